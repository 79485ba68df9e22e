"""The standard caption metrics, exactly as the official coco-caption flow computes them.

    result = score_captions({"256.png": "the car is gone"}, {"256": ["the red car is gone", ...]})
    result.metrics["CIDEr"]           # toolkit scale (papers print x100)

How it matches the official flow, per-type subsets and SPICE's jars: docs/metrics.md, "Caption metrics".
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pycocoevalcap.bleu.bleu_scorer import BleuScorer
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor.meteor import Meteor
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

from davir.data.records import CHANGE_TYPES, DISTRACTOR
from davir.errors import DataError
from davir.metrics.io import IdMismatch, align_ids, canonical_groups, canonical_id
from davir.metrics.spice import prepare_spice, score_per_image

# Metric families a caller can ask for; SPICE is controlled by the `spice` argument.
METRICS = ("BLEU", "METEOR", "ROUGE_L", "CIDEr")
# Score names in table order.
SCORE_NAMES = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE_L", "CIDEr", "SPICE")
# COCOEvalCap's names for the same scores (expected_scores.json and every repo's logs use these).
COCO_NAMES = {
    "Bleu_1": "BLEU-1",
    "Bleu_2": "BLEU-2",
    "Bleu_3": "BLEU-3",
    "Bleu_4": "BLEU-4",
    "METEOR": "METEOR",
    "ROUGE_L": "ROUGE_L",
    "CIDEr": "CIDEr",
    "SPICE": "SPICE",
}
# Row names score_by_group adds after the groups themselves.
SEMANTIC, TOTAL = "semantic", "total"

JAVA_HINT = "java was not found on PATH; the PTB tokenizer and METEOR of pycocoevalcap need Java 8 or newer"

# Characters Java's PTBLexer treats as line ends: inside a caption they would split its line and shift
# every later caption onto the wrong id, so they become spaces (coco-caption only replaces "\n").
_LINE_BREAKS = re.compile("[\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# A last line whose tokenised form is known: if it comes back changed, lines went out of step.
_SENTINEL_KEY = ("davir", "sentinel")
_SENTINEL = "davirsentinel"


class MetricsError(RuntimeError):
    """The scoring tools could not run (no Java, a Java process failed); the message says why."""


@dataclass
class CaptionScores:
    """Scores of one set of pairs (toolkit scale, 0..1 except CIDEr; papers print x100).

    `metrics` maps SCORE_NAMES entries that were asked for to their value; SPICE is None when it
    could not be computed (`notes` says why). `per_image` maps a metric to {pair id: score} (BLEU-4,
    METEOR, ROUGE_L, CIDEr and SPICE where computed). `bleu_stats` are coco-caption's corpus BLEU
    counts (testlen, reflen, guess, correct).
    """

    metrics: dict[str, float | None]
    num_pairs: int
    num_references: int
    num_empty_predictions: int = 0
    mismatch: IdMismatch = field(default_factory=IdMismatch)
    per_image: dict[str, dict[str, float]] = field(default_factory=dict)
    bleu_stats: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def per_image_cider(self) -> dict[str, float]:
        return self.per_image.get("CIDEr", {})

    def to_dict(self, *, per_image: bool = False) -> dict:
        """Plain JSON-ready view; per-image scores only when asked (they are large)."""
        out = {
            "metrics": dict(self.metrics),
            "num_pairs": self.num_pairs,
            "num_references": self.num_references,
            "num_empty_predictions": self.num_empty_predictions,
            "bleu_stats": self.bleu_stats,
            "mismatch": self.mismatch.to_dict(),
            "notes": list(self.notes),
        }
        if per_image:
            out["per_image"] = {metric: dict(values) for metric, values in self.per_image.items()}
        return out


# ----------------------------------------------------------------------------------------------
# Java tools: tokenizer, METEOR process, SPICE set-up


def _require_java() -> None:
    if shutil.which("java") is None:
        raise MetricsError(JAVA_HINT)


def ptb_tokenize(captions: Mapping[Any, list[str]]) -> dict[Any, list[str]]:
    """coco-caption's tokenisation (Stanford PTBTokenizer -lowerCase, punctuation removed), one Java run.

    Keys may be any hashable; the output keeps each key's caption order. The run is checked: a
    caption that would split its line is made one line first, and a sentinel line must come back
    intact, so a caption is never scored against another pair's text.
    """
    _require_java()
    payload = {
        key: [{"caption": _LINE_BREAKS.sub(" ", caption)} for caption in texts] for key, texts in captions.items()
    }
    payload[_SENTINEL_KEY] = [{"caption": _SENTINEL}]
    try:
        tokenized = PTBTokenizer().tokenize(payload)
    except OSError as error:
        raise MetricsError(f"the PTB tokenizer (java) could not run: {error}") from error
    if tokenized.get(_SENTINEL_KEY) != [_SENTINEL] or any(
        len(tokenized.get(k, ())) != len(v) for k, v in captions.items()
    ):
        raise MetricsError(
            "the PTB tokenizer's output does not line up with its input (did java fail? see its messages above)"
        )
    del tokenized[_SENTINEL_KEY]
    return tokenized


def _close_meteor(meteor: Meteor) -> None:
    """End METEOR's java process and its pipes now (pycocoevalcap leaves that to garbage collection)."""
    process = meteor.meteor_p
    # compute_score keeps its lock when java dies mid-call; free it, or Meteor.__del__ would block forever.
    if meteor.lock.locked():
        meteor.lock.release()
    for stream in (process.stdin, process.stdout, process.stderr):
        try:
            stream.close()
        except OSError:  # a broken pipe of a process that already died
            pass
    if process.poll() is None:
        process.kill()
    process.wait()


