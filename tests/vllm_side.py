"""Run inside a venv with vLLM (tests/test_vllm_inputs.py starts it there): vLLM's own input processing of the
requests `caption.py --engine vllm` would send, written out for the test to compare with davir's.

    python tests/vllm_side.py REQUESTS.json OUT_DIR

REQUESTS.json: {"model": merged export folder, "requests": [{"prompt_token_ids": [...], "images": [png, png]}]}.
For each request this runs the renderer `vllm.LLM.generate` runs before the model (tokens → placeholder expansion →
the HF processor on the pictures) and writes OUT_DIR/result.json ({"prompt_token_ids": [...]} a request, or
{"error": ...} for the whole model) and OUT_DIR/pixels_<i>.pt (the tensors vLLM hands the model). Pixels are
normalised on the host (`mm_device_do_normalize=False`), as transformers does, so they compare number for number.
Needs no GPU: only vLLM's input side is built.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from PIL import Image


def main(requests_file: str, out_dir: str) -> None:
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig
    from vllm.renderers.registry import renderer_from_config

    spec = json.loads(Path(requests_file).read_text())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        model = ModelConfig(
            model=spec["model"], limit_mm_per_prompt={"image": 2}, dtype="float32", mm_device_do_normalize=False
        )
        renderer = renderer_from_config(VllmConfig(model_config=model, device_config=DeviceConfig(device="cpu")))
    except Exception as error:  # the test reports what vLLM said
        (out / "result.json").write_text(json.dumps({"error": f"{type(error).__name__}: {error}"}))
        return
    rows = []
    for index, request in enumerate(spec["requests"]):
        images = [Image.open(path).convert("RGB") for path in request["images"]]
        (rendered,) = renderer.render_cmpl(
            [{"prompt_token_ids": request["prompt_token_ids"], "multi_modal_data": {"image": images}}]
        )
        kwargs = rendered["mm_kwargs"].get_data()
        torch.save(
            {key: value for key, value in dict(kwargs).items() if torch.is_tensor(value)}, out / f"pixels_{index}.pt"
        )
        rows.append({"prompt_token_ids": list(rendered["prompt_token_ids"])})
    import vllm

    (out / "result.json").write_text(json.dumps({"vllm": vllm.__version__, "rows": rows}))


if __name__ == "__main__":
    main(*sys.argv[1:])
