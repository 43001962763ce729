"""The vLLM adapter's Prometheus series and config info (kvtier.vllm's
``build_metric_definitions``, ``get_stats``, ``config_info``).

Two sets of series: the adapter's own (``vllm:kv_offload_kvtier_*``, below)
and every family of the library's text (``Tier.metrics()``) as
``vllm:`` + its native name (``kvtier_io_threads_stuck`` is
``vllm:kvtier_io_threads_stuck``), read from that text by ``kvtier._prom``."""

from __future__ import annotations

import time
from typing import Any, Callable

from . import _lib, _prom
from ._mirror import PresenceMirror
from ._vllm_compat import (
    OffloadingConnectorStats,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingHistogramMetadata,
)
from .records import TierStats

# Prometheus series this tier adds to vLLM's /metrics. Every one is labelled
# by the tier type (its name in the config) and the backend.
PREFIX = "vllm:kv_offload_kvtier_"
_LABELS = ("tier_type", "backend")
# name -> (kind, library stats field or None, documentation)
_METRICS: dict[str, tuple[str, str | None, str]] = {
    "capacity_bytes": ("gauge", "capacity_bytes", "Bytes of block data the kvtier tier may hold."),
    "used_bytes": ("gauge", "used_bytes", "Bytes of block data the kvtier tier holds or is writing."),
    "blocks": ("gauge", "num_blocks", "Readable blocks in the kvtier tier."),
    "jobs_in_flight": ("gauge", "jobs_in_flight", "kvtier jobs submitted and not yet finished."),
    "evictions": ("counter", "evictions", "Blocks the kvtier tier evicted (LRU) to make room."),
    "store_jobs_ok": ("counter", "stores_ok", "kvtier store jobs that succeeded."),
    "store_jobs_failed": ("counter", "stores_failed", "kvtier store jobs that failed."),
    "load_jobs_ok": ("counter", "loads_ok", "kvtier load jobs that succeeded."),
    "load_jobs_failed": ("counter", "loads_failed", "kvtier load jobs that failed."),
    "stored_bytes": ("counter", "bytes_stored", "Bytes kvtier copied into its backend."),
    "loaded_bytes": ("counter", "bytes_loaded", "Bytes kvtier copied back into primary rows."),
    "events_dropped": ("counter", "events_dropped", "kvtier block events dropped (ring full)."),
    "lookups": ("counter", None, "Lookups the kvtier tier answered, by source (mirror, library)."),
    "lookup_hits": ("counter", None, "Lookups the kvtier tier answered HIT, by source."),
    "mirror_hit_failed_loads": (
        "counter",
        None,
        "Keys answered HIT from the adapter's presence mirror whose load then failed.",
    ),
}
_SOURCE_LABEL = "source"
# The library's families: vLLM's prefix before the native name.
LIBRARY_PREFIX = "vllm:"
# Rendering and reading the library's text costs about a millisecond: it is
# done at most this often (vLLM asks every step), the first report always.
# Counters and histograms lose nothing (they carry the increase since the
# previous reading); gauges are this fresh.
LIBRARY_INTERVAL_S = 1.0
_SOURCED = frozenset({"lookups", "lookup_hits"})

CONFIG_INFO_KEYS = (
    "kvtier_backend",
    "kvtier_capacity_bytes",
    "kvtier_block_bytes",
    "kvtier_io_threads",
    "kvtier_shared",
    "kvtier_lookup_mirror",
    "kvtier_namespace",
    "kvtier_version",
)


