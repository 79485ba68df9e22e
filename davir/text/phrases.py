"""Noun-phrase chunking of change captions and the entity vocabulary built from training captions.

Used by DAVIR's entity prompt construction (methods.md §5.2(d), §5.8: "key noun phrases from the
ground-truth captions of the training set"), CHEER's subject entities (§4.8: the first noun phrase)
and RDD's attribute segments (§3.8: noun and verb segments of a caption).

Three interchangeable back-ends, chosen by `get_extractor(backend="auto")`:

* ``spacy``   — spaCy `en_core_web_sm` `noun_chunks` and the RDD verb Matcher, when both are installed
  (imported lazily; the workplace does not ship them).
* ``wordnet`` — the offline default: a rule chunker whose part-of-speech lexicon is WordNet 3.0 as
  Debian's `wordnet-base` package installs it (`/usr/share/wordnet`, or `$DAVIR_WORDNET_DIR`). Each
  open-class word gets its candidate parts of speech from `index.{noun,adj,verb,adv}` (via WordNet's
  own "morphy" lemmatiser) weighted by their SemCor tag counts (`cntlist.rev`); a left context rule
  (after a determiner or preposition a word is nominal, after an auxiliary it is predicative) picks one.
* ``rules``   — no external data at all: a word is nominal if the caption corpus shows it after a
  determiner, verbal if it carries a verb suffix or follows an auxiliary (fitted on the captions given).

Every back-end lower-cases, strips determiners and quantifiers (they are closed-class words and never
join a phrase), lemmatises the head noun to its singular ("cars" → "car"), and, for entity phrases,
drops phrases whose head is generic ("difference", "image", "picture", "change", "scene", positions).
A phrase is the *longest* run of adjectives/nouns ending in a noun, so CLEVR-style captions keep the
full object phrase ("the small red metal sphere changed to blue" → "small red metal sphere"). The
vocabulary (`build_vocabulary`) also leaves out one-word phrases that the captions mostly use as
modifiers ("changed to metal" → "metal"), since they name an attribute, not an entity.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from davir.data.records import DataError
from davir.io import read_json, write_json_atomic

BACKENDS = ("auto", "spacy", "wordnet", "rules")
DEFAULT_WORDNET_DIR = "/usr/share/wordnet"
SPACY_MODEL = "en_core_web_sm"

# --- closed-class words: they never belong to a noun phrase -----------------------------------------
DETERMINERS = frozenset("""
a an the this that these those some any each every all both no none another other others either neither
much many few fewer several more most less least such same various certain enough whole entire
different similar own my your his her its our their whose
one two three four five six seven eight nine ten eleven twelve dozen hundred thousand
first second third fourth fifth last next previous former latter single double couple
""".split())
PRONOUNS = frozenset("""
i me you he him she it we us they them myself yourself himself herself itself ourselves themselves
someone somebody something anyone anybody anything everyone everybody everything nobody nothing noone ones
there here who whom which what whatever whoever where when why how
""".split())
PREPOSITIONS = frozenset("""
about above across after against along alongside amid among around as at atop before behind below beneath
beside besides between beyond by despite down during except for from in inside into like near nearby
nearer of off on onto opposite out outside over past per round since than through throughout till to
toward towards under underneath unlike until up upon via with within without
""".split())
CONJUNCTIONS = frozenset("and or but nor so yet if because while whereas although though unless whether then".split())
AUXILIARIES = frozenset("""
am is are was were be been being has have had having do does did will would shall should can could may
might must isn't aren't wasn't weren't hasn't haven't hadn't don't doesn't didn't won't wouldn't can't
cannot couldn't shouldn't there's it's that's here's what's he's she's they're we're they've get gets
got getting theres thats whats heres isnt arent wasnt werent hasnt havent doesnt dont didnt cant wont
""".split())
ADVERBS = frozenset("""
not only longer anymore now still just also very too quite slightly already again even almost rather somewhat
currently previously originally totally completely partially mostly nearly ever never always often
sometimes instead initially finally really actually apparently probably maybe perhaps please etc ok
okay yes
""".split())
CLOSED_CLASS = DETERMINERS | PRONOUNS | PREPOSITIONS | CONJUNCTIONS | AUXILIARIES | ADVERBS

# Heads that name the picture, the change itself, or a position rather than a thing in the scene.
GENERIC_HEADS = frozenset("""
difference image picture photo photograph pic change scene frame shot view version edit effect
left right top bottom middle center centre side corner front back area part spot place position location way
time
""".split())

# Tags: closed classes, then the open classes N (noun), A (adjective), V (verb), R (adverb), and
# X for punctuation (a hard phrase boundary).
DET, PRON, PREP, CONJ, AUX, ADV_CLOSED, PUNCT = "DET", "PRON", "PREP", "CONJ", "AUX", "ADV", "X"
NOUN, ADJ, VERB, ADVERB = "N", "A", "V", "R"
_CLOSED_TAGS = ((DETERMINERS, DET), (PRONOUNS, PRON), (PREPOSITIONS, PREP), (CONJUNCTIONS, CONJ),
                (AUXILIARIES, AUX), (ADVERBS, ADV_CLOSED))
# After these a word that can be nominal is nominal ("the parked car", "at stop sign"); after a noun
# the word's own frequencies decide ("parking lot" vs "people standing").
_NOMINAL_CONTEXT = frozenset({DET, PREP, ADJ})
# A clause start: there an open-class word followed by a determiner or pronoun is an imperative verb
# ("crop the image", "make it larger"), the usual form of Image-Editing-Request instructions.
_CLAUSE_START = frozenset({PUNCT, CONJ})
_OBJECT_PRONOUNS = frozenset("it them him her me us everything something".split())

_TOKEN = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*|[^\sa-z0-9]")
CAPITAL = "\x00capital"


@dataclass(frozen=True)
class Token:
    """One word of a caption with its chosen tag and (for nouns) its singular lemma."""

    text: str
    tag: str
    lemma: str


# ---------------------------------------------------------------------------------------------------
# Lexicons: a word -> {tag: weight} map of its possible open-class parts of speech
# ---------------------------------------------------------------------------------------------------

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
                if not _is_word(word):
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


# ---------------------------------------------------------------------------------------------------
# Tokenising and tagging
# ---------------------------------------------------------------------------------------------------

def tokenize(caption: str) -> list[str]:
    """Lower-cased words (hyphens and apostrophes kept inside a word) and punctuation marks.

    In a mixed-case caption a capitalised word after the first is preceded by the marker CAPITAL:
    run-on instructions ("Change the background into solid white Increase the height") start each
    clause with a capital, and `tag_words` ends the phrase there when the word can be a verb.
    """
    mixed_case = caption != caption.upper()
    words: list[str] = []
    for match in _TOKEN.finditer(caption.lower()):
        original = caption[match.start():match.end()]
        if mixed_case and words and original[:1].isupper():
            words.append(CAPITAL)
        words.append(match.group())
    return words


def closed_tag(word: str) -> str | None:
    for words, tag in _CLOSED_TAGS:
        if word in words:
            return tag
    if word.isdigit():
        return DET  # numerals act as quantifiers ("2 cars")
    return None


def _is_word(word: str) -> bool:
    return word[:1].isalpha() and len(word) > 1


def _choose(options: dict[str, float], allowed: tuple[str, ...]) -> str | None:
    """The most frequent allowed tag (ties broken by the order of `allowed`)."""
    best, best_weight = None, 0.0
    for tag in allowed:
        weight = options.get(tag, 0.0)
        if weight > best_weight:
            best, best_weight = tag, weight
    return best


def tag_words(words: list[str], lexicon) -> list[Token]:
    """Tag each word with a closed-class tag or one open-class tag chosen from the left context."""
    tokens: list[Token] = []
    previous = PUNCT
    capital = False
    for position, word in enumerate(words):
        if word == CAPITAL:
            capital = True
            continue
        following = words[position + 1] if position + 1 < len(words) else ""
        starts_object = following in DETERMINERS or following in _OBJECT_PRONOUNS
        possessive = False
        if word.endswith("'s") and closed_tag(word) is None:
            word, possessive = word[:-2], True
        tag = closed_tag(word)
        if tag is None and not _is_word(word):
            tag = PUNCT
        if tag is None:
            options = lexicon.candidates(word)
            if not options and "-" in word:
                options = lexicon.candidates(word.rsplit("-", 1)[1])
            known = bool(options)
            if not known:
                options = {NOUN: 1.0}  # unknown words (names, typos) are most often nouns
            verb_first = options.get(VERB, 0.0) > max(options.get(NOUN, 0.0), options.get(ADJ, 0.0))
            if capital and previous != PUNCT and VERB in options and (starts_object or verb_first):
                tokens.append(Token(",", PUNCT, ","))  # a capitalised imperative starts a new clause
                previous = PUNCT
            if previous in _CLAUSE_START and starts_object and (VERB in options or not known):
                tag = VERB
            elif previous in _NOMINAL_CONTEXT:
                tag = _choose(options, (NOUN, ADJ)) or _choose(options, (VERB, ADVERB))
            elif previous == AUX:
                # "is parked", "is gone", "is white": a predicate, not the start of a phrase.
                tag = _choose(options, (VERB, ADJ)) or _choose(options, (NOUN, ADVERB))
            else:
                tag = _choose(options, (NOUN, ADJ, VERB, ADVERB))
                if (tag == VERB and previous == NOUN and tokens[-1].lemma == tokens[-1].text
                        and lexicon.is_base_verb(word) and 4 * options.get(NOUN, 0.0) >= options[VERB]):
                    # A singular noun followed by an uninflected verb form that is also a common noun
                    # is a compound ("stop sign"): a present-tense verb would agree ("the man signs").
                    tag = NOUN
        if possessive:
            tag = NOUN
        lemma = lexicon.noun_lemma(word) if tag == NOUN else word
        tokens.append(Token(word, tag, lemma))
        if possessive:
            tokens.append(Token("'s", DET, "'s"))  # "man's bag": the possessor ends a phrase
        previous = tokens[-1].tag
        capital = False
    return tokens


def chunk_tokens(tokens: list[Token]) -> list[list[Token]]:
    """Maximal adjective/noun runs, trimmed to end in a noun: the longest noun phrase."""
    chunks: list[list[Token]] = []
    current: list[Token] = []

    def close() -> None:
        while current and current[-1].tag != NOUN:
            current.pop()
        if current:
            chunks.append(list(current))
        current.clear()

    for token in tokens:
        if token.tag in (NOUN, ADJ):
            current.append(token)
        else:
            close()
    close()
    return chunks


def _phrase_text(chunk: list[Token]) -> str:
    """Modifiers as written, the head noun in its singular lemma."""
    return " ".join([token.text for token in chunk[:-1]] + [chunk[-1].lemma])


def _verb_segments(tokens: list[Token]) -> list[str]:
    """RDD's verb segments: runs of auxiliaries/adverbs/verbs that end in a verb ("has been moved")."""
    segments: list[str] = []
    current: list[Token] = []

    def close() -> None:
        while current and current[-1].tag != VERB:
            current.pop()
        if current:
            segments.append(" ".join(token.text for token in current))
        current.clear()

    for token in tokens:
        if token.tag in (AUX, ADV_CLOSED, ADVERB, VERB):
            current.append(token)
        else:
            close()
    close()
    return segments


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def is_generic(phrase: str) -> bool:
    return phrase.rsplit(" ", 1)[-1] in GENERIC_HEADS


