"""kvtier as a vLLM (0.33) secondary tier.

Enable it with one entry in ``kv_connector_extra_config["secondary_tiers"]``::

    {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm",
     "capacity_bytes": "64GiB"}

Every key other than vLLM's own (``type``, ``module_path``, ``backpressure``)
and this adapter's (``enable_kv_events``, ``locality``, ``lookup_mirror``) is a
kvtier config key, passed to the library as a string; an unknown one fails at
construction. ``python/README.md`` lists them all.

The tier copies whole rows of vLLM's primary CPU buffer: row size is the
view's ``strides[0]``, the whole view is handed to the library once, and the
chunk ids of each job are the row numbers. Scheduler-facing methods never
raise: a failing lookup answers MISS, a rejected submit becomes a failed
``JobResult`` at the next ``get_finished_jobs``.

Lookups and the presence mirror
-------------------------------
vLLM asks ``lookup`` one key at a time, and one ctypes call costs more than
vLLM's whole budget for it. So the adapter keeps a Python-side set of the keys
the library holds readable, fed by the library's block events (STORED /
REMOVED, per key, in order), and answers from it. It stays exact because the
library changes what it holds at only two kinds of moments:

* synchronously, inside ``submit_store`` (planning evicts under the index
  lock): the adapter drains the events right after each store it submits;
* on a worker thread, when a job completes (a store's blocks become readable,
  a load finds a block corrupt or gone): keys of jobs the adapter has
  submitted and not yet reported are "unsettled" and always asked of the
  library. ``get_finished_jobs`` polls results first and events second, and
  the library records a job's events before it queues its result, so a key
  leaves the unsettled set only once its events are in the mirror.

A key the mirror lacks is a MISS only while the mirror is complete: a tier
that nobody else writes to, with no event lost. After a LOST event (the ring
overflowed) the mirror is cleared and only a subset: absent keys are then
asked of the library (whose HIT answers are added back), until the library's
block count equals the mirror's size with no job in flight. Shared storage
(disk ``shared=true``, redis ``sharing=shared``) is never complete: another
writer's blocks are found by the library's probes, so absent keys always go to
the library. Its probes can also evict on a worker thread, so while one may be
running (the library answered PENDING since the last check) a mirror HIT
first drains the events.

Keys answered HIT from the mirror are touched (one batched call) before the
next store is submitted, so a store submitted between a lookup and its
promotion evicts other blocks first; ``stats_mirror()`` counts mirror HITs
whose load then failed (zero for a tier nobody else writes to).

This module imports without vLLM; the class then refuses to be instantiated.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections.abc import Collection, Iterable
from typing import Any

from . import _lib, identity
from .tier import EventKind, KVTierError, LookupState, Tier
from .tier import JobResult as _TierResult

try:
    from vllm.v1.kv_offload.base import Medium, OffloadingEvent
    from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager

    _VLLM_IMPORT_ERROR: BaseException | None = None
except Exception as exc:  # ImportError, or a vLLM install that fails to import
    _VLLM_IMPORT_ERROR = exc
    SecondaryTierManager = object  # type: ignore[assignment,misc]

if _VLLM_IMPORT_ERROR is None:
    from vllm.logger import init_logger

    logger = init_logger(__name__)

    try:
        from vllm.v1.kv_offload.base import LookupResult

        _MISS: Any = LookupResult.MISS
        _HIT: Any = LookupResult.HIT
        _RETRY: Any = LookupResult.RETRY
    except ImportError:  # older vLLM: lookup returns True / False / None
        _MISS, _HIT, _RETRY = False, True, None
    try:
        from vllm.v1.kv_offload.base import Locality
    except ImportError:
        Locality = None  # type: ignore[assignment,misc]
    try:
        from vllm.v1.kv_offload.base import RequestOffloadingContext
    except ImportError:
        try:
            from vllm.v1.kv_offload.tiering.base import RequestOffloadingContext
        except ImportError:
            RequestOffloadingContext = None  # type: ignore[assignment,misc]
    try:
        from vllm.v1.metrics.cache_hit_source import CacheHitSource
    except ImportError:
        CacheHitSource = None  # type: ignore[assignment,misc]
    try:
        from vllm.v1.kv_offload.base import (
            OffloadingCounterMetadata,
            OffloadingGaugeMetadata,
        )
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )
    except ImportError:  # older vLLM: no tier metrics
        OffloadingConnectorStats = None  # type: ignore[assignment,misc]
    try:
        from vllm.v1.kv_offload.tiering.backpressure import EMABackpressureDetector
    except ImportError:
        EMABackpressureDetector = None  # type: ignore[assignment,misc]

    # Indexed by LookupState (an int): a tuple, not a dict, because hashing an
    # enum member runs Python code.
    _LOOKUP = tuple(
        {LookupState.MISS: _MISS, LookupState.HIT: _HIT, LookupState.PENDING: _RETRY}[s]
        for s in sorted(LookupState)
    )
    _RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(JobResult))
    _EVENT_FIELDS = frozenset(f.name for f in dataclasses.fields(OffloadingEvent))
    _SUPER_PARAMS = [
        p.name
        for p in list(inspect.signature(SecondaryTierManager.__init__).parameters.values())[1:]
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
else:
    logger = logging.getLogger(__name__)
    Medium = None  # type: ignore[assignment,misc]
    OffloadingConnectorStats = None  # type: ignore[assignment,misc]
    _RESULT_FIELDS = frozenset()
    _EVENT_FIELDS = frozenset()
    _SUPER_PARAMS = []

# Enum members as module constants: `LookupState.HIT` is a class attribute
# lookup through the enum's metaclass, ~100 ns each on CPython 3.11.
_STATE_HIT = LookupState.HIT
_STATE_PENDING = LookupState.PENDING
_EVENT_LOST = EventKind.LOST
_EVENT_REMOVED = EventKind.REMOVED

# Keys vLLM or its branches may pass that are not kvtier config.
_VLLM_KWARGS = ("tier_name", "name")
_LOG_INTERVAL_S = 5.0
_EVENT_BATCH = 4096
# Bound on remembered HIT answers when on_schedule_end is never called.
_MAX_PROMISED = 1 << 16
# OffloadingEvent.ownership of this tier's events (vLLM's events tracker keys
# a block's residencies by (medium, ownership)).
_OWNERSHIP = "kvtier"

# Backend names as the library accepts them (case-insensitive), by kind.
_BACKENDS = {"memory": "memory", "disk": "disk", "redis": "redis", "valkey": "redis"}
_TRUE = frozenset({"true", "1", "on", "yes"})
_FALSE = frozenset({"false", "0", "off", "no"})

# Prometheus series this tier adds to vLLM's /metrics (see get_stats). Every
# one is labelled by the tier type (its name in the config) and the backend.
_METRIC_PREFIX = "vllm:kv_offload_kvtier_"
_METRIC_LABELS = ("tier_type", "backend")
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


def _job_rows(job: Any) -> Any:
    rows = getattr(job, "chunk_ids", None)
    return job.block_ids if rows is None else rows


def _parse_bool(name: str, value: Any) -> bool:
    """A flag from JSON config: a bool, 0/1, or true/false/on/off/yes/no in any
    case. Anything else is an error, so that the string "false" never reads
    as true."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise ValueError(
        f"kvtier secondary tier: {name} must be true or false "
        f"(a bool, or one of {sorted(_TRUE | _FALSE)}), got {value!r}"
    )


