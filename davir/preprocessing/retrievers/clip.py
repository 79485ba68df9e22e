"""Eq. 9 with CLIP (open_clip, a local checkpoint only): cosine of region crops to prompted phrases."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from davir.errors import DataError
from davir.models.clip_loader import load_open_clip
from davir.preprocessing.components import option
from davir.preprocessing.retrievers.regions import PairRegions

DEFAULT_PROMPT = "a photo of {phrase}"


@dataclass(frozen=True)
class ClipSettings:
    """The CLIP retriever's settings; the weights file (`--clip-checkpoint`) and the device are given beside them."""

    clip_model: str = field(
        default="ViT-L-14-quickgelu",
        metadata=option(
            "--clip-model",
            "open_clip model name (OpenAI's CLIP weights were trained with QuickGELU; plain ViT-L-14 "
            "is the LAION/DataComp variant and silently degrades OpenAI embeddings)",
        ),
    )
    clip_prompt: str = field(default=DEFAULT_PROMPT, metadata=option("--clip-prompt"))
    # Not recorded (a cache names the architecture by clip_model): registers a custom architecture's config.
    clip_config: str | None = field(
        default=None,
        metadata=option(
            "--clip-config", "JSON model config to register (custom architectures)", type=str, compared=False
        ),
    )
    batch_size: int = field(
        default=32, metadata=option("--batch-size", "CLIP images/texts per forward pass", compared=False)
    )


def square_pad(image: np.ndarray) -> np.ndarray:
    """Pad a crop with black (the masked-out value) to a square, so CLIP's centre crop cuts nothing."""
    height, width = image.shape[:2]
    side = max(height, width)
    out = np.zeros((side, side, 3), np.uint8)
    top, left = (side - height) // 2, (side - width) // 2
    out[top : top + height, left : left + width] = image
    return out


class ClipRetriever:
    """Eq. 9 with open_clip: score(e) = max(cos(img(I^m_bef), txt(e)), cos(img(I^m_aft), txt(e)))."""

    name = "clip"

    def __init__(
        self,
        model_name: str = "ViT-L-14",
        checkpoint: str | Path | None = None,
        *,
        config: str | Path | None = None,
        device: str | None = None,
        prompt: str = DEFAULT_PROMPT,
        batch_size: int = 32,
    ):
        import torch

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model_name, self.checkpoint, self.prompt, self.batch_size = model_name, checkpoint, prompt, batch_size
        self.model, self.preprocess, self.tokenizer = load_open_clip(
            model_name, checkpoint, config=config, device=self.device
        )
        self.text_embeddings = None

    @classmethod
    def build(
        cls, settings: ClipSettings, *, checkpoint: str | Path | None, device: str | None = None, folder=None
    ) -> ClipRetriever:
        """The registry's builder (`folder` is not used: nothing is fitted)."""
        return cls(
            settings.clip_model,
            checkpoint,
            config=settings.clip_config,
            device=device,
            prompt=settings.clip_prompt,
            batch_size=settings.batch_size,
        )

    def embed_texts(self, phrases: Sequence[str]) -> np.ndarray:
        """L2-normalised text embeddings of the prompted phrases."""
        import torch

        chunks = []
        with torch.no_grad():
            for start in range(0, len(phrases), self.batch_size):
                texts = [self.prompt.format(phrase=p) for p in phrases[start : start + self.batch_size]]
                features = self.model.encode_text(self.tokenizer(texts).to(self.device)).float()
                chunks.append(torch.nn.functional.normalize(features, dim=-1).cpu().numpy())
        return np.concatenate(chunks) if chunks else np.zeros((0, 0), np.float32)

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """L2-normalised image embeddings of region crops (square-padded, then CLIP's own transform)."""
        import torch
        from PIL import Image

        chunks = []
        with torch.no_grad():
            for start in range(0, len(images), self.batch_size):
                batch = torch.stack(
                    [
                        self.preprocess(Image.fromarray(square_pad(image)))
                        for image in images[start : start + self.batch_size]
                    ]
                ).to(self.device)
                features = self.model.encode_image(batch).float()
                chunks.append(torch.nn.functional.normalize(features, dim=-1).cpu().numpy())
        return np.concatenate(chunks)

    def prepare(self, phrases: Sequence[str]) -> None:
        self.text_embeddings = self.embed_texts(list(phrases))

    def score(self, pairs: Sequence[PairRegions]) -> np.ndarray:
        if self.text_embeddings is None:
            raise DataError("call prepare(phrases) before score()")
        if not pairs:
            return np.zeros((0, len(self.text_embeddings)))
        images = [region.crop for pair in pairs for region in (pair.before, pair.after)]
        similarity = self.embed_images(images) @ self.text_embeddings.T
        return np.maximum(similarity[0::2], similarity[1::2]).astype(np.float64)

    def frame_scores(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """Image-level S (CHEER §4.8): cosine of each whole frame's global CLIP embedding to every entity.

        Frames are square-padded like region crops [D]: CLIP's own centre crop would cut the outer sixth
        of each side of a 3:2 frame (CLEVR's 480×320), where the changed object may be.
        """
        if self.text_embeddings is None:
            raise DataError("call prepare(phrases) before frame_scores()")
        if not len(images):
            return np.zeros((0, len(self.text_embeddings)))
        return (self.embed_images([np.asarray(image) for image in images]) @ self.text_embeddings.T).astype(np.float64)

    def describe(self) -> dict:
        return {
            "retriever": self.name,
            "model": self.model_name,
            "checkpoint": str(self.checkpoint),
            "prompt": self.prompt,
        }