# ---------------------------------------------------------------------------------------------------
# Extractors
# ---------------------------------------------------------------------------------------------------

class PhraseExtractor:
    """Noun phrases, entity phrases, subject phrase and noun/verb segments of a caption."""

    backend = "rules"

    def __init__(self, lexicon=None):
        self.lexicon = lexicon if lexicon is not None else CorpusLexicon()

    def tag(self, caption: str) -> list[Token]:
        return tag_words(tokenize(caption), self.lexicon)

    def noun_chunks(self, caption: str) -> list[str]:
        """Every noun phrase (determiners stripped, head singular), generic heads included, in order."""
        return _unique(_phrase_text(chunk) for chunk in chunk_tokens(self.tag(caption)))

    def phrases(self, caption: str) -> list[str]:
        """The entity phrases of a caption: noun phrases without generic heads, in order, deduplicated."""
        return [phrase for phrase in self.noun_chunks(caption) if not is_generic(phrase)]

    def attributes(self, caption: str) -> dict[str, list[str]]:
        """RDD §3.8 noun and verb segments of one caption (noun phrases with generic heads kept)."""
        tokens = self.tag(caption)
        return {"nouns": _unique(_phrase_text(chunk) for chunk in chunk_tokens(tokens)),
                "verbs": _unique(_verb_segments(tokens))}

    def subject(self, caption: str) -> str | None:
        """CHEER §4.8's subject entity: the first entity phrase (pronoun/expletive subjects never chunk)."""
        phrases = self.phrases(caption)
        return phrases[0] if phrases else None

    def describe(self) -> dict:
        return {"backend": self.backend}


