"""The `Tier` class: a Pythonic handle over one `tier_t`."""

from __future__ import annotations

import array
import ctypes
import dataclasses
import enum
import operator
import os
import struct
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from . import _lib
from ._lib import (
    TIER_ERR_CONFIG,
    TIER_ERR_INVALID_ARG,
    TIER_ERR_OUT_OF_RANGE,
    TIER_ERR_SHUTDOWN,
    TIER_JOB_LOAD,
    TIER_JOB_STORE,
    TIER_OK,
    TIER_TIMEOUT,
    lib,
)

try:  # numpy is optional; with it, block-id arrays pass without Python loops.
    import numpy as _np

    _ndarray: Any = _np.ndarray
    _INT64 = _np.dtype(_np.int64)
except ImportError:  # pragma: no cover - exercised only without numpy
    _np = None
    _ndarray = ()
    _INT64 = None

_U64_LIMIT = 1 << 64

# lookup_one runs once per key per scheduler step. ctypes' argtypes conversion
# is most of a call's cost, so this second entry point has no argtypes and is
# always given exact ctypes objects (c_void_p, c_size_t, byref, and bytes as
# char*), which ctypes passes as they are.
_lookup_exact = lib["tier_lookup"]
_lookup_exact.restype = ctypes.c_int32
_SIZES = tuple(ctypes.c_size_t(i) for i in range(_lib.TIER_MAX_KEY_LEN + 1))
_ONE = _SIZES[1]
_c_uint8 = ctypes.c_uint8
_byref = ctypes.byref

# tier_job_result_t: job_id u64, status i32, kind u32, num_blocks u32,
# num_done u32, bytes u64, elapsed_ns u64, io_ns u64, reason u32,
# reserved u32 (56 bytes, no padding).
_RESULT_STRUCT = struct.Struct("=QiIIIQQQI4x")
_RESULT_SIZE = ctypes.c_size_t(_RESULT_STRUCT.size)
_RESULT_WORDS = _RESULT_STRUCT.size // 8
_POLL_CHUNK = 256
assert _RESULT_STRUCT.size == ctypes.sizeof(_lib.tier_job_result_t)
# The longest single tier_wait; keeps close() from waiting long behind a wait().
_WAIT_SLICE_S = 0.05


class KVTierError(Exception):
    """A kvtier call failed.

    Attributes:
        status: the library's status code (negative ``TIER_ERR_*``).
        status_name: its name, e.g. ``"TIER_ERR_OUT_OF_RANGE"``.
        message: ``tier_last_error``'s text (or the binding's own, for
            argument problems found before calling the library).
        function: the C function (or Python method) that failed.

    """

    def __init__(self, status: int, message: str, function: str = "") -> None:
        self.status = status
        self.status_name = _lib.status_name(status)
        self.message = message
        self.function = function
        # Library messages already start with the function's name.
        if function and not message.startswith(function):
            message = f"{function}: {message}"
        super().__init__(f"{self.status_name} ({status}): {message}")

    def __reduce__(self):  # picklable, e.g. across multiprocessing
        return (KVTierError, (self.status, self.message, self.function))


def _fail(status: int, function: str) -> KVTierError:
    return KVTierError(status, _lib.last_error(), function)


class LookupState(enum.IntEnum):
    MISS = _lib.TIER_MISS
    HIT = _lib.TIER_HIT
    PENDING = _lib.TIER_PENDING


_STATES = (LookupState.MISS, LookupState.HIT, LookupState.PENDING)


class JobKind(enum.IntEnum):
    STORE = TIER_JOB_STORE
    LOAD = TIER_JOB_LOAD


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

    @property
    def ok(self) -> bool:
        return self.status == TIER_OK

    @property
    def status_name(self) -> str:
        return _lib.status_name(self.status)

    @property
    def is_store(self) -> bool:
        return self.kind == TIER_JOB_STORE

    @property
    def is_load(self) -> bool:
        return self.kind == TIER_JOB_LOAD


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


_make_result = JobResult._make


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


