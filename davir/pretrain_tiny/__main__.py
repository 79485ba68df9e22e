"""python -m davir.pretrain_tiny"""

import sys

from davir.pretrain_tiny.cli import main

if __name__ == "__main__":
    sys.exit(main())
