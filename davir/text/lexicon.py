"""Lexicons: a word -> {tag: weight} map of its possible open-class parts of speech (WordNet, or fitted on captions).

The WordNet lexicon is shipped with the package, so every machine reads captions the same way (no OS package)."""

from __future__ import annotations

import gzip
import hashlib
import os
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from davir.errors import DataError
from davir.text.words import (
    ADJ,
    ADVERB,
    AUX,
    CAPITAL,
    DET,
    NOUN,
    PREP,
    PRON,
    PUNCT,
    VERB,
    closed_tag,
    is_word,
    tokenize,
)

# The lexicon every machine uses: the part of WordNet 3.0 the chunker reads (lemmas, morphy exceptions, SemCor
# counts), shipped with the package (davir/text/data/README.md; regenerate with `python -m davir.text.build_lexicon`).
DATA_DIR = Path(__file__).resolve().parent / "data"
SHIPPED_FILE = DATA_DIR / "wordnet-3.0-lexicon.txt.gz"
SHIPPED_NAME = "wordnet-3.0"
# sha256 of the file's text (its gzip bytes may differ with zlib's version; its text may not).
SHIPPED_SHA256 = "3f16f03abeed4755157f041cec22cf8f14ec44581b2b678e7ab22532b3cdf4a7"
# Research only: build the lexicon from another WordNet dict folder; its sha256 goes into every record instead.
OVERRIDE_ENV = "DAVIR_WORDNET_DIR"
FORMAT_LINE = "# davir lexicon 1: WordNet 3.0 lemmas, morphy exceptions and SemCor counts (see WORDNET_LICENSE)"
POS = ("n", "v", "a", "r")


class WordNetLexicon:
    """Parts of speech and noun lemmas from WordNet 3.0: the shipped word lists (`shipped_lexicon`), or a WordNet
    dict folder (`from_folder`, what the shipped file is made from)."""

    # WordNet's morphy detachment rules (wn `morph.c`).
    _RULES = {
        "n": (
            ("s", ""),
            ("ses", "s"),
            ("xes", "x"),
            ("zes", "z"),
            ("ches", "ch"),
            ("shes", "sh"),
            ("men", "man"),
            ("ies", "y"),
        ),
        "v": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")),
        "a": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
        "r": (),
    }
    _FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
    _TAGS = {"n": NOUN, "a": ADJ, "v": VERB, "r": ADVERB}

    def __init__(
        self,
        index: dict[str, frozenset[str]],
        exceptions: dict[str, dict[str, tuple[str, ...]]],
        counts: Counter[tuple[str, str]],
        *,
        source: str = "shipped",
    ):
        self.index, self.exceptions, self.counts = index, exceptions, counts
        self.source = source
        self.text = canonical_text(index, exceptions, counts)
        self.sha256 = hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def describe(self) -> dict:
        """What records carry: the lexicon's name, the sha256 of its content, and where it came from."""
        shipped = self.sha256 == SHIPPED_SHA256
        return {
            "name": SHIPPED_NAME if shipped else "wordnet-custom",
            "sha256": self.sha256,
            "source": self.source,
            "shipped": shipped,
        }

    @classmethod
    def from_folder(cls, folder: str | Path) -> WordNetLexicon:
        """Read `index.*`, `*.exc` and `cntlist.rev` of a WordNet 3.0 dict folder (Debian's /usr/share/wordnet)."""
        folder = Path(folder)
        index: dict[str, frozenset[str]] = {}
        exceptions: dict[str, dict[str, tuple[str, ...]]] = {}
        for pos, name in cls._FILES.items():
            path = folder / f"index.{name}"
            if not path.is_file():
                raise DataError(
                    f"WordNet index file is missing: {path} (a WordNet 3.0 dict folder holds "
                    "index.noun, index.verb, index.adj, index.adv)"
                )
            with open(path, encoding="utf-8", errors="replace") as handle:
                # Data lines start with the lemma; the license header lines start with spaces.
                index[pos] = frozenset(line.split(" ", 1)[0] for line in handle if not line.startswith(" "))
            found: dict[str, tuple[str, ...]] = {}
            exc_path = folder / f"{name}.exc"
            if exc_path.is_file():
                with open(exc_path, encoding="utf-8", errors="replace") as handle:
                    for line in handle:
                        parts = line.split()
                        if len(parts) >= 2:
                            found[parts[0]] = tuple(parts[1:])
            exceptions[pos] = found
        # SemCor tag counts per (lemma, pos): how often each reading occurs in running text.
        counts: Counter[tuple[str, str]] = Counter()
        count_path = folder / "cntlist.rev"
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
                        counts[(lemma, pos)] += int(parts[2])
        return cls(index, exceptions, counts, source=str(folder))

    @classmethod
    def from_text(cls, text: str, *, source: str) -> WordNetLexicon:
        """Parse `canonical_text`'s format (the shipped file)."""
        lines = text.split("\n")
        if not lines or lines[0] != FORMAT_LINE:
            raise DataError(f"{source}: not a davir lexicon file (its first line is not {FORMAT_LINE!r})")
        index: dict[str, set[str]] = {pos: set() for pos in POS}
        exceptions: dict[str, dict[str, tuple[str, ...]]] = {pos: {} for pos in POS}
        counts: Counter[tuple[str, str]] = Counter()
        section, pos = None, None
        for line in lines[1:]:
            if not line:
                continue
            parts = line.split(" ")
            if parts[0] == "##" and len(parts) == 3 and parts[1] in ("index", "exc") and parts[2] in POS:
                section, pos = parts[1:]
            elif section == "index":
                index[pos].add(parts[0])
                if len(parts) > 1:
                    counts[(parts[0], pos)] = int(parts[1])
            elif section == "exc":
                exceptions[pos][parts[0]] = tuple(parts[1:])
            else:
                raise DataError(f"{source}: a lexicon line outside a section: {line[:60]!r}")
        return cls({pos: frozenset(words) for pos, words in index.items()}, exceptions, counts, source=source)

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