_EVENT_REASONS = {
    EventKind.STORED: StoredReason,
    EventKind.REMOVED: RemovedReason,
}
# tier_event_t: seq u64, dropped u64, kind u32, reason u32, key_len u32,
# key[128], reserved u32 (160 bytes).
_EVENT_STRUCT = struct.Struct("=QQIII128s4x")
_EVENT_SIZE = ctypes.c_size_t(_EVENT_STRUCT.size)
_EVENT_WORDS = _EVENT_STRUCT.size // 8
_EVENT_CHUNK = 256
assert _EVENT_STRUCT.size == ctypes.sizeof(_lib.tier_event_t)


def _make_event(seq: int, dropped: int, kind: int, reason: int, key_len: int, key: bytes) -> Event:
    kind = EventKind(kind)
    reasons = _EVENT_REASONS.get(kind)
    return Event(seq, kind, reasons(reason) if reasons else reason, key[:key_len], dropped)


def _stats_as_dict(self: Any) -> dict[str, int]:
    return dataclasses.asdict(self)


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
TierStats.__module__ = __name__  # for repr and pickling (make_dataclass's
# own `module=` needs Python 3.12)


def _config_text(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if key == "seal_key" and isinstance(value, (bytes, bytearray)):
        # 32 raw bytes, as a key store hands them out; the library checks the
        # length (and never repeats the value in its message).
        return bytes(value).hex()
    text = str(value)
    if "\0" in text or "\0" in key:
        raise KVTierError(TIER_ERR_CONFIG, f"config {key!r}: NUL byte in key or value", "Tier")
    return text


def _pack_keys(keys: Any, function: str) -> tuple[bytes | None, int, int]:
    """Packs equal-length keys back to back: (packed, key_len, n)."""
    if isinstance(keys, (bytes, bytearray, memoryview, str)):
        raise KVTierError(
            TIER_ERR_INVALID_ARG,
            "keys must be a sequence of bytes keys, not a single key",
            function,
        )
    if type(keys) is not list and type(keys) is not tuple:
        keys = list(keys)  # sets, dict views, generators: any Collection
    n = len(keys)
    if n == 0:
        # key_len must be valid even for an empty call; NULL is legal at n = 0.
        return None, 1, 0
    first = keys[0]
    try:
        key_len = len(first)
        if n == 1:
            packed = first if type(first) is bytes else bytes(first)
        else:
            packed = b"".join(keys)
    except TypeError:
        raise KVTierError(
            TIER_ERR_INVALID_ARG, "keys must be bytes-like objects", function
        ) from None
    if len(packed) != key_len * n or (n > 1 and len(set(map(len, keys))) != 1):
        lengths = sorted(set(map(len, keys)))
        raise KVTierError(
            TIER_ERR_INVALID_ARG,
            f"keys must all have the same length; got lengths {lengths}",
            function,
        )
    return packed, key_len, n


def _pack_block_ids(block_ids: Any, function: str) -> tuple[Any, int]:
    """Block ids packed as native int64 bytes (passed as ``const int64_t *``),
    and their count."""
    if type(block_ids) is _ndarray or isinstance(block_ids, _ndarray):
        if block_ids.ndim != 1:
            raise KVTierError(
                TIER_ERR_INVALID_ARG,
                f"block_ids must be one-dimensional, got shape {block_ids.shape}",
                function,
            )
        if block_ids.dtype is not _INT64:
            if block_ids.dtype.kind not in "iu":
                raise KVTierError(
                    TIER_ERR_INVALID_ARG,
                    f"block_ids must be integers, got dtype {block_ids.dtype}",
                    function,
                )
            # uint64 ids >= 2**63 wrap negative, which the library rejects.
            block_ids = block_ids.astype(_INT64)
        # tobytes() is one memcpy; a bytes payload is 8-aligned in CPython, and
        # the library checks alignment anyway (INVALID_ARG, never a crash).
        return block_ids.tobytes(), block_ids.shape[0]
    try:
        arr = array.array("q", block_ids)
    except OverflowError:
        raise KVTierError(
            TIER_ERR_OUT_OF_RANGE, "a block id does not fit in int64", function
        ) from None
    except TypeError:
        raise KVTierError(
            TIER_ERR_INVALID_ARG, "block_ids must be a sequence of integers", function
        ) from None
    return arr.tobytes(), len(arr)


class Tier:
    """A kvtier secondary tier over a caller-owned primary buffer.

    ``buffer`` is any writable, C-contiguous object with the buffer protocol
    (bytearray, numpy array, mmap, memoryview...). It is cut into rows of
    ``block_bytes`` (default: the buffer's first stride, i.e. one row of a 2-D
    array; pass it explicitly for 1-D buffers such as bytearray or mmap). The
    tier holds the buffer, and a buffer export so that a bytearray cannot be
    resized nor an mmap closed underneath it, until :meth:`close`.

    Config keywords are passed to ``tier_config_set`` as strings: for example
    ``capacity_bytes="1GiB"`` or ``capacity_bytes=1 << 30``, ``io_threads=4``,
    ``backend="memory"``. ``None`` values are skipped (library default).
    ``seal_key`` takes 64 hex digits or 32 raw bytes; ``seal_key_file`` a
    path (str or os.PathLike) to a file only its owner can read. Python
    cannot wipe its own copies of a ``seal_key`` string: prefer
    ``seal_key_file``.

    Every method may be called from any thread. After :meth:`close` (which is
    idempotent) every method raises :class:`KVTierError` with
    ``TIER_ERR_SHUTDOWN``.

    A tier belongs to the process that created it. In a child made by
    ``fork`` (``os.fork``, ``multiprocessing`` with the fork start method),
    which has none of the tier's I/O threads, every method of an inherited
    tier raises :class:`KVTierError` with ``TIER_ERR_SHUTDOWN`` at once and a
    message naming the owning process: create a new ``Tier`` in the child.
    :meth:`close` on the inherited tier is safe there (or just drop it). The
    parent's tier is unaffected.
    """

    def __init__(self, buffer: Any, block_bytes: int | None = None, **config: Any) -> None:
        self._handle: int | None = None
        self._handle_arg: ctypes.c_void_p | None = None  # the same, for _lookup_exact
        # Calls in progress: list.append/pop are atomic under the GIL, which
        # lets close() wait for them without a lock on every call.
        self._calls: list[None] = []
        self._poll_buffers: list[Any] = []
        self._event_buffers: list[Any] = []
        self._anchor = None
        self._view = None
        # The creating process: in a forked child, close() must not wait for
        # calls that were in progress on the parent's other threads.
        self._pid = os.getpid()
        try:
            view = memoryview(buffer)
        except TypeError:
            raise KVTierError(
                TIER_ERR_INVALID_ARG,
                f"buffer must support the buffer protocol, got {type(buffer).__name__}",
                "Tier",
            ) from None
        if view.readonly:
            raise KVTierError(TIER_ERR_INVALID_ARG, "buffer is read-only", "Tier")
        if not view.c_contiguous:
            raise KVTierError(TIER_ERR_INVALID_ARG, "buffer is not C-contiguous", "Tier")
        if view.nbytes == 0:
            raise KVTierError(TIER_ERR_INVALID_ARG, "buffer is empty", "Tier")
        if block_bytes is None:
            block_bytes = view.strides[0] if view.ndim else view.nbytes
        # Holding a ctypes object built from the view keeps a buffer export
        # (and so the memory) alive until close().
        anchor = ctypes.c_char.from_buffer(view)
        try:
            out = self._new(ctypes.addressof(anchor), view.nbytes, block_bytes, config)
        except BaseException:
            del anchor  # let go of the export now, not when the traceback dies
            view.release()
            raise
        self._buffer = buffer
        self._view = view
        self._anchor = anchor
        self.block_bytes: int = block_bytes
        self.nbytes: int = view.nbytes
        self.num_rows: int = view.nbytes // block_bytes
        self._handle = out
        self._handle_arg = ctypes.c_void_p(out)

    @staticmethod
    def _new(address: int, nbytes: int, block_bytes: Any, config: dict[str, Any]) -> int:
        cfg = lib.tier_config_new()
        if not cfg:
            raise KVTierError(_lib.TIER_ERR_ALLOC, "tier_config_new returned NULL", "Tier")
        try:
            for key, value in config.items():
                if value is None:
                    continue
                st = lib.tier_config_set(
                    cfg, key.encode(), _config_text(key, value).encode()
                )
                if st != TIER_OK:
                    raise _fail(st, "tier_config_set")
            out = ctypes.c_void_p()
            if not isinstance(block_bytes, int) or block_bytes < 0:
                raise KVTierError(
                    TIER_ERR_INVALID_ARG,
                    f"block_bytes must be a positive int, got {block_bytes!r}",
                    "Tier",
                )
            st = lib.tier_new(cfg, address, nbytes, block_bytes, ctypes.byref(out))
            if st != TIER_OK:
                raise _fail(st, "tier_new")
        finally:
            lib.tier_config_free(cfg)
        return out.value

    # -- lifetime -----------------------------------------------------------

    def _call(self, name: str, fn: Any, *args: Any, timeout_ok: bool = False) -> int:
        """Runs ``fn(handle, *args)``: fails if the tier is closed, counts as a
        call in progress (so close() waits for it), and raises on an error
        status. Returns the status (TIER_OK, or TIER_TIMEOUT if allowed)."""
        calls = self._calls
        calls.append(None)
        try:
            handle = self._handle
            if handle is None:
                raise KVTierError(TIER_ERR_SHUTDOWN, "the tier is closed", name)
            st = fn(handle, *args)
        finally:
            calls.pop()
        if st != TIER_OK and not (timeout_ok and st == TIER_TIMEOUT):
            raise _fail(st, name)
        return st

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Stops the I/O threads and frees the tier; queued jobs are abandoned
        (not reported). When it returns the library never touches the buffer
        again. Waits for calls in progress on other threads. Idempotent."""
        handle = self._handle
        if handle is None:
            return
        self._handle = None  # new calls now fail; ones in progress finish
        self._handle_arg = None
        if os.getpid() == self._pid:
            while self._calls:
                time.sleep(0.0005)
        # else: a forked child. Calls the parent's threads had in progress at
        # the fork are copied into _calls, but those threads do not exist here
        # and the calls never end; tier_free on an inherited handle neither
        # waits nor touches anything those calls used.
        lib.tier_free(handle)
        self._anchor = None
        if self._view is not None:
            try:
                self._view.release()
            except BufferError:  # pragma: no cover - another export of ours
                pass
        self._view = None
        self._buffer = None

    def __enter__(self) -> Tier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # No other thread can be inside a call: it would hold a reference.
        handle = getattr(self, "_handle", None)
        if handle is not None:
            self._handle = None
            self._handle_arg = None
            try:
                lib.tier_free(handle)
            except Exception:  # pragma: no cover - interpreter teardown
                pass

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else f"{self.num_rows} rows"
        return f"<kvtier.Tier {state} of {self.block_bytes} bytes>"

    # -- scheduler-facing calls ------------------------------------------

    def lookup(self, keys: Iterable[bytes]) -> list[LookupState]:
        """One LookupState per key, in input order. Never waits for a copy."""
        packed, key_len, n = _pack_keys(keys, "tier_lookup")
        out = ctypes.create_string_buffer(n) if n else None
        self._call("tier_lookup", lib.tier_lookup, packed, key_len, n, out)
        if not n:
            return []
        states = _STATES
        return [states[s] for s in out.raw]

    def lookup_one(self, key: bytes) -> LookupState:
        """The state of one key: the cheapest call, for per-key schedulers."""
        if type(key) is not bytes:
            key = bytes(key)
        n = len(key)
        out = _c_uint8()
        calls = self._calls
        calls.append(None)
        handle = self._handle_arg
        if handle is None:
            calls.pop()
            raise KVTierError(TIER_ERR_SHUTDOWN, "the tier is closed", "tier_lookup")
        try:
            st = _lookup_exact(
                handle, key, _SIZES[n] if n < len(_SIZES) else ctypes.c_size_t(n), _ONE, _byref(out)
            )
        finally:
            calls.pop()
        if st:
            raise _fail(st, "tier_lookup")
        return _STATES[out.value]

    def touch(self, keys: Iterable[bytes]) -> None:
        """Makes stored keys most recent, the first key most recent of all."""
        packed, key_len, n = _pack_keys(keys, "tier_touch")
        self._call("tier_touch", lib.tier_touch, packed, key_len, n)

    def _submit(self, fn: Any, name: str, job_id: int, keys: Any, block_ids: Any) -> None:
        if type(job_id) is not int:
            try:
                job_id = operator.index(job_id)
            except TypeError:
                raise KVTierError(
                    TIER_ERR_INVALID_ARG, f"job_id must be an int, got {job_id!r}", name
                ) from None
        if not 0 <= job_id < _U64_LIMIT:
            raise KVTierError(
                TIER_ERR_INVALID_ARG, f"job_id {job_id} is outside uint64", name
            )
        packed, key_len, n = _pack_keys(keys, name)
        ids, n_ids = _pack_block_ids(block_ids, name)
        if n_ids != n:
            raise KVTierError(
                TIER_ERR_INVALID_ARG, f"{n} keys but {n_ids} block ids", name
            )
        self._call(name, fn, job_id, packed, key_len, ids if n else None, n)

    def submit_store(
        self, job_id: int, keys: Sequence[bytes], block_ids: Sequence[int] | Any
    ) -> None:
        """Copies rows ``block_ids[i]`` into the tier under ``keys[i]``, on the
        tier's threads. Accepted jobs are reported once by :meth:`poll`; a
        rejected one raises and is never reported. Do not modify the rows
        until the job is polled."""
        self._submit(lib.tier_submit_store, "tier_submit_store", job_id, keys, block_ids)

    def submit_load(
        self, job_id: int, keys: Sequence[bytes], block_ids: Sequence[int] | Any
    ) -> None:
        """Copies the blocks of ``keys`` into rows ``block_ids``; a missing key
        fails the job (``num_done`` leading blocks were copied). Do not read
        the rows until the job is polled. A read is a use: the blocks copied
        become most recently used, the first key most of all."""
        self._submit(lib.tier_submit_load, "tier_submit_load", job_id, keys, block_ids)

    def poll(self, max: int = 1024) -> list[JobResult]:
        """Finished jobs, oldest first, at most ``max``; never blocks."""
        if max <= 0:
            raise KVTierError(TIER_ERR_INVALID_ARG, "max must be at least 1", "tier_poll_finished")
        # Result buffers are reused (list pop/append is atomic, so concurrent
        # pollers each take their own); allocating one per call costs more
        # than the call.
        bufs = self._poll_buffers
        try:
            buf, view = bufs.pop()
        except IndexError:
            buf = (ctypes.c_uint64 * (_POLL_CHUNK * _RESULT_WORDS))()  # 8-aligned
            view = memoryview(buf).cast("B")
        got = ctypes.c_size_t()
        results: list[JobResult] = []
        try:
            while True:
                want = min(_POLL_CHUNK, max - len(results))
                self._call(
                    "tier_poll_finished", lib.tier_poll_finished, buf, _RESULT_SIZE, want, _byref(got)
                )
                n = got.value
                if n:
                    results.extend(
                        map(_make_result, _RESULT_STRUCT.iter_unpack(view[: n * _RESULT_STRUCT.size]))
                    )
                if n < want or len(results) >= max:
                    return results
        finally:
            bufs.append((buf, view))

    def poll_events(self, max: int = 4096) -> list[Event]:
        """Block events, oldest first, at most ``max``; never blocks.

        Needs a tier built with ``events=True`` (else :class:`KVTierError`
        ``TIER_ERR_CONFIG``). A block's STORED comes once when it becomes
        readable (a store, or found in storage: reason RECOVERED at open,
        FOUND by a shared tier's lookup), its REMOVED once when it stops being
        readable, with the reason; a key's events keep their order. Concurrent
        pollers each get distinct events (order them by ``seq``).
        """
        if max <= 0:
            raise KVTierError(TIER_ERR_INVALID_ARG, "max must be at least 1", "tier_poll_events")
        # Reused like poll()'s buffers (list pop/append is atomic).
        bufs = self._event_buffers
        try:
            buf, view = bufs.pop()
        except IndexError:
            buf = (ctypes.c_uint64 * (_EVENT_CHUNK * _EVENT_WORDS))()  # 8-aligned
            view = memoryview(buf).cast("B")
        got = ctypes.c_size_t()
        events: list[Event] = []
        try:
            while True:
                want = min(_EVENT_CHUNK, max - len(events))
                self._call(
                    "tier_poll_events", lib.tier_poll_events, buf, _EVENT_SIZE, want, _byref(got)
                )
                n = got.value
                if n:
                    chunk = view[: n * _EVENT_STRUCT.size]
                    events.extend(_make_event(*e) for e in _EVENT_STRUCT.iter_unpack(chunk))
                if n < want or len(events) >= max:
                    return events
        finally:
            bufs.append((buf, view))

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once a result is ready to poll, False after ``timeout_s``
        seconds (``None``: no limit). Does not consume results."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if deadline is None:
                slice_s = _WAIT_SLICE_S
            else:
                slice_s = min(_WAIT_SLICE_S, deadline - time.monotonic())
                if slice_s <= 0:
                    slice_s = 0
            st = self._call("tier_wait", lib.tier_wait, int(slice_s * 1000), timeout_ok=True)
            if st == TIER_OK:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def drain(self) -> None:
        """Blocks until every accepted job has completed and its result is
        queued (results are not consumed)."""
        self._call("tier_drain", lib.tier_drain)

    def clear(self) -> None:
        """Drops every stored block; jobs in flight still complete and report.
        On shared storage it clears the namespace for every process and
        returns after two ``probe_ttl_ms`` (see docs/sharing.md)."""
        self._call("tier_clear", lib.tier_clear)

    def metrics(self) -> str:
        """The tier's metrics in the Prometheus text format (what a
        ``/metrics`` endpoint serves): the stats as ``kvtier_*`` counters and
        gauges, and histograms of job latency and per-block I/O time by job
        kind, every sample labelled ``backend=...``. See ``tier_metrics``."""
        need = self._call_text(lambda h: lib.tier_metrics(h, None, 0))
        while True:
            # Room to spare: counters may grow between the two calls.
            buf = ctypes.create_string_buffer(need + 1024)
            got = self._call_text(lambda h: lib.tier_metrics(h, buf, len(buf)))
            if got < len(buf):
                return buf.raw[:got].decode()
            need = got

    def _call_text(self, fn: Any) -> int:
        """Runs a text-out call (which returns 0 only on failure)."""
        calls = self._calls
        calls.append(None)
        try:
            handle = self._handle
            if handle is None:
                raise KVTierError(TIER_ERR_SHUTDOWN, "the tier is closed", "tier_metrics")
            n = fn(handle)
        finally:
            calls.pop()
        if n == 0:
            raise KVTierError(TIER_ERR_SHUTDOWN, _lib.last_error(), "tier_metrics")
        return n

    def completion_fd(self) -> int:
        """A file descriptor that is readable exactly while finished results
        wait for :meth:`poll` (an eventfd; see ``tier_completion_fd``): for
        ``selectors``, ``select.epoll`` or ``asyncio``'s
        ``loop.add_reader(fd, ...)``. Nothing to re-arm: poll when it is
        readable. The tier owns it and closes it in :meth:`close`; never
        read, write or close it yourself. The same descriptor on every call."""
        calls = self._calls
        calls.append(None)
        try:
            handle = self._handle
            if handle is None:
                raise KVTierError(TIER_ERR_SHUTDOWN, "the tier is closed", "tier_completion_fd")
            fd = lib.tier_completion_fd(handle)
        finally:
            calls.pop()
        if fd < 0:
            raise _fail(fd, "tier_completion_fd")
        return fd

    def stats(self) -> TierStats:
        out = _lib.tier_stats_t()
        self._call("tier_stats", lib.tier_stats, ctypes.byref(out), ctypes.sizeof(out))
        return TierStats(*(getattr(out, name) for name in _lib.STATS_FIELDS))
