"""Command-line entry points: each parses its arguments and calls one davir function (see pyproject.toml)."""
