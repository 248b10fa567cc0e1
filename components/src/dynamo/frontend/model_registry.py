"""Which models the frontend serves, and which worker instances serve each one.

The discovery watcher feeds it (:meth:`ModelRegistry.add_instance` / :meth:`remove_instance`).
The first instance of a model builds its chat processor through the factory; later instances of
the same model share it and take turns (round-robin). The model goes when its last instance goes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from dynamo.runtime.discovery import ModelRecord

from .chat_processor import ChatProcessor

logger = logging.getLogger(__name__)

ChatEngineFactory = Callable[[str], ChatProcessor]


@dataclass
class ModelEntry:
    name: str
    processor: ChatProcessor
    created: int = field(default_factory=lambda: int(time.time()))
    instances: dict[str, ModelRecord] = field(default_factory=dict)  # by instance id
    _turn: int = 0

    def route_order(self) -> list[ModelRecord]:
        """Every instance once, starting with the one whose turn it is (round-robin).

        The caller tries them in this order, so one dead instance costs a retry, not a request.
        """
        records = list(self.instances.values())
        if not records:
            return []
        start = self._turn % len(records)
        self._turn += 1
        return records[start:] + records[:start]


class ModelRegistry:
    def __init__(self, chat_engine_factory: ChatEngineFactory) -> None:
        self._factory = chat_engine_factory
        self._models: dict[str, ModelEntry] = {}

    def get(self, model: str) -> ModelEntry | None:
        return self._models.get(model)

    def entries(self) -> list[ModelEntry]:
        return list(self._models.values())

    def add_instance(self, record: ModelRecord) -> None:
        entry = self._models.get(record.model)
        if entry is None:
            # Built before the entry is published: a request never sees a half-made model.
            entry = ModelEntry(name=record.model, processor=self._factory(record.model))
            self._models[record.model] = entry
            logger.info(
                "Model added: model=%s instance=%s endpoint=%s",
                record.model,
                record.instance_id,
                record.endpoint,
            )
        else:
            logger.info(
                "Model instance added: model=%s instance=%s endpoint=%s (%d instances)",
                record.model,
                record.instance_id,
                record.endpoint,
                len(entry.instances) + 1,
            )
        entry.instances[record.instance_id] = record

    def remove_instance(self, record: ModelRecord) -> None:
        entry = self._models.get(record.model)
        if entry is None or entry.instances.pop(record.instance_id, None) is None:
            return
        logger.info(
            "Model instance removed: model=%s instance=%s endpoint=%s",
            record.model,
            record.instance_id,
            record.endpoint,
        )
        if not entry.instances:
            del self._models[record.model]
            logger.info("Model removed: model=%s (no instance left)", record.model)
