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

**Label cardinality is bounded.** ``model`` is never the client's raw string: it is the name
of a model the registry serves (a discovery record's word, so bounded too: at most
:data:`MAX_MODEL_LABELS` distinct names get their own series, later ones share
:data:`OTHER_MODEL`); a request whose model the registry does not serve (a typo, a 404, a body
that does not parse) is counted under :data:`UNKNOWN_MODEL`. The other labels take values from
fixed sets. Upstream reads its bucket ranges from ``DYN_METRICS_*`` environment variables; this
frontend uses upstream's defaults and no overrides (one declared option per setting is the
project's rule, and nobody has asked for them yet).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
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
OTHER_MODEL = "other"
MAX_MODEL_LABELS = 64


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

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
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
        self._models: set[str] = set()

    def model_label(self, served_name: str) -> str:
        """The ``model`` label of a model the registry serves: its name, while fewer than
        :data:`MAX_MODEL_LABELS` names have been seen, else :data:`OTHER_MODEL`."""
        if served_name in self._models:
            return served_name
        if len(self._models) >= MAX_MODEL_LABELS:
            return OTHER_MODEL
        self._models.add(served_name)
        return served_name

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
        self._metrics.inflight.labels(self._model).inc()
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
            metrics.inflight.labels(model).dec()
        if self._prompt_tokens is not None:
            metrics.osl.labels(model).observe(self._tokens)
        failed = self._error is not None
        metrics.requests.labels(
            model,
            self._endpoint,
            STREAM if self.stream else UNARY,
            ERROR if failed else SUCCESS,
            self._error if failed else ERROR_NONE,
        ).inc()
        metrics.duration.labels(model).observe(time.perf_counter() - self._started)
