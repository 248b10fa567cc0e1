"""The frontend's request metrics: upstream Dynamo's ``dynamo_frontend_*`` family.

Names, labels, label values and bucket rules are upstream's (ai-dynamo/dynamo: the names in
``lib/runtime/src/metrics/prometheus_names.rs``, module ``frontend_service``; the families,
labels and default buckets in ``lib/llm/src/http/service/metrics.rs``, ``Metrics::new`` and
``generate_log_buckets``; the catalog at
https://docs.nvidia.com/dynamo/v1.6.2/reference/observability/metrics-catalog), so a dashboard
or an alert written for upstream's frontend reads ours unchanged:

* ``dynamo_frontend_requests_total`` (counter): ``model``, ``endpoint`` (``chat_completions``,
  ``completions``), ``request_type`` (``stream``, ``unary``), ``status`` (``success``,
  ``error``), ``error_type`` (empty on success; ``validation``, ``not_found``, ``overload``,
  ``cancelled``, ``internal``, ``not_implemented``);
* ``dynamo_frontend_inflight_requests`` (gauge), ``dynamo_frontend_output_tokens_total``
  (counter): ``model``;
* histograms by ``model``: ``dynamo_frontend_request_duration_seconds``,
  ``dynamo_frontend_time_to_first_token_seconds``, ``dynamo_frontend_inter_token_latency_seconds``,
  ``dynamo_frontend_input_sequence_tokens``, ``dynamo_frontend_output_sequence_tokens``.

What is measured where (as upstream's ``InflightGuard`` / ``ResponseMetricCollector`` do):
every request to the two completion endpoints is counted, from the handler's start to its last
byte; time to first token is from the handler's start to the first item of the worker's answer
that carries tokens; each later item of ``n`` tokens observes ``n`` inter-token latencies of
(time since the previous item) / ``n``; the input length is observed with the first token, the
output length when the request ends (if a worker was asked).

**Label cardinality is bounded, and follows what is served.** ``model`` is never the client's
raw string: it is the name of a model the registry serves (a discovery record's word). A model
served now always has its own series (the registry serves at most ``--dyn-max-models``); a model
no longer served keeps its series while it is among the :data:`MAX_GONE_MODEL_LABELS` most
recently used of the gone ones, and beyond that gives its label up: its series are removed from
the registry (so /metrics stops showing them) when a newer model needs a label, never while one
of its requests is in flight. A request whose model the registry does not serve (a typo, a 404,
a body that does not parse) is counted under :data:`UNKNOWN_MODEL`. The other labels take
values from fixed sets.

Upstream reads its bucket ranges from ``DYN_METRICS_*`` environment variables; this frontend
uses upstream's defaults and no overrides (one declared option per setting is the project's
rule, and nobody has asked for them yet).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dynamo.frontend.openai import protocol as oai

PREFIX = "dynamo_frontend"
REQUESTS_TOTAL = f"{PREFIX}_requests_total"
INFLIGHT_REQUESTS = f"{PREFIX}_inflight_requests"
REQUEST_DURATION_SECONDS = f"{PREFIX}_request_duration_seconds"
TIME_TO_FIRST_TOKEN_SECONDS = f"{PREFIX}_time_to_first_token_seconds"
INTER_TOKEN_LATENCY_SECONDS = f"{PREFIX}_inter_token_latency_seconds"
INPUT_SEQUENCE_TOKENS = f"{PREFIX}_input_sequence_tokens"
OUTPUT_SEQUENCE_TOKENS = f"{PREFIX}_output_sequence_tokens"
OUTPUT_TOKENS_TOTAL = f"{PREFIX}_output_tokens_total"

# Label values (upstream's frontend_service::{status, request_type, error_type}).
ENDPOINT_CHAT = "chat_completions"
ENDPOINT_COMPLETIONS = "completions"
SUCCESS, ERROR = "success", "error"
STREAM, UNARY = "stream", "unary"
ERROR_NONE = ""  # upstream's error_type of a successful request
VALIDATION = "validation"
NOT_FOUND = "not_found"
OVERLOAD = "overload"
CANCELLED = "cancelled"
INTERNAL = "internal"
NOT_IMPLEMENTED = "not_implemented"

UNKNOWN_MODEL = "unknown"
# How many models no longer served keep their series (the most recently used first): enough for
# a worker's restart or a rolling update to keep its history, bounded against model churn.
MAX_GONE_MODEL_LABELS = 64


def log_buckets(low: float, high: float, count: int) -> tuple[float, ...]:
    """Upstream's ``generate_log_buckets``: 0, then ``count - 1`` log-spaced values from just
    above ``low`` up to ``high``, each rounded to two significant figures, duplicates dropped."""
    buckets = [0.0]
    for i in range(1, count):
        value = math.exp(math.log(low) + (math.log(high) - math.log(low)) * i / (count - 1))
        rounded = _two_significant(value)
        if rounded != buckets[-1]:
            buckets.append(rounded)
    return tuple(buckets)


def _two_significant(value: float) -> float:
    magnitude = math.floor(math.log10(abs(value)))
    scale = 10.0 ** (1 - magnitude)
    return math.floor(value * scale + 0.5) / scale  # Rust's f64::round: half away from zero


# Upstream's defaults: (min, max, count) of DYN_METRICS_{REQUEST_DURATION,INPUT_SEQUENCE,
# OUTPUT_SEQUENCE,TTFT,ITL}_{MIN,MAX,COUNT}.
REQUEST_DURATION_BUCKETS = log_buckets(1.0, 512.0, 10)
INPUT_SEQUENCE_BUCKETS = log_buckets(50.0, 128000.0, 12)
OUTPUT_SEQUENCE_BUCKETS = log_buckets(50.0, 32000.0, 10)
TTFT_BUCKETS = log_buckets(0.001, 480.0, 18)
ITL_BUCKETS = log_buckets(0.001, 2.0, 13)


def error_type(status: int) -> str:
    """The ``error_type`` of a request answered with HTTP ``status`` (upstream's mapping)."""
    if status == 404:
        return NOT_FOUND
    if status in (429, 503, 529):
        return OVERLOAD
    if status == 501:
        return NOT_IMPLEMENTED
    if 400 <= status < 500:
        return VALIDATION
    return INTERNAL


class RequestMetrics:
    """The ``dynamo_frontend_*`` family on ``registry`` (the process's own, served on /metrics)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        is_served: Callable[[str], bool] = lambda name: False,
        max_gone_labels: int = MAX_GONE_MODEL_LABELS,
    ) -> None:
        """``is_served``: whether the registry serves a model now (its label is never given
        up); ``max_gone_labels``: how many others keep theirs (see the module docstring)."""
        registry = registry if registry is not None else CollectorRegistry()
        self.registry = registry
        self.requests = Counter(
            REQUESTS_TOTAL,
            "Total number of LLM requests processed",
            ["model", "endpoint", "request_type", "status", "error_type"],
            registry=registry,
        )
        self.inflight = Gauge(
            INFLIGHT_REQUESTS, "Number of inflight requests", ["model"], registry=registry
        )
        self.duration = Histogram(
            REQUEST_DURATION_SECONDS,
            "Duration of LLM requests",
            ["model"],
            buckets=REQUEST_DURATION_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            TIME_TO_FIRST_TOKEN_SECONDS,
            "Time to first token in seconds",
            ["model"],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.itl = Histogram(
            INTER_TOKEN_LATENCY_SECONDS,
            "Inter-token latency in seconds",
            ["model"],
            buckets=ITL_BUCKETS,
            registry=registry,
        )
        self.isl = Histogram(
            INPUT_SEQUENCE_TOKENS,
            "Input sequence length in tokens",
            ["model"],
            buckets=INPUT_SEQUENCE_BUCKETS,
            registry=registry,
        )
        self.osl = Histogram(
            OUTPUT_SEQUENCE_TOKENS,
            "Output sequence length in tokens",
            ["model"],
            buckets=OUTPUT_SEQUENCE_BUCKETS,
            registry=registry,
        )
        self.output_tokens = Counter(
            # prometheus_client adds "_total" to a counter's name itself.
            OUTPUT_TOKENS_TOTAL.removesuffix("_total"),
            "Total number of output tokens generated (updates in real-time)",
            ["model"],
            registry=registry,
        )
        self._is_served = is_served
        self._max_gone_labels = max_gone_labels
        # Every model label with series, least recently used first; the request counter's label
        # sets of each (to remove them with the label); requests in flight per label.
        self._labels: OrderedDict[str, set[tuple[str, ...]]] = OrderedDict()
        self._inflight: dict[str, int] = {}

    def model_label(self, served_name: str) -> str:
        """The ``model`` label of a model the registry serves: its own name. A new label may
        make a model long gone give its label up (see the module docstring)."""
        if served_name in self._labels:
            self._labels.move_to_end(served_name)
            return served_name
        self._give_up_gone_labels()
        self._labels[served_name] = set()
        return served_name

    def labels(self) -> list[str]:
        """The model labels with series now, least recently used first (for tests, diagnosis)."""
        return list(self._labels)

    def _give_up_gone_labels(self) -> None:
        gone = [
            name
            for name in self._labels
            if not self._is_served(name) and not self._inflight.get(name)
        ]
        # Room for the new label among the gone ones, should it go too before it is used again.
        for name in gone[: max(0, len(gone) - self._max_gone_labels + 1)]:
            self._remove_series(name)

    def _remove_series(self, name: str) -> None:
        for label_set in self._labels.pop(name):
            self.requests.remove(*label_set)
        for metric in (
            self.inflight, self.duration, self.ttft, self.itl, self.isl, self.osl,
            self.output_tokens,
        ):  # fmt: skip
            try:
                metric.remove(name)
            except KeyError:  # no series of that metric yet
                pass

    def _count_request(self, label_set: tuple[str, ...]) -> None:
        self.requests.labels(*label_set).inc()
        sets = self._labels.get(label_set[0])
        if sets is not None:
            sets.add(label_set)

    def _enter(self, model: str) -> None:
        self._inflight[model] = self._inflight.get(model, 0) + 1
        self.inflight.labels(model).inc()

    def _leave(self, model: str) -> None:
        left = self._inflight.get(model, 1) - 1
        if left:
            self._inflight[model] = left
        else:
            self._inflight.pop(model, None)
        self.inflight.labels(model).dec()

    @contextmanager
    def request(self, endpoint: str) -> Iterator[RequestTrack]:
        """Track one request from its handler's start; the outcome is read from how the block
        ends (an OpenAI error's status, a cancellation) unless the block said it itself."""
        track = RequestTrack(self, endpoint)
        try:
            yield track
        except oai.ApiError as exc:
            track.fail(error_type(exc.status))
            raise
        except web.HTTPException as exc:
            track.fail(error_type(exc.status))
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            if not track.answered:  # a client gone after the whole answer was sent is no failure
                track.fail(CANCELLED)
            raise
        except BaseException:
            track.fail(INTERNAL)
            raise
        finally:
            track.close()


class RequestTrack:
    """One request's measurements; the service tells it what happened, in order."""

    def __init__(self, metrics: RequestMetrics, endpoint: str) -> None:
        self._metrics = metrics
        self._endpoint = endpoint
        self._started = time.perf_counter()
        self._model = UNKNOWN_MODEL
        self._inflight = False
        self.stream = False
        self._error: str | None = None
        self._prompt_tokens: int | None = None
        self._tokens = 0
        self._last: float | None = None
        # The whole answer is written (a stream's last event): what happens after (the
        # workers' streams closing, the client going) does not change the outcome.
        self.answered = False

    def served(self, model: str) -> None:
        """The request names a model the registry serves: from here on it is in flight."""
        self._model = self._metrics.model_label(model)
        self._metrics._enter(self._model)
        self._inflight = True

    def sent(self, prompt_tokens: int) -> None:
        """The request goes to a worker with this many prompt tokens."""
        self._prompt_tokens = prompt_tokens

    def tokens(self, total: int) -> None:
        """The completion has ``total`` tokens now (called once per item of the answer)."""
        new = total - self._tokens
        if new <= 0:
            return
        now = time.perf_counter()
        metrics, model = self._metrics, self._model
        metrics.output_tokens.labels(model).inc(new)
        if self._last is None:
            metrics.ttft.labels(model).observe(now - self._started)
            if self._prompt_tokens is not None:
                metrics.isl.labels(model).observe(self._prompt_tokens)
        else:
            itl = metrics.itl.labels(model)
            each = (now - self._last) / new
            for _ in range(new):
                itl.observe(each)
        self._tokens, self._last = total, now

    def fail(self, kind: str) -> None:
        """The request ended in an error of this ``error_type`` (the first one said counts)."""
        if self._error is None:
            self._error = kind

    def close(self) -> None:
        metrics, model = self._metrics, self._model
        if self._inflight:
            metrics._leave(model)
        if self._prompt_tokens is not None:
            metrics.osl.labels(model).observe(self._tokens)
        error = self._error
        metrics._count_request(
            (
                model,
                self._endpoint,
                STREAM if self.stream else UNARY,
                SUCCESS if error is None else ERROR,
                ERROR_NONE if error is None else error,
            )
        )
        metrics.duration.labels(model).observe(time.perf_counter() - self._started)
