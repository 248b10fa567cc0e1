"""The GC policy in vLLM's EngineCore process, through the scheduler vLLM builds there.

``AsyncLLM`` runs its scheduler (and the loop that drives every step) in a separate EngineCore
process, and on this platform its model worker in a third (vLLM's CPU backend always uses the
multiprocessing executor, ``platforms/cpu.py``). A measured self-benchmark window runs in all
three: the worker's main process submits and collects, EngineCore schedules, the rank computes.
``collective_rpc`` reaches the ranks only, so EngineCore needs a hook of its own: vLLM's
``--scheduler-cls`` (``SchedulerConfig.scheduler_cls``, resolved by qualified name in
``EngineCore.__init__``). The worker injects :class:`FpmGcScheduler` while the self-benchmark
runs; a user ``--scheduler-cls`` must subclass it (else exit 2, like the worker extension).

The main process talks to it with *control requests*: a one-token generate whose
``SamplingParams.extra_args`` (vLLM's documented field for plugins, passed to the scheduler
untouched) carries ``{"dynamo_fpm_gc": {"command": ...}}``. The scheduler runs the command in
:meth:`add_request`, before the request is scheduled, and writes this process's GC report (a
JSON file the caller names) before the request's token comes back, so the caller's ``await``
is the synchronisation. The request is then served like any other (one untimed step).
Commands: ``start`` (the policy, with ``interval_s``), ``stop``, ``maintain`` (the untimed
collect window of long sweeps; ``report=False`` skips the report's heap walk), ``pause_log``
(install the pause logger, ``threshold_ms``), ``report``. vLLM calls :meth:`shutdown` when
EngineCore stops, so a policy still running then (a main process that died mid-sweep) is stopped
too.

Which base: vLLM picks ``AsyncScheduler`` when async scheduling is on and ``Scheduler``
otherwise (the CPU platform turns it off); ``FpmGcScheduler.__new__`` makes the same choice from
the engine's config, so the benchmark schedules exactly as serving does.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import tempfile
import uuid
from typing import Any

from vllm import SamplingParams
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from dynamo.vllm import gc_policy
from dynamo_gc import bench_policy

logger = logging.getLogger(__name__)

QUALNAME = "dynamo.vllm.gc_scheduler.FpmGcScheduler"
CONTROL_KEY = "dynamo_fpm_gc"
COMMANDS = ("start", "stop", "maintain", "pause_log", "report")
LABEL = gc_policy.ENGINE_CORE_LABEL


class FpmGcScheduler(Scheduler):
    """vLLM's scheduler, plus the GC-policy control requests (see the module docstring)."""

    def __new__(cls, *args: Any, **kwargs: Any):
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        scheduler_config = getattr(vllm_config, "scheduler_config", None)
        if cls is FpmGcScheduler and getattr(scheduler_config, "async_scheduling", False):
            cls = FpmGcAsyncScheduler
        return super().__new__(cls)

    def add_request(self, request: Any) -> None:
        control = _control_of(request)
        if control is not None:
            _run_control(control)
        super().add_request(request)

    def shutdown(self) -> None:
        try:
            if bench_policy.stop_policy():
                logger.info("GC policy stopped at EngineCore shutdown (pid %d)", os.getpid())
        finally:
            super().shutdown()


class FpmGcAsyncScheduler(FpmGcScheduler, AsyncScheduler):
    """:class:`FpmGcScheduler` on vLLM's ``AsyncScheduler`` (async scheduling on)."""


def _control_of(request: Any) -> dict | None:
    params = getattr(request, "sampling_params", None)
    extra = getattr(params, "extra_args", None)
    if not extra or CONTROL_KEY not in extra:
        return None
    control = extra[CONTROL_KEY]
    return control if isinstance(control, dict) else {"command": control}


REPORT_DIR_PREFIX = "dynamo-fpm-gc-"


