"""Regenerate the shipped lexicon (davir/text/data/wordnet-3.0-lexicon.txt.gz) from a WordNet 3.0 dict folder.

    python -m davir.text.build_lexicon --wordnet /usr/share/wordnet [--out davir/text/data/wordnet-3.0-lexicon.txt.gz]

Prints the text's sha256: set `SHIPPED_SHA256` in davir/text/lexicon.py to it. What is read and how the shipped
file was made: docs/metrics.md, "Noun-phrase extraction".
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
from pathlib import Path

from davir.errors import DataError
from davir.io import atomic_path
from davir.text.lexicon import SHIPPED_FILE, WordNetLexicon


def lexicon_bytes(lexicon: WordNetLexicon) -> bytes:
    """The gzip file of `lexicon.text`: level 9, mtime 0, no file name, so the bytes depend on the text only."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buffer, mtime=0) as handle:
        handle.write(lexicon.text.encode("utf-8"))
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m davir.text.build_lexicon",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--wordnet", type=Path, required=True, help="a WordNet 3.0 dict folder (index.noun, …)")
    parser.add_argument("--out", type=Path, default=SHIPPED_FILE, help=f"default: {SHIPPED_FILE}")
    args = parser.parse_args(argv)
    try:
        lexicon = WordNetLexicon.from_folder(args.wordnet)
        with atomic_path(args.out) as tmp:
            tmp.write_bytes(lexicon_bytes(lexicon))
    except DataError as error:
        print(f"error: --wordnet {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: --out {args.out}: cannot be written ({error.strerror or error})", file=sys.stderr)
        return 2
    sizes = {pos: len(words) for pos, words in lexicon.index.items()}
    print(f"wrote {args.out}: {sum(sizes.values())} lemmas {sizes}, {len(lexicon.text.encode())} bytes of text")
    print(f"sha256 {lexicon.sha256}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