class WordNetExtractor(PhraseExtractor):
    backend = "wordnet"

    def __init__(self, folder: str | Path | None = None):
        folder = Path(folder) if folder is not None else wordnet_dir()
        super().__init__(load_wordnet(str(folder)))
        self.folder = folder

    def describe(self) -> dict:
        return {"backend": self.backend, "wordnet_dir": str(self.folder)}


class SpacyExtractor(PhraseExtractor):
    """spaCy noun_chunks (and the RDD verb Matcher), with the same normalisation as the rule back-ends."""

    backend = "spacy"

    def __init__(self, model: str = SPACY_MODEL):
        try:
            import spacy
            from spacy.matcher import Matcher
        except ImportError as error:
            raise DataError("the spaCy back-end needs `pip install spacy` and its en_core_web_sm model") from error
        try:
            self.nlp = spacy.load(model)
        except OSError as error:
            raise DataError(f"spaCy model {model!r} is not installed (`python -m spacy download {model}`)") from error
        self.model = model
        self.matcher = Matcher(self.nlp.vocab)
        self.matcher.add("VERB_SEGMENT", [[{"POS": "VERB", "OP": "?"}, {"POS": "ADV", "OP": "*"},
                                           {"POS": "AUX", "OP": "*"}, {"POS": "VERB", "OP": "+"}]])
        super().__init__(CorpusLexicon())

    def _chunk_text(self, chunk) -> str | None:
        words = [t for t in chunk if t.lower_ not in CLOSED_CLASS and t.pos_ not in ("DET", "NUM", "PRON", "PUNCT")]
        if not words or words[-1].pos_ not in ("NOUN", "PROPN"):
            return None
        return " ".join([t.lower_ for t in words[:-1]] + [words[-1].lemma_.lower()])

    def noun_chunks(self, caption: str) -> list[str]:
        doc = self.nlp(caption.lower())
        return _unique(text for text in (self._chunk_text(chunk) for chunk in doc.noun_chunks) if text)

    def attributes(self, caption: str) -> dict[str, list[str]]:
        from spacy.util import filter_spans

        doc = self.nlp(caption.lower())
        spans = filter_spans([doc[start:end] for _, start, end in self.matcher(doc)])
        return {"nouns": self.noun_chunks(caption), "verbs": _unique(span.text for span in spans)}

    def subject(self, caption: str) -> str | None:
        """§4.8 default: the noun chunk of the first nominal subject; expletive/pronoun → first attr/dobj."""
        doc = self.nlp(caption.lower())
        chunks = [(chunk, self._chunk_text(chunk)) for chunk in doc.noun_chunks]
        chunks = [(chunk, text) for chunk, text in chunks if text and not is_generic(text)]
        for wanted in (("nsubj", "nsubjpass"), ("attr", "dobj")):
            for chunk, text in chunks:
                if chunk.root.dep_ in wanted:
                    return text
        return chunks[0][1] if chunks else None

    def describe(self) -> dict:
        return {"backend": self.backend, "model": self.model}


