"""Sampling a scene from its own random stream: objects placed in a valid layout, one change, the distractor views."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from davir.data.records import CHANGE_TYPES
from davir.data.synthetic.config import SynthConfig
from davir.data.synthetic.render import SpriteCache, in_frame, visible_coverage
from davir.data.synthetic.world import (
    BASE_CAMERA,
    COLORS,
    MATERIALS,
    SHAPES,
    SIZES,
    Camera,
    Illumination,
    PoseCamera,
    SceneObject,
    View,
)
from davir.errors import DataError

DISTRACTOR_KINDS = ("illumination", "viewpoint", "both")

MIN_VISIBLE = 0.6  # every object keeps at least this share of its pixels, so it can be named
GROUND_EXTENT = 3.2  # object centres lie in [-GROUND_EXTENT, GROUND_EXTENT]^2 (CLEVR uses ±3)
MIN_GAP = 0.15  # free ground between two objects' footprints
MIN_MOVE = 1.5  # a moved object travels at least this far on the ground


class _Layout:
    """Checks placements against one camera, with silhouettes from the scene's sprite cache."""

    def __init__(self, camera: Camera | PoseCamera, cache: SpriteCache, min_visible: float = MIN_VISIBLE):
        self.camera, self.cache = camera, cache
        self.width, self.height = cache.width, cache.height
        self.min_visible = min_visible

    def ok(self, objects: list[SceneObject]) -> bool:
        """Every object inside the frame and at least `min_visible` (MIN_VISIBLE unless told) visible."""
        sprites = [self.cache.silhouette(obj, self.camera) for obj in objects]
        if not all(in_frame(sprite, self.width, self.height) for sprite in sprites):
            return False
        visible = visible_coverage(sprites)
        return all(v is s.alpha or float(v.sum()) >= self.min_visible * s.area for v, s in zip(visible, sprites))


def _apart(candidate: SceneObject, others: list[SceneObject]) -> bool:
    return all(
        math.hypot(candidate.x - o.x, candidate.y - o.y) >= candidate.footprint + o.footprint + MIN_GAP for o in others
    )


def _random_attributes(rng: np.random.Generator) -> dict[str, Any]:
    return {
        "shape": SHAPES[rng.integers(len(SHAPES))],
        "color": list(COLORS)[rng.integers(len(COLORS))],
        "material": MATERIALS[rng.integers(len(MATERIALS))],
        "size": list(SIZES)[rng.integers(len(SIZES))],
    }


def _random_position(rng: np.random.Generator) -> tuple[float, float]:
    x, y = rng.uniform(-GROUND_EXTENT, GROUND_EXTENT, size=2)
    return round(float(x), 4), round(float(y), 4)


def _random_yaw(rng: np.random.Generator, shape: str) -> float:
    return round(float(rng.uniform(0.0, math.pi / 2.0)), 4) if shape == "cube" else 0.0


def _place(
    rng: np.random.Generator,
    attributes: dict[str, Any],
    others: list[SceneObject],
    layout: _Layout,
    tries: int = 40,
    away_from: tuple[float, float] | None = None,
) -> SceneObject | None:
    """A position for an object among `others` that keeps the layout valid, or None."""
    yaw = _random_yaw(rng, attributes["shape"])
    for _ in range(tries):
        x, y = _random_position(rng)
        if away_from is not None and math.hypot(x - away_from[0], y - away_from[1]) < MIN_MOVE:
            continue
        candidate = SceneObject(x=x, y=y, yaw=yaw, **attributes)
        if _apart(candidate, others) and layout.ok(others + [candidate]):
            return candidate
    return None


def _sample_objects(rng: np.random.Generator, count: int, layout: _Layout, attributes=None) -> list[SceneObject] | None:
    """`count` objects placed one by one (`attributes(rng)` draws each one's look; the standard set's by default)."""
    attributes = attributes or _random_attributes
    objects: list[SceneObject] = []
    for _ in range(count):
        placed = _place(rng, attributes(rng), objects, layout)
        if placed is None:
            return None
        objects.append(placed)
    return objects


def _sample_illumination(rng: np.random.Generator) -> Illumination:
    brightness = rng.uniform(0.78, 0.9) if rng.random() < 0.5 else rng.uniform(1.1, 1.22)
    temperature = rng.uniform(0.03, 0.08) * (1 if rng.random() < 0.5 else -1)
    return Illumination(
        round(float(brightness), 4), round(float(rng.uniform(0.85, 1.15)), 4), round(float(temperature), 4)
    )


def _sample_camera(rng: np.random.Generator) -> Camera:
    """A small camera move around the base view: orbit, tilt, zoom and pan."""
    return Camera(
        azimuth=round(float(rng.uniform(2.0, 5.0) * (1 if rng.random() < 0.5 else -1)), 4),
        elevation=round(BASE_CAMERA.elevation + float(rng.uniform(-3.0, 3.0)), 4),
        distance=round(BASE_CAMERA.distance * float(rng.uniform(0.94, 1.06)), 4),
        pan_x=round(float(rng.uniform(-0.3, 0.3)), 4),
        pan_y=round(float(rng.uniform(-0.3, 0.3)), 4),
    )


