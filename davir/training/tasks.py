"""What differs between methods inside the one training loop: model, batch fields, loss, generation, saving.

A task owns the model and the datasets; the loop (davir.training.loop) owns the optimisation. Tasks
register themselves under the `config.method` names they serve, as segment-anything's
`sam_model_registry` does for architectures:

    @register_task("davir")
    class DavirTask: ...

    task = build_task(config, accelerator)      # TASKS[config.method](config, accelerator)

A new method is one module (model + a task, or a lightweight captioner and its settings registered with
`davir.models.lightweight.registry.register_method`, which LightweightTask serves) plus one config; list a
task's module in TASK_MODULES so it is imported on demand.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Iterable

import torch
from accelerate import Accelerator

from davir.data.records import ChangePair
from davir.errors import DataError

# method name → task class; filled by @register_task when a task module is imported.
TASKS: dict[str, Callable[..., Any]] = {}
# Where the tasks live (imported lazily, so `import davir.training` stays light).
TASK_MODULES = ("davir.training.davir_task", "davir.training.lightweight_task")


def register_task(*methods: str):
    """Class decorator: `build_task` builds this task for every `config.method` in `methods`."""

    def decorate(cls):
        for method in methods:
            if method in TASKS and TASKS[method] is not cls:
                raise ValueError(f"method {method!r} is registered twice ({TASKS[method].__name__}, {cls.__name__})")
            TASKS[method] = cls
        return cls

    return decorate


# A task serving a family of methods that grows after it is imported (LightweightTask: every method registered
# with davir.models.lightweight.registry.register_method, a user's own included): (the family's names now, task).
TASK_FAMILIES: list[tuple[Callable[[], Iterable[str]], Callable[..., Any]]] = []


def register_task_family(names: Callable[[], Iterable[str]]):
    """Class decorator: `build_task` builds this task for every method `names()` lists when it is called."""

    def decorate(cls):
        TASK_FAMILIES.append((names, cls))
        return cls

    return decorate


def registered_methods() -> list[str]:
    for module in TASK_MODULES:
        importlib.import_module(module)
    return sorted(set(TASKS).union(*(names() for names, _ in TASK_FAMILIES)))


def task_class(method: str) -> Callable[..., Any]:
    """The task that trains `method`; a DataError listing the registered methods when none does."""
    methods = registered_methods()
    if method in TASKS:
        return TASKS[method]
    for names, cls in TASK_FAMILIES:
        if method in names():
            return cls
    raise DataError(f"method: no task is registered for {method!r}; choose from {', '.join(methods)}")


def build_task(config, accelerator: Accelerator):
    """The task registered for `config.method`, built on `config`."""
    return task_class(config.method)(config, accelerator)


def flat_scalars(obj: Any, prefix: str = "") -> dict[str, int | float | str | bool]:
    """Flatten a (dataclass) config to the scalar key/values TensorBoard's hparams accept."""
    data = dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj
    flat: dict[str, int | float | str | bool] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_scalars(value, f"{name}."))
        elif isinstance(value, (int, float, str, bool)):
            flat[name] = value
        elif value is not None:
            flat[name] = str(value)
    return flat


def move_to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def require_cached(pairs: list[ChangePair], has, *, what: str, command: str) -> None:
    """Refuse to start when a cache lacks pairs: computing them silently on the fly is not allowed."""
    missing = [p.pair_id for p in pairs if not has(p.pair_id)]
    if missing:
        raise DataError(f"{len(missing)} of {len(pairs)} pairs have no {what}, e.g. {missing[:3]}; run `{command}` first")
