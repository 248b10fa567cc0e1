"""Our launchers' configuration: what only they have (upstream Dynamo's refused names, the
prerequisites between options, discovery and drain options, the docs pages), on top of the GC
layer's option machinery (:mod:`dynamo_gc.configuration`), which is re-exported here so a
launcher imports its configuration from one place.
"""

from dynamo_gc.configuration import (
    Choice,
    DynamoArgParser,
    FiniteFloat,
    Host,
    IntRange,
    Option,
    Surface,
    Text,
    build_parser,
    choice_option,
    count_option,
    gc_options,
    host_option,
    milliseconds_option,
    parse_bool_word,
    port_option,
    seconds_option,
    text_option,
)

from .parser import parse_surface

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
