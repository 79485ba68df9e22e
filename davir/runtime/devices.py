"""The device a command is asked to run on, checked before any work (issue 49: a GPU that is not there)."""

from __future__ import annotations

import torch

from davir.errors import DataError


def check_device(device: str | torch.device, flag: str = "--device", *, who: str = "davir runs") -> torch.device:
    """`device` as a torch.device this machine has; a DataError naming `flag` for a name torch does not know
    (`tpu`) or a GPU that is not here (`cuda` without CUDA, `cuda:3` on a 2-GPU machine)."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise DataError(f"{flag} {device}: not a device name; use cpu, cuda or cuda:N (a GPU index)") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise DataError(f"{flag} {device}: this machine has no CUDA GPU that torch can use; use --device cpu")
        if parsed.index is not None and parsed.index >= count:
            raise DataError(f"{flag} {device}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise DataError(f"{flag} {device}: no Apple MPS device here; use --device cpu")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise DataError(f"{flag} {device}: {who} on cpu, cuda or mps, not {parsed.type}")
    return parsed
