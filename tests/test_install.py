"""The package stands alone (issue 34): a wheel built from the repository, installed non-editable into a scratch
folder and run from elsewhere through its console scripts, trains with its shipped default config and captions
with its shipped tiny backbone — and records no git commit that is not davir's."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Package data and the repository's copies of it (for users and the Makefile): the package's is the source.
SHIPPED = {"configs/demo.yaml": "davir/configs/demo.yaml"}
ASSETS = [f"davir/assets/tiny_resnet/{name}" for name in ("backbone.pth", "head.pth", "pretrain_info.json")] + [
    f"davir/text/data/{name}" for name in ("wordnet-3.0-lexicon.txt.gz", "WORDNET_LICENSE")
]
PACKAGES = ("davir",)
# Copied into the source too, and left out of the wheel: the repository's entry to the jobs, like train.py.
ENTRIES = ("preprocess",)
# The console scripts the pipeline below does not run, or not with --help (davir-train's is 5-10 s of imports).
SCRIPTS = (
    ("davir-evaluate",),
    ("davir-caption",),
    ("davir-preprocess", "masks"),
    ("davir-data",),
    ("davir-export",),
    ("davir-app",),
)

# Loaded in every command the test starts (PYTHONPATH): drops the .venv's editable-install finder, which would
# otherwise serve any module missing from the wheel out of the repository, and records where each davir/preprocess
# module came from when the command exits.
GUARD = """
import atexit, json, os, sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]

def _record():
    files = {name: getattr(module, "__file__", None) for name, module in list(sys.modules.items())
             if name.split(".")[0] in ("davir", "preprocess")}
    with open(os.path.join(os.environ["DAVIR_MODULE_LOG"], f"{os.getpid()}.json"), "w") as handle:
        json.dump(files, handle)

atexit.register(_record)
"""


def git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


class Installed:
    def __init__(self, base: Path):
        self.base = base
        # The user's own project, a git repository, with davir installed inside it (`pip install --target`):
        # a davir that ran git in the folder above its package would record this repository's commit.
        self.project = base / "project"
        self.site = self.project / "site"
        self.work = self.project / "work"
        self.log = base / "module_log"
        for folder in (self.work, self.log, base / "guard"):
            folder.mkdir(parents=True)
        (base / "guard" / "sitecustomize.py").write_text(GUARD)
        git(self.project, "init", "-q")
        git(self.project, "commit", "-q", "--allow-empty", "-m", "the user's project")
        self.project_commit = git(self.project, "rev-parse", "HEAD")
        self.env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "GIT_"))}
        self.env.update(
            PYTHONPATH=f"{self.site}{os.pathsep}{base / 'guard'}",
            DAVIR_MODULE_LOG=str(self.log),
            PATH=f"{self.site / 'bin'}{os.pathsep}{os.environ['PATH']}",
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
        )

    def run(self, script: str, *args) -> subprocess.CompletedProcess:
        """An installed console script, in the work folder; it must succeed."""
        command = [str(self.site / "bin" / script), *map(str, args)]
        done = subprocess.run(command, cwd=self.work, env=self.env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(command)} → {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
        return done

    def check_modules_came_from_the_install(self) -> None:
        """Every davir/preprocess module the commands so far imported was the installed one."""
        logs = [json.loads(path.read_text()) for path in self.log.glob("*.json")]
        assert len(logs) >= 4 and max(map(len, logs)) > 30, "the guard recorded no command's imports"
        elsewhere = {
            name: file
            for log in logs
            for name, file in log.items()
            if file and not Path(file).is_relative_to(self.site)
        }
        assert not elsewhere, elsewhere


def pip(cwd: Path, *args) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "-q", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"pip {' '.join(map(str, args))}:\n{done.stdout}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    """The wheel of a copy of the sources (no build/ or egg-info written into the repository), installed."""
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in PACKAGES + ENTRIES:
        shutil.copytree(REPO / package, source / package, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    pip(base, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", base / "wheels", source)
    [wheel] = (base / "wheels").glob("davir-*.whl")
    target = Installed(base)
    pip(base, "install", "--no-deps", "--no-index", "--target", target.site, wheel)
    target.wheel, target.source = wheel, source
    return target


@pytest.fixture(scope="module")
def data(installed) -> Path:
    """A small synthetic set and three pairs of its images as a user's folder, made by the installed commands."""
    installed.run(
        "davir-data",
        "synth",
        "--out",
        "data",
        "--scenes",
        "16",
        "--seed",
        "4",
        "--width",
        "96",
        "--height",
        "72",
        "--workers",
        "1",
    )
    work = installed.work
    for side in ("before", "after"):
        (work / "pairs" / side).mkdir(parents=True)
    for i, image in enumerate(sorted((work / "data" / "images").iterdir())[:3]):
        shutil.copy(image, work / "pairs" / "before" / f"p{i}.png")
        shutil.copy(
            work / "data" / "sc_images" / image.name.replace("default", "semantic"),
            work / "pairs" / "after" / f"p{i}.png",
        )
    return work / "data"


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_repository_copies_equal_the_package_data():
    differ = [
        f"{copy} differs from {source}"
        for copy, source in SHIPPED.items()
        if not filecmp.cmp(REPO / copy, REPO / source, shallow=False)
    ]
    assert not differ, "edit the package's file and copy it over the repository's:\n" + "\n".join(differ)


