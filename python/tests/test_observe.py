"""What an engine observes besides results: Tier.metrics() read with
Prometheus' own text parser and checked against Tier.stats(), the completion
descriptor, the notify eventfds of add_notify_fd, and a result's io_ns.

The metrics test needs ``prometheus_client`` (python/run_tests.sh installs
it); without it the test skips, except under CI (CI=true), where it fails.
"""

from __future__ import annotations

import os
import select
import time

import numpy as np
import pytest

import kvtier
from kvtier import KVTierError, Tier

ROW = 4096


def key(i: int) -> bytes:
    return i.to_bytes(8, "big").rjust(36, b"m")


def parser():
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("prometheus_client is not installed (python/run_tests.sh installs it)")
    return text_string_to_metric_families


def finish(tier: Tier, job_id: int) -> kvtier.JobResult:
    tier.drain()
    (r,) = tier.poll()
    assert r.job_id == job_id
    return r


def test_metrics_parse_as_prometheus_text_and_match_the_stats():
    families_of = parser()
    buf = np.zeros((8, ROW), dtype=np.uint8)
    buf[:5] = np.arange(5, dtype=np.uint8)[:, None] + 1
    with Tier(buf, capacity_bytes=4 * ROW, io_threads=2, namespace="model/bf16") as tier:
        # A known workload: 3 blocks stored, a store refused for space, 2
        # blocks loaded, a load of a missing key, some lookups.
        tier.submit_store(1, [key(1), key(2), key(3)], [0, 1, 2])
        assert finish(tier, 1).ok
        tier.submit_store(2, [key(i) for i in range(10, 15)], [0, 1, 2, 3, 4])
        assert finish(tier, 2).status_name == "TIER_ERR_NO_SPACE"
        tier.submit_load(3, [key(1), key(2)], [5, 6])
        assert finish(tier, 3).ok
        tier.submit_load(4, [key(99)], [7])
        assert finish(tier, 4).status_name == "TIER_ERR_NOT_FOUND"
        tier.lookup([key(1), key(99), key(3)])

        stats = tier.stats()
        text = tier.metrics()

    families = {f.name: f for f in families_of(text)}
    samples = {}
    for family in families.values():
        assert family.documentation, f"{family.name} has no HELP"
        for s in family.samples:
            labels = dict(s.labels)
            assert labels.pop("backend") == "memory", s
            assert labels.pop("namespace") == "model/bf16", s
            samples[(s.name, tuple(sorted(labels.items())))] = s.value

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    # The parser names counter families without "_total"; samples keep it.
    assert families["kvtier_jobs"].type == "counter"
    assert families["kvtier_used_bytes"].type == "gauge"
    assert families["kvtier_job_latency_seconds"].type == "histogram"
    assert families["kvtier_block_io_seconds"].type == "histogram"

    for kind, ok, failed in (
        ("store", stats.stores_ok, stats.stores_failed),
        ("load", stats.loads_ok, stats.loads_failed),
    ):
        assert value("kvtier_jobs_total", kind=kind, outcome="ok") == ok == 1
        assert value("kvtier_jobs_total", kind=kind, outcome="failed") == failed == 1
        # One latency observation per completed job.
        assert value("kvtier_job_latency_seconds_count", kind=kind) == ok + failed
        # Buckets are cumulative and end in +Inf, which equals the count.
        for hist in ("kvtier_job_latency_seconds", "kvtier_block_io_seconds"):
            buckets = sorted(
                (float(dict(labels)["le"]), v)
                for (name, labels), v in samples.items()
                if name == hist + "_bucket" and dict(labels)["kind"] == kind
            )
            assert len(buckets) == 29 and buckets[-1][0] == float("inf")
            counts = [v for _, v in buckets]
            assert counts == sorted(counts)
            assert counts[-1] == value(hist + "_count", kind=kind)
            assert value(hist + "_sum", kind=kind) > 0
    # One block-I/O observation per block copied: 3 stored, 2 loaded (the
    # refused store and the missing key copied nothing).
    assert value("kvtier_block_io_seconds_count", kind="store") == 3
    assert value("kvtier_block_io_seconds_count", kind="load") == 2
    assert value("kvtier_transferred_bytes_total", kind="store") == stats.bytes_stored == 3 * ROW
    assert value("kvtier_transferred_bytes_total", kind="load") == stats.bytes_loaded == 2 * ROW

    for name, field in (
        ("kvtier_lookups_total", "lookups"),
        ("kvtier_lookup_hits_total", "hits"),
        ("kvtier_lookup_misses_total", "misses"),
        ("kvtier_lookup_pending_total", "lookups_pending"),
        ("kvtier_evictions_total", "evictions"),
        ("kvtier_events_dropped_total", "events_dropped"),
        ("kvtier_capacity_bytes", "capacity_bytes"),
        ("kvtier_used_bytes", "used_bytes"),
        ("kvtier_stored_blocks", "num_blocks"),
        ("kvtier_capacity_blocks", "capacity_blocks"),
        ("kvtier_block_size_bytes", "block_bytes"),
        ("kvtier_index_metadata_bytes", "metadata_bytes"),
        ("kvtier_jobs_in_flight", "jobs_in_flight"),
        ("kvtier_results_queued", "results_queued"),
        ("kvtier_io_threads", "io_threads"),
        ("kvtier_resident_bytes", "resident_bytes"),
        ("kvtier_io_deadlines_missed_total", "io_deadlines_missed"),
        ("kvtier_io_threads_stuck", "io_threads_stuck"),
        ("kvtier_probes_in_flight", "probes_in_flight"),
    ):
        assert value(name) == getattr(stats, field), name
    assert (stats.lookups, stats.hits, stats.misses) == (3, 2, 1)