def canonical_text(
    index: dict[str, frozenset[str]],
    exceptions: dict[str, dict[str, tuple[str, ...]]],
    counts: Counter[tuple[str, str]],
) -> str:
    """The lexicon as text, one way only: what the chunker can reach of it, sorted; its sha256 names the lexicon.

    A count or an exception base that names no lemma of the index can never be looked up (`lemmas` keeps only
    index members), so it is left out: the text changes only when the chunker's answers can.
    """
    lines = [FORMAT_LINE]
    for pos in POS:
        lines.append(f"## index {pos}")
        for lemma in sorted(index[pos]):
            count = counts.get((lemma, pos), 0)
            lines.append(f"{lemma} {count}" if count else lemma)
        lines.append(f"## exc {pos}")
        for word in sorted(exceptions[pos]):
            bases = [base for base in exceptions[pos][word] if base in index[pos]]
            if bases:
                lines.append(" ".join([word, *bases]))
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=4)
def load_wordnet(folder: str) -> WordNetLexicon:
    return WordNetLexicon.from_folder(folder)


@lru_cache(maxsize=1)
def shipped_lexicon() -> WordNetLexicon:
    """The lexicon shipped with davir, checked against its recorded sha256 (a damaged install is refused)."""
    try:
        text = gzip.decompress(SHIPPED_FILE.read_bytes()).decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise DataError(f"the shipped lexicon {SHIPPED_FILE} cannot be read ({error}); reinstall davir") from error
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != SHIPPED_SHA256:
        raise DataError(
            f"the shipped lexicon {SHIPPED_FILE} has sha256 {digest}, not the {SHIPPED_SHA256} this davir "
            "was made with; reinstall davir (or regenerate it: python -m davir.text.build_lexicon)"
        )
    return WordNetLexicon.from_text(text, source="shipped")


def wordnet_override() -> Path | None:
    """The WordNet folder of $DAVIR_WORDNET_DIR (research), or None: the shipped lexicon."""
    value = os.environ.get(OVERRIDE_ENV, "").strip()
    return Path(value) if value else None


def current_lexicon() -> WordNetLexicon:
    """The shipped lexicon, or the one $DAVIR_WORDNET_DIR names (its own sha256 is then recorded)."""
    folder = wordnet_override()
    if folder is None:
        return shipped_lexicon()
    try:
        return load_wordnet(str(folder))
    except DataError as error:
        raise DataError(f"{OVERRIDE_ENV}={folder}: {error}; unset it to use the lexicon shipped with davir") from error


def lexicon_record(*, strict: bool = True) -> dict:
    """The current lexicon's record (name, sha256, source, shipped) for metrics.json, caches and run records;
    ``strict=False`` records an unreadable one as {"error": …} (a run that reads no caption need not stop)."""
    try:
        return current_lexicon().describe()
    except DataError as error:
        if strict:
            raise
        return {"error": str(error)}