# A wheel build and a dozen fresh Pythons: about a minute on 2 busy cores.
@pytest.mark.slow
def test_the_wheel_holds_every_module_and_nothing_of_the_checkout(installed):
    names = zipfile.ZipFile(installed.wheel).namelist()
    sources = {
        path.relative_to(installed.source).as_posix()
        for package in PACKAGES
        for path in (installed.source / package).rglob("*.py")
    }
    missing = (sources | set(SHIPPED.values()) | set(ASSETS)) - set(names)
    assert not missing, f"left out of the wheel (a folder without __init__.py? package-data?): {sorted(missing)}"
    top = {name.split("/")[0] for name in names}
    assert top == {"davir", "davir-0.1.0.dist-info"}, top  # no preprocess/, tests/, outputs/, configs/, assets/
    assert not [name for name in names if set(name.split("/")) & {"tests", "outputs", "__pycache__"}]
    installed_top = {path.name for path in installed.site.iterdir()}
    assert installed_top == {"bin", "davir", "davir-0.1.0.dist-info"}, installed_top
    for script in SCRIPTS:
        assert "usage:" in installed.run(*script, "--help").stdout
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import davir; print(davir.__file__)\n"
            "try:\n    import preprocess\nexcept ModuleNotFoundError:\n    print('no-preprocess')",
        ],
        cwd=installed.work,
        env=installed.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert Path(shown[0]).parent.parent == installed.site and shown[1:] == ["no-preprocess"], shown


@pytest.mark.parametrize(
    "module, usage",
    [
        ("preprocess", "usage: python -m preprocess masks"),
        ("davir.data", "usage: python -m davir.data"),
        ("davir.pretrain_tiny", "usage: python -m davir.pretrain_tiny"),
    ],
)
def test_the_entries_of_the_repository_still_run(module, usage):
    """`python -m preprocess …` (the Makefile, docs/cluster.md's `accelerate launch -m preprocess`) from the repository
    root, and the `python -m` of the moved command lines, reach their parsers."""
    argv = ["masks", "--help"] if module == "preprocess" else ["--help"]
    done = subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0 and done.stdout.startswith(usage), (done.stdout[:300], done.stderr[-2000:])


def test_the_packages_found_for_the_wheel_are_davir_only():
    """No top-level `preprocess` (or any other name) beside davir in site-packages: the jobs are davir.jobs."""
    import tomllib
    from setuptools import find_packages

    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = find_packages(where=REPO, include=find["include"], exclude=find.get("exclude", ()))
    assert "davir.jobs" in found and "davir.cli" in found, found
    assert {name.split(".")[0] for name in found} == {"davir"}, sorted(found)
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["davir-preprocess"] == "davir.cli.preprocess:main"
    assert all(target.startswith("davir.") for target in scripts.values()), scripts


@pytest.mark.slow
def test_an_installed_davir_trains_and_captions_from_another_folder(installed, data):
    installed.run(
        "davir-preprocess",
        "masks",
        "--format",
        "clevr_change",
        "--root",
        "data",
        "--split",
        "train",
        "--out",
        "masks",
        "--limit",
        "4",
        "--workers",
        "1",
    )
    # No --config: the shipped default (the demo's), its data and tiny InstructBLIP (not shipped: 8 MB) overridden.
    installed.run(
        "davir-train",
        "data.root=data",
        "data.masks=masks",
        "data.entities=null",
        "model.fac.lambda_attn=0",
        "model.epc.use_entities=false",
        f"model.pretrained={REPO / 'assets' / 'tiny_instructblip'}",
        "optim.batch_size=4",
        "optim.max_steps=1",
        "run.val_max_pairs=2",
        "run.eval_every=0",
        "run.tensorboard=false",
        "run.output_dir=runs/tiny",
    )
    run_info = json.loads((installed.work / "runs" / "tiny" / "run_info.json").read_text())
    # Not the commit of the user's repository around the install and the current folder: davir's is unknown.
    assert run_info["git"] == {"commit": None, "dirty": None}, (run_info["git"], installed.project_commit)
    out = installed.work / "captions.jsonl"
    installed.run(
        "davir-caption",
        "--checkpoint",
        "runs/tiny",
        "--pairs",
        "pairs",
        "--out",
        out,
        "--workers",
        "0",
        "--batch-size",
        "2",
        "--quiet",
    )
    rows = rows_of(out)
    assert [row["id"] for row in rows] == ["p0", "p1", "p2"]
    assert all(row["error"] is None and row["caption"].strip() for row in rows), rows
    installed.check_modules_came_from_the_install()


@pytest.mark.slow
def test_a_lightweight_run_finds_the_shipped_backbone_when_installed(installed, data):
    backbone = REPO / "davir" / "assets" / "tiny_resnet" / "backbone.pth"
    installed.run(
        "davir-preprocess",
        "features",
        "--format",
        "clevr_change",
        "--root",
        "data",
        "--split",
        "train",
        "--out",
        "features",
        "--weights",
        backbone,
        "--workers",
        "0",
        "--no-progress",
    )
    installed.run(
        "davir-train",
        "--config",
        REPO / "configs" / "subtraction_demo.yaml",
        "data.root=data",
        "data.features=features",
        "data.val_split=train",
        "optim.max_steps=2",
        "optim.batch_size=4",
        "run.eval_every=0",
        "run.val_max_pairs=2",
        "run.output_dir=runs/sub",
    )
    out = installed.work / "lightweight.jsonl"
    # New pairs need the backbone the features came from: the installed copy is found by its hash, no option.
    installed.run(
        "davir-caption", "--checkpoint", "runs/sub", "--pairs", "pairs", "--out", out, "--workers", "0", "--quiet"
    )
    rows = rows_of(out)
    assert [row["id"] for row in rows] == ["p0", "p1", "p2"] and all(row["error"] is None for row in rows), rows
    installed.check_modules_came_from_the_install()
