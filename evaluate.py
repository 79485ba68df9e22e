"""Score change captions with the standard metrics (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE).

    python evaluate.py --predictions preds.json --references refs.json --out metrics.json
    python evaluate.py --predictions preds.json --format clevr_change --root data/clevr_change --split test
    python evaluate.py --checkpoint runs/demo --split test          # generate with a trained model, then score
    accelerate launch evaluate.py --checkpoint runs/demo            # generation sharded over processes

Predictions: a COCO results list, an {id: caption} JSON or a JSONL file. References: a COCO captions
file or an {id: [captions]} JSON (--references), or a dataset split through the data layer
(--format/--root/--split); when that dataset has change types (CLEVR-Change) a per-type table follows.
Tables print x100 as papers do; the JSON keeps the toolkit scale. Exit status 2 on bad input.
"""

import sys

from davir.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
