"""Strategy search: enumeration, vectorized law filtering, evaluation and ranking."""
