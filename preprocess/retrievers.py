"""Entity retrievers for DAVIR's entity prompt (davir.txt §3.3, Eqs. 8-9; methods.md §5.2(d)).

    regions = pair_regions(before, after, masks)          # Eq. 8: masked, cropped change regions
    retriever = build_retriever("fitted") / ("clip", model_name=…, checkpoint=…)
    scores = retriever.score(regions_of_many_pairs)        # (pairs, vocabulary) scores, Eq. 9
    top = top_k(scores[i], vocabulary.phrases, k)

Two retrievers share one interface (`prepare(phrases)`, `score(pairs)`, `save/load`):

* ``clip``   — open_clip with a local checkpoint file (never a hub tag): score(e) = max over the before
  and after region of cos(CLIP_img(region), CLIP_text("a photo of {e}")), the paper's Eq. 9.
* ``fitted`` — no weights at all: hand-made region descriptors (colour, shape, size, highlights)
  and logistic regressions fitted on the training split, each training pair labelled with the
  vocabulary phrases its reference captions name (one regression per vocabulary word, composed into
  phrase scores). By default (`mode="mixture"`) the two regions are weighted by a learned
  probability that the caption describes the before image, instead of Eq. 9's max: the max cannot
  tell which image the caption names for an attribute change ("the red sphere changed to blue" names
  the before object; "someone added a cube" the after one). See FittedRetriever. The fitted model is
  stored as JSON + npz (plain arrays, loaded with allow_pickle=False) and rebuilt, never unpickled.

The entity gate (EntityGate, [D]) withholds the entities of a pair whose change region shows nothing
the captions would name (a camera or light change): a logistic regression on both regions'
descriptors and their difference, fitted on the fit split; `retrieve_top_k(…, gate=gate)` applies it.

CHEER's image-level retrieval (methods.md §4.8, CHEER Eq. 1) uses no masks: both retrievers also score
whole frames (`frame_scores(images)` → S ∈ R^{n×M}), and `cheer_rank_entities` ranks the vocabulary by
|S_bef − S_aft| (or S_bef − S_aft) under the paper's mean constraint; `retrieve_image_level` applies it.
"""

from __future__ import annotations

import math
from functools import cached_property
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

import cv2
import numpy as np

from davir.data.caches import PairMasks
from davir.data.records import DataError
from davir.io import read_json, write_json_atomic

MASK_SOURCES = ("per_image", "union")
MASK_WEIGHTINGS = ("binary", "soft")
DEFAULT_PROMPT = "a photo of {phrase}"


# ---------------------------------------------------------------------------------------------------
# Eq. 8: masked change regions
# ---------------------------------------------------------------------------------------------------

@dataclass
class Region:
    """One image's change region: `crop` = (image ⊙ mask) cut to the padded mask box, `mask` inside it."""

    crop: np.ndarray          # (h, w, 3) uint8
    mask: np.ndarray          # (h, w) float in [0, 1]; all ones when the mask was empty
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 of the crop in the full image (x1, y1 exclusive)
    image_size: tuple[int, int]     # full image (width, height)
    empty: bool               # no mask pixel: the region is the whole image

    @cached_property
    def descriptor(self) -> np.ndarray:
        """`region_descriptor(self)`, computed once: the fitted retriever and the entity gate both read it."""
        return region_descriptor(self)


@dataclass
class PairRegions:
    """The before and after regions of one pair."""

    pair_id: str
    before: Region
    after: Region


def soft_patch_mask(mask: np.ndarray, grid: int = 16, sigma: float = 1.0) -> np.ndarray:
    """Eq. 6: M^ = GaussianBlur(Downsample(M)) — average-pool to a grid×grid patch map, 3×3 blur, σ in patches."""
    pooled = cv2.resize(mask.astype(np.float32), (grid, grid), interpolation=cv2.INTER_AREA)
    return cv2.GaussianBlur(pooled, (3, 3), sigma, borderType=cv2.BORDER_CONSTANT)


def resize_mask(mask: np.ndarray, height: int, width: int) -> np.ndarray:
    """A mask in the image's size: nearest for binary masks, bilinear for soft ones (the "upsampled" M^)."""
    if mask.shape == (height, width):
        return mask.astype(np.float32)
    if mask.dtype == bool:
        return cv2.resize(mask.astype(np.uint8), (width, height), interpolation=cv2.INTER_NEAREST).astype(np.float32)
    return cv2.resize(mask.astype(np.float32), (width, height), interpolation=cv2.INTER_LINEAR)


def padded_box(mask: np.ndarray, pad: float) -> tuple[int, int, int, int] | None:
    """Bounding box of mask > 0.5, grown by `pad` × its width/height on each side, clipped to the image."""
    rows = np.flatnonzero((mask > 0.5).any(axis=1))
    cols = np.flatnonzero((mask > 0.5).any(axis=0))
    if rows.size == 0:
        return None
    y0, y1, x0, x1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
    grow_y, grow_x = int(math.ceil(pad * (y1 - y0))), int(math.ceil(pad * (x1 - x0)))
    height, width = mask.shape
    return max(0, x0 - grow_x), max(0, y0 - grow_y), min(width, x1 + grow_x), min(height, y1 + grow_y)


