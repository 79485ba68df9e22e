"""Where a trained run's recorded paths are, from any working directory.

A run's `config.yaml` records its data caches (`data.masks`, `data.entities`, `data.features`) and the
model its base InstructBLIP folder (`model.pretrained`) as the user typed them, often relative to the
folder training was started from. That folder is recovered from the run itself: the run was written to
`run.output_dir`, so `/abs/work/runs/demo` recorded as `runs/demo` means training ran in `/abs/work`; and
`run_info.json` records the training folder (`cwd`), which also covers an absolute `run.output_dir`.
A run copied to another machine, where neither exists, falls back to the current folder, then to an error
naming the flag to pass.

    run = RunPaths.of("/abs/work/runs/demo")
    run.resolve(run.data.get("masks"), what="mask cache (data.masks)", flag="--masks-from")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from davir.data.records import DataError
from davir.inference.davir_generation import resolve_model_dir, run_dir_of
from davir.runs.files import read_run_config, read_run_info


@dataclass
class RunPaths:
    model_dir: Path                 # the saved model folder (a run's best/ or last/, or a model folder)
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

    def bases(self) -> list[Path]:
        """Folders a relative recorded path may be relative to: the training folder (from `run.output_dir`,
        then run_info.json's `cwd`), then the current folder."""
        bases = []
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

    def resolve(self, recorded: str | Path | None, *, what: str, flag: str) -> Path | None:
        """The existing absolute path of a recorded `what`; None for None; a DataError naming `flag` otherwise."""
        if recorded is None or str(recorded) == "":
            return None
        found = self.find(recorded)
        if found is not None:
            return found
        looked = ", ".join(str(c) for c in dict.fromkeys(self.candidates(recorded)))
        raise DataError(f"the {what} recorded by {self.run_dir or self.model_dir} is not found: {recorded} "
                        f"(looked at {looked}); the run or its data moved: pass {flag} PATH")
