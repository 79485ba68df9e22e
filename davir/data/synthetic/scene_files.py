"""One scene rendered and written: its seven images and masks, its scenes.json record and its captions."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from davir.data.images import save_png_atomic
from davir.data.synthetic.captions import change_captions, describe, no_change_captions
from davir.data.synthetic.config import SynthConfig
from davir.data.synthetic.draw import Sprite, projector
from davir.data.synthetic.render import full_mask, render
from davir.data.synthetic.sampling import sample_scene
from davir.data.synthetic.world import BASE_CAMERA, SceneObject, View
from davir.runtime.signals import ignore_interrupts

PNG_COMPRESS_LEVEL = 1  # zlib level: writing dominates the run time; level 1 is ~2x faster, files ~15% larger


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


def _object_records(
    objects: list[SceneObject],
    ids: list[int],
    sprites: list[Sprite],
    visible: list[np.ndarray],
    view: View | None = None,
    size: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """The objects of one image; with `view` and `size` (hard sets) also each one's radius, the camera depth of its
    centre and that centre's pixel (x, y), the metadata a parallax check needs."""
    order = sorted(range(len(sprites)), key=lambda i: sprites[i].depth)
    rank = {index: position for position, index in enumerate(order)}
    proj = None if view is None else projector(view.camera, *size)
    records = []
    for i, (obj, sprite, vis) in enumerate(zip(objects, sprites, visible)):
        record = {
            "id": ids[i],
            "shape": obj.shape,
            "color": obj.color,
            "material": obj.material,
            "size": obj.size,
            "box": list(sprite.box),
            "visible": round(float(vis.sum()) / sprite.area, 4),
            "depth_order": rank[i],
            "position": [obj.x, obj.y],
            "yaw": obj.yaw,
        }
        if proj is not None:
            centre, depth = proj.project(np.array([[obj.x, obj.y, obj.radius]]))
            record.update(
                {
                    "radius": round(obj.radius, 4),
                    "depth": round(float(depth[0]), 4),
                    "centre_px": [round(float(v), 2) for v in centre[0]],
                }
            )
        records.append(record)
    return records


def _view_record(view: View) -> dict[str, Any] | None:
    if view.distractor is None:
        return None
    record: dict[str, Any] = {"kind": view.distractor}
    if view.distractor in ("viewpoint", "both"):
        record["camera"] = asdict(view.camera)
    if view.distractor in ("illumination", "both"):
        record["illumination"] = asdict(view.illumination)
        if view.light is not None:
            record["light"] = asdict(view.light)
    return record


def _base_view_record(view: View) -> dict[str, Any]:
    """A hard set's before view: its camera pose, key light and floor texture."""
    return {
        "camera": asdict(view.camera),
        "light": asdict(view.light) if view.light else None,
        "floor": asdict(view.floor) if view.floor else None,
    }


def build_scene(index: int, change_type: str, config: SynthConfig, out: Path | None) -> dict[str, Any]:
    """Sample, render and (when `out` is given) write scene `index`; returns its scenes.json record
    plus its captions under "_captions" / "_no_change_captions"."""
    scene, rng = sample_scene(index, change_type, config)
    width, height = config.width, config.height
    hard = config.difficulty == "hard"
    base_view = scene.base_view or View(BASE_CAMERA)
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
        for key, array in (
            ("before", before_image),
            ("after", after_image),
            ("nonsemantic", nsc_image),
            ("mask_before", mask_before),
            ("mask_after", mask_after),
            ("mask_before_n", empty),
            ("mask_after_n", empty),
        ):
            save_png_atomic(array, out / names[key], compress_level=PNG_COMPRESS_LEVEL)

    change = dict(scene.change)
    change["subject"] = subject.phrase()
    if change_type == "move":
        before_box = before_sprites[target].box
        position = scene.after_ids.index(target)
        change["box_from"] = list(before_box)
        change["box_to"] = list(after_sprites[position].box)
    images = {}
    for key, objects, ids, sprites, visible, view in (
        ("before", scene.before, scene.before_ids, before_sprites, before_visible, base_view),
        ("after", scene.after, scene.after_ids, after_sprites, after_visible, scene.semantic_view),
        ("nonsemantic", scene.before, scene.before_ids, nsc_sprites, nsc_visible, scene.nonsemantic_view),
    ):
        records = _object_records(objects, ids, sprites, visible, *((view, (width, height)) if hard else ()))
        images[key] = {"file": names[key], "objects": records, "description": describe(records)}
    if hard:
        change["hard_target"] = scene.hard_target
        extra = {"view": _base_view_record(base_view)}
    else:
        extra = {}
    return {
        "change": change,
        "images": images,
        "distractors": {
            "semantic": _view_record(scene.semantic_view),
            "nonsemantic": _view_record(scene.nonsemantic_view),
        },
        "masks": {k[len("mask_") :]: v for k, v in names.items() if k.startswith("mask_")},
        **extra,
        "_captions": captions,
        "_no_change_captions": no_change,
    }


def worker_init() -> None:
    cv2.setNumThreads(1)
    ignore_interrupts()  # Ctrl-C reaches the whole group; the parent stops the pool (davir.runtime.signals)


def build_task(task: tuple[int, str, SynthConfig, str]) -> dict[str, Any]:
    index, change_type, config, out = task
    return build_scene(index, change_type, config, Path(out))