def definitions() -> dict[str, Any]:
    """vLLM's metadata of every series, by name; none without vLLM's tier metrics."""
    if OffloadingConnectorStats is None:
        return {}
    out: dict[str, Any] = {}
    for name, (kind, _, doc) in _METRICS.items():
        labels = _LABELS + ((_SOURCE_LABEL,) if name in _SOURCED else ())
        meta = OffloadingGaugeMetadata if kind == "gauge" else OffloadingCounterMetadata
        out[PREFIX + name] = meta(documentation=doc, labelnames=labels)
    for fam in _prom.exported_families():
        labels = _LABELS + fam.labels
        if fam.kind == "histogram":
            out[LIBRARY_PREFIX + fam.name] = OffloadingHistogramMetadata(
                documentation=fam.help, labelnames=labels, buckets=fam.buckets
            )
        elif fam.kind == "counter":
            out[LIBRARY_PREFIX + _prom.base_name(fam)] = OffloadingCounterMetadata(
                documentation=fam.help, labelnames=labels
            )
        else:
            out[LIBRARY_PREFIX + fam.name] = OffloadingGaugeMetadata(documentation=fam.help, labelnames=labels)
    return out


class StatsReporter:
    """Turns the library's stats and the mirror's counters into vLLM stats:
    gauges are snapshots, counters the increase since the previous report."""

    def __init__(self, tier_type: str, backend: str) -> None:
        self._labels = (tier_type, backend)
        self._reported: dict[str, int] = {}
        self._deltas = _prom.Deltas()
        self._defined: set[str] | None = None
        self._read_at: float | None = None

    def report(self, stats: TierStats, mirror: PresenceMirror, metrics: Callable[[], str] | None = None) -> Any:
        """vLLM stats of the adapter's series and, at most every
        :data:`LIBRARY_INTERVAL_S`, of ``metrics()`` (the tier's text)."""
        if OffloadingConnectorStats is None:
            return None
        totals = {
            name: getattr(stats, field) for name, (_, field, _) in _METRICS.items() if field is not None
        }
        totals["lookups/mirror"] = mirror.misses + mirror.hits
        totals["lookups/library"] = mirror.library_lookups
        totals["lookup_hits/mirror"] = mirror.hits
        totals["lookup_hits/library"] = mirror.library_hits
        totals["mirror_hit_failed_loads"] = mirror.hit_failed_loads
        out = OffloadingConnectorStats()
        for key, value in totals.items():
            name, _, source = key.partition("/")
            labelvalues = self._labels + ((source,) if source else ())
            if _METRICS[name][0] == "gauge":
                out.set_gauge(PREFIX + name, value, labelvalues)
            else:
                out.increase_counter(PREFIX + name, value - self._reported.get(key, 0), labelvalues)
                self._reported[key] = value
        now = time.monotonic()
        if metrics is not None and (self._read_at is None or now - self._read_at >= LIBRARY_INTERVAL_S):
            self._read_at = now
            self._report_library(out, metrics())
        return out

    def _report_library(self, out: Any, text: str) -> None:
        if self._defined is None:
            self._defined = {name for name in definitions() if name.startswith(LIBRARY_PREFIX + "kvtier_")}
        for fam in _prom.parse(text).values():
            name = LIBRARY_PREFIX + (fam.name if fam.kind != "counter" else _prom.base_name(fam))
            if name not in self._defined:
                continue  # not declared to vLLM (it would fail the step): the tests see to it
            if fam.kind == "histogram":
                for labelvalues, values in self._deltas.observations(fam).items():
                    for v in values:
                        out.observe_histogram(name, v, self._labels + labelvalues)
                continue
            for sample, labelvalues, le, value in fam.samples:
                if fam.kind == "counter":
                    increase = self._deltas.increase(sample, labelvalues, le, value)
                    out.increase_counter(name, increase, self._labels + labelvalues)
                else:
                    out.set_gauge(name, value, self._labels + labelvalues)


def config_info(stats: TierStats, backend: str, shared: bool, mirror: bool, namespace: str) -> dict[str, Any]:
    """The values of :data:`CONFIG_INFO_KEYS`."""
    return {
        "kvtier_backend": backend,
        "kvtier_capacity_bytes": stats.capacity_bytes,
        "kvtier_block_bytes": stats.block_bytes,
        "kvtier_io_threads": stats.io_threads,
        "kvtier_shared": shared,
        "kvtier_lookup_mirror": mirror,
        "kvtier_namespace": namespace,
        "kvtier_version": _lib.library_version(),
    }
