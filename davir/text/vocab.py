"""Word vocabulary and tokeniser of the SCORER/DIRL reference code (docs/methods/README.md).

    vocab = Vocabulary.build(train_captions)            # <NULL>=0 <UNK>=1 <START>=2 <END>=3, then sorted words
    ids = vocab.encode("the red cube is gone.")         # [2, ..., 3]
    vocab.save("vocab.json"); Vocabulary.load("vocab.json")

The tokenisation and its one departure from the reference: docs/metrics.md, "The word vocabulary".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from davir.errors import DataError
from davir.io import read_json, write_json_atomic

NULL, UNK, START, END = "<NULL>", "<UNK>", "<START>", "<END>"
SPECIAL_TOKENS = {NULL: 0, UNK: 1, START: 2, END: 3}
PAD_ID, UNK_ID, START_ID, END_ID = 0, 1, 2, 3
# Caption targets are padded with this value; the caption loss ignores it.
IGNORE_INDEX = -1

PUNCT_TO_KEEP = (";", ",")
PUNCT_TO_REMOVE = ("?", ".")


def tokenize(sentence: str) -> list[str]:
    """Split one caption into word tokens the way the reference preprocessing does (no START/END)."""
    for mark in PUNCT_TO_KEEP:
        sentence = sentence.replace(mark, f" {mark}")
    for mark in PUNCT_TO_REMOVE:
        sentence = sentence.replace(mark, "")
    return [token for token in sentence.split(" ") if token]


class Vocabulary:
    """Word ↔ id table with the four special tokens at ids 0-3 and the other words sorted after them."""

    def __init__(self, word_to_id: dict[str, int]):
        for token, index in SPECIAL_TOKENS.items():
            if word_to_id.get(token) != index:
                raise DataError(f"vocabulary must map {token} to {index}, got {word_to_id.get(token)!r}")
        ids = sorted(word_to_id.values())
        if ids != list(range(len(ids))):
            raise DataError(f"vocabulary ids must be 0..{len(ids) - 1} without gaps or repeats")
        self.word_to_id = dict(word_to_id)
        self.id_to_word = {index: word for word, index in word_to_id.items()}

    @classmethod
    def build(cls, sentences: Iterable[str], min_count: int = 1) -> Vocabulary:
        """Vocabulary of every token seen at least `min_count` times, ids in sorted token order (from 4)."""
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        counts = Counter(token for sentence in sentences for token in tokenize(sentence))
        word_to_id = dict(SPECIAL_TOKENS)
        for token in sorted(counts):
            if counts[token] >= min_count and token not in word_to_id:
                word_to_id[token] = len(word_to_id)
        return cls(word_to_id)

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        """Load a ``{"word": id}`` JSON file (ours or the reference code's `transformer_vocab.json`)."""
        table = read_json(Path(path))
        if not isinstance(table, dict) or not all(
            isinstance(word, str) and isinstance(index, int) and not isinstance(index, bool)
            for word, index in table.items()
        ):
            raise DataError(f"{path}: expected a JSON object mapping words to integer ids")
        try:
            return cls(table)
        except DataError as error:
            raise DataError(f"{path}: {error}") from error

    def save(self, path: str | Path) -> None:
        write_json_atomic(Path(path), self.word_to_id, indent=None)

    def __len__(self) -> int:
        return len(self.word_to_id)

    def __contains__(self, word: str) -> bool:
        return word in self.word_to_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.word_to_id == other.word_to_id

    def encode(
        self, sentence: str, *, add_start: bool = True, add_end: bool = True, allow_unk: bool = True
    ) -> list[int]:
        """Token ids of one sentence; unknown words become <UNK> (or a DataError with `allow_unk=False`)."""
        ids = [START_ID] if add_start else []
        for token in tokenize(sentence):
            index = self.word_to_id.get(token)
            if index is None:
                if not allow_unk:
                    raise DataError(f"word {token!r} of caption {sentence!r} is not in the vocabulary")
                index = UNK_ID
            ids.append(index)
        if add_end:
            ids.append(END_ID)
        return ids

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Words of a generated or encoded sequence: <START> skipped, stops at <END> or <NULL>."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        words = []
        for index in ids:
            index = int(index)
            if index == START_ID:
                continue
            if index in (END_ID, PAD_ID):
                break
            words.append(self.id_to_word.get(index, UNK))
        return " ".join(words)

    def caption_tensors(self, sentences: Sequence[str], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forcing inputs and targets of a batch of captions, as the reference loader builds them.

        `captions_in` (B, max_len) = ``<START> w1 … wm <END>`` padded with <NULL>=0; `captions_target`
        (B, max_len) = the same shifted left (``w1 … wm <END>``), padded with -1. A caption longer than
        `max_len` tokens (with START and END) is a DataError rather than a silent truncation.
        """
        captions_in = torch.full((len(sentences), max_len), PAD_ID, dtype=torch.long)
        captions_target = torch.full((len(sentences), max_len), IGNORE_INDEX, dtype=torch.long)
        for row, sentence in enumerate(sentences):
            ids = self.encode(sentence)
            if len(ids) > max_len:
                raise DataError(
                    f"caption {sentence!r} has {len(ids)} tokens with <START>/<END>, more than max_len={max_len}"
                )
            captions_in[row, : len(ids)] = torch.tensor(ids)
            captions_target[row, : len(ids) - 1] = torch.tensor(ids[1:])
        return captions_in, captions_target
