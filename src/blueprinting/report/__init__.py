"""Human-readable renderings of reports (rich tables); JSON lives with the report values."""
