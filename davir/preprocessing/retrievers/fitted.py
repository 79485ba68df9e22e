"""The fitted retriever: region descriptors → vocabulary phrases, with no pretrained weights at all."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from davir.errors import DataError
from davir.io import atomic_path, read_json, write_json_atomic
from davir.preprocessing.components import option
from davir.preprocessing.retrievers.regions import (
    DESCRIPTOR_NAMES,
    PairRegions,
    pair_features,
    region_descriptor,
    whole_frame_region,
)

FITTED_MODES = ("mixture", "max")


@dataclass(frozen=True)
class FittedSettings:
    """The fitted retriever's settings (recorded in an entity cache's manifest under these names)."""

    fitted_mode: str = field(
        default="mixture",
        metadata=option(
            "--fitted-mode",
            "weight the two regions by a learned 'caption describes the before image' probability, or take Eq. 9's max",
            choices=FITTED_MODES,
        ),
    )
    fitted_C: float = field(
        default=1.0, metadata=option("--fitted-C", "inverse L2 strength of the logistic regression")
    )


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


def fit_soft_logistic(
    x: np.ndarray,
    y: np.ndarray,
    *,
    weights: np.ndarray | None = None,
    C: float = 1.0,
    max_iter: int = 500,
    start: tuple[np.ndarray, np.ndarray] | None = None,
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
        theta, bias = flat[: f * k].reshape(f, k), flat[f * k :]
        logits = x @ theta + bias
        # weighted BCE with logits, numerically stable: softplus(z) − y·z
        loss = np.sum(s[:, None] * (np.logaddexp(0.0, logits) - y * logits)) + 0.5 * np.sum(theta**2) / C
        residual = s[:, None] * (1.0 / (1.0 + np.exp(-logits)) - y)
        gradient = np.concatenate([(x.T @ residual + theta / C).ravel(), residual.sum(axis=0)])
        return float(loss), gradient

    initial = np.zeros(f * k + k)
    if start is not None:
        initial[: f * k], initial[f * k :] = start[0].T.ravel(), start[1]
    else:
        prior = np.clip(np.average(y, axis=0, weights=s), 1e-4, 1 - 1e-4)
        initial[f * k :] = np.log(prior / (1 - prior))
    result = minimize(objective, initial, jac=True, method="L-BFGS-B", options={"maxiter": max_iter})
    return result.x[: f * k].reshape(f, k).T.copy(), result.x[f * k :].copy()


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

    def fit_features(
        self, features: Sequence[np.ndarray], labels: Sequence[dict[str, float]], phrases: Sequence[str]
    ) -> None:
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
            raise DataError(
                f"the fitted retriever needs at least 2 training pairs naming a vocabulary phrase, got {len(kept)}"
            )
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
                self.coef, self.intercept = fit_soft_logistic(
                    x, y, weights=weights, C=self.C, max_iter=self.max_iter, start=(self.coef, self.intercept)
                )
            pair_x = np.concatenate([x[0::2], x[1::2]], axis=1)
            self.side_coef, self.side_intercept = fit_soft_logistic(
                pair_x, side[:, None], C=self.C, max_iter=self.max_iter
            )
        self.training = {
            "pairs": len(kept),
            "words": len(self.words),
            "share_describing_before": round(float(np.mean(side > 0.5)), 4),
        }

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
        with atomic_path(folder / "fitted.npz", suffix=".tmp.npz") as tmp:  # np.savez adds .npz to other names
            np.savez(tmp, **arrays)
        write_json_atomic(
            folder / "fitted.json",
            {
                "retriever": self.name,
                "mode": self.mode,
                "C": self.C,
                "phrases": self.phrases,
                "words": self.words,
                "features": DESCRIPTOR_NAMES,
                "training": self.training,
            },
        )

    @classmethod
    def exists(cls, folder: str | Path) -> bool:
        return (Path(folder) / "fitted.json").is_file() and (Path(folder) / "fitted.npz").is_file()

    @classmethod
    def load(cls, folder: str | Path) -> FittedRetriever:
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
        if (
            retriever.coef.shape != (len(retriever.words), width)
            or retriever.mean.shape != (width,)
            or (retriever.mode == "mixture" and retriever.side_coef.shape != (1, 2 * width))
        ):
            raise DataError(f"{folder}: fitted arrays do not match {len(retriever.words)} words × {width} features")
        return retriever

    def describe(self) -> dict:
        return {"retriever": self.name, "mode": self.mode, "C": self.C, "training": self.training}

    # -- the registry's hooks: fitted on the fit split by `preprocess entities`, loaded from its folder ---------
    @classmethod
    def fit_new(
        cls,
        settings: FittedSettings,
        features: Sequence[np.ndarray],
        labels: Sequence[dict[str, float]],
        phrases: Sequence[str],
    ) -> FittedRetriever:
        retriever = cls(mode=settings.fitted_mode, C=settings.fitted_C)
        retriever.fit_features(features, labels, phrases)
        return retriever

    @classmethod
    def build(cls, settings: FittedSettings, *, checkpoint=None, device=None, folder: str | Path) -> FittedRetriever:
        """The retriever fitted into `folder` (an entity cache's retriever/), checked against `settings`."""
        retriever = cls.load(folder)
        if (retriever.mode, retriever.C) != (settings.fitted_mode, settings.fitted_C):
            raise DataError(
                f"{folder} holds a fitted retriever with mode {retriever.mode!r}, C {retriever.C}, not "
                f"{settings.fitted_mode!r}, {settings.fitted_C}; use another --out"
            )
        return retriever
