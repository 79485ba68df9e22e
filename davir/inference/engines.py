"""The two kinds of trained model behind `ChangeCaptioner`: what each makes of a prepared pair, and one batched
generate. Only `ChangeCaptioner` calls them; `load_engine` opens either from a run or model folder.

    engine = load_engine(RunPaths.of("runs/demo"), device="cpu")   # DAVIR or a lightweight run

An engine answers `inputs(pair, before, after, entities)` (the CPU stage: the model's input tensors, and a
CHEER model's entity ids; a DataError is that pair's error) and `generate(inputs, entities, …)` (captions and,
for DAVIR on request, attention maps as arrays).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image

from davir.data.records import ChangePair
from davir.errors import DataError
from davir.inference.sources import CachedFeatures, FeatureSource, OnlineFeatures
from davir.runs.paths import RunPaths


class DavirEngine:
    """DAVIR: the saved model of its family (InstructBLIP or a chat VLM) + LoRA; entities (Eq. 10 prompts) when it
    was trained with EPC."""

    kind = "davir"
    needs_images = True

    def __init__(self, model, *, static_decode: bool = False):
        self.model = model
        self.uses_entities = bool(model.config.epc.use_entities)
        self.num_entities = model.config.epc.num_entities
        # static_decode: HF's static KV cache, compiled with CUDA graphs on a GPU. Every call gets one shape (rows
        # padded to the largest batch seen, the input to a multiple of STATIC_LENGTH_MULTIPLE) so the decode step
        # compiles once or a few times, not per batch.
        self.static_decode = static_decode
        self._static_settings = static_decode_settings(model.device) if static_decode else {}
        self._rows = 0

    @classmethod
    def load(
        cls,
        run: RunPaths,
        device,
        *,
        pretrained: str | Path | None = None,
        pretrained_flag: str | None = "--pretrained",
        merge_lora: bool = True,
        static_decode: bool = False,
    ) -> DavirEngine:
        """The run's model on `device`; its base InstructBLIP folder is `pretrained`, else the one it recorded,
        found from any folder (`RunPaths.resolve`: found nowhere, a DataError naming `pretrained_flag`). With
        `merge_lora` the LoRA deltas are folded into the base weights in memory (faster captioning)."""
        from davir.models.vlm.build import load_davir_model
        from davir.models.vlm.checkpoint import read_davir_config
        from davir.models.vlm.lora import merge_lora_for_inference

        if run.exported:  # davir-export's folder: an adapter over its base (`pretrained`), or merged weights
            from davir.export.loading import load_exported_model

            model = load_exported_model(run.model_dir, device=device, base_model=pretrained)
        else:
            recorded = read_davir_config(run.model_dir).pretrained
            base = pretrained or run.resolve(
                recorded, what="pretrained InstructBLIP folder (model.pretrained)", flag=pretrained_flag
            )
            model = load_davir_model(run.model_dir, device=device, pretrained=base)
        if merge_lora:
            merge_lora_for_inference(model)
        return cls(model.eval(), static_decode=static_decode)

    def inputs(self, pair: ChangePair, before: Image.Image, after: Image.Image, entities: list[str]) -> torch.Tensor:
        return self.model.image_processor([before, after])

    def generate(
        self,
        inputs: list[torch.Tensor],
        entities: list[list[str]],
        *,
        num_beams: int,
        max_new_tokens: int,
        attention: bool,
    ) -> tuple[list[str], list | None]:
        count, settings = len(inputs), {}
        if self.static_decode:
            self._rows = max(self._rows, count)
            inputs = [*inputs, *[inputs[-1]] * (self._rows - count)]  # the last batch as large as the others
            entities = [*entities, *[entities[-1]] * (self._rows - count)]
            settings = self._static_settings
        pixels = torch.stack(inputs).to(self.model.device)
        prompts = self.model.build_prompts(entities if self.uses_entities else None, batch_size=len(inputs))
        out = self.model.generate(
            pixels[:, 0],
            pixels[:, 1],
            prompts,
            max_new_tokens=max_new_tokens,
            num_beams=num_beams,
            return_attention=attention,
            **settings,
        )
        if not attention:
            return out[:count], None
        captions, before, after = out
        maps = [(before[i].float().cpu().numpy(), after[i].float().cpu().numpy()) for i in range(count)]
        return captions[:count], maps


STATIC_LENGTH_MULTIPLE = 16


def static_decode_settings(device: torch.device) -> dict:
    """``generate`` settings of the static-cache path: a fixed-size KV cache, on a CUDA GPU its decode step
    compiled with CUDA graphs (bench/generate.py: InstructBLIP-7B at batch 64, merged LoRA, 89 → 127 pairs/s on an
    H200); transformers compiles nothing on a CPU, where the static cache alone runs."""
    settings = {"cache_implementation": "static", "pad_length_to": STATIC_LENGTH_MULTIPLE}
    if torch.device(device).type == "cuda":
        from transformers import CompileConfig

        settings["compile_config"] = CompileConfig(fullgraph=False, dynamic=False, mode="reduce-overhead")
    return settings


class LightweightEngine:
    """Subtraction / SCORER / DIRL / RDD / CHEER on ResNet-101 layer3 features (a `FeatureSource`)."""

    kind = "lightweight"

    def __init__(self, bundle, features: FeatureSource):
        self.bundle, self.features = bundle, features
        config = bundle.model.config  # what the method declares (CHEER: entities), never its name
        self.uses_entities = bool(config.uses_entities)
        self.num_entities = config.entities_per_pair if self.uses_entities else 0

    @classmethod
    def load(
        cls,
        run: RunPaths,
        device,
        *,
        features=None,
        backbone_weights: str | Path | None = None,
        read_files: bool = False,
    ) -> LightweightEngine:
        """The run's model on `device`. `features`: a FeatureCache of the pairs to caption (checked to hold the
        backbone the model was trained on); None computes them (`OnlineFeatures`, with `backbone_weights` or the
        backbone the model recorded, and `read_files` as documented there)."""
        from davir.inference.lightweight import load_lightweight

        bundle = load_lightweight(run.model_dir, device=device)
        trained_with = (bundle.info.get("features") or {}).get("weights")
        if features is not None:
            source = CachedFeatures(features, trained_with=trained_with)
        else:
            source = OnlineFeatures(
                backbone_weights, trained_with=trained_with, device=bundle.device, read_files=read_files
            )
        return cls(bundle, source)

    @property
    def needs_images(self) -> bool:
        return self.features.needs_images

    @property
    def max_len(self) -> int:
        """The most tokens the model's decoder writes."""
        return self.bundle.model.config.max_len

    def check_vocabulary(self, phrases: Sequence[str], where: str) -> None:
        """Every phrase an entity source can give is one of this CHEER model's (else no pair could be captioned)."""
        unknown = [phrase for phrase in phrases if phrase not in self.bundle.entity_index]
        if unknown:
            raise DataError(f"{where} holds entities outside this CHEER model's vocabulary: {unknown[:5]}")

    def entity_ids(self, pair_id: str, phrases: list[str]) -> list[int]:
        """CHEER's entity ids of one pair's phrases: its k entities, each of the model's vocabulary."""
        k = self.num_entities
        unknown = [phrase for phrase in phrases if phrase not in self.bundle.entity_index]
        if len(phrases) < k or unknown:
            raise DataError(
                f"pair {pair_id!r}: needs {k} entities of the model's vocabulary, got {phrases} (unknown: {unknown})"
            )
        return [self.bundle.entity_index[phrase] for phrase in phrases]

    def inputs(
        self, pair: ChangePair, before: Image.Image | None, after: Image.Image | None, entities: list[str]
    ) -> tuple:
        ids = self.entity_ids(pair.pair_id, entities) if self.uses_entities else None
        return self.features.inputs(pair, before, after), ids

    @torch.no_grad()
    def generate(
        self, inputs: list[tuple], entities: list[list[str]], *, num_beams: int, max_new_tokens: int, attention: bool
    ) -> tuple[list[str], None]:
        bundle, device = self.bundle, self.bundle.device
        before, after = self.features.batch([features for features, _ in inputs], device)
        entity_ids = None
        if self.uses_entities:
            entity_ids = torch.tensor([ids for _, ids in inputs], dtype=torch.long, device=device)
        ids = bundle.model.generate(
            before, after, max_len=min(max_new_tokens, self.max_len), beam_size=num_beams, entities=entity_ids
        )
        return [bundle.vocab.decode(row) for row in ids], None


def load_engine(
    run: RunPaths,
    device=None,
    *,
    pretrained: str | Path | None = None,
    pretrained_flag: str | None = "--pretrained",
    backbone_weights: str | Path | None = None,
    features=None,
    read_files: bool = False,
    merge_lora: bool = True,
    static_decode: bool = False,
) -> DavirEngine | LightweightEngine:
    """The engine of a run or model folder, DAVIR or lightweight (see `DavirEngine.load`, `LightweightEngine.load`);
    `device` None: CUDA when there is one."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if run.lightweight:
        return LightweightEngine.load(
            run, device, features=features, backbone_weights=backbone_weights, read_files=read_files
        )
    return DavirEngine.load(
        run,
        device,
        pretrained=pretrained,
        pretrained_flag=pretrained_flag,
        merge_lora=merge_lora,
        static_decode=static_decode,
    )
