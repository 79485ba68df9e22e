"""Pretrain the tiny ResNet backbone whose layer3 grid features the lightweight demo methods read.

    python -m davir.data synth --out /tmp/synth_bb --scenes 1500 --seed 17       # not the demo's seed 0
    python -m davir.pretrain_backbone --data /tmp/synth_bb --out davir/assets/tiny_resnet --minutes 15
    python -m davir.pretrain_backbone probe --data SET [--weights OUT/backbone.pth]     # linear probes of layer3

The network, the "what is where" task, the crops and the outputs: docs/experiments/tiny_backbone.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch import nn

from davir.config import FieldError, require
from davir.data.images import load_rgb
from davir.data.synthetic import COLORS, MATERIALS, SHAPES, SIZES, load_synthetic_set
from davir.errors import DataError, check_output_dir
from davir.io import atomic_path, read_json, write_json_atomic
from davir.models.resnet_layout import build_resnet, truncate_at_layer3

IMAGE_SIZE = 224
GRID = 14
CELL = IMAGE_SIZE // GRID
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
BLOCKS = [1, 1, 1]
WIDTH_PER_GROUP = 32
# Attribute → class names; class 0 of every head is "background" (no object box holds the cell centre).
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "color": tuple(COLORS),
    "shape": SHAPES,
    "material": MATERIALS,
    "size": tuple(SIZES),
}
IMAGE_KEYS = ("before", "after", "nonsemantic")


# --- data -----------------------------------------------------------------------------------------
def cell_labels(objects: list[dict], width: int, height: int) -> np.ndarray:
    """(4, 14, 14) int64: per attribute, 1 + the class of the nearest object whose box holds the cell
    centre, 0 where none does. Boxes are [x0, y0, x1, y1) in the original image; cells split the image
    evenly as the 224×224 resize does."""
    labels = np.zeros((len(ATTRIBUTES), GRID, GRID), np.int64)
    xs = (np.arange(GRID) + 0.5) * width / GRID
    ys = (np.arange(GRID) + 0.5) * height / GRID
    for obj in sorted(objects, key=lambda o: -o["depth_order"]):  # far to near: nearer overwrite
        x0, y0, x1, y1 = obj["box"]
        inside = ((ys >= y0) & (ys < y1))[:, None] & ((xs >= x0) & (xs < x1))[None, :]
        for a, (name, classes) in enumerate(ATTRIBUTES.items()):
            labels[a][inside] = 1 + classes.index(obj[name])
    return labels


def load_resized(path: Path) -> np.ndarray:
    """uint8 (224, 224, 3), bicubic as `preprocess features`."""
    rgb = np.asarray(load_rgb(path, record=str(path)))
    return cv2.resize(rgb, (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_CUBIC)


def load_cells(root: Path, split: str, *, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every image of a split's scenes (before, after, distractor): uint8 (N, 3, 224, 224), labels (N, 4, 14, 14)."""
    data = load_synthetic_set(root)
    config = data["config"]
    ids = read_json(root / "splits.json")[split][:limit]
    images, labels = [], []
    for index in ids:
        record = data["scenes"][f"{index:06d}"]
        for key in IMAGE_KEYS:
            image = record["images"][key]
            images.append(load_resized(root / image["file"]))
            labels.append(cell_labels(image["objects"], config["width"], config["height"]))
    if not images:
        raise DataError(f"{root}: split {split!r} has no scenes")
    return (torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(np.stack(labels)))


