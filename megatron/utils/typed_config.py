"""Typed configs from parsed flags: a frozen dataclass whose field names are argparse dests,
filled from a validated ``argparse.Namespace`` with no defaults (megatron-core's
``TransformerConfig`` and ``OptimizerConfig`` are filled the same way). A leaf: imports only
megatron/errors.py (the lowest leaf, which imports nothing of the project)."""
import dataclasses
from typing import Type, TypeVar

from megatron.errors import ConfigError

T = TypeVar("T")


def config_from_args(cls: Type[T], args, **derived) -> T:
    """``cls(**{field: args.<field>})`` for every init field of the dataclass ``cls``; ``derived``
    gives fields that are not argparse dests (objects validation or start-up derived). A field
    missing from both is a :class:`ConfigError` naming the fields and the config, never a silent
    default: a namespace that did not go through ``validate_args`` fails here, loudly."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    missing = [n for n in names if n not in derived and not hasattr(args, n)]
    if missing:
        raise ConfigError(f"{cls.__name__} needs {', '.join(missing)}, which the parsed flags "
                          "lack (a namespace that was not built by megatron.config.arguments' "
                          "parse_args/validate_args?)")
    return cls(**{n: derived[n] if n in derived else getattr(args, n) for n in names})
