"""kvtier as a vLLM (0.33) secondary tier.

Enable it with one entry in ``kv_connector_extra_config["secondary_tiers"]``::

    {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm",
     "capacity_bytes": "64GiB", "io_threads": 8}

Every key other than vLLM's own (``type``, ``module_path``, ``backpressure``)
and this adapter's (``enable_kv_events``, ``locality``) is a kvtier config key,
passed to the library as a string; an unknown one fails at construction.

The tier copies whole rows of vLLM's primary CPU buffer: row size is the
view's ``strides[0]``, the whole view is handed to the library once, and the
chunk ids of each job are the row numbers. Scheduler-facing methods never
raise: a failing lookup answers MISS, a rejected submit becomes a failed
``JobResult`` at the next ``get_finished_jobs``.

This module imports without vLLM; the class then refuses to be instantiated.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections.abc import Collection, Iterable
from typing import Any

from . import _lib
from .tier import JobResult as _TierResult
from .tier import KVTierError, LookupState, Tier

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
    _RESULT_FIELDS = frozenset()
    _EVENT_FIELDS = frozenset()
    _SUPER_PARAMS = []

# Keys vLLM or its branches may pass that are not kvtier config.
_VLLM_KWARGS = ("tier_name", "name")
_LOG_INTERVAL_S = 5.0


def _job_rows(job: Any) -> Any:
    rows = getattr(job, "chunk_ids", None)
    return job.block_ids if rows is None else rows


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
        enable_kv_events: bool = False,
        locality: str | None = None,
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
        self._init_base(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type
        self.locality = None
        if locality is not None:
            if Locality is None:
                raise ValueError("this vLLM has no Locality; drop 'locality'")
            self.locality = Locality(locality)  # ValueError on a bad name

        backend = str(config.get("backend", "memory"))
        if backend != "memory":
            # A tier on storage is a different medium for load_tier_filter
            # and for cache-hit metrics.
            self.medium = Medium.STORAGE
            if CacheHitSource is not None:
                self.cache_hit_source = CacheHitSource.DISK

        strides = primary_kv_view.strides
        if not strides:
            raise ValueError("primary_kv_view must have strides (one row per chunk)")
        self._row_bytes = strides[0]
        self._tier = Tier(primary_kv_view, block_bytes=self._row_bytes, **config)

        self._events: list[Any] | None = None
        if enable_kv_events:
            kv_events = getattr(offloading_spec, "kv_events_config", None)
            if kv_events is not None and getattr(kv_events, "enable_kv_cache_events", False):
                self._events = []
            else:
                logger.warning(
                    "enable_kv_events is set on secondary tier '%s' but KV cache "
                    "events are disabled globally; the tier will not emit events.",
                    tier_type,
                )
        # job id -> (is_load, keys, req_id) for every accepted job not yet reported.
        self._jobs: dict[int, tuple[bool, Any, str | None]] = {}
        # Results of rejected submits, reported by the next get_finished_jobs.
        self._ready: list[Any] = []
        # req_id -> keys whose load failed for that request: they look up as
        # MISS for it, so it cannot loop on a promotion that cannot succeed.
        self._failed_keys: dict[str, set[bytes]] = {}
        self._last_log: dict[str, float] = {}
        logger.info(
            "kvtier secondary tier '%s': %d rows of %d bytes, library %s (%s)",
            tier_type,
            self._tier.num_rows,
            self._row_bytes,
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

    def _submit(self, job: Any, is_load: bool) -> None:
        job_id = job.job_id
        keys = job.keys
        req_context = getattr(job, "req_context", None)
        req_id = getattr(req_context, "req_id", None)
        try:
            if type(keys) is not list and type(keys) is not tuple:
                keys = tuple(keys)
            rows = _job_rows(job)
            if is_load:
                self._tier.submit_load(job_id, keys, rows)
            else:
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
        self._jobs[job_id] = (is_load, keys, req_id)

    def _reject(self, job_id: int, keys: Any, req_id: str | None, is_load: bool) -> None:
        if is_load:
            try:
                self._mark_failed(req_id, keys)
            except TypeError:  # unhashable junk keys: nothing to remember
                pass
        self._ready.append(self._result(job_id=job_id, success=False))

    def _finished(self, r: _TierResult) -> Any:
        is_load, keys, req_id = self._jobs.pop(r.job_id)
        success = r.status == _lib.TIER_OK
        moved = r.bytes or None  # None: let vLLM count len(keys) * row size
        common = {
            "job_id": r.job_id,
            "transfer_time": r.elapsed_ns / 1e9,
            "transfer_bytes": moved,
            "transfer_size": moved,
        }
        if is_load:
            if success:
                return self._result(success=True, **common)
            done = min(r.num_done, len(keys))
            self._mark_failed(req_id, keys[done:])
            return self._result(
                success=False, successful_keys=tuple(keys[:done]) if done else None, **common
            )
        if success and self._events is not None and keys:
            event = {
                "keys": list(keys),
                "medium": self.medium,
                "removed": False,
                "locality": self.locality,
                "ownership": "kvtier",
            }
            self._events.append(
                OffloadingEvent(**{k: v for k, v in event.items() if k in _EVENT_FIELDS})
            )
        return self._result(success=success, **common)

    # -- SecondaryTierManager ---------------------------------------------

    def lookup(self, key: bytes, req_context: Any) -> Any:
        try:
            if self._failed_keys:
                failed = self._failed_keys.get(req_context.req_id)
                if failed is not None and key in failed:
                    return _MISS
            return _LOOKUP[self._tier.lookup_one(key)]
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
        if not self._jobs:
            return results
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

    def stats(self) -> Any:
        """The library's counters (kvtier.TierStats), for diagnostics."""
        return self._tier.stats()

    # Names of older vLLM releases.
    get_finished = get_finished_jobs
    request_finished = on_request_finished
    get_request_offloading_context = on_new_request

    @staticmethod
    def get_tier_type() -> str:
        return "KVTierSecondaryTier"


__all__ = ["KVTierSecondaryTier"]
