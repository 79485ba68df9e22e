"""Composing a scene's image: sprites drawn far to near over the floor, visible coverage and exact masks."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from davir.data.synthetic.draw import PATCH_PAD, Sprite, draw_object, projector
from davir.data.synthetic.world import Camera, Illumination, SceneObject, View

FRAME_MARGIN = 2  # pixels between an object's box and the image border


class SpriteCache:
    """The sprites of one scene, per (object, camera): silhouettes for layout checks, shaded ones for images."""

    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self._silhouettes: dict[tuple[SceneObject, Camera], Sprite] = {}
        self._shaded: dict[tuple[SceneObject, Camera], Sprite] = {}

    def silhouette(self, obj: SceneObject, camera: Camera) -> Sprite:
        key = (obj, camera)
        sprite = self._shaded.get(key) or self._silhouettes.get(key)
        if sprite is None:
            sprite = self._silhouettes[key] = draw_object(obj, projector(camera, self.width, self.height), shade=False)
        return sprite

    def shaded(self, obj: SceneObject, camera: Camera) -> Sprite:
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
    return (sprite.x0 >= -slack and sprite.y0 >= -slack
            and sprite.x0 + w <= width + slack and sprite.y0 + h <= height + slack)


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
            coverage[y0 - sprite.y0:y1 - sprite.y0, x0 - sprite.x0:x1 - sprite.x0] *= \
                1.0 - nearer.alpha[y0 - nearer.y0:y1 - nearer.y0, x0 - nearer.x0:x1 - nearer.x0]
        visible[index] = coverage
    return visible  # type: ignore[return-value]


def render(objects: list[SceneObject], view: View, width: int, height: int, cache: SpriteCache | None = None
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
    image = floor_image(width, height).copy()
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
    mask[sprite.y0:sprite.y0 + h, sprite.x0:sprite.x0 + w] = visible > 0
    return mask
