"""The closed-class words of English captions, the tags, and tokenising: what never joins a noun phrase."""

from __future__ import annotations

import re
from dataclasses import dataclass

# --- closed-class words: they never belong to a noun phrase -----------------------------------------
DETERMINERS = frozenset(
    """
a an the this that these those some any each every all both no none another other others either neither
much many few fewer several more most less least such same various certain enough whole entire
different similar own my your his her its our their whose
one two three four five six seven eight nine ten eleven twelve dozen hundred thousand
first second third fourth fifth last next previous former latter single double couple
""".split()
)
PRONOUNS = frozenset(
    """
i me you he him she it we us they them myself yourself himself herself itself ourselves themselves
someone somebody something anyone anybody anything everyone everybody everything nobody nothing noone ones
there here who whom which what whatever whoever where when why how
""".split()
)
PREPOSITIONS = frozenset(
    """
about above across after against along alongside amid among around as at atop before behind below beneath
beside besides between beyond by despite down during except for from in inside into like near nearby
nearer of off on onto opposite out outside over past per round since than through throughout till to
toward towards under underneath unlike until up upon via with within without
""".split()
)
CONJUNCTIONS = frozenset("and or but nor so yet if because while whereas although though unless whether then".split())
AUXILIARIES = frozenset(
    """
am is are was were be been being has have had having do does did will would shall should can could may
might must isn't aren't wasn't weren't hasn't haven't hadn't don't doesn't didn't won't wouldn't can't
cannot couldn't shouldn't there's it's that's here's what's he's she's they're we're they've get gets
got getting theres thats whats heres isnt arent wasnt werent hasnt havent doesnt dont didnt cant wont
""".split()
)
ADVERBS = frozenset(
    """
not only longer anymore now still just also very too quite slightly already again even almost rather somewhat
currently previously originally totally completely partially mostly nearly ever never always often
sometimes instead initially finally really actually apparently probably maybe perhaps please etc ok
okay yes
""".split()
)
CLOSED_CLASS = DETERMINERS | PRONOUNS | PREPOSITIONS | CONJUNCTIONS | AUXILIARIES | ADVERBS

# Heads that name the picture, the change itself, or a position rather than a thing in the scene.
GENERIC_HEADS = frozenset(
    """
difference image picture photo photograph pic change scene frame shot view version edit effect
left right top bottom middle center centre side corner front back area part spot place position location way
time
""".split()
)

# Tags: closed classes, then the open classes N (noun), A (adjective), V (verb), R (adverb), and
# X for punctuation (a hard phrase boundary).
DET, PRON, PREP, CONJ, AUX, ADV_CLOSED, PUNCT = "DET", "PRON", "PREP", "CONJ", "AUX", "ADV", "X"
NOUN, ADJ, VERB, ADVERB = "N", "A", "V", "R"
_CLOSED_TAGS = (
    (DETERMINERS, DET),
    (PRONOUNS, PRON),
    (PREPOSITIONS, PREP),
    (CONJUNCTIONS, CONJ),
    (AUXILIARIES, AUX),
    (ADVERBS, ADV_CLOSED),
)

_TOKEN = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*|[^\sa-z0-9]")
CAPITAL = "\x00capital"


@dataclass(frozen=True)
class Token:
    """One word of a caption with its chosen tag and (for nouns) its singular lemma."""

    text: str
    tag: str
    lemma: str


def tokenize(caption: str) -> list[str]:
    """Lower-cased words (hyphens and apostrophes kept inside a word) and punctuation marks.

    In a mixed-case caption a capitalised word after the first is preceded by the marker CAPITAL:
    run-on instructions ("Change the background into solid white Increase the height") start each
    clause with a capital, and `tag_words` ends the phrase there when the word can be a verb.
    """
    mixed_case = caption != caption.upper()
    words: list[str] = []
    for match in _TOKEN.finditer(caption.lower()):
        original = caption[match.start() : match.end()]
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


def is_word(word: str) -> bool:
    return word[:1].isalpha() and len(word) > 1


def is_generic(phrase: str) -> bool:
    return phrase.rsplit(" ", 1)[-1] in GENERIC_HEADS
