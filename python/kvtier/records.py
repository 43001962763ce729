"""What the library hands back: job results, block events, stats and the
codes inside them, as Python records, and their C layouts (include/kvtier.h)."""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import struct
from typing import TYPE_CHECKING, Any, NamedTuple

from . import _lib


class LookupState(enum.IntEnum):
    """A key's state in a lookup (the C ``TIER_MISS``, ``TIER_HIT``, ``TIER_PENDING``)."""

    MISS = _lib.TIER_MISS
    HIT = _lib.TIER_HIT
    PENDING = _lib.TIER_PENDING


# Indexed by the library's state byte: a tuple, because hashing an enum
# member (a dict lookup) runs Python code.
LOOKUP_STATES = (LookupState.MISS, LookupState.HIT, LookupState.PENDING)


class JobKind(enum.IntEnum):
    STORE = _lib.TIER_JOB_STORE
    LOAD = _lib.TIER_JOB_LOAD
    DELETE = _lib.TIER_JOB_DELETE


class FailReason(enum.IntEnum):
    """Why a job failed (``JobResult.reason``, the C ``TIER_FAIL_*``)."""

    NONE = _lib.TIER_FAIL_NONE
    NO_SPACE = _lib.TIER_FAIL_NO_SPACE
    NOT_FOUND = _lib.TIER_FAIL_NOT_FOUND
    CORRUPT = _lib.TIER_FAIL_CORRUPT
    IO_ERROR = _lib.TIER_FAIL_IO_ERROR
    DEADLINE = _lib.TIER_FAIL_DEADLINE
    UNAVAILABLE = _lib.TIER_FAIL_UNAVAILABLE
    SHUTDOWN = _lib.TIER_FAIL_SHUTDOWN
    ALLOC = _lib.TIER_FAIL_ALLOC
    PANIC = _lib.TIER_FAIL_PANIC
    LENGTH_MISMATCH = _lib.TIER_FAIL_LENGTH_MISMATCH  # an extent load of another length
    BUSY = _lib.TIER_FAIL_BUSY  # a delete found the block pinned or in flight


class Feature(enum.IntFlag):
    """What a tier can do or is (:meth:`Tier.features`, the C
    ``TIER_FEATURE_*`` bits): ``EXTENTS`` (takes extent jobs; not a sealed
    disk or Redis tier), ``SHARED`` (another process may store into its
    storage; lookups probe it), ``SEALED`` (blocks sealed with a seal key),
    ``PERSISTENT`` (blocks outlive the tier: disk, Redis, memory with
    ``persist_path``)."""

    EXTENTS = _lib.TIER_FEATURE_EXTENTS
    SHARED = _lib.TIER_FEATURE_SHARED
    SEALED = _lib.TIER_FEATURE_SEALED
    PERSISTENT = _lib.TIER_FEATURE_PERSISTENT


class ItemStatus(enum.IntEnum):
    """What became of one key of an extent or delete job (``ItemResult.status``,
    the C ``TIER_ITEM_*``)."""

    OK = _lib.TIER_ITEM_OK
    MISS = _lib.TIER_ITEM_MISS
    FAILED = _lib.TIER_ITEM_FAILED
    BUSY = _lib.TIER_ITEM_BUSY


class ItemResult(NamedTuple):
    """One key's outcome in an extent or delete job (``JobResult.items``)."""

    status: ItemStatus
    #: ``FailReason.NONE`` when OK, else why not.
    reason: FailReason

    @property
    def ok(self) -> bool:
        return self.status == ItemStatus.OK


class JobResult(NamedTuple):
    """One finished job, as reported exactly once by :meth:`Tier.poll`."""

    job_id: int
    status: int
    kind: int
    num_blocks: int
    num_done: int
    bytes: int
    #: Nanoseconds from submit to completion.
    elapsed_ns: int
    #: Nanoseconds the job's blocks spent in backend I/O and copies on the
    #: tier's threads (its active transfer time): from a worker starting the
    #: job's first copy to its last copy ending, without the time queued
    #: before; 0 if no block was copied. See ``tier_job_result_t.io_ns``.
    io_ns: int
    #: Why the job failed, finer than ``status``: a :class:`FailReason`
    #: (``NONE`` on success; ``DEADLINE``, a hung device, and
    #: ``UNAVAILABLE`` both come with ``TIER_ERR_IO``).
    reason: int = 0
    #: Extent and delete jobs: one :class:`ItemResult` per key, in submit
    #: order; ``None`` for jobs of rows.
    items: list[ItemResult] | None = None

    @property
    def ok(self) -> bool:
        return self.status == _lib.TIER_OK

    @property
    def status_name(self) -> str:
        return _lib.status_name(self.status)

    @property
    def is_store(self) -> bool:
        return self.kind == _lib.TIER_JOB_STORE

    @property
    def is_load(self) -> bool:
        return self.kind == _lib.TIER_JOB_LOAD


