"""kvtier as a vLLM (0.33) secondary tier.

Enable it with one entry in ``kv_connector_extra_config["secondary_tiers"]``::

    {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm",
     "capacity_bytes": "64GiB"}

Every key other than vLLM's own (``type``, ``module_path``, ``backpressure``)
and this adapter's (``enable_kv_events``, ``locality``, ``lookup_mirror``) is a
kvtier config key, passed to the library as a string; an unknown one fails at
construction. ``docs/vllm.md`` lists them all.

The tier copies whole rows of vLLM's primary CPU buffer: row size is the
view's ``strides[0]``, the whole view is handed to the library once, and the
chunk ids of each job are the row numbers. Scheduler-facing methods never
raise: a failing lookup answers MISS, a rejected submit becomes a failed
``JobResult`` at the next ``get_finished_jobs``.

Lookups are answered by a presence mirror of the tier's contents
(``kvtier._mirror``, which says how it stays exact), jobs are kept by
``kvtier._vllm_jobs``; ``kvtier._vllm_compat`` holds what differs between
vLLM releases, ``kvtier._vllm_setup`` how the tier presents itself to vLLM
and ``kvtier._vllm_metrics`` its Prometheus series.

This module imports without vLLM; the class then refuses to be instantiated.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from . import _lib, _vllm_metrics, _vllm_setup, identity
from ._adapter import FailureLog, backend_of, is_shared, parse_bool
from ._mirror import PresenceMirror
from ._vllm_compat import (
    ANSWERS,
    IMPORT_ERROR,
    Medium,
    RequestOffloadingContext,
    SecondaryTierManager,
    logger,
    offloading_event,
)
from ._vllm_jobs import JobBook
from .records import TierStats
from .tier import Tier

# Keys vLLM or its branches may pass that are not kvtier config.
_VLLM_KWARGS = ("tier_name", "name")
# Seconds between two log lines of one failing call.
_LOG_INTERVAL_S = 5.0
# OffloadingEvent.ownership of this tier's events (vLLM's events tracker keys
# a block's residencies by (medium, ownership)).
_OWNERSHIP = "kvtier"
_OWNER = "kvtier secondary tier"


class KVTierSecondaryTier(SecondaryTierManager):
    """A vLLM ``SecondaryTierManager`` backed by libkvtier."""

    medium = Medium.CPU if Medium is not None else None

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
        if IMPORT_ERROR is not None:
            raise ImportError(
                "kvtier.vllm.KVTierSecondaryTier needs vLLM (>= 0.33, with "
                "vllm.v1.kv_offload.tiering); importing it failed: "
                f"{IMPORT_ERROR!r}"
            ) from IMPORT_ERROR
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
                f"{_OWNER}: 'events' is set by the adapter (it keeps "
                "its lookup mirror and vLLM's KV events from them); use "
                "'enable_kv_events' for vLLM events and 'lookup_mirror' for lookups"
            )
        want_vllm_events = parse_bool(_OWNER, "enable_kv_events", enable_kv_events)
        mirror_enabled = parse_bool(_OWNER, "lookup_mirror", lookup_mirror)
        super().__init__(
            *_vllm_setup.base_args(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        )
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type
        self._log = FailureLog(logger, f"kvtier tier '{tier_type}'", _LOG_INTERVAL_S)

        self._backend = backend_of(config)
        self._shared = is_shared(config)
        where = _vllm_setup.placement(self._backend, self._shared, locality)
        self.medium = where.medium
        if where.cache_hit_source is not None:
            self.cache_hit_source = where.cache_hit_source
        self.locality = where.locality
        _vllm_setup.tune_backpressure(backpressure_detector, self._backend, locality)

        strides = primary_kv_view.strides
        if not strides:
            raise ValueError("primary_kv_view must have strides (one row per chunk)")
        self._row_bytes = strides[0]

        publishes = _vllm_setup.publishes_events(offloading_spec, want_vllm_events, tier_type)
        self._events: list[Any] | None = [] if publishes else None
        if mirror_enabled or publishes:
            config["events"] = True

        # What the blocks mean (model, dtype, layout; kvtier.identity), so
        # that no engine of another identity ever reads them; the user's
        # namespace is added to it, never in its place.
        user_namespace = str(config.pop("namespace", "") or "")
        derived = identity.vllm_namespace(offloading_spec)
        self.namespace = identity.with_user(derived, user_namespace) if derived else user_namespace
        if self.namespace:
            config["namespace"] = self.namespace
        self._tier = Tier(primary_kv_view, block_bytes=self._row_bytes, **config)

        self._failed_keys: dict[str, set[bytes]] = {}
        self._mirror = PresenceMirror(
            self._tier,
            enabled=mirror_enabled,
            shared=self._shared,
            # The library trusts the namespace's clear generation this long
            # (probe_ttl_ms, at least 250 ms; the library has checked it).
            lease_s=max(int(config.get("probe_ttl_ms", 1000)), 250) / 1000,
            answers=ANSWERS,
            failed_keys=self._failed_keys,
            on_error=self._log.failed,
            emit=self._emit if publishes else None,
            label=f"kvtier tier '{tier_type}'",
            logger=logger,
        )
        # vLLM calls lookup once per key per step: bound straight to the
        # mirror's, it costs no call through this class.
        self.lookup = self._mirror.lookup  # type: ignore[method-assign]
        self._jobs = JobBook(self._tier, self._mirror, self._failed_keys, self._row_bytes, self._log)
        self._reporter = _vllm_metrics.StatsReporter(tier_type, self._backend)
        if self._mirror.reads_events:
            self._mirror.drain_events()  # blocks recovered at open (disk)
        logger.info(
            "kvtier secondary tier '%s': %s backend, namespace %r, %d rows of %d "
            "bytes, lookup mirror %s, library %s (%s)",
            tier_type,
            self._backend,
            self.namespace,
            self._tier.num_rows,
            self._row_bytes,
            "on" if mirror_enabled else "off",
            _lib.library_version(),
            _lib.library_path,
        )

    def _emit(self, removed: bool, keys: list[bytes]) -> None:
        assert self._events is not None  # emit is given only when events are published
        self._events.append(
            offloading_event(
                keys=keys,
                medium=self.medium,
                removed=removed,
                locality=self.locality,
                ownership=_OWNERSHIP,
                # Every block this tier reports stored is reported removed
                # when it stops being readable: vLLM's events tracker keeps
                # its payload until then, so the BlockRemoved names the same
                # hashes.
                removal_expected=True,
            )
        )

    # -- SecondaryTierManager ---------------------------------------------

    def lookup(self, key: bytes, req_context: Any) -> Any:
        return self._mirror.lookup(key, req_context)

    def submit_store(self, job_metadata: Any) -> None:
        self._jobs.submit(job_metadata, is_load=False)

    def submit_load(self, job_metadata: Any) -> None:
        self._jobs.submit(job_metadata, is_load=True)

    def get_finished_jobs(self) -> list[Any]:
        return self._jobs.finished()

    def has_pending_work(self) -> bool:
        return self._jobs.has_pending_work()

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
            self._log.failed("touch", exc)

    def on_new_request(self, req_context: Any) -> Any:
        return RequestOffloadingContext() if RequestOffloadingContext is not None else None

    def on_schedule_end(self, context: Any) -> None:
        # vLLM has submitted this step's promotions (it flushes them before
        # calling the tiers): HITs not loaded by now were not used.
        self._mirror.end_step()

    def on_request_finished(self, req_context: Any) -> None:
        try:
            self._jobs.request_finished(req_context.req_id)
        except Exception as exc:
            self._log.failed("on_request_finished", exc)

    def drain_jobs(self) -> None:
        try:
            self._tier.drain()
        except Exception as exc:
            self._log.failed("drain_jobs", exc)

    def shutdown(self) -> None:
        # tier_free stops the workers after their current copy and abandons
        # queued jobs; when it returns the library never touches the view.
        tier = getattr(self, "_tier", None)
        if tier is not None:
            tier.close()
        if hasattr(self, "_jobs"):
            self._jobs.clear()
            self._mirror.clear()

    # -- metrics ------------------------------------------------------------

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        return _vllm_metrics.definitions()

    def get_stats(self) -> Any:
        """The library's counters and gauges (and the adapter's lookup
        counters), and every family of the library's Prometheus text, as vLLM
        stats: gauges are snapshots, counters the increase since the previous
        call, histograms the observations since then (the library's text at
        most every second: _vllm_metrics.LIBRARY_INTERVAL_S). None once the
        tier is closed."""
        if _vllm_metrics.OffloadingConnectorStats is None or self._tier.closed:
            return None
        try:
            stats = self._tier.stats()
            return self._reporter.report(stats, self._mirror, self._tier.metrics)
        except Exception as exc:
            self._log.failed("get_stats", exc)
            return None

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return _vllm_metrics.CONFIG_INFO_KEYS

    def config_info(self) -> dict[str, Any]:
        try:
            stats = self._tier.stats()
        except Exception as exc:
            self._log.failed("config_info", exc)
            return {}
        return _vllm_metrics.config_info(
            stats, self._backend, self._shared, self._mirror.enabled, self.namespace
        )

    # -- diagnostics ----------------------------------------------------------

    def stats(self) -> TierStats:
        """The library's counters (kvtier.TierStats), for diagnostics."""
        return self._tier.stats()

    def stats_mirror(self) -> dict[str, Any]:
        """The presence mirror's state and counters, for diagnostics and tests."""
        return self._mirror.stats()

    # Names of older vLLM releases.
    get_finished = get_finished_jobs
    request_finished = on_request_finished
    get_request_offloading_context = on_new_request

    @staticmethod
    def get_tier_type() -> str:
        return "KVTierSecondaryTier"


__all__ = ["KVTierSecondaryTier"]
