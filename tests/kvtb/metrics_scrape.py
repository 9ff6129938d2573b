"""Scrape a service's /metrics and parse it with prometheus_client's parser."""
from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(address: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label items): value} of http://ADDRESS/metrics."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    """A sample's value (0 when absent)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
