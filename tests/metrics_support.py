"""Reading a Prometheus scrape in the metrics tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

#: A sample's key: its name and its labels, sorted.
SampleKey = tuple[str, tuple[tuple[str, str], ...]]


def parse(text: str) -> dict[SampleKey, float]:
    """Every sample of a text exposition, by name and labels (parsing fails on a malformed one)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[SampleKey, float], name: str, **labels: str) -> float:
    """The value of one sample; 0 for a series not (yet) in the scrape."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: dict[SampleKey, float], after: dict[SampleKey, float], name: str, **labels: str) -> float:
    """How much a counter grew between two scrapes (counters are per process, not per test)."""
    return value(after, name, **labels) - value(before, name, **labels)
