"""Argument types the commands share."""

from __future__ import annotations

import argparse


def whole_number(minimum: int):
    """An argparse type: an integer >= `minimum`, so that a count out of range is a usage error before any work
    (caption.py's --batch-size 0 reached torch's DataLoader, davir-app's --max-upload-mb -1 Gradio, after the
    model loaded, as tracebacks)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {value}")
        return value

    return parse
