"""What differs between methods inside the one training loop: model, batch fields, loss, generation, saving.

A task owns the model and the datasets; the loop (davir.training.loop) owns the optimisation. Tasks
register themselves (`davir.registry.Registry`) under the `config.method` names they serve, as segment-anything's
`sam_model_registry` does for architectures:

    @register_task("davir")
    class DavirTask: ...

    task = build_task(config, accelerator)      # TASKS[config.method](config, accelerator)

A new method is one module (model + a task, or a lightweight captioner and its settings registered with
`davir.models.lightweight.registry.register_method`, which LightweightTask serves) plus one config; a built-in
task's module is named in the lazy table below, so it is imported on demand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch
from accelerate import Accelerator

from davir.data.caches import require_cached  # noqa: F401  (the tasks' import of it)
from davir.errors import DataError
from davir.registry import Registry

# method name → task class, filled by @register_task; the built-in tasks' modules are imported on first use.
TASKS: Registry[Callable[..., Any]] = Registry("method", error=DataError, lazy={"davir": "davir.training.davir_task"})
# A task serving a family of methods that grows after it is imported (LightweightTask: every method registered
# with davir.models.lightweight.registry.register_method, a user's own included): family → (its names now, task).
TASK_FAMILIES: Registry[tuple[Callable[[], Iterable[str]], Callable[..., Any]]] = Registry(
    "task family", error=DataError, lazy={"lightweight": "davir.training.lightweight_task"}
)
# Where the built-in tasks live (the lazy entries above).
TASK_MODULES = ("davir.training.davir_task", "davir.training.lightweight_task")


def register_task(*methods: str):
    """Class decorator: `build_task` builds this task for every `config.method` in `methods`."""

    def decorate(cls):
        for method in methods:
            TASKS.register(method, cls)  # a second, different class for a method is a ValueError naming both
        return cls

    return decorate


def register_task_family(family: str, names: Callable[[], Iterable[str]]):
    """Class decorator: `build_task` builds this task for every method `names()` lists when it is called."""

    def decorate(cls):
        TASK_FAMILIES.register(family, (names, cls))
        return cls

    return decorate


def registered_methods() -> list[str]:
    families = [names for _, (names, _cls) in TASK_FAMILIES.items()]  # imports the lazy families
    return sorted(set(TASKS.names()).union(*(names() for names in families)))


def task_class(method: str) -> Callable[..., Any]:
    """The task that trains `method`; a DataError listing the registered methods when none does."""
    if method in TASKS:
        return TASKS[method]
    for _, (names, cls) in TASK_FAMILIES.items():
        if method in names():
            return cls
    raise DataError(f"method: no task is registered for {method!r}; choose from {', '.join(registered_methods())}")


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
