"""Caption your own folder of image pairs with a trained checkpoint; JSONL out, and an HTML report to look at.

    python caption.py --checkpoint runs/demo --pairs my_pairs/ --out captions.jsonl --html report.html

`--pairs` is a folder with `before/` + `after/` (matching names), or `NAME_before.EXT`/`NAME_after.EXT`
side by side, or a `pairs.csv`/`pairs.jsonl` manifest (`before,after[,id]`), or such a manifest file.
Change masks and entities are computed on the fly with the same preprocessing (and settings) the model was
trained with. A pair that cannot be read (missing or corrupt image, before/after of different sizes unless
`--resize-mismatched`) is listed with the reason in the JSONL and the report; the others still get captions.
"""

import sys

from davir.cli.caption import main

if __name__ == "__main__":
    sys.exit(main())
