"""`python -m preprocess COMMAND …` / `davir-preprocess COMMAND …` — each command is a job of davir.jobs with its own
`main(argv)` (parser and job together: the job reads its options as one Namespace).

    masks        difference map → threshold → DBSCAN → prompts → segmenter → IoU filter → union (Eqs. 2-3)
    mask-eval    mask IoU / precision / recall against ground truth (built-in synthetic set)
    entities     entity vocabulary from training captions and top-k retrieval per pair (Eqs. 8-9)
    entity-eval  top-1 / top-k accuracy of retrieved entities against the reference captions
    features     ResNet-101 layer3 grid features for the lightweight methods
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "masks": ("davir.jobs.masks", "main"),
    "mask-eval": ("davir.jobs.mask_eval", "main"),
    "entities": ("davir.jobs.entities", "main"),
    "entity-eval": ("davir.jobs.entity_eval", "main"),
    "features": ("davir.jobs.features", "main"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):  # asked for: usage on stdout, success
        print(__doc__)
        print(f"usage: python -m preprocess {{{','.join(COMMANDS)}}} [options]  (COMMAND --help for its options)")
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        print(f"usage: python -m preprocess {{{','.join(COMMANDS)}}} [options]", file=sys.stderr)
        return 2
    module_name, function = COMMANDS[argv[0]]
    module = importlib.import_module(module_name)
    try:
        return int(getattr(module, function)(argv[1:]) or 0)
    except OSError as error:  # permissions, a full disk: one line, never a traceback (docs/errors.md)
        from davir.errors import describe_os_error

        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
