"""davir.runtime.cost: parameter counts, wall time, pairs/s and peak memory of a stage."""

from __future__ import annotations

import time

import pytest
import torch

from davir.runtime.cost import CostMeter, parameter_counts


def test_parameter_counts_by_hand():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[1].requires_grad_(False)
    # 3×4 + 4 = 16 trainable; 4×2 + 2 = 10 frozen
    assert parameter_counts(model) == {"total": 26, "trainable": 16}
    tied = torch.nn.Sequential(model[0], model[0])  # one tensor used twice counts once
    assert parameter_counts(tied) == {"total": 16, "trainable": 16}


def test_cost_record_on_the_cpu():
    meter = CostMeter("cpu")
    time.sleep(0.05)
    record = meter.record(pairs=10, model=torch.nn.Linear(2, 2), batch_size=4)
    assert record["wall_s"] >= 0.05 and record["pairs"] == 10
    assert abs(record["pairs_per_s"] - 10 / record["wall_s"]) < 10 / record["wall_s"] * 1e-2
    assert record["peak_memory_mb"] > 10 and "process peak RSS" in record["peak_memory"]
    assert record["device"].startswith("cpu (") and record["parameters"] == {"total": 6, "trainable": 6}
    assert record["batch_size"] == 4


def test_each_stage_reports_its_own_peak_not_an_earlier_ones():
    """A sweep trains and scores many cells in one process: on Linux each stage's CPU peak starts anew."""
    first = CostMeter("cpu")
    if not first.reset:
        pytest.skip("the peak RSS cannot be reset here (not Linux)")
    block = bytearray(256 * 2**20)  # 256 MiB, touched: resident
    block[::4096] = b"x" * len(block[::4096])
    peak_with_block = first.record(pairs=1)["peak_memory_mb"]
    del block
    second = CostMeter("cpu").record(pairs=1)
    assert second["peak_memory"] == "process peak RSS since the stage began (VmHWM)"
    assert second["peak_memory_mb"] < peak_with_block - 200
