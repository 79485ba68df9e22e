"""`caption.py --engine vllm`: batch captioning of a merged export through vLLM, on a GPU machine.

Same chat turn and S×S pictures as `ChatDavirModel`, greedy decoding only, no attention maps. Why merged, and what
is not run here: docs/toolkits.md, "Batch captioning through vLLM", and docs/sharing.md.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from PIL import Image

from davir.data.records import ChangePair
from davir.errors import DataError
from davir.runs.paths import RunPaths

# The chat families whose vLLM inputs are davir's own: vLLM's input processing (its renderer, the code
# `LLM.generate` runs before the model), given VllmEngine.requests, builds the same token ids and pixels as davir's
# model captions from (tests/test_vllm_inputs.py, run with vLLM in its own venv: `make check-vllm`).
VLLM_FAMILIES = ("qwen2_5_vl", "qwen3_vl", "internvl", "smolvlm", "gemma3")
NOT_SERVED = {
    "instructblip": "vLLM has no InstructBLIP",
    # Measured on the tiny preset: 293 prompt tokens a pair from vLLM against 151 from transformers.
    "llava_onevision": (
        "vLLM gives every picture its high-resolution tiles too, where transformers (and so davir's training) gives "
        "a picture of a two-image turn its base view only: vLLM would caption from image tokens the model never "
        "trained on"
    ),
}


def check_vllm_available() -> None:
    """A DataError naming what is missing: the vllm package, or a CUDA GPU."""
    if importlib.util.find_spec("vllm") is None:
        raise DataError(
            "--engine vllm: vLLM is not installed here (pip install vllm, on a machine with a CUDA GPU); "
            "the default engine (--engine transformers) captions on any device"
        )
    if not torch.cuda.is_available():
        raise DataError(
            "--engine vllm needs a CUDA GPU, and none is visible; use --engine transformers on this machine"
        )


class VllmEngine:
    """A merged export of a chat family, captioned by vLLM (greedy)."""

    kind = "davir"
    needs_images = True

    def __init__(self, llm, processor, config, image_size: int, end_token_id: int):
        self.llm, self.processor, self.config = llm, processor, config
        self.image_size, self.end_token_id = image_size, end_token_id
        self.uses_entities = bool(config.epc.use_entities)
        self.num_entities = config.epc.num_entities

    @classmethod
    def load(cls, run: RunPaths, *, num_beams: int | None = None) -> VllmEngine:
        from davir.export.layout import is_export, read_export_info
        from davir.models.families import get_family
        from davir.models.vlm.checkpoint import read_davir_config

        folder = Path(run.model_dir)
        if not is_export(folder) or read_export_info(folder)["weights"] != "merged":
            raise DataError(
                f"--engine vllm serves a merged export: {folder} is not one (write it with "
                "`davir-export --checkpoint RUN --out DIR --merge`, then caption.py --checkpoint DIR)"
            )
        config = read_davir_config(folder)
        if config.family not in VLLM_FAMILIES:
            reason = NOT_SERVED.get(config.family, "not checked against vLLM's input processing")
            raise DataError(
                f"--engine vllm: model.family={config.family} is not served through vLLM ({reason}; it serves "
                f"{', '.join(VLLM_FAMILIES)}); use --engine transformers"
            )
        if num_beams not in (None, 1):
            raise DataError(
                "--engine vllm decodes greedily: pass --num-beams 1, or use --engine transformers for beams"
            )
        check_vllm_available()
        from vllm import LLM

        family = get_family(config.family)
        processor = family.load_processor(folder)
        architecture = family.load_architecture(folder)
        size = family.input_size(config, architecture)
        end = processor.tokenizer.convert_tokens_to_ids(family.end_of_turn)
        llm = LLM(model=str(folder), limit_mm_per_prompt={"image": 2}, dtype=config.dtype)
        return cls(llm, processor, config, size, end)

    def inputs(self, pair: ChangePair, before: Image.Image, after: Image.Image, entities: list[str]):
        side = (self.image_size, self.image_size)
        return (
            before.convert("RGB").resize(side, Image.Resampling.BICUBIC),
            after.convert("RGB").resize(side, Image.Resampling.BICUBIC),
        )

    def requests(self, inputs: list, entities: list[list[str]]) -> list[dict]:
        """vLLM's prompt of each pair: the token ids of the chat turn davir's own model encodes, with the image
        placeholders unexpanded (vLLM expands them), and the two S×S pictures. Ids, not text: vLLM would add a
        second BOS to a turn whose template writes one (Gemma 3)."""
        from davir.models.vlm.chat_turn import cut_prompt, encode_turns, turn_text
        from davir.models.vlm.epc import entity_prompts

        prompts = entity_prompts(self.config.epc, entities if self.uses_entities else None, batch_size=len(inputs))
        tokenizer = self.processor.tokenizer
        texts = [
            turn_text(self.processor, self.config.family, cut_prompt(tokenizer, p, self.config.max_prompt_tokens))
            for p in prompts
        ]
        return [
            {"prompt_token_ids": ids, "multi_modal_data": {"image": [before, after]}}
            for ids, (before, after) in zip(encode_turns(tokenizer, texts), inputs)
        ]

    def generate(
        self, inputs: list, entities: list[list[str]], *, num_beams: int, max_new_tokens: int, attention: bool
    ) -> tuple[list[str], list | None]:
        from vllm import SamplingParams

        settings = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=[self.end_token_id])
        outputs = self.llm.generate(self.requests(inputs, entities), settings, use_tqdm=False)
        return [output.outputs[0].text.strip() for output in outputs], None
