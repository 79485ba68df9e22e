import sys

from davir.pretrain_backbone.train import main

sys.exit(main())
