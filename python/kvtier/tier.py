"""The `Tier` class: a Pythonic handle over one `tier_t`."""

from __future__ import annotations

import ctypes
import operator
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

from . import _lib
from ._args import config_text, count_packed, pack_block_ids, pack_keys
from ._items import ItemJobs
from ._lib import (
    TIER_ERR_INVALID_ARG,
    TIER_ERR_SHUTDOWN,
    TIER_OK,
    TIER_TIMEOUT,
    lib,
)
from .errors import KVTierError, fail
from .records import (
    EVENT_STRUCT,
    LOOKUP_STATES,
    RESULT_STRUCT,
    Event,
    EventKind,
    FailReason,
    Feature,
    ItemResult,
    ItemStatus,
    JobKind,
    JobResult,
    LookupState,
    RemovedReason,
    StoredReason,
    TierStats,
    make_event,
    make_result,
    stats_from,
)

# The records were defined here before records.py: their old names stay.
__all__ = [
    "Event",
    "EventKind",
    "FailReason",
    "ItemResult",
    "ItemStatus",
    "JobKind",
    "JobResult",
    "KVTierError",
    "LookupState",
    "RemovedReason",
    "StoredReason",
    "Tier",
    "TierStats",
]

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

_RESULT_SIZE = ctypes.c_size_t(RESULT_STRUCT.size)
_RESULT_WORDS = RESULT_STRUCT.size // 8
_POLL_CHUNK = 256
_EVENT_SIZE = ctypes.c_size_t(EVENT_STRUCT.size)
_EVENT_WORDS = EVENT_STRUCT.size // 8
_EVENT_CHUNK = 256
# The longest single tier_wait; keeps close() from waiting long behind a wait().
_WAIT_SLICE_S = 0.05


