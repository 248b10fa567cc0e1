"""The Grafana dashboard under docs/deploy/ read the way Prometheus would: its queries, the
metric names each one reads, the labels it selects or groups by."""

from __future__ import annotations

import json
import re
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "deploy" / "grafana-dashboard.json"

# Names this project exports start with these (ours, and prometheus_client's collectors).
_METRIC = re.compile(r"\b((?:dynamo|process|python)_[A-Za-z0-9_]*)")
_SELECTOR = re.compile(r"\b((?:dynamo|process|python)_[A-Za-z0-9_]*)\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_BY = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
# Labels Prometheus or its scrape configuration adds (docs/deploy/podmonitor.yaml), and the
# bucket bound.
ADDED_LABELS = frozenset({"pod", "namespace", "instance", "job", "le"})


def queries(path: Path = DASHBOARD) -> list[str]:
    """Every PromQL expression of every panel's targets."""
    dashboard = json.loads(path.read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append(target["expr"])
    return found


def metric_names(expr: str) -> set[str]:
    """The series names ``expr`` reads (``_bucket``/``_count``/``_sum`` kept)."""
    return set(_METRIC.findall(_QUOTED.sub('""', expr)))


def selected_labels(expr: str) -> dict[str, set[str]]:
    """For each series name with a ``{...}`` selector in ``expr``, the label names it matches."""
    found: dict[str, set[str]] = {}
    for name, body in _SELECTOR.findall(expr):
        found.setdefault(name, set()).update(_MATCHER.findall(_QUOTED.sub('""', body)))
    return found


def grouping_labels(expr: str) -> set[str]:
    """The labels of every ``by (...)`` / ``on (...)`` clause in ``expr``."""
    return {
        label.strip() for group in _BY.findall(expr) for label in group.split(",") if label.strip()
    }
