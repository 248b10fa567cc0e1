"""Reading a Prometheus text scrape (nothing here is a test).

Values are read with prometheus_client's own parser, never matched as text: the exposition
format writes large values Go-style (1518904 is ``1.518904e+06``), so a test that looks for
``1518904.0`` in the text fails whenever the process's frozen count passes a million, which
depends on what ran before it.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of the sample ``name`` with exactly ``labels`` in the scrape ``metrics``."""
    for family in text_string_to_metric_families(metrics):
        for each in family.samples:
            if each.name == name and each.labels == labels:
                return float(each.value)
    raise AssertionError(f"no sample {name}{labels or ''} in the scrape:\n{metrics}")
