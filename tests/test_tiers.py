"""The two tiers of the suite: `make test` leaves out the tests marked slow, `make test-all` and CI run every test."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_arguments(target: str) -> list[str]:
    """The arguments of the pytest command `make TARGET` runs (make -n: printed, not run; install taken as done)."""
    printed = subprocess.run(["make", "-n", "-o", "install", "-C", str(REPO), target], capture_output=True, text=True,
                             check=True, cwd="/").stdout
    [line] = [line for line in printed.splitlines() if " -m pytest " in line]
    return shlex.split(line)[shlex.split(line).index("pytest") + 1:]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_leaves_out_the_slow_tier_and_make_test_all_runs_every_test():
    quick, full = pytest_arguments("test"), pytest_arguments("test-all")
    assert quick[quick.index("-m") + 1] == "not slow" and quick[-1] == "tests"
    assert "-m" not in full and "-k" not in full and full[-1] == "tests"
    assert [a for a in quick if a not in ("-m", "not slow")] == full  # the same run otherwise (workers, order)


def test_ci_runs_make_test_all():
    commands = [line.split("#")[0].strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert "make test-all" in commands and "make test" not in commands
