"""Every series of the library's own Prometheus text (Tier.metrics()) is
recorded by the SGLang backend in prometheus_client as ``sglang:`` + its
native name, with its value, when SGLang collects its storage metrics
(get_stats): SGLang's StorageMetrics has no room for them. Skipped without
SGLang (sglang_helpers' import skips it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sglang_helpers import indices, load, make_backend, round_trip  # noqa: I001 (skips the module without SGLang)

from metrics_helpers import assert_every_series_exported, record_reads
from prometheus_client import CollectorRegistry

from kvtier import _sglang_metrics


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_every_library_series_reaches_prometheus_client(backend, request):
    cfg = {"backend": "memory", "capacity_bytes": "64MiB"}
    if backend == "redis":
        cfg = {"backend": "redis", "url": request.getfixturevalue("redis_url"), "capacity_bytes": "64MiB"}
    b = make_backend(cfg, metrics=True, tp_rank=0)
    registry = CollectorRegistry()
    b._exporter = _sglang_metrics.Exporter(b.backend, 0, registry=registry)
    try:
        round_trip(b, "page_first")  # stores and loads: both kinds in every family
        reads = record_reads(b.tier)
        b.get_stats()
        checked = assert_every_series_exported(reads[-1], registry, "sglang:", {"backend": backend, "tp_rank": "0"})
        want = {"kvtier_io_deadlines_missed_total", "kvtier_io_threads_stuck", "kvtier_block_io_seconds_bucket"}
        assert want <= checked
        if backend == "redis":
            assert {"kvtier_redis_ask_total", "kvtier_redis_slot_map_reads_total"} <= checked
    finally:
        b.close()


def test_counters_carry_only_what_changed_and_reads_are_paced(monkeypatch):
    # An hour: the second get_stats is within it however slow this machine is.
    monkeypatch.setattr(_sglang_metrics, "INTERVAL_S", 3600.0)
    b = make_backend({"backend": "memory", "capacity_bytes": "64MiB"}, metrics=True)
    registry = CollectorRegistry()
    b._exporter = _sglang_metrics.Exporter(b.backend, 0, registry=registry)
    try:
        pool, keys = round_trip(b, "page_first")
        reads = record_reads(b.tier)
        b.get_stats()
        ctrl = SimpleNamespace(storage_backend=b, storage_host_pool=pool, page_size=pool.page_size)
        assert load(ctrl, keys, indices(range(len(keys)))) == len(keys)
        b.get_stats()  # within INTERVAL_S of the first: not read again
        assert len(reads) == 1
        jobs = registry.get_sample_value("sglang:kvtier_jobs_total", {"backend": "memory", "tp_rank": "0",
                                                                       "kind": "load", "outcome": "ok"})
        assert jobs == 1
        b.export_metrics(force=True)
        assert len(reads) == 2
        assert_every_series_exported(reads[-1], registry, "sglang:", {"backend": "memory", "tp_rank": "0"})
    finally:
        b.close()