def _sample_distractor(rng: np.random.Generator, objects: list[SceneObject], cache: SpriteCache) -> View:
    """An illumination change, a small camera move or both; a camera move that breaks the layout is redrawn."""
    kind = DISTRACTOR_KINDS[rng.integers(len(DISTRACTOR_KINDS))]
    illumination = _sample_illumination(rng) if kind in ("illumination", "both") else Illumination()
    camera = BASE_CAMERA
    if kind in ("viewpoint", "both"):
        for _ in range(12):
            candidate = _sample_camera(rng)
            if _Layout(candidate, cache).ok(objects):
                camera = candidate
                break
        else:  # no camera move keeps every object in frame and visible: fall back to a light change
            kind = "illumination"
            illumination = _sample_illumination(rng)
    return View(camera, illumination, kind)


@dataclass
class Scene:
    """A sampled scene: before objects, after objects, the change, and the three views."""

    index: int
    change_type: str
    before: list[SceneObject]
    after: list[SceneObject]
    before_ids: list[int]
    after_ids: list[int]
    change: dict[str, Any]
    semantic_view: View
    nonsemantic_view: View
    sprites: SpriteCache  # silhouettes drawn while sampling, reused when rendering
    base_view: View | None = None  # the before image's view; None = View(BASE_CAMERA) (standard sets)
    hard_target: bool = False  # hard sets: the change was put on a small or partly hidden object on purpose


def _apply_change(
    rng: np.random.Generator, change_type: str, objects: list[SceneObject], layout: _Layout
) -> tuple[list[SceneObject], list[int], dict[str, Any]] | None:
    """The after objects, their ids, and the change record; None when no valid change was found."""
    ids = list(range(len(objects)))
    if change_type == "add":
        attributes = _random_attributes(rng)
        added = _place(rng, attributes, objects, layout)
        if added is None:
            return None
        return objects + [added], ids + [len(objects)], {"type": "add", "object": len(objects)}
    target = int(rng.integers(len(objects)))
    return change_object(rng, objects, ids, target, change_type, layout)


def change_object(
    rng: np.random.Generator,
    objects: list[SceneObject],
    ids: list[int],
    target: int,
    change_type: str,
    layout: _Layout,
    kept: tuple[str, ...] = ("shape", "color", "material", "size"),
):
    """(after objects, their ids, the change record) of a drop, colour, material or move change of object
    `target`, or None when the moved object finds no valid place; `kept`: what a moved object keeps."""
    old = objects[target]
    if change_type == "drop":
        return (
            objects[:target] + objects[target + 1 :],
            ids[:target] + ids[target + 1 :],
            {"type": "drop", "object": target},
        )
    if change_type in ("color", "material"):
        choices = [c for c in (COLORS if change_type == "color" else MATERIALS) if c != getattr(old, change_type)]
        new_value = choices[rng.integers(len(choices))]
        after = list(objects)
        after[target] = replace(old, **{change_type: new_value})
        change = {
            "type": change_type,
            "object": target,
            "attribute": change_type,
            "old": getattr(old, change_type),
            "new": new_value,
        }
        return after, ids, change
    if change_type == "move":
        others = objects[:target] + objects[target + 1 :]
        attributes = {name: getattr(old, name) for name in kept}
        moved = _place(rng, attributes, others, layout, away_from=(old.x, old.y))
        if moved is None:
            return None
        moved = replace(moved, yaw=old.yaw)
        if not layout.ok(others + [moved]):
            return None
        after = list(objects)
        after[target] = moved
        change = {"type": "move", "object": target, "from": [old.x, old.y], "to": [moved.x, moved.y]}
        return after, ids, change
    raise DataError(f"synthetic set: unknown change type {change_type!r}; known: {', '.join(CHANGE_TYPES)}")


def sample_standard_scene(index: int, change_type: str, config: SynthConfig) -> tuple[Scene, np.random.Generator]:
    """Sample scene `index` of a standard set from its own random stream (independent of every other scene)."""
    rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(0, index)))
    cache = SpriteCache(config.width, config.height)
    layout = _Layout(BASE_CAMERA, cache)
    low, high = config.min_objects, config.max_objects
    if change_type == "add":
        high -= 1  # the after image keeps at most max_objects
    if change_type == "drop":
        low += 1
    for attempt in range(200):
        if attempt % 25 == 0:  # keep the object count across failed layouts, so counts stay uniform
            count = int(rng.integers(low, high + 1))
        objects = _sample_objects(rng, count, layout)
        if objects is None:
            continue
        changed = _apply_change(rng, change_type, objects, layout)
        if changed is None:
            continue
        after, after_ids, change = changed
        semantic_view = View(BASE_CAMERA)
        if rng.random() < config.semantic_distractor_rate:
            semantic_view = _sample_distractor(rng, after, cache)
        nonsemantic_view = _sample_distractor(rng, objects, cache)
        scene = Scene(
            index,
            change_type,
            objects,
            after,
            list(range(len(objects))),
            after_ids,
            change,
            semantic_view,
            nonsemantic_view,
            cache,
        )
        return scene, rng
    raise DataError(
        f"synthetic set: could not place the objects of scene {index} in 200 tries "
        f"({config.width}x{config.height} may be too small for {config.max_objects} objects)"
    )
