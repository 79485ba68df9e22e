"""Sampling a scene of a hard set (`SynthConfig(difficulty="hard")`): parallax camera moves, crowded and partly
hidden objects, small objects, moving shadows and a textured floor.

Every knob is a module constant below, with its range. Why each is there, and what the masks leave out on purpose:
docs/experiments/synthetic_hard.md.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from davir.data.synthetic.config import SynthConfig
from davir.data.synthetic.render import SpriteCache, visible_coverage
from davir.data.synthetic.scenes import (
    DISTRACTOR_KINDS,
    Scene,
    _Layout,
    _place,
    _sample_illumination,
    _sample_objects,
    change_object,
)
from davir.data.synthetic.world import (
    COLORS,
    MATERIALS,
    SHAPES,
    Camera,
    Floor,
    Illumination,
    Light,
    PoseCamera,
    SceneObject,
    View,
)
from davir.errors import DataError

# The base view: CLEVR-like, a little farther and higher than the standard set's (a crowded scene keeps room
# in the frame for the camera moves).
HARD_BASE_CAMERA = PoseCamera.from_camera(Camera(elevation=38.0, distance=20.0))
MIN_VISIBLE_HARD = 0.35  # every object keeps at least this share of its pixels (standard: 0.6)
SMALL_SHARE = 0.6  # share of small objects (standard: 0.5)
SMALL_SCALE = 0.75  # radius factor of a small object: 0.4 → 0.3 world units (CLEVR's small is 0.35)
HARD_TARGET_RATE = 0.5  # share of changes put on a small or partly hidden object (when the scene has one)
PARTLY_HIDDEN = 0.85  # an object with less than this share visible in the before image is partly hidden
# Camera moves, in the base camera's horizontal frame (world units) and degrees.
SIDE_SHIFT = (0.9, 2.4)  # |sideways translation|, either side
FORWARD_SHIFT = 1.2  # forward/backward translation in [-1.2, 1.2]
UP_SHIFT = 0.6  # vertical translation in [-0.6, 0.6]
AIM_OFFSET = 0.8  # the moved camera looks at a floor point within ±0.8 of the scene centre (x and y) ...
AIM_JITTER_DEG = 1.5  # ... then turns by up to ±1.5° in yaw and pitch (a rotation that is not an orbit)
CAMERA_TRIES = 20  # moves tried before the distractor falls back to a light change
# Light: the key light's direction (it casts the shadows) and its change in an illumination distractor.
LIGHT_AZIMUTH = (-120.0, 120.0)  # base azimuth, degrees (0 = light from the camera's side)
LIGHT_ELEVATION = (40.0, 65.0)  # base elevation, degrees
LIGHT_TURN = (30.0, 90.0)  # |azimuth change| of an illumination distractor, either way
LIGHT_TILT = 10.0  # elevation change in [-10, 10] (kept within 30..75)
# Floor texture: value noise fixed to the floor.
FLOOR_AMPLITUDE = (0.03, 0.05)  # ± share of the floor's brightness
FLOOR_CELL = (0.5, 1.0)  # noise cell, world units


def _hard_attributes(rng: np.random.Generator, small: bool | None = None) -> dict[str, Any]:
    small = bool(rng.random() < SMALL_SHARE) if small is None else small
    return {
        "shape": SHAPES[rng.integers(len(SHAPES))],
        "color": list(COLORS)[rng.integers(len(COLORS))],
        "material": MATERIALS[rng.integers(len(MATERIALS))],
        "size": "small" if small else "large",
        "scale": SMALL_SCALE if small else 1.0,
    }


def _sample_light(rng: np.random.Generator) -> Light:
    return Light(round(float(rng.uniform(*LIGHT_AZIMUTH)), 4), round(float(rng.uniform(*LIGHT_ELEVATION)), 4))


def _moved_light(rng: np.random.Generator, light: Light) -> Light:
    turn = float(rng.uniform(*LIGHT_TURN)) * (1 if rng.random() < 0.5 else -1)
    tilt = float(rng.uniform(-LIGHT_TILT, LIGHT_TILT))
    return Light(round(light.azimuth + turn, 4), round(min(75.0, max(30.0, light.elevation + tilt)), 4))


def _sample_camera(rng: np.random.Generator, base: PoseCamera) -> PoseCamera:
    """A camera moved in 3-D: translated sideways, forward and up, re-aimed near the scene centre, turned a little."""
    position, _, _, forward = base.basis()
    ahead = np.array([forward[0], forward[1], 0.0]) / math.hypot(forward[0], forward[1])
    side = np.array([ahead[1], -ahead[0], 0.0])
    shift = (
        float(rng.uniform(*SIDE_SHIFT)) * (1 if rng.random() < 0.5 else -1) * side
        + float(rng.uniform(-FORWARD_SHIFT, FORWARD_SHIFT)) * ahead
        + float(rng.uniform(-UP_SHIFT, UP_SHIFT)) * np.array([0.0, 0.0, 1.0])
    )
    # the base camera's aim on the floor
    aim = position - forward * (position[2] / forward[2])
    aim[:2] += rng.uniform(-AIM_OFFSET, AIM_OFFSET, size=2)
    moved = position + shift
    pose = PoseCamera.look_along(moved, aim - moved)
    return replace(
        pose,
        yaw=round(pose.yaw + float(rng.uniform(-AIM_JITTER_DEG, AIM_JITTER_DEG)), 4),
        pitch=round(pose.pitch + float(rng.uniform(-AIM_JITTER_DEG, AIM_JITTER_DEG)), 4),
    )


def _sample_distractor(rng: np.random.Generator, objects: list[SceneObject], cache: SpriteCache, base: View) -> View:
    """An illumination change (global light and a turned key light: the shadows move), a parallax camera move,
    or both; a move that breaks the layout is redrawn, and after CAMERA_TRIES the distractor is a light change."""
    kind = DISTRACTOR_KINDS[rng.integers(len(DISTRACTOR_KINDS))]
    illumination, light = Illumination(), base.light
    if kind in ("illumination", "both"):
        illumination, light = _sample_illumination(rng), _moved_light(rng, base.light)
    camera = base.camera
    if kind in ("viewpoint", "both"):
        for _ in range(CAMERA_TRIES):
            candidate = _sample_camera(rng, base.camera)
            if _Layout(candidate, cache, MIN_VISIBLE_HARD).ok(objects):
                camera = candidate
                break
        else:
            kind = "illumination"
            illumination, light = _sample_illumination(rng), _moved_light(rng, base.light)
    return View(camera, illumination, kind, light=light, floor=base.floor)


def _hard_objects(objects: list[SceneObject], layout: _Layout) -> list[int]:
    """Indices of the small or partly hidden objects (in the layout's camera)."""
    sprites = [layout.cache.silhouette(obj, layout.camera) for obj in objects]
    visible = visible_coverage(sprites)
    return [
        i
        for i, (obj, sprite, vis) in enumerate(zip(objects, sprites, visible))
        if obj.size == "small" or float(vis.sum()) < PARTLY_HIDDEN * sprite.area
    ]


def _apply_change(
    rng: np.random.Generator, change_type: str, objects: list[SceneObject], layout: _Layout
) -> tuple[list[SceneObject], list[int], dict[str, Any], bool] | None:
    """As scenes._apply_change, with HARD_TARGET_RATE of the changes on a small or partly hidden object (an added
    object is then small); the last item says whether this change was so targeted."""
    ids = list(range(len(objects)))
    targeted = bool(rng.random() < HARD_TARGET_RATE)
    if change_type == "add":
        added = _place(rng, _hard_attributes(rng, small=True if targeted else None), objects, layout)
        if added is None:
            return None
        return objects + [added], ids + [len(objects)], {"type": "add", "object": len(objects)}, targeted
    candidates = _hard_objects(objects, layout) if targeted else []
    targeted = bool(candidates)
    pool = candidates or ids
    target = int(pool[rng.integers(len(pool))])
    result = change_object(
        rng, objects, ids, target, change_type, layout, kept=("shape", "color", "material", "size", "scale")
    )
    return None if result is None else (*result, targeted)


def sample_hard_scene(index: int, change_type: str, config: SynthConfig) -> tuple[Scene, np.random.Generator]:
    """Sample hard scene `index` from its own random stream (independent of every other scene)."""
    rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(0, index)))
    cache = SpriteCache(config.width, config.height)
    layout = _Layout(HARD_BASE_CAMERA, cache, MIN_VISIBLE_HARD)
    floor = Floor(
        int(rng.integers(2**31)),
        round(float(rng.uniform(*FLOOR_AMPLITUDE)), 4),
        round(float(rng.uniform(*FLOOR_CELL)), 4),
    )
    base_view = View(HARD_BASE_CAMERA, light=_sample_light(rng), floor=floor)
    low, high = config.min_objects, config.max_objects
    if change_type == "add":
        high -= 1
    if change_type == "drop":
        low += 1
    for attempt in range(200):
        if attempt % 25 == 0:
            count = int(rng.integers(low, high + 1))
        objects = _sample_objects(rng, count, layout, attributes=_hard_attributes)
        if objects is None:
            continue
        changed = _apply_change(rng, change_type, objects, layout)
        if changed is None:
            continue
        after, after_ids, change, targeted = changed
        semantic_view = base_view
        if rng.random() < config.semantic_distractor_rate:
            semantic_view = _sample_distractor(rng, after, cache, base_view)
        nonsemantic_view = _sample_distractor(rng, objects, cache, base_view)
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
            base_view=base_view,
            hard_target=targeted,
        )
        return scene, rng
    raise DataError(
        f"synthetic set: could not place the {low}-{high} objects of hard scene {index} in 200 tries "
        f"({config.width}x{config.height} may be too small)"
    )
