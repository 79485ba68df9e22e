"""Captioning folds LoRA into the base weights in memory (caption.py / evaluate.py's engine): the same captions as the
unmerged model on every family, the adapters really merged, the saved files untouched."""

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
from davir.models.families import FAMILY_NAMES, get_family  # noqa: E402

TINY_BLIP = REPO / "assets" / "tiny_instructblip"


def _trained_like(family: str, folder: Path):
    """A family's tiny model with non-zero LoRA B matrices (as training leaves them), saved to ``folder``."""
    from davir.models.davir import build_davir_model
    from davir.models.davir_config import DavirModelConfig
    from davir.models.epc import EpcConfig

    if family == "instructblip":
        base, size = TINY_BLIP, {}
    else:
        texts = ["the small red cube moved", "there is no change", "the large blue sphere turned green",
                 EpcConfig().prompt, EpcConfig().entity_prefix]
        base, size = write_chat_folder(family, folder.parent / "base", texts), {"image_size": 64}
    model = build_davir_model(DavirModelConfig(family=family, pretrained=str(base), epc=EpcConfig(use_entities=False),
                                               **size)).eval()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("family", FAMILY_NAMES)
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

    pictures = [Image.fromarray(torch.randint(0, 256, (48 + 8 * i, 60, 3), dtype=torch.uint8,
                                              generator=torch.Generator().manual_seed(i)).numpy()) for i in range(8)]
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


def test_caption_cli_merges_by_default_and_says_how_not_to():
    parser = caption_script.build_parser()
    base = ["--checkpoint", "x", "--pairs", "y"]
    assert parser.parse_args(base).merge_lora is True
    assert parser.parse_args([*base, "--no-merge-lora"]).merge_lora is False
    assert get_family("instructblip") is not None
