"""`python -m davir.export --checkpoint RUN --out DIR` (the same as `davir-export`)."""

import sys

from davir.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