def masked_region(image: np.ndarray, mask: np.ndarray | None, *, pad: float = 0.1,
                  weighting: str = "binary") -> Region:
    """Eq. 8: I^m = I ⊙ M, cropped to the mask's box padded by `pad`; the whole image if M is empty.

    `weighting="binary"` multiplies by the full-resolution binary mask; `"soft"` by the paper's
    patch-level soft mask M^ (Eq. 6) bilinearly upsampled to the image. The crop box always comes
    from the binary mask, so a small object is not lost when its soft mask never exceeds 0.5.
    """
    if weighting not in MASK_WEIGHTINGS:
        raise ValueError(f"weighting must be one of {MASK_WEIGHTINGS}, got {weighting!r}")
    height, width = image.shape[:2]
    binary = None if mask is None else resize_mask(np.asarray(mask) > 0, height, width) > 0.5
    box = None if binary is None else padded_box(binary, pad)
    if box is None:
        return Region(crop=image.copy(), mask=np.ones((height, width), np.float32), box=(0, 0, width, height),
                      image_size=(width, height), empty=True)
    weights = binary.astype(np.float32) if weighting == "binary" else resize_mask(soft_patch_mask(binary), height, width)
    x0, y0, x1, y1 = box
    crop_weights = weights[y0:y1, x0:x1]
    crop = np.clip(image[y0:y1, x0:x1].astype(np.float32) * crop_weights[..., None] + 0.5, 0, 255).astype(np.uint8)
    return Region(crop=crop, mask=binary[y0:y1, x0:x1].astype(np.float32), box=box, image_size=(width, height),
                  empty=False)


def pair_regions(pair_id: str, before: np.ndarray, after: np.ndarray, masks: PairMasks, *,
                 mask_source: str = "per_image", pad: float = 0.1, weighting: str = "binary") -> PairRegions:
    """The regions of both images (Eq. 8).

    `union` applies one mask M = M_bef ∪ M_aft to both images, as the paper's single M^ does.
    `per_image` uses each image's own mask and falls back to the union where that mask is missing or
    empty (so an added object's location is still cut out of the before image); it differs from
    `union` only when the two masks are at different places (a moved object).
    """
    if mask_source not in MASK_SOURCES:
        raise ValueError(f"mask_source must be one of {MASK_SOURCES}, got {mask_source!r}")
    height, width = after.shape[:2]
    own = {"before": masks.before, "after": masks.after}
    resized = {side: None if m is None else resize_mask(np.asarray(m) > 0, height, width) > 0.5 for side, m in own.items()}
    present = [m for m in resized.values() if m is not None]
    union = np.logical_or.reduce(present) if present else None
    chosen = {}
    for side in ("before", "after"):
        mask = resized[side]
        chosen[side] = mask if mask_source == "per_image" and mask is not None and mask.any() else union
    return PairRegions(pair_id, masked_region(before, chosen["before"], pad=pad, weighting=weighting),
                       masked_region(after, chosen["after"], pad=pad, weighting=weighting))


# ---------------------------------------------------------------------------------------------------
# Retriever interface and top-k
# ---------------------------------------------------------------------------------------------------

class Retriever(Protocol):
    name: str

    def prepare(self, phrases: Sequence[str]) -> None: ...

    def score(self, pairs: Sequence[PairRegions]) -> np.ndarray: ...

    def frame_scores(self, images: Sequence[np.ndarray]) -> np.ndarray: ...

    def describe(self) -> dict: ...


def retrieve_top_k(retriever: "Retriever", regions: Sequence[PairRegions], phrases: Sequence[str],
                   k: int, gate: "EntityGate | None" = None) -> list[list[tuple[str, float]]]:
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


# ---------------------------------------------------------------------------------------------------
# CHEER §4.8: image-level change-entity retrieval (whole frames, no masks)
# ---------------------------------------------------------------------------------------------------

IMAGE_SCORES = ("abs", "bef_minus_aft")


