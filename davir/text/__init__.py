"""Caption text processing: noun-phrase extraction (`davir.text.extractors`, built on `words`, `lexicon` and
`chunker`), the entity vocabulary (`davir.text.entity_vocabulary`) and the caption vocabulary (`davir.text.vocab`)."""

from davir.text.entity_vocabulary import EntityVocabulary, build_vocabulary
from davir.text.extractors import (
    BACKENDS,
    PhraseExtractor,
    extract_attributes,
    extract_phrases,
    get_extractor,
    subject_phrase,
)

__all__ = [
    "BACKENDS",
    "EntityVocabulary",
    "PhraseExtractor",
    "build_vocabulary",
    "extract_attributes",
    "extract_phrases",
    "get_extractor",
    "subject_phrase",
]
