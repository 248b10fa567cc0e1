"""From a parse to a typed, frozen configuration: one field per option, nothing else.

Each launcher's configuration is a frozen dataclass whose fields are exactly the ``dest`` of the
options its command line declares (the ``Option`` declarations stay the single source of flag,
env var, help and docs). :func:`typed_config` builds it from argparse's namespace and refuses a
namespace and a dataclass that disagree, so an option cannot be parsed and then silently not
read, nor a field exist that no option fills. The result is a value: code reads it by attribute
and never writes to it; what start-up derives from it (an opened discovery store, a resolved
class, engine arguments) is built by the launcher and passed on, not stored here.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def typed_config(cls: type[T], parsed: argparse.Namespace, **extra: Any) -> T:
    """``cls`` from the parsed values (plus ``extra``, the parse's own results such as the
    arguments it left for another parser)."""
    values = {**vars(parsed), **extra}
    fields = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unread = sorted(values.keys() - fields)
    unfilled = sorted(fields - values.keys())
    if unread or unfilled:
        raise TypeError(
            f"{cls.__name__} and its options disagree: parsed but not in the configuration "
            f"{unread}; in the configuration but parsed by no option {unfilled}"
        )
    return cls(**values)


def option_fields(cls: type) -> set[str]:
    """The fields of a configuration class (for the test that holds it to its options)."""
    return {field.name for field in dataclasses.fields(cls)}