def test_metrics_of_a_closed_tier_raise():
    buf = np.zeros((2, ROW), dtype=np.uint8)
    tier = Tier(buf, capacity_bytes="1MiB")
    assert "kvtier_io_threads" in tier.metrics()
    tier.close()
    with pytest.raises(KVTierError) as err:
        tier.metrics()
    assert err.value.status_name == "TIER_ERR_SHUTDOWN"
    with pytest.raises(KVTierError):
        tier.completion_fd()


def test_completion_fd_is_readable_while_results_wait():
    buf = np.zeros((8, ROW), dtype=np.uint8)
    with Tier(buf, capacity_bytes="1MiB", io_threads=2) as tier:
        fd = tier.completion_fd()
        assert tier.completion_fd() == fd
        ep = select.epoll()
        try:
            ep.register(fd, select.EPOLLIN)
            assert ep.poll(0) == []
            tier.submit_store(1, [key(1), key(2)], [0, 1])
            tier.submit_store(2, [key(3)], [2])
            deadline = time.monotonic() + 30
            got = []
            while len(got) < 2:
                assert time.monotonic() < deadline, got
                if ep.poll(1.0):
                    got.extend(tier.poll(1))  # one at a time: stays readable
            assert ep.poll(0) == []
            ep.unregister(fd)
        finally:
            ep.close()
        for r in got:
            assert r.ok and 0 < r.io_ns <= r.elapsed_ns
        # Nothing copied (keys present): no I/O time.
        tier.submit_store(3, [key(1)], [4])
        assert finish(tier, 3).io_ns == 0
    # close() closed it: the descriptor number is free again.
    with pytest.raises(OSError):
        os.fstat(fd)


def test_notify_fd_counts_the_jobs_of_its_kind():
    buf = np.zeros((8, ROW), dtype=np.uint8)
    loads = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    r, w = os.pipe()
    try:
        with Tier(buf, capacity_bytes="1MiB", io_threads=2) as tier:
            with pytest.raises(KVTierError, match="not an eventfd") as err:
                tier.add_notify_fd(kvtier.JobKind.LOAD, w)
            assert err.value.status_name == "TIER_ERR_INVALID_ARG"
            with pytest.raises(KVTierError, match="job_kind: 7"):
                tier.add_notify_fd(7, loads)
            tier.add_notify_fd(kvtier.JobKind.LOAD, loads)
            tier.submit_store(1, [key(1), key(2)], [0, 1])
            assert finish(tier, 1).ok
            with pytest.raises(BlockingIOError):  # a store is not counted
                os.eventfd_read(loads)
            tier.submit_load(2, [key(1)], [4])
            tier.submit_load(3, [key(2)], [5])
            # Woken by the library alone: both results are queued by the time
            # the count reaches 2.
            seen, deadline = 0, time.monotonic() + 30
            while seen < 2:
                assert time.monotonic() < deadline
                if select.select([loads], [], [], 1.0)[0]:
                    seen += os.eventfd_read(loads)
            assert seen == 2
            assert sorted(res.job_id for res in tier.poll()) == [2, 3]
    finally:
        for fd in (loads, r, w):
            os.close(fd)
