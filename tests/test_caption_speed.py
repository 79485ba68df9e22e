"""The captioning engine's speed paths (caption.py / evaluate.py): LoRA folded into the base weights in memory, and
`--compile`'s static KV cache of one shape; each gives the same captions as the plain path on every family."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_fixtures import write_chat_folder  # noqa: E402

from davir.cli import caption as caption_script  # noqa: E402
from davir.models.families import FAMILIES, get_family  # noqa: E402

TINY_BLIP = REPO / "assets" / "tiny_instructblip"


def _trained_like(family: str, folder: Path, *, entities: bool = False):
    """A family's tiny model with non-zero LoRA B matrices (as training leaves them), saved to ``folder``."""
    from davir.models.vlm.build import build_davir_model
    from davir.models.vlm.config import DavirModelConfig
    from davir.models.vlm.epc import EpcConfig

    if family == "instructblip":
        base, size = TINY_BLIP, {}
    else:
        texts = [
            "the small red cube moved",
            "there is no change",
            "the large blue sphere turned green",
            EpcConfig().prompt,
            EpcConfig().entity_prefix,
        ]
        base, size = write_chat_folder(family, folder.parent / "base", texts), {"image_size": 64}
    model = build_davir_model(
        DavirModelConfig(family=family, pretrained=str(base), epc=EpcConfig(use_entities=entities), **size)
    ).eval()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("family", FAMILIES.names())
def test_engine_merges_lora_and_captions_as_the_unmerged_model(family, tmp_path, one_torch_thread):
    from peft.tuners.lora import LoraLayer

    from davir.inference.engines import DavirEngine
    from davir.runs.paths import RunPaths

    _trained_like(family, tmp_path / "model")
    saved = {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir() if p.is_file()}
    run = RunPaths.of(tmp_path / "model")
    plain = DavirEngine.load(run, "cpu", merge_lora=False)
    merged = DavirEngine.load(run, "cpu")  # the default: merged
    lora_layers = [m for m in merged.model.core.modules() if isinstance(m, LoraLayer)]
    assert lora_layers and all(m.merged for m in lora_layers)
    assert not any(m.merged for m in plain.model.core.modules() if isinstance(m, LoraLayer))

    pictures = [
        Image.fromarray(
            torch.randint(
                0, 256, (48 + 8 * i, 60, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(i)
            ).numpy()
        )
        for i in range(8)
    ]
    inputs = [plain.inputs(None, pictures[i], pictures[i + 1], []) for i in range(0, 8, 2)]
    with torch.no_grad():
        want, _ = plain.generate(inputs, [[]] * 4, num_beams=1, max_new_tokens=8, attention=False)
        got, _ = merged.generate(inputs, [[]] * 4, num_beams=1, max_new_tokens=8, attention=False)
        beams, _ = merged.generate(inputs, [[]] * 4, num_beams=3, max_new_tokens=8, attention=False)
        want_beams, _ = plain.generate(inputs, [[]] * 4, num_beams=3, max_new_tokens=8, attention=False)
    assert got == want and beams == want_beams
    # the merge changed the weights the forward uses (not a no-op), by the LoRA delta alone
    name = next(n for n, m in merged.model.core.named_modules() if isinstance(m, LoraLayer))
    layer_m, layer_p = merged.model.core.get_submodule(name), plain.model.core.get_submodule(name)
    delta = layer_p.get_delta_weight("default")
    assert delta.abs().max() > 0
    torch.testing.assert_close(layer_m.base_layer.weight, layer_p.base_layer.weight + delta, rtol=0, atol=1e-6)
    assert {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir() if p.is_file()} == saved


@pytest.mark.parametrize("family", ["instructblip", "qwen2_5_vl"])
def test_static_decode_gives_one_shape_and_the_same_captions(family, tmp_path, one_torch_thread):
    from davir.inference.engines import STATIC_LENGTH_MULTIPLE, DavirEngine
    from davir.runs.paths import RunPaths

    _trained_like(family, tmp_path / "model", entities=True)
    run = RunPaths.of(tmp_path / "model")
    plain, static = DavirEngine.load(run, "cpu"), DavirEngine.load(run, "cpu", static_decode=True)
    calls = []
    model_generate = static.model.generate

    def spy(before, after, prompts, **settings):
        calls.append((before.shape[0], settings.get("cache_implementation"), settings.get("pad_length_to")))
        return model_generate(before, after, prompts, **settings)

    static.model.generate = spy
    pictures = [
        Image.fromarray(
            torch.randint(
                0, 256, (48 + 8 * i, 60, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(i)
            ).numpy()
        )
        for i in range(10)
    ]
    inputs = [plain.inputs(None, pictures[i], pictures[i + 1], []) for i in range(0, 10, 2)]
    entities = [["cube"], ["small red metal sphere"], [], ["large blue rubber cylinder"], ["sphere"]]  # 5 lengths
    with torch.no_grad():
        for batch in (slice(0, 3), slice(3, 5)):  # a full batch of 3, then a last one of 2
            for beams in (1, 2):
                want, _ = plain.generate(
                    inputs[batch], entities[batch], num_beams=beams, max_new_tokens=8, attention=False
                )
                got, _ = static.generate(
                    inputs[batch], entities[batch], num_beams=beams, max_new_tokens=8, attention=False
                )
                assert got == want and len(got) == len(inputs[batch])
    # every call: 3 rows (the last batch padded), the static cache, the input rounded to one multiple
    assert calls == [(3, "static", STATIC_LENGTH_MULTIPLE)] * 4


def test_caption_cli_merges_by_default_and_compiles_on_request():
    parser = caption_script.build_parser()
    base = ["--checkpoint", "x", "--pairs", "y"]
    assert parser.parse_args(base).merge_lora is True and parser.parse_args(base).static_decode is False
    assert parser.parse_args([*base, "--no-merge-lora"]).merge_lora is False
    assert parser.parse_args([*base, "--compile"]).static_decode is True
    assert get_family("instructblip") is not None