def _start_meteor() -> Meteor:
    _require_java()
    try:
        return Meteor()
    except OSError as error:
        raise MetricsError(f"METEOR (java) could not start: {error}") from error


class _SharedMeteor:
    """The METEOR process of an open `shared_meteor()` block (`depth` > 0), else none."""

    depth = 0
    meteor: Meteor | None = None


@contextmanager
def shared_meteor() -> Iterator[None]:
    """Within this block every scoring call reuses one METEOR java process, closed when the block ends.

    Starting METEOR costs ~8 s (it loads its paraphrase table) against ~0.2 s to score 300 captions, so a
    sweep that scores 15 runs in one process holds one open; outside such a block each call starts its own.
    """
    _SharedMeteor.depth += 1
    try:
        yield
    finally:
        _SharedMeteor.depth -= 1
        if _SharedMeteor.depth == 0 and _SharedMeteor.meteor is not None:
            meteor, _SharedMeteor.meteor = _SharedMeteor.meteor, None
            _close_meteor(meteor)


@contextmanager
def meteor_scorer() -> Iterator[Meteor]:
    """pycocoevalcap's Meteor (one java process for many compute_score calls), closed on exit; inside a
    `shared_meteor()` block, that block's process (restarted if it died, closed after a failure)."""
    if _SharedMeteor.depth == 0:
        meteor = _start_meteor()
        try:
            yield meteor
        finally:
            _close_meteor(meteor)
        return
    if _SharedMeteor.meteor is None or _SharedMeteor.meteor.meteor_p.poll() is not None:
        if _SharedMeteor.meteor is not None:
            _close_meteor(_SharedMeteor.meteor)
        _SharedMeteor.meteor = None  # a failed start leaves nothing behind
        _SharedMeteor.meteor = _start_meteor()
    try:
        yield _SharedMeteor.meteor
    except BaseException:
        meteor, _SharedMeteor.meteor = _SharedMeteor.meteor, None
        _close_meteor(meteor)
        raise


# ----------------------------------------------------------------------------------------------
# Scoring


def _normalise_metrics(metrics: Iterable[str]) -> tuple[str, ...]:
    by_lower = {name.lower(): name for name in METRICS}
    chosen = []
    for name in metrics:
        key = by_lower.get(str(name).lower())
        if key is None:
            raise ValueError(f"unknown metric {name!r}; choose from {', '.join(METRICS)} (SPICE is set by spice=)")
        if key not in chosen:
            chosen.append(key)
    if not chosen:
        raise ValueError(f"no metric chosen; choose from {', '.join(METRICS)}")
    return tuple(name for name in METRICS if name in chosen)


