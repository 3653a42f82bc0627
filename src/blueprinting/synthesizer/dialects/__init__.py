"""Model-family dialects: the semantic operations of each model family."""
