"""What the worker checks before anything starts, and how a start-up step reports an operator's
mistake.

Every message names the option (flag and env var) and the value, so the operator knows what to
change, and none is a traceback:

* :func:`check_paths` runs in ``main()`` before the event loop: the discovery directory must be
  creatable and writable, the self-benchmark output file creatable, the chat template file one
  a frontend would render (a Jinja file of at most 1 MiB) and compiling, the worker extension
  class importable. A bad one exits 2, like a bad flag, before engine init and the
  self-benchmark have spent a minute.
* :func:`listening` wraps the bind of a listener: a taken port (or an unknown host) becomes a
  :class:`OptionUnusable`, which ``main()`` logs as one ERROR line before exiting 2.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from dynamo.common.bind_errors import is_host_error
from dynamo.common.configuration import Option
from dynamo.common.configuration.runtime_options import DISCOVERY_DIR
from dynamo.common.launcher import OptionUnusable
from dynamo.runtime.chat_template import compile_problem
from dynamo.runtime.discovery import Discovery, DiscoveryDirError, ModelRecord
from dynamo.runtime.discovery.record import record_problem
from dynamo.runtime.model_card import ModelCard
from dynamo.runtime.template_files import MAX_TEMPLATE_BYTES, is_jinja_file, not_jinja, too_large
from dynamo.vllm.backend_args import (
    CHAT_TEMPLATE,
    MODEL,
    PROG,
    REASONING_PARSER,
    SERVED_MODEL_NAME,
    TOOL_CALL_PARSER,
    WorkerConfig,
)
from dynamo.vllm.self_benchmark_args import SELF_BENCHMARK_OUTPUT, WORKER_EXTENSION_CLS

PARSER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

T = TypeVar("T")


class UnusablePath(ValueError):
    """A path option names something the worker cannot use."""


def _reason(exc: OSError) -> str:
    if exc.errno is not None and exc.errno > 0:
        return os.strerror(exc.errno)
    return exc.strerror or str(exc)


def unusable(option: Option, value: str, problem: str, exc: BaseException) -> UnusablePath:
    """The error naming the option, its value, what the worker cannot do with it, and why."""
    if isinstance(exc, OSError):
        reason = _reason(exc)
    elif isinstance(exc, UnicodeDecodeError):
        reason = f"not UTF-8 text: {exc}"
    else:
        reason = str(exc)
    return UnusablePath(f"{option.source_label()} is {value!r}: the worker {problem} ({reason})")


def check_discovery(discovery: Discovery, directory: str) -> None:
    """The store must be usable by a writer (file: the directory created, a record writable)."""
    try:
        discovery.check(writer=True)
    except DiscoveryDirError as exc:
        raise unusable(
            DISCOVERY_DIR, directory, "cannot write its discovery record there", exc
        ) from None


def create_benchmark_output(path: str) -> None:
    """Create (truncate) the self-benchmark's output file, as the sweep will."""
    try:
        with open(path, "w", encoding="utf-8"):
            pass
    except OSError as exc:
        raise unusable(SELF_BENCHMARK_OUTPUT, path, "cannot create the file", exc) from None


