"""The presence mirror: the keys a tier holds readable, kept in Python from
the library's block events, so that a lookup of one key needs no library call.

vLLM asks ``lookup`` one key at a time, and one ctypes call costs more than
vLLM's whole budget for it. The mirror answers from a set fed by the
library's block events (STORED / REMOVED, per key, in order). It stays exact
because the library changes what it holds at only two kinds of moments:

* synchronously, inside ``submit_store`` (planning evicts under the index
  lock): the owner drains the events right after each store it submits;
* on a worker thread, when a job completes (a store's blocks become readable,
  a load finds a block corrupt or gone): keys of jobs submitted and not yet
  reported are "unsettled" and always asked of the library. The owner polls
  results first and events second, and the library records a job's events
  before it queues its result, so a key leaves the unsettled set only once
  its events are in the mirror.

A key the mirror lacks is a MISS only while the mirror is complete: a tier
that nobody else writes to, with no event lost. After a LOST event (the ring
overflowed) the mirror is cleared and only a subset: absent keys are then
asked of the library (whose HIT answers are added back), until the library's
block count equals the mirror's size with no job in flight. Shared storage
(disk ``shared=true``, redis ``sharing=shared``) is never complete: another
writer's blocks are found by the library's probes, so absent keys always go to
the library. Its probes can also evict on a worker thread, so while one may be
running (the library answered PENDING since its gauge of probes in flight was
last seen at 0) a mirror HIT first drains the events.

Keys answered HIT from the mirror are "promised": the owner touches them
(one batched call) before the next store, so a store submitted between a
lookup and its load evicts other blocks first, and counts those whose load
then failed (zero for a tier nobody else writes to).

Disabled (``enabled=False``) it holds nothing and every lookup asks the
library; it still reads the events for an owner that publishes them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from .records import EventKind, LookupState
from .tier import Tier

_EVENT_BATCH = 4096
# Bound on remembered HIT answers when end_step is never called.
_MAX_PROMISED = 1 << 16
# Enum members as module constants: `LookupState.HIT` is a class attribute
# lookup through the enum's metaclass, ~100 ns each on CPython 3.11.
_STATE_HIT = LookupState.HIT
_STATE_PENDING = LookupState.PENDING
_EVENT_LOST = EventKind.LOST
_EVENT_REMOVED = EventKind.REMOVED


class PresenceMirror:
    """Answers lookups of one key for a :class:`Tier` built with ``events=True``.

    ``answers`` are what :meth:`lookup` returns, indexed by
    :class:`LookupState` (MISS, HIT, PENDING): an engine's own values.
    ``failed_keys`` (request id -> keys) is the owner's record of loads that
    failed for a request: those keys answer MISS to it. ``emit(removed,
    keys)``, if given, receives the events as runs of one kind, keys in the
    library's order. ``on_error(what, exc)`` hears of a failed lookup (which
    answers MISS) and of events that could not be read.
    """

    def __init__(
        self,
        tier: Tier,
        *,
        enabled: bool,
        shared: bool,
        answers: Sequence[Any],
        lease_s: float = 1.0,
        failed_keys: dict[str, set[bytes]],
        on_error: Callable[[str, BaseException], None],
        emit: Callable[[bool, list[bytes]], None] | None = None,
        label: str = "kvtier",
        logger: logging.Logger | None = None,
    ) -> None:
        self._tier = tier
        self.enabled = enabled
        self.shared = shared
        self._miss, self._hit = answers[LookupState.MISS], answers[LookupState.HIT]
        self._answers = answers
        self._failed_keys = failed_keys
        self._on_error = on_error
        self._emit = emit
        self._label = label
        self._logger = logger or logging.getLogger(__name__)
        # Keys the library holds readable, as far as its events told.
        self.present: set[bytes] = set()
        # True while `present` is every key the library holds readable.
        self.complete = enabled and not shared
        # key -> number of submitted, unreported jobs naming it: asked of the
        # library, whose answer may change on a worker thread.
        self._unsettled: dict[bytes, int] = {}
        # Keys answered HIT this step and not yet loaded, insertion-ordered (a
        # dict) so that the touch before a store is deterministic.
        self._promised: dict[bytes, None] = {}
        # Shared storage: a probe may be running (it can evict on a worker).
        self._probes_maybe_running = False
        # Shared storage: the library trusts the clear generation it knows
        # for `lease_s` after reading it, and another process's clear()
        # returns two leases after raising it. So a mirror HIT is given only
        # within one lease of a library answer that was not PENDING; then no
        # HIT outlives a clear() anywhere (docs/sharing.md).
        self._lease_s = lease_s
        self._trusted_until = 0.0
        self._lost_warned = False
        self.misses = 0
        self.hits = 0
        self.library_lookups = 0
        self.library_hits = 0
        self.hit_failed_loads = 0

    @property
    def expects_events_between_jobs(self) -> bool:
        """Whether events may come with no job result to announce them: a
        shared tier's probes and other writers, or a mirror catching up
        (lost events, or no mirror, whose events go to the owner as they
        come). Otherwise every event comes from a job, recorded before its
        result is queued, or at a store's submit (read there), at open or
        at clear."""
        return not self.complete or self.shared or self._probes_maybe_running

    @property
    def reads_events(self) -> bool:
        """Whether the tier's block events are read (for the mirror or the owner)."""
        return self.enabled or self._emit is not None

    # -- the hot path ---------------------------------------------------------

    def lookup(self, key: bytes, req_context: Any) -> Any:
        """The answer for one key, from the mirror when it knows."""
        try:
            if self._failed_keys:
                failed = self._failed_keys.get(req_context.req_id)
                if failed is not None and key in failed:
                    return self._miss
            if key in self.present:
                if not self._probes_maybe_running and key not in self._unsettled:
                    if self.shared and time.monotonic() >= self._trusted_until:
                        return self._ask_library(key)
                    self.hits += 1
                    self._promised[key] = None
                    return self._hit
            elif self.complete and key not in self._unsettled:
                self.misses += 1
                return self._miss
            return self._ask_library(key)
        except Exception as exc:
            self._on_error("lookup", exc)
            return self._miss

    def _ask_library(self, key: bytes) -> Any:
        if self._probes_maybe_running and key in self.present:
            # A probe's admission may have evicted it: bring the mirror up to
            # date before answering from it.
            self.drain_events()
            if (
                key in self.present
                and key not in self._unsettled
                and time.monotonic() < self._trusted_until
            ):
                self.hits += 1
                self._promised[key] = None
                return self._hit
        asked = time.monotonic()
        state = self._tier.lookup_one(key)
        self.library_lookups += 1
        if self.shared and state is not _STATE_PENDING:
            self._trusted_until = asked + self._lease_s
        if state is _STATE_HIT:
            self.library_hits += 1
            if self.enabled:
                # Safe even before the pending events are drained: the key's
                # events up to now end with STORED, later ones follow it.
                self.present.add(key)
        elif state is _STATE_PENDING and self.shared:
            self._probes_maybe_running = True
        return self._answers[state]

    # -- the owner's jobs -----------------------------------------------------

    def before_store(self) -> None:
        """Keys answered HIT and not yet loaded become most recent (the
        latest answer most of all), so a store's evictions take others first."""
        if self._promised:
            self._tier.touch(list(reversed(self._promised)))

    def submitted(self, keys: Iterable[bytes], is_load: bool) -> set[bytes] | None:
        """Records an accepted job: its keys are unsettled until
        :meth:`settled`. A load takes its promised keys out and returns them
        (to count them if it fails); a store's evictions are read now."""
        promised = None
        if is_load and self._promised:
            promised = {k for k in keys if k in self._promised}
            for k in promised:
                del self._promised[k]
        unsettled = self._unsettled
        for key in keys:
            unsettled[key] = unsettled.get(key, 0) + 1
        if not is_load and self.reads_events:
            try:
                self.drain_events()  # this store's evictions, made at submit
            except Exception as exc:
                self.failed("submit_store", exc)
        return promised

    def settled(self, keys: Iterable[bytes]) -> None:
        """A job of these keys was reported: they no longer change under it."""
        unsettled = self._unsettled
        for key in keys:
            n = unsettled.get(key, 0)
            if n <= 1:
                unsettled.pop(key, None)
            else:
                unsettled[key] = n - 1

    def load_failed(self, promised: set[bytes] | None, failed: Collection[bytes]) -> None:
        """Counts the keys answered HIT whose load then failed."""
        if promised:
            self.hit_failed_loads += len(promised.intersection(failed))

    def end_step(self) -> None:
        """The engine's step ended: HITs not loaded by now were not used."""
        self._promised.clear()

    def bound_promises(self) -> None:
        """Forgets the HITs of a caller that never ends its steps."""
        if len(self._promised) > _MAX_PROMISED:
            self._promised.clear()

    # -- events ---------------------------------------------------------------

    def drain_events(self) -> None:
        """Applies the library's pending block events to the mirror and hands
        them to ``emit`` (one run per stretch of events of one kind)."""
        present = self.present
        mirror = self.enabled
        emit = self._emit
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
                    self.complete = False
                    if not self._lost_warned:
                        self._lost_warned = True
                        self._logger.warning(
                            "%s: %d block events dropped (raise events_capacity); lookups ask "
                            "the library until the mirror is whole again%s",
                            self._label,
                            event.dropped,
                            ", and routers miss those KV events" if emit is not None else "",
                        )
                    continue
                removed = kind is _EVENT_REMOVED
                if mirror:
                    if removed:
                        present.discard(event.key)
                    else:
                        present.add(event.key)
                if emit is not None:
                    if run and removed != run_removed:
                        emit(run_removed, run)
                        run = []
                    run_removed = removed
                    run.append(event.key)
            if len(batch) < _EVENT_BATCH:
                break
        if run and emit is not None:
            emit(run_removed, run)

    def resync(self, jobs_in_flight: int) -> None:
        """Called after a full drain. A shared tier's probes: cleared once the
        library has none queued or running (``probes_in_flight``). A mirror made partial by lost events: complete
        again once it holds as many keys as the library's readable blocks,
        with no job in flight (nothing can change meanwhile, and every key it
        holds is readable, so the two sets are equal)."""
        if self._probes_maybe_running and self._tier.stats().probes_in_flight == 0:
            self._probes_maybe_running = False
            self.drain_events()  # the last probes' admissions
        if (
            not self.complete
            and self.enabled
            and not self.shared
            and not jobs_in_flight
            and self._tier.stats().num_blocks == len(self.present)
        ):
            self.complete = True

    def failed(self, what: str, exc: BaseException) -> None:
        """Events could not be read: the mirror can no longer say MISS."""
        self._on_error(what, exc)
        self.present.clear()
        self.complete = False

    def clear(self) -> None:
        """Forgets everything (the tier was closed)."""
        self.present.clear()
        self.complete = False
        self._unsettled.clear()
        self._promised.clear()

    def stats(self) -> dict[str, Any]:
        """The mirror's state and counters, for diagnostics and tests."""
        return {
            "enabled": self.enabled,
            "complete": self.complete,
            "keys": len(self.present),
            "unsettled": len(self._unsettled),
            "mirror_lookups": self.misses + self.hits,
            "mirror_hits": self.hits,
            "library_lookups": self.library_lookups,
            "library_hits": self.library_hits,
            "mirror_hit_failed_loads": self.hit_failed_loads,
        }
