"""The one list of lightweight methods: name → captioner class + settings class, each registered once.

A method's module registers its captioner where it defines it:

    @register_method("scorer", ScorerSettings)
    class ScorerCaptioner(LightweightCaptioner): ...

The package (davir.models.lightweight) imports every method module, so `METHODS` is complete once it is
imported; the trainer's task (davir.training.lightweight_task), the config loader and the model loader all
read the names from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LightweightMethod:
    name: str
    captioner: type  # a LightweightCaptioner (config.py, which base.py imports, imports this module: no import back)
    settings: type  # its LightweightConfig subclass


METHODS: dict[str, LightweightMethod] = {}  # in registration order: subtraction, scorer, dirl, rdd, cheer


def register_method(name: str, settings: type):
    """Class decorator of a captioner: `name` builds it from `settings` (which learns its name here)."""

    def decorate(captioner: type) -> type:
        if name in METHODS:
            raise ValueError(f"lightweight method {name!r} is registered twice ({METHODS[name].captioner.__name__}, "
                             f"{captioner.__name__})")
        if any(spec.settings is settings for spec in METHODS.values()):
            raise ValueError(f"{settings.__name__} already belongs to another method; give {name} its own class")
        settings.method = name
        METHODS[name] = LightweightMethod(name, captioner, settings)
        return captioner

    return decorate


def method_names() -> tuple[str, ...]:
    return tuple(METHODS)


def get_method(name: str) -> LightweightMethod:
    if name not in METHODS:
        raise ValueError(f"unknown lightweight method {name!r}; choose from {', '.join(METHODS)}")
    return METHODS[name]