def _report_path_allowed(path: Any) -> bool:
    """Only a report file in a directory :func:`call_engine_core` made: a control request is
    never a way to write elsewhere, whoever managed to send one."""
    if not isinstance(path, str):
        return False
    parent = os.path.dirname(os.path.realpath(path))
    return os.path.dirname(parent) == os.path.realpath(tempfile.gettempdir()) and os.path.basename(
        parent
    ).startswith(REPORT_DIR_PREFIX)


def _run_control(control: dict) -> None:
    """Run one command in this process; write the report (or the error) where asked."""
    report_path = control.get("report_path")
    if report_path is not None and not _report_path_allowed(report_path):
        logger.warning(
            "GC control %r ignored: its report path %r is not one of ours",
            control.get("command"),
            report_path,
        )
        return
    report: dict[str, Any]
    try:
        gc_policy.ensure_process_logging(LABEL)
        command = control.get("command")
        if command == "start":
            result: Any = bench_policy.start_policy(interval_s=float(control["interval_s"]))
        elif command == "stop":
            # EngineCore has no serving freeze of its own: frozen again only if it was before
            # (vLLM freezes its engine processes after init).
            result = bench_policy.stop_policy()
        elif command == "maintain":
            result = bench_policy.maintain()  # objects collected (0 outside the policy)
        elif command == "pause_log":
            result = gc_policy.install_pause_logger_here(
                float(control["threshold_ms"]), label=LABEL
            )
        elif command == "report":
            result = None
        else:
            raise ValueError(f"unknown GC control command {command!r} (known: {COMMANDS})")
        # The report walks the heap: only where it is wanted (not in maintain windows).
        wanted = report_path and control.get("report", True)
        report = bench_policy.gc_process_report(LABEL) if wanted else {}
        report["command"] = command
        report["result"] = result
    except Exception as exc:  # reported to the caller, never kills EngineCore
        logger.exception("GC control %r failed in EngineCore", control.get("command"))
        report = {"command": control.get("command"), "error": f"{type(exc).__name__}: {exc}"}
    if report_path:
        with open(report_path, "w", encoding="utf-8") as out:
            json.dump(report, out)


class EngineCoreUnpoliced(RuntimeError):
    """EngineCore's scheduler is not :class:`FpmGcScheduler`: no control reached it."""


_control_ids = itertools.count()
_id_prefix = uuid.uuid4().hex[:8]


async def call_engine_core(async_llm: Any, command: str, **params: Any) -> dict:
    """Run ``command`` in EngineCore through a control request; return EngineCore's GC report.

    Raises :class:`EngineCoreUnpoliced` when the scheduler there is not ours (the request was
    served, nobody wrote the report), ``RuntimeError`` with EngineCore's error otherwise.
    """
    if command not in COMMANDS:
        raise ValueError(f"unknown GC control command {command!r} (known: {COMMANDS})")
    with tempfile.TemporaryDirectory(prefix=REPORT_DIR_PREFIX) as tmp:
        report_path = os.path.join(tmp, "report.json")
        control = {"command": command, "report_path": report_path, **params}
        sampling = SamplingParams(
            max_tokens=1,
            output_kind=RequestOutputKind.FINAL_ONLY,
            extra_args={CONTROL_KEY: control},
        )
        request_id = f"fpm-gc-{command}-{_id_prefix}-{next(_control_ids)}"
        async for _ in async_llm.generate(TokensPrompt(prompt_token_ids=[0]), sampling, request_id):
            pass
        try:
            with open(report_path, encoding="utf-8") as report_file:
                report = json.load(report_file)
        except FileNotFoundError:
            raise EngineCoreUnpoliced(
                f"EngineCore's scheduler is not {QUALNAME} (or a subclass): "
                f"the GC control {command!r} reached nobody"
            ) from None
    if "error" in report:
        raise RuntimeError(f"GC control {command!r} failed in EngineCore: {report['error']}")
    return report


__all__ = [
    "CONTROL_KEY",
    "EngineCoreUnpoliced",
    "FpmGcAsyncScheduler",
    "FpmGcScheduler",
    "QUALNAME",
    "call_engine_core",
]
