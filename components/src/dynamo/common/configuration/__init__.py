"""Option declarations and the parser built from them.

configargparse patches ``argparse`` process-wide when imported, so it is imported only here.
"""

from .gc_options import gc_options
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
from .parser import DynamoArgParser, build_parser, parse_surface
from .values import Choice, FiniteFloat, Host, IntRange, Text, parse_bool_word

__all__ = [
    "Choice",
    "DynamoArgParser",
    "FiniteFloat",
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
    "parse_surface",
    "port_option",
    "seconds_option",
    "text_option",
]
