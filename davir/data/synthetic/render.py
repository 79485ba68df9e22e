"""Composing a scene's image: sprites drawn far to near over the floor, visible coverage and exact masks."""

from __future__ import annotations

import math
from functools import lru_cache

import cv2
import numpy as np

from davir.data.synthetic.draw import PATCH_PAD, Projector, Sprite, draw_object, projector
from davir.data.synthetic.world import (
    Camera,
    Floor,
    Illumination,
    Light,
    PoseCamera,
    SceneObject,
    View,
    cube_half_side,
    cylinder_dims,
)

FRAME_MARGIN = 2  # pixels between an object's box and the image border


class SpriteCache:
    """The sprites of one scene, per (object, camera): silhouettes for layout checks, shaded ones for images."""

    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self._silhouettes: dict[tuple[SceneObject, Camera | PoseCamera], Sprite] = {}
        self._shaded: dict[tuple[SceneObject, Camera | PoseCamera], Sprite] = {}

    def silhouette(self, obj: SceneObject, camera: Camera | PoseCamera) -> Sprite:
        key = (obj, camera)
        sprite = self._shaded.get(key) or self._silhouettes.get(key)
        if sprite is None:
            sprite = self._silhouettes[key] = draw_object(obj, projector(camera, self.width, self.height), shade=False)
        return sprite

    def shaded(self, obj: SceneObject, camera: Camera | PoseCamera) -> Sprite:
        key = (obj, camera)
        sprite = self._shaded.get(key)
        if sprite is None:
            proj = projector(camera, self.width, self.height)
            sprite = self._shaded[key] = draw_object(obj, proj, silhouette=self._silhouettes.get(key))
        return sprite


@lru_cache(maxsize=8)
def floor_image(width: int, height: int) -> np.ndarray:
    """The light gray floor (uint8, read-only), brighter towards the camera (bottom).

    The gradient is vertical only: constant rows compress to almost nothing in PNG, which keeps
    writing 15,000 images fast.
    """
    rows = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    level = (0.62 + 0.18 * rows) * np.array([1.0, 1.0, 1.01], np.float32) * 255.0 + 0.5
    floor = np.broadcast_to(level.astype(np.uint8), (height, width, 3)).copy()
    floor.setflags(write=False)
    return floor


def in_frame(sprite: Sprite, width: int, height: int) -> bool:
    """The whole object lies inside the image, about FRAME_MARGIN pixels from the border.

    Sprite patches extend PATCH_PAD pixels beyond the object's projected outline.
    """
    h, w = sprite.alpha.shape
    slack = PATCH_PAD - FRAME_MARGIN
    return (
        sprite.x0 >= -slack
        and sprite.y0 >= -slack
        and sprite.x0 + w <= width + slack
        and sprite.y0 + h <= height + slack
    )


def visible_coverage(sprites: list[Sprite]) -> list[np.ndarray]:
    """Each sprite's visible coverage on its own patch: its alpha times (1 - alpha) of every nearer
    sprite that overlaps it (patches that do not overlap cost nothing)."""
    order = sorted(range(len(sprites)), key=lambda i: sprites[i].depth)
    visible: list[np.ndarray | None] = [None] * len(sprites)
    for rank, index in enumerate(order):
        sprite = sprites[index]
        h, w = sprite.alpha.shape
        coverage = sprite.alpha
        for nearer_index in order[:rank]:
            nearer = sprites[nearer_index]
            nh, nw = nearer.alpha.shape
            x0, y0 = max(sprite.x0, nearer.x0), max(sprite.y0, nearer.y0)
            x1, y1 = min(sprite.x0 + w, nearer.x0 + nw), min(sprite.y0 + h, nearer.y0 + nh)
            if x0 >= x1 or y0 >= y1:
                continue
            if coverage is sprite.alpha:
                coverage = coverage.copy()
            coverage[y0 - sprite.y0 : y1 - sprite.y0, x0 - sprite.x0 : x1 - sprite.x0] *= (
                1.0 - nearer.alpha[y0 - nearer.y0 : y1 - nearer.y0, x0 - nearer.x0 : x1 - nearer.x0]
            )
        visible[index] = coverage
    return visible  # type: ignore[return-value]


def render(
    objects: list[SceneObject], view: View, width: int, height: int, cache: SpriteCache | None = None
) -> tuple[np.ndarray, list[Sprite], list[np.ndarray]]:
    """Draw the objects far to near over the floor; returns (uint8 image, sprites, visible coverage).

    Each object is blended into the uint8 image on its own patch as image*(1-a) + rgb*a, so a pixel
    where an object has zero coverage, or which a nearer object covers fully, is bit-identical to the
    image without that object: this is what makes the ground-truth masks exact. `cache` shares sprites
    between the images of one scene.
    """
    cache = cache or SpriteCache(width, height)
    sprites = [cache.shaded(obj, view.camera) for obj in objects]
    visible = visible_coverage(sprites)
    if view.light is None and view.floor is None:
        image = floor_image(width, height).copy()
    else:  # hard sets: a textured floor with the objects' soft shadows
        image = _hard_background(objects, view, width, height)
    for index in sorted(range(len(sprites)), key=lambda i: -sprites[i].depth):
        sprite = sprites[index]
        h, w = sprite.alpha.shape
        window = (slice(sprite.y0, sprite.y0 + h), slice(sprite.x0, sprite.x0 + w))
        alpha = sprite.alpha[..., None]
        blended = image[window] * (1.0 - alpha) + sprite.rgb * alpha
        image[window] = (blended + 0.5).astype(np.uint8)
    if view.illumination != Illumination():
        image = view.illumination.apply_uint8(image)
    return image, sprites, visible


