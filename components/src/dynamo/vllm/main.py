"""``python -m dynamo.vllm``: the worker, with its GC heap frozen at its quiescent point.

Lifecycle, each step logged at INFO, in this order:

1. parse args, then check what can be checked before anything starts: the discovery directory
   (created), the self-benchmark output file (created), and with ``--engine vllm`` vLLM's own
   arguments (vLLM is imported here, before the event loop exists). Bad input exits 2;
2. logging set-up, the GC pause logger (and metrics);
3. the listeners: the optional system port, then the request plane. They bind before engine
   init, so a taken port fails in milliseconds with one ERROR line (exit 1) instead of after a
   minute of engine init and self-benchmark. Binding early admits nothing: the request plane's
   address is published only by ``register_model``, and its generate route refuses (503) until
   the phase is ``serving``;
4. engine init (``await engine.start()``), then the optional self-benchmark;
5. the serving freeze (``maybe_freeze_gc_heap``): after everything start-up allocates, before
   anything can be admitted. The listeners' few objects are frozen with the rest;
6. mark the phase ``serving``, then ``register_model``: the record carries the model card the
   engine resolved (served name, tokenizer directory, context length, EOS ids), and the
   frontend routes to this worker only once it exists; from then on the record's heartbeat renews it (a
   worker that dies without removing it, SIGKILL included, is dropped after --discovery-ttl);
7. serve until SIGTERM/SIGINT; then mark ``draining``, stop the heartbeat, remove the record
   (so the frontend stops routing here), let in-flight requests finish within a grace period
   (then abort them), shut the engine down, close the system port, and put the process's GC
   state back (pause logger off, metrics detached, heap unfrozen so the interpreter's exit
   finalizes it), then exit 0.

A signal during start-up cancels start-up, shuts the engine down and exits 0 without ever
registering.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence

from aiohttp import web

from dynamo.common import lifecycle, logging_setup
from dynamo.common.configuration import upstream
from dynamo.common.configuration.drain_options import DEFAULT_DRAIN_TIMEOUT_S
from dynamo.common.configuration.runtime_options import discovery_settings
from dynamo.common.http_server import REQUEST_PLANE_MAX_BODY_BYTES, GuardedRunner
from dynamo.common.metrics import DynamoMetrics
from dynamo.common.request_drain import END_BOUND_S, RequestDrain
from dynamo.common.system_server import start_system_server
from dynamo.common.utils import gc_freeze
from dynamo.runtime.discovery import (
    Discovery,
    DiscoverySetupError,
    ModelRecord,
    Registration,
    open_discovery,
)
from dynamo.runtime.model_card import ModelCard
from dynamo.runtime.request_plane import GenerateRequest, add_request_plane_routes
from dynamo.vllm import backend_args, engine_factory, reachability, startup_checks
from dynamo.vllm.engine import Engine, EngineInitFailed, EngineUnavailable
from dynamo.vllm.ranks import RankError
from dynamo.vllm.startup_checks import StartupError

logger = logging.getLogger(__name__)

PROG = "python -m dynamo.vllm"
FREEZE_CONTEXT = "vllm worker"
# How long a drain waits for in-flight requests before aborting them. Long enough for a chat
# completion to finish, short enough for a Kubernetes default terminationGracePeriodSeconds.
DRAIN_GRACE_S = DEFAULT_DRAIN_TIMEOUT_S  # the --drain-timeout default
CUT_SHORT_MESSAGE = "worker draining: the request was cut short at the end of its drain"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """SIGTERM/SIGINT handling for one run of the worker.

    During start-up a signal cancels the start-up task (engine init and the self-benchmark can
    take minutes; nothing is registered yet, so there is nothing to drain). Once serving, it
    starts the drain. Further signals while stopping are logged and otherwise ignored: the
    drain is already bounded by its grace period.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, startup_task: asyncio.Task) -> None:
        self._loop = loop
        self._startup_task = startup_task
        self._serving = False
        self._stop = asyncio.Event()
        self.received: str | None = None

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            self._loop.add_signal_handler(signum, self._on_signal, signum)

    def uninstall(self) -> None:
        for signum in STOP_SIGNALS:
            self._loop.remove_signal_handler(signum)

    def serving(self) -> None:
        self._serving = True

    async def wait(self) -> str:
        await self._stop.wait()
        assert self.received is not None
        return self.received

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            logger.info("Received %s while stopping (after %s): ignored", name, self.received)
            return
        self.received = name
        if self._serving:
            logger.info("Received %s: draining", name)
            self._stop.set()
        else:
            logger.info("Received %s during start-up: abandoning start-up", name)
            self._startup_task.cancel()


