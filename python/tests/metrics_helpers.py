"""Checks that an engine's Prometheus registry carries every series of a
kvtier tier's own text (Tier.metrics()), under the engine's prefix, with the
same values: used by the vLLM and SGLang metrics tests."""

from __future__ import annotations

import math

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

# The tier's labels, which the adapters replace with their own.
TIER_LABELS = ("backend", "namespace")


def record_reads(tier) -> list[str]:
    """The texts the adapter reads from `tier` (a kvtier.Tier) from now on,
    appended as it reads them: what to compare the registry with, since a
    gauge such as kvtier_resident_bytes moves on its own between readings."""
    texts: list[str] = []
    render = tier.metrics

    def metrics() -> str:
        texts.append(render())
        return texts[-1]

    tier.metrics = metrics
    return texts


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text, read by prometheus_client's parser
    (not by kvtier._prom, whose reading is what is under test)."""
    return [(s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def _same_le(a: str | None, b: str | None) -> bool:
    return a == b or (a is not None and b is not None and float(a) == float(b))


def assert_every_series_exported(native: str, registry, prefix: str, labels: dict[str, str]) -> set[str]:
    """Asserts that each sample of `native` is in `registry` as `prefix` +
    its name, labelled with `labels` and its own labels, with its value
    (a histogram's `_sum` to float precision: the adapters rebuild it from
    observations). Returns the native family names checked."""
    exported = samples(generate_latest(registry).decode())
    checked = set()
    for name, own, value in samples(native):
        own = {k: v for k, v in own.items() if k not in TIER_LABELS}
        le = own.pop("le", None)
        want = {**labels, **own}
        found = [
            v for n, lab, v in exported
            if n == prefix + name and _same_le(lab.get("le"), le)
            and all(lab.get(k) == w for k, w in want.items())
        ]
        assert len(found) == 1, f"{name}{own} (le={le}) is exported as {prefix + name} {len(found)} times"
        if name.endswith("_sum"):
            assert math.isclose(found[0], value, rel_tol=1e-6, abs_tol=1e-12), (name, found[0], value)
        else:
            assert found[0] == value, (name, own, le, found[0], value)
        checked.add(name)
    return checked