def cheer_rank_entities(s_bef: np.ndarray, s_aft: np.ndarray, k: int, sign: str = "abs") -> list[tuple[int, float]]:
    """CHEER's entity ranking (methods.md §4.8 "Retrieval", CHEER Eq. 1): the k entities to keep, best first.

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


def retrieve_image_level(retriever: "Retriever", frames: Sequence[tuple[np.ndarray, np.ndarray]],
                         phrases: Sequence[str], k: int, sign: str = "abs") -> list[list[tuple[str, float]]]:
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


# ---------------------------------------------------------------------------------------------------
# Region descriptors of the fitted retriever
# ---------------------------------------------------------------------------------------------------

HUE_BINS, SAT_BINS, VAL_BINS = 18, 4, 4


def _descriptor_names() -> list[str]:
    names = [f"hue{i}" for i in range(HUE_BINS)] + ["achromatic"]
    names += [f"sat{i}" for i in range(SAT_BINS)] + [f"val{i}" for i in range(VAL_BINS)]
    names += ["lab_l_med", "lab_a_med", "lab_b_med", "lab_l_std", "lab_a_std", "lab_b_std"]
    names += ["l_p10", "l_p90", "highlight", "dark", "grad_mean", "lap_abs_mean"]
    names += ["sqrt_area", "box_w", "box_h", "aspect", "extent", "solidity", "circularity", "vertices"]
    names += [f"hu{i}" for i in range(7)]
    names += ["center_x", "center_y", "bottom_y", "size_at_depth", "empty"]
    return names


DESCRIPTOR_NAMES = _descriptor_names()
EMPTY_FLAG = DESCRIPTOR_NAMES.index("empty")  # 1 for a pair side without a change region


def region_descriptor(region: Region) -> np.ndarray:
    """Colour (HSV histograms, Lab statistics), material cues (highlights, texture) and mask shape.

    Material: metal shows small unsaturated highlights and strong gradients, rubber is flat.
    Size: the mask's √area, and √area relative to its foot's height in the image (a depth proxy,
    since objects further up a ground-plane scene are further away).
    """
    values = np.zeros(len(DESCRIPTOR_NAMES), np.float32)
    if region.empty:
        values[-1] = 1.0
        return values
    inside = region.mask > 0.5
    count = int(inside.sum())
    width, height = region.image_size
    hsv = cv2.cvtColor(region.crop, cv2.COLOR_RGB2HSV)
    hue, sat, val = (hsv[..., c][inside].astype(np.float32) for c in range(3))
    chroma = (sat / 255.0) * (val / 255.0)
    hue_hist = np.bincount(np.minimum((hue / 180.0 * HUE_BINS).astype(int), HUE_BINS - 1), weights=chroma,
                           minlength=HUE_BINS) / count
    features: list[float] = list(hue_hist) + [float(np.mean(chroma < 0.15))]
    features += list(np.bincount(np.minimum((sat / 256.0 * SAT_BINS).astype(int), SAT_BINS - 1), minlength=SAT_BINS) / count)
    features += list(np.bincount(np.minimum((val / 256.0 * VAL_BINS).astype(int), VAL_BINS - 1), minlength=VAL_BINS) / count)
    lab = cv2.cvtColor(region.crop, cv2.COLOR_RGB2LAB)[inside].astype(np.float32)
    features += list(np.median(lab, axis=0) / 255.0) + list(lab.std(axis=0) / 255.0)
    lightness = lab[:, 0] / 255.0
    features += [float(np.percentile(lightness, 10)), float(np.percentile(lightness, 90))]
    features += [float(np.mean((val > 220) & (sat < 80))), float(np.mean(val < 40))]
    gray = cv2.cvtColor(region.crop, cv2.COLOR_RGB2GRAY).astype(np.float32) / 255.0
    interior = cv2.erode(inside.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    interior = interior if interior.any() else inside
    gradient = np.hypot(cv2.Sobel(gray, cv2.CV_32F, 1, 0), cv2.Sobel(gray, cv2.CV_32F, 0, 1))
    features += [float(gradient[interior].mean()), float(np.abs(cv2.Laplacian(gray, cv2.CV_32F))[interior].mean())]

    mask_u8 = inside.astype(np.uint8)
    contours, _ = cv2.findContours(mask_u8, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    largest = max(contours, key=cv2.contourArea)
    area = float(count)
    ys, xs = np.nonzero(inside)
    box_w, box_h = float(xs.max() - xs.min() + 1), float(ys.max() - ys.min() + 1)
    hull_area = float(cv2.contourArea(cv2.convexHull(largest)))
    perimeter = float(cv2.arcLength(largest, True))
    vertices = len(cv2.approxPolyDP(largest, 0.02 * perimeter, True)) if perimeter > 0 else 0
    hu = cv2.HuMoments(cv2.moments(mask_u8, binaryImage=True)).ravel()
    hu = -np.sign(hu) * np.log10(np.abs(hu) + 1e-30)
    diagonal = math.hypot(width, height)
    x0, y0 = region.box[0], region.box[1]
    bottom = (y0 + ys.max() + 1) / height
    features += [math.sqrt(area) / diagonal, box_w / width, box_h / height, box_w / box_h,
                 area / (box_w * box_h), area / hull_area if hull_area > 0 else 1.0,
                 4 * math.pi * area / perimeter ** 2 if perimeter > 0 else 0.0, float(min(vertices, 12))]
    features += list(np.clip(hu, 0, 30) / 10.0)
    features += [(x0 + xs.mean()) / width, (y0 + ys.mean()) / height, bottom,
                 math.sqrt(area) / diagonal / max(bottom, 0.05), 0.0]
    values[:] = np.asarray(features, np.float32)
    return values


def whole_frame_region(image: np.ndarray) -> Region:
    """The whole image as a non-empty region (all-ones mask), for image-level retrieval.

    `masked_region(image, None)` also covers the whole frame but is marked `empty`, which
    `region_descriptor` maps to an all-zero "no change region" descriptor; this one is described.
    """
    height, width = image.shape[:2]
    return Region(crop=np.ascontiguousarray(image[..., :3]), mask=np.ones((height, width), np.float32),
                  box=(0, 0, width, height), image_size=(width, height), empty=False)


def frame_pair_features(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """`pair_features` of the two whole frames: (2, F), row 0 before, row 1 after."""
    return np.stack([region_descriptor(whole_frame_region(before)), region_descriptor(whole_frame_region(after))])


def pair_features(pair: PairRegions) -> np.ndarray:
    """The descriptors of both regions as a (2, F) array: row 0 before, row 1 after."""
    return np.stack([pair.before.descriptor, pair.after.descriptor])


# ---------------------------------------------------------------------------------------------------
# The fitted retriever
# ---------------------------------------------------------------------------------------------------

FITTED_MODES = ("mixture", "max")


def phrase_words(phrases: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The words of the vocabulary and the (phrases × words) 0/1 incidence matrix B."""
    words = sorted({word for phrase in phrases for word in phrase.split()})
    column = {word: i for i, word in enumerate(words)}
    incidence = np.zeros((len(phrases), len(words)), np.float64)
    for row, phrase in enumerate(phrases):
        for word in phrase.split():
            incidence[row, column[word]] = 1.0
    return words, incidence