class Tier(ItemJobs):
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
        self._item_arrays: dict[int, tuple[Any, int]] = {}
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
            strides = view.strides
            block_bytes = strides[0] if strides else view.nbytes
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
                    cfg, key.encode(), config_text(key, value).encode()
                )
                if st != TIER_OK:
                    raise fail(st, "tier_config_set")
            out = ctypes.c_void_p()
            if not isinstance(block_bytes, int) or block_bytes < 0:
                raise KVTierError(
                    TIER_ERR_INVALID_ARG,
                    f"block_bytes must be a positive int, got {block_bytes!r}",
                    "Tier",
                )
            st = lib.tier_new(cfg, address, nbytes, block_bytes, ctypes.byref(out))
            if st != TIER_OK:
                raise fail(st, "tier_new")
        finally:
            lib.tier_config_free(cfg)
        handle = out.value
        assert handle, "tier_new succeeded without a handle"
        return handle

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
            raise fail(st, name)
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
        self._item_arrays.clear()  # abandoned jobs: never reported
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
        packed, key_len, n = pack_keys(keys, "tier_lookup")
        out = ctypes.create_string_buffer(n) if n else None
        self._call("tier_lookup", lib.tier_lookup, packed, key_len, n, out)
        if out is None:
            return []
        states = LOOKUP_STATES
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
            raise fail(st, "tier_lookup")
        return LOOKUP_STATES[out.value]

    def touch(self, keys: Iterable[bytes]) -> None:
        """Makes stored keys most recent, the first key most recent of all."""
        packed, key_len, n = pack_keys(keys, "tier_touch")
        self._call("tier_touch", lib.tier_touch, packed, key_len, n)

    def _submit(
        self, fn: Any, name: str, job_id: int, keys: Any, block_ids: Any, key_len: int | None = None
    ) -> None:
        """Submits a job of ``keys``: a sequence of keys, or with ``key_len``
        keys already packed back to back."""
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
        if key_len is None:
            packed, key_len, n = pack_keys(keys, name)
        else:
            packed, n = count_packed(keys, key_len, name)
        ids, n_ids = pack_block_ids(block_ids, name)
        if n_ids != n:
            raise KVTierError(
                TIER_ERR_INVALID_ARG, f"{n} keys but {n_ids} block ids", name
            )
        self._call(name, fn, job_id, packed if n else None, key_len, ids if n else None, n)

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

    # -- packed keys: for engines that hold a batch's keys in one buffer -----

    def lookup_packed(self, packed: bytes, key_len: int) -> bytes:
        """The states of keys packed back to back (``len(packed) // key_len``
        keys of ``key_len`` bytes, as the C API takes them), in input order,
        one byte per key: a :class:`LookupState` value (``TIER_MISS``,
        ``TIER_HIT``, ``TIER_PENDING``). Never waits for a copy."""
        packed, n = count_packed(packed, key_len, "tier_lookup")
        out = ctypes.create_string_buffer(n)
        self._call("tier_lookup", lib.tier_lookup, packed if n else None, key_len, n, out)
        return out.raw

    def submit_store_packed(self, job_id: int, packed: bytes, key_len: int, block_ids: Any) -> None:
        """:meth:`submit_store` of keys packed back to back, ``key_len`` bytes each."""
        self._submit(lib.tier_submit_store, "tier_submit_store", job_id, packed, block_ids, key_len)

    def submit_load_packed(self, job_id: int, packed: bytes, key_len: int, block_ids: Any) -> None:
        """:meth:`submit_load` of keys packed back to back, ``key_len`` bytes each."""
        self._submit(lib.tier_submit_load, "tier_submit_load", job_id, packed, block_ids, key_len)

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
                        map(make_result, RESULT_STRUCT.iter_unpack(view[: n * RESULT_STRUCT.size]))
                    )
                if n < want or len(results) >= max:
                    if self._item_arrays:
                        results = [self._with_items(r) for r in results]
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
                    chunk = view[: n * EVENT_STRUCT.size]
                    events.extend(make_event(*e) for e in EVENT_STRUCT.iter_unpack(chunk))
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
        need = self._metrics_text(None, 0)
        while True:
            # Room to spare: counters may grow between the two calls.
            buf = ctypes.create_string_buffer(need + 1024)
            got = self._metrics_text(buf, len(buf))
            if got < len(buf):
                return buf.raw[:got].decode()
            need = got

    def _metrics_text(self, buf: Any, cap: int) -> int:
        """Runs tier_metrics (which returns 0 only on failure)."""
        calls = self._calls
        calls.append(None)
        try:
            handle = self._handle
            if handle is None:
                raise KVTierError(TIER_ERR_SHUTDOWN, "the tier is closed", "tier_metrics")
            n = lib.tier_metrics(handle, buf, cap)
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
            raise fail(fd, "tier_completion_fd")
        return fd

    def add_notify_fd(self, kind: JobKind, fd: int) -> None:
        """Has the library add 1 to the eventfd ``fd`` each time a job of
        ``kind`` completes, after its result is queued for :meth:`poll`, until
        :meth:`close` (``tier_add_notify_fd``): a waiter per kind is woken by
        the library's own thread. The tier writes a duplicate, so ``fd``
        stays the caller's to read, wait on and close. Raises
        ``KVTierError`` (``TIER_ERR_INVALID_ARG``) for a descriptor that is
        not an eventfd, or past 16 of them."""
        self._call("tier_add_notify_fd", lib.tier_add_notify_fd, int(kind), int(fd))

    def features(self) -> Feature:
        """What this tier can do or is, as the library answers from its
        backend (``tier_features``): e.g. ``Feature.EXTENTS in
        tier.features()`` before an extent job."""
        out = ctypes.c_uint64()
        self._call("tier_features", lib.tier_features, ctypes.byref(out))
        return Feature(out.value)

    def stats(self) -> TierStats:
        out = _lib.tier_stats_t()
        self._call("tier_stats", lib.tier_stats, ctypes.byref(out), ctypes.sizeof(out))
        return stats_from(out)
