"""Variants × seeds: train and score a grid of runs, one table of mean ± std (`python -m davir.sweep SWEEP.yaml`)."""

import sys

from davir.cli.sweep import main

sys.exit(main())
