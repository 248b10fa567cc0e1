"""The worker process's parts, built at start-up and run through the launcher's lifecycle.

:class:`WorkerProcess` is the worker's :class:`~dynamo.common.launcher.Service`, in this order:

1. ``start``: the listeners bind first (the optional system port, then the request plane), so
   a taken port fails in milliseconds instead of after a minute of engine init and
   self-benchmark. Binding early admits nothing: the request plane's address is published only
   by ``register_model``, and its generate route refuses (503) until the phase is ``serving``.
   Then the discovery store is reached (etcd: retried until it answers; the worker stays not
   ready meanwhile), the engine is initialised, and the optional self-benchmark runs (its GC
   policy stopped on every exit path);
2. the launcher freezes the heap here (after everything start-up allocates, before anything can
   be admitted) and marks the phase ``serving``;
3. ``admit``: ``register_model``: the record carries the model card the engine resolved (served
   name, tokenizer directory, context length, EOS ids), and the frontend routes to this worker
   only once it exists; from then on the record's lease is renewed (a worker that dies without
   removing it, SIGKILL included, is dropped after --discovery-ttl);
4. ``serve``: until SIGTERM/SIGINT, then the drain (one deadline, ``--drain-timeout``), or until
   the engine dies (exit 1: requests in flight end with an in-band error at once). Closing (the
   launcher's, last opened first) removes the record, lets in-flight requests finish, shuts the
   engine down and closes the system port.

With ``--gc-maintenance`` (idle or withdraw), generate requests go through an admission gate
from the start, the maintainer starts once the model is registered, and it is stopped first
when serving ends, before the drain begins (an attempt in progress comes back on its way:
admission reopened, the record's state cleared, the model's maintenance lock released).
"""

from __future__ import annotations

import asyncio
import logging
import time

from dynamo.common.launcher import Closer, OptionUnusable, StopSignals
from dynamo.common.system_server import NotReadyCheck, start_system_server
from dynamo.runtime.discovery import Discovery, ModelRecord, Registration
from dynamo.runtime.model_card import ModelCard
from dynamo.vllm import backend_args, reachability, startup_checks
from dynamo.vllm.backend_args import WorkerConfig
from dynamo.vllm.engine import Engine
from dynamo.vllm.engine_factory import EngineBuilder
from dynamo.vllm.request_plane_server import RequestPlaneServer
from dynamo.vllm.withdrawal import Peers, WithdrawQuiescence
from dynamo_gc import lifecycle, startup_stop
from dynamo_gc.admission import AdmissionGate
from dynamo_gc.configuration.gc_options import MAINTENANCE_WITHDRAW
from dynamo_gc.maintainer import GcMaintainer, Quiescence
from dynamo_gc.metrics import DynamoMetrics
from dynamo_gc.process_gc import GcMaintenance

logger = logging.getLogger(__name__)


