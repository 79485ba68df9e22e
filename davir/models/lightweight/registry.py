"""The one list of lightweight methods (a `davir.registry.Registry`): name → captioner + settings + paper values.

A method's module registers its captioner where it defines it, with everything the method owns:

    @register_method("scorer", ScorerSettings, rows=PAPER_ROWS, switches=SWITCHES)
    class ScorerCaptioner(LightweightCaptioner): ...

`rows` are the per-dataset values its paper (or released code) reports ({dataset: {key: value}}, see
`config.paper_settings`); `switches` the printed values of the switches it reads (paper_values.py). The
registration also makes the settings class the one `LightweightConfig(method=name, ...)` builds, and refuses a
key of another method's settings there (one line naming whose it is).

The package (davir.models.lightweight) imports every method module, so `METHODS` is complete once it is
imported; the trainer's task (davir.training.lightweight_task), the config loader and the model loader all
read the names from here. A method registered later (a user's module) is served the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from davir.registry import Registry


@dataclass(frozen=True)
class LightweightMethod:
    name: str
    captioner: type  # a LightweightCaptioner (config.py, which base.py imports, imports this module: no import back)
    settings: type  # its LightweightConfig subclass
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # dataset → its paper's values (paper_settings)
    switches: tuple = ()  # its paper_values.Switch entries (the shared ones every method reads are added there)


# in registration order: subtraction, scorer, dirl, rdd, cheer
METHODS: Registry[LightweightMethod] = Registry("lightweight method", error=ValueError)


def register_method(name: str, settings: type, *, rows: dict | None = None, switches: tuple = ()):
    """Class decorator of a captioner: `name` builds it from `settings` (which learns its name here)."""

    def decorate(captioner: type) -> type:
        if name in METHODS:
            raise ValueError(
                f"lightweight method {name!r} is registered twice ({METHODS[name].captioner.__name__}, "
                f"{captioner.__name__})"
            )
        if any(spec.settings is settings for _, spec in METHODS.items()):
            raise ValueError(f"{settings.__name__} already belongs to another method; give {name} its own class")
        settings.bind_method(name)  # LightweightConfig(method=name) builds it; other methods' keys refused
        owned = tuple(switch if switch.methods else switch.owned_by(name) for switch in switches)
        METHODS.register(name, LightweightMethod(name, captioner, settings, dict(rows or {}), owned))
        return captioner

    return decorate


def method_names() -> tuple[str, ...]:
    return METHODS.names()


def get_method(name: str) -> LightweightMethod:
    return METHODS[name]
