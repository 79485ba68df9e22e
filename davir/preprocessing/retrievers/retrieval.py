"""Top-k retrieval with any retriever: per change region (DAVIR Eq. 9) or per whole frame (CHEER §4.8)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from davir.preprocessing.retrievers.regions import PairRegions

if TYPE_CHECKING:
    from davir.preprocessing.retrievers.gate import EntityGate


class Retriever(Protocol):
    name: str

    def prepare(self, phrases: Sequence[str]) -> None: ...

    def score(self, pairs: Sequence[PairRegions]) -> np.ndarray: ...

    def frame_scores(self, images: Sequence[np.ndarray]) -> np.ndarray: ...

    def describe(self) -> dict: ...


def retrieve_top_k(
    retriever: Retriever, regions: Sequence[PairRegions], phrases: Sequence[str], k: int, gate: EntityGate | None = None
) -> list[list[tuple[str, float]]]:
    """Top-k entities per pair; none for a pair whose masks are empty in both images, or that `gate` rejects.

    No change region means no change entity: the prompt then carries no entity, so "no entity" can
    teach "no change" instead of the whole image's most typical object being named. The gate (see
    EntityGate) does the same for regions the mask pipeline found where nothing the captions name
    changed (a camera shift or a light change leaves differences at every edge).
    """
    scores = retriever.score(regions)
    keep = np.array([not (pair.before.empty and pair.after.empty) for pair in regions], bool)
    if gate is not None and keep.any():
        keep &= gate.keeps(regions)
    return [top_k(row, phrases, k) if kept else [] for kept, row in zip(keep, scores)]


def top_k(scores: np.ndarray, phrases: Sequence[str], k: int) -> list[tuple[str, float]]:
    """The k best phrases with their scores, best first (ties keep vocabulary order)."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")[:k]
    return [(phrases[i], float(scores[i])) for i in order]


# CHEER §4.8: image-level change-entity retrieval (whole frames, no masks).
IMAGE_SCORES = ("abs", "bef_minus_aft")


def cheer_rank_entities(s_bef: np.ndarray, s_aft: np.ndarray, k: int, sign: str = "abs") -> list[tuple[int, float]]:
    """CHEER's entity ranking (docs/methods/cheer.md, CHEER Eq. 1): the k entities to keep, best first.

    `s_bef`, `s_aft` (M,) are the similarities of the before and after image to all M vocabulary
    entities (CLIP cosine, or the fitted retriever's analog). Steps 3-5 of §4.8:

    3. score = |S_bef − S_aft| (`sign="abs"`, our default [D]: an added object is more similar to the
       after image, so the paper's signed score would rank it last) or S_bef − S_aft
       (`sign="bef_minus_aft"`, Eq. 1 as written: Ê = argmax_E (S_bef − S_aft)).
    4. Constraint: an entity is eligible only when S_bef[i] > mean(S_bef) or S_aft[i] > mean(S_aft)
       (strictly above its image's mean over all M entities), so an entity that neither image shows
       cannot win on a large difference of two low similarities.
    5. The k eligible entities with the highest score. If fewer than k are eligible, the list is padded
       with the best-scoring ineligible entities (after all eligible ones, so scores are then not
       monotone), so CHEER always gets K entries unless the vocabulary holds fewer than k (then all M).

    Returns [(entity index, score)], ties in vocabulary order. Pure numpy.
    """
    s_bef = np.asarray(s_bef, dtype=np.float64)
    s_aft = np.asarray(s_aft, dtype=np.float64)
    if s_bef.ndim != 1 or s_bef.shape != s_aft.shape:
        raise ValueError(f"S_bef and S_aft must be vectors of the same length, got {s_bef.shape} and {s_aft.shape}")
    if sign not in IMAGE_SCORES:
        raise ValueError(f"sign must be one of {IMAGE_SCORES}, got {sign!r}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    difference = s_bef - s_aft
    score = np.abs(difference) if sign == "abs" else difference
    eligible = (s_bef > s_bef.mean()) | (s_aft > s_aft.mean())
    order = np.argsort(-score, kind="stable")
    ranked = np.concatenate([order[eligible[order]], order[~eligible[order]]])[:k]
    return [(int(i), float(score[i])) for i in ranked]


def retrieve_image_level(
    retriever: Retriever,
    frames: Sequence[tuple[np.ndarray, np.ndarray]],
    phrases: Sequence[str],
    k: int,
    sign: str = "abs",
) -> list[list[tuple[str, float]]]:
    """Top-k entities per pair from whole before/after frames (CHEER §4.8); every pair gets min(k, M).

    `retriever.frame_scores(images)` gives S for each frame (CLIP: cosine of the global image embedding
    to each entity's text embedding); `cheer_rank_entities` ranks. Unlike `retrieve_top_k`, there is no
    "no change region → no entity" case: CHEER has no masks and always retrieves K entities.
    """
    if not frames:
        return []
    s_bef = retriever.frame_scores([before for before, _ in frames])
    s_aft = retriever.frame_scores([after for _, after in frames])
    return [[(phrases[i], score) for i, score in cheer_rank_entities(b, a, k, sign)] for b, a in zip(s_bef, s_aft)]