def _backend_of(config: dict[str, Any]) -> str:
    """The backend kind ("memory", "disk", "redis") the library will run, or
    the raw text if unknown (the library then rejects it with its message)."""
    text = str(config.get("backend", "memory")).strip().lower()
    return _BACKENDS.get(text, text)


def _is_shared(backend: str, config: dict[str, Any]) -> bool:
    """Whether others may write the tier's storage (its mirror is then never
    complete). An unparsable value counts as shared; the library rejects it."""
    try:
        if backend == "disk":
            return _parse_bool("shared", config.get("shared", False))
        if backend == "redis":
            return str(config.get("sharing", "owned")).strip().lower() != "owned"
    except ValueError:
        return True
    return False


class KVTierSecondaryTier(SecondaryTierManager):  # type: ignore[misc,valid-type]
    """A vLLM ``SecondaryTierManager`` backed by libkvtier."""

    medium = Medium.CPU if Medium is not None else None  # type: ignore[union-attr]

    def __init__(
        self,
        offloading_spec: Any = None,
        primary_kv_view: memoryview | None = None,
        tier_type: str | None = None,
        backpressure_detector: Any = None,
        *,
        enable_kv_events: Any = False,
        locality: str | None = None,
        lookup_mirror: Any = True,
        **config: Any,
    ) -> None:
        if _VLLM_IMPORT_ERROR is not None:
            raise ImportError(
                "kvtier.vllm.KVTierSecondaryTier needs vLLM (>= 0.33, with "
                "vllm.v1.kv_offload.tiering); importing it failed: "
                f"{_VLLM_IMPORT_ERROR!r}"
            ) from _VLLM_IMPORT_ERROR
        if primary_kv_view is None:
            raise TypeError("KVTierSecondaryTier needs primary_kv_view")
        for name in _VLLM_KWARGS:
            value = config.pop(name, None)
            if tier_type is None and isinstance(value, str):
                tier_type = value
        if tier_type is None:
            tier_type = type(self).__name__
        if "events" in config:
            raise ValueError(
                "kvtier secondary tier: 'events' is set by the adapter (it keeps "
                "its lookup mirror and vLLM's KV events from them); use "
                "'enable_kv_events' for vLLM events and 'lookup_mirror' for lookups"
            )
        want_vllm_events = _parse_bool("enable_kv_events", enable_kv_events)
        self._mirror_enabled = _parse_bool("lookup_mirror", lookup_mirror)
        self._init_base(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type

        self._backend = _backend_of(config)
        self._shared = _is_shared(self._backend, config)
        self._set_medium_and_locality(locality)
        self._tune_backpressure(backpressure_detector, locality)

        strides = primary_kv_view.strides
        if not strides:
            raise ValueError("primary_kv_view must have strides (one row per chunk)")
        self._row_bytes = strides[0]

        # vLLM events: only with the global KV-events flag too, as vLLM's tiers.
        self._events: list[Any] | None = None
        if want_vllm_events:
            kv_events = getattr(offloading_spec, "kv_events_config", None)
            if kv_events is not None and getattr(kv_events, "enable_kv_cache_events", False):
                self._events = []
            else:
                logger.warning(
                    "enable_kv_events is set on secondary tier '%s' but KV cache "
                    "events are disabled globally; the tier will not emit events.",
                    tier_type,
                )
        self._library_events = self._mirror_enabled or self._events is not None
        if self._library_events:
            config["events"] = True

        # -- the presence mirror (see the module docstring) --
        # Keys the library holds readable, as far as its events told.
        self._present: set[bytes] = set()
        # True while `_present` is every key the library holds readable.
        self._complete = self._mirror_enabled and not self._shared
        # key -> number of submitted, unreported jobs naming it: asked of the
        # library, whose answer may change on a worker thread.
        self._unsettled: dict[bytes, int] = {}
        # Keys answered HIT from the mirror this step and not yet loaded:
        # touched before each store so that it evicts others first, and
        # counted if their load fails.
        # Insertion-ordered (a dict), so the touch below is deterministic.
        self._promised: dict[bytes, None] = {}
        # Shared storage: a probe may be running (it can evict on a worker).
        self._probes_maybe_running = False
        self._lost_warned = False
        # Counters of this adapter (get_stats / stats_mirror).
        self._mirror_misses = 0
        self._mirror_hits = 0
        self._library_lookups = 0
        self._library_hits = 0
        self._mirror_hit_failed_loads = 0
        self._reported: dict[str, int] = {}

        # What the blocks mean (model, dtype, layout; kvtier.identity), so
        # that no engine of another identity ever reads them; the user's
        # namespace is added to it, never in its place.
        user_namespace = str(config.pop("namespace", "") or "")
        derived = identity.vllm_namespace(offloading_spec)
        self.namespace = identity.with_user(derived, user_namespace) if derived else user_namespace
        if self.namespace:
            config["namespace"] = self.namespace
        self._tier = Tier(primary_kv_view, block_bytes=self._row_bytes, **config)

        # job id -> (is_load, keys, req_id, mirror-HIT keys of a load)
        self._jobs: dict[int, tuple[bool, Any, str | None, Any]] = {}
        # Results of rejected submits, reported by the next get_finished_jobs.
        self._ready: list[Any] = []
        # req_id -> keys whose load failed for that request: they look up as
        # MISS for it, so it cannot loop on a promotion that cannot succeed.
        self._failed_keys: dict[str, set[bytes]] = {}
        self._last_log: dict[str, float] = {}
        if self._library_events:
            self._drain_events()  # blocks recovered at open (disk)
        logger.info(
            "kvtier secondary tier '%s': %s backend, namespace %r, %d rows of %d "
            "bytes, lookup mirror %s, library %s (%s)",
            tier_type,
            self._backend,
            self.namespace,
            self._tier.num_rows,
            self._row_bytes,
            "on" if self._mirror_enabled else "off",
            _lib.library_version(),
            _lib.library_path,
        )

    def _init_base(self, spec: Any, view: Any, tier_type: str, detector: Any) -> None:
        # Positional, by the installed base's own parameter names: 0.33 has
        # (offloading_spec, primary_kv_view, tier_type, backpressure_detector),
        # older releases (vllm_config, primary_kv_view[, tier_type]).
        by_name = {
            "offloading_spec": spec,
            "vllm_config": spec,
            "primary_kv_view": view,
            "tier_type": tier_type,
            "tier_name": tier_type,
            "backpressure_detector": detector,
        }
        args = []
        for name in _SUPER_PARAMS:
            if name not in by_name:
                break
            args.append(by_name[name])
        super().__init__(*args)

    def _set_medium_and_locality(self, locality: str | None) -> None:
        """What vLLM's load_tier_filter, cache-hit metrics and KV events see.

        memory: host memory of this process (CPU, HOST, LOCAL). disk: storage
        (STORAGE, DISK; LOCAL unless shared, which may be a network file
        system: then unset unless configured). redis: a server's memory that a
        fleet may share (STORAGE, reported as a remote store, REMOTE).
        """
        backend = self._backend
        if backend == "memory":
            self.medium = Medium.CPU
            source, default_locality = "HOST", "LOCAL"
        elif backend == "disk":
            self.medium = Medium.STORAGE
            source, default_locality = "DISK", (None if self._shared else "LOCAL")
        else:  # redis (or an unknown name, which the library rejects below)
            self.medium = Medium.STORAGE
            source, default_locality = "EXTERNAL_UNSPECIFIED", "REMOTE"
        if CacheHitSource is not None:
            self.cache_hit_source = CacheHitSource[source]
        self.locality = None
        if Locality is None:
            if locality is not None:
                raise ValueError("this vLLM has no Locality; drop 'locality'")
            return
        chosen = locality if locality is not None else default_locality
        # Exact names, as vLLM's fs tier: "local" is a ValueError.
        self.locality = Locality(chosen) if chosen is not None else None

    def _tune_backpressure(self, detector: Any, locality: str | None) -> None:
        """Storage backends get the defaults vLLM gives its own storage tiers.

        vLLM's factory fills the detector's defaults by tier type, and knows
        only "fs" and "obj" as storage: for this tier it leaves out the
        failure threshold and picks local-disk water marks. A disk backend
        gets fs's failure threshold; redis also gets the network water marks
        vLLM gives "obj" (unless 'locality' is "LOCAL", which the factory
        already honoured). The failure threshold is added only when unset,
        the water marks only when they are the factory's local defaults.
        """
        if EMABackpressureDetector is None or not isinstance(detector, EMABackpressureDetector):
            return
        if self._backend not in ("disk", "redis"):
            return
        ema = EMABackpressureDetector
        if getattr(detector, "_failure_threshold", 0) is None:
            detector._failure_threshold = ema.DEFAULT_FAILURE_THRESHOLD
        if (
            self._backend == "redis"
            and locality is None
            and (detector._high, detector._low) == (ema.LOCAL_HIGH_WATER_S, ema.LOCAL_LOW_WATER_S)
        ):
            detector._high = ema.NETWORK_HIGH_WATER_S
            detector._low = ema.NETWORK_LOW_WATER_S

    # -- helpers ------------------------------------------------------------

    def _log(self, what: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._last_log.get(what, -_LOG_INTERVAL_S) >= _LOG_INTERVAL_S:
            self._last_log[what] = now
            logger.warning("kvtier tier '%s': %s failed: %s", self.tier_type, what, exc)

    def _result(self, **kwargs: Any) -> Any:
        return JobResult(**{k: v for k, v in kwargs.items() if k in _RESULT_FIELDS})

    def _mark_failed(self, req_id: str | None, keys: Iterable[bytes]) -> None:
        if req_id is None:
            return
        failed = self._failed_keys.get(req_id)
        if failed is None:
            failed = self._failed_keys[req_id] = set()
        failed.update(keys)

    def _emit(self, removed: bool, keys: list[bytes]) -> None:
        event = {
            "keys": keys,
            "medium": self.medium,
            "removed": removed,
            "locality": self.locality,
            "ownership": _OWNERSHIP,
            # Every block this tier reports stored is reported removed when
            # it stops being readable: vLLM's events tracker keeps its
            # payload until then, so the BlockRemoved names the same hashes.
            "removal_expected": True,
        }
        self._events.append(  # type: ignore[union-attr]
            OffloadingEvent(**{k: v for k, v in event.items() if k in _EVENT_FIELDS})
        )

    def _drain_events(self) -> None:
        """Applies the library's pending block events to the mirror and, with
        vLLM events on, turns them into OffloadingEvents (one per run of
        consecutive events of one kind, keys in the library's order)."""
        present = self._present
        mirror = self._mirror_enabled
        emit = self._events is not None
        run_removed = False
        run: list[bytes] = []
        while True:
            batch = self._tier.poll_events(_EVENT_BATCH)
            for event in batch:
                kind = event.kind
                if kind is _EVENT_LOST:
                    # Events were dropped: the mirror may hold keys that are
                    # gone and lack keys that were stored. Start over as a
                    # subset; absent keys go to the library until resynced.
                    present.clear()
                    self._complete = False
                    if not self._lost_warned:
                        self._lost_warned = True
                        logger.warning(
                            "kvtier tier '%s': %d block events dropped (raise "
                            "events_capacity); lookups ask the library until "
                            "the mirror is whole again%s",
                            self.tier_type,
                            event.dropped,
                            ", and routers miss those KV events" if emit else "",
                        )
                    continue
                removed = kind is _EVENT_REMOVED
                if mirror:
                    if removed:
                        present.discard(event.key)
                    else:
                        present.add(event.key)
                if emit:
                    if run and removed != run_removed:
                        self._emit(run_removed, run)
                        run = []
                    run_removed = removed
                    run.append(event.key)
            if len(batch) < _EVENT_BATCH:
                break
        if run:
            self._emit(run_removed, run)

    def _settle(self, keys: Any) -> None:
        unsettled = self._unsettled
        for key in keys:
            n = unsettled.get(key, 0)
            if n <= 1:
                unsettled.pop(key, None)
            else:
                unsettled[key] = n - 1

    def _submit(self, job: Any, is_load: bool) -> None:
        job_id = job.job_id
        req_context = getattr(job, "req_context", None)
        req_id = getattr(req_context, "req_id", None)
        keys: Any = ()
        try:
            keys = job.keys
            # bytes keys: the mirror hashes them (a bytearray cannot be hashed).
            keys = [k if type(k) is bytes else bytes(k) for k in keys]
            rows = _job_rows(job)
            if is_load:
                self._tier.submit_load(job_id, keys, rows)
            else:
                if self._promised:
                    # Keys answered HIT and not yet loaded become most recent
                    # (the latest answer most of all), so this store's
                    # evictions take other blocks first.
                    self._tier.touch(list(reversed(self._promised)))
                self._tier.submit_store(job_id, keys, rows)
        except KVTierError as exc:
            self._log("submit_load" if is_load else "submit_store", exc)
            if exc.status == _lib.TIER_ERR_DUPLICATE_JOB:
                # The id is in flight and will be reported once; a second
                # report would break vLLM's exactly-once bookkeeping.
                return
            self._reject(job_id, keys, req_id, is_load)
            return
        except Exception as exc:
            self._log("submit_load" if is_load else "submit_store", exc)
            self._reject(job_id, keys, req_id, is_load)
            return
        promised = None
        if is_load and self._promised:
            promised = {k for k in keys if k in self._promised}
            for k in promised:
                del self._promised[k]
        self._jobs[job_id] = (is_load, keys, req_id, promised)
        unsettled = self._unsettled
        for key in keys:
            unsettled[key] = unsettled.get(key, 0) + 1
        if not is_load and self._library_events:
            try:
                self._drain_events()  # this store's evictions, made at submit
            except Exception as exc:
                self._mirror_failed("submit_store", exc)

    def _mirror_failed(self, what: str, exc: BaseException) -> None:
        # Events could not be read: the mirror can no longer say MISS.
        self._log(what, exc)
        self._present.clear()
        self._complete = False

    def _reject(self, job_id: int, keys: Any, req_id: str | None, is_load: bool) -> None:
        if is_load:
            try:
                self._mark_failed(req_id, keys)
            except TypeError:  # unhashable junk keys: nothing to remember
                pass
        self._ready.append(self._result(job_id=job_id, success=False))

    def _finished(self, r: _TierResult) -> Any:
        is_load, keys, req_id, promised = self._jobs.pop(r.job_id)
        self._settle(keys)
        success = r.status == _lib.TIER_OK
        # vLLM's backpressure detector and its read/write byte counters take
        # a job's size as len(keys) x row bytes (vLLM's fs tier reports the
        # same), whether or not a block was already present; the library's
        # r.bytes counts only bytes it copied.
        size = len(keys) * self._row_bytes or None
        common = {
            "job_id": r.job_id,
            # Active transfer time, without time queued (as vLLM's fs tier).
            "transfer_time": r.io_ns / 1e9,
            "transfer_bytes": size,
            "transfer_size": size,
        }
        if not is_load:
            return self._result(success=success, **common)
        if success:
            return self._result(success=True, **common)
        done = min(r.num_done, len(keys))
        failed = keys[done:]
        self._mark_failed(req_id, failed)
        if promised:
            self._mirror_hit_failed_loads += len(promised.intersection(failed))
        return self._result(
            success=False, successful_keys=tuple(keys[:done]) if done else None, **common
        )

    def _resync(self) -> None:
        """Called after a full drain. A shared tier's probes: cleared once the
        library runs none. A mirror made partial by lost events: complete
        again once it holds as many keys as the library's readable blocks,
        with no job in flight (nothing can change meanwhile, and every key it
        holds is readable, so the two sets are equal)."""
        if self._probes_maybe_running:
            if self._tier.stats().lookups_pending == 0:
                self._probes_maybe_running = False
                self._drain_events()  # the last probes' admissions
        if not self._complete and self._mirror_enabled and not self._shared and not self._jobs:
            if self._tier.stats().num_blocks == len(self._present):
                self._complete = True

    def _ask_library(self, key: bytes) -> Any:
        if self._probes_maybe_running and key in self._present:
            # A probe's admission may have evicted it: bring the mirror up to
            # date before answering from it.
            self._drain_events()
            if key in self._present and key not in self._unsettled:
                self._mirror_hits += 1
                self._promised[key] = None
                return _HIT
        state = self._tier.lookup_one(key)
        self._library_lookups += 1
        if state is _STATE_HIT:
            self._library_hits += 1
            if self._mirror_enabled:
                # Safe even before the pending events are drained: the key's
                # events up to now end with STORED, later ones follow it.
                self._present.add(key)
        elif state is _STATE_PENDING and self._shared:
            self._probes_maybe_running = True
        return _LOOKUP[state]

    # -- SecondaryTierManager ---------------------------------------------

    def lookup(self, key: bytes, req_context: Any) -> Any:
        try:
            if self._failed_keys:
                failed = self._failed_keys.get(req_context.req_id)
                if failed is not None and key in failed:
                    return _MISS
            if key in self._present:
                if not self._probes_maybe_running and key not in self._unsettled:
                    self._mirror_hits += 1
                    self._promised[key] = None
                    return _HIT
            elif self._complete and key not in self._unsettled:
                self._mirror_misses += 1
                return _MISS
            return self._ask_library(key)
        except Exception as exc:
            self._log("lookup", exc)
            return _MISS

    def submit_store(self, job_metadata: Any) -> None:
        self._submit(job_metadata, is_load=False)

    def submit_load(self, job_metadata: Any) -> None:
        self._submit(job_metadata, is_load=True)

    def get_finished_jobs(self) -> list[Any]:
        if self._ready:
            results, self._ready = self._ready, []
        else:
            results = []
        if self._jobs:
            try:
                while True:
                    batch = self._tier.poll(1024)
                    for r in batch:
                        if r.job_id not in self._jobs:
                            logger.error("kvtier reported unknown job id %d; dropped", r.job_id)
                            continue
                        results.append(self._finished(r))
                    if len(batch) < 1024:
                        break
            except Exception as exc:
                self._log("get_finished_jobs", exc)
        if len(self._promised) > _MAX_PROMISED:
            self._promised.clear()  # a caller that never ends its steps
        if self._library_events and not self._tier.closed:
            # After the results: the library records a job's events before
            # queueing its result, so the keys just settled are up to date.
            try:
                self._drain_events()
                self._resync()
            except Exception as exc:
                self._mirror_failed("get_finished_jobs", exc)
        return results

    def has_pending_work(self) -> bool:
        return bool(self._jobs) or bool(self._ready)

    def take_events(self) -> Iterable[Any]:
        if not self._events:
            return ()
        events, self._events = self._events, []
        return events

    def touch(self, keys: Collection[bytes], req_context: Any) -> None:
        try:
            if keys:
                self._tier.touch(keys)
        except Exception as exc:
            self._log("touch", exc)

    def on_new_request(self, req_context: Any) -> Any:
        return RequestOffloadingContext() if RequestOffloadingContext is not None else None

    def on_schedule_end(self, context: Any) -> None:
        # vLLM has submitted this step's promotions (it flushes them before
        # calling the tiers): HITs not loaded by now were not used.
        self._promised.clear()

    def on_request_finished(self, req_context: Any) -> None:
        try:
            self._failed_keys.pop(req_context.req_id, None)
        except Exception as exc:
            self._log("on_request_finished", exc)

    def drain_jobs(self) -> None:
        try:
            self._tier.drain()
        except Exception as exc:
            self._log("drain_jobs", exc)

    def shutdown(self) -> None:
        # tier_free stops the workers after their current copy and abandons
        # queued jobs; when it returns the library never touches the view.
        tier = getattr(self, "_tier", None)
        if tier is not None:
            tier.close()
        self._jobs.clear()
        self._failed_keys.clear()
        self._present.clear()
        self._complete = False
        self._unsettled.clear()
        self._promised.clear()

    # -- metrics ------------------------------------------------------------

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        if OffloadingConnectorStats is None:
            return {}
        out: dict[str, Any] = {}
        for name, (kind, _, doc) in _METRICS.items():
            labels = _METRIC_LABELS + ((_SOURCE_LABEL,) if name in _SOURCED else ())
            meta = OffloadingGaugeMetadata if kind == "gauge" else OffloadingCounterMetadata
            out[_METRIC_PREFIX + name] = meta(documentation=doc, labelnames=labels)
        return out

    def get_stats(self) -> Any:
        """The library's counters and gauges (and the adapter's lookup
        counters) as vLLM stats: gauges are snapshots, counters the increase
        since the previous call. None once the tier is closed."""
        if OffloadingConnectorStats is None or self._tier.closed:
            return None
        try:
            stats = self._tier.stats()
        except Exception as exc:
            self._log("get_stats", exc)
            return None
        totals = {
            name: getattr(stats, field)
            for name, (_, field, _) in _METRICS.items()
            if field is not None
        }
        totals["lookups/mirror"] = self._mirror_misses + self._mirror_hits
        totals["lookups/library"] = self._library_lookups
        totals["lookup_hits/mirror"] = self._mirror_hits
        totals["lookup_hits/library"] = self._library_hits
        totals["mirror_hit_failed_loads"] = self._mirror_hit_failed_loads
        labels = (self.tier_type, self._backend)
        out = OffloadingConnectorStats()
        for key, value in totals.items():
            name, _, source = key.partition("/")
            labelvalues = labels + ((source,) if source else ())
            if _METRICS[name][0] == "gauge":
                out.set_gauge(_METRIC_PREFIX + name, value, labelvalues)
            else:
                out.increase_counter(
                    _METRIC_PREFIX + name, value - self._reported.get(key, 0), labelvalues
                )
                self._reported[key] = value
        return out

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return (
            "kvtier_backend",
            "kvtier_capacity_bytes",
            "kvtier_block_bytes",
            "kvtier_io_threads",
            "kvtier_shared",
            "kvtier_lookup_mirror",
            "kvtier_namespace",
            "kvtier_version",
        )

    def config_info(self) -> dict[str, Any]:
        try:
            stats = self._tier.stats()
        except Exception as exc:
            self._log("config_info", exc)
            return {}
        return {
            "kvtier_backend": self._backend,
            "kvtier_capacity_bytes": stats.capacity_bytes,
            "kvtier_block_bytes": stats.block_bytes,
            "kvtier_io_threads": stats.io_threads,
            "kvtier_shared": self._shared,
            "kvtier_lookup_mirror": self._mirror_enabled,
            "kvtier_namespace": self.namespace,
            "kvtier_version": _lib.library_version(),
        }

    # -- diagnostics ----------------------------------------------------------

    def stats(self) -> Any:
        """The library's counters (kvtier.TierStats), for diagnostics."""
        return self._tier.stats()

    def stats_mirror(self) -> dict[str, Any]:
        """The presence mirror's state and counters, for diagnostics and tests."""
        return {
            "enabled": self._mirror_enabled,
            "complete": self._complete,
            "keys": len(self._present),
            "unsettled": len(self._unsettled),
            "mirror_lookups": self._mirror_misses + self._mirror_hits,
            "mirror_hits": self._mirror_hits,
            "library_lookups": self._library_lookups,
            "library_hits": self._library_hits,
            "mirror_hit_failed_loads": self._mirror_hit_failed_loads,
        }

    # Names of older vLLM releases.
    get_finished = get_finished_jobs
    request_finished = on_request_finished
    get_request_offloading_context = on_new_request

    @staticmethod
    def get_tier_type() -> str:
        return "KVTierSecondaryTier"


__all__ = ["KVTierSecondaryTier"]
