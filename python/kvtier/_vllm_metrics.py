"""The vLLM adapter's Prometheus series and config info (kvtier.vllm's
``build_metric_definitions``, ``get_stats``, ``config_info``)."""

from __future__ import annotations

from typing import Any

from . import _lib
from ._mirror import PresenceMirror
from ._vllm_compat import (
    OffloadingConnectorStats,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
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
    return out


class StatsReporter:
    """Turns the library's stats and the mirror's counters into vLLM stats:
    gauges are snapshots, counters the increase since the previous report."""

    def __init__(self, tier_type: str, backend: str) -> None:
        self._labels = (tier_type, backend)
        self._reported: dict[str, int] = {}

    def report(self, stats: TierStats, mirror: PresenceMirror) -> Any:
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
        return out


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