def _bleu(gts: dict[str, list[str]], res: dict[str, list[str]]) -> tuple[list[float], list[float], dict]:
    """Corpus BLEU-1..4 with coco-caption's "closest" reference length, per-image BLEU-4, and the counts."""
    scorer = BleuScorer(n=4)
    for pair_id in gts:
        scorer += (res[pair_id][0], gts[pair_id])
    score, per_image = scorer.compute_score(option="closest", verbose=0)
    stats = {
        "testlen": scorer.testlen(),
        "reflen": scorer.reflen(),
        "guess": [int(sum(c["guess"][k] for c in scorer.ctest)) for k in range(4)],
        "correct": [int(sum(c["correct"][k] for c in scorer.ctest)) for k in range(4)],
    }
    return [float(s) for s in score], [float(s) for s in per_image[3]], stats


def _meteor(meteor: Meteor, gts: dict[str, list[str]], res: dict[str, list[str]]) -> tuple[float, list[float]]:
    try:
        score, per_image = meteor.compute_score(gts, res)
    except (ValueError, OSError) as error:  # the java process died: its stdout ran dry
        stderr = b""
        try:
            meteor.meteor_p.kill()
            stderr = meteor.meteor_p.stderr.read()[-2000:]
        except (OSError, ValueError):
            pass
        raise MetricsError(
            f"METEOR (java) failed: {error}; java said: {stderr.decode(errors='replace').strip()}"
        ) from error
    return float(score), [float(s) for s in per_image]


def _score_subset(
    ids: list[str],
    gts_all: dict[str, list[str]],
    res_all: dict[str, list[str]],
    metrics: tuple[str, ...],
    meteor: Meteor | None,
    spice_per_image: dict[str, float] | None,
    spice_note: str | None,
    empty_ids: set[str],
) -> CaptionScores:
    """Every requested scorer on the pairs `ids` of the tokenised captions."""
    gts = {pair_id: gts_all[pair_id] for pair_id in ids}
    res = {pair_id: res_all[pair_id] for pair_id in ids}
    scores: dict[str, float | None] = {}
    per_image: dict[str, dict[str, float]] = {}
    bleu_stats = None
    if "BLEU" in metrics:
        bleu, bleu4_per_image, bleu_stats = _bleu(gts, res)
        scores.update({f"BLEU-{n}": value for n, value in enumerate(bleu, start=1)})
        per_image["BLEU-4"] = dict(zip(ids, bleu4_per_image))
    if "ROUGE_L" in metrics:
        score, values = Rouge().compute_score(gts, res)
        scores["ROUGE_L"] = float(score)
        per_image["ROUGE_L"] = dict(zip(ids, map(float, values)))
    if "CIDEr" in metrics:
        score, values = Cider().compute_score(gts, res)
        scores["CIDEr"] = float(score)
        per_image["CIDEr"] = dict(zip(ids, map(float, values)))
    if "METEOR" in metrics:  # last: METEOR's java process loads its paraphrase table meanwhile
        scores["METEOR"], values = _meteor(meteor, gts, res)
        per_image["METEOR"] = dict(zip(ids, values))
    notes = []
    if spice_per_image is not None:
        # SPICE is a mean of independent per-image F-scores, so a subset's SPICE is the subset's mean.
        scores["SPICE"] = float(np.mean([spice_per_image[pair_id] for pair_id in ids]))
        per_image["SPICE"] = {pair_id: spice_per_image[pair_id] for pair_id in ids}
    else:
        scores["SPICE"] = None
        if spice_note:
            notes.append(spice_note)
    return CaptionScores(
        metrics={name: scores[name] for name in SCORE_NAMES if name in scores},
        num_pairs=len(ids),
        num_references=sum(len(gts[pair_id]) for pair_id in ids),
        num_empty_predictions=sum(pair_id in empty_ids for pair_id in ids),
        per_image=per_image,
        bleu_stats=bleu_stats,
        notes=notes,
    )


