"""Train DAVIR (InstructBLIP + LoRA + FAC + EPC) or a lightweight method with one explicit Accelerate loop.

    accelerate launch train.py --config configs/demo.yaml [key.sub=value …] [--resume]
    python train.py                      # the built-in demo config

The command line is davir.cli.train; the loop, written out in full, is davir.training.loop.train.
"""

import sys

from davir.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
