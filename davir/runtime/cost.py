"""What a run cost: parameters, pairs seen, wall time, device, peak memory and pairs/s.

    meter = CostMeter(device)                 # resets the CUDA peak; starts the clock
    ...                                       # train or caption, counting pairs
    record = meter.record(pairs=n, model=model)

Training writes its record to run_info.json (``compute``), captioning to metrics.json (``compute.captioning``,
beside a copy of the training record), so the sweep summary and ``python -m davir.compare`` can show cost
beside the scores. Peak memory is the CUDA allocator's peak (``torch.cuda.max_memory_allocated``) on a GPU and
the process's peak resident set size on a CPU: since the stage began where Linux lets it be reset (VmHWM),
else over the process's life (``ru_maxrss``; the record says which).
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: compare and sweep read only COST_FIELDS (a 3-s import)
    import torch


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Total and trainable parameters (each shared tensor counted once, as `Module.parameters` yields it)."""
    total = trainable = 0
    for parameter in model.parameters():
        total += parameter.numel()
        trainable += parameter.numel() if parameter.requires_grad else 0
    return {"total": total, "trainable": trainable}


def device_description(device: torch.device | str) -> str:
    """ "NVIDIA H100 80GB HBM3" on a GPU; "cpu (16 cores, 1 torch thread)" on a CPU."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    return f"{device.type} ({os.cpu_count()} cores, {threads} torch thread{'s' if threads != 1 else ''})"


def reset_peak_memory(device: torch.device | str) -> bool:
    """Start a new peak: the CUDA allocator's, or on Linux the process's peak RSS (writing 5 to
    /proc/self/clear_refs resets VmHWM), so that a sweep's later cells do not report an earlier cell's peak.
    Returns whether the reset took."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _vm_hwm_kib() -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_memory_mb(device: torch.device | str, *, since_reset: bool = False) -> tuple[float, str]:
    """(peak memory in MiB, what was measured)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda max_memory_allocated"
    hwm = _vm_hwm_kib() if since_reset else None
    if hwm is not None:
        return hwm / 2**10, "process peak RSS since the stage began (VmHWM)"
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes
    return (peak / 2**20 if sys.platform == "darwin" else peak / 2**10), "process peak RSS over its life (ru_maxrss)"


class CostMeter:
    """Wall clock and peak memory of one stage (training, captioning) on one device."""

    def __init__(self, device: torch.device | str):
        import torch

        self.device = torch.device(device)
        self.reset = reset_peak_memory(self.device)
        self.started = time.perf_counter()

    def record(self, *, pairs: int, model: torch.nn.Module | None = None, **extra) -> dict:
        """The stage's cost so far: wall seconds, pairs and pairs/s, device, peak memory, parameters if given."""
        wall = time.perf_counter() - self.started
        peak, measured = peak_memory_mb(self.device, since_reset=self.reset)
        record = {
            "device": device_description(self.device),
            "wall_s": round(wall, 3),
            "pairs": int(pairs),
            "pairs_per_s": round(pairs / wall, 3) if wall > 0 else None,
            "peak_memory_mb": round(peak, 1),
            "peak_memory": measured,
        }
        if model is not None:
            record["parameters"] = parameter_counts(model)
        return {**record, **extra}


# The cost columns of the sweep summary and the compare table: (title with its unit, path in metrics.json,
# scale, digits).
COST_FIELDS: tuple[tuple[str, tuple[str, ...], float, int], ...] = (
    ("params (M)", ("compute", "training", "parameters", "total"), 1e-6, 2),
    ("trainable (M)", ("compute", "training", "parameters", "trainable"), 1e-6, 2),
    ("pairs seen", ("compute", "training", "pairs"), 1.0, 0),
    ("train min", ("compute", "training", "wall_s"), 1 / 60, 1),
    ("train pairs/s", ("compute", "training", "pairs_per_s"), 1.0, 1),
    ("train peak MiB", ("compute", "training", "peak_memory_mb"), 1.0, 0),
    ("caption pairs/s", ("compute", "captioning", "pairs_per_s"), 1.0, 1),
)
DEVICE_PATH = ("compute", "training", "device")

__all__ = [
    "COST_FIELDS",
    "DEVICE_PATH",
    "CostMeter",
    "device_description",
    "parameter_counts",
    "peak_memory_mb",
    "reset_peak_memory",
]