def full_mask(sprite: Sprite, visible: np.ndarray, width: int, height: int) -> np.ndarray:
    """Binary (H, W) mask of an object's visible pixels (any non-zero visible coverage)."""
    mask = np.zeros((height, width), bool)
    h, w = visible.shape
    mask[sprite.y0 : sprite.y0 + h, sprite.x0 : sprite.x0 + w] = visible > 0
    return mask


# Hard sets (davir.data.synthetic.hard): a floor texture fixed to the world and soft ground shadows.

SHADOW_STRENGTH = 0.38  # a fully shadowed floor pixel keeps 1 - SHADOW_STRENGTH of its light
SHADOW_BLUR_PX = 1.6  # Gaussian σ of the shadow's soft edge, in pixels
_NOISE_EXTENT = 12.0  # the noise grid covers [-extent, extent]^2 world units


def _floor_points(camera: Camera | PoseCamera, width: int, height: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """World (x, y) of the floor seen at every pixel centre, and a mask of the pixels that see the floor."""
    proj = projector(camera, width, height)
    us = (np.arange(width, dtype=np.float64) - proj.cx) / proj.focal
    vs = (np.arange(height, dtype=np.float64) - proj.cy) / proj.focal
    rays = (
        proj.forward[None, None, :]
        + us[None, :, None] * proj.right[None, None, :]
        + vs[:, None, None] * proj.down[None, None, :]
    )
    dz = rays[..., 2]
    hits = dz < -1e-6
    t = np.where(hits, -proj.position[2] / np.where(hits, dz, -1.0), 0.0)
    return proj.position[0] + t * rays[..., 0], proj.position[1] + t * rays[..., 1], hits


@lru_cache(maxsize=16)
def _noise_grid(seed: int, cells: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=(cells + 1, cells + 1)).astype(np.float32)


@lru_cache(maxsize=32)
def floor_texture(camera: Camera | PoseCamera, floor: Floor, width: int, height: int) -> np.ndarray:
    """(H, W) float32 brightness factor 1 + amplitude × noise(x, y) of the floor seen through `camera`
    (read-only): value noise on a grid of `floor.cell` world units plus half as much at a third of it."""
    xs, ys, hits = _floor_points(camera, width, height)
    field = np.zeros((height, width), np.float32)
    for octave, (cell, weight) in enumerate(((floor.cell, 1.0), (floor.cell / 3.0, 0.5))):
        cells = int(math.ceil(2 * _NOISE_EXTENT / cell))
        grid = _noise_grid(floor.seed + octave, cells)
        map_x = ((xs + _NOISE_EXTENT) / cell).astype(np.float32)
        map_y = ((ys + _NOISE_EXTENT) / cell).astype(np.float32)
        field += weight * cv2.remap(grid, map_x, map_y, cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT)
    factor = 1.0 + np.float32(floor.amplitude / 1.5) * np.clip(field, -1.5, 1.5) * hits
    factor.setflags(write=False)
    return factor


def _object_height(obj: SceneObject) -> float:
    if obj.shape == "cube":
        return 2.0 * cube_half_side(obj.radius)
    if obj.shape == "cylinder":
        return cylinder_dims(obj.radius)[1]
    return 2.0 * obj.radius


_RING = np.stack(
    [np.cos(np.linspace(0, 2 * np.pi, 24, endpoint=False)), np.sin(np.linspace(0, 2 * np.pi, 24, endpoint=False))],
    axis=1,
)


def shadow_polygon(obj: SceneObject, light: Light) -> np.ndarray:
    """(N, 2) ground points of the object's shadow: the hull of its footprint and the footprint cast by its top."""
    direction = light.direction()
    offset = -direction[:2] / max(direction[2], 0.2) * _object_height(obj)
    radius = obj.footprint if obj.shape != "sphere" else obj.radius * 0.9
    base = _RING * radius + [obj.x, obj.y]
    top = (
        _RING * radius * (0.75 if obj.shape == "sphere" else 1.0)
        + [obj.x, obj.y]
        + offset * (0.55 if obj.shape == "sphere" else 1.0)
    )
    points = np.concatenate([base, top]).astype(np.float32)
    return cv2.convexHull(points).reshape(-1, 2).astype(np.float64)


def shadow_coverage(objects: list[SceneObject], light: Light, proj: Projector) -> np.ndarray:
    """(H, W) float32 in [0, 1]: where the objects' soft shadows darken the floor (overlaps count once)."""
    scale = 2
    canvas = np.zeros((proj.height * scale, proj.width * scale), np.uint8)
    for obj in objects:
        ground = shadow_polygon(obj, light)
        pixels, depth = proj.project(np.concatenate([ground, np.zeros((len(ground), 1))], axis=1))
        if (depth <= 0).any():
            continue
        points = np.round(((pixels + 0.5) * scale - 0.5) * 16).astype(np.int32).reshape(-1, 1, 2)
        cv2.fillPoly(canvas, [points], 255, lineType=cv2.LINE_8, shift=4)
    small = cv2.resize(canvas, (proj.width, proj.height), interpolation=cv2.INTER_AREA).astype(np.float32) / 255.0
    return cv2.GaussianBlur(small, (0, 0), SHADOW_BLUR_PX)


def _hard_background(objects: list[SceneObject], view: View, width: int, height: int) -> np.ndarray:
    """The floor of a hard set's image (uint8): the brightness gradient, the texture, the shadows."""
    floor = floor_image(width, height).astype(np.float32)
    factor = np.ones((height, width), np.float32)
    if view.floor is not None:
        factor = factor * floor_texture(view.camera, view.floor, width, height)
    if view.light is not None:
        factor = factor * (
            1.0 - SHADOW_STRENGTH * shadow_coverage(objects, view.light, projector(view.camera, width, height))
        )
    return np.clip(floor * factor[..., None] + 0.5, 0, 255).astype(np.uint8)
