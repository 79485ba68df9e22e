"""The processes of one preprocessing job: `accelerate launch -m preprocess …` or hand-set shards.

    layout = process_layout(args.num_shards, args.shard_index)
    mine = layout.share(pairs)                      # item i goes to process i % N, in the reader's order
    layout.announce(len(mine), len(pairs))          # "process I/N: K of M pairs" on stderr
    layout.main_first(fit)                          # the main process fits; the others wait, then load
    everyone = layout.gather(summary)               # every process's summary, in process order (a barrier)

Under `accelerate launch` (WORLD_SIZE > 1) each process is a shard: accelerate's PartialState gives its index
and device (one GPU each; gloo between CPU processes), and the main process writes the whole cache's manifest
once every share is complete. Without it, `--num-shards K --shard-index I` name the share by hand and nothing
is merged (each shard writes its own manifest, as before). Strided shares keep every process's work alike
when pair costs drift along the reader's order (e.g. image sizes grouped by source).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from davir.errors import DataError

T = TypeVar("T")


@dataclass
class ProcessLayout:
    count: int
    index: int
    state: object | None = None  # accelerate.PartialState of an `accelerate launch`; None otherwise

    @property
    def launched(self) -> bool:
        """Whether the processes were started together by accelerate (and so merge their results)."""
        return self.state is not None

    @property
    def is_main(self) -> bool:
        return self.index == 0

    @property
    def device(self) -> str | None:
        """This process's accelerate device (`cuda:LOCAL_RANK`, `cpu`), or None outside a launch."""
        return None if self.state is None else str(self.state.device)

    def share(self, items: Sequence[T]) -> list[T]:
        return list(items[self.index :: self.count])

    def describe(self) -> str:
        return f"process {self.index + 1}/{self.count}"

    def announce(self, taken: int, total: int, what: str = "pairs") -> None:
        if self.count > 1:
            print(f"{self.describe()}: {taken} of {total} {what}", file=sys.stderr, flush=True)

    def main_first(self, work: Callable[[], T]) -> T | None:
        """Run `work` on the main process while the others wait (fitting, shared files); a DataError there
        stops every process with its message instead of leaving them waiting. Returns work's result on
        the main process, None on the others."""
        if self.state is None:
            return work()
        from accelerate.utils import broadcast_object_list

        outcome: list = [None]
        result = None
        if self.is_main:
            try:
                result = work()
            except DataError as error:
                outcome = [str(error)]
                broadcast_object_list(outcome, from_process=0)
                raise
        broadcast_object_list(outcome, from_process=0)
        if outcome[0] is not None:
            raise DataError(f"the main process stopped: {outcome[0]}")
        return result

    def gather(self, summary: T) -> list[T]:
        """Every process's `summary`, in process order, on every process; waits for all of them."""
        if self.state is None:
            return [summary]
        from accelerate.utils import gather_object

        return list(gather_object([summary]))


def process_layout(num_shards: int | None = 1, shard_index: int | None = 0) -> ProcessLayout:
    """accelerate's processes when launched by it, else the hand-set shard (`--num-shards/--shard-index`)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torch.distributed.run (accelerate launch --multi_gpu, torchrun)
        import torch
        from accelerate import PartialState

        state = PartialState(cpu=not torch.cuda.is_available())
        if state.num_processes > 1:
            if num_shards not in (None, 1):
                raise DataError(
                    "--num-shards is for schedulers without accelerate: under `accelerate launch` each "
                    "process is a shard already"
                )
            return ProcessLayout(state.num_processes, state.process_index, state)
    count, index = num_shards or 1, shard_index or 0
    if count < 1 or not 0 <= index < count:
        raise DataError(f"--shard-index must be in [0, {count}), got {index} (--num-shards {count})")
    return ProcessLayout(count, index)
