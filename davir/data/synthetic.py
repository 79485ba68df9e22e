"""The built-in synthetic change dataset: CLEVR-Change-like scenes drawn with numpy/OpenCV.

    python -m davir.data synth --out data/synth --scenes 5000 --seed 0

Scenes of 3-7 objects (sphere, cube, cylinder × the 8 CLEVR colours × metal/rubber × small/large)
standing on a light gray floor, seen through a pinhole camera and shaded per pixel (metal: dark
reflective body, strong white highlight, darker rim; rubber: matte Lambert shading). Every scene gives
a semantic pair (one change: color, material, add, drop or move, balanced) and a distractor-only pair
(an illumination change, a small camera move, or both); a share of the semantic pairs carries a
distractor too.

Written in the CLEVR-Change layout that the `clevr_change` reader serves (docs/datasets.md B.1):

    images/CLEVR_default_%06d.png       before
    sc_images/CLEVR_semantic_%06d.png   after (semantic change)
    nsc_images/CLEVR_nonsemantic_%06d.png  distractor only
    change_captions.json, no_change_captions.json   {"CLEVR_default_%06d.png": [captions]}
    splits.json      {"train": [ints], "val": [...], "test": [...]}   (80/10/10 by default)
    type_mapping.json {"color": ["%06d.png", ...], ...}

plus what CLEVR-Change lacks:

    gt_masks/{before,after}/%06d.png      the changed object's visible pixels (0/255) in that image's frame;
                                          before is empty for add, after is empty for drop
    gt_masks/{before_n,after_n}/%06d.png  all zero (the distractor pair has no change)
    scenes.json   {"version", "config", "scenes": {"%06d": record}}: objects of each image, the change,
                  the distractors and a left-to-right description of each image (see `scene_record`).

No soft ground shadows are drawn on purpose: a shadow lies outside the object's mask, and the masks
are only exact (pixels outside them identical in a pair without distractor) when an object changes
nothing but its own pixels. Output is deterministic for a seed: each scene draws from its own
`SeedSequence(seed, spawn_key=(0, index))`, so the bytes do not depend on the number of workers.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from davir.data.images import save_png_atomic
from davir.data.records import CHANGE_TYPES, DataError
from davir.io import read_json, write_json_atomic

FORMAT_VERSION = 1

SHAPES = ("sphere", "cube", "cylinder")
# CLEVR's colours (properties.json of the CLEVR generator), 8-bit RGB.
COLORS: dict[str, tuple[int, int, int]] = {
    "gray": (87, 87, 87),
    "red": (173, 35, 35),
    "blue": (42, 75, 215),
    "green": (29, 105, 20),
    "brown": (129, 74, 25),
    "purple": (129, 38, 192),
    "cyan": (41, 208, 208),
    "yellow": (255, 238, 51),
}
MATERIALS = ("metal", "rubber")
# Object radius in world units. CLEVR uses 0.35 / 0.7; small is a little larger here so that small
# objects stay nameable in 64-pixel thumbnails (large is still ~1.9x small).
SIZES: dict[str, float] = {"small": 0.4, "large": 0.75}
DISTRACTOR_KINDS = ("illumination", "viewpoint", "both")

MIN_VISIBLE = 0.6  # every object keeps at least this share of its pixels, so it can be named
GROUND_EXTENT = 3.2  # object centres lie in [-GROUND_EXTENT, GROUND_EXTENT]^2 (CLEVR uses ±3)
MIN_GAP = 0.15  # free ground between two objects' footprints
MIN_MOVE = 1.5  # a moved object travels at least this far on the ground
PNG_COMPRESS_LEVEL = 1  # zlib level: writing dominates the run time; level 1 is ~2x faster, files ~15% larger
FRAME_MARGIN = 2  # pixels between an object's box and the image border
LIGHT = np.array([-0.45, -0.55, 0.70]) / np.linalg.norm([-0.45, -0.55, 0.70])  # towards the key light

# ---------------------------------------------------------------------------------------------
# Captions. Synonyms are kept few (CLEVR-Change uses the same ones) so ~80 words cover everything.
SIZE_WORDS = {"small": ("small", "tiny"), "large": ("large", "big")}
COLOR_WORDS = {name: (name,) for name in COLORS}
MATERIAL_WORDS = {"metal": ("metal", "metallic", "shiny"), "rubber": ("rubber", "matte")}
SHAPE_WORDS = {"sphere": ("sphere", "ball"), "cube": ("cube", "block"), "cylinder": ("cylinder",)}
CHANGE_TEMPLATES: dict[str, tuple[str, ...]] = {
    "color": ("the {obj} changed to {new}", "the {obj} became {new}", "the {obj} turned {new}"),
    "material": ("the {obj} changed to {new}", "the {obj} became {new}", "the {obj} turned {new}"),
    "add": ("someone added a {obj}", "a {obj} has appeared", "a {obj} has been added",
            "a {obj} has been newly placed"),
    "drop": ("the {obj} has disappeared", "the {obj} is missing", "the {obj} is gone",
             "the {obj} is no longer there"),
    "move": ("the {obj} moved", "the {obj} changed its location", "the {obj} is in a different location",
             "the {obj} has been moved"),
}
NO_CHANGE_CAPTIONS = (
    "the scene remains the same", "the two scenes seem identical", "no change has occurred",
    "nothing has changed", "there is no change",
)
MIN_REFERENCES, MAX_REFERENCES = 3, 5


@dataclass(frozen=True)
class SynthConfig:
    """What to generate. Every field is recorded in scenes.json; a rerun with the same config reuses the folder."""

    scenes: int = 5000
    seed: int = 0
    width: int = 320
    height: int = 240
    semantic_distractor_rate: float = 0.3
    min_objects: int = 3
    max_objects: int = 7
    val_fraction: float = 0.1
    test_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.scenes < 1:
            raise DataError(f"synthetic set: scenes must be at least 1, got {self.scenes}")
        if self.width < 64 or self.height < 48:
            raise DataError(f"synthetic set: image size {self.width}x{self.height} is too small (at least 64x48)")
        if not 0.0 <= self.semantic_distractor_rate <= 1.0:
            raise DataError(f"synthetic set: semantic_distractor_rate must be in [0, 1], got {self.semantic_distractor_rate}")
        if not 2 <= self.min_objects < self.max_objects <= 8:
            raise DataError(
                f"synthetic set: need 2 <= min_objects < max_objects <= 8, got {self.min_objects}..{self.max_objects}"
            )
        if self.val_fraction < 0 or self.test_fraction < 0 or self.val_fraction + self.test_fraction >= 1:
            raise DataError(
                f"synthetic set: val_fraction {self.val_fraction} + test_fraction {self.test_fraction} must be in [0, 1)"
            )


@dataclass(frozen=True)
class SceneObject:
    """One object on the floor: attributes, ground position (x, y) of its centre, rotation about the vertical."""

    shape: str
    color: str
    material: str
    size: str
    x: float
    y: float
    yaw: float = 0.0

    @property
    def radius(self) -> float:
        return SIZES[self.size]

    @property
    def footprint(self) -> float:
        """Radius of the disc the object covers on the ground (used to keep objects apart)."""
        if self.shape == "cube":
            return cube_half_side(self.radius) * math.sqrt(2.0)
        if self.shape == "cylinder":
            return cylinder_dims(self.radius)[0]
        return self.radius

    def phrase(self) -> str:
        """Canonical attribute phrase, e.g. "small red metal sphere"."""
        return f"{self.size} {self.color} {self.material} {self.shape}"


def cube_half_side(radius: float) -> float:
    return 0.8 * radius


def cylinder_dims(radius: float) -> tuple[float, float]:
    """(radius, height) of a cylinder of the given size."""
    return 0.75 * radius, 2.0 * radius


@dataclass(frozen=True)
class Camera:
    """A pinhole camera orbiting a target point (pan_x, pan_y) on the floor; angles in degrees."""

    azimuth: float = 0.0
    elevation: float = 35.0
    distance: float = 18.0
    pan_x: float = 0.0
    pan_y: float = 0.0

    def basis(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(position, right, down, forward) in world coordinates (x right, y away, z up)."""
        a, e = math.radians(self.azimuth), math.radians(self.elevation)
        target = np.array([self.pan_x, self.pan_y, 0.0])
        position = target + self.distance * np.array([math.sin(a) * math.cos(e), -math.cos(a) * math.cos(e), math.sin(e)])
        forward = (target - position) / self.distance
        right = np.cross(forward, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        down = np.cross(forward, right)
        return position, right, down, forward


@dataclass(frozen=True)
class Illumination:
    """A global light change: out = ((img - 0.5) * contrast + 0.5) * brightness * (1 + t, 1, 1 - t)."""

    brightness: float = 1.0
    contrast: float = 1.0
    temperature: float = 0.0

    def apply(self, image: np.ndarray) -> np.ndarray:
        """Apply to a float image in [0, 1] (unclipped)."""
        gains = np.array([1.0 + self.temperature, 1.0, 1.0 - self.temperature], dtype=np.float32)
        return ((image - 0.5) * self.contrast + 0.5) * (self.brightness * gains)

    def apply_uint8(self, image: np.ndarray) -> np.ndarray:
        """Apply to a uint8 RGB image through a per-channel lookup table (the change is per pixel value)."""
        levels = np.arange(256, dtype=np.float32)[:, None] / 255.0
        table = np.clip(self.apply(np.repeat(levels, 3, axis=1)) * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return cv2.LUT(image, table.reshape(256, 1, 3))


@dataclass
class View:
    """How one image is taken: camera and illumination, and which distractor (if any) made them."""

    camera: Camera
    illumination: Illumination = field(default_factory=Illumination)
    distractor: str | None = None


BASE_CAMERA = Camera()


@lru_cache(maxsize=64)
def projector(camera: Camera, width: int, height: int) -> "Projector":
    """A (cached) projector: a scene's images share a few cameras, and building one costs more than using it."""
    return Projector(camera, width, height)


class Projector:
    """Projects world points into one image of a given size through one camera."""

    def __init__(self, camera: Camera, width: int, height: int):
        self.camera = camera
        self.width, self.height = width, height
        self.position, self.right, self.down, self.forward = camera.basis()
        # The focal length fits a 4:3 view into the frame whatever its aspect ratio.
        self.focal = 2.7 * min(width, height * 4.0 / 3.0)
        self.cx, self.cy = width / 2.0, height / 2.0
        self._axes = np.stack([self.right, self.down, self.forward], axis=1)
        self._centre = np.array([self.cx, self.cy])

    def project(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """World points (N, 3) -> pixel coordinates (N, 2) and depths (N,)."""
        camera = (points - self.position) @ self._axes  # columns: right, down, forward
        depth = camera[:, 2]
        pixels = camera[:, :2] * (self.focal / depth)[:, None] + self._centre
        return pixels, depth

    def to_camera(self, vector: np.ndarray) -> np.ndarray:
        """A world direction in camera coordinates (x right, y down, z forward)."""
        return np.array([vector @ self.right, vector @ self.down, vector @ self.forward])


@dataclass
class Sprite:
    """One drawn object: its anti-aliased coverage and colour on a patch at (x0, y0) of the image."""

    x0: int
    y0: int
    alpha: np.ndarray  # (h, w) float32 in [0, 1]
    rgb: np.ndarray | None  # (h, w, 3) float32, None when only the silhouette was needed
    depth: float

    @cached_property
    def box(self) -> tuple[int, int, int, int]:
        """[x0, y0, x1, y1) of the non-zero coverage, in image pixels (x1, y1 exclusive)."""
        rows = np.flatnonzero(self.alpha.any(axis=1))
        cols = np.flatnonzero(self.alpha.any(axis=0))
        return (self.x0 + int(cols[0]), self.y0 + int(rows[0]), self.x0 + int(cols[-1]) + 1, self.y0 + int(rows[-1]) + 1)

    @cached_property
    def area(self) -> float:
        """Total coverage in pixels (the object's size before occlusion)."""
        return float(self.alpha.sum())


# ---------------------------------------------------------------------------------------------
# Drawing. Coverage is drawn 3x supersampled and box-filtered down (OpenCV's own anti-aliased fill
# leaves spikes at the many short edges of an ellipse); colour is computed per pixel of the object's
# patch from a surface normal and the key light.

_SHIFT = 4
_SUB = float(1 << _SHIFT)
_SUPERSAMPLE = 3
_PATCH_PAD = 2.0  # pixels of patch around an object's projected outline


def _fixed(points: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Pixel coordinates as OpenCV fixed point (4 fractional bits), on a grid `scale` times finer."""
    return np.round(((points + 0.5) * scale - 0.5) * _SUB).astype(np.int32).reshape(-1, 1, 2)


def _coverage(canvas: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """A supersampled 0/255 drawing averaged down to per-pixel coverage in [0, 1]."""
    small = cv2.resize(canvas, (shape[1], shape[0]), interpolation=cv2.INTER_AREA)
    return small.astype(np.float32) * np.float32(1.0 / 255.0)


def _fill_polygon(shape: tuple[int, int], points: np.ndarray) -> np.ndarray:
    canvas = np.zeros((shape[0] * _SUPERSAMPLE, shape[1] * _SUPERSAMPLE), np.uint8)
    cv2.fillPoly(canvas, [_fixed(points, _SUPERSAMPLE)], 255, lineType=cv2.LINE_8, shift=_SHIFT)
    return _coverage(canvas, shape)


def _fill_circle(shape: tuple[int, int], centre: tuple[float, float], radius: float) -> np.ndarray:
    canvas = np.zeros((shape[0] * _SUPERSAMPLE, shape[1] * _SUPERSAMPLE), np.uint8)
    (cx, cy), = _fixed(np.array([centre]), _SUPERSAMPLE)[0]
    cv2.circle(canvas, (int(cx), int(cy)), round(radius * _SUPERSAMPLE * _SUB), 255, -1, lineType=cv2.LINE_8,
               shift=_SHIFT)
    return _coverage(canvas, shape)


def _patch_frame(points: np.ndarray) -> tuple[int, int, int, int]:
    """Integer patch (x0, y0, w, h) enclosing the points with a margin of _PATCH_PAD pixels."""
    (low_x, low_y), (high_x, high_y) = points.min(axis=0).tolist(), points.max(axis=0).tolist()
    x0, y0 = math.floor(low_x - _PATCH_PAD), math.floor(low_y - _PATCH_PAD)
    return x0, y0, math.ceil(high_x + _PATCH_PAD) - x0, math.ceil(high_y + _PATCH_PAD) - y0


def _power(x: np.ndarray, exponent: int) -> np.ndarray:
    """x ** exponent for a small positive integer by repeated squaring (np.power on floats is slow)."""
    result, square = None, x
    while exponent:
        if exponent & 1:
            result = square if result is None else result * square
        exponent >>= 1
        if exponent:
            square = square * square
    return result


def _surface(material: str, diffuse, specular, rim, reflection, sharpness: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """Lighting of surface points as two scalar fields (body, white): colour = base * body + white.

    Rubber is matte: body = Lambert with ambient 0.32, no white. Metal is the base colour in a dark
    mirror: a body darker where it turns from the light and at the rim, a coloured sheen and a sharp
    white highlight (specular ** sharpness), and the bright floor reflected low on the object.
    Inputs are 2-D fields (or scalars) that broadcast together.
    """
    diffuse = np.maximum(diffuse, 0.0)
    if material == "rubber":
        body = 0.32 + 0.68 * diffuse
        return body, np.zeros_like(body)
    specular = np.maximum(specular, 0.0)
    sheen = _power(specular, 4)
    body = (0.16 + 0.72 * diffuse * np.sqrt(diffuse)) * (0.4 + 0.6 * rim) + 0.45 * sheen + 0.12 * reflection
    white = 1.2 * _power(specular, sharpness) + 0.16 * reflection
    return body, white


def _finish(base: np.ndarray, body: np.ndarray, white: np.ndarray, edge: np.ndarray | None = None) -> np.ndarray:
    """Colour in 0..255 (float32, h x w x 3); `edge` (0..1) blends towards a light rim colour."""
    rgb = base * body[..., None] + white[..., None]
    if edge is not None:
        rgb += edge[..., None] * (np.minimum(base * 1.3 + 0.3, 1.0) - rgb)
    return np.clip(rgb * 255.0, 0.0, 255.0).astype(np.float32)


def _light_camera(proj: Projector) -> tuple[float, float, float]:
    x, y, z = proj.to_camera(LIGHT)
    return float(x), float(y), float(z)


def _draw_sphere(obj: SceneObject, proj: Projector, shade: bool, alpha: np.ndarray | None) -> Sprite:
    centre, depth = proj.project(np.array([[obj.x, obj.y, obj.radius]]))
    cx, cy = centre[0]
    radius = proj.focal * obj.radius / depth[0]
    x0, y0, w, h = _patch_frame(np.array([[cx - radius, cy - radius], [cx + radius, cy + radius]]))
    if alpha is None:
        alpha = _fill_circle((h, w), (cx - x0, cy - y0), radius)
    rgb = None
    if shade:
        dx = ((np.arange(w, dtype=np.float32) + (x0 - cx)) / radius)[None, :].astype(np.float32)
        dy = ((np.arange(h, dtype=np.float32) + (y0 - cy)) / radius)[:, None].astype(np.float32)
        nz = np.sqrt(np.clip(1.0 - dx * dx - dy * dy, 0.0, 1.0))
        lx, ly, lz = _light_camera(proj)
        hx, hy, hz = lx, ly, lz - 1.0  # half vector between the light and the view direction (0, 0, -1)
        norm = math.sqrt(hx * hx + hy * hy + hz * hz)
        hx, hy, hz = hx / norm, hy / norm, hz / norm
        # Camera-space normal (dx, dy, -nz): the visible hemisphere faces the camera (-z).
        diffuse = dx * lx + dy * ly - nz * lz
        specular = dx * hx + dy * hy - nz * hz
        reflection = np.clip(dy * 1.6 - 0.4, 0.0, 1.0) * nz  # the floor mirrored in the lower half
        body, white = _surface(obj.material, diffuse, specular, nz, reflection)
        rgb = _finish(np.array(COLORS[obj.color], np.float32) / 255.0, body, white)
    return Sprite(x0, y0, alpha, rgb, float(depth[0]))


def _horizontal_frame(obj: SceneObject, proj: Projector) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unit vectors on the floor: towards the camera, to the camera's right, and the horizontal half vector."""
    towards = proj.position - np.array([obj.x, obj.y, 0.0])
    flat = np.array([towards[0], towards[1], 0.0])
    flat /= np.linalg.norm(flat)
    right = np.array([flat[1], -flat[0], 0.0])
    half = LIGHT + towards / np.linalg.norm(towards)
    half[2] = 0.0
    return flat, right, half / np.linalg.norm(half)


def _outline(shape: tuple[int, int], polygon: np.ndarray, strength: float) -> np.ndarray:
    """A one-pixel anti-aliased outline weight (the rim of a top face catching the light)."""
    canvas = np.zeros((shape[0] * _SUPERSAMPLE, shape[1] * _SUPERSAMPLE), np.uint8)
    cv2.polylines(canvas, [_fixed(polygon, _SUPERSAMPLE)], True, 255, thickness=_SUPERSAMPLE, lineType=cv2.LINE_8,
                  shift=_SHIFT)
    return np.float32(strength) * _coverage(canvas, shape)


def _face_parameter(xs: np.ndarray, ys: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """t = 0 at `start`, 1 at `end`, linear in between, clipped to [0, 1], over the patch."""
    dx, dy = float(end[0] - start[0]), float(end[1] - start[1])
    length = max(dx * dx + dy * dy, 1e-6)
    return np.clip(((xs - float(start[0])) * (dx / length) + (ys - float(start[1])) * (dy / length)), 0.0, 1.0)


def _draw_cube(obj: SceneObject, proj: Projector, shade: bool, alpha: np.ndarray | None) -> Sprite:
    s = cube_half_side(obj.radius)
    c, si = math.cos(obj.yaw), math.sin(obj.yaw)
    local = np.array([[-s, -s], [s, -s], [s, s], [-s, s]])
    ground = local @ np.array([[c, si], [-si, c]]) + [obj.x, obj.y]
    # 4 bottom corners, 4 top corners, and the centre (for the depth order)
    points = np.empty((9, 3))
    points[:4, :2], points[:4, 2] = ground, 0.0
    points[4:8, :2], points[4:8, 2] = ground, 2 * s
    points[8] = (obj.x, obj.y, s)
    projected, depths = proj.project(points)
    pixels, centre_depth = projected[:8], depths[8]
    x0, y0, w, h = _patch_frame(pixels)
    local_pixels = pixels - [x0, y0]
    if alpha is None:
        alpha = _fill_polygon((h, w), cv2.convexHull(local_pixels.astype(np.float32)).reshape(-1, 2))
    rgb = None
    if shade:
        base = np.array(COLORS[obj.color], np.float32) / 255.0
        _, _, half = _horizontal_frame(obj, proj)
        xs = np.arange(w, dtype=np.float32)[None, :]
        ys = np.arange(h, dtype=np.float32)[:, None]
        faces = []  # (corner indices: top edge then bottom edge, outward normal)
        for k in range(4):
            a, b = k, (k + 1) % 4
            edge = ground[b] - ground[a]
            normal = np.array([edge[1], -edge[0], 0.0]) / np.linalg.norm(edge)
            face_centre = np.array([*(ground[a] + ground[b]) / 2.0, s])
            if normal @ (proj.position - face_centre) > 0:
                faces.append(([4 + a, 4 + b, b, a], normal))
        faces.append(([4, 5, 6, 7], np.array([0.0, 0.0, 1.0])))
        body = white = None
        for indices, normal in faces:
            quad = local_pixels[indices]
            lit = float(normal @ LIGHT)
            if normal[2] > 0.5:  # top face: t runs from its farthest (highest) to its nearest corner
                t = _face_parameter(xs, ys, quad[np.argmin(quad[:, 1])], quad[np.argmax(quad[:, 1])])
                specular = 0.95 - 0.5 * t
                reflection = 0.25 * (1.0 - t)
                rim = 1.0 - 0.2 * t
            else:  # side face: t runs down from the top edge; metal mirrors the bright floor low down
                t = _face_parameter(xs, ys, (quad[0] + quad[1]) / 2.0, (quad[2] + quad[3]) / 2.0)
                specular = (0.35 + 0.45 * max(float(normal @ half), 0.0)) * (1.0 - 0.6 * t)
                reflection = 0.6 * t * t
                rim = 0.9 - 0.3 * t
            face_body, face_white = _surface(obj.material, lit * (1.06 - 0.12 * t), specular, rim, reflection, sharpness=6)
            if body is None:  # the first face fills the patch, so face seams blend with a face, not the floor
                body, white = face_body.copy(), face_white.copy()
            else:
                coverage = _fill_polygon((h, w), quad)
                body += coverage * (face_body - body)
                white += coverage * (face_white - white)
        edge = _outline((h, w), local_pixels[[4, 5, 6, 7]], 0.6 if obj.material == "metal" else 0.22)
        rgb = _finish(base, body, white, edge)
    return Sprite(x0, y0, alpha, rgb, float(centre_depth))


_CIRCLE = np.stack([np.cos(np.linspace(0, 2 * np.pi, 48, endpoint=False)),
                    np.sin(np.linspace(0, 2 * np.pi, 48, endpoint=False))], axis=1)


def _draw_cylinder(obj: SceneObject, proj: Projector, shade: bool, alpha: np.ndarray | None) -> Sprite:
    radius, height = cylinder_dims(obj.radius)
    ring = _CIRCLE * radius + [obj.x, obj.y]
    # bottom circle, top circle, and the centre of the axis (for the depth order)
    n = len(ring)
    points = np.empty((2 * n + 1, 3))
    points[:n, :2], points[:n, 2] = ring, 0.0
    points[n:2 * n, :2], points[n:2 * n, 2] = ring, height
    points[2 * n] = (obj.x, obj.y, height / 2.0)
    projected, depths = proj.project(points)
    pixels, centre, centre_depth = projected[:-1], projected[-1:], depths[-1]
    x0, y0, w, h = _patch_frame(pixels)
    local_pixels = pixels - [x0, y0]
    if alpha is None:
        alpha = _fill_polygon((h, w), cv2.convexHull(local_pixels.astype(np.float32)).reshape(-1, 2))
    rgb = None
    if shade:
        base = np.array(COLORS[obj.color], np.float32) / 255.0
        towards, right, half = _horizontal_frame(obj, proj)
        bottom, top = local_pixels[: len(ring)], local_pixels[len(ring):]
        # Body: the normal turns across the width (u in [-1, 1] from the camera's left to right).
        half_width = float(local_pixels[:, 0].max() - local_pixels[:, 0].min()) / 2.0
        u = np.clip((np.arange(w, dtype=np.float32) + float(x0 - centre[0, 0])) / half_width, -1.0, 1.0)[None, :]
        facing = np.sqrt(1.0 - u * u)
        diffuse = u * float(right @ LIGHT) + facing * float(towards @ LIGHT)
        specular = u * float(right @ half) + facing * float(towards @ half)
        v = np.clip((np.arange(h, dtype=np.float32)[:, None] - float(top[:, 1].mean()))
                    / max(float(bottom[:, 1].mean() - top[:, 1].mean()), 1.0), 0.0, 1.0)
        reflection = 0.7 * v * v * facing
        body, white = _surface(obj.material, diffuse, specular, facing, reflection)
        body, white = np.broadcast_to(body, (h, w)).copy(), np.broadcast_to(white, (h, w)).copy()
        ys = np.arange(h, dtype=np.float32)[:, None]
        span = max(float(top[:, 1].max() - top[:, 1].min()), 1.0)
        t = np.clip((ys - float(top[:, 1].min())) / span, 0.0, 1.0)
        top_body, top_white = _surface(obj.material, float(LIGHT[2]) * (1.04 - 0.08 * t), 0.95 - 0.4 * t,
                                       1.0 - 0.2 * t, 0.25 * (1.0 - t), sharpness=6)
        coverage = _fill_polygon((h, w), top)
        body += coverage * (top_body - body)
        white += coverage * (top_white - white)
        rgb = _finish(base, body, white, _outline((h, w), top, 0.55 if obj.material == "metal" else 0.18))
    return Sprite(x0, y0, alpha, rgb, float(centre_depth))


_DRAW = {"sphere": _draw_sphere, "cube": _draw_cube, "cylinder": _draw_cylinder}


def draw_object(obj: SceneObject, proj: Projector, shade: bool = True, silhouette: Sprite | None = None) -> Sprite:
    """The object's sprite as seen through `proj`: coverage, and (when `shade`) colour in 0..255.

    `silhouette`, the same object's unshaded sprite through the same projector, saves redrawing its coverage.
    """
    return _DRAW[obj.shape](obj, proj, shade, None if silhouette is None else silhouette.alpha)


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

    Sprite patches extend _PATCH_PAD pixels beyond the object's projected outline.
    """
    h, w = sprite.alpha.shape
    slack = _PATCH_PAD - FRAME_MARGIN
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


# ---------------------------------------------------------------------------------------------
# Scene sampling.

class _Layout:
    """Checks placements against one camera, with silhouettes from the scene's sprite cache."""

    def __init__(self, camera: Camera, cache: SpriteCache):
        self.camera, self.cache = camera, cache
        self.width, self.height = cache.width, cache.height

    def ok(self, objects: list[SceneObject]) -> bool:
        """Every object inside the frame and at least MIN_VISIBLE visible."""
        sprites = [self.cache.silhouette(obj, self.camera) for obj in objects]
        if not all(in_frame(sprite, self.width, self.height) for sprite in sprites):
            return False
        visible = visible_coverage(sprites)
        return all(v is s.alpha or float(v.sum()) >= MIN_VISIBLE * s.area for v, s in zip(visible, sprites))


def _apart(candidate: SceneObject, others: list[SceneObject]) -> bool:
    return all(math.hypot(candidate.x - o.x, candidate.y - o.y) >= candidate.footprint + o.footprint + MIN_GAP
               for o in others)


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


def _place(rng: np.random.Generator, attributes: dict[str, Any], others: list[SceneObject], layout: _Layout,
           tries: int = 40, away_from: tuple[float, float] | None = None) -> SceneObject | None:
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


def _sample_objects(rng: np.random.Generator, count: int, layout: _Layout) -> list[SceneObject] | None:
    objects: list[SceneObject] = []
    for _ in range(count):
        placed = _place(rng, _random_attributes(rng), objects, layout)
        if placed is None:
            return None
        objects.append(placed)
    return objects


def _sample_illumination(rng: np.random.Generator) -> Illumination:
    brightness = rng.uniform(0.78, 0.9) if rng.random() < 0.5 else rng.uniform(1.1, 1.22)
    temperature = rng.uniform(0.03, 0.08) * (1 if rng.random() < 0.5 else -1)
    return Illumination(round(float(brightness), 4), round(float(rng.uniform(0.85, 1.15)), 4), round(float(temperature), 4))


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


def _apply_change(rng: np.random.Generator, change_type: str, objects: list[SceneObject], layout: _Layout
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
    old = objects[target]
    if change_type == "drop":
        return objects[:target] + objects[target + 1:], ids[:target] + ids[target + 1:], {"type": "drop", "object": target}
    if change_type in ("color", "material"):
        choices = [c for c in (COLORS if change_type == "color" else MATERIALS) if c != getattr(old, change_type)]
        new_value = choices[rng.integers(len(choices))]
        after = list(objects)
        after[target] = replace(old, **{change_type: new_value})
        change = {"type": change_type, "object": target, "attribute": change_type,
                  "old": getattr(old, change_type), "new": new_value}
        return after, ids, change
    if change_type == "move":
        others = objects[:target] + objects[target + 1:]
        attributes = {"shape": old.shape, "color": old.color, "material": old.material, "size": old.size}
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


def sample_scene(index: int, change_type: str, config: SynthConfig) -> tuple[Scene, np.random.Generator]:
    """Sample scene `index` from its own random stream (independent of every other scene)."""
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
        scene = Scene(index, change_type, objects, after, list(range(len(objects))), after_ids, change,
                      semantic_view, nonsemantic_view, cache)
        return scene, rng
    raise DataError(f"synthetic set: could not place the objects of scene {index} in 200 tries "
                    f"({config.width}x{config.height} may be too small for {config.max_objects} objects)")


# ---------------------------------------------------------------------------------------------
# Captions and descriptions.

def _phrase(obj: SceneObject, rng: np.random.Generator | None) -> str:
    """Attribute phrase; canonical words without `rng`, otherwise each attribute may use a synonym."""
    words = []
    for table, value in ((SIZE_WORDS, obj.size), (COLOR_WORDS, obj.color), (MATERIAL_WORDS, obj.material),
                         (SHAPE_WORDS, obj.shape)):
        options = table[value]
        words.append(options[0] if rng is None or len(options) == 1 or rng.random() < 0.6
                     else options[int(rng.integers(1, len(options)))])
    return " ".join(words)


def change_captions(change: dict[str, Any], subject: SceneObject, rng: np.random.Generator) -> list[str]:
    """3-5 distinct references for a change; the first uses the first template and canonical words.

    `subject` is the changed object as it was before (color/material/drop/move) or as added (add),
    so the attributes named are its true ones and the new colour/material follows "to"/"became"/"turned".
    """
    templates = CHANGE_TEMPLATES[change["type"]]
    new = change.get("new", "")
    captions = [templates[0].format(obj=_phrase(subject, None), new=new)]
    wanted = int(rng.integers(MIN_REFERENCES, MAX_REFERENCES + 1))
    for _ in range(50):
        if len(captions) == wanted:
            break
        sentence = templates[int(rng.integers(len(templates)))].format(obj=_phrase(subject, rng), new=new)
        if sentence not in captions:
            captions.append(sentence)
    return captions


def no_change_captions(rng: np.random.Generator) -> list[str]:
    count = int(rng.integers(MIN_REFERENCES, MAX_REFERENCES + 1))
    order = rng.permutation(len(NO_CHANGE_CAPTIONS))[:count]
    return [NO_CHANGE_CAPTIONS[i] for i in order]


def object_phrase(record: dict[str, Any]) -> str:
    """Canonical attribute phrase of a stored object record, as `SceneObject.phrase`: "small red metal sphere"."""
    return f"{record['size']} {record['color']} {record['material']} {record['shape']}"


def describe(objects: list[dict[str, Any]]) -> str:
    """Single-image description: canonical phrases left to right by box centre, joined by " , "."""
    ordered = sorted(objects, key=lambda o: ((o["box"][0] + o["box"][2]) / 2.0, o["id"]))
    return " , ".join(object_phrase(o) for o in ordered)


# ---------------------------------------------------------------------------------------------
# Writing one scene.

def image_names(index: int) -> dict[str, str]:
    """Relative paths of every file of one scene."""
    name = f"{index:06d}.png"
    return {
        "before": f"images/CLEVR_default_{index:06d}.png",
        "after": f"sc_images/CLEVR_semantic_{index:06d}.png",
        "nonsemantic": f"nsc_images/CLEVR_nonsemantic_{index:06d}.png",
        "mask_before": f"gt_masks/before/{name}",
        "mask_after": f"gt_masks/after/{name}",
        "mask_before_n": f"gt_masks/before_n/{name}",
        "mask_after_n": f"gt_masks/after_n/{name}",
    }


def _object_records(objects: list[SceneObject], ids: list[int], sprites: list[Sprite], visible: list[np.ndarray]
                    ) -> list[dict[str, Any]]:
    order = sorted(range(len(sprites)), key=lambda i: sprites[i].depth)
    rank = {index: position for position, index in enumerate(order)}
    records = []
    for i, (obj, sprite, vis) in enumerate(zip(objects, sprites, visible)):
        records.append({
            "id": ids[i], "shape": obj.shape, "color": obj.color, "material": obj.material, "size": obj.size,
            "box": list(sprite.box), "visible": round(float(vis.sum()) / sprite.area, 4),
            "depth_order": rank[i], "position": [obj.x, obj.y], "yaw": obj.yaw,
        })
    return records


def _view_record(view: View) -> dict[str, Any] | None:
    if view.distractor is None:
        return None
    record: dict[str, Any] = {"kind": view.distractor}
    if view.distractor in ("viewpoint", "both"):
        record["camera"] = asdict(view.camera)
    if view.distractor in ("illumination", "both"):
        record["illumination"] = asdict(view.illumination)
    return record


def build_scene(index: int, change_type: str, config: SynthConfig, out: Path | None) -> dict[str, Any]:
    """Sample, render and (when `out` is given) write scene `index`; returns its scenes.json record
    plus its captions under "_captions" / "_no_change_captions"."""
    scene, rng = sample_scene(index, change_type, config)
    width, height = config.width, config.height
    base_view = View(BASE_CAMERA)
    cache = scene.sprites
    before_image, before_sprites, before_visible = render(scene.before, base_view, width, height, cache)
    after_image, after_sprites, after_visible = render(scene.after, scene.semantic_view, width, height, cache)
    nsc_image, nsc_sprites, nsc_visible = render(scene.before, scene.nonsemantic_view, width, height, cache)

    target = scene.change["object"]
    empty = np.zeros((height, width), bool)
    mask_before, mask_after = empty, empty
    if change_type != "add":
        mask_before = full_mask(before_sprites[target], before_visible[target], width, height)
    if change_type != "drop":
        position = scene.after_ids.index(target)
        mask_after = full_mask(after_sprites[position], after_visible[position], width, height)

    subject = scene.after[scene.after_ids.index(target)] if change_type == "add" else scene.before[target]
    captions = change_captions(scene.change, subject, rng)
    no_change = no_change_captions(rng)

    names = image_names(index)
    if out is not None:
        for key, array in (("before", before_image), ("after", after_image), ("nonsemantic", nsc_image),
                           ("mask_before", mask_before), ("mask_after", mask_after),
                           ("mask_before_n", empty), ("mask_after_n", empty)):
            save_png_atomic(array, out / names[key], compress_level=PNG_COMPRESS_LEVEL)

    change = dict(scene.change)
    change["subject"] = subject.phrase()
    if change_type == "move":
        before_box = before_sprites[target].box
        position = scene.after_ids.index(target)
        change["box_from"] = list(before_box)
        change["box_to"] = list(after_sprites[position].box)
    images = {}
    for key, objects, ids, sprites, visible in (
        ("before", scene.before, scene.before_ids, before_sprites, before_visible),
        ("after", scene.after, scene.after_ids, after_sprites, after_visible),
        ("nonsemantic", scene.before, scene.before_ids, nsc_sprites, nsc_visible),
    ):
        records = _object_records(objects, ids, sprites, visible)
        images[key] = {"file": names[key], "objects": records, "description": describe(records)}
    return {
        "change": change,
        "images": images,
        "distractors": {"semantic": _view_record(scene.semantic_view), "nonsemantic": _view_record(scene.nonsemantic_view)},
        "masks": {k[len("mask_"):]: v for k, v in names.items() if k.startswith("mask_")},
        "_captions": captions,
        "_no_change_captions": no_change,
    }


def _worker_init() -> None:
    cv2.setNumThreads(1)


def _build_task(task: tuple[int, str, SynthConfig, str]) -> dict[str, Any]:
    index, change_type, config, out = task
    return build_scene(index, change_type, config, Path(out))


# ---------------------------------------------------------------------------------------------
# The whole set.

def scene_types(config: SynthConfig) -> list[str]:
    """Change type of every scene: each block of 5 consecutive ids holds the 5 types in a seeded order."""
    types: list[str] = []
    for block in range((config.scenes + len(CHANGE_TYPES) - 1) // len(CHANGE_TYPES)):
        rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(1, block)))
        types.extend(CHANGE_TYPES[i] for i in rng.permutation(len(CHANGE_TYPES)))
    return types[: config.scenes]


def make_splits(config: SynthConfig) -> dict[str, list[int]]:
    """Seeded partition of the scene ids into train/val/test (sorted id lists)."""
    rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(2,)))
    order = rng.permutation(config.scenes)
    n_val = int(round(config.scenes * config.val_fraction))
    n_test = int(round(config.scenes * config.test_fraction))
    return {
        "train": sorted(int(i) for i in order[n_val + n_test:]),
        "val": sorted(int(i) for i in order[:n_val]),
        "test": sorted(int(i) for i in order[n_val:n_val + n_test]),
    }


def _worker_count(workers: int) -> int:
    if workers < 0:
        raise DataError(f"synthetic set: workers must be >= 0 (0 = one per core), got {workers}")
    if workers == 0:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return workers


def _summary(out: Path, config: SynthConfig, types: list[str], splits: dict[str, list[int]], seconds: float,
             workers: int, reused: bool) -> dict[str, Any]:
    return {
        "output": str(out),
        "scenes": config.scenes,
        "pairs": 2 * config.scenes,
        "change_types": {t: types.count(t) for t in CHANGE_TYPES},
        "splits": {name: len(ids) for name, ids in splits.items()},
        "width": config.width,
        "height": config.height,
        "seed": config.seed,
        "workers": workers,
        "reused_existing": reused,
        "seconds": round(seconds, 2),
    }


def generate_dataset(out: str | Path, config: SynthConfig, workers: int = 0) -> dict[str, Any]:
    """Render the whole set into `out` (CLEVR-Change layout + gt_masks + scenes.json); returns a summary.

    `workers` = processes (0 = one per core; 1 = in this process). The JSON files are written after
    every image, scenes.json last: a folder whose scenes.json holds the same config is complete and is
    reused as it is; one made with another config is refused rather than mixed.
    """
    start = time.perf_counter()
    out = Path(out)
    types = scene_types(config)
    splits = make_splits(config)
    count = _worker_count(workers)
    scenes_path = out / "scenes.json"
    if scenes_path.is_file():
        existing = read_json(scenes_path)
        if isinstance(existing, dict) and existing.get("config") == asdict(config):
            return _summary(out, config, types, splits, time.perf_counter() - start, count, reused=True)
        raise DataError(f"{out} already holds a synthetic set made with another config ({scenes_path}); "
                        "choose another --out or delete that folder")
    if out.exists() and not out.is_dir():
        raise DataError(f"synthetic set: output {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)

    tasks = [(index, types[index], config, str(out)) for index in range(config.scenes)]
    if count == 1 or config.scenes < 8:
        results = [_build_task(task) for task in tasks]
    else:
        # spawn: the parent may hold threads (torch, OpenCV) that fork would copy in a broken state.
        with multiprocessing.get_context("spawn").Pool(count, initializer=_worker_init) as pool:
            results = list(pool.imap(_build_task, tasks, chunksize=max(1, min(64, config.scenes // (count * 8)))))

    split_of = {index: name for name, ids in splits.items() for index in ids}
    change_file: dict[str, list[str]] = {}
    no_change_file: dict[str, list[str]] = {}
    scenes: dict[str, Any] = {}
    for index, record in enumerate(results):
        key = f"CLEVR_default_{index:06d}.png"
        change_file[key] = record.pop("_captions")
        no_change_file[key] = record.pop("_no_change_captions")
        record["split"] = split_of.get(index)
        record["captions"] = change_file[key]
        scenes[f"{index:06d}"] = record
    type_mapping = {t: [f"{i:06d}.png" for i, ti in enumerate(types) if ti == t] for t in CHANGE_TYPES}
    write_json_atomic(out / "change_captions.json", change_file, indent=None)
    write_json_atomic(out / "no_change_captions.json", no_change_file, indent=None)
    write_json_atomic(out / "splits.json", splits, indent=None)
    write_json_atomic(out / "type_mapping.json", type_mapping, indent=None)
    write_json_atomic(scenes_path, {"version": FORMAT_VERSION, "config": asdict(config), "scenes": scenes}, indent=None)
    return _summary(out, config, types, splits, time.perf_counter() - start, count, reused=False)


def load_synthetic_set(root: str | Path) -> dict[str, Any]:
    """root/scenes.json of a synthetic set, checked: {"version", "config" (the generator settings, seed
    included), "scenes"} (see :func:`load_scenes` for the records)."""
    path = Path(root) / "scenes.json"
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("scenes"), dict):
        raise DataError(f"{path}: expected an object with a \"scenes\" mapping (a davir synthetic set)")
    if data.get("version") != FORMAT_VERSION:
        raise DataError(f"{path}: synthetic set version {data.get('version')!r}; this davir reads version {FORMAT_VERSION}")
    return data


def load_scenes(root: str | Path) -> dict[str, Any]:
    """The per-scene records of a synthetic set: {"%06d": record} from root/scenes.json.

    A record holds "change" (type, object id, old/new or from/to, subject phrase), "images" (before /
    after / nonsemantic: file, objects with shape/color/material/size, box [x0, y0, x1, y1) in that
    image, visible fraction, depth_order 0 = nearest, ground position; and a left-to-right
    "description"), "distractors" (semantic / nonsemantic: None or kind + camera/illumination),
    "masks" (relative paths), "split" and "captions".
    """
    return load_synthetic_set(root)["scenes"]


__all__ = [
    "COLORS", "MATERIALS", "SHAPES", "SIZES", "NO_CHANGE_CAPTIONS", "CHANGE_TEMPLATES", "SynthConfig",
    "SceneObject", "Camera", "Illumination", "generate_dataset", "load_scenes", "render", "describe",
    "change_captions", "load_synthetic_set", "make_splits", "object_phrase", "scene_types", "build_scene",
]
