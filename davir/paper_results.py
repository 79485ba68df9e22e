"""The numbers each method's own paper reports (methods.md §7.4), for side-by-side tables.

Values are as printed (x100); None = not reported. `setting` is the row group the paper scores:
"total" (every pair), "semantic" (CLEVR-Change semantic-change pairs only), "distractor" (only pseudo
change) or "all" (datasets without that split). The subtraction rows are the ablation baselines two of
the papers report (SCORER Table 6, RDD Table 4: CIDEr only).
"""

from __future__ import annotations

from dataclasses import dataclass

METRIC_COLUMNS = ("BLEU-4", "METEOR", "ROUGE_L", "CIDEr", "SPICE")


@dataclass(frozen=True)
class PaperResult:
    method: str
    dataset: str
    setting: str
    scores: dict[str, float | None]
    source: str


def _row(method: str, dataset: str, setting: str, b, m, r, c, s, source: str) -> PaperResult:
    return PaperResult(method, dataset, setting, dict(zip(METRIC_COLUMNS, (b, m, r, c, s))), source)


PAPER_RESULTS: tuple[PaperResult, ...] = (
    _row("scorer", "clevr_change", "total", 56.3, 41.2, 74.5, 126.8, 33.3, "SCORER Table 1"),
    _row("scorer", "clevr_change", "semantic", 54.4, 37.6, 71.7, 122.4, 31.6, "SCORER Table 1"),
    _row("scorer", "clevr_change", "distractor", 62.0, 51.7, 77.4, 117.9, 35.0, "SCORER Table 7"),
    _row("scorer", "clevr_dc", "all", 49.4, 33.4, 66.1, 83.7, 16.2, "SCORER Table 3 (R: suppl. Table 10)"),
    _row("scorer", "ier", "all", 10.0, 15.0, 39.6, 33.4, 12.6, "SCORER Table 4 (S: suppl. Table 11)"),
    _row("scorer", "spot_the_diff", "all", 10.2, 12.2, 31.9, 38.9, 18.4, "SCORER Table 5 (R: suppl. Table 12)"),
    _row("dirl", "clevr_change", "semantic", 54.6, 38.1, 71.9, 123.6, 31.8, "DIRL Table 2"),
    _row("dirl", "clevr_dc", "all", 51.4, 32.3, 66.3, 84.1, 16.8, "DIRL Table 4"),
    _row("dirl", "ier", "all", 10.9, 15.0, 41.0, 34.1, None, "DIRL Table 5"),
    _row("dirl", "spot_the_diff", "all", 10.3, 13.8, 32.8, 40.9, 19.9, "DIRL Table 1"),
    _row("rdd", "clevr_change", "total", 56.1, 41.3, 75.0, 128.1, 33.5, "RDD Table 1"),
    _row("rdd", "levir_cc", "all", 65.6, 40.3, 75.5, 138.3, None, "RDD Table 2"),
    _row("rdd", "spot_the_diff", "all", 9.2, 13.9, 31.0, 43.6, None, "RDD Table 3"),
    _row("cheer", "clevr_change", "total", 57.1, 42.2, 75.8, 130.0, 33.9, "CHEER Table 1"),
    _row("cheer", "clevr_change", "semantic", 54.1, 39.0, 73.6, 127.4, 33.2, "CHEER Table 1"),
    _row("cheer", "clevr_dc", "all", 51.6, 32.7, 66.8, 86.9, 17.0, "CHEER Table 2"),
    _row("cheer", "spot_the_diff", "all", 10.5, 12.9, 33.1, 41.0, 19.6, "CHEER Table 3"),
    _row("subtraction", "clevr_change", "total", None, None, None, 119.7, None, "SCORER Table 6 (ablation)"),
    _row("subtraction", "clevr_change", "total", None, None, None, 120.4, None, "RDD Table 4 'direct-sub' (ablation)"),
    _row("davir", "spot_the_diff", "all", 12.1, 15.8, 35.9, 61.9, 23.0, "DAVIR Table 1"),
    _row("davir", "ier", "all", 16.7, 16.2, 41.2, 65.2, 16.9, "DAVIR Table 2"),
    _row("davir", "levir_cc", "all", 65.1, 40.9, 75.9, 140.7, None, "DAVIR Table 3"),
)


def paper_results(dataset: str, methods: set[str] | None = None) -> list[PaperResult]:
    """The reported rows for `dataset` (optionally only `methods`), in table order."""
    return [r for r in PAPER_RESULTS if r.dataset == dataset and (methods is None or r.method in methods)]
