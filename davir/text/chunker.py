"""Tagging a tokenised caption from its left context and chunking it into noun phrases and verb segments."""

from __future__ import annotations

from collections.abc import Iterable

from davir.text.words import (
    ADJ,
    ADV_CLOSED,
    ADVERB,
    AUX,
    CAPITAL,
    CONJ,
    DET,
    DETERMINERS,
    NOUN,
    PREP,
    PUNCT,
    VERB,
    Token,
    closed_tag,
    is_word,
)

# After these a word that can be nominal is nominal ("the parked car", "at stop sign"); after a noun
# the word's own frequencies decide ("parking lot" vs "people standing").
_NOMINAL_CONTEXT = frozenset({DET, PREP, ADJ})
# A clause start: there an open-class word followed by a determiner or pronoun is an imperative verb
# ("crop the image", "make it larger"), the usual form of Image-Editing-Request instructions.
_CLAUSE_START = frozenset({PUNCT, CONJ})
_OBJECT_PRONOUNS = frozenset("it them him her me us everything something".split())


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
        if tag is None and not is_word(word):
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
                if (
                    tag == VERB
                    and previous == NOUN
                    and tokens[-1].lemma == tokens[-1].text
                    and lexicon.is_base_verb(word)
                    and 4 * options.get(NOUN, 0.0) >= options[VERB]
                ):
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


def phrase_text(chunk: list[Token]) -> str:
    """Modifiers as written, the head noun in its singular lemma."""
    return " ".join([token.text for token in chunk[:-1]] + [chunk[-1].lemma])


def verb_segments(tokens: list[Token]) -> list[str]:
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


def unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
