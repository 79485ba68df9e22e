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

    from davir.runs.config import TrainConfig

    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    assert any(p.name == "demo.yaml" for p in configs)
    for path in configs:
        config = load_config(TrainConfig, path)
        assert config.optim.batch_size > 0, path


# --- values read by the field's declared type (YAML 1.1 words stay words in text fields) ------------


@dataclass
class Typed:
    word: str = "x"
    mode: Literal["no", "yes", "bf16"] = "bf16"
    flag: bool = False
    count: int = 1
    rate: float = 0.5
    maybe: str | None = "set"
    count_or_none: int | None = None
    words: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


@pytest.mark.parametrize("source", ["yaml", "overrides"])
def test_values_follow_the_declared_type_in_files_and_overrides(tmp_path, source):
    values = {
        "word": "no",
        "mode": "no",
        "flag": "no",
        "count": "7",
        "rate": "1e-4",
        "maybe": "off",
        "count_or_none": "null",
        "words": "[yes, on, 007]",
        "extra": "{a: no}",
    }
    if source == "yaml":
        path = tmp_path / "c.yaml"
        path.write_text("".join(f"{key}: {value}\n" for key, value in values.items()))
        config = load_config(Typed, path)
    else:
        config = load_config(Typed, None, [f"{key}={value}" for key, value in values.items()])
    assert config == Typed(
        word="no",
        mode="no",
        flag=False,
        count=7,
        rate=1e-4,
        maybe="off",
        count_or_none=None,
        words=["yes", "on", "007"],
        extra={"a": False},
    )


@pytest.mark.parametrize(
    "text, expected", [("yes", True), ("on", True), ("true", True), ("off", False), ("false", False)]
)
def test_bool_fields_read_yaml_words(text, expected):
    assert load_config(Typed, None, [f"flag={text}"]).flag is expected


def test_text_fields_keep_quoted_and_numeric_text(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("word: 'yes'\nmode: \"yes\"\nmaybe: 1.10\n")
    config = load_config(Typed, path, ["count_or_none=3"])
    assert (config.word, config.mode, config.maybe, config.count_or_none) == ("yes", "yes", "1.10", 3)
    with pytest.raises(ConfigError, match=r"mode: 'No' is not one of \['no', 'yes', 'bf16'\]"):
        load_config(Typed, None, ["mode=No"])
    with pytest.raises(ConfigError, match="flag: expected true/false, got 'maybe'"):
        load_config(Typed, None, ["flag=maybe"])
    with pytest.raises(ConfigError, match="count: expected an integer, got 'no'"):
        load_config(Typed, None, ["count=no"])


def test_mixed_precision_no_is_accelerates_word(tmp_path):
    from davir.runs.config import TrainConfig

    assert load_config(TrainConfig, None, ["run.mixed_precision=no"]).run.mixed_precision == "no"
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  mixed_precision: no\n  tensorboard: off\n")
    config = load_config(TrainConfig, path)
    assert (config.run.mixed_precision, config.run.tensorboard) == ("no", False)


# --- 18.11 / 18.3: out-of-range values are one line naming the key, exit status 2 -------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.batch_size=0", "optim.batch_size: must be ≥ 1, got 0"),
        ("optim.lr=-1", "optim.lr: must be > 0, got -1"),
        ("optim.lr=0", "optim.lr: must be > 0, got 0"),
        ("optim.max_steps=-3", "optim.max_steps: must be ≥ 1, got -3"),
        ("optim.epochs=0", "optim.epochs: must be ≥ 1, got 0"),
        ("optim.gradient_accumulation_steps=0", "optim.gradient_accumulation_steps: must be ≥ 1, got 0"),
        ("optim.warmup_ratio=1.5", "optim.warmup_ratio: must be in [0, 1], got 1.5"),
        ("optim.max_grad_norm=-0.5", "optim.max_grad_norm: must be ≥ 0, got -0.5"),
        ("optim.weight_decay=-1", "optim.weight_decay: must be ≥ 0, got -1"),
        ("optim.betas=[0.9, 1.0]", "optim.betas[1]: must be in [0, 1), got 1"),
        ("run.keep_checkpoints=-1", "run.keep_checkpoints: must be ≥ 0, got -1"),
        ("run.num_beams=0", "run.num_beams: must be ≥ 1, got 0"),
        ("run.log_every=0", "run.log_every: must be ≥ 1, got 0"),
        ("run.seed=-1", "run.seed: must be in [0, 4294967296), got -1"),
        ("data.num_workers=-2", "data.num_workers: must be ≥ 0, got -2"),
        ("data.max_train_pairs=0", "data.max_train_pairs: must be ≥ 1, got 0"),
    ],
)
def test_train_refuses_out_of_range_values_naming_the_key(override, message, capsys, tmp_path):
    import train

    method = ["method=subtraction"] if override.startswith("lightweight.") else []  # davir takes no lightweight keys
    assert train.main([*method, override, f"run.output_dir={tmp_path / 'run'}"]) == 2
    assert capsys.readouterr().err.splitlines()[0] == f"config error: {message}"
    assert not (tmp_path / "run").exists()


