"""`python -m preprocess …` from the repository root (and `accelerate launch -m preprocess …`): davir.cli.preprocess."""

import sys

from davir.cli.preprocess import main

if __name__ == "__main__":
    sys.exit(main())
