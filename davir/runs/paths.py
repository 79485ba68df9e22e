"""A run folder or a saved model folder: which is which, the decoding it was selected with, and where the
paths it recorded are, from any working directory. The one place captioning and evaluation learn this.

    run = RunPaths.of("runs/demo")             # the run's best/ (else last/), its config and run_info.json
    run.lightweight                            # a subtraction/SCORER/DIRL/RDD/CHEER model, else DAVIR
    run.resolve(run.data.get("masks"), what="mask cache (data.masks)", flag="--masks-from")

How the training folder is recovered: docs/recipes.md, "Run folders from anywhere".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from davir.errors import DataError
from davir.runs.files import LIGHTWEIGHT_CONFIG, RUN_CONFIG, read_run_config, read_run_info

DAVIR_CONFIG = "davir_config.json"
EXPORT_FILE = "davir_export.json"  # davir.export.layout.EXPORT_FILE (runs/ imports nothing of export/)


def _is_model_dir(path: Path) -> bool:
    return (path / DAVIR_CONFIG).is_file() or (path / LIGHTWEIGHT_CONFIG).is_file()


def resolve_model_dir(path: str | Path) -> Path:
    """A run folder (→ its best/, else last/) or a saved model folder itself (the path as given, not resolved)."""
    path = Path(path)
    if _is_model_dir(path):
        return path
    for name in ("best", "last"):
        if _is_model_dir(path / name):
            return path / name
    raise DataError(f"{path} is neither a saved model (davir_config.json) nor a run folder with best/ or last/")


def run_dir_of(model_dir: Path) -> Path | None:
    """The run folder a saved model belongs to (holding config.yaml), if any."""
    for candidate in (model_dir, model_dir.parent):
        if (candidate / RUN_CONFIG).is_file():
            return candidate
    return None


def run_decoding(run_dir: str | Path | None, *, num_beams: int | None = None,
                 max_new_tokens: int | None = None) -> dict:
    """The decoding a run selected its `best/` with (its config's `run.num_beams` / `run.max_new_tokens`),
    overridden by any value given here; what `evaluate.py --checkpoint` and `caption.py` use by default.

    ``run_dir`` is a run folder (holding config.yaml) or a model folder inside one (best/, last/); None or a
    folder without a run config gives the TrainConfig defaults. Returns ``{"num_beams", "max_new_tokens",
    "source"}``, source naming where each value came from (for metrics.json)."""
    from davir.runs.config import RunConfig  # the defaults, as read_run_config's schema (it imports torch: only when read)

    defaults = RunConfig()
    settings: dict = {}
    config_file = None
    for candidate in ((Path(run_dir), Path(run_dir).parent) if run_dir is not None else ()):
        if (candidate / RUN_CONFIG).is_file():
            config_file = candidate / RUN_CONFIG
            break
    if config_file is not None:  # checked: run.num_beams / max_new_tokens are integers ≥ 1 if present
        settings = read_run_config(config_file).get("run") or {}
    decoding, source = {}, {}
    for key, given in (("num_beams", num_beams), ("max_new_tokens", max_new_tokens)):
        if given is not None:
            decoding[key], source[key] = int(given), "command line"
        elif key in settings:
            decoding[key], source[key] = int(settings[key]), str(config_file)
        else:
            decoding[key], source[key] = getattr(defaults, key), "TrainConfig default"
        if decoding[key] < 1:
            raise DataError(f"{key} must be >= 1, got {decoding[key]} (from {source[key]})")
    return {**decoding, "source": source}


@dataclass
class RunPaths:
    model_dir: Path                 # the saved model folder (a run's best/ or last/, or a model folder), absolute
    run_dir: Path | None            # the run folder holding config.yaml, if any
    config: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # run_info.json ({} for a run without one)

    @classmethod
    def of(cls, checkpoint: str | Path) -> "RunPaths":
        model_dir = resolve_model_dir(checkpoint).resolve()
        run_dir = run_dir_of(model_dir)
        if run_dir is None:
            return cls(model_dir, None)
        return cls(model_dir, run_dir, read_run_config(run_dir), read_run_info(run_dir) or {})

    @property
    def data(self) -> dict:
        return dict(self.config.get("data") or {})

    @property
    def lightweight(self) -> bool:
        """A subtraction/SCORER/DIRL/RDD/CHEER model (lightweight_config.json), else a DAVIR one."""
        return (self.model_dir / LIGHTWEIGHT_CONFIG).is_file()

    @property
    def exported(self) -> bool:
        """A folder `davir-export` wrote (davir_export.json): a model with its own config.yaml and preprocessing."""
        return (self.model_dir / EXPORT_FILE).is_file()

    def bases(self) -> list[Path]:
        """Folders a relative recorded path may be relative to: the training folder (from `run.output_dir`,
        then run_info.json's `cwd`), then the current folder."""
        bases = []
        if self.exported:  # an exported folder (davir.export): the paths its config.yaml records are its own files
            bases.append(self.model_dir)
        output_dir = (self.config.get("run") or {}).get("output_dir")
        if self.run_dir is not None and output_dir and not Path(output_dir).is_absolute():
            parts = Path(output_dir).parts
            run_dir = self.run_dir.resolve()
            if run_dir.parts[-len(parts):] == parts:
                bases.append(run_dir.parents[len(parts) - 1])
        recorded_cwd = self.info.get("cwd")  # checked when read; absent in runs of older versions
        if recorded_cwd and Path(recorded_cwd).is_dir():
            bases.append(Path(recorded_cwd))
        bases.append(Path.cwd())
        return bases

    def candidates(self, recorded: str | Path) -> list[Path]:
        """Where a recorded path may be: itself if absolute, else under each of `bases()`, in that order."""
        path = Path(recorded).expanduser()
        return [path] if path.is_absolute() else [base / path for base in self.bases()]

    def find(self, recorded: str | Path) -> Path | None:
        """The first existing candidate of a recorded path, made absolute; None if none exists."""
        return next((c.resolve() for c in self.candidates(recorded) if c.exists()), None)

    def resolve(self, recorded: str | Path | None, *, what: str, flag: str | None) -> Path | None:
        """The existing absolute path of a recorded `what`; None for None. Found nowhere: a DataError naming
        `flag`, or with `flag=None` (a command without one) the path as recorded, for its reader to name."""
        if recorded is None or str(recorded) == "":
            return None
        found = self.find(recorded)
        if found is not None:
            return found
        if flag is None:
            return Path(recorded)
        looked = ", ".join(str(c) for c in dict.fromkeys(self.candidates(recorded)))
        raise DataError(f"the {what} recorded by {self.run_dir or self.model_dir} is not found: {recorded} "
                        f"(looked at {looked}); the run or its data moved: pass {flag} PATH")
