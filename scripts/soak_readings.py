"""What the soak (scripts/bench_gc_soak.py) reads from the processes it runs: their log lines
and their /metrics, turned into figures.

From the logs (each line starts with its time): every GC pause the pause logger logged (at
WARNING while the process serves, at INFO while it starts or maintains: only the WARNING ones
are pauses a request can have waited on), every maintenance's line (how long its GC work took,
what it collected and reclaimed, how long the process admitted nothing), the requests held at
an idle maintenance's gate (a WARNING once the wait reaches the pause-log threshold), the
attempts given up. From /metrics: the serving full collections and the admission waits as
histograms (below the pause-log threshold no line is logged, so the longest of those is known
only to its bucket), the maintenances and the reclaimed objects as counters.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterable
from datetime import datetime

# "2026-12-06 23:56:58,957 WARNING pid=123 dynamo_gc.pause_logger: GC gen2 pause 421.8 ms ..."
_STAMP = rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
PAUSE_LINE = re.compile(_STAMP + rb"(WARNING|INFO) .*?GC gen(\d) pause ([0-9.]+) ms", re.M)
MAINTAINED_LINE = re.compile(
    _STAMP + rb"INFO .*?GC heap maintained \([^)]*\): mode=(\w+) reason=(\w+) "
    rb"took_ms=([0-9.]+) collected=(\d+) reclaimed=(\d+) frozen=(~?\d+) \w+_ms=([0-9.]+) "
    rb"waiting=(\d+)",
    re.M,
)
HELD_LINE = re.compile(
    _STAMP + rb"WARNING .*?GC maintenance \([^)]*\) held (\d+) request\(s\) at admission for "
    rb"up to ([0-9.]+) ms",
    re.M,
)
GAVE_UP_LINE = re.compile(_STAMP + rb"INFO .*?GC maintenance deferred \(", re.M)
DUE_LINE = re.compile(_STAMP + rb"WARNING .*?GC maintenance \([^)]*\) due for", re.M)


def _when(stamp: bytes) -> float:
    """A log line's time (the launchers log local time, to the millisecond) as epoch seconds."""
    return datetime.strptime(stamp.decode(), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def read_log(log: bytes, since: float) -> dict:
    """What one process logged from ``since`` (epoch seconds) on, times relative to it."""
    pauses, maintenances, held = [], [], []
    for stamp, level, generation, ms in PAUSE_LINE.findall(log):
        at = _when(stamp) - since
        if at >= 0 and level == b"WARNING":
            pauses.append({"t": at, "generation": int(generation), "ms": float(ms)})
    for (
        stamp,
        mode,
        reason,
        took,
        collected,
        reclaimed,
        frozen,
        closed,
        waiting,
    ) in MAINTAINED_LINE.findall(log):
        at = _when(stamp) - since
        if at >= 0:
            maintenances.append(
                {
                    "t": at,
                    "mode": mode.decode(),
                    "reason": reason.decode(),
                    "took_ms": float(took),
                    "collected": int(collected),
                    "reclaimed": int(reclaimed),
                    "frozen": frozen.decode(),
                    "closed_ms": float(closed),  # withdrawn, or admission held
                    "waiting": int(waiting),
                }
            )
    for stamp, count, ms in HELD_LINE.findall(log):
        at = _when(stamp) - since
        if at >= 0:
            held.append({"t": at, "requests": int(count), "ms": float(ms)})
    return {
        "serving_pauses": pauses,
        "maintenances": maintenances,
        "held": held,
        "gave_up": sum(1 for (stamp,) in _stamps(GAVE_UP_LINE, log) if _when(stamp) >= since),
        "due_warnings": sum(1 for (stamp,) in _stamps(DUE_LINE, log) if _when(stamp) >= since),
    }


def _stamps(pattern: re.Pattern, log: bytes) -> Iterable[tuple[bytes]]:
    return ((match.group(1),) for match in pattern.finditer(log))


def scrape(metrics_url: str, timeout_s: float = 10.0) -> dict:
    """A process's /metrics as prometheus_client parses it: {family name: family}; {} when it
    cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(metrics_url, timeout=timeout_s) as response:
            text = response.read().decode(errors="replace")
    except OSError:
        return {}
    return {family.name: family for family in text_string_to_metric_families(text)}


def histogram(families: dict, name: str, **labels: str) -> dict:
    """One histogram's count and sum over the series matching ``labels``, and the upper bound of
    its highest non-empty bucket in ms (the longest observation is at most that; None with no
    observation)."""
    family = families.get(name)
    if family is None:
        return {"count": 0, "sum_s": 0.0, "max_le_ms": None}
    buckets: dict[float, float] = {}
    total = count = 0.0
    for sample in family.samples:
        if any(sample.labels.get(key) != value for key, value in labels.items()):
            continue
        if sample.name.endswith("_bucket"):
            bound = float(sample.labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + sample.value
        elif sample.name.endswith("_sum"):
            total += sample.value
        elif sample.name.endswith("_count"):
            count += sample.value
    highest = None
    for bound in sorted(buckets):
        if buckets[bound] >= count and count > 0:
            highest = bound * 1000.0
            break
    return {"count": int(count), "sum_s": total, "max_le_ms": highest}


def counter(families: dict, name: str, **labels: str) -> float:
    """A counter family's total over the series matching ``labels`` (0 when it is absent)."""
    family = families.get(name)
    if family is None:
        return 0.0
    return sum(
        sample.value
        for sample in family.samples
        if sample.name.endswith("_total")
        and all(sample.labels.get(key) == value for key, value in labels.items())
    )


def process_metrics(metrics_url: str) -> dict:
    """The figures of one process's /metrics the soak reports."""
    families = scrape(metrics_url)
    return {
        "serving_gen2": histogram(
            families, "dynamo_gc_pause_seconds", generation="2", phase="serving"
        ),
        "serving_all": histogram(families, "dynamo_gc_pause_seconds", phase="serving"),
        "maintaining": histogram(families, "dynamo_gc_pause_seconds", phase="maintaining"),
        "maintenances": counter(families, "dynamo_gc_maintenance"),
        "reclaimed": counter(families, "dynamo_gc_maintenance_reclaimed_objects"),
        "gave_up": counter(families, "dynamo_gc_maintenance_gave_up"),
        "waits": histogram(families, "dynamo_gc_maintenance_wait_seconds"),
    }


class Timeline:
    """Samples taken while the load runs: resident memory per process and the load average."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.samples: list[dict] = []

    def sample(self, rss: dict[str, float | None]) -> None:
        import os

        self.samples.append(
            {"t": time.time() - self.started, "rss_mb": rss, "load1": os.getloadavg()[0]}
        )
