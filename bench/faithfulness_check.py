"""Print N pairs of a predictions file with the stated differences the faithfulness reader finds, for a hand check.

    python bench/faithfulness_check.py PREDICTIONS REFERENCES [--pairs 50] [--seed 0] [--out sample.json]

The pairs are a seeded sample of the scored ids (sorted, then `random.Random(seed).sample`). For each pair:
the caption, its references, the objects the caption states and those no reference supports (the reader's
hallucination verdict), and whether caption / references say nothing changed. A person then marks, per
pair, whether each verdict is right; docs/experiments/results.md records the counts.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from davir.metrics import load_predictions
from davir.metrics.faithfulness import score_faithfulness
from davir.metrics.protocols import load_reference_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("predictions", type=Path)
    parser.add_argument("references", type=Path)
    parser.add_argument("--pairs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    references = load_reference_file(args.references, empty="auto").references
    scores = score_faithfulness(load_predictions(args.predictions), references, keep_pairs=True)
    ids = sorted(scores["pairs"])
    sample = {
        pair_id: scores["pairs"][pair_id] for pair_id in random.Random(args.seed).sample(ids, min(args.pairs, len(ids)))
    }
    text = json.dumps(
        {
            "predictions": str(args.predictions),
            "references": str(args.references),
            "seed": args.seed,
            "reader": scores["reader"],
            "pairs": sample,
        },
        indent=1,
        ensure_ascii=False,
    )
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
