"""The frontend's bounds on rendering peers' chat templates (:mod:`.template_sandbox`)."""

from __future__ import annotations

from dynamo.common.configuration import count_option, seconds_option
from dynamo.frontend.processors.template_sandbox import (
    DEFAULT_MEMORY_MB,
    DEFAULT_PROCESSES,
    DEFAULT_TIMEOUT_S,
)

TEMPLATE_PROCESSES = count_option(
    "dyn-template-processes",
    "DYN_TEMPLATE_PROCESSES",
    DEFAULT_PROCESSES,
    (
        "Render the models' chat templates (a peer's code, whichever --dyn-chat-processor) in N "
        "processes the frontend bounds in time and memory and replaces after a breach; one "
        "model uses at most N - 1 of them at once (all, when N is 1), so a slow template leaves "
        "the others to every other model. 0: render on the frontend's threads, unbounded "
        "(docs/security.md)"
    ),
    low=0,
    high=256,
)

TEMPLATE_TIMEOUT = seconds_option(
    "dyn-template-timeout",
    "DYN_TEMPLATE_TIMEOUT",
    DEFAULT_TIMEOUT_S,
    (
        "Longest a chat template may render one request (and longest a request waits for a "
        "render process): past it the request is a 503 naming the model (code "
        "chat_template_limit) and the process is replaced"
    ),
    minimum=0.001,
    maximum=3600.0,
)

TEMPLATE_MEMORY_MB = count_option(
    "dyn-template-memory-mb",
    "DYN_TEMPLATE_MEMORY_MB",
    DEFAULT_MEMORY_MB,
    (
        "Memory a render process may take beyond what it holds once started (its address "
        "space is limited, RLIMIT_AS): a render that needs more is a 503 naming the model and "
        "the process is replaced"
    ),
    low=16,
    high=1024 * 1024,
    metavar="MIB",
)

TEMPLATE_OPTIONS = [TEMPLATE_PROCESSES, TEMPLATE_TIMEOUT, TEMPLATE_MEMORY_MB]
