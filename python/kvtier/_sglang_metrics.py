"""The SGLang backend's Prometheus series: every family of the library's text
(``Tier.metrics()``) as ``sglang:`` + its native name
(``kvtier_io_threads_stuck`` is ``sglang:kvtier_io_threads_stuck``).

SGLang's storage hook (``get_stats`` returning its ``StorageMetrics``) carries
four fixed histograms and nothing else, so the backend records these the way
SGLang's own collectors (``sglang.srt.observability.metrics_collector``) do:
``prometheus_client`` metrics made in the scheduler process, which under
SGLang's ``--enable-metrics`` (``PROMETHEUS_MULTIPROC_DIR``) its HTTP server's
``/metrics`` serves, gauges with ``multiprocess_mode="mostrecent"`` as
SGLang's are. They are updated each time SGLang collects the storage
metrics (``get_stats``)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from . import _prom

PREFIX = "sglang:"
# The backend's labels, before each family's own (kind, outcome).
LABELS = ("backend", "tp_rank")

# Rendering and reading the library's text costs about a millisecond: at most
# this often (SGLang collects every step), the first time always. Counters and
# histograms lose nothing (they carry the increase since the previous reading).
INTERVAL_S = 1.0

_lock = threading.Lock()
# Per registry: the metric objects, by exported name (prometheus_client
# refuses a second registration of a name in one registry).
_made: dict[int, dict[str, Any]] = {}


def exported_name(fam: _prom.Family) -> str:
    """The name prometheus_client is given (a counter's ``_total`` is its own)."""
    return PREFIX + (_prom.base_name(fam) if fam.kind == "counter" else fam.name)


def _metrics(registry: Any) -> dict[str, Any]:
    from prometheus_client import REGISTRY, Counter, Gauge, Histogram

    registry = REGISTRY if registry is None else registry
    with _lock:
        made = _made.get(id(registry))
        if made is not None:
            return made
        made = {}
        for fam in _prom.exported_families():
            name = exported_name(fam)
            labels = LABELS + fam.labels
            doc = fam.help or fam.name
            if fam.kind == "counter":
                made[name] = Counter(name, doc, labels, registry=registry)
            elif fam.kind == "histogram":
                made[name] = Histogram(name, doc, labels, registry=registry, buckets=fam.buckets + (float("inf"),))
            else:
                made[name] = Gauge(name, doc, labels, registry=registry, multiprocess_mode="mostrecent")
        _made[id(registry)] = made
        return made


class Exporter:
    """Updates the ``sglang:kvtier_*`` series from a tier's text: gauges set,
    counters increased and histograms observed by what changed since the
    previous call."""

    def __init__(self, backend: str, tp_rank: int, registry: Any = None) -> None:
        self._labels = (backend, str(tp_rank))
        self._registry = registry
        self._deltas = _prom.Deltas()
        self._lock = threading.Lock()
        self._read_at: float | None = None

    def export(self, render: Callable[[], str], force: bool = False) -> None:
        """Reads ``render()`` (the tier's metrics()) if due or ``force``."""
        metrics = _metrics(self._registry)
        with self._lock:  # one reader of the deltas at a time
            now = time.monotonic()
            if not force and self._read_at is not None and now - self._read_at < INTERVAL_S:
                return
            self._read_at = now
            text = render()
            for fam in _prom.parse(text).values():
                metric = metrics.get(exported_name(fam))
                if metric is None:
                    continue  # not made (the tests see that every family is)
                if fam.kind == "histogram":
                    for labelvalues, values in self._deltas.observations(fam).items():
                        child = metric.labels(*(self._labels + labelvalues))
                        for v in values:
                            child.observe(v)
                    continue
                for sample, labelvalues, le, value in fam.samples:
                    child = metric.labels(*(self._labels + labelvalues))
                    if fam.kind == "counter":
                        child.inc(self._deltas.increase(sample, labelvalues, le, value))
                    else:
                        child.set(value)
