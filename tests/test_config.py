from dataclasses import dataclass, field
from typing import Literal

import pytest

from davir.config import ConfigError, apply_overrides, load_config


@dataclass
class Inner:
    lr: float = 1e-3
    schedule: Literal["cosine", "linear"] = "cosine"


@dataclass
class Outer:
    name: str = "run"
    steps: int = 10
    flags: list[str] = field(default_factory=list)
    inner: Inner = field(default_factory=Inner)
    path: str | None = None


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: demo\ninner:\n  lr: 1e-4\n")
    config = load_config(Outer, path, ["steps=20", "inner.schedule=linear", "flags=[a, b]"])
    assert config == Outer(name="demo", steps=20, flags=["a", "b"], inner=Inner(lr=1e-4, schedule="linear"))


def test_unknown_key_names_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("inner:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError, match=r"c.yaml.inner: unknown key\(s\) \['lrr'\]"):
        load_config(Outer, path)


def test_wrong_types_rejected():
    with pytest.raises(ConfigError, match="steps: expected an integer"):
        load_config(Outer, None, ["steps=ten"])
    with pytest.raises(ConfigError, match="not one of"):
        load_config(Outer, None, ["inner.schedule=step"])
    with pytest.raises(ConfigError, match="not of the form"):
        apply_overrides({}, ["steps"])


def test_malformed_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_config(Outer, path)


def test_every_shipped_train_config_loads():
    """Each YAML in configs/ fits the typed TrainConfig (a typo in a shipped config fails here, not in a run)."""
    from pathlib import Path

    from davir.training.config import TrainConfig

    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    assert any(p.name == "demo.yaml" for p in configs)
    for path in configs:
        config = load_config(TrainConfig, path)
        assert config.optim.batch_size > 0, path
