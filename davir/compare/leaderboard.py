"""The leaderboard of one benchmark: every reported number (davir.compare.paper_results) with its source and protocol,
and your runs beside them (`python -m davir.compare --leaderboard BENCHMARK [RUN…]`).

Each row is marked =, ≠ or ? against the protocol davir scores: docs/recipes.md, "Runs side by side".
"""

from __future__ import annotations

from typing import Any

from davir.compare.paper_results import METRIC_COLUMNS, leaderboard_rows
from davir.metrics.captions import TOTAL
from davir.metrics.protocols import PROTOCOLS

MARKS = {True: "=", False: "≠", None: "?"}


def official_protocol_text(benchmark: str) -> str:
    """What davir scores for `benchmark`: its official reference files, or the reader's references."""
    protocols = [p for (data_format, _), p in PROTOCOLS.items() if data_format == benchmark]
    if not protocols:
        return (
            f"{benchmark}: no official reference file is shared, so davir scores the reader's references with "
            "coco-caption's PTB tokenizer; no published row can be checked against it"
        )
    return (
        "; ".join(
            f"{p.name}: {p.official_file.split(' = ')[0]} ({p.pairs} pairs, {p.sentences} sentences)" for p in protocols
        )
        + "; coco-caption PTB tokenizer (pycocoevalcap 1.2)"
    )


def run_protocol(result: Any, benchmark: str) -> tuple[str, str]:
    """(mark, what) for one of our runs (a davir.compare.RunResult): "=" when it was scored with the
    benchmark's official protocol."""
    if result.dataset != benchmark:
        return "≠", f"scored on {result.dataset}, not {benchmark}"
    if "synthetic" in result.document:
        return "≠", "the built-in synthetic set, not the benchmark"
    references = result.document.get("references") or {}
    protocol = references.get("protocol") or references.get("official_protocol") or {}
    if protocol.get("name"):
        return "=", f"davir, official protocol of {protocol['name']}"
    return "?", "davir, the reader's references (no official file for this split)"


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _as_printed(value: float | None) -> str:
    """A reported number with the digits its source printed (65.49 stays 65.49)."""
    if value is None:
        return "–"
    text = f"{value:.2f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def leaderboard_table(benchmark: str, results: list[Any] | None = None) -> str:
    """A Markdown leaderboard of `benchmark`: the reported rows (highest CIDEr first), our runs' total rows, and
    the caveats: what each mark means, the official protocol, and every row's note."""
    rows = leaderboard_rows(benchmark)
    header = ["rank", "method", "setting", *METRIC_COLUMNS, "protocol", "source"]
    lines = [
        f"## Leaderboard: {benchmark}",
        "",
        "| " + " | ".join(header) + " |",
        "|---:|---|---|" + "---:|" * len(METRIC_COLUMNS) + "---|---|",
    ]
    entries = [(row.scores.get("CIDEr"), "paper", row) for row in rows]
    # runs scored on other data are listed after the ranking, unranked: their numbers are not on this benchmark
    elsewhere = [r for r in results or [] if run_protocol(r, benchmark)[0] == "≠"]
    entries += [
        (100 * r.rows[TOTAL]["CIDEr"] if r.rows[TOTAL].get("CIDEr") is not None else None, "ours", r)
        for r in results or []
        if r not in elsewhere
    ]
    entries.sort(key=lambda e: -(e[0] if e[0] is not None else float("-inf")))
    entries += [(None, "ours", r) for r in elsewhere]
    notes = []
    for position, (_, kind, entry) in enumerate(entries, start=1):
        rank = "–" if kind == "ours" and entry in elsewhere else str(position)
        if kind == "paper":
            mark = MARKS[entry.same_protocol]
            cells = [
                entry.method,
                entry.setting,
                *(_as_printed(entry.scores[m]) for m in METRIC_COLUMNS),
                mark + (f" {entry.protocol}" if entry.protocol else ""),
                entry.source,
            ]
            if entry.note:
                notes.append(f"- {entry.method} ({entry.source.split(' (')[0]}): {entry.note}")
        else:
            mark, what = run_protocol(entry, benchmark)
            metrics = entry.rows[TOTAL]
            cells = [
                f"**ours: {entry.name}** ({entry.method})",
                f"{TOTAL} ({entry.split})",
                *(_cell(None if metrics.get(m) is None else 100 * metrics[m]) for m in METRIC_COLUMNS),
                f"{mark} {what}",
                str(entry.path),
            ]
        lines.append(f"| {rank} | " + " | ".join(cells) + " |")
    if not rows:
        lines.append(f"\n(no reported numbers for {benchmark} in davir.compare.paper_results)")
    lines += [
        "",
        "Scores x100 (CIDEr = CIDEr-D); `setting`: total / semantic / all pairs, or unstated where the "
        "source does not say.",
        "",
        "Protocol marks against what davir scores — " + official_protocol_text(benchmark) + ":",
        "= same references and tokenizer; ≠ known to differ; ? not stated where the number was read.",
        "",
    ]
    if notes:
        lines += ["Caveats:", *notes, ""]
    lines.append(
        "Numbers quoted by another paper or repository say so in `source`; the same method can be quoted "
        "with different numbers (both rows are listed). Methods whose numbers could not be read from a "
        "source here are left out (docs/experiments/results.md lists them)."
    )
    return "\n".join(lines) + "\n"


__all__ = ["MARKS", "leaderboard_table", "official_protocol_text", "run_protocol"]
