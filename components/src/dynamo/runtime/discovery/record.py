"""A discovery record: one registered model instance, as both stores hold it.

A record is opaque JSON to the stores (:meth:`ModelRecord.to_json` / ``from_json``), at most
:data:`MAX_RECORD_BYTES` long. Records are written by workers, which are peers, not
administrators (docs/security.md): :meth:`ModelRecord.from_json` validates every field
against a strict schema with bounded sizes before anything else sees it, and a record that does
not validate is skipped by the watchers with one WARNING.

A record carries only what a frontend needs to route to the instance: the served model name,
the request plane's endpoint, the instance id (the record's key in either store), the lease
(a heartbeat counter and the interval it is renewed at), the model card, and a routing state:
absent while the instance takes requests, ``withdrawn`` while it is out for a GC maintenance
(frontends route to it last; it answers a distinct 503 meanwhile). A state this schema does not
know refuses the record, like any other invalid field. Fields that older
workers wrote for humans (``pid``, ``registered_at``, ``heartbeat_at``) are ignored when read and
no longer written: a frontend must not depend on what it cannot check.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Literal
from urllib.parse import urlsplit

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from dynamo.runtime.model_card import ModelCard

# A record unchanged (file) or unrenewed (etcd) for this long is treated as gone: the default of
# --discovery-ttl.
DEFAULT_LEASE_TTL_S = 10.0
# The largest record either backend reads (bytes of JSON). Ours are ~1 KiB (the model card names
# tokenizer files by path); a file or an etcd value over this is skipped with one WARNING and
# never read whole, so a stray huge file cannot take the frontend's memory.
MAX_RECORD_BYTES = 64 * 1024
# How many records a frontend holds at most (--discovery-max-records): with MAX_RECORD_BYTES,
# what bounds the memory that whoever can write records can make the frontend spend on them.
DEFAULT_MAX_RECORDS = 4096
# An instance id names the record in its store (the file <id>.json, the etcd key <prefix><id>):
# letters, digits, '_' and '-' only, so it can never name another path or key.
INSTANCE_ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
MAX_MODEL_NAME = 512
MAX_ENDPOINT = 512


class _RecordSchema(BaseModel):
    """What a record's JSON must hold; unknown fields (an older or newer writer's) are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    model: Annotated[StrictStr, Field(min_length=1, max_length=MAX_MODEL_NAME)]
    endpoint: Annotated[StrictStr, Field(min_length=1, max_length=MAX_ENDPOINT)]
    instance_id: Annotated[StrictStr, Field(pattern=INSTANCE_ID_PATTERN)]
    heartbeat: Annotated[StrictInt, Field(ge=0)] | None = None
    heartbeat_interval_s: Annotated[StrictFloat, Field(gt=0.0, le=3600.0)] | None = None
    card: ModelCard | None = None
    state: Literal["withdrawn"] | None = None


# The routing state of an instance out for a GC maintenance (dynamo.vllm.withdrawal).
STATE_WITHDRAWN = "withdrawn"


@dataclass(frozen=True)
class ModelRecord:
    """One registered model instance: which model, and where its request plane listens."""

    model: str
    endpoint: str  # base URL of the worker's request plane, e.g. http://127.0.0.1:40123
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # The lease (None: a record without one, as written before leases existed). `heartbeat`
    # counts rewrites, so every rewrite changes the content.
    heartbeat: int | None = None
    heartbeat_interval_s: float | None = None
    # What a frontend needs to serve the model (None: a record from an older worker, which a
    # frontend refuses to serve rather than guess a tokenizer for).
    card: ModelCard | None = None
    # None: takes requests; STATE_WITHDRAWN: out for a GC maintenance (routed to last).
    state: str | None = None

    @property
    def has_lease(self) -> bool:
        return self.heartbeat is not None

    @property
    def withdrawn(self) -> bool:
        return self.state is not None

    def serves_like(self, other: ModelRecord) -> bool:
        """Whether requests routed by ``other`` would go where they go by this record (same
        model, endpoint and card; the lease and the routing state may differ). A record
        rewritten under the same instance id that does not serve like the one known replaces
        it; one that only changed its state updates it."""
        return (self.model, self.endpoint, self.card) == (other.model, other.endpoint, other.card)

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
    def from_json(cls, text: str | bytes) -> ModelRecord:
        """The record ``text`` holds; raises :class:`InvalidRecord` (a ValueError) saying which
        field is wrong (the message quotes no more of the record than a field name: callers
        escape what they log)."""
        try:
            parsed = _RecordSchema.model_validate_json(text)
        except pydantic.ValidationError as exc:
            raise _first_error(exc) from None
        problem = endpoint_problem(parsed.endpoint)
        if problem is not None:
            raise InvalidRecord(
                "endpoint", f"record field 'endpoint' {parsed.endpoint[:200]!r}: {problem}"
            )
        return cls(
            model=parsed.model,
            endpoint=parsed.endpoint,
            instance_id=parsed.instance_id,
            heartbeat=parsed.heartbeat,
            heartbeat_interval_s=parsed.heartbeat_interval_s,
            card=parsed.card,
            state=parsed.state,
        )


class InvalidRecord(ValueError):
    """A record a frontend refuses; ``field`` is the path of the first wrong field (``model``,
    ``card.chat_template_path``; empty when the record as a whole is wrong)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def record_problem(record: ModelRecord) -> InvalidRecord | None:
    """Why a frontend would refuse ``record`` (None: it would read it), by the very checks
    :meth:`ModelRecord.from_json` makes, its size included: a worker asks this of the record it
    is about to write, so that a setting a frontend would refuse stops the worker, naming the
    option, instead of serving a model no frontend will ever route to."""
    text = record.to_json()
    size = len(text.encode("utf-8"))
    if size > MAX_RECORD_BYTES:
        return InvalidRecord(
            "", f"the record is {size} bytes, over the frontend's bound of {MAX_RECORD_BYTES}"
        )
    try:
        ModelRecord.from_json(text)
    except InvalidRecord as exc:
        return exc
    return None


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


def _first_error(exc: pydantic.ValidationError) -> InvalidRecord:
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in error["loc"])
    if error["type"] in ("json_invalid", "model_type"):
        message = "record is not a JSON object" if error["type"] == "model_type" else error["msg"]
        return InvalidRecord("", message)
    if where.startswith("card."):
        return InvalidRecord(
            where, f"record has an invalid model card: {where[5:]}: {error['msg']}"
        )
    if error["type"] == "missing":
        return InvalidRecord(where, f"record lacks field {where!r}")
    return InvalidRecord(where, f"record field {where!r}: {error['msg']}")
