import sys

from davir.compare.runs import main

sys.exit(main())
