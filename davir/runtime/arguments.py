"""Argument types the commands share.

    parser.add_argument("--limit", type=at_least(0))    # "--limit -1" is a usage error (exit 2), not a slice

A count given as a plain `int` lets a negative value reach the work, where it does something else: `pairs[:-1]`
drops the last pair, a format width of -1 fails after scoring.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum`; argparse names the flag in its error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    return parse
