"""Pretrain the tiny ResNet backbone of the lightweight demo (`python -m davir.pretrain_backbone`)."""

import sys

from davir.cli.pretrain_backbone import main

sys.exit(main())