# tier_job_result_t: job_id u64, status i32, kind u32, num_blocks u32,
# num_done u32, bytes u64, elapsed_ns u64, io_ns u64, reason u32,
# reserved u32 (56 bytes, no padding).
RESULT_STRUCT = struct.Struct("=QiIIIQQQI4x")
_NO_ITEMS = (None,)
_tuple_new = tuple.__new__


def make_result(fields: tuple[Any, ...]) -> JobResult:
    """A :class:`JobResult` from one unpacked ``tier_job_result_t`` (no items)."""
    return _tuple_new(JobResult, fields + _NO_ITEMS)


# tier_item_result_t: status u32, reason u32.
ITEM_STRUCT = struct.Struct("=II")
assert ITEM_STRUCT.size == ctypes.sizeof(_lib.tier_item_result_t) == _lib.TIER_ITEM_RESULT_SIZE_V1
assert RESULT_STRUCT.size == ctypes.sizeof(_lib.tier_job_result_t)


class EventKind(enum.IntEnum):
    STORED = _lib.TIER_EVENT_STORED
    REMOVED = _lib.TIER_EVENT_REMOVED
    LOST = _lib.TIER_EVENT_LOST


class StoredReason(enum.IntEnum):
    """How a block became readable (``Event.reason`` of a STORED event)."""

    WRITTEN = _lib.TIER_STORED_WRITTEN  # a store job of this tier
    RECOVERED = _lib.TIER_STORED_RECOVERED  # storage held it at open
    FOUND = _lib.TIER_STORED_FOUND  # shared storage: another writer's, found by a lookup


class RemovedReason(enum.IntEnum):
    """Why a block stopped being readable (``Event.reason`` of a REMOVED event)."""

    EVICTED = _lib.TIER_REMOVED_EVICTED
    CLEARED = _lib.TIER_REMOVED_CLEARED
    CORRUPT = _lib.TIER_REMOVED_CORRUPT
    VANISHED = _lib.TIER_REMOVED_VANISHED  # storage no longer holds it
    UNREADABLE = _lib.TIER_REMOVED_UNREADABLE  # transient load failures, given up on
    DELETED = _lib.TIER_REMOVED_DELETED  # a delete job (Tier.submit_delete)


class Event(NamedTuple):
    """One block event, as :meth:`Tier.poll_events` hands it out once.

    ``kind`` is STORED (the key's block became readable: lookups answer HIT),
    REMOVED (it stopped being readable) or LOST (``dropped`` events were
    dropped here because the ring was full: a mirror of the tier's contents
    is stale and must be rebuilt). ``reason`` is a :class:`StoredReason` or a
    :class:`RemovedReason` (0 for LOST); ``key`` is empty for LOST. ``seq``
    numbers events in the order recorded, dropped ones included.
    """

    seq: int
    kind: EventKind
    reason: int
    key: bytes
    dropped: int = 0


_EVENT_REASONS: dict[EventKind, type[enum.IntEnum]] = {
    EventKind.STORED: StoredReason,
    EventKind.REMOVED: RemovedReason,
}
# tier_event_t: seq u64, dropped u64, kind u32, reason u32, key_len u32,
# key[128], reserved u32 (160 bytes).
EVENT_STRUCT = struct.Struct("=QQIII128s4x")
assert EVENT_STRUCT.size == ctypes.sizeof(_lib.tier_event_t)


def make_event(seq: int, dropped: int, kind: int, reason: int, key_len: int, key: bytes) -> Event:
    """An :class:`Event` from the fields of one unpacked ``tier_event_t``."""
    event_kind = EventKind(kind)
    reasons = _EVENT_REASONS.get(event_kind)
    return Event(seq, event_kind, reasons(reason) if reasons else reason, key[:key_len], dropped)


def _stats_as_dict(self: Any) -> dict[str, int]:
    return dataclasses.asdict(self)


if TYPE_CHECKING:
    # What a type checker sees of the class built below from the field table.

    class TierStats:
        """A snapshot of ``tier_stats_t`` (same field names and order)."""

        def __init__(self, *fields: int) -> None: ...
        def __getattr__(self, name: str) -> int: ...
        def as_dict(self) -> dict[str, int]: ...

else:
    # Built from the one table of field names (_lib.STATS_FIELDS, in header order).
    TierStats = dataclasses.make_dataclass(
        "TierStats",
        [(name, int) for name in _lib.STATS_FIELDS],
        namespace={
            "__doc__": "A snapshot of ``tier_stats_t`` (same field names and order).",
            "as_dict": _stats_as_dict,
        },
        frozen=True,
    )
    # For repr and pickling (make_dataclass's own `module=` needs Python 3.12).
    TierStats.__module__ = __name__


def stats_from(out: _lib.tier_stats_t) -> TierStats:
    """A :data:`TierStats` of one ``tier_stats_t``."""
    return TierStats(*(getattr(out, name) for name in _lib.STATS_FIELDS))
