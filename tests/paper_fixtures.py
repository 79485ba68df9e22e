"""Tiny stand-ins of the paper path's real weights, of the same classes and on disk as a user has them.

* ``write_tiny_instructblip``: an InstructBLIP folder written by ``save_pretrained``, with a LLaMA
  tokenizer (sentencepiece-style BPE: metaspace, byte fallback, BOS, no pad token) and a BERT WordPiece
  Q-Former tokenizer, both trained offline on the given texts with ``tokenizers``, and — like the real
  ``instructblip-vicuna-7b`` folder — ``truncation_side="left"``.
* ``build_tiny_sam`` / ``write_tiny_sam``: segment-anything's own classes at toy size, a ``.pth`` state dict.
* ``write_tiny_clip``: an open_clip CLIP of a tiny registered config, a state-dict file + its JSON config.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import torch

TINY_SAM_TYPE = "tiny_test"
TINY_CLIP_NAME = "davir-test-tiny-clip"
TINY_CLIP = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def llama_tokenizer(texts: list[str], vocab_size: int = 400):
    """A LlamaTokenizerFast on a BPE trained on ``texts`` the way LLaMA's sentencepiece model is built."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    core.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    core.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]  # ids 0, 1, 2 as in LLaMA
    trainer = trainers.BpeTrainer(
        vocab_size=len(specials) + vocab_size,
        special_tokens=specials,
        initial_alphabet=list("▁abcdefghijklmnopqrstuvwxyz.,:"),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer)
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", core.token_to_id("<s>"))]
    )
    return LlamaTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        add_bos_token=True,
        add_eos_token=False,
        truncation_side="left",
        padding_side="right",
    )


def bert_tokenizer(texts: list[str], vocab_size: int = 300):
    """A BertTokenizerFast on a WordPiece vocabulary trained on ``texts`` (uncased, as bert-base-uncased)."""
    from tokenizers.implementations import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(
        texts, vocab_size=vocab_size, show_progress=False, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    )
    return BertTokenizerFast(
        tokenizer_object=wordpiece._tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        truncation_side="left",
    )


def write_tiny_instructblip(folder: Path, texts: list[str], *, seed: int = 0, **sizes) -> Path:
    """``InstructBlipForConditionalGeneration`` + ``InstructBlipProcessor`` of toy size, saved to ``folder``."""
    from transformers import InstructBlipForConditionalGeneration, InstructBlipProcessor

    from davir.models.families.instructblip import clip_image_processor
    from davir.models.presets import tiny_config

    folder = Path(folder)
    llama, bert = llama_tokenizer(texts), bert_tokenizer(texts)
    num_query_tokens = sizes.pop("num_query_tokens", 4)
    processor = InstructBlipProcessor(
        image_processor=clip_image_processor(64),
        tokenizer=llama,
        qformer_tokenizer=bert,
        num_query_tokens=num_query_tokens,
    )
    llama = processor.tokenizer  # now with the processor's "<image>" token
    config = tiny_config(
        vocab_size=len(llama),
        pad_token_id=llama.unk_token_id,
        bos_token_id=llama.bos_token_id,
        eos_token_id=llama.eos_token_id,
        num_query_tokens=num_query_tokens,
        **{
            "vision_layers": 1,
            "qformer_layers": 1,
            "text_layers": 1,
            "vision_hidden": 64,
            "vision_mlp": 128,
            "qformer_hidden": 64,
            "qformer_mlp": 128,
            "text_hidden": 64,
            "text_mlp": 128,
            **sizes,
        },
    )
    config.qformer_config.vocab_size = len(bert)
    config.qformer_config.pad_token_id = bert.pad_token_id
    config.image_token_id = llama.convert_tokens_to_ids("<image>")
    torch.manual_seed(seed)
    model = InstructBlipForConditionalGeneration(config)
    with torch.no_grad():
        model.query_tokens.normal_(std=0.02)
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    return folder


def build_tiny_sam(checkpoint=None):
    """segment_anything.build_sam._build_sam with tiny sizes (img 256, one block, width 32)."""
    from segment_anything.modeling import ImageEncoderViT, MaskDecoder, PromptEncoder, Sam, TwoWayTransformer

    embed, image_size, patch = 32, 256, 16
    sam = Sam(
        image_encoder=ImageEncoderViT(
            depth=1,
            embed_dim=32,
            img_size=image_size,
            mlp_ratio=2,
            num_heads=2,
            patch_size=patch,
            norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
            qkv_bias=True,
            use_rel_pos=True,
            global_attn_indexes=[0],
            window_size=4,
            out_chans=embed,
        ),
        prompt_encoder=PromptEncoder(
            embed_dim=embed,
            image_embedding_size=(image_size // patch,) * 2,
            input_image_size=(image_size, image_size),
            mask_in_chans=4,
        ),
        mask_decoder=MaskDecoder(
            num_multimask_outputs=3,
            transformer=TwoWayTransformer(depth=1, embedding_dim=embed, mlp_dim=64, num_heads=2),
            transformer_dim=embed,
            iou_head_depth=2,
            iou_head_hidden_dim=16,
        ),
        pixel_mean=[123.675, 116.28, 103.53],
        pixel_std=[58.395, 57.12, 57.375],
    )
    if checkpoint is not None:
        sam.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
    return sam.eval()


def write_tiny_sam(path: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    torch.save(build_tiny_sam().state_dict(), path)
    return path


def write_tiny_clip(folder: Path, seed: int = 0) -> tuple[str, Path, Path]:
    """(model name, state-dict file, JSON config) of a tiny open_clip CLIP, registered with open_clip."""
    import open_clip

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / f"{TINY_CLIP_NAME}.json"
    config.write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(config)
    torch.manual_seed(seed)
    checkpoint = folder / "tiny_clip.pt"
    torch.save(open_clip.create_model(TINY_CLIP_NAME).state_dict(), checkpoint)
    return TINY_CLIP_NAME, checkpoint, config
