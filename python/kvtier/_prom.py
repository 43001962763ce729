"""The library's Prometheus text (``Tier.metrics()``) read back as metric
families, for the adapters that export every one of them through an engine's
own registry (``kvtier._vllm_metrics``, ``kvtier._sglang_metrics``).

The exported set is whatever the library renders, never a list kept here: a
family the library adds is exported under the same rule (the engine's prefix
before the native name) with its own type, help and labels. Only the
``backend`` label is kept of the tier's own labels (``namespace`` is in the
adapters' config info); a histogram's ``le`` is the engine histogram's own.
Counters and histograms are cumulative in the text: a :class:`Deltas` turns
each report into increases since the previous one, and a histogram's
increase into observations that land in the same buckets and add up to the
same ``_sum``."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field

from .tier import Tier

# The tier's own labels: backend is exported as the adapters' label of that
# name, namespace is dropped (one tier, one namespace: see config info).
TIER_LABELS = ("backend", "namespace")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class Family:
    """One metric family of the text: its type, help, label names (without
    the tier's and ``le``), buckets (histograms) and samples, each a
    (sample name, label values in ``labels`` order, le or None, value)."""

    name: str
    kind: str = "untyped"
    help: str = ""
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    samples: list[tuple[str, tuple[str, ...], float | None, float]] = field(default_factory=list)


def _unescape(value: str) -> str:
    return value.replace(r"\"", '"').replace(r"\n", "\n").replace("\\\\", "\\")


def parse(text: str) -> dict[str, Family]:
    """The families of a Prometheus text, by name, in the text's order."""
    families: dict[str, Family] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            families.setdefault(name, Family(name)).help = _unescape(doc)
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            families.setdefault(name, Family(name)).kind = kind.strip()
        elif line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            if m is None:
                continue
            sample, labeltext, value = m.group(1), m.group(2) or "", float(m.group(3))
            fam = _family_of(families, sample)
            labels = {k: _unescape(v) for k, v in _LABEL.findall(labeltext)}
            le = labels.pop("le", None)
            for k in TIER_LABELS:
                labels.pop(k, None)
            for k in labels:
                if k not in fam.labels:
                    fam.labels += (k,)
            bound = None if le is None else float(le)
            if bound is not None and not math.isinf(bound) and bound not in fam.buckets:
                fam.buckets += (bound,)
            fam.samples.append((sample, tuple(labels.get(k, "") for k in fam.labels), bound, value))
    return families


def _family_of(families: dict[str, Family], sample: str) -> Family:
    if sample in families:
        return families[sample]
    for suffix in ("_bucket", "_sum", "_count"):
        base = sample[: -len(suffix)]
        if sample.endswith(suffix) and families.get(base, Family(base)).kind == "histogram":
            return families[base]
    return families.setdefault(sample, Family(sample))


@functools.lru_cache(maxsize=1)
def library_families() -> tuple[Family, ...]:
    """The families every tier renders, read from a throwaway one-block
    memory tier's text (samples dropped): what the adapters declare to the
    engine before any tier of theirs exists. Backend-only families (the
    Redis client's) are in :data:`BACKEND_FAMILIES`."""
    block = 4096
    with Tier(bytearray(block), block_bytes=block, capacity_bytes=block, io_threads=1) as tier:
        text = tier.metrics()
    out = []
    for fam in parse(text).values():
        fam.samples = []
        out.append(fam)
    return tuple(out)


# The Redis backend's client counters: a memory tier does not render them and
# a Redis tier needs a server, so they are declared here. The Redis tests
# (test_every_library_series_is_exported_*) fail if a Redis tier renders a
# family that is neither here nor in library_families().
BACKEND_FAMILIES = tuple(
    Family(name, "counter", doc)
    for name, doc in (
        ("kvtier_redis_reconnects_total", "Redis connections opened in place of ones dropped broken."),
        ("kvtier_redis_connections_dropped_total", "Redis connections dropped broken."),
        ("kvtier_redis_connect_failures_total", "Failed Redis connection attempts."),
        ("kvtier_redis_moved_total", "Blocks a Redis Cluster node answered with MOVED."),
        ("kvtier_redis_ask_total", "Blocks a Redis Cluster node answered with ASK."),
        ("kvtier_redis_rerouted_blocks_total", "Blocks sent again after a redirection or for want of a master."),
        ("kvtier_redis_slot_map_reads_total", "Times the Redis Cluster slot map was read again."),
    )
)


def exported_families() -> tuple[Family, ...]:
    """Every family the adapters export: the library's and the backends'."""
    return library_families() + BACKEND_FAMILIES


def base_name(family: Family) -> str:
    """The family's name as an engine registers it: without the ``_total``
    a counter's client library appends again."""
    if family.kind == "counter" and family.name.endswith("_total"):
        return family.name[: -len("_total")]
    return family.name


class Deltas:
    """Increases since the previous report, per family and label values."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, tuple[str, ...], float | None], float] = {}

    def increase(self, sample: str, labelvalues: tuple[str, ...], le: float | None, value: float) -> float:
        key = (sample, labelvalues, le)
        before = self._seen.get(key, 0.0)
        self._seen[key] = value
        # A counter never goes down; a new tier behind the same reporter
        # starts over, and its whole value is the increase.
        return value - before if value >= before else value

    def observations(self, fam: Family) -> dict[tuple[str, ...], list[float]]:
        """A histogram's new observations per label values: as many in each
        bucket as the library counted since the last report, each at the same
        fraction of its bucket's width, chosen so they add up to the
        increase of ``_sum``."""
        cumulative: dict[tuple[str, ...], list[tuple[float, float]]] = {}
        sums: dict[tuple[str, ...], float] = {}
        for sample, labelvalues, le, value in fam.samples:
            if sample.endswith("_bucket") and le is not None:
                cumulative.setdefault(labelvalues, []).append((le, value))
            elif sample.endswith("_sum"):
                sums[labelvalues] = value
        out: dict[tuple[str, ...], list[float]] = {}
        for labelvalues, buckets in cumulative.items():
            buckets.sort()
            now = [c - (buckets[i - 1][1] if i else 0.0) for i, (_, c) in enumerate(buckets)]
            counts = [int(self.increase(fam.name + "_bucket", labelvalues, le, n)) for (le, _), n in zip(buckets, now)]
            total = self.increase(fam.name + "_sum", labelvalues, None, sums.get(labelvalues, 0.0))
            out[labelvalues] = _spread(buckets, counts, total)
        return out


def _spread(buckets: list[tuple[float, float]], counts: list[int], total: float) -> list[float]:
    lows, highs = [], []
    lo = 0.0
    for (le, _), n in zip(buckets, counts):
        hi = le if not math.isinf(le) else max(lo * 10, 1.0)
        lows += [lo] * n
        highs += [hi] * n
        lo = le if not math.isinf(le) else lo
    if not lows:
        return []
    span = sum(highs) - sum(lows)
    t = (total - sum(lows)) / span if span > 0 else 1.0
    # Strictly above a bucket's lower bound, at most its upper one: le is inclusive.
    t = min(max(t, 1e-9), 1.0)
    return [a + t * (b - a) for a, b in zip(lows, highs)]
