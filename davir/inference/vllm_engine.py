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

# The chat families vLLM serves (its model registry: Qwen2_5_VLForConditionalGeneration,
# LlavaOnevisionForConditionalGeneration, Idefics3/SmolVLM); InstructBLIP is not among them. Qwen3-VL, InternVL
# and Gemma 3 are in vLLM's registry too but left out until run there (docs/toolkits.md says why).
VLLM_FAMILIES = ("qwen2_5_vl", "llava_onevision", "smolvlm")


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
            raise DataError(
                f"--engine vllm: model.family={config.family} is not served by vLLM (it serves "
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

    def generate(
        self, inputs: list, entities: list[list[str]], *, num_beams: int, max_new_tokens: int, attention: bool
    ) -> tuple[list[str], list | None]:
        from vllm import SamplingParams

        from davir.models.vlm.epc import entity_prompts

        prompts = entity_prompts(self.config.epc, entities if self.uses_entities else None, batch_size=len(inputs))
        requests = []
        for (before, after), prompt in zip(inputs, prompts):
            messages = [
                {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": prompt}]}
            ]
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            requests.append({"prompt": text, "multi_modal_data": {"image": [before, after]}})
        settings = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=[self.end_token_id])
        outputs = self.llm.generate(requests, settings, use_tqdm=False)
        return [output.outputs[0].text.strip() for output in outputs], None
