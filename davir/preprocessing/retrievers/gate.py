"""The entity gate [D]: does a pair's change region show a change the captions would name?"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from davir.errors import DataError
from davir.io import atomic_path, read_json, write_json_atomic
from davir.preprocessing.retrievers.fitted import fit_soft_logistic
from davir.preprocessing.retrievers.regions import DESCRIPTOR_NAMES, EMPTY_FLAG, PairRegions, pair_features


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
            self.training["inactive"] = (
                f"the fit split has {counts['naming_an_entity']} pairs with a change region "
                f"naming an entity and {counts['naming_none']} naming none; the gate needs "
                f"{self.min_per_class} of each, so it keeps every pair"
            )
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
            with atomic_path(folder / "gate.npz", suffix=".tmp.npz") as tmp:  # np.savez adds .npz to other names
                np.savez(tmp, mean=self.mean, scale=self.scale, coef=self.coef, intercept=np.array([self.intercept]))
        write_json_atomic(
            folder / "gate.json",
            {
                "gate": self.name,
                "threshold": self.threshold,
                "C": self.C,
                "active": self.active,
                "features": DESCRIPTOR_NAMES,
                "training": self.training,
            },
        )

    @classmethod
    def exists(cls, folder: str | Path) -> bool:
        return (Path(folder) / "gate.json").is_file()

    @classmethod
    def load(cls, folder: str | Path) -> EntityGate:
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
        return {
            "gate": self.name,
            "threshold": self.threshold,
            "C": self.C,
            "active": self.active,
            "training": self.training,
        }
