"""Every series of the library's own Prometheus text (Tier.metrics()) reaches
vLLM's registry as ``vllm:`` + its native name, with its value: counters,
gauges, the latency histograms, deadline misses, stuck threads and (Redis)
the client's counters. Through vLLM's own OffloadPromMetrics, as
test_vllm_prometheus_registry_exposes_kvtier_series does for the adapter's
series. Skipped without vLLM (test_vllm_adapter's import skips it)."""

from __future__ import annotations

import functools
import time
from types import SimpleNamespace

import pytest
from metrics_helpers import assert_every_series_exported, record_reads
from test_vllm_adapter import finished, job, keys, make  # noqa: F401 (make is a fixture)

from kvtier import _prom, _vllm_metrics


def _registry_and_prom():
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadPromMetrics

    tier_config = {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm"}
    extra = {"spec_name": "TieringOffloadingSpec", "secondary_tiers": [tier_config]}
    registry = CollectorRegistry()
    prom = OffloadPromMetrics(
        SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra)),
        {cls: functools.partial(cls, registry=registry) for cls in (Gauge, Counter, Histogram)},
        ["model_name", "engine"],
        {0: ["m", "0"]},
    )
    return registry, prom


def _exercise(tier):
    tier.submit_store(job(1, keys(1, 2), [0, 1]))
    finished(tier, 1)
    tier.submit_store(job(2, keys(3), [2]))
    finished(tier, 1)
    tier.submit_load(job(3, keys(1), [3], load=True))
    finished(tier, 1)


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_every_library_series_reaches_vllms_registry(make, backend, request):  # noqa: F811
    cfg = {}
    if backend == "redis":
        cfg = {"backend": "redis", "url": request.getfixturevalue("redis_url"), "key_prefix": f"m{time.monotonic_ns()}"}
    tier, _ = make(rows=4, **cfg)
    registry, prom = _registry_and_prom()
    _exercise(tier)
    reads = record_reads(tier._tier)
    prom.observe(tier.get_stats().data, 0)
    checked = assert_every_series_exported(
        reads[-1], registry, "vllm:", {"tier_type": "KVTierSecondaryTier", "backend": backend, "engine": "0"}
    )
    want = {"kvtier_io_deadlines_missed_total", "kvtier_io_threads_stuck", "kvtier_job_latency_seconds_bucket"}
    assert want <= checked
    if backend == "redis":
        assert {"kvtier_redis_moved_total", "kvtier_redis_reconnects_total"} <= checked


def test_the_second_report_carries_only_the_increase(make, monkeypatch):  # noqa: F811
    monkeypatch.setattr(_vllm_metrics, "LIBRARY_INTERVAL_S", 0.0)  # report the library's text every time
    tier, _ = make(rows=4)
    registry, prom = _registry_and_prom()
    _exercise(tier)
    reads = record_reads(tier._tier)
    prom.observe(tier.get_stats().data, 0)
    tier.submit_store(job(4, keys(4), [0]))
    finished(tier, 1)
    prom.observe(tier.get_stats().data, 0)
    assert len(reads) == 2
    assert_every_series_exported(
        reads[-1], registry, "vllm:", {"tier_type": "KVTierSecondaryTier", "backend": "memory"}
    )


def test_the_library_text_is_read_at_most_once_per_interval(make, monkeypatch):  # noqa: F811
    # An hour: the second get_stats is within it however slow this machine is.
    monkeypatch.setattr(_vllm_metrics, "LIBRARY_INTERVAL_S", 3600.0)
    tier, _ = make(rows=4)
    first = tier.get_stats().data["data"]
    again = tier.get_stats().data["data"]
    assert "vllm:kvtier_used_bytes" in first
    assert "vllm:kvtier_used_bytes" not in again  # within LIBRARY_INTERVAL_S of the first


def test_every_declared_family_is_a_vllm_definition():
    defs = _vllm_metrics.definitions()
    for fam in _prom.exported_families():
        name = "vllm:" + (_prom.base_name(fam) if fam.kind == "counter" else fam.name)
        assert name in defs, name
        assert defs[name].labelnames == ("tier_type", "backend") + fam.labels
