"""The optional parts and their extras (issue 53): `pip install davir` brings none of gradio, trl, wandb, mlflow or
trackio; each part that needs one stops with one line naming the extra of pyproject.toml that installs it."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest
import tomllib

from davir.config import ConfigError
from davir.errors import EXTRAS, DataError, MissingExtra, import_optional, install_hint
from davir.training import trackers

REPO = Path(__file__).resolve().parents[1]


def block(monkeypatch, package: str) -> None:
    """`package` (and every submodule of it already loaded) as if it were not installed."""
    for name in [name for name in sys.modules if name == package or name.startswith(package + ".")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)


def pins() -> dict[str, str]:
    """requirements.txt's and requirements-nodeps.txt's exact pins, by package name."""
    found = {}
    for name in ("requirements.txt", "requirements-nodeps.txt"):
        for line in (REPO / name).read_text().splitlines():
            match = re.match(r"([A-Za-z0-9_.-]+)(\[[^]]*\])?==([^\s#]+)", line)
            if match:
                found[match[1].lower()] = match[3]
    return found


def test_each_extra_requires_the_pinned_version_of_what_it_brings():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pinned = pins()
    for extra in ("app", "trl", "trackers"):
        for requirement in extras[extra]:
            name, floor = requirement.split(">=")
            assert pinned[name.lower()] == floor, f"davir[{extra}] asks {requirement}, requirements pin {pinned[name]}"
    assert extras["all"] == ["davir[app,trl,trackers]"]
    # every module import_optional names has its extra, and that extra installs the module's package
    distribution = {"gradio": "gradio", "trl": "trl", "wandb": "wandb", "mlflow": "mlflow-skinny", "trackio": "trackio"}
    assert set(EXTRAS) == set(distribution)
    for module, extra in EXTRAS.items():
        assert any(requirement.startswith(distribution[module] + ">=") for requirement in extras[extra]), module


@pytest.mark.parametrize(
    "module, needed_by, message",
    [
        ("gradio", "davir-app", "davir-app needs gradio: pip install 'davir[app]'"),
        (
            "trl.trainer.sft_trainer",
            "davir.integrations.trl",
            "davir.integrations.trl needs trl: pip install 'davir[trl]'",
        ),
    ],
)
def test_a_missing_optional_package_names_its_extra(monkeypatch, module, needed_by, message):
    block(monkeypatch, module.split(".")[0])
    with pytest.raises(MissingExtra) as raised:
        import_optional(module, needed_by=needed_by)
    assert str(raised.value) == message
    # a command's DataError (one line, status 2), an ImportError for code that imports davir's modules
    assert isinstance(raised.value, DataError) and isinstance(raised.value, ModuleNotFoundError)
    assert raised.value.name == module.split(".")[0]


def test_a_missing_dependency_of_an_optional_package_is_named_too(tmp_path, monkeypatch):
    """The package is there but something it imports is not: the same extra installs both."""
    (tmp_path / "davir_fake_app").mkdir()
    (tmp_path / "davir_fake_app" / "__init__.py").write_text("import davir_fake_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(EXTRAS, "davir_fake_app", "app")
    with pytest.raises(
        MissingExtra,
        match=r"^davir-app needs davir_fake_app, which cannot import "
        r"davir_fake_dependency: pip install 'davir\[app\]'$",
    ):
        import_optional("davir_fake_app", needed_by="davir-app")
    assert "davir_fake_app" not in sys.modules


def test_install_hint_groups_extras_and_names_other_packages():
    assert install_hint("wandb", "mlflow", "trl") == "pip install 'davir[trackers,trl]'"
    assert install_hint("tensorboard") == "pip install tensorboard"
    assert install_hint("trackio", "vllm") == "pip install 'davir[trackers]' vllm"


def test_davir_integrations_trl_without_trl_says_which_extra(monkeypatch):
    block(monkeypatch, "trl")
    monkeypatch.delitem(sys.modules, "davir.integrations.trl", raising=False)
    with pytest.raises(ImportError, match=r"^davir.integrations.trl needs trl: pip install 'davir\[trl\]'$"):
        importlib.import_module("davir.integrations.trl")


def test_the_app_modules_without_gradio_say_which_extra(monkeypatch):
    block(monkeypatch, "gradio")
    for name in ("davir.app.ui", "davir.app.uploads"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError, match=r"^davir-app needs gradio: pip install 'davir\[app\]'$"):
        importlib.import_module("davir.app.ui")


@pytest.mark.parametrize(
    "missing, message",
    [
        (["trackio"], "pip install 'davir[trackers]' (or pip install trackio; or remove it from run.trackers;"),
        (["tensorboard"], "pip install tensorboard (or remove it from run.trackers;"),
    ],
)
def test_a_missing_tracker_names_the_trackers_extra(monkeypatch, missing, message):
    monkeypatch.setattr(trackers, "available", lambda name: name not in missing)
    with pytest.raises(ConfigError) as raised:
        trackers.check_installed(missing)
    assert message in str(raised.value)


def test_davir_app_without_gradio_is_one_line_and_status_2(tmp_path, monkeypatch, capsys):
    """`davir-app` (its main, as the console script calls it) where gradio cannot be imported: the one line before
    any model is loaded (the checkpoint does not exist); --help still works. Gradio is imported only once the app
    has chosen its GRADIO_TEMP_DIR (davir.app.serve), which it reads at import."""
    from davir.cli.app import main

    block(monkeypatch, "gradio")
    for loaded in ("davir.app.serve", "davir.app.ui", "davir.app.uploads"):  # imported by an earlier test: afresh
        monkeypatch.delitem(sys.modules, loaded, raising=False)
    assert main(["--checkpoint", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == "error: davir-app needs gradio: pip install 'davir[app]'\n"
    with pytest.raises(SystemExit) as helped:
        main(["--help"])
    assert helped.value.code == 0 and "usage: davir-app" in capsys.readouterr().out