def test_train_script_reports_a_bad_value_as_a_user_runs_it(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    completed = subprocess.run(
        [sys.executable, "train.py", "optim.batch_size=0", f"run.output_dir={tmp_path / 'run'}"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2
    assert completed.stderr.splitlines()[0] == "config error: optim.batch_size: must be ≥ 1, got 0"


def test_model_config_checks_name_the_key_too():
    from davir.runs.config import TrainConfig

    with pytest.raises(ConfigError, match=r"defaults.model.fac: FAC lambda_attn must be a finite number >= 0"):
        load_config(TrainConfig, None, ["model.fac.lambda_attn=-1"])


# --- non-finite numbers (inf, -inf, nan) are refused at load, naming the key ------------------------


@pytest.mark.parametrize("text", ["inf", "-inf", ".inf", "-.inf", "nan", ".nan"])
def test_non_finite_floats_are_refused_from_yaml_naming_the_key(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(f"rate: {text}\n")
    shown = str(float(text.replace(".", "")))  # YAML's .inf is Python's inf
    with pytest.raises(ConfigError, match=rf"^rate: must be a finite number, got {shown}$"):
        load_config(Typed, path)


@pytest.mark.parametrize(
    "override, key",
    [
        ("optim.lr=inf", "optim.lr"),
        ("optim.lr=-inf", "optim.lr"),
        ("optim.max_grad_norm=inf", "optim.max_grad_norm"),
        ("optim.betas=[0.9, inf]", "optim.betas[1]"),
        ("lightweight.dropout=-inf", "lightweight.dropout"),
        ("lightweight.decoder_init_std=inf", "lightweight.decoder_init_std"),  # an optional float field
    ],
)
def test_train_refuses_non_finite_overrides_naming_the_key(override, key, capsys, tmp_path):
    import train

    method = ["method=subtraction"] if override.startswith("lightweight.") else []  # davir takes no lightweight keys
    assert train.main([*method, override, f"run.output_dir={tmp_path / 'run'}"]) == 2
    value = override.split("=", 1)[1].strip("[]").split(", ")[-1]
    assert capsys.readouterr().err.splitlines()[0] == f"config error: {key}: must be a finite number, got {value}"
    assert not (tmp_path / "run").exists()


def test_data_workers_auto_is_four_on_a_gpu_and_none_on_a_cpu(monkeypatch):
    import torch

    from davir.runs.config import TrainConfig
    from davir.training import loop

    assert TrainConfig().data.num_workers == "auto"
    assert load_config(TrainConfig, None, ["data.num_workers=2"]).data.num_workers == 2
    assert load_config(TrainConfig, None, ["data.num_workers=auto"]).data.num_workers == "auto"
    with pytest.raises(ConfigError, match="num_workers"):
        load_config(TrainConfig, None, ["data.num_workers=-1"])
    with pytest.raises(ConfigError, match="num_workers"):
        load_config(TrainConfig, None, ["data.num_workers=many"])
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.setattr(loop.os, "cpu_count", lambda: 16)
    assert (loop.data_workers("auto", cpu), loop.data_workers("auto", gpu), loop.data_workers(3, gpu)) == (0, 4, 3)
    monkeypatch.setattr(loop.os, "cpu_count", lambda: 2)  # never more workers than the cores but one
    assert (loop.data_workers("auto", gpu), loop.data_workers(2, cpu)) == (1, 2)
