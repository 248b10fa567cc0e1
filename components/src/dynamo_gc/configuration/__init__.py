"""Option declarations, value kinds and the parser built from them, for any program.

One :class:`~dynamo_gc.configuration.options.Option` per setting (flag, env var, kind, default,
help); the parser, the help text and the docs tables are derived from it. The two GC options
are declared once in :mod:`dynamo_gc.configuration.gc_options` and instantiated per surface;
:mod:`dynamo_gc.configuration.gc_surfaces` gives them, per kind of process, to a program that
wraps another one's command line (:func:`split_gc_args`, :func:`gc_settings_from_env`; with the
serving-time maintenance's options where the process can host it: :func:`split_surface_args`,
:func:`surface_settings_from_env`).

configargparse patches ``argparse`` process-wide when imported, so it is imported only in
:mod:`dynamo_gc.configuration.parser`.
"""

from .gc_options import GcSettings, gc_options
from .gc_surfaces import (
    FRONTEND_GC,
    VLLM_WORKER_GC,
    WORKER_GC,
    GcSurface,
    SurfaceSettings,
    gc_help,
    gc_settings_from_env,
    split_gc_args,
    split_surface_args,
    surface_settings_from_env,
)
from .options import (
    Option,
    Surface,
    choice_option,
    count_option,
    host_option,
    milliseconds_option,
    port_option,
    seconds_option,
    text_option,
)
from .parser import DynamoArgParser, build_parser, short_usage_error
from .values import Choice, FiniteFloat, Host, IntRange, Text, parse_bool_word

__all__ = [
    "FRONTEND_GC",
    "VLLM_WORKER_GC",
    "WORKER_GC",
    "Choice",
    "DynamoArgParser",
    "FiniteFloat",
    "GcSettings",
    "GcSurface",
    "Host",
    "IntRange",
    "Option",
    "Surface",
    "SurfaceSettings",
    "Text",
    "build_parser",
    "choice_option",
    "count_option",
    "gc_help",
    "gc_options",
    "gc_settings_from_env",
    "host_option",
    "milliseconds_option",
    "parse_bool_word",
    "port_option",
    "seconds_option",
    "short_usage_error",
    "split_gc_args",
    "split_surface_args",
    "surface_settings_from_env",
    "text_option",
]
