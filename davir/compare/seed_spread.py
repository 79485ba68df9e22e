"""Seed spread: mean ± std and min–max over seeds, and which differences between variants it cannot tell apart.

    spread_text([0.5, 0.6, 0.7], scale=100)          # "60.0 ± 10.0 (50.0–70.0)"
    inside_spread({"A": [0.50, 0.62], "B": [0.58, 0.70], "C": [0.9, 0.95]})   # [("A", "B")]

A difference between two variants is *inside the spread* when their min–max ranges over seeds overlap: some
seed of the worse one did as well as some seed of the better one, so the seeds run do not settle the order.
Used by the sweep summary (davir.sweep) and the compare table (davir.compare).
"""

from __future__ import annotations

import statistics
from itertools import combinations
from typing import Any


def value_at(document: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """The value at `keys` in a metrics.json / run_info.json document, or None where the path is missing."""
    value: Any = document
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def metric_at(document: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    """The number at `keys` in a metrics.json document, or None where the path or a number is missing."""
    value = value_at(document, keys)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def spread_text(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    """ "mean ± std (min–max)" of the scaled values; one value alone; "—" for none."""
    if not values:
        return "—"
    scaled = [v * scale for v in values]
    mean, std = mean_std(scaled)
    if len(scaled) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f} ({min(scaled):.{digits}f}–{max(scaled):.{digits}f})"


def spread_record(values: list[float]) -> dict:
    """The JSON form of one cell: the values and their mean, std, min and max (None for no values)."""
    mean, std = mean_std(values) if values else (None, None)
    return {
        "values": values,
        "mean": mean,
        "std": std,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


def inside_spread(values: dict[str, list[float]]) -> list[tuple[str, str]]:
    """Pairs of variants (in the given order) whose min–max ranges overlap, when at least one has several
    seeds (two single runs say nothing about spread); variants without values are left out."""
    pairs = []
    for (a, xs), (b, ys) in combinations([(name, v) for name, v in values.items() if v], 2):
        if len(xs) < 2 and len(ys) < 2:
            continue
        if min(xs) <= max(ys) and min(ys) <= max(xs):
            pairs.append((a, b))
    return pairs


def inside_spread_lines(columns: dict[str, dict[str, list[float]]]) -> list[str]:
    """One Markdown bullet per column with differences inside the spread ("- CIDEr: A ≈ B, A ≈ C")."""
    lines = []
    for title, values in columns.items():
        pairs = inside_spread(values)
        if pairs:
            lines.append(f"- {title}: " + ", ".join(f"{a} ≈ {b}" for a, b in pairs))
    return lines


__all__ = ["inside_spread", "inside_spread_lines", "mean_std", "spread_record", "spread_text"]
