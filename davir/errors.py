"""Exceptions shared across the toolkit (a leaf module: it imports nothing from davir)."""


class DataError(ValueError):
    """Bad input: the message names the file and record and says what is wrong."""
