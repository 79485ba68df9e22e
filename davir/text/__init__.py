"""Caption text processing: noun-phrase chunking and the entity vocabulary (`davir.text.phrases`)."""

from davir.text.phrases import (
    BACKENDS, EntityVocabulary, PhraseExtractor, build_vocabulary, extract_attributes, extract_phrases,
    get_extractor, subject_phrase,
)

__all__ = [
    "BACKENDS", "EntityVocabulary", "PhraseExtractor", "build_vocabulary", "extract_attributes",
    "extract_phrases", "get_extractor", "subject_phrase",
]