class RequestPlaneServer:
    """The worker's request-plane listener (aiohttp), counting the requests in flight."""

    def __init__(self, engine: Engine, host: str, port: int, *, drain_grace_s: float) -> None:
        self._engine = engine
        self._host = host
        self._port = port
        self.drain_grace_s = drain_grace_s
        self.endpoint: str | None = None
        self.in_flight = 0
        self.finished = 0
        self.aborted = 0
        self._closed = False
        app = web.Application(client_max_size=REQUEST_PLANE_MAX_BODY_BYTES)
        add_request_plane_routes(
            app, self._generate, self._admitting, served_model_name=engine.served_model_name
        )
        # Our drain (one deadline; a cut stream ends with an in-band error line) finishes every
        # request before aiohttp's cleanup, whose timeout then only bounds closing connections.
        # What a request cut short is told: the drain's message, or why the engine died.
        self.cut_message = CUT_SHORT_MESSAGE
        self.drain = RequestDrain(
            what="request plane", end_stream=self._end_cut_stream, refuse=self._refuse_cut_request
        )
        self.drain.install(app)
        self._runner = GuardedRunner(app, what="request plane", shutdown_timeout=END_BOUND_S / 2)

    @staticmethod
    def _admitting() -> bool:
        # Nothing is admitted before the phase is `serving` (see run_worker) nor while draining.
        return lifecycle.current_phase() is lifecycle.Phase.SERVING

    async def _generate(self, request: GenerateRequest) -> AsyncIterator[dict]:
        self.in_flight += 1
        finished = False
        try:
            # aclosing: when the client goes away, the engine's stream is closed (= aborted)
            # right now, not whenever the garbage collector gets to it.
            async with contextlib.aclosing(self._engine.generate(request)) as stream:
                async for item in stream:
                    finished = finished or "finish_reason" in item
                    yield item
        finally:
            self.in_flight -= 1
            if finished:
                self.finished += 1
            else:
                self.aborted += 1

    def fail(self, message: str) -> None:
        """The engine died: every request still running is cut short now (no grace period),
        each told ``message`` (in-band, or a 503 before its stream started)."""
        self.cut_message = message
        self.drain.start(0.0)

    async def _end_cut_stream(self, response: web.StreamResponse) -> None:
        # The request plane's in-band failure line (see dynamo.runtime.request_plane).
        await response.write(json.dumps({"error": self.cut_message}).encode() + b"\n")
        await response.write_eof()

    def _refuse_cut_request(self) -> web.Response:
        return web.json_response({"error": self.cut_message}, status=503)

    async def open(self) -> str:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.endpoint = f"http://{_advertised_host(self._host)}:{port}"
        logger.info("Request plane listening on %s", self.endpoint)
        return self.endpoint

    async def close(self) -> None:
        """Stop listening and drain (bounded by the grace period); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.endpoint is None or lifecycle.current_phase() is lifecycle.Phase.STARTING:
            # Never listened, or start-up failed or was cancelled before anything was admitted:
            # nothing to drain, and nothing to report.
            await self._runner.cleanup()
            return
        if self.cut_message == CUT_SHORT_MESSAGE:
            logger.info(
                "Draining: %d request(s) in flight; waiting up to %g s before aborting them",
                self.in_flight,
                self.drain_grace_s,
            )
        else:
            logger.info("Ending the %d request(s) in flight: the engine died", self.in_flight)
        for site in list(self._runner.sites):
            await site.stop()  # the listener closes first
        self.drain.start(self.drain_grace_s)  # no-op when the signal already set the deadline
        await self.drain.wait()
        await self._runner.cleanup()
        logger.info(
            "Request plane closed: requests finished=%d aborted=%d", self.finished, self.aborted
        )


def _advertised_host(host: str) -> str:
    """The host part of the URL others use to reach a listener bound to ``host``."""
    if host in ("", "0.0.0.0", "::"):
        return socket.gethostname()  # a wildcard bind is reachable under the host's name
    return f"[{host}]" if ":" in host else host


def install_pause_logger(
    config: argparse.Namespace, metrics: DynamoMetrics | None = None
) -> gc_freeze.GcPauseLogger | None:
    # With metrics the logger is always installed: every pause feeds dynamo_gc_pause_seconds,
    # even when the log threshold is 0 (no log lines).
    on_pause = None if metrics is None else metrics.observe_pause
    pause_logger = gc_freeze.install_gc_pause_logger(config.gc_pause_log_ms, on_pause=on_pause)
    if config.gc_pause_log_ms <= 0:
        logger.info(
            "GC pause logger off (gc_pause_log_ms=0)%s",
            "; pauses still recorded in dynamo_gc_pause_seconds" if metrics is not None else "",
        )
    return pause_logger


async def start_system_port(
    config: argparse.Namespace, metrics: DynamoMetrics, cleanup: contextlib.AsyncExitStack
) -> None:
    """/health and /metrics on --system-port, from the start so probes see `starting`.

    A port that cannot be bound raises :class:`StartupError` naming --system-port.
    """
    if config.system_port is None:
        if config.debug_gc_endpoint:
            logger.warning("--debug-gc-endpoint needs --system-port: no debug endpoint served")
        return
    server = await startup_checks.listening(
        lambda: start_system_server(
            metrics,
            host=config.system_host,
            port=config.system_port,
            debug_gc_endpoint=config.debug_gc_endpoint,
        ),
        host=config.system_host,
        port=config.system_port,
        host_option=backend_args.SYSTEM_HOST,
        port_option=backend_args.SYSTEM_PORT,
    )
    cleanup.push_async_callback(server.stop)


async def open_request_plane(
    config: argparse.Namespace, engine: Engine, cleanup: contextlib.AsyncExitStack
) -> RequestPlaneServer:
    """The request-plane listener, bound now; it admits nothing before the phase is `serving`.

    A port that cannot be bound raises :class:`StartupError` naming --request-plane-port.
    """
    plane = RequestPlaneServer(
        engine,
        config.request_plane_host,
        config.request_plane_port,
        drain_grace_s=getattr(config, "drain_timeout", DRAIN_GRACE_S),
    )
    # Closes the listener if start-up fails or is cancelled; once serving, a second close
    # pushed after the engine's shutdown drains first (see _start_and_serve).
    cleanup.push_async_callback(plane.close)
    await startup_checks.listening(
        plane.open,
        host=config.request_plane_host,
        port=config.request_plane_port,
        host_option=backend_args.REQUEST_PLANE_HOST,
        port_option=backend_args.REQUEST_PLANE_PORT,
    )
    return plane


async def warn_if_unreachable(discovery: Discovery, endpoint: str) -> str | None:
    """One WARNING when the advertised request plane is loopback but other hosts read the
    discovery record (see :mod:`dynamo.vllm.reachability`); off the loop: it may resolve a name
    and read the mount table."""
    reason = await asyncio.to_thread(reachability.unreachable_reason, endpoint, discovery)
    if reason is not None:
        logger.warning(reason)
    return reason


async def register_model(registration: Registration, card: ModelCard, endpoint: str) -> ModelRecord:
    """Publish this worker's model and its card; the frontend routes to it from the moment this
    returns.

    The record's model is the card's served name. The record is a lease, kept alive by the
    registration until :func:`unregister_model` (file: rewritten every heartbeat; etcd: a lease
    kept alive); a worker that dies without unregistering is dropped after --discovery-ttl.
    """
    record = await registration.register(
        ModelRecord(model=card.served_model_name, endpoint=endpoint, card=card)
    )
    logger.info(
        "Model registered: model=%s instance=%s endpoint=%s %s "
        "tokenizer=%s context_length=%d eos_token_ids=%s",
        record.model,
        record.instance_id,
        record.endpoint,
        registration.describe_lease(),
        card.tokenizer_path,
        card.context_length,
        list(card.eos_token_ids),
    )
    return record


async def unregister_model(registration: Registration, record: ModelRecord) -> None:
    await registration.unregister()
    logger.info("Model unregistered: model=%s instance=%s", record.model, record.instance_id)


async def connect_discovery(
    discovery: Discovery, config: argparse.Namespace, cleanup: contextlib.AsyncExitStack
) -> Registration:
    """The worker's registration, its store reachable (etcd: retried with back-off until it
    answers; the worker stays `starting`, so not ready, meanwhile)."""
    registration = discovery.registration()
    cleanup.push_async_callback(registration.close)
    logger.info("Discovery: %s backend, %s", discovery.backend, discovery.describe())
    await registration.connect()
    return registration


async def shutdown_engine(engine: Engine) -> None:
    began = time.perf_counter()
    await engine.shutdown()
    logger.info("Engine shut down in %.0f ms", (time.perf_counter() - began) * 1000.0)


async def run_worker(config: argparse.Namespace) -> int:
    """Everything after argument parsing; returns the exit code (0 after a signal)."""
    # main() opens the backend before the loop exists (the etcd client's import is then
    # frozen with the rest); a caller that skipped main() gets it here.
    discovery = getattr(config, "discovery", None) or open_discovery(discovery_settings(config))
    signals = StopSignals(asyncio.get_running_loop(), asyncio.current_task())
    signals.install()
    try:
        async with contextlib.AsyncExitStack() as cleanup:
            # Unwound last-in first-out: unregister, close the request plane, stop the engine.
            exit_code = await _start_and_serve(config, discovery, signals, cleanup)
    except asyncio.CancelledError:
        if signals.received is None:
            raise
        _consume_cancellation()
        logger.info("Worker stopped during start-up (%s); it never registered", signals.received)
        return 0
    finally:
        signals.uninstall()
    if exit_code:
        logger.info("Worker stopped after its engine died (exit %d)", exit_code)
    else:
        logger.info("Worker stopped")
    return exit_code


async def _start_and_serve(
    config: argparse.Namespace,
    discovery: Discovery,
    signals: StopSignals,
    cleanup: contextlib.AsyncExitStack,
) -> int:
    """Start up, serve until a signal (returns 0) or the engine's death (returns 1)."""
    metrics = DynamoMetrics(freeze_enabled=config.freeze_gc_heap).attach()
    gc_state = gc_freeze.ProcessGcState(metrics)
    cleanup.callback(gc_state.restore)  # pushed first, so it runs last
    install_pause_logger(config, metrics)
    # The listeners bind before engine init, so a taken port fails now, not after it.
    await start_system_port(config, metrics, cleanup)

    # Building the vLLM adapter imports vLLM (3-19 s) unless main() has already done so: off
    # the event loop, which must answer health probes and signals meanwhile.
    engine = await asyncio.to_thread(
        engine_factory.build_engine,
        config,
        worker_extension_cls=getattr(config, "worker_extension_cls", None),
    )
    plane = await open_request_plane(config, engine, cleanup)
    await warn_if_unreachable(discovery, plane.endpoint)
    # Before engine init: a store that is down shows in the log at once, not after a minute.
    registration = await connect_discovery(discovery, config, cleanup)

    logger.info(
        "Engine init: starting the %s engine for model %s (served as %s)",
        config.engine,
        config.model,
        engine.served_model_name,
    )
    began = time.perf_counter()
    cleanup.push_async_callback(shutdown_engine, engine)
    await engine.start()
    logger.info("Engine init done in %.0f ms", (time.perf_counter() - began) * 1000.0)

    if config.self_benchmark_points > 0:
        from dynamo.vllm.self_benchmark import run_self_benchmark

        await run_self_benchmark(engine, config)

    # The quiescent point: engine init (and the benchmark, with its GC policy stopped) is done,
    # and no request can reach this process yet: the listener is bound, but its address is not
    # published and it refuses requests until the phase below is `serving`.
    frozen = gc_freeze.maybe_freeze_gc_heap(config.freeze_gc_heap, context=FREEZE_CONTEXT)
    gc_state.froze = frozen is not None

    # Pushed after the engine's shutdown, so it unwinds before it: in-flight requests finish
    # (within the grace period) while the engine still runs. The close pushed at bind time is
    # then a no-op.
    cleanup.push_async_callback(plane.close)
    lifecycle.mark_serving("register_model")
    record = await register_model(registration, engine.model_card, plane.endpoint)
    # Unwinds first: the record goes (file: heartbeat stopped, then the file; etcd: the lease
    # revoked) before the request plane drains.
    cleanup.push_async_callback(unregister_model, registration, record)

    signals.serving()
    logger.info("Worker serving model %s; stop it with SIGTERM or SIGINT", record.model)
    death = await serve_until_stopped(signals, engine)
    if death is not None:
        # The one ERROR line. Then, as for a drain but with no grace period: new requests are
        # refused, the record goes at once (the exit stack), the requests in flight end with
        # an in-band error, the other ranks are reaped, GC state is put back; exit 1.
        logger.error("Worker stopped: the engine died: %s", death)
        plane.fail(f"worker failed: the engine died ({death})")
        lifecycle.mark_draining("the engine died")
        return 1
    reason = signals.received
    assert reason is not None
    plane.drain.start(plane.drain_grace_s)  # one deadline, from the signal, for the drain
    # Draining refuses new requests at once; the heartbeat stops and the record is removed next
    # (the exit stack), then in-flight requests finish within the grace period, then the engine
    # stops, then the system port closes and the process's GC state is put back.
    lifecycle.mark_draining(reason)
    return 0