def word_targets(label: dict[str, float], words: Sequence[str]) -> np.ndarray:
    """Soft target of each word: the share of the pair's named phrases (weighted) that contain it."""
    column = {word: i for i, word in enumerate(words)}
    target = np.zeros(len(words), np.float64)
    total = sum(label.values())
    for phrase, weight in label.items():
        for word in set(phrase.split()):
            target[column[word]] += weight / total
    return target


def fit_soft_logistic(x: np.ndarray, y: np.ndarray, *, weights: np.ndarray | None = None, C: float = 1.0,
                      max_iter: int = 500, start: tuple[np.ndarray, np.ndarray] | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """One-vs-rest logistic regressions with soft targets y ∈ [0, 1]^(n×k), fitted jointly by L-BFGS.

    Minimises Σ_i s_i Σ_w BCE(y_iw, σ(x_i·θ_w + b_w)) + ||θ||² / (2C) — per column the objective of
    scikit-learn's LogisticRegression(C) with sample weights s, which itself takes only hard labels.
    Returns (coef (k, f), intercept (k,)).
    """
    from scipy.optimize import minimize

    n, f = x.shape
    k = y.shape[1]
    s = np.ones(n) if weights is None else np.asarray(weights, np.float64)

    def objective(flat: np.ndarray) -> tuple[float, np.ndarray]:
        theta, bias = flat[: f * k].reshape(f, k), flat[f * k:]
        logits = x @ theta + bias
        # weighted BCE with logits, numerically stable: softplus(z) − y·z
        loss = np.sum(s[:, None] * (np.logaddexp(0.0, logits) - y * logits)) + 0.5 * np.sum(theta ** 2) / C
        residual = s[:, None] * (1.0 / (1.0 + np.exp(-logits)) - y)
        gradient = np.concatenate([(x.T @ residual + theta / C).ravel(), residual.sum(axis=0)])
        return float(loss), gradient

    initial = np.zeros(f * k + k)
    if start is not None:
        initial[: f * k], initial[f * k:] = start[0].T.ravel(), start[1]
    else:
        prior = np.clip(np.average(y, axis=0, weights=s), 1e-4, 1 - 1e-4)
        initial[f * k:] = np.log(prior / (1 - prior))
    result = minimize(objective, initial, jac=True, method="L-BFGS-B", options={"maxiter": max_iter})
    return result.x[: f * k].reshape(f, k).T.copy(), result.x[f * k:].copy()


def _log_sigmoid(z: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -z)


class FittedRetriever:
    """Region descriptors → vocabulary phrases, through one logistic regression per vocabulary word.

    Word model: each word w of the vocabulary ("small", "red", "metal", "sphere", "car", …) gets a
    logistic regression over one region's standardised descriptors, predicting whether the entity
    phrase contains w (soft target: the share of the pair's references whose phrase does). A phrase's
    score for a region is the likelihood of exactly its word set under these independent Bernoullis,
    normalised over the vocabulary: log P(p | region) = const + Σ_{w∈p} z_w, i.e. softmax(B·z).
    Sharing words makes it compositional — "small red metal sphere" borrows strength from every red
    object — so it needs far fewer examples per phrase than one class per phrase.

    Combining the two regions:
    * ``max`` — Eq. 9 literally: max(P(p | before), P(p | after)). It cannot know which image the
      caption describes, so for an attribute change it returns the new colour half of the time.
    * ``mixture`` (default) — π·P(p | before) + (1 − π)·P(p | after), where π = P(the caption
      describes the before image | both regions) is a logistic regression on both descriptors. Fitting
      alternates (a hard-EM on the latent side): the word model is fitted on both regions; each training
      pair's side target is σ(log-lik(before) − log-lik(after)) of its reference words; the word model
      is refitted with those side weights, and π is fitted to the side targets.
    """

    name = "fitted"

    def __init__(self, mode: str = "mixture", C: float = 1.0, max_iter: int = 500, rounds: int = 2):
        if mode not in FITTED_MODES:
            raise DataError(f"fitted retriever mode must be one of {FITTED_MODES}, got {mode!r}")
        self.mode, self.C, self.max_iter, self.rounds = mode, C, max_iter, rounds
        self.phrases: list[str] = []
        self.words: list[str] = []
        self.incidence = np.zeros((0, 0))
        self.mean = self.scale = self.coef = self.intercept = None
        self.side_coef = self.side_intercept = None
        self.training: dict = {}

    # -- fitting -----------------------------------------------------------------------------------
    def fit(self, pairs: Sequence[PairRegions], labels: Sequence[dict[str, float]], phrases: Sequence[str]) -> None:
        """Fit on training pairs; labels[i] maps the phrases pair i's references name to their share."""
        self.fit_features([pair_features(p) for p in pairs], labels, phrases)

    def fit_features(self, features: Sequence[np.ndarray], labels: Sequence[dict[str, float]],
                     phrases: Sequence[str]) -> None:
        """Fit on the (2, F) `pair_features` of training pairs and their phrase shares (pairs naming none are skipped)."""
        self.phrases = list(phrases)
        self.words, self.incidence = phrase_words(self.phrases)
        vocabulary = set(self.phrases)
        kept, targets = [], []
        for pair_rows, label in zip(features, labels):
            label = {p: w for p, w in label.items() if p in vocabulary and w > 0}
            if label:
                kept.append(pair_rows)
                targets.append(word_targets(label, self.words))
        if len(kept) < 2:
            raise DataError(f"the fitted retriever needs at least 2 training pairs naming a vocabulary phrase, got {len(kept)}")
        x = np.concatenate(kept).astype(np.float64)  # rows: before0, after0, before1, after1, …
        self.mean = x.mean(axis=0)
        scale = x.std(axis=0)
        self.scale = np.where(scale > 1e-8, scale, 1.0)
        x = (x - self.mean) / self.scale
        y = np.repeat(np.asarray(targets), 2, axis=0)
        self.coef, self.intercept = fit_soft_logistic(x, y, C=self.C, max_iter=self.max_iter)
        side = np.full(len(kept), 0.5)
        if self.mode == "mixture":
            for _ in range(self.rounds):
                z = x @ self.coef.T + self.intercept
                loglik = np.sum(y * _log_sigmoid(z) + (1 - y) * _log_sigmoid(-z), axis=1)
                side = 1.0 / (1.0 + np.exp(-np.clip(loglik[0::2] - loglik[1::2], -50, 50)))
                weights = np.stack([side, 1 - side], axis=1).ravel()
                self.coef, self.intercept = fit_soft_logistic(x, y, weights=weights, C=self.C, max_iter=self.max_iter,
                                                              start=(self.coef, self.intercept))
            pair_x = np.concatenate([x[0::2], x[1::2]], axis=1)
            self.side_coef, self.side_intercept = fit_soft_logistic(pair_x, side[:, None], C=self.C,
                                                                    max_iter=self.max_iter)
        self.training = {"pairs": len(kept), "words": len(self.words),
                         "share_describing_before": round(float(np.mean(side > 0.5)), 4)}

    # -- scoring -----------------------------------------------------------------------------------
    def prepare(self, phrases: Sequence[str]) -> None:
        if self.coef is None:
            raise DataError("the fitted retriever has not been fitted or loaded")
        if list(phrases) != self.phrases:
            raise DataError("the fitted retriever was fitted on another entity vocabulary; refit it (new --out)")

    def phrase_logits(self, features: np.ndarray) -> np.ndarray:
        """Per region: B·z, each phrase's word-set log-likelihood up to a per-region constant."""
        return (((features - self.mean) / self.scale) @ self.coef.T + self.intercept) @ self.incidence.T

    def phrase_scores(self, features: np.ndarray) -> np.ndarray:
        """Per region: softmax over phrases of B·z, the normalised likelihood of each phrase's word set."""
        logits = self.phrase_logits(features)
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        return exp / exp.sum(axis=1, keepdims=True)

    def side_probability(self, features: np.ndarray) -> np.ndarray:
        """π for each pair ((2·pairs, F) rows): the probability that its entity is the before region's."""
        x = (features - self.mean) / self.scale
        logits = np.concatenate([x[0::2], x[1::2]], axis=1) @ self.side_coef.T + self.side_intercept
        return 1.0 / (1.0 + np.exp(-logits[:, 0]))

    def score(self, pairs: Sequence[PairRegions]) -> np.ndarray:
        """(pairs, vocabulary) phrase probabilities."""
        if self.coef is None:
            raise DataError("the fitted retriever has not been fitted or loaded")
        if not pairs:
            return np.zeros((0, len(self.phrases)))
        features = np.concatenate([pair_features(p) for p in pairs])
        per_region = self.phrase_scores(features)
        before, after = per_region[0::2], per_region[1::2]
        if self.mode == "max":  # Eq. 9: the better of the before and after region
            return np.maximum(before, after)
        side = self.side_probability(features)[:, None]
        return side * before + (1 - side) * after

    def frame_scores(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """Image-level S (CHEER §4.8) for whole frames: (frames, vocabulary) phrase logits B·z.

        The weight-free analog of CLIP's cosine similarity between a global image embedding and each
        entity's text embedding: the region descriptors of the whole frame (`whole_frame_region`;
        colour and material statistics of the full image, the shape features then constant) through
        the word model. B·z, not its softmax, because the cosine is CLIP's pre-softmax logit (× its
        temperature): neither is normalised over the vocabulary per image. The retriever must have been
        fitted on whole frames too (`training["input"] == "whole_frame"`), so its standardisation
        and word weights describe whole-frame statistics, not object crops.
        """
        if self.coef is None:
            raise DataError("the fitted retriever has not been fitted or loaded")
        if not len(images):
            return np.zeros((0, len(self.phrases)))
        features = np.stack([region_descriptor(whole_frame_region(np.asarray(image))) for image in images])
        return self.phrase_logits(features)

    # -- storage: JSON + npz of plain arrays -------------------------------------------------------
    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {"mean": self.mean, "scale": self.scale, "coef": self.coef, "intercept": self.intercept}
        if self.mode == "mixture":
            arrays.update(side_coef=self.side_coef, side_intercept=self.side_intercept)
        tmp = folder / ".fitted.tmp.npz"
        np.savez(tmp, **arrays)
        tmp.replace(folder / "fitted.npz")
        write_json_atomic(folder / "fitted.json", {
            "retriever": self.name, "mode": self.mode, "C": self.C, "phrases": self.phrases, "words": self.words,
            "features": DESCRIPTOR_NAMES, "training": self.training,
        })

    @classmethod
    def exists(cls, folder: str | Path) -> bool:
        return (Path(folder) / "fitted.json").is_file() and (Path(folder) / "fitted.npz").is_file()

    @classmethod
    def load(cls, folder: str | Path) -> "FittedRetriever":
        folder = Path(folder)
        meta = read_json(folder / "fitted.json")
        if meta.get("features") != DESCRIPTOR_NAMES or meta.get("mode") not in FITTED_MODES:
            raise DataError(f"{folder / 'fitted.json'}: fitted with other region descriptors or mode; refit it")
        retriever = cls(mode=meta["mode"], C=float(meta["C"]))
        try:
            with np.load(folder / "fitted.npz", allow_pickle=False) as arrays:
                retriever.mean, retriever.scale = arrays["mean"], arrays["scale"]
                retriever.coef, retriever.intercept = arrays["coef"], arrays["intercept"]
                if retriever.mode == "mixture":
                    retriever.side_coef, retriever.side_intercept = arrays["side_coef"], arrays["side_intercept"]
        except (OSError, KeyError, ValueError) as error:
            raise DataError(f"{folder / 'fitted.npz'}: unreadable fitted retriever ({error})") from error
        retriever.phrases = list(meta["phrases"])
        retriever.words, retriever.incidence = phrase_words(retriever.phrases)
        if retriever.words != meta.get("words"):
            raise DataError(f"{folder / 'fitted.json'}: its words do not match its phrases")
        retriever.training = dict(meta.get("training", {}))
        width = len(DESCRIPTOR_NAMES)
        if retriever.coef.shape != (len(retriever.words), width) or retriever.mean.shape != (width,) or (
                retriever.mode == "mixture" and retriever.side_coef.shape != (1, 2 * width)):
            raise DataError(f"{folder}: fitted arrays do not match {len(retriever.words)} words × {width} features")
        return retriever

    def describe(self) -> dict:
        return {"retriever": self.name, "mode": self.mode, "C": self.C, "training": self.training}


# ---------------------------------------------------------------------------------------------------
# The entity gate: does a change region show a change the captions name?
# ---------------------------------------------------------------------------------------------------

def gate_features(pair_rows: np.ndarray) -> np.ndarray:
    """(2, F) `pair_features` → (3F,) gate input: the before and after descriptors and |before − after|.

    The difference carries the signal: a real change alters colour, material or presence inside the
    region, while a camera or light change leaves the same object in both crops.
    """
    before, after = np.asarray(pair_rows, np.float64)
    return np.concatenate([before, after, np.abs(before - after)])


class EntityGate:
    """P(the references name an entity | the two change regions of a pair): one logistic regression.

    The mask pipeline also finds change regions in pairs where nothing the captions name has changed:
    on the built-in set a camera shift or a light change leaves differences along object edges, and the
    retriever then names an object of a "nothing changed" pair, which the captioner tends to follow.
    DAVIR's Eq. 9 always retrieves; this gate [D] withholds the entities of a pair whose probability is
    below `threshold`, so such a pair gets the prompt of a pair without a change region.

    Fitted on the fit split's pairs with a change region (empty ones get no entity anyway): target 1
    when its references name a vocabulary phrase, 0 when they name none (CLEVR-style distractor and
    "no change" pairs). It uses only the weight-free region descriptors, so it serves either retriever.
    A fit split with fewer than `min_per_class` pairs of either kind (Spot-the-Diff and Image Editing
    Request have no "no change" pairs) leaves the gate inactive: it then keeps every pair, and
    `training["inactive"]` says why. Stored as JSON + npz like FittedRetriever.
    """

    name = "fitted"

    def __init__(self, threshold: float = 0.5, C: float = 1.0, max_iter: int = 500, min_per_class: int = 10):
        if not 0.0 <= threshold <= 1.0:
            raise DataError(f"entity gate threshold must lie in [0, 1], got {threshold}")
        self.threshold, self.C, self.max_iter, self.min_per_class = threshold, C, max_iter, min_per_class
        self.mean = self.scale = self.coef = self.intercept = None
        self.training: dict = {}

    @property
    def active(self) -> bool:
        return self.coef is not None

    def fit(self, features: Sequence[np.ndarray], names_entity: Sequence[bool]) -> None:
        """Fit on the (2, F) `pair_features` of pairs and whether their references name an entity.

        Pairs without a change region (both descriptors flagged `empty`) are left out: they never get an entity.
        """
        if len(features) != len(names_entity):
            raise DataError(f"entity gate: {len(features)} feature rows but {len(names_entity)} labels")
        with_region = [i for i, rows in enumerate(features) if not (rows[0][EMPTY_FLAG] and rows[1][EMPTY_FLAG])]
        features = [features[i] for i in with_region]
        y = np.asarray([names_entity[i] for i in with_region], np.float64)
        counts = {"naming_an_entity": int(y.sum()), "naming_none": int(len(y) - y.sum())}
        self.training = {"pairs": len(y), **counts, "without_region": len(names_entity) - len(y)}
        if min(counts.values()) < self.min_per_class:
            self.mean = self.scale = self.coef = self.intercept = None
            self.training["inactive"] = (f"the fit split has {counts['naming_an_entity']} pairs with a change region "
                                         f"naming an entity and {counts['naming_none']} naming none; the gate needs "
                                         f"{self.min_per_class} of each, so it keeps every pair")
            return
        x = np.stack([gate_features(rows) for rows in features])
        self.mean = x.mean(axis=0)
        scale = x.std(axis=0)
        self.scale = np.where(scale > 1e-8, scale, 1.0)
        coef, intercept = fit_soft_logistic((x - self.mean) / self.scale, y[:, None], C=self.C, max_iter=self.max_iter)
        self.coef, self.intercept = coef[0], float(intercept[0])
        predicted = self.probability(features) >= self.threshold
        self.training["fit_accuracy"] = round(float(np.mean(predicted == (y > 0.5))), 4)

    def probability(self, features: Sequence[np.ndarray]) -> np.ndarray:
        """P(the references name an entity) per pair, from its (2, F) `pair_features`; ones when inactive."""
        if not self.active:
            return np.ones(len(features))
        x = (np.stack([gate_features(rows) for rows in features]) - self.mean) / self.scale
        return 1.0 / (1.0 + np.exp(-np.clip(x @ self.coef + self.intercept, -50, 50)))

    def keeps(self, pairs: Sequence[PairRegions]) -> np.ndarray:
        """Whether each pair's entities are kept (probability ≥ threshold)."""
        if not self.active:
            return np.ones(len(pairs), bool)
        return self.probability([pair_features(pair) for pair in pairs]) >= self.threshold

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if self.active:
            tmp = folder / ".gate.tmp.npz"
            np.savez(tmp, mean=self.mean, scale=self.scale, coef=self.coef, intercept=np.array([self.intercept]))
            tmp.replace(folder / "gate.npz")
        write_json_atomic(folder / "gate.json", {
            "gate": self.name, "threshold": self.threshold, "C": self.C, "active": self.active,
            "features": DESCRIPTOR_NAMES, "training": self.training,
        })

    @classmethod
    def exists(cls, folder: str | Path) -> bool:
        return (Path(folder) / "gate.json").is_file()

    @classmethod
    def load(cls, folder: str | Path) -> "EntityGate":
        folder = Path(folder)
        meta = read_json(folder / "gate.json")
        if meta.get("features") != DESCRIPTOR_NAMES:
            raise DataError(f"{folder / 'gate.json'}: fitted with other region descriptors; refit it")
        gate = cls(threshold=float(meta["threshold"]), C=float(meta["C"]))
        gate.training = dict(meta.get("training", {}))
        if not meta.get("active"):
            return gate
        try:
            with np.load(folder / "gate.npz", allow_pickle=False) as arrays:
                gate.mean, gate.scale, gate.coef = arrays["mean"], arrays["scale"], arrays["coef"]
                gate.intercept = float(arrays["intercept"][0])
        except (OSError, KeyError, ValueError, IndexError) as error:
            raise DataError(f"{folder / 'gate.npz'}: unreadable entity gate ({error})") from error
        width = 3 * len(DESCRIPTOR_NAMES)
        if gate.coef.shape != (width,) or gate.mean.shape != (width,) or gate.scale.shape != (width,):
            raise DataError(f"{folder / 'gate.npz'}: gate arrays do not match {width} features")
        return gate

    def describe(self) -> dict:
        return {"gate": self.name, "threshold": self.threshold, "C": self.C, "active": self.active,
                "training": self.training}


# ---------------------------------------------------------------------------------------------------
# The CLIP retriever (open_clip, local checkpoint only)
# ---------------------------------------------------------------------------------------------------

def square_pad(image: np.ndarray) -> np.ndarray:
    """Pad a crop with black (the masked-out value) to a square, so CLIP's centre crop cuts nothing."""
    height, width = image.shape[:2]
    side = max(height, width)
    out = np.zeros((side, side, 3), np.uint8)
    top, left = (side - height) // 2, (side - width) // 2
    out[top:top + height, left:left + width] = image
    return out


def load_open_clip(model_name: str, checkpoint: str | Path, *, config: str | Path | None = None, device: str = "cpu"):
    """An open_clip model and its eval transform from a local state-dict file (never a hub tag)."""
    try:
        import open_clip
    except ImportError as error:
        raise DataError("the clip retriever needs open_clip (`pip install open_clip_torch`)") from error
    if checkpoint is None or not Path(checkpoint).is_file():
        raise DataError(f"CLIP checkpoint file is missing: {checkpoint} (pass --clip-checkpoint with a local "
                        f"open_clip state dict for {model_name}; nothing is downloaded)")
    if config is not None:
        if not Path(config).is_file():
            raise DataError(f"open_clip model config file is missing: {config}")
        open_clip.add_model_config(Path(config))
    if model_name not in open_clip.list_models():
        raise DataError(f"unknown open_clip model {model_name!r} (pass --clip-config with its JSON config)")
    try:
        model, _, preprocess = open_clip.create_model_and_transforms(
            model_name, pretrained=str(checkpoint), device=device, pretrained_image=False)
    except RuntimeError as error:
        raise DataError(f"{checkpoint}: not an open_clip {model_name} checkpoint ({error})") from error
    model.eval()
    return model, preprocess, open_clip.get_tokenizer(model_name)


class ClipRetriever:
    """Eq. 9 with open_clip: score(e) = max(cos(img(I^m_bef), txt(e)), cos(img(I^m_aft), txt(e)))."""

    name = "clip"

    def __init__(self, model_name: str = "ViT-L-14", checkpoint: str | Path | None = None, *,
                 config: str | Path | None = None, device: str | None = None, prompt: str = DEFAULT_PROMPT,
                 batch_size: int = 32):
        import torch

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model_name, self.checkpoint, self.prompt, self.batch_size = model_name, checkpoint, prompt, batch_size
        self.model, self.preprocess, self.tokenizer = load_open_clip(model_name, checkpoint, config=config,
                                                                     device=self.device)
        self.text_embeddings = None

    def embed_texts(self, phrases: Sequence[str]) -> np.ndarray:
        """L2-normalised text embeddings of the prompted phrases."""
        import torch

        chunks = []
        with torch.no_grad():
            for start in range(0, len(phrases), self.batch_size):
                texts = [self.prompt.format(phrase=p) for p in phrases[start:start + self.batch_size]]
                features = self.model.encode_text(self.tokenizer(texts).to(self.device)).float()
                chunks.append(torch.nn.functional.normalize(features, dim=-1).cpu().numpy())
        return np.concatenate(chunks) if chunks else np.zeros((0, 0), np.float32)

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """L2-normalised image embeddings of region crops (square-padded, then CLIP's own transform)."""
        import torch
        from PIL import Image

        chunks = []
        with torch.no_grad():
            for start in range(0, len(images), self.batch_size):
                batch = torch.stack([self.preprocess(Image.fromarray(square_pad(image)))
                                     for image in images[start:start + self.batch_size]]).to(self.device)
                features = self.model.encode_image(batch).float()
                chunks.append(torch.nn.functional.normalize(features, dim=-1).cpu().numpy())
        return np.concatenate(chunks)

    def prepare(self, phrases: Sequence[str]) -> None:
        self.text_embeddings = self.embed_texts(list(phrases))

    def score(self, pairs: Sequence[PairRegions]) -> np.ndarray:
        if self.text_embeddings is None:
            raise DataError("call prepare(phrases) before score()")
        if not pairs:
            return np.zeros((0, len(self.text_embeddings)))
        images = [region.crop for pair in pairs for region in (pair.before, pair.after)]
        similarity = self.embed_images(images) @ self.text_embeddings.T
        return np.maximum(similarity[0::2], similarity[1::2]).astype(np.float64)

    def frame_scores(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """Image-level S (CHEER §4.8): cosine of each whole frame's global CLIP embedding to every entity.

        Frames are square-padded like region crops [D]: CLIP's own centre crop would cut the outer sixth
        of each side of a 3:2 frame (CLEVR's 480×320), where the changed object may be.
        """
        if self.text_embeddings is None:
            raise DataError("call prepare(phrases) before frame_scores()")
        if not len(images):
            return np.zeros((0, len(self.text_embeddings)))
        return (self.embed_images([np.asarray(image) for image in images]) @ self.text_embeddings.T).astype(np.float64)

    def describe(self) -> dict:
        return {"retriever": self.name, "model": self.model_name, "checkpoint": str(self.checkpoint),
                "prompt": self.prompt}


RETRIEVERS: dict[str, Callable[..., Retriever]] = {"fitted": FittedRetriever, "clip": ClipRetriever}


def build_retriever(name: str, **options) -> Retriever:
    """A retriever by registry name with its options (see FittedRetriever / ClipRetriever)."""
    if name not in RETRIEVERS:
        raise DataError(f"unknown retriever {name!r}; choose from {', '.join(sorted(RETRIEVERS))}")
    return RETRIEVERS[name](**options)
