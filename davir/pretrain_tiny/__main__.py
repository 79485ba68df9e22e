"""python -m davir.pretrain_tiny"""

import sys

from davir.cli.pretrain_tiny import main

if __name__ == "__main__":
    sys.exit(main())
