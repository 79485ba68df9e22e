"""What a change caption says changed: its stated differences, each a change kind and an object phrase.

    reader = DifferenceReader()
    reader.read("the small red cube is gone and a blue ball appeared")
    # Statement(differences=(Difference("removed", ChangeObject("cube", {"small", "red"})),
    #                        Difference("added", ChangeObject("sphere", {"blue"}))), no_change=False)

Clauses, cue words and synonyms: docs/metrics.md, "Stated-difference faithfulness".
"""

from __future__ import annotations

from dataclasses import dataclass

from davir.text.extractors import PhraseExtractor, get_extractor
from davir.text.words import tokenize

ADDED, REMOVED, MOVED, ATTRIBUTE = "added", "removed", "moved", "attribute"
KINDS = (ADDED, REMOVED, MOVED, ATTRIBUTE)

# One spelling per synonym group: sizes, materials and shapes of CLEVR-style captions, colour spellings,
# and people (Spot-the-Diff writes "man", "guy", "person" for one pedestrian).
SYNONYMS: dict[str, str] = {
    "tiny": "small",
    "little": "small",
    "big": "large",
    "huge": "large",
    "metallic": "metal",
    "shiny": "metal",
    "matte": "rubber",
    "ball": "sphere",
    "block": "cube",
    "grey": "gray",
    "colour": "color",
    "man": "person",
    "woman": "person",
    "guy": "person",
    "lady": "person",
    "boy": "person",
    "girl": "person",
    "people": "person",
    "pedestrian": "person",
    "men": "person",
    "women": "person",
    "kid": "person",
    "child": "person",
    "children": "person",
    "kids": "person",
}
# "a group of people": the thing that changed is the people, the phrase after "of".
COLLECTIVE_HEADS = frozenset("group crowd couple number pair row bunch cluster line".split())
# Pronouns that stand for a person when the clause has no noun phrase ("someone walked away").
PERSON_PRONOUNS = frozenset("someone somebody anyone anybody everyone everybody".split())

# Two-word cues are tried before one-word cues (so "changed its location" is a move, not an attribute change).
_PHRASE_CUES: tuple[tuple[tuple[str, str], str], ...] = tuple(
    (tuple(cue.split()), kind)
    for kind, cues in (
        (
            MOVED,
            (
                "different location",
                "different position",
                "different place",
                "different spot",
                "new location",
                "new position",
                "its location",
                "its position",
                "changed location",
                "changed position",
                "changed place",
            ),
        ),
        (
            REMOVED,
            (
                "no longer",
                "not there",
                "not present",
                "not visible",
                "taken away",
                "walked away",
                "drove away",
                "drove off",
                "walked off",
                "has left",
                "have left",
                "had left",
            ),
        ),
        (ADDED, ("showed up", "shows up", "pulled in", "pulled up")),
        (
            ATTRIBUTE,
            ("changed to", "changed into", "changes to", "change to", "turned into", "changed color", "changed colour"),
        ),
    )
    for cue in cues
)
_WORD_CUES: tuple[tuple[frozenset[str], str], ...] = (
    (
        frozenset(
            "gone removed remove removes missing disappeared disappear disappears vanished absent fewer less "
            "exited departed".split()
        ),
        REMOVED,
    ),
    (frozenset("moved move moves moving shifted relocated repositioned closer farther".split()), MOVED),
    (
        frozenset(
            "added add adds appeared appear appears appearing new newly arrived arrives additional more "
            "emerged placed introduced inserted entered enters".split()
        ),
        ADDED,
    ),
    (frozenset("became become becomes turned turns painted recolored recoloured changed".split()), ATTRIBUTE),
)
_NO_CHANGE_PHRASES = tuple(
    tuple(cue.split())
    for cue in ("no change", "no changes", "no difference", "no differences", "not changed", "no visible")
)
_NO_CHANGE_WORDS = frozenset("nothing same identical unchanged".split())
_CLAUSE_BREAKS = frozenset(", ; . ! ? and but while whereas also".split())


@dataclass(frozen=True)
class ChangeObject:
    """An object phrase in canonical spelling: the head noun and the set of its modifiers."""

    head: str
    modifiers: frozenset[str] = frozenset()

    @classmethod
    def from_phrase(cls, phrase: str) -> ChangeObject:
        words = [SYNONYMS.get(word, word) for word in phrase.split()]
        return cls(words[-1], frozenset(words[:-1]))

    def text(self) -> str:
        return " ".join([*sorted(self.modifiers), self.head])


