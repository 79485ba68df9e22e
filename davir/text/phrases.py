"""The names `davir.text.phrases` held before it was split, for callers that import them from here.

The code lives in modules of one idea: `davir.text.words` (closed-class words, tags, tokenising),
`davir.text.lexicon` (WordNet and caption-fitted parts of speech), `davir.text.chunker` (tagging and
noun-phrase / verb-segment chunking), `davir.text.extractors` (the back-ends and one-call helpers) and
`davir.text.entity_vocabulary` (the vocabulary of entity phrases). New code imports from those.
"""

from davir.text.chunker import chunk_tokens, tag_words
from davir.text.entity_vocabulary import EntityVocabulary, bare_attributes, build_vocabulary, extractor_for
from davir.text.extractors import (
    BACKENDS,
    SPACY_MODEL,
    PhraseExtractor,
    SpacyExtractor,
    WordNetExtractor,
    extract_attributes,
    extract_phrases,
    get_extractor,
    spacy_available,
    subject_phrase,
)
from davir.text.lexicon import (
    DEFAULT_WORDNET_DIR,
    CorpusLexicon,
    WordNetLexicon,
    load_wordnet,
    wordnet_available,
    wordnet_dir,
)
from davir.text.words import CLOSED_CLASS, GENERIC_HEADS, Token, closed_tag, is_generic, tokenize

__all__ = [
    "BACKENDS", "CLOSED_CLASS", "DEFAULT_WORDNET_DIR", "GENERIC_HEADS", "SPACY_MODEL", "CorpusLexicon",
    "EntityVocabulary", "PhraseExtractor", "SpacyExtractor", "Token", "WordNetExtractor", "WordNetLexicon",
    "bare_attributes", "build_vocabulary", "chunk_tokens", "closed_tag", "extract_attributes", "extract_phrases",
    "extractor_for", "get_extractor", "is_generic", "load_wordnet", "spacy_available", "subject_phrase", "tag_words",
    "tokenize", "wordnet_available", "wordnet_dir",
]
