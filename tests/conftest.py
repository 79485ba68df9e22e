"""Shared fixtures: the real annotation files in ../shared/datasets, and no hub access in tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests never download: any accidental hub call fails fast instead of hanging on the network.
os.environ["HF_HUB_OFFLINE"] = "1"

SHARED_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """The folder of real annotation files and image pairs (never copied into the repository)."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"real dataset fixtures not found at {SHARED_DATASETS} (expected ../shared/datasets next to the repo)")
    return SHARED_DATASETS


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a test of a whole pipeline of commands (deselect with -m 'not slow')")
