"""`python -m davir.data …`: the command line is davir.cli.data (`davir-data`)."""

import sys

from davir.cli.data import main

if __name__ == "__main__":
    sys.exit(main())
