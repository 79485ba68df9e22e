"""Offline word-level tokenizer for the random-weight presets (``tiny``, ``vicuna7b`` from code).

No LLaMA/BERT tokenizer can be downloaded here, so the presets that are built from code use a
word-level vocabulary learned from the training captions (and the prompt). It is a regular
``transformers.PreTrainedTokenizerFast`` (``save_pretrained``/``from_pretrained`` work), so the model
code treats it exactly like the real InstructBLIP tokenizers:

* normaliser: lower-case; pre-tokeniser: split on whitespace, then isolate each punctuation mark;
* ``tokenizer(text)`` prepends ``<s>`` (like the LLaMA tokenizer); ``add_special_tokens=False`` does not;
* decoding joins words with spaces and removes the space before punctuation.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
from tokenizers.models import WordLevel
from tokenizers.trainers import WordLevelTrainer
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
# Fixed ids 0..3 so the preset configs can name them without looking at the vocabulary.
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, EOS_TOKEN)


def build_word_tokenizer(texts: Iterable[str], *, min_frequency: int = 1) -> PreTrainedTokenizerFast:
    """Learn a word-level vocabulary from ``texts`` and wrap it as a ``PreTrainedTokenizerFast``.

    ``texts`` should hold every training caption and the prompt text(s); words seen fewer than
    ``min_frequency`` times map to ``<unk>``. Special tokens get ids pad=0, unk=1, bos=2, eos=3.
    """
    texts = [t for t in texts if t and t.strip()]
    if not texts:
        raise ValueError("build_word_tokenizer needs at least one non-empty caption or prompt to learn a vocabulary")
    core = Tokenizer(WordLevel(unk_token=UNK_TOKEN))
    core.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated")]
    )
    trainer = WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS), min_frequency=min_frequency, show_progress=False)
    core.train_from_iterator(texts, trainer=trainer)
    bos_id = core.token_to_id(BOS_TOKEN)
    # Like LLaMA: a BOS in front of every sequence encoded with add_special_tokens=True.
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        clean_up_tokenization_spaces=True,
        padding_side="right",
    )


def load_word_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer written by ``save_pretrained`` (local files only)."""
    return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
