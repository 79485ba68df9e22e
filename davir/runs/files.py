"""The files of a run folder and of its saved models, read with their keys checked.

    RUN/config.yaml            the TrainConfig the run trains with    read_run_config
    RUN/run_info.json          seed, cwd, resume history, finished    read_run_info
    RUN/best|last/selection.json   the step the model was saved at    read_selection
    MODEL/lightweight_config.json  a lightweight model's files        read_lightweight_info
    (MODEL/davir_config.json: davir.models.vlm.checkpoint.read_davir_config)

Every loader (evaluate.py --checkpoint, caption.py, train.py --resume) reads them here, so a damaged or
hand-edited file is one DataError naming the file and the key (docs/errors.md), not a KeyError or
AttributeError from deep inside a loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from davir.config import ConfigError, from_dict, load_yaml_text, plain
from davir.errors import DataError
from davir.io import read_json

RUN_CONFIG = "config.yaml"
RUN_INFO = "run_info.json"
SELECTION = "selection.json"
LIGHTWEIGHT_CONFIG = "lightweight_config.json"

# What training (and evaluate.py, a sweep) writes into a run folder: all that run.overwrite may delete.
RUN_ENTRIES = frozenset(
    {RUN_CONFIG, RUN_INFO, "train_log.jsonl", "best", "last", "checkpoints", "logs", "val", "eval", "sweep_cell.json"}
)
_OWN_LEFTOVERS = (".tmp", ".staging", ".old")  # a killed run's temporaries: .NAME.<pid>.<random>.tmp, .best.staging


def not_run_entries(run_dir: str | Path) -> list[str]:
    """The names in `run_dir` that no run wrote (the user's files beside a run), sorted."""
    return sorted(
        entry.name
        for entry in Path(run_dir).iterdir()
        if entry.name not in RUN_ENTRIES and not (entry.name.startswith(".") and entry.name.endswith(_OWN_LEFTOVERS))
    )


_MISSING = object()
_NUMBER = (int, float)


def _type_names(types: tuple) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true/false", list: "a list",
             dict: "a mapping", type(None): "null"}
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def _lookup(data: dict, dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def check_keys(data: Any, path: Path, schema: dict[str, tuple], required: tuple[str, ...] = (), *,
               hint: str = "") -> dict:
    """`data` must be a JSON/YAML object whose dotted keys in `schema` have one of the listed types (when
    present) and whose `required` keys are present; otherwise a DataError naming `path` and the key."""
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected an object of keys, got {type(data).__name__}")
    for key in required:
        if _lookup(data, key) in (_MISSING, None):
            raise DataError(f"{path}: missing key '{key}'" + (f"; {hint}" if hint else ""))
    for key, types in schema.items():
        value = _lookup(data, key)
        if value is _MISSING:
            continue
        is_bool = isinstance(value, bool)
        if not isinstance(value, types) or (is_bool and bool not in types):  # True is an int to Python
            raise DataError(f"{path}: key '{key}' must be {_type_names(types)}, got {value!r}")
    return data


def read_run_config(run_dir_or_file: str | Path, *, required: tuple[str, ...] = (), hint: str = "") -> dict:
    """A run's config.yaml as the plain mapping it records (paths as typed), checked against TrainConfig:
    every key known, every value of its type and range. `required`: dotted keys that must be set."""
    from davir.runs.config import TrainConfig

    path = Path(run_dir_or_file)
    path = path / RUN_CONFIG if path.is_dir() else path
    try:
        loaded = load_yaml_text(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise DataError(f"{path}: not a readable run config ({error})") from error
    raw = plain(loaded) if loaded is not None else {}
    check_keys(raw, path, {"data": (dict,), "run": (dict,), "model": (dict,), "optim": (dict,)}, required, hint=hint)
    try:
        from_dict(TrainConfig, loaded or {}, where=str(path))
    except ConfigError as error:
        message = str(error)
        raise DataError(message if message.startswith(str(path)) else f"{path}: {message}") from None
    return raw


RUN_INFO_KEYS = {"cwd": (str,), "seed": (int,), "command": (list,), "resumed_from": (str, type(None)),
                 "resume_changes": (list,), "max_steps": (int,), "finished": (bool,), "final_step": (int,),
                 "compute": (dict,)}


def read_run_info(run_dir: str | Path) -> dict | None:
    """run_info.json of a run folder (None when it has none: a run of an older version, or a bare model)."""
    path = Path(run_dir) / RUN_INFO
    if not path.is_file():
        return None
    info = check_keys(read_json(path), path, RUN_INFO_KEYS)
    for change in info.get("resume_changes", []):
        check_keys(change, path, {"step": (int,), "key": (str,)}, ("step", "key"))
    return info


def read_selection(model_dir: str | Path) -> dict | None:
    """selection.json of a saved best/ or last/: the step it was saved at (None for a folder without one)."""
    path = Path(model_dir) / SELECTION
    if not path.is_file():
        return None
    return check_keys(read_json(path), path, {"step": (int,), "metric": (str,), "score": _NUMBER + (type(None),)},
                      ("step",))


LIGHTWEIGHT_KEYS = {"method": (str,), "weights": (str,), "vocabulary": (str,), "entity_phrases": (str, type(None)),
                    "features": (dict, type(None)), "features.weights": (str, type(None))}


def read_lightweight_info(model_dir: str | Path) -> dict:
    """lightweight_config.json of a saved lightweight model: its method and the names of its other files."""
    from davir.models.lightweight.config import METHOD_NAMES

    path = Path(model_dir) / LIGHTWEIGHT_CONFIG
    info = check_keys(read_json(path), path, LIGHTWEIGHT_KEYS, ("method",))
    if info["method"] not in METHOD_NAMES:
        raise DataError(f"{path}: key 'method' is {info['method']!r}, not one of {list(METHOD_NAMES)}")
    for key in ("weights", "vocabulary", "entity_phrases"):
        name = info.get(key)
        if isinstance(name, str) and (Path(name).is_absolute() or ".." in Path(name).parts):
            raise DataError(f"{path}: key '{key}' must name a file inside {Path(model_dir)}, got {name!r}")
    return info


def saved_model_state(model_dir: str | Path, run_dir: str | Path | None) -> dict:
    """Which saved model of its run `model_dir` is (best/last), the step it was saved at, and whether the run
    had finished training: run_info.json's `finished` marker, or for runs of older versions, a `last/`
    (written only when training ends)."""
    model_dir = Path(model_dir)
    selection = read_selection(model_dir)
    state: dict = {"checkpoint_folder": None, "checkpoint_step": selection["step"] if selection else None,
                   "run_finished": None, "run_max_steps": None}
    if run_dir is None:
        return state
    run_dir = Path(run_dir)
    if model_dir.resolve().parent == run_dir.resolve():
        state["checkpoint_folder"] = model_dir.name
    info = read_run_info(run_dir) or {}
    state["run_max_steps"] = info.get("max_steps")
    state["run_finished"] = info["finished"] if "finished" in info else (run_dir / "last" / SELECTION).is_file()
    return state


def unfinished_run_note(state: dict, run_dir: str | Path) -> str | None:
    """The `note:` evaluate.py prints when the run of the model it scores is still training (or was stopped)."""
    if state["run_finished"] is not False:
        return None
    folder = f"{state['checkpoint_folder']}/" if state["checkpoint_folder"] else "the model"
    of_steps = f" of {state['run_max_steps']}" if state["run_max_steps"] else ""
    step = f"step {state['checkpoint_step']}{of_steps}" if state["checkpoint_step"] is not None else "an unknown step"
    return (f"the run {run_dir} has not finished training (no final marker in {RUN_INFO}); {folder} is from "
            f"{step}, so these scores are not the run's final result")
