"""What a synthetic scene is made of: object attributes, objects on the floor, the camera, the light."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import cv2
import numpy as np

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
    scale: float = 1.0  # radius = SIZES[size] * scale (hard sets draw small objects smaller; 1.0 elsewhere)

    @property
    def radius(self) -> float:
        return SIZES[self.size] * self.scale if self.scale != 1.0 else SIZES[self.size]

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
        position = target + self.distance * np.array(
            [math.sin(a) * math.cos(e), -math.cos(a) * math.cos(e), math.sin(e)]
        )
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


@dataclass(frozen=True)
class PoseCamera:
    """A pinhole camera at a free 3-D pose (hard sets): position (x, y, z), heading `yaw` (degrees, 0 = looking
    along +y, positive towards +x) and downward tilt `pitch` (degrees), no roll. Moving it translates and
    rotates the camera, so nearer objects shift more in the image than far ones (parallax)."""

    x: float
    y: float
    z: float
    yaw: float
    pitch: float

    @classmethod
    def from_camera(cls, camera: Camera) -> PoseCamera:
        position, _, _, forward = camera.basis()
        return cls.look_along(position, forward)

    @classmethod
    def look_along(cls, position: np.ndarray, forward: np.ndarray) -> PoseCamera:
        yaw = math.degrees(math.atan2(forward[0], forward[1]))
        pitch = math.degrees(math.asin(-forward[2] / np.linalg.norm(forward)))
        return cls(*(round(float(v), 4) for v in (*position, yaw, pitch)))

    def basis(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(position, right, down, forward) in world coordinates, as `Camera.basis`."""
        a, p = math.radians(self.yaw), math.radians(self.pitch)
        position = np.array([self.x, self.y, self.z])
        forward = np.array([math.sin(a) * math.cos(p), math.cos(a) * math.cos(p), -math.sin(p)])
        right = np.cross(forward, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        down = np.cross(forward, right)
        return position, right, down, forward


@dataclass(frozen=True)
class Light:
    """Direction of the key light that casts the ground shadows (hard sets): azimuth and elevation in degrees
    (azimuth 0 = light from -y, the camera's side; positive towards +x)."""

    azimuth: float
    elevation: float

    def direction(self) -> np.ndarray:
        """Unit vector from the scene towards the light."""
        a, e = math.radians(self.azimuth), math.radians(self.elevation)
        return np.array([math.sin(a) * math.cos(e), -math.cos(a) * math.cos(e), math.sin(e)])


@dataclass(frozen=True)
class Floor:
    """A mild value-noise texture fixed to the floor (hard sets): brightness × (1 + amplitude × noise(x, y)),
    noise in [-1, 1] drawn from `seed` on a grid of `cell` world units (plus an octave at cell / 3)."""

    seed: int
    amplitude: float
    cell: float


@dataclass
class View:
    """How one image is taken: camera and illumination, and which distractor (if any) made them.

    `light` (shadows) and `floor` (texture) are set in hard sets only; None draws neither, as standard sets do.
    """

    camera: Camera | PoseCamera
    illumination: Illumination = field(default_factory=Illumination)
    distractor: str | None = None
    light: Light | None = None
    floor: Floor | None = None


BASE_CAMERA = Camera()
