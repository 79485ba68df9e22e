"""Lexicons: a word -> {tag: weight} map of its possible open-class parts of speech (WordNet, or fitted on captions)."""

from __future__ import annotations

import os
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from davir.errors import DataError
from davir.text.words import (ADJ, ADVERB, AUX, CAPITAL, DET, NOUN, PREP, PRON, PUNCT, VERB, closed_tag, is_word,
                              tokenize)

DEFAULT_WORDNET_DIR = "/usr/share/wordnet"


class WordNetLexicon:
    """Parts of speech and noun lemmas from WordNet 3.0's database files (Debian `wordnet-base`)."""

    # WordNet's morphy detachment rules (wn `morph.c`).
    _RULES = {
        "n": (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"),
              ("men", "man"), ("ies", "y")),
        "v": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"),
              ("ing", "")),
        "a": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
        "r": (),
    }
    _FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
    _TAGS = {"n": NOUN, "a": ADJ, "v": VERB, "r": ADVERB}

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.index: dict[str, frozenset[str]] = {}
        self.exceptions: dict[str, dict[str, tuple[str, ...]]] = {}
        for pos, name in self._FILES.items():
            path = self.folder / f"index.{name}"
            if not path.is_file():
                raise DataError(f"WordNet index file is missing: {path} (install Debian's `wordnet-base`)")
            with open(path, encoding="utf-8", errors="replace") as handle:
                # Data lines start with the lemma; the license header lines start with spaces.
                self.index[pos] = frozenset(line.split(" ", 1)[0] for line in handle if not line.startswith(" "))
            exceptions: dict[str, tuple[str, ...]] = {}
            exc_path = self.folder / f"{name}.exc"
            if exc_path.is_file():
                with open(exc_path, encoding="utf-8", errors="replace") as handle:
                    for line in handle:
                        parts = line.split()
                        if len(parts) >= 2:
                            exceptions[parts[0]] = tuple(parts[1:])
            self.exceptions[pos] = exceptions
        # SemCor tag counts per (lemma, pos): how often each reading occurs in running text.
        self.counts: Counter[tuple[str, str]] = Counter()
        count_path = self.folder / "cntlist.rev"
        if count_path.is_file():
            ss_type = {"1": "n", "2": "v", "3": "a", "4": "r", "5": "a"}
            with open(count_path, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    parts = line.split()
                    if len(parts) != 3 or "%" not in parts[0]:
                        continue
                    lemma, rest = parts[0].split("%", 1)
                    pos = ss_type.get(rest[:1])
                    if pos is not None:
                        self.counts[(lemma, pos)] += int(parts[2])

    def lemmas(self, word: str, pos: str) -> list[str]:
        """WordNet's morphy: the base forms of `word` that exist in the `pos` index (surface form first)."""
        index = self.index[pos]
        found = [word] if word in index else []
        for base in self.exceptions[pos].get(word, ()):
            if base in index and base not in found:
                found.append(base)
        for suffix, replacement in self._RULES[pos]:
            if word.endswith(suffix) and len(word) > len(suffix):
                base = word[: len(word) - len(suffix)] + replacement
                if base in index and base not in found:
                    found.append(base)
        return found

    def candidates(self, word: str) -> dict[str, float]:
        """Possible tags of `word`, each weighted by 1 + the SemCor count of its best lemma."""
        options: dict[str, float] = {}
        for pos, tag in self._TAGS.items():
            lemmas = self.lemmas(word, pos)
            if lemmas:
                options[tag] = 1.0 + max(self.counts[(lemma, pos)] for lemma in lemmas)
        return options

    def is_base_verb(self, word: str) -> bool:
        """True for an uninflected verb form ("sign", not "signs"/"signed"/"signing")."""
        return word in self.index["v"] and not word.endswith(("s", "ed", "ing"))

    def noun_lemma(self, word: str) -> str:
        """The word itself if WordNet lists it ("glasses", "people"), else its most frequent base form
        ("crosses" → "cross", not the rarer "crosse")."""
        lemmas = self.lemmas(word, "n")
        if not lemmas:
            return _plural_to_singular(word)
        if lemmas[0] == word:
            return word
        return max(lemmas, key=lambda lemma: self.counts[(lemma, "n")])


class CorpusLexicon:
    """The no-data fallback: parts of speech fitted on a caption corpus with closed-class rules.

    A word is nominal when the corpus shows it right after a determiner, a preposition or another
    nominal word; verbal when it follows an auxiliary or a pronoun subject, or ends in -ed/-ing.
    """

    def __init__(self, captions: Iterable[str] = ()):
        self.nominal: Counter[str] = Counter()
        self.verbal: Counter[str] = Counter()
        for caption in captions:
            previous = PUNCT
            for word in tokenize(caption):
                if word == CAPITAL:
                    continue
                closed = closed_tag(word)
                if closed is not None:
                    previous = closed
                    continue
                if not is_word(word):
                    previous = PUNCT
                    continue
                if previous in (DET, PREP) or (previous == NOUN and not _has_verb_suffix(word)):
                    self.nominal[word] += 1
                    previous = NOUN
                elif previous in (AUX, PRON):
                    self.verbal[word] += 1
                    previous = VERB
                else:
                    previous = VERB if word in self.verbal else NOUN

    def candidates(self, word: str) -> dict[str, float]:
        options: dict[str, float] = {}
        nominal, verbal = self.nominal[word], self.verbal[word]
        if _has_verb_suffix(word):
            verbal += 1
        if word.endswith("ly") and len(word) > 4:
            return {ADVERB: 1.0}
        if nominal or not verbal:
            options[NOUN] = 1.0 + nominal
        if verbal:
            options[VERB] = 1.0 + verbal
        return options

    def is_base_verb(self, word: str) -> bool:
        return not word.endswith(("s", "ed", "ing"))

    def noun_lemma(self, word: str) -> str:
        return _plural_to_singular(word)


def _has_verb_suffix(word: str) -> bool:
    return word.endswith(("ed", "ing")) and len(word) > 4


def _plural_to_singular(word: str) -> str:
    """A small English plural rule for words no dictionary knows."""
    if len(word) <= 3 or word.endswith(("ss", "us", "is")):
        return word
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("xes", "ches", "shes", "zes", "sses")):
        return word[:-2]
    if word.endswith("s"):
        return word[:-1]
    return word


@lru_cache(maxsize=4)
def load_wordnet(folder: str) -> WordNetLexicon:
    return WordNetLexicon(folder)


def wordnet_dir() -> Path:
    return Path(os.environ.get("DAVIR_WORDNET_DIR", DEFAULT_WORDNET_DIR))


def wordnet_available(folder: str | Path | None = None) -> bool:
    folder = Path(folder) if folder is not None else wordnet_dir()
    return all((folder / f"index.{name}").is_file() for name in ("noun", "adj", "verb", "adv"))
