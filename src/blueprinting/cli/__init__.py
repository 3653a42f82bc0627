"""Command-line interface; each subcommand lives in its own module and is imported lazily."""
