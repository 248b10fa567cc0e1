"""Option declarations, value kinds and the parser built from them, for any program.

One :class:`~dynamo_gc.configuration.options.Option` per setting (flag, env var, kind, default,
help); the parser, the help text and the docs tables are derived from it. The two GC options
are declared once in :mod:`dynamo_gc.configuration.gc_options` and instantiated per surface.

configargparse patches ``argparse`` process-wide when imported, so it is imported only in
:mod:`dynamo_gc.configuration.parser`.
"""

from .gc_options import GcSettings, gc_options
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
    "Choice",
    "DynamoArgParser",
    "FiniteFloat",
    "GcSettings",
    "Host",
    "IntRange",
    "Option",
    "Surface",
    "Text",
    "build_parser",
    "choice_option",
    "count_option",
    "gc_options",
    "host_option",
    "milliseconds_option",
    "parse_bool_word",
    "port_option",
    "seconds_option",
    "short_usage_error",
    "text_option",
]
