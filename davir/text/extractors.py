"""Noun-phrase extraction from change captions: the `PhraseExtractor` back-ends and one-call helpers.

    extractor = get_extractor(backend="auto")      # "wordnet" (shipped lexicon), "spacy" or "rules"
    extract_phrases("the small red metal sphere changed to blue")   # ["small red metal sphere"]

Used by DAVIR's entity prompt, CHEER's subject entities and RDD's attribute segments. The back-ends and the
phrase rules: docs/metrics.md, "Noun-phrase extraction".
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from davir.errors import DataError
from davir.text.chunker import chunk_tokens, phrase_text, tag_words, unique, verb_segments
from davir.text.lexicon import CorpusLexicon, WordNetLexicon, current_lexicon
from davir.text.words import CLOSED_CLASS, Token, is_generic, tokenize

BACKENDS = ("auto", "spacy", "wordnet", "rules")
SPACY_MODEL = "en_core_web_sm"


class PhraseExtractor:
    """Noun phrases, entity phrases, subject phrase and noun/verb segments of a caption."""

    backend = "rules"

    def __init__(self, lexicon=None):
        self.lexicon = lexicon if lexicon is not None else CorpusLexicon()

    def tag(self, caption: str) -> list[Token]:
        return tag_words(tokenize(caption), self.lexicon)

    def noun_chunks(self, caption: str) -> list[str]:
        """Every noun phrase (determiners stripped, head singular), generic heads included, in order."""
        return unique(phrase_text(chunk) for chunk in chunk_tokens(self.tag(caption)))

    def phrases(self, caption: str) -> list[str]:
        """The entity phrases of a caption: noun phrases without generic heads, in order, deduplicated."""
        return [phrase for phrase in self.noun_chunks(caption) if not is_generic(phrase)]

    def attributes(self, caption: str) -> dict[str, list[str]]:
        """RDD §3.8 noun and verb segments of one caption (noun phrases with generic heads kept)."""
        tokens = self.tag(caption)
        return {
            "nouns": unique(phrase_text(chunk) for chunk in chunk_tokens(tokens)),
            "verbs": unique(verb_segments(tokens)),
        }

    def subject(self, caption: str) -> str | None:
        """CHEER §4.8's subject entity: the first entity phrase (pronoun/expletive subjects never chunk)."""
        phrases = self.phrases(caption)
        return phrases[0] if phrases else None

    def describe(self) -> dict:
        return {"backend": self.backend}


class WordNetExtractor(PhraseExtractor):
    backend = "wordnet"

    def __init__(self, lexicon: WordNetLexicon | None = None):
        super().__init__(lexicon if lexicon is not None else current_lexicon())

    def describe(self) -> dict:
        return {"backend": self.backend, "lexicon": self.lexicon.describe()}


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
        self.matcher.add(
            "VERB_SEGMENT",
            [
                [
                    {"POS": "VERB", "OP": "?"},
                    {"POS": "ADV", "OP": "*"},
                    {"POS": "AUX", "OP": "*"},
                    {"POS": "VERB", "OP": "+"},
                ]
            ],
        )
        super().__init__(CorpusLexicon())

    def _chunk_text(self, chunk) -> str | None:
        words = [t for t in chunk if t.lower_ not in CLOSED_CLASS and t.pos_ not in ("DET", "NUM", "PRON", "PUNCT")]
        if not words or words[-1].pos_ not in ("NOUN", "PROPN"):
            return None
        return " ".join([t.lower_ for t in words[:-1]] + [words[-1].lemma_.lower()])

    def noun_chunks(self, caption: str) -> list[str]:
        doc = self.nlp(caption.lower())
        return unique(text for text in (self._chunk_text(chunk) for chunk in doc.noun_chunks) if text)

    def attributes(self, caption: str) -> dict[str, list[str]]:
        from spacy.util import filter_spans

        doc = self.nlp(caption.lower())
        spans = filter_spans([doc[start:end] for _, start, end in self.matcher(doc)])
        return {"nouns": self.noun_chunks(caption), "verbs": unique(span.text for span in spans)}

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


def get_extractor(backend: str = "auto", *, corpus: Iterable[str] | None = None) -> PhraseExtractor:
    """The phrase extractor for a back-end name; "auto" is the shipped WordNet lexicon (spaCy only by name, so
    that what is installed never changes a result)."""
    if backend not in BACKENDS:
        raise DataError(f"unknown phrase back-end {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "spacy":
        return SpacyExtractor()
    if backend in ("auto", "wordnet"):
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