def _score_subsets(
    predictions: dict[str, str],
    references: dict[str, list[str]],
    subsets: dict[str, list[str]],
    *,
    metrics: Iterable[str],
    spice: bool | str | os.PathLike,
) -> dict[str, CaptionScores]:
    """Start METEOR once, tokenise once, run SPICE once, then score every subset."""
    chosen = _normalise_metrics(metrics)
    # METEOR's java process is started first: it loads its paraphrase table while the rest runs.
    with meteor_scorer() if "METEOR" in chosen else _no_meteor() as meteor:
        tokenized = ptb_tokenize(
            {**{("ref", k): v for k, v in references.items()}, **{("hyp", k): [v] for k, v in predictions.items()}}
        )
        gts = {k: tokenized[("ref", k)] for k in references}
        res = {k: tokenized[("hyp", k)] for k in predictions}
        empty_ids = {k for k, v in res.items() if not v[0].strip()}

        spice_per_image, spice_note = None, None
        if spice is False:
            spice_note = "SPICE not computed (disabled)"
        else:
            ready, spice_note = prepare_spice(None if spice is True else spice)
            if ready:
                spice_per_image, spice_note = score_per_image(gts, res)

        return {
            name: _score_subset(ids, gts, res, chosen, meteor, spice_per_image, spice_note, empty_ids)
            for name, ids in subsets.items()
        }


@contextmanager
def _no_meteor() -> Iterator[None]:
    yield None


def score_captions(
    predictions: Mapping[Any, str],
    references: Mapping[Any, list[str]],
    *,
    metrics: Iterable[str] = METRICS,
    spice: bool | str | os.PathLike = True,
    strict: bool = False,
) -> CaptionScores:
    """Score predictions ({id: caption}) against references ({id: [captions]}) on the ids both have.

    metrics: any of METRICS. spice: True = use SPICE if CoreNLP 3.6.0 is installed or named by
    $DAVIR_SPICE_CORENLP, a folder = take the jars from there, False = skip. strict: ids on one side
    only raise a DataError instead of being reported in `result.mismatch`.
    """
    aligned = align_ids(predictions, references, strict=strict)
    ids = list(aligned.predictions)
    result = _score_subsets(aligned.predictions, aligned.references, {TOTAL: ids}, metrics=metrics, spice=spice)[TOTAL]
    result.mismatch = aligned.mismatch
    return result


def group_order(names: Iterable[str]) -> list[str]:
    """CLEVR-Change's table order: the five change types, distractor, then any other group by name."""
    names = set(names)
    known = [name for name in (*CHANGE_TYPES, DISTRACTOR) if name in names]
    return known + sorted(names - set(known))


def score_by_group(
    predictions: Mapping[Any, str],
    references: Mapping[Any, list[str]],
    groups: Mapping[Any, str],
    *,
    metrics: Iterable[str] = METRICS,
    spice: bool | str | os.PathLike = True,
    strict: bool = False,
) -> dict[str, CaptionScores]:
    """Per-group scores plus "semantic" (every grouped pair not in "distractor") and "total" (all pairs).

    groups: {pair id: group name}, e.g. CLEVR-Change's change types (color, material, add, drop, move,
    distractor). Each row re-runs the scorers on its pairs (CIDEr's IDF is the row's own, as in the
    papers' per-type tables). Scored pairs without a group count in "total" only (said in its notes).
    """
    aligned = align_ids(predictions, references, strict=strict)
    by_key = canonical_groups(groups)
    for reserved in (SEMANTIC, TOTAL):
        if reserved in by_key.values():
            raise DataError(f"groups: {reserved!r} is a row score_by_group adds itself; rename that group")
    members: dict[str, list[str]] = {}
    ungrouped = []
    for pair_id in aligned.predictions:
        group = by_key.get(canonical_id(pair_id))
        if group is None:
            ungrouped.append(pair_id)
        else:
            members.setdefault(group, []).append(pair_id)
    subsets = {name: members[name] for name in group_order(members)}
    semantic = [pair_id for name, ids in subsets.items() if name != DISTRACTOR for pair_id in ids]
    if semantic:
        subsets[SEMANTIC] = semantic
    subsets[TOTAL] = list(aligned.predictions)
    results = _score_subsets(aligned.predictions, aligned.references, subsets, metrics=metrics, spice=spice)
    results[TOTAL].mismatch = aligned.mismatch
    if ungrouped:
        examples = ", ".join(map(repr, ungrouped[:5]))
        results[TOTAL].notes.append(
            f"{len(ungrouped)} scored pair(s) have no group and count in {TOTAL!r} only (e.g. {examples})"
        )
    return results


def from_coco_names(scores: Mapping[str, float]) -> dict[str, float]:
    """COCOEvalCap's score names ("Bleu_4") to ours ("BLEU-4")."""
    return {COCO_NAMES[name]: value for name, value in scores.items() if name in COCO_NAMES}
