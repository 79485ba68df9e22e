"""`caption.py --engine vllm` against vLLM's own code: for a merged export of each chat family, the requests
`VllmEngine.requests` builds go through vLLM's input processing (tests/vllm_side.py, in a venv of its own, since
vLLM pins its own torch and transformers), and what vLLM would hand the model — prompt token ids with the image
placeholders expanded, and the pixel tensors — must equal what davir's own model captions from. Where they differ
(LLaVA-OneVision), the engine refuses the family; the test then holds the difference, so a vLLM that stops
differing shows up here.

Runs where DAVIR_VLLM_PYTHON names that venv's python (`make check-vllm` builds it and runs this file); skipped
otherwise. No GPU is needed: vLLM's renderer and multimodal processors run on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_fixtures import mask_and_entity_caches, write_chat_folder  # noqa: E402

VLLM_PYTHON = os.environ.get("DAVIR_VLLM_PYTHON")
pytestmark = [
    pytest.mark.skipif(not VLLM_PYTHON, reason="needs vLLM's venv: make check-vllm (DAVIR_VLLM_PYTHON)"),
    pytest.mark.usefixtures("one_torch_thread"),
]
CHAT_FAMILIES = ("qwen2_5_vl", "llava_onevision", "smolvlm", "qwen3_vl", "internvl", "gemma3")
# An entity long enough that model.max_prompt_tokens (64) cuts the prompt, as training cut it.
ENTITIES = [["small red metal cube"], [], [" ".join(["large gray rubber cylinder"] * 20)]]


@pytest.fixture(scope="module")
def caches(synthetic_set, tmp_path_factory):
    return mask_and_entity_caches(synthetic_set(12, 3), tmp_path_factory.mktemp("vllm_caches"))


def merged_export(family: str, caches, where: Path) -> Path:
    """A user's toy folder of the family, trained one step with FAC and EPC, exported merged as vLLM serves it."""
    from davir.cli import export, train
    from davir.data.formats import read_dataset
    from davir.models.vlm.epc import EpcConfig

    root, masks, entities = caches
    texts = [c for p in read_dataset("clevr_change", root, "train").pairs for c in p.captions]
    folder = write_chat_folder(family, where / "toy", [*texts, EpcConfig().prompt, EpcConfig().entity_prefix])
    run = where / "run"
    settings = [f"data.root={root}", f"data.masks={masks}", f"data.entities={entities}", f"model.family={family}"]
    settings += [f"model.pretrained={folder}", "model.image_size=64", "model.extra_trainable=[]"]
    settings += ["optim.batch_size=2", "optim.max_steps=1", "run.eval_every=0", "run.tensorboard=false"]
    assert train.main(["--config", str(REPO / "configs" / "demo.yaml"), *settings, f"run.output_dir={run}"]) == 0
    assert export.main(["--checkpoint", str(run), "--out", str(where / "merged"), "--merge"]) == 0
    return where / "merged"


def vllm_inputs(folder: Path, requests: list[dict], where: Path) -> dict:
    """vLLM's prompt token ids and pixel tensors for `requests` (tests/vllm_side.py in vLLM's venv)."""
    where.mkdir(parents=True, exist_ok=True)
    spec = {"model": str(folder), "requests": []}
    for index, request in enumerate(requests):
        paths = [where / f"{index}_{side}.png" for side in ("before", "after")]
        for image, path in zip(request["multi_modal_data"]["image"], paths):
            image.save(path)  # PNG: the same pixels reach vLLM
        spec["requests"].append({"prompt_token_ids": request["prompt_token_ids"], "images": [str(p) for p in paths]})
    (where / "requests.json").write_text(json.dumps(spec))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    done = subprocess.run(
        [VLLM_PYTHON, str(REPO / "tests" / "vllm_side.py"), str(where / "requests.json"), str(where / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((where / "out" / "result.json").read_text())
    assert "error" not in result, result["error"]
    pixels = [torch.load(where / "out" / f"pixels_{i}.pt", weights_only=True) for i in range(len(requests))]
    return {"ids": [row["prompt_token_ids"] for row in result["rows"]], "pixels": pixels}


def same_tensors(ours: dict, theirs: dict) -> list[str]:
    """Keys both hold whose values differ (a layout that only adds a batch axis compares flat); pixel_values must
    be in both."""
    assert "pixel_values" in ours and "pixel_values" in theirs, (sorted(ours), sorted(theirs))
    differing = []
    for key in sorted(set(ours) & set(theirs)):
        a, b = ours[key], theirs[key]
        if a.numel() != b.numel() or not torch.equal(a.reshape(b.shape).to(b.dtype), b):
            differing.append(key)
    return differing


@pytest.mark.parametrize("family", CHAT_FAMILIES)
def test_vllm_builds_the_inputs_davir_captions_from(family, caches, tmp_path):
    from PIL import Image

    from davir.errors import DataError
    from davir.export.loading import load_exported_model
    from davir.inference.vllm_engine import NOT_SERVED, VllmEngine
    from davir.runs.paths import RunPaths

    folder = merged_export(family, caches, tmp_path)
    model = load_exported_model(folder, device="cpu").eval()
    engine = VllmEngine(None, model.processor, model.config, model.image_size, model.end_token_id)
    root = caches[0]
    names = sorted(p.name for p in (root / "images").iterdir())[:3]
    pictures = [
        (Image.open(root / "images" / n), Image.open(root / "sc_images" / n.replace("default", "semantic")))
        for n in names
    ]
    inputs = [engine.inputs(None, before, after, []) for before, after in pictures]
    requests = engine.requests(inputs, ENTITIES)
    theirs = vllm_inputs(folder, requests, tmp_path / "vllm")

    prompts = model.build_prompts(ENTITIES, batch_size=len(ENTITIES))
    assert model.config.epc.use_entities and len(model.tokenizer(prompts[2])["input_ids"]) > 64  # the cut is tested
    ours_ids = model._prompt_ids(prompts)
    ours_pixels = [
        model._pixel_inputs(model.image_processor(before), model.image_processor(after)) for before, after in inputs
    ]
    if family in NOT_SERVED:  # the engine refuses it, for the difference held here
        assert [len(ids) for ids in theirs["ids"]] != [len(ids) for ids in ours_ids]
        with pytest.raises(DataError, match="not served through vLLM"):
            VllmEngine.load(RunPaths.of(folder))
        return
    assert theirs["ids"] == ours_ids
    for ours, vllm_pixels in zip(ours_pixels, theirs["pixels"]):
        assert same_tensors({k: v for k, v in ours.items() if torch.is_tensor(v)}, vllm_pixels) == []
