import sys

from davir.sweep.grid import main

sys.exit(main())
