"""Argument types the commands share.

    parser.add_argument("--batch-size", type=at_least(1))   # "--batch-size 0" is a usage error (exit 2)
    parser.add_argument("--limit", type=limit_type())        # N >= 1; omitted: every pair (one meaning everywhere)

A count given as a plain `int` lets a negative value reach the work, where it does something else: `pairs[:-1]`
drops the last pair, a format width of -1 fails after scoring.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from davir.errors import DataError


def at_least(minimum: int, *, hint: str | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum`; argparse names the flag in its error, and `hint` (what to do
    instead) follows it: `argument --limit: must be 1 or more, got 0; omit --limit for all pairs`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}" + (f"; {hint}" if hint else ""))
        return value

    return parse


def limit_type(flag: str = "--limit", everything: str = "all pairs") -> Callable[[str], int]:
    """The argparse type of every command's `--limit N` ("only the first N pairs"): N >= 1, and the flag left
    out means all of them. 0 is a usage error: `pairs[:0]` would make it "none" and `if limit:` "all", and the two
    meanings had both shipped (evaluate.py: all; preprocess masks/entities/mask-eval: none)."""
    return at_least(1, hint=f"omit {flag} for {everything}")


def check_limit(limit: int | None, *, name: str = "limit") -> int | None:
    """The library side of `--limit`: None (every pair) or a whole number >= 1, as `limit_type` parses it; a
    DataError otherwise (0 would mean "none" to a slice and "all" to `if limit:`; -1 would drop the last pair)."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise DataError(f"{name} must be a whole number of 1 or more (None for every pair), got {limit!r}")
    return limit
