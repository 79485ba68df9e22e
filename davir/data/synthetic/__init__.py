"""The built-in synthetic change dataset: CLEVR-Change-like scenes drawn with numpy/OpenCV.

    python -m davir.data synth --out data/synth --scenes 5000 --seed 0
    python -m davir.data synth --out data/synth_hard --scenes 5000 --seed 0 --difficulty hard

`--difficulty standard` (default) is the set described below, byte for byte as before difficulties existed;
`--difficulty hard` (module `hard`, docs/experiments/synthetic_hard.md) has 6-10 partly hidden and small objects, camera
moves with parallax (a 3-D pose change), moving ground shadows and a textured floor, in the same layout.

Scenes of 3-7 objects (sphere, cube, cylinder × the 8 CLEVR colours × metal/rubber × small/large)
standing on a light gray floor, seen through a pinhole camera and shaded per pixel (metal: dark
reflective body, strong white highlight, darker rim; rubber: matte Lambert shading). Every scene gives
a semantic pair (one change: color, material, add, drop or move, balanced) and a distractor-only pair
(an illumination change, a small camera move, or both); a share of the semantic pairs carries a
distractor too.

Written in the CLEVR-Change layout that the `clevr_change` reader serves (docs/datasets.md, CLEVR-Change):

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
                  the distractors and a left-to-right description of each image (see `load_scenes`).

No soft ground shadows are drawn on purpose: a shadow lies outside the object's mask, and the masks
are only exact (pixels outside them identical in a pair without distractor) when an object changes
nothing but its own pixels. Output is deterministic for a seed: each scene draws from its own
`SeedSequence(seed, spawn_key=(0, index))`, so the bytes do not depend on the number of workers.

The package, one idea a module: `world` (attributes, objects, camera, light), `config` (SynthConfig),
`draw` (one object as a sprite), `render` (a scene's image and masks), `scenes` (sampling a scene),
`captions` (references and descriptions), `scene_files` (one scene written), `dataset` (the whole set),
`hard` (sampling a hard scene).
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
from davir.data.synthetic.scene_files import build_scene, image_names
from davir.data.synthetic.sampling import sample_scene
from davir.data.synthetic.scenes import Scene
from davir.data.synthetic.world import COLORS, MATERIALS, SHAPES, SIZES, Camera, Illumination, SceneObject, View

__all__ = [
    "COLORS", "MATERIALS", "SHAPES", "SIZES", "NO_CHANGE_CAPTIONS", "CHANGE_TEMPLATES", "SIZE_WORDS", "COLOR_WORDS",
    "MATERIAL_WORDS", "SHAPE_WORDS", "FORMAT_VERSION", "SynthConfig", "SceneObject", "Camera", "Illumination", "View",
    "Scene", "generate_dataset", "load_scenes", "load_synthetic_set", "render", "full_mask", "describe",
    "change_captions", "no_change_captions", "make_splits", "object_phrase", "scene_types", "sample_scene",
    "build_scene", "image_names",
]
