"""A discovery record: one registered model instance, as both stores hold it.

A record is opaque JSON to the stores (:meth:`ModelRecord.to_json` / ``from_json``), at most
:data:`MAX_RECORD_BYTES` long. Records are written by workers, which are peers, not
administrators: :meth:`ModelRecord.from_json` validates every field before anything else sees
it, and a record that does not validate is skipped by the watchers with one WARNING.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pydantic

from dynamo.runtime.model_card import ModelCard

# A record unchanged (file) or unrenewed (etcd) for this long is treated as gone: the default of
# --discovery-ttl.
DEFAULT_LEASE_TTL_S = 10.0
# The largest record either backend reads (bytes of JSON). Ours are ~1 KiB (the model card names
# tokenizer files by path); a file or an etcd value over this is skipped with one WARNING and
# never read whole, so a stray huge file cannot take the frontend's memory.
MAX_RECORD_BYTES = 1 << 20


@dataclass(frozen=True)
class ModelRecord:
    """One registered model instance: which model, and where its request plane listens."""

    model: str
    endpoint: str  # base URL of the worker's request plane, e.g. http://127.0.0.1:40123
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    pid: int = field(default_factory=os.getpid)
    registered_at: float = field(default_factory=time.time)
    # The lease (None: a record without one, as written before leases existed). `heartbeat`
    # counts rewrites, so every rewrite changes the content; `heartbeat_at` is the writer's
    # wall clock, informative only (watchers never compare it with theirs).
    heartbeat: int | None = None
    heartbeat_at: float | None = None
    heartbeat_interval_s: float | None = None
    # What a frontend needs to serve the model (None: a record from an older worker, which a
    # frontend refuses to serve rather than guess a tokenizer for).
    card: ModelCard | None = None

    @property
    def has_lease(self) -> bool:
        return self.heartbeat is not None

    def to_json(self) -> str:
        # Absent lease fields are left out: the record keeps the shape older readers know.
        data = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }
        if self.card is not None:
            data["card"] = self.card.model_dump(mode="json")
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelRecord:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("record is not a JSON object")
        try:
            record = cls(
                model=data["model"],
                endpoint=data["endpoint"],
                instance_id=data["instance_id"],
                pid=int(data.get("pid", 0)),
                registered_at=float(data.get("registered_at", 0.0)),
                heartbeat=_optional(int, data.get("heartbeat")),
                heartbeat_at=_optional(float, data.get("heartbeat_at")),
                heartbeat_interval_s=_optional(float, data.get("heartbeat_interval_s")),
                card=_optional(ModelCard.model_validate, data.get("card")),
            )
        except KeyError as exc:
            raise ValueError(f"record lacks field {exc.args[0]!r}") from None
        except pydantic.ValidationError as exc:
            raise ValueError(f"record has an invalid model card: {_first_error(exc)}") from None
        except (TypeError, OverflowError) as exc:  # "pid": null, "registered_at": {}, Infinity
            raise ValueError(f"record has a field of the wrong type: {exc}") from None
        for name in ("model", "endpoint", "instance_id"):
            value = getattr(record, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"record field {name!r} must be a non-empty string")
        interval = record.heartbeat_interval_s
        if interval is not None and not (math.isfinite(interval) and interval > 0):
            raise ValueError("record field 'heartbeat_interval_s' must be a positive number")
        problem = endpoint_problem(record.endpoint)
        if problem is not None:
            raise ValueError(f"record field 'endpoint' {record.endpoint[:200]!r}: {problem}")
        return record


def endpoint_problem(endpoint: str) -> str | None:
    """Why ``endpoint`` is not a request-plane URL a frontend can route to (None: it is).

    What a worker writes: ``http://host[:port]``, the host an IP literal or an ASCII name the
    resolver's IDNA codec takes (labels of 1-63 characters), the port ASCII digits. Checked when
    a record is read, so a record that would fail every request routed to it (a 64-character
    label fails in the IDNA codec: a 500 and a traceback per request; a fullwidth port digit
    silently meant another port) is skipped with the one WARNING a malformed record gets.
    """
    if not endpoint.isascii() or any(ord(c) < 0x21 or ord(c) == 0x7F for c in endpoint):
        return "must be ASCII, without blanks or control characters"
    try:
        parts = urlsplit(endpoint)
        port = parts.port
        if "[" in parts.netloc:
            # A bracketed host is an IPv6 literal: 3.11's urlsplit checks it, 3.10's does not.
            ipaddress.IPv6Address(parts.hostname or "")
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme != "http":
        return "must start with http://"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username is not None:
        return "must be http://host:port (no path, query or user)"
    host = parts.hostname
    if not host:
        return "has no host"
    port_text = parts.netloc.rsplit("]", 1)[-1].partition(":")[2]  # after an IPv6 literal
    if (port_text and not port_text.isdigit()) or port == 0:  # 3.10's urlsplit takes "+1"
        return "the port must be between 1 and 65535"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        encoded = host.encode("idna")
    except UnicodeError:
        return f"host {host[:100]!r} is not a valid host name (labels are 1-63 characters)"
    if len(encoded.rstrip(b".")) > 253 or ".." in host or host.startswith("."):
        return f"host {host[:100]!r} is not a valid host name"
    return None


def _optional(convert: Callable, value: object):
    return None if value is None else convert(value)


def _first_error(exc: pydantic.ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "card"
    return f"{where}: {error['msg']}"
