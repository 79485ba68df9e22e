"""Drawing one object: projection through the camera, anti-aliased coverage and per-pixel shading, as a `Sprite`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

import cv2
import numpy as np

from davir.data.synthetic.world import COLORS, Camera, SceneObject, cube_half_side, cylinder_dims

LIGHT = np.array([-0.45, -0.55, 0.70]) / np.linalg.norm([-0.45, -0.55, 0.70])  # towards the key light


@lru_cache(maxsize=64)
def projector(camera: Camera, width: int, height: int) -> Projector:
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
        return (
            self.x0 + int(cols[0]),
            self.y0 + int(rows[0]),
            self.x0 + int(cols[-1]) + 1,
            self.y0 + int(rows[-1]) + 1,
        )

    @cached_property
    def area(self) -> float:
        """Total coverage in pixels (the object's size before occlusion)."""
        return float(self.alpha.sum())


# Drawing. Coverage is drawn 3x supersampled and box-filtered down (OpenCV's own anti-aliased fill
# leaves spikes at the many short edges of an ellipse); colour is computed per pixel of the object's
# patch from a surface normal and the key light.

_SHIFT = 4
_SUB = float(1 << _SHIFT)
_SUPERSAMPLE = 3
PATCH_PAD = 2.0  # pixels of patch around an object's projected outline


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
    ((cx, cy),) = _fixed(np.array([centre]), _SUPERSAMPLE)[0]
    cv2.circle(
        canvas, (int(cx), int(cy)), round(radius * _SUPERSAMPLE * _SUB), 255, -1, lineType=cv2.LINE_8, shift=_SHIFT
    )
    return _coverage(canvas, shape)


def _patch_frame(points: np.ndarray) -> tuple[int, int, int, int]:
    """Integer patch (x0, y0, w, h) enclosing the points with a margin of PATCH_PAD pixels."""
    (low_x, low_y), (high_x, high_y) = points.min(axis=0).tolist(), points.max(axis=0).tolist()
    x0, y0 = math.floor(low_x - PATCH_PAD), math.floor(low_y - PATCH_PAD)
    return x0, y0, math.ceil(high_x + PATCH_PAD) - x0, math.ceil(high_y + PATCH_PAD) - y0


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
    cv2.polylines(
        canvas, [_fixed(polygon, _SUPERSAMPLE)], True, 255, thickness=_SUPERSAMPLE, lineType=cv2.LINE_8, shift=_SHIFT
    )
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
            face_body, face_white = _surface(
                obj.material, lit * (1.06 - 0.12 * t), specular, rim, reflection, sharpness=6
            )
            if body is None:  # the first face fills the patch, so face seams blend with a face, not the floor
                body, white = face_body.copy(), face_white.copy()
            else:
                coverage = _fill_polygon((h, w), quad)
                body += coverage * (face_body - body)
                white += coverage * (face_white - white)
        edge = _outline((h, w), local_pixels[[4, 5, 6, 7]], 0.6 if obj.material == "metal" else 0.22)
        rgb = _finish(base, body, white, edge)
    return Sprite(x0, y0, alpha, rgb, float(centre_depth))


_CIRCLE = np.stack(
    [np.cos(np.linspace(0, 2 * np.pi, 48, endpoint=False)), np.sin(np.linspace(0, 2 * np.pi, 48, endpoint=False))],
    axis=1,
)


def _draw_cylinder(obj: SceneObject, proj: Projector, shade: bool, alpha: np.ndarray | None) -> Sprite:
    radius, height = cylinder_dims(obj.radius)
    ring = _CIRCLE * radius + [obj.x, obj.y]
    # bottom circle, top circle, and the centre of the axis (for the depth order)
    n = len(ring)
    points = np.empty((2 * n + 1, 3))
    points[:n, :2], points[:n, 2] = ring, 0.0
    points[n : 2 * n, :2], points[n : 2 * n, 2] = ring, height
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
        bottom, top = local_pixels[: len(ring)], local_pixels[len(ring) :]
        # Body: the normal turns across the width (u in [-1, 1] from the camera's left to right).
        half_width = float(local_pixels[:, 0].max() - local_pixels[:, 0].min()) / 2.0
        u = np.clip((np.arange(w, dtype=np.float32) + float(x0 - centre[0, 0])) / half_width, -1.0, 1.0)[None, :]
        facing = np.sqrt(1.0 - u * u)
        diffuse = u * float(right @ LIGHT) + facing * float(towards @ LIGHT)
        specular = u * float(right @ half) + facing * float(towards @ half)
        v = np.clip(
            (np.arange(h, dtype=np.float32)[:, None] - float(top[:, 1].mean()))
            / max(float(bottom[:, 1].mean() - top[:, 1].mean()), 1.0),
            0.0,
            1.0,
        )
        reflection = 0.7 * v * v * facing
        body, white = _surface(obj.material, diffuse, specular, facing, reflection)
        body, white = np.broadcast_to(body, (h, w)).copy(), np.broadcast_to(white, (h, w)).copy()
        ys = np.arange(h, dtype=np.float32)[:, None]
        span = max(float(top[:, 1].max() - top[:, 1].min()), 1.0)
        t = np.clip((ys - float(top[:, 1].min())) / span, 0.0, 1.0)
        top_body, top_white = _surface(
            obj.material,
            float(LIGHT[2]) * (1.04 - 0.08 * t),
            0.95 - 0.4 * t,
            1.0 - 0.2 * t,
            0.25 * (1.0 - t),
            sharpness=6,
        )
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
