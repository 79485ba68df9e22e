"""Score change captions with the standard metrics, from a predictions file or a trained checkpoint.

python evaluate.py --help        # the options; the command line is davir.cli.evaluate, also `davir-evaluate`
"""

import sys

from davir.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