def check_chat_template(path: str) -> None:
    """The chat template must be a file every frontend would render: a Jinja file once links
    are resolved, at most :data:`MAX_TEMPLATE_BYTES`, UTF-8, and compiling (the frontend
    renders it for every request: one it refuses or cannot compile would fail them all, after
    the worker said it serves)."""
    resolved = Path(path).resolve()
    if not is_jinja_file(resolved):
        resolves = "" if str(resolved) == path else f" (it resolves to {str(resolved)!r})"
        raise UnusablePath(
            f"{CHAT_TEMPLATE.source_label()} is {path!r}: a frontend would refuse it: "
            f"{not_jinja('the file')}{resolves}"
        )
    try:
        with open(resolved, "rb") as template:
            size = os.fstat(template.fileno()).st_size
            if size > MAX_TEMPLATE_BYTES:
                raise UnusablePath(
                    f"{CHAT_TEMPLATE.source_label()} is {path!r}: a frontend would refuse it: "
                    f"{too_large('the file', size)}"
                )
            source = template.read(MAX_TEMPLATE_BYTES + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise unusable(CHAT_TEMPLATE, path, "cannot read it", exc) from None
    if len(source.encode("utf-8")) > MAX_TEMPLATE_BYTES:  # grew since the fstat
        raise UnusablePath(
            f"{CHAT_TEMPLATE.source_label()} is {path!r}: a frontend would refuse it: "
            f"{too_large('the file', len(source.encode('utf-8')))}"
        )
    problem = compile_problem(source)
    if problem is not None:
        raise UnusablePath(f"{CHAT_TEMPLATE.source_label()} is {path!r}: the template {problem}")


def check_worker_extension(qualname: str | None) -> None:
    """The worker extension must be a class this Python can import: every rank imports it after
    engine init has begun (vLLM's ``worker_extension_cls``), where a typo ended in a traceback
    and exit 1. Imported here, in the worker before anything starts (as each rank will)."""
    if qualname is None:
        return
    from dynamo.vllm.ranks import resolve_qualname

    try:
        found = resolve_qualname(qualname)
    except Exception as exc:  # noqa: BLE001 - whatever the import raises is the same mistake
        raise unusable(WORKER_EXTENSION_CLS, qualname, "cannot import it", exc) from None
    if not isinstance(found, type):
        raise UnusablePath(
            f"{WORKER_EXTENSION_CLS.source_label()} is {qualname!r}: not a class "
            f"({type(found).__name__})"
        )


def check_paths(config: WorkerConfig, discovery: Discovery, directory: str) -> None:
    """The path options, checked (and created) before anything starts; exits 2 on a bad one."""
    try:
        if config.chat_template is not None:
            check_chat_template(config.chat_template)
        check_worker_extension(config.worker_extension_cls)
        check_discovery(discovery, directory)
        if config.self_benchmark_points > 0 and config.self_benchmark_output is not None:
            create_benchmark_output(config.self_benchmark_output)
    except UnusablePath as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def card_with_parsers(card: ModelCard, config: WorkerConfig) -> ModelCard:
    """``card`` with the parser names the worker was given (judged with the rest of the record,
    by :func:`record_refusal`, before it is written)."""
    return card.model_copy(
        update={
            "tool_call_parser": config.dyn_tool_call_parser,
            "reasoning_parser": config.dyn_reasoning_parser,
        }
    )


def check_parser_names(config: WorkerConfig) -> None:
    """The parser names must be names (letters, digits, ``_.-``; the model card's rule): exit 2
    naming the option. Whether the frontend knows them is the frontend's check; with
    ``--engine vllm`` vLLM's registries are checked too (engine_factory)."""
    for option, value in (
        (TOOL_CALL_PARSER, config.dyn_tool_call_parser),
        (REASONING_PARSER, config.dyn_reasoning_parser),
    ):
        if value is not None and not PARSER_NAME.fullmatch(value):
            print(
                f"{PROG}: error: {option.source_label()} is {value!r}: a parser name is letters, "
                "digits, '_', '.' and '-' (at most 64, starting with a letter or digit)",
                file=sys.stderr,
            )
            raise SystemExit(2)


# A stand-in endpoint for the record checked before the request plane listens (its own check,
# the listener's host, is the bind's); any valid one leaves the other fields to be judged.
_PROBE_ENDPOINT = "http://127.0.0.1:1"


def _options_of_fields(config: WorkerConfig) -> dict[str, Option]:
    """Which option sets each record field a worker writes (the served name: --served-model-name
    when given, else --model)."""
    named = SERVED_MODEL_NAME if config.served_model_name else MODEL
    return {
        "model": named,
        "card.served_model_name": named,
        "card.model_path": MODEL,
        "card.tokenizer_path": MODEL,
        "card.context_length": MODEL,  # the model's config (or the engine's max length)
        "card.chat_template_path": CHAT_TEMPLATE,
        "card.tool_call_parser": TOOL_CALL_PARSER,
        "card.reasoning_parser": REASONING_PARSER,
    }


def record_refusal(config: WorkerConfig, record: ModelRecord) -> str | None:
    """What to tell the operator when a frontend would refuse ``record`` (None: it would not):
    the option behind the first wrong field, its value and the frontend's reason, by the
    record schema's own check (:func:`~dynamo.runtime.discovery.record.record_problem`)."""
    problem = record_problem(record)
    if problem is None:
        return None
    option = _options_of_fields(config).get(problem.field)
    if option is None:
        return f"a frontend would refuse this worker's discovery record: {problem}"
    value = getattr(config, option.dest) or ""
    shown = value if len(value) <= 80 else f"{value[:80]}…({len(value) - 80} more)"
    return f"{option.source_label()} is {shown!r}: a frontend would refuse it ({problem})"


def check_record_fields(config: WorkerConfig) -> None:
    """The record this worker will write, as far as its options decide it, must be one a
    frontend reads (exit 2 naming the option): otherwise the worker would say it serves a model
    that no frontend ever routes to. The engine's own fields are checked again at
    registration."""
    template = os.path.abspath(config.chat_template) if config.chat_template else None
    # Built unchecked: judging it is record_problem's job, with the frontend's schema.
    card = ModelCard.model_construct(
        served_model_name=config.served_name,
        model_path=config.model,
        tokenizer_path=config.model,
        context_length=1,
        chat_template_path=template,
        tool_call_parser=config.dyn_tool_call_parser,
        reasoning_parser=config.dyn_reasoning_parser,
    )
    probe = ModelRecord(model=config.served_name, endpoint=_PROBE_ENDPOINT, card=card)
    refusal = record_refusal(config, probe)
    if refusal is not None:
        print(f"{PROG}: error: {refusal}", file=sys.stderr)
        raise SystemExit(2)


async def listening(
    bind: Callable[[], Awaitable[T]],
    *,
    host: str,
    port: int,
    host_option: Option,
    port_option: Option,
) -> T:
    """``await bind()``; a failure to listen becomes an :class:`OptionUnusable` (exit 2)
    naming the option.

    A host that does not resolve or is no address of this machine names the host option,
    anything else (a taken port, a port below 1024 without the privilege) the port option.
    """
    try:
        return await bind()
    except OSError as exc:
        option = host_option if is_host_error(exc) else port_option
        raise OptionUnusable(
            f"cannot listen on {host}:{port} ({_reason(exc)}): choose another "
            f"{option.source_label()}"
        ) from None
