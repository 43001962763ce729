"""kvtier._prom: the library's Prometheus text read back, and a histogram's
increase turned into observations with the same buckets and sum (what the
vLLM and SGLang adapters export; see test_vllm_metrics.py and
test_sglang_metrics.py for the engines' registries)."""

from __future__ import annotations

import math

import numpy as np

from kvtier import Tier, _prom

ROW = 4096


def _run_jobs(tier: Tier, n: int, first: int) -> None:
    for i in range(n):
        tier.submit_store(first + i, [bytes([i % 256]) * 16], [i % 4])
    done = []
    while len(done) < n:
        assert tier.wait(10.0), "jobs did not finish"
        done += tier.poll()
    assert all(r.ok for r in done), done


def test_every_family_of_a_tier_is_among_the_exported():
    """The set the adapters declare holds each family a memory and a disk
    tier render, with its type: a family the library adds is declared too."""
    declared = {f.name: f.kind for f in _prom.exported_families()}
    assert "kvtier_io_deadlines_missed_total" in declared and "kvtier_io_threads_stuck" in declared
    assert declared["kvtier_job_latency_seconds"] == "histogram"
    buf = np.zeros((4, ROW), dtype=np.uint8)
    with Tier(buf, capacity_bytes=1 << 20, namespace="m") as tier:
        rendered = _prom.parse(tier.metrics())
    assert rendered and {n: f.kind for n, f in rendered.items()}.items() <= declared.items()


def test_histogram_increases_become_observations_with_the_same_buckets_and_sum():
    buf = np.zeros((4, ROW), dtype=np.uint8)
    deltas = _prom.Deltas()
    with Tier(buf, capacity_bytes=1 << 20, io_threads=2) as tier:
        _run_jobs(tier, 5, 1)
        seen: dict[tuple[str, ...], list[float]] = {}
        for round_ in range(2):
            fam = _prom.parse(tier.metrics())["kvtier_job_latency_seconds"]
            for labelvalues, values in deltas.observations(fam).items():
                seen.setdefault(labelvalues, []).extend(values)
            if round_ == 0:
                _run_jobs(tier, 3, 10)  # the second reading adds only these
    assert len(seen[("store",)]) == 8 and seen.get(("load",), []) == []
    buckets = fam.buckets
    for (sample, labelvalues, le, value) in fam.samples:
        got = seen.get(labelvalues, [])
        if sample.endswith("_count"):
            assert len(got) == value
        elif sample.endswith("_sum"):
            assert math.isclose(sum(got), value, rel_tol=1e-9, abs_tol=1e-15), (sum(got), value)
        elif le is not None and not math.isinf(le):
            # le is inclusive: how many observations are at most le.
            assert sum(1 for v in got if v <= le) == value, (labelvalues, le)
    assert all(b > a for a, b in zip(buckets, buckets[1:])), buckets


def test_a_counter_that_starts_over_reports_its_whole_value():
    deltas = _prom.Deltas()
    assert deltas.increase("c", (), None, 5) == 5
    assert deltas.increase("c", (), None, 7) == 2
    assert deltas.increase("c", (), None, 3) == 3  # a new tier behind the same reporter


def test_the_docs_table_names_every_exported_series():
    """docs/observability.md maps each native family to its vLLM and SGLang
    name: a family the library adds and the adapters export is documented."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    for fam in _prom.exported_families():
        for name in (f"`{fam.name}", f"`vllm:{fam.name}`", f"`sglang:{fam.name}`"):
            assert name in doc, f"docs/observability.md does not name {name}"
