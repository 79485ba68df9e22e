"""The built-in synthetic change dataset: CLEVR-Change-like scenes drawn with numpy/OpenCV.

    python -m davir.data synth --out data/synth --scenes 5000 --seed 0
    python -m davir.data synth --out data/synth_hard --scenes 5000 --seed 0 --difficulty hard

The scenes, the files written, the masks and the modules: docs/datasets.md, "The built-in synthetic set";
the hard set: docs/experiments/synthetic_hard.md.
"""

from davir.data.synthetic.captions import (
    CHANGE_TEMPLATES,
    COLOR_WORDS,
    MATERIAL_WORDS,
    NO_CHANGE_CAPTIONS,
    SHAPE_WORDS,
    SIZE_WORDS,
    change_captions,
    describe,
    no_change_captions,
    object_phrase,
)
from davir.data.synthetic.config import SynthConfig
from davir.data.synthetic.dataset import (
    FORMAT_VERSION,
    generate_dataset,
    load_scenes,
    load_synthetic_set,
    make_splits,
    scene_types,
)
from davir.data.synthetic.render import full_mask, render
from davir.data.synthetic.sampling import sample_scene
from davir.data.synthetic.scene_files import build_scene, image_names
from davir.data.synthetic.scenes import Scene
from davir.data.synthetic.world import COLORS, MATERIALS, SHAPES, SIZES, Camera, Illumination, SceneObject, View

__all__ = [
    "COLORS",
    "MATERIALS",
    "SHAPES",
    "SIZES",
    "NO_CHANGE_CAPTIONS",
    "CHANGE_TEMPLATES",
    "SIZE_WORDS",
    "COLOR_WORDS",
    "MATERIAL_WORDS",
    "SHAPE_WORDS",
    "FORMAT_VERSION",
    "SynthConfig",
    "SceneObject",
    "Camera",
    "Illumination",
    "View",
    "Scene",
    "generate_dataset",
    "load_scenes",
    "load_synthetic_set",
    "render",
    "full_mask",
    "describe",
    "change_captions",
    "no_change_captions",
    "make_splits",
    "object_phrase",
    "scene_types",
    "sample_scene",
    "build_scene",
    "image_names",
]
