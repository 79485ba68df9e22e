"""Caption your own folder of image pairs with any trained model: JSONL out, and an HTML report.

python caption.py --help        # the options; the command line is davir.cli.caption, also `davir-caption`
"""

import sys

from davir.cli.caption import main

if __name__ == "__main__":
    sys.exit(main())