async def serve_until_stopped(signals: StopSignals, engine: Engine) -> str | None:
    """Wait for SIGTERM/SIGINT (returns None) or for the engine's death (returns what died and
    how, from ``engine.wait_until_dead``); the other wait is cancelled."""
    stopped = asyncio.ensure_future(signals.wait())
    died = asyncio.ensure_future(engine.wait_until_dead())
    try:
        await asyncio.wait((stopped, died), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in (stopped, died):
            wait.cancel()
        await asyncio.gather(stopped, died, return_exceptions=True)
    if stopped.done() and not stopped.cancelled():
        return None  # a signal wins a tie: a deliberate stop is not a failure
    return died.result()


def _consume_cancellation() -> None:
    """Mark the start-up cancellation as handled (3.11+ counts pending cancellations)."""
    task = asyncio.current_task()
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()


def main(argv: Sequence[str] | None = None) -> int:
    """Exit codes: 0 after a signal (or --help), 2 for bad input (flags, env vars, paths, vLLM's
    arguments, an engine that cannot run here, a bad mock model directory), 1 when a start-up
    step fails (a taken port, engine init)."""
    try:
        config = backend_args.parse_args(argv)
        log_levels = logging_setup.log_levels_or_exit(PROG)  # DYN_LOG, as upstream
        if config.self_benchmark_points > 0:
            # Before the engine exists: its ranks must load the GC policy's worker extension
            # (a conflicting user extension exits 2 here), and read the policy from their
            # environment, since they never see this command line.
            from dynamo.vllm.self_benchmark import export_policy_env, resolve_worker_extension

            config.worker_extension_cls = resolve_worker_extension(config)
            export_policy_env(config)
    except SystemExit as exc:  # bad input (exit 2) or --help (exit 0): nothing else has run
        return _exit_code(exc)
    settings = discovery_settings(config)
    try:
        # The etcd client is imported here, before the event loop and the freeze.
        config.discovery = open_discovery(settings)
    except DiscoverySetupError as exc:  # etcd credentials that cannot work
        print(f"{startup_checks.PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        startup_checks.check_paths(config, config.discovery, settings.directory)
    except SystemExit as exc:  # an unusable path (exit 2): nothing else has run
        return _exit_code(exc)
    logging_setup.configure_logging(log_levels)
    logging_setup.warn_unmatched_targets(log_levels)
    upstream.warn_ignored_env(PROG, upstream.declared_names(backend_args.ALL_OPTIONS))
    logger.info(
        "Worker options: model=%s served_model_name=%s engine=%s discovery_backend=%s discovery_dir=%s discovery_ttl=%g "
        "request_plane=%s:%s freeze_gc_heap=%s gc_pause_log_ms=%g self_benchmark_points=%d",
        config.model,
        config.served_model_name or config.model,
        config.engine,
        config.discovery_backend,
        settings.directory,
        config.discovery_ttl,
        config.request_plane_host,
        config.request_plane_port,
        config.freeze_gc_heap,
        config.gc_pause_log_ms,
        config.self_benchmark_points,
    )
    try:
        # With --engine vllm: import vLLM and parse its arguments now, before the event loop
        # and before anything starts, so a bad vLLM flag exits 2 at once.
        engine_factory.prepare_engine(config, worker_extension_cls=config.worker_extension_cls)
    except SystemExit as exc:  # vLLM's --help
        return _exit_code(exc)
    except EngineUnavailable as exc:
        logger.error("Cannot start the worker: %s", exc)
        return 2
    try:
        return asyncio.run(run_worker(config))
    except EngineUnavailable as exc:
        logger.error("Cannot start the worker: %s", exc)
        return 2
    except (StartupError, EngineInitFailed) as exc:
        logger.error("Cannot start the worker: %s", exc)
        return 1
    except RankError as exc:
        # A rank process died (or failed): the engine cannot run a step. Every other rank has
        # been reaped and the GC state put back by the time this is logged: one ERROR line.
        logger.error("Worker stopped: %s", " ".join(str(exc).split("\n")))
        return 1


def _exit_code(exc: SystemExit) -> int:
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