def normalize(images: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (images.float() / 255.0 - mean) / std


# --- model ----------------------------------------------------------------------------------------
class CellClassifier(nn.Module):
    """Backbone up to layer3 + one 1×1 conv giving every attribute's logits per cell."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = build_resnet(BLOCKS, WIDTH_PER_GROUP)
        self.backbone = truncate_at_layer3(self.net)
        self.sizes = [1 + len(classes) for classes in ATTRIBUTES.values()]
        self.head = nn.Conv2d(1024, sum(self.sizes), 1)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return list(self.head(self.backbone(x)).split(self.sizes, dim=1))

    def backbone_state(self) -> dict[str, torch.Tensor]:
        """torchvision ResNet state dict of conv1 … layer3 (no fc, no layer4): what `--weights` loads."""
        return {k: v.detach().clone() for k, v in self.net.state_dict().items() if not k.startswith(("fc.", "layer4."))}


def cell_loss(logits: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    """Sum over attributes of the cell cross-entropy; object cells weigh as much as all background cells."""
    total = logits[0].new_zeros(())
    for a, logit in enumerate(logits):
        target = labels[:, a]
        weight = torch.ones(logit.shape[1], device=logit.device)
        weight[0] = 0.25  # ~70 % of cells are floor
        total = total + nn.functional.cross_entropy(logit, target, weight=weight)
    return total


@torch.no_grad()
def cell_accuracy(
    model: CellClassifier, images: torch.Tensor, labels: torch.Tensor, batch: int = 32
) -> dict[str, float]:
    """Per attribute, accuracy on cells that hold an object (the class, not "background"), plus object/floor."""
    model.eval()
    hits = np.zeros(len(ATTRIBUTES))
    objects = floor_hits = floor = presence_hits = 0
    for start in range(0, len(images), batch):
        logits = model(normalize(images[start : start + batch]))
        target = labels[start : start + batch]
        occupied = target[:, 0] > 0
        objects += int(occupied.sum())
        floor += int((~occupied).sum())
        for a, logit in enumerate(logits):
            hits[a] += int((logit.argmax(1) == target[:, a])[occupied].sum())
        predicted_object = logits[0].argmax(1) > 0
        presence_hits += int((predicted_object == occupied).sum())
        floor_hits += int((~predicted_object)[~occupied].sum())
    model.train()
    result = {name: round(hits[a] / max(objects, 1), 4) for a, name in enumerate(ATTRIBUTES)}
    result["object_vs_floor"] = round(presence_hits / max(objects + floor, 1), 4)
    return result


def random_crops(
    images: torch.Tensor, labels: torch.Tensor, cells: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A `cells`×`cells` cell window (16-pixel aligned) of each image, random position and horizontal flip."""
    out_images, out_labels = [], []
    for image, label in zip(images, labels):
        r, c = (int(v) for v in torch.randint(0, GRID - cells + 1, (2,), generator=generator))
        crop = image[:, r * CELL : (r + cells) * CELL, c * CELL : (c + cells) * CELL]
        cell = label[:, r : r + cells, c : c + cells]
        if bool(torch.rand((), generator=generator) < 0.5):
            crop, cell = crop.flip(-1), cell.flip(-1)
        out_images.append(crop)
        out_labels.append(cell)
    return torch.stack(out_images), torch.stack(out_labels)


# --- settings -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PretrainSettings:
    """What `pretrain_backbone` trains on, where it writes and how long (the command's flags, same defaults)."""

    data: str | Path  # a synthetic set (python -m davir.data synth), not the demo's seed
    out: str | Path  # folder for backbone.pth, head.pth, pretrain_info.json
    minutes: float = 15.0  # wall-clock training budget
    max_steps: int = 0  # stop after this many steps (0 = time only)
    batch_size: int = 24
    crop_cells: int = 7  # crop side in 16-pixel cells (14 = whole image)
    lr: float = 2e-3
    seed: int = 0
    threads: int = 1
    eval_every: int = 200
    eval_scenes: int = 60  # held-out test scenes (3 images each)
    train_limit: int | None = None  # use only the first N train scenes

    def __post_init__(self) -> None:
        require("minutes", self.minutes, above=0)  # 0 trained no step and saved the random weights, exit 0
        require("lr", self.lr, above=0)  # -1 and nan stopped in AdamW with a traceback
        if not math.isfinite(self.lr):  # inf trained the weights to NaN, exit 0
            raise FieldError("lr", f"must be a finite number, got {self.lr}")
        require("max_steps", self.max_steps, at_least=0)
        require("batch_size", self.batch_size, at_least=1)
        require("crop_cells", self.crop_cells, at_least=1, at_most=GRID)
        require("threads", self.threads, at_least=1)
        require("eval_every", self.eval_every, at_least=1)
        require("eval_scenes", self.eval_scenes, at_least=1)
        require("train_limit", self.train_limit, at_least=1)

    def record(self) -> dict[str, Any]:
        """The settings as pretrain_info.json keeps them (paths as text)."""
        return {**dataclasses.asdict(self), "data": str(self.data), "out": str(self.out)}


@dataclass(frozen=True)
class ProbeSettings:
    """What `probe_backbone` probes: a set's train and test splits, with a backbone file or a random-init one."""

    data: str | Path  # a synthetic set (train and test splits are probed)
    weights: str | Path | None = None  # backbone state dict (None: a random-init ResNet-101)
    seed: int = 0  # seed of the random-init backbone
    scenes: int = 150  # scenes per split (their before images)
    threads: int = 1

    def __post_init__(self) -> None:
        require("scenes", self.scenes, at_least=1)
        require("threads", self.threads, at_least=1)


# --- training -------------------------------------------------------------------------------------
def package_versions() -> dict[str, str]:
    import torchvision

    return {"python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__}


INFO_FILE = "pretrain_info.json"
OUTPUTS = ("backbone.pth", "head.pth", INFO_FILE)


def check_out(out: str | Path) -> Path:
    """Before any work: `out` can become a folder and is new, empty or a folder this command wrote (its
    pretrain_info.json records the "layout"); a folder of other files (a model of pretrain_tiny, whose
    pretrain_info.json it would replace, or a user's backbone.pth) is refused, nothing in it replaced."""
    out = check_output_dir(out, what="--out")
    if not out.is_dir() or not any(out.iterdir()):
        return out
    try:
        info = read_json(out / INFO_FILE)
    except DataError:
        info = None
    if not (isinstance(info, dict) and "layout" in info):
        raise DataError(
            f"--out {out} holds files that python -m davir.pretrain_backbone did not write (no {INFO_FILE} of "
            f"its own), where its {', '.join(OUTPUTS)} would go; give a new or empty folder"
        )
    return out


def save(model: CellClassifier, out: Path, info: dict[str, Any]) -> None:
    """Write backbone.pth, head.pth and pretrain_info.json (each to a temporary name, then renamed)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, state in (("backbone.pth", model.backbone_state()), ("head.pth", model.head.state_dict())):
        with atomic_path(out / name) as tmp:
            torch.save(state, tmp)
    write_json_atomic(out / "pretrain_info.json", info)


def pretrain_backbone(settings: PretrainSettings, *, command: str | None = None) -> dict[str, Any]:
    """Train until the time budget (or `max_steps`) is spent, saving at every held-out evaluation; returns the
    info written to OUT/pretrain_info.json. `command`: the command line recorded there (None from Python)."""
    root, out = Path(settings.data), check_out(settings.out)
    torch.set_num_threads(settings.threads)
    config = load_synthetic_set(root)["config"]
    started = time.perf_counter()
    train_images, train_labels = load_cells(root, "train", limit=settings.train_limit)
    eval_images, eval_labels = load_cells(root, "test", limit=settings.eval_scenes)
    print(
        f"loaded {len(train_images)} train / {len(eval_images)} held-out images in "
        f"{time.perf_counter() - started:.0f} s",
        flush=True,
    )
    model = CellClassifier(settings.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(settings.seed)
    budget = settings.minutes * 60.0
    info: dict[str, Any] = {
        "command": command,
        "data": {
            "root": str(root),
            "config": config,
            "train_images": len(train_images),
            "eval_images": len(eval_images),
        },
        "layout": {
            "class": "torchvision.models.resnet.ResNet(Bottleneck)",
            "blocks": BLOCKS,
            "width_per_group": WIDTH_PER_GROUP,
            "output": "layer3, 1024 x 14 x 14",
        },
        "attributes": {name: ["background", *classes] for name, classes in ATTRIBUTES.items()},
        "settings": settings.record(),
        "versions": package_versions(),
        "curve": [],
    }
    step, loop_start, running = 0, time.perf_counter(), []
    # Cosine schedule over the wall-clock budget (steps are not known in advance on a shared machine).
    while True:
        elapsed = time.perf_counter() - loop_start
        done = elapsed >= budget or (settings.max_steps and step >= settings.max_steps)
        if step % settings.eval_every == 0 or done:
            accuracy = cell_accuracy(model, eval_images, eval_labels)
            loss = float(np.mean(running)) if running else None
            info["curve"].append({"step": step, "seconds": round(elapsed, 1), "train_loss": loss, **accuracy})
            print(json.dumps(info["curve"][-1]), flush=True)
            running = []
            info["steps"], info["train_seconds"] = step, round(elapsed, 1)
            info["process_cpu_seconds"] = round(time.process_time(), 1)  # the wall budget is shared-machine time
            save(model, out, info)
        if done:
            return info
        progress = min(elapsed / budget, 1.0)
        if settings.max_steps:
            progress = max(progress, step / settings.max_steps)
        lr = settings.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = lr
        rows = torch.randint(0, len(train_images), (settings.batch_size,), generator=generator)
        images, labels = random_crops(train_images[rows], train_labels[rows], settings.crop_cells, generator)
        loss = cell_loss(model(normalize(images)), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        running.append(float(loss.detach()))
        step += 1


# --- probe ----------------------------------------------------------------------------------------
def load_backbone(weights: str | None, seed: int = 0) -> nn.Module:
    """`--weights FILE` (any bottleneck ResNet state dict) or a seeded random ResNet-101 (`random_backbone`)."""
    from davir.models.resnet_layout import LayoutError, backbone_from_state_dict, random_backbone

    if weights is None:
        return random_backbone(seed).eval()
    try:
        return backbone_from_state_dict(torch.load(weights, map_location="cpu", weights_only=True)).eval()
    except (OSError, LayoutError, RuntimeError) as error:
        raise DataError(f"{weights}: cannot load a ResNet state dict ({error})") from error


@torch.no_grad()
def probe_cells(
    backbone: nn.Module, root: Path, split: str, scenes: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Layer3 features (n, 1024) and labels (n, 4) of the object cells of `scenes` before images, plus as
    many floor cells (at most 8 per image)."""
    images, labels = load_cells(root, split, limit=scenes)
    images, labels = images[:: len(IMAGE_KEYS)], labels[:: len(IMAGE_KEYS)]  # the before images
    features, kept = [], []
    for start in range(0, len(images), 16):
        grid = backbone(normalize(images[start : start + 16])).flatten(2).transpose(1, 2)  # (b, 196, 1024)
        for cells, label in zip(grid.numpy(), labels[start : start + 16].flatten(2).transpose(1, 2).numpy()):
            occupied = np.flatnonzero(label[:, 0] > 0)
            floor = np.flatnonzero(label[:, 0] == 0)
            keep = np.concatenate([occupied, rng.choice(floor, size=min(len(occupied), 8, len(floor)), replace=False)])
            features.append(cells[keep])
            kept.append(label[keep])
    return np.concatenate(features), np.concatenate(kept)


def probe_backbone(settings: ProbeSettings) -> dict[str, Any]:
    """Linear probes (logistic regression on standardised layer3 cell features): what a cell encodes about
    the object over it. Fitted on cells of train-split before images, scored on test-split ones."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    torch.set_num_threads(settings.threads)
    root = Path(settings.data)
    weights = None if settings.weights is None else str(settings.weights)
    backbone = load_backbone(weights, settings.seed)
    rng = np.random.default_rng(0)
    x_train, y_train = probe_cells(backbone, root, "train", settings.scenes, rng)
    x_test, y_test = probe_cells(backbone, root, "test", settings.scenes, rng)
    scaler = StandardScaler().fit(x_train)
    x_train, x_test = scaler.transform(x_train), scaler.transform(x_test)
    result: dict[str, Any] = {
        "weights": weights or f"random-init ResNet-101 (seed {settings.seed})",
        "data": str(root),
        "train_cells": len(x_train),
        "test_cells": len(x_test),
    }
    occupied_train, occupied_test = y_train[:, 0] > 0, y_test[:, 0] > 0
    presence = LogisticRegression(max_iter=500, C=0.1).fit(x_train, occupied_train)
    result["object_vs_floor"] = round(float(presence.score(x_test, occupied_test)), 4)
    for a, name in enumerate(ATTRIBUTES):
        fit = LogisticRegression(max_iter=500, C=0.1).fit(x_train[occupied_train], y_train[occupied_train, a])
        result[name] = round(float(fit.score(x_test[occupied_test], y_test[occupied_test, a])), 4)
        counts = np.bincount(y_test[occupied_test, a])
        result[f"{name}_majority"] = round(float(counts.max() / counts.sum()), 4)
    return result