def spacy_available(model: str = SPACY_MODEL) -> bool:
    try:
        import spacy  # noqa: F401
        from spacy.util import is_package
    except ImportError:
        return False
    return bool(is_package(model))


def get_extractor(backend: str = "auto", *, corpus: Iterable[str] | None = None) -> PhraseExtractor:
    """The phrase extractor for a back-end name; "auto" takes spaCy, then WordNet, then corpus rules."""
    if backend not in BACKENDS:
        raise DataError(f"unknown phrase back-end {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "spacy" if spacy_available() else "wordnet" if wordnet_available() else "rules"
    if backend == "spacy":
        return SpacyExtractor()
    if backend == "wordnet":
        if not wordnet_available():
            raise DataError(f"WordNet is not installed in {wordnet_dir()} (Debian package `wordnet-base`, "
                            "or set DAVIR_WORDNET_DIR)")
        return WordNetExtractor()
    return PhraseExtractor(CorpusLexicon(corpus or ()))


@lru_cache(maxsize=8)
def _default_extractor(backend: str) -> PhraseExtractor:
    return get_extractor(backend)


def extract_phrases(caption: str, backend: str = "auto") -> list[str]:
    """Entity noun phrases of one caption ("person with umbrella is gone" → ["person", "umbrella"])."""
    return _default_extractor(backend).phrases(caption)


def extract_attributes(caption: str, backend: str = "auto") -> dict[str, list[str]]:
    """RDD §3.8 segments: {"nouns": noun phrases, "verbs": verb segments such as "has been moved"}."""
    return _default_extractor(backend).attributes(caption)


def subject_phrase(caption: str, backend: str = "auto") -> str | None:
    """CHEER §4.8 subject entity of a caption (the first entity phrase), or None if it names none."""
    return _default_extractor(backend).subject(caption)


# ---------------------------------------------------------------------------------------------------
# Entity vocabulary
# ---------------------------------------------------------------------------------------------------

@dataclass
class EntityVocabulary:
    """Entity phrases from training captions kept with frequency ≥ min_count, most frequent first."""

    phrases: list[str]
    counts: dict[str, int]
    min_count: int
    extractor: dict
    source: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.phrases)

    def index(self) -> dict[str, int]:
        return {phrase: position for position, phrase in enumerate(self.phrases)}

    def to_dict(self) -> dict:
        return {"phrases": self.phrases, "counts": self.counts, "min_count": self.min_count,
                "extractor": self.extractor, "source": self.source}

    def save(self, path: str | Path) -> None:
        write_json_atomic(Path(path), self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "EntityVocabulary":
        data = read_json(Path(path))
        if not isinstance(data, dict) or not isinstance(data.get("phrases"), list):
            raise DataError(f"{path}: not an entity vocabulary (expected an object with a 'phrases' list)")
        if not all(isinstance(p, str) and p for p in data["phrases"]):
            raise DataError(f"{path}: 'phrases' must be non-empty strings")
        return cls(phrases=list(data["phrases"]), counts={str(k): int(v) for k, v in data.get("counts", {}).items()},
                   min_count=int(data.get("min_count", 1)), extractor=dict(data.get("extractor", {})),
                   source=dict(data.get("source", {})))


def bare_attributes(counts: Counter[str]) -> set[str]:
    """One-word phrases whose word the corpus mostly uses as a modifier of other phrases.

    "the rubber sphere changed to metal" makes "metal" a noun phrase, but across the captions
    "metal" modifies far more phrases than it heads (here: at least twice as many): it names an
    attribute, not an entity.
    """
    heads: Counter[str] = Counter()
    modifiers: Counter[str] = Counter()
    for phrase, count in counts.items():
        words = phrase.split()
        heads[words[-1]] += count
        for word in words[:-1]:
            modifiers[word] += count
    return {p for p in counts if " " not in p and modifiers[p] >= 2 * heads[p]}


def build_vocabulary(
    captions: Iterable[str], *, min_count: int = 2, extractor: PhraseExtractor | None = None,
    source: dict | None = None,
) -> EntityVocabulary:
    """Count each caption's distinct entity phrases; keep those named by ≥ min_count captions.

    One-word phrases that are mostly modifiers elsewhere (`bare_attributes`) are left out.
    """
    if min_count < 1:
        raise ValueError(f"min_count must be ≥ 1, got {min_count}")
    captions = list(captions)
    if extractor is None:
        extractor = get_extractor("auto", corpus=captions)
    counts: Counter[str] = Counter()
    for caption in captions:
        counts.update(set(extractor.phrases(caption)))
    attributes = bare_attributes(counts)
    kept = sorted((p for p, c in counts.items() if c >= min_count and p not in attributes),
                  key=lambda p: (-counts[p], p))
    return EntityVocabulary(phrases=kept, counts={p: counts[p] for p in kept}, min_count=min_count,
                            extractor=extractor.describe(),
                            source={**(source or {}), "captions": len(captions), "distinct_phrases": len(counts),
                                    "bare_attributes_dropped": sorted(p for p in attributes if counts[p] >= min_count)})


def extractor_for(vocabulary: EntityVocabulary, corpus: Iterable[str] | None = None) -> PhraseExtractor:
    """The extractor a vocabulary was built with, so references are chunked the same way."""
    return get_extractor(vocabulary.extractor.get("backend", "auto"), corpus=corpus)
