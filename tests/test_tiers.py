"""The two tiers of the suite: `make test` leaves out the tests marked slow, `make test-all` and CI run every test."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_arguments(target: str) -> list[str]:
    """The arguments of the pytest command `make TARGET` runs (make -n: printed, not run; install taken as done)."""
    printed = subprocess.run(
        ["make", "-n", "-o", "install", "-C", str(REPO), target], capture_output=True, text=True, check=True, cwd="/"
    ).stdout
    [line] = [line for line in printed.splitlines() if " -m pytest " in line]
    return shlex.split(line)[shlex.split(line).index("pytest") + 1 :]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_leaves_out_the_slow_tier_and_make_test_all_runs_every_test():
    quick, full = pytest_arguments("test"), pytest_arguments("test-all")
    assert quick[quick.index("-m") + 1] == "not slow" and quick[-1] == "tests"
    assert "-m" not in full and "-k" not in full and full[-1] == "tests"
    assert [a for a in quick if a not in ("-m", "not slow")] == full  # the same run otherwise (workers, order)


def test_ci_runs_make_test_all():
    commands = [line.split("#")[0].strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert "make test-all" in commands and "make test" not in commands


def test_ci_runs_the_formatter_and_the_linter_before_the_tests():
    commands = [line.split("#")[0].strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert commands.index("make lint") < commands.index("make test-all")
    printed = subprocess.run(
        ["make", "-n", "-o", "install", "-C", str(REPO), "lint"], capture_output=True, text=True, check=True, cwd="/"
    ).stdout
    assert " -m ruff format --check ." in printed and " -m ruff check ." in printed


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_the_tree_is_formatted_and_lint_free():
    """What `make lint` checks, here too: a change that skips `make format` fails the suite, not only CI."""
    ruff = [sys.executable, "-m", "ruff"]
    formatted = subprocess.run([*ruff, "format", "--check", "."], cwd=REPO, capture_output=True, text=True)
    assert formatted.returncode == 0, formatted.stdout[-2000:] + formatted.stderr[-500:]
    linted = subprocess.run([*ruff, "check", "."], cwd=REPO, capture_output=True, text=True)
    assert linted.returncode == 0, linted.stdout[-2000:]