@dataclass(frozen=True)
class Difference:
    """One stated difference: its kind (one of KINDS; None when the clause has no cue) and its object
    (None when the clause names none, "something was added")."""

    kind: str | None
    object: ChangeObject | None


@dataclass(frozen=True)
class Statement:
    """Everything one caption states: its differences, and whether it says that nothing changed."""

    differences: tuple[Difference, ...]
    no_change: bool

    def objects(self) -> list[ChangeObject]:
        return list(dict.fromkeys(d.object for d in self.differences if d.object is not None))

    def kinds(self) -> set[str]:
        return {d.kind for d in self.differences if d.kind is not None}


def _contains(words: list[str], cue: tuple[str, ...]) -> bool:
    n = len(cue)
    return any(tuple(words[i : i + n]) == cue for i in range(len(words) - n + 1))


def change_kind(words: list[str]) -> str | None:
    """The kind a clause's cue words state, or None (two-word cues first, then one-word cues in KINDS' priority)."""
    for cue, kind in _PHRASE_CUES:
        if _contains(words, cue):
            return kind
    for cues, kind in _WORD_CUES:
        if cues.intersection(words):
            return kind
    return None


def says_no_change(words: list[str]) -> bool:
    return bool(_NO_CHANGE_WORDS.intersection(words)) or any(_contains(words, cue) for cue in _NO_CHANGE_PHRASES)


def split_clauses(caption: str) -> list[list[str]]:
    """The caption's words, cut at punctuation and clause-joining conjunctions (lower case; no empty clause)."""
    clauses: list[list[str]] = [[]]
    for word in tokenize(caption.lower()):
        if word in _CLAUSE_BREAKS:
            clauses.append([])
        else:
            clauses[-1].append(word)
    return [clause for clause in clauses if clause]


def stated_object(phrases: list[str], words: list[str]) -> ChangeObject | None:
    """The object a clause states: its first entity phrase, the phrase after a collective head ("group of
    people" → person), or a person for a person pronoun when the clause has no phrase."""
    if not phrases:
        return ChangeObject("person") if PERSON_PRONOUNS.intersection(words) else None
    first = ChangeObject.from_phrase(phrases[0])
    if first.head in COLLECTIVE_HEADS and len(phrases) > 1:
        return ChangeObject.from_phrase(phrases[1])
    return first


class DifferenceReader:
    """Reads captions into `Statement`s with one phrase extractor (by default the shipped WordNet lexicon's, see
    `davir.text.extractors.get_extractor`); statements are cached, since references repeat across runs."""

    def __init__(self, extractor: PhraseExtractor | None = None):
        self.extractor = extractor if extractor is not None else get_extractor("auto")
        self._cache: dict[str, Statement] = {}

    def read(self, caption: str) -> Statement:
        if caption not in self._cache:
            self._cache[caption] = self._read(caption)
        return self._cache[caption]

    def _read(self, caption: str) -> Statement:
        differences: list[Difference] = []
        no_change_cue = False
        for words in split_clauses(caption):
            phrases = self.extractor.phrases(" ".join(words))
            kind = change_kind(words)
            if says_no_change(words):
                if not phrases:  # "nothing has changed": its "changed" is no attribute change
                    no_change_cue = True
                    continue
                if kind is None:  # "the car is the same": names an object, states no difference
                    continue
            if phrases or kind is not None:
                differences.append(Difference(kind, stated_object(phrases, words)))
        named = any(d.object is not None for d in differences)
        if no_change_cue and not named:
            # "there is no change" states no difference at all, whatever cue word it carries
            return Statement((), True)
        return Statement(tuple(differences), False)

    def describe(self) -> dict:
        return {**self.extractor.describe(), "reader": "davir.text.differences"}


__all__ = [
    "ADDED",
    "ATTRIBUTE",
    "COLLECTIVE_HEADS",
    "KINDS",
    "MOVED",
    "PERSON_PRONOUNS",
    "REMOVED",
    "SYNONYMS",
    "ChangeObject",
    "Difference",
    "DifferenceReader",
    "Statement",
    "change_kind",
    "says_no_change",
    "split_clauses",
    "stated_object",
]