class WorkerProcess:
    freeze_context = "vllm worker"
    admission = "register_model"

    def __init__(
        self,
        config: WorkerConfig,
        discovery: Discovery,
        engine_builder: EngineBuilder,
        metrics: DynamoMetrics,
        maintenance: GcMaintenance | None = None,
    ) -> None:
        self.config = config
        self.discovery = discovery
        self.engine_builder = engine_builder
        self.metrics = metrics
        self.maintenance = maintenance
        self.gate = AdmissionGate() if maintenance is not None else None
        self.maintainer: GcMaintainer | None = None
        self.engine: Engine | None = None
        self.plane: RequestPlaneServer | None = None
        self.registration: Registration | None = None
        self.registered = False  # the model's record is published: /health may say ready
        self._closer: Closer | None = None

    async def start(self, closer: Closer) -> None:
        self._closer = closer
        config = self.config
        await start_system_port(config, self.metrics, closer, not_ready=self.not_ready_reason)
        # Building the vLLM adapter's engine is quick (main() imported vLLM), but off the loop
        # all the same: the loop answers health probes and signals meanwhile.
        engine = self.engine = await asyncio.to_thread(self.engine_builder)
        plane = self.plane = RequestPlaneServer(
            engine,
            config.request_plane_host,
            config.request_plane_port,
            drain_grace_s=config.drain_timeout,
            gate=self.gate,
        )
        # Closes the listener if start-up fails or is cancelled; once serving, the close pushed
        # after the engine's shutdown (below) drains first, and this one is a no-op.
        closer.push("request plane", plane.close)
        await startup_checks.listening(
            plane.open,
            host=config.request_plane_host,
            port=config.request_plane_port,
            host_option=backend_args.REQUEST_PLANE_HOST,
            port_option=backend_args.REQUEST_PLANE_PORT,
        )
        assert plane.endpoint is not None, "open() advertised it"
        await warn_if_unreachable(self.discovery, plane.endpoint)
        # Before engine init: a store that is down shows in the log at once, not after a minute.
        registration = self.registration = self.discovery.registration()
        closer.push("discovery registration", registration.close)
        logger.info("Discovery: %s backend, %s", self.discovery.backend, self.discovery.describe())
        await registration.connect()
        startup_stop.check()

        logger.info(
            "Engine init: starting the %s engine for model %s (served as %s)",
            config.engine,
            config.model,
            engine.served_model_name,
        )
        began = time.perf_counter()
        closer.push("engine", lambda: shutdown_engine(engine))
        await engine.start()
        logger.info("Engine init done in %.0f ms", (time.perf_counter() - began) * 1000.0)
        if config.self_benchmark.enabled:
            from dynamo.vllm.self_benchmark import run_self_benchmark

            startup_stop.check()  # minutes of benchmark for a process that is stopping: no
            await run_self_benchmark(engine, config)
        # After the engine's shutdown, so it closes before it: in-flight requests finish (within
        # the drain's deadline) while the engine still runs.
        closer.push("request plane", plane.close)

    async def admit(self) -> None:
        assert self.plane is not None and self.plane.endpoint is not None, "start() has run"
        assert self.engine is not None and self.registration is not None and self._closer
        registration = self.registration
        # The card carries the parser names the frontend runs over this model's output.
        card = startup_checks.card_with_parsers(self.engine.model_card, self.config)
        # What the engine resolved (its tokenizer path, say) is judged as the options were.
        refusal = startup_checks.record_refusal(
            self.config, ModelRecord(card.served_model_name, self.plane.endpoint, card=card)
        )
        if refusal is not None:
            raise OptionUnusable(refusal)
        # Right before the record is published (the frontend routes to it from then on): a
        # signal recorded by now stops start-up, whether or not its cancellation got here.
        startup_stop.check()
        record = await register_model(registration, card, self.plane.endpoint)
        # Closes first: the record goes (file: heartbeat stopped, then the file; etcd: the lease
        # revoked) before the request plane drains.
        self._closer.push("model registration", lambda: unregister_model(registration, record))
        self.registered = True
        logger.info("Worker serving model %s; stop it with SIGTERM or SIGINT", record.model)
        if self.maintenance is not None:
            self.maintainer = self._maintainer(record, self._closer)
            self._closer.push("GC maintainer", self.maintainer.stop)  # closes first
            self.maintainer.start()

    def _maintainer(self, record: ModelRecord, closer: Closer) -> GcMaintainer:
        """The serving-time maintainer of ``--gc-maintenance``: idle on the gate, or withdraw
        (its peers watched, the model's maintenance lock in the store)."""
        maintenance, gate = self.maintenance, self.gate
        assert maintenance is not None and gate is not None and self.registration is not None
        quiescence: Quiescence = maintenance.idle_quiescence(gate)
        if maintenance.settings.mode == MAINTENANCE_WITHDRAW:
            peers = Peers(self.discovery, record.model, record.instance_id)
            lock = self.discovery.maintenance_lock(record.model, record.instance_id)
            closer.push("GC maintenance lock", lock.close)
            closer.push("GC maintenance peers", peers.stop)
            peers.start()
            quiescence = WithdrawQuiescence(
                gate,
                registration=self.registration,
                lock=lock,
                peers=peers,
                idle=maintenance.idle_quiescence(gate),
                bound_s=self.config.drain_timeout,
                context=self.freeze_context,
            )
        return maintenance.maintainer(
            quiescence, context=self.freeze_context, pause_log_ms=self.config.gc_pause_log_ms
        )

    def not_ready_reason(self) -> str | None:
        """Why /health is not ready once the phase is ``serving``: the frontend routes to this
        worker only once its record is published, so readiness waits for it too."""
        return None if self.registered else "the model is not registered in discovery yet"

    async def serve(self, signals: StopSignals) -> int:
        assert self.plane is not None and self.engine is not None, "start() has run"
        death = await serve_until_stopped(signals, self.engine)
        if self.maintainer is not None:
            await self.maintainer.stop()  # first: no maintenance once serving ends
        if death is not None:
            # The one ERROR line. Then, as for a drain but with no grace period: new requests
            # are refused, the record goes at once, the requests in flight end with an in-band
            # error, the other ranks are reaped, GC state is put back; exit 1.
            logger.error("Worker stopped: the engine died: %s", death)
            self.plane.fail(f"worker failed: the engine died ({death})")
            lifecycle.mark_draining("the engine died")
            return 1
        reason = signals.received
        assert reason is not None, "serve_until_stopped returned for a signal"
        self.plane.drain.start(self.plane.drain_grace_s)  # one deadline, from the signal
        # Draining refuses new requests at once; then the record is removed, in-flight requests
        # finish within the deadline, the engine stops and the system port closes.
        lifecycle.mark_draining(reason)
        return 0


async def start_system_port(
    config: WorkerConfig,
    metrics: DynamoMetrics,
    closer: Closer,
    *,
    not_ready: NotReadyCheck | None = None,
) -> None:
    """/live, /health and /metrics on --system-port, from the start so probes see `starting`.

    A port that cannot be bound raises :class:`StartupFailed` naming --system-port.
    """
    port = config.system_port
    if port is None:  # --debug-gc-endpoint without it was refused or warned about at start-up
        return
    server = await startup_checks.listening(
        lambda: start_system_server(
            metrics,
            host=config.system_host,
            port=port,
            debug_gc_endpoint=config.debug_gc_endpoint,
            not_ready=not_ready,
        ),
        host=config.system_host,
        port=port,
        host_option=backend_args.SYSTEM_HOST,
        port_option=backend_args.SYSTEM_PORT,
    )
    closer.push("system server", server.stop)


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


async def shutdown_engine(engine: Engine) -> None:
    began = time.perf_counter()
    await engine.shutdown()
    logger.info("Engine shut down in %.0f ms", (time.perf_counter() - began) * 1000.0)


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
