"""Which models the frontend serves, and which worker instances serve each one.

The discovery watcher feeds it on the event loop (:meth:`ModelRegistry.add_instance` /
:meth:`remove_instance`). The first instance of a model starts building its chat processor from
the record's model card, in a thread (loading a real tokenizer takes from milliseconds to
seconds, and /health and every stream must not wait for it); the model is published, and
served, once the processor is built. Later instances of the same model share it and take turns
(round-robin). The model goes when its last instance goes, and with it the processor: nothing
else holds it, so its memory (the tokenizer lives in Rust) is returned then.

Records the frontend cannot serve are refused with one WARNING each, not one per poll: a record
without a model card (an older worker: serving it with a tokenizer that is not the model's own
would return garbage), a model over ``--dyn-max-models``, a model whose processor fails to
build (its files missing or broken on this host), and an instance whose card differs from the
one its model is served with. What a record says (names, endpoints, paths) is a peer's text:
escaped and bounded in every log line (:mod:`dynamo.runtime.peer_text`). Records are a peer's
to multiply (a thousand over ``--dyn-max-models``, new names for ever), so every line they
cause is budgeted per cause (:class:`~dynamo.runtime.log_budget.CauseBudgets`): at most
:data:`REFUSAL_LINES` refusals of each kind a minute, and :data:`CHANGE_LINES` INFO lines of
each kind (a model or an instance added or removed) per :data:`CHANGE_INTERVAL_S`, the next line
counting those held back.

A model is *known* while its processor is built and for :data:`GONE_MODEL_MEMORY_S` after its
last instance went (a worker killed, stopped, or whose heartbeat failed, and not back yet): the
service answers its requests 503, not 404 (a client should retry, not give up on a model that is
still deployed). At most :data:`MAX_GONE_MODELS` gone models are remembered.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dynamo.frontend.processors.chat_processor import ChatProcessor
from dynamo.runtime import peer_text
from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.log_budget import CauseBudgets
from dynamo.runtime.model_card import ModelCard

logger = logging.getLogger(__name__)

ChatEngineFactory = Callable[[ModelCard], ChatProcessor]
DEFAULT_MAX_MODELS = 64
# How long a model whose last instance went is still answered 503 rather than 404 (long enough
# for a crashed worker to be restarted and to load its engine), and how many such models are
# remembered at most (the oldest forgotten first).
GONE_MODEL_MEMORY_S = 600.0
MAX_GONE_MODELS = 1024
# Refusals (WARNING) logged per kind per REFUSAL_INTERVAL_S; a model or an instance added or
# removed (INFO) per kind per CHANGE_INTERVAL_S: as many as the default --dyn-max-models, so a
# deployment's models starting together are each named (operators and scripts wait for "Model
# added: model=M"), and a bounded log whatever a peer writes.
REFUSAL_LINES = 5
REFUSAL_INTERVAL_S = 60.0
CHANGE_LINES = DEFAULT_MAX_MODELS
CHANGE_INTERVAL_S = 10.0
_escape = peer_text.escape


@dataclass
class ModelEntry:
    name: str
    processor: ChatProcessor
    created: int = field(default_factory=lambda: int(time.time()))
    instances: dict[str, ModelRecord] = field(default_factory=dict)  # by instance id
    _turn: int = 0

    @property
    def card(self) -> ModelCard:
        return self.processor.card

    def route_order(self) -> list[ModelRecord]:
        """Every instance once, starting with the one whose turn it is (round-robin), those
        withdrawn for a GC maintenance last (tried only when no other one could take it: the
        record may lag behind an instance that is back).

        The caller tries them in this order, so one dead instance costs a retry, not a request.
        """
        records = list(self.instances.values())
        if not records:
            return []
        start = self._turn % len(records)
        self._turn += 1
        turn = records[start:] + records[:start]
        return [r for r in turn if not r.withdrawn] + [r for r in turn if r.withdrawn]


@dataclass
class _PendingModel:
    """A model whose processor is being built: the instances that arrived meanwhile."""

    card: ModelCard
    instances: dict[str, ModelRecord]
    task: asyncio.Task | None = None


class ModelRegistry:
    def __init__(
        self,
        chat_engine_factory: ChatEngineFactory,
        *,
        max_models: int = DEFAULT_MAX_MODELS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_models < 1:
            raise ValueError("max_models must be at least 1")
        self._factory = chat_engine_factory
        self.max_models = max_models
        self._clock = clock
        self._gone: dict[str, float] = {}  # model -> when its last instance went
        self._models: dict[str, ModelEntry] = {}
        self._pending: dict[str, _PendingModel] = {}
        # What was refused, so each refusal is logged once: instance ids (no card, card
        # mismatch) and model names (over the limit, processor failed), forgotten when the
        # refused record goes away.
        self._refused: dict[str, set[str]] = {}  # model name -> refused instance ids
        self._failed: dict[str, str] = {}  # model name -> why its processor failed
        # Instances refused for the model limit, by instance id: admitted, oldest first, when
        # a model goes and makes room.
        self._over_limit: dict[str, ModelRecord] = {}
        self._refusals = CauseBudgets(
            logger, lines=REFUSAL_LINES, interval_s=REFUSAL_INTERVAL_S, clock=clock
        )
        self._changes = CauseBudgets(
            logger, logging.INFO, lines=CHANGE_LINES, interval_s=CHANGE_INTERVAL_S, clock=clock
        )

    def get(self, model: str) -> ModelEntry | None:
        return self._models.get(model)

    def entries(self) -> list[ModelEntry]:
        return list(self._models.values())

    def known(self, model: str) -> bool:
        """Whether ``model`` is being loaded, or lost its last instance within
        :data:`GONE_MODEL_MEMORY_S` (it has no instance to serve it either way)."""
        if model in self._pending:
            return True
        gone = self._gone.get(model)
        if gone is None:
            return False
        if self._clock() - gone < GONE_MODEL_MEMORY_S:
            return True
        del self._gone[model]
        return False

    def _went(self, model: str) -> None:
        self._gone.pop(model, None)
        self._gone[model] = self._clock()
        while len(self._gone) > MAX_GONE_MODELS:
            del self._gone[next(iter(self._gone))]

    @property
    def building(self) -> int:
        """Models whose processor is being built (not served yet)."""
        return len(self._pending)

    async def wait_idle(self) -> None:
        """Until no processor is being built (for tests and shutdown)."""
        while self._pending:
            tasks = [p.task for p in self._pending.values() if p.task is not None]
            if not tasks:
                return
            await asyncio.wait(tasks)

    async def aclose(self) -> None:
        """Cancel builds in flight (their threads finish on their own; results are dropped)."""
        for pending in list(self._pending.values()):
            if pending.task is not None:
                pending.task.cancel()
        await asyncio.gather(
            *(p.task for p in self._pending.values() if p.task is not None),
            return_exceptions=True,
        )
        self._pending.clear()

    def _refuse(self, record: ModelRecord, cause: str, message: str, *args) -> None:
        """One refusal of ``cause``'s kind, logged once per instance and within the budget."""
        refused = self._refused.setdefault(record.model, set())
        if record.instance_id in refused:
            return
        refused.add(record.instance_id)
        self._refusals.emit(cause, message, *args)

    def add_instance(self, record: ModelRecord) -> None:
        card = record.card
        if card is None:
            self._refuse(
                record,
                "no card",
                "Model instance refused: instance=%s endpoint=%s model=%s has no model card "
                "(a worker older than the frontend?); its model is not served through it",
                record.instance_id,
                _escape(record.endpoint),
                _escape(record.model),
            )
            return
        entry = self._models.get(record.model)
        if entry is not None:
            if not self._same_card(entry.card, record):
                return
            previous = entry.instances.get(record.instance_id)
            entry.instances[record.instance_id] = record
            if previous is not None:  # the same instance, its routing state moved
                self._changes.emit(
                    "instance state",
                    "Model instance %s: model=%s instance=%s",
                    record.state or "serving again",
                    _escape(record.model),
                    record.instance_id,
                )
                return
            self._changes.emit(
                "instance added",
                "Model instance added: model=%s instance=%s endpoint=%s (%d instances)",
                _escape(record.model),
                record.instance_id,
                _escape(record.endpoint),
                len(entry.instances),
            )
            return
        pending = self._pending.get(record.model)
        if pending is not None:
            if self._same_card(pending.card, record):
                pending.instances[record.instance_id] = record
            return
        if record.model in self._failed:
            self._refuse(
                record,
                "processor failed",
                "Model instance refused: instance=%s model=%s: its chat processor failed to "
                "build (%s)",
                record.instance_id,
                _escape(record.model),
                self._failed[record.model],
            )
            return
        if len(self._models) + len(self._pending) >= self.max_models:
            self._over_limit[record.instance_id] = record
            self._refuse(
                record,
                "over the limit",
                "Model refused: model=%s instance=%s endpoint=%s: the frontend already serves "
                "%d models, the limit of --dyn-max-models / DYN_MAX_MODELS (it is served once "
                "another model goes)",
                _escape(record.model),
                record.instance_id,
                _escape(record.endpoint),
                self.max_models,
            )
            return
        self._forget_refusal(record)
        pending = _PendingModel(card=card, instances={record.instance_id: record})
        self._pending[record.model] = pending
        pending.task = asyncio.get_running_loop().create_task(
            self._build(record.model, pending), name=f"chat-processor-{record.model}"
        )

    def _forget_refusal(self, record: ModelRecord) -> None:
        refused = self._refused.get(record.model)
        if refused is not None:
            refused.discard(record.instance_id)
            if not refused:
                del self._refused[record.model]
                self._failed.pop(record.model, None)  # a later record may bring fixed files

    def _make_room(self) -> None:
        """A model went: admit the instances the limit refused, oldest first."""
        waiting, self._over_limit = self._over_limit, {}
        for record in waiting.values():
            self.add_instance(record)

    def _same_card(self, card: ModelCard, record: ModelRecord) -> bool:
        if record.card == card:
            return True
        self._refuse(
            record,
            "card differs",
            "Model instance refused: instance=%s endpoint=%s model=%s: its model card differs "
            "from the one the model is served with (tokenizer %s, context %d vs tokenizer %s, "
            "context %d); give every instance of a model the same model files",
            record.instance_id,
            _escape(record.endpoint),
            _escape(record.model),
            _escape(record.card.tokenizer_path if record.card else None),
            record.card.context_length if record.card else 0,
            _escape(card.tokenizer_path),
            card.context_length,
        )
        return False

    async def _build(self, model: str, pending: _PendingModel) -> None:
        try:
            # Off the event loop: /health and every stream keep being served meanwhile.
            processor = await _in_a_thread_of_its_own(self._factory, pending.card, model)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the model is refused, with the reason
            if self._pending.get(model) is pending:
                del self._pending[model]
            reason = _escape(str(exc) or type(exc).__name__, 1000)
            self._failed[model] = reason
            self._refused.setdefault(model, set()).update(pending.instances)
            self._refusals.emit(
                "processor failed",
                "Model refused: model=%s instances=%s: its chat processor failed to build: %s",
                _escape(model),
                _escape(",".join(pending.instances), 300),
                reason,
            )
            self._make_room()
            return
        if self._pending.get(model) is not pending:
            return  # the registry was closed meanwhile
        del self._pending[model]
        if not pending.instances:
            # Every instance went while the processor was built: drop it (it is freed here).
            self._changes.emit(
                "model gone",
                "Model %s went away while its chat processor was built",
                _escape(model),
            )
            self._went(model)
            self._make_room()
            return
        entry = ModelEntry(name=model, processor=processor, instances=pending.instances)
        self._models[model] = entry
        self._gone.pop(model, None)
        first = next(iter(entry.instances.values()))
        self._changes.emit(
            "model added",
            "Model added: model=%s instance=%s endpoint=%s (%d instances)",
            _escape(model),
            first.instance_id,
            _escape(first.endpoint),
            len(entry.instances),
        )

    def remove_instance(self, record: ModelRecord) -> None:
        refused = self._refused.get(record.model)
        if refused is not None and record.instance_id in refused:
            self._over_limit.pop(record.instance_id, None)
            self._forget_refusal(record)
            return
        pending = self._pending.get(record.model)
        if pending is not None:
            pending.instances.pop(record.instance_id, None)
            return
        entry = self._models.get(record.model)
        if entry is None or entry.instances.pop(record.instance_id, None) is None:
            return
        self._changes.emit(
            "instance removed",
            "Model instance removed: model=%s instance=%s endpoint=%s",
            _escape(record.model),
            record.instance_id,
            _escape(record.endpoint),
        )
        if not entry.instances:
            del self._models[record.model]
            self._went(record.model)
            self._changes.emit(
                "model gone",
                "Model removed: model=%s (no instance left; answered 503 for up to %g s while "
                "none comes back)",
                _escape(record.model),
                GONE_MODEL_MEMORY_S,
            )
            self._make_room()


async def _in_a_thread_of_its_own(factory: ChatEngineFactory, card: ModelCard, model: str):
    """``factory(card)`` in a thread started for it (off the event loop), which ends with it.

    Not the loop's default executor: its few threads (six on two cores) would be held by builds
    waiting on a slow one's resources (a peer's template in its compile check), and a later
    model's build would queue behind them. At most ``max_models`` builds pend at once, so at
    most that many threads; a daemon, so that the process never waits at exit for a build
    whose result nobody wants any more (the template checks are stopped with the render
    processes)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[ChatProcessor] = loop.create_future()

    def settle(outcome: ChatProcessor | BaseException) -> None:
        if future.done():  # the build was cancelled meanwhile
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def build() -> None:
        outcome: ChatProcessor | BaseException
        try:
            outcome = factory(card)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            outcome = exc
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:  # the loop is closed: nobody waits for it
            pass

    name = f"chat-processor-build-{_escape(model, 40)}"
    threading.Thread(target=build, name=name, daemon=True).start()
    return await future
