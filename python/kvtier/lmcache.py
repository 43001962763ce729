"""kvtier as LMCache's L2 storage (LMCache 0.5.6, multiprocess mode).

LMCache loads it through its ``plugin`` adapter type, without a patch::

    --l2-adapter '{"type": "plugin", "module_path": "kvtier.lmcache",
                   "class_name": "KVTierL2Adapter",
                   "adapter_params": {"block_bytes": "32MiB", "backend": "disk",
                                      "path": "/nvme/kvtier", "capacity_bytes": "200GiB"}}'

``adapter_params`` holds this adapter's own ``block_bytes`` (the largest
object LMCache will store, required) and any kvtier config key, passed to the
library as in the vLLM and SGLang adapters; an unknown key fails at
construction. ``docs/lmcache.md`` lists them.

Zero copy: the tier is built at construction over LMCache's L1 arena, which
LMCache's factory hands every L2 adapter as ``l1_memory_desc`` (base address
and size; the arena is allocated whole before any adapter, so its address
never changes). Objects are (offset, length) extents in it: a store copies
straight out of the L1 object, a load straight into it. That holds wherever
the library stores extents (memory, ``persist_path``, disk, Redis); a sealed
tier (``seal_key``) stores none (``stores_extents`` asks the library), so
there objects must be whole rows of ``block_bytes`` and run through the row
calls.

LMCache's ``ObjectKey`` (model, kv rank, object group, cache salt, chunk
hash) becomes a 32-byte kvtier key digest of all of them, so the objects of
every model and rank one LMCache server serves live apart in one tier; the
tier's ``namespace`` names that key format (plus the user's ``namespace``),
as docs/sharing.md asks of shared storage.

Completions: the library itself adds 1 to LMCache's store and load eventfds
as each store or load job finishes (``Tier.add_notify_fd``), and LMCache's
own threads collect the results when they ask (``pop_completed_store_tasks``,
``query_load_result``), so no thread of ours stands between a finished job
and its waiter. A lookup-and-lock is answered on the caller's thread (the
tier's ``pin`` only takes the index lock) and signals the third. One thread
of ours collects deletes, and the tier's events when nobody asks for a while.
Submits never wait for I/O and may come from any thread.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import select
import threading
from dataclasses import dataclass, field
from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.api import KeyEntry, KeyListPage
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface
from lmcache.v1.platform import consume_fd, create_event_notifier

from . import ItemStatus
from ._adapter import FailureLog, check_config
from ._lmcache_books import KEY_BYTES, Books, Change, tier_keys
from ._lmcache_params import namespace, split_params
from .errors import KVTierError
from .records import EventKind, Feature, JobKind, LookupState
from .tier import Tier

__all__ = ["KVTierL2Adapter", "namespace"]

logger = logging.getLogger(__name__)

_OWNER = "kvtier.lmcache"
# How long delete() waits for its job: LMCache's eviction calls it from its
# own thread and expects the usage to have dropped when it returns (its fs
# adapter waits as long).
_DELETE_WAIT_S = 30.0
# The adapter's thread also collects this often without a finished delete:
# the tier's events (evictions; on a shared tier, blocks other writers
# removed) reach the books even when LMCache asks for nothing.
_IDLE_POLL_MS = 1000

_STORE, _LOAD, _DELETE = "store", "load", "delete"
def stores_extents(tier: Tier) -> bool:
    """Whether the library stores extents on ``tier`` (``tier_features``): not
    on a sealed disk or Redis tier, whose records are fixed to the block size.
    Without extents, objects are whole rows: ``block_bytes`` long, at a
    multiple of ``block_bytes`` from the arena's start."""
    return Feature.EXTENTS in tier.features()


@dataclass
class _Job:
    kind: str
    keys: list[Any]
    tkeys: list[bytes]
    sizes: list[int]
    # A load's items are the keys whose extents were valid: item i is key index[i].
    index: list[int] = field(default_factory=list)
    num_keys: int = 0
    done: threading.Event | None = None


class KVTierL2Adapter(L2AdapterInterface):
    """LMCache's ``L2AdapterInterface`` over one kvtier ``Tier`` on LMCache's
    L1 arena. Built by LMCache's ``plugin`` factory from ``adapter_params``
    and ``l1_memory_desc``."""

    def __init__(self, config: Any, l1_memory_desc: Any = None) -> None:
        super().__init__(max_capacity_bytes=0)
        block_bytes, tier_config = split_params(config)
        if l1_memory_desc is None:
            raise ValueError(
                f"{_OWNER}: LMCache gave no l1_memory_desc; the adapter works on "
                "LMCache's L1 arena and needs its address and size"
            )
        self._base = int(l1_memory_desc.ptr)
        arena_bytes = int(l1_memory_desc.size)
        # The tier takes a whole number of blocks: the arena's tail past the
        # last one is left out, and an object there fails (logged).
        self._size = arena_bytes - arena_bytes % block_bytes
        if self._base <= 0 or self._size <= 0:
            raise ValueError(
                f"{_OWNER}: the L1 arena ({arena_bytes} bytes at {self._base:#x}) is smaller "
                f"than block_bytes={block_bytes}"
            )
        if self._size < arena_bytes:
            logger.warning(
                "%s: the L1 arena's last %d bytes are not a whole block of %d: objects there "
                "are not stored (a block_bytes dividing %d avoids it)",
                _OWNER, arena_bytes - self._size, block_bytes, arena_bytes,
            )
        self.block_bytes = block_bytes
        check_config({k: v for k, v in tier_config.items()})
        arena = (ctypes.c_ubyte * self._size).from_address(self._base)
        self._tier = Tier(arena, block_bytes=block_bytes, **tier_config)
        self.extents = stores_extents(self._tier)
        self.namespace: str = tier_config["namespace"]
        self._books = Books()
        self._log = FailureLog(logger, "kvtier", None)
        self._mutex = threading.Condition()
        self._ids = itertools.count(1)
        self._jobs: dict[int, _Job] = {}
        self._stores_done: dict[int, L2StoreResult] = {}
        self._lookups_done: dict[int, Any] = {}
        self._loads_done: dict[int, Any] = {}
        self._closed = False
        self._active = 0  # submits between their closed check and their signal
        # One collector at a time: results polled are filed before another
        # caller looks for its own.
        self._collecting = threading.Lock()
        # Readable exactly while finished results wait: a query finding it
        # quiet has nothing to collect.
        self._results_fd = self._tier.completion_fd()
        self._store_fd = create_event_notifier()
        self._lookup_fd = create_event_notifier()
        self._load_fd = create_event_notifier()
        self._wake = create_event_notifier()
        try:
            self._tier.add_notify_fd(JobKind.STORE, self._store_fd.fileno())
            self._tier.add_notify_fd(JobKind.LOAD, self._load_fd.fileno())
            self._tier.add_notify_fd(JobKind.DELETE, self._wake.fileno())
        except Exception:
            self._tier.close()
            for notifier in (self._store_fd, self._lookup_fd, self._load_fd, self._wake):
                notifier.close()
            raise
        self._thread = threading.Thread(target=self._serve, name="kvtier-lmcache", daemon=True)
        self._thread.start()
        logger.info(
            "kvtier L2 adapter: %s backend on %s, block_bytes %d, arena %d bytes at %#x, namespace %r",
            tier_config.get("backend", "memory"), "extents" if self.extents else "whole rows",
            block_bytes, self._size, self._base, self.namespace,
        )

    # -- event fds -------------------------------------------------------------

    def get_store_event_fd(self) -> int:
        return int(self._store_fd.fileno())

    def get_lookup_and_lock_event_fd(self) -> int:
        return int(self._lookup_fd.fileno())

    def get_load_event_fd(self) -> int:
        return int(self._load_fd.fileno())

    # -- submits -----------------------------------------------------------------

    def _enter(self, what: str) -> int:
        with self._mutex:
            if self._closed:
                raise RuntimeError(f"{_OWNER}: {what} after close()")
            self._active += 1
            return next(self._ids)

    def _leave(self) -> None:
        with self._mutex:
            self._active -= 1
            self._mutex.notify_all()

    def _extents(self, objects: list[Any]) -> tuple[list[int], list[int], list[int]]:
        """(positions, offsets, lengths) in the arena of the L1 objects the
        tier can take: those inside it and no larger than a block (and, on
        rows, exactly a row). One pass, as it runs for every object of every
        task."""
        base, limit, block, rows = self._base, self._size, self.block_bytes, not self.extents
        positions: list[int] = []
        offsets: list[int] = []
        lengths: list[int] = []
        for i, obj in enumerate(objects):
            try:
                offset = int(obj.data_ptr) - base
                length = int(obj.get_size())
            except Exception as exc:
                self._log.failed("reading an L1 object's address", exc)
                continue
            if offset < 0 or length <= 0 or length > block or offset + length > limit:
                continue
            if rows and (length != block or offset % block):
                continue
            positions.append(i)
            offsets.append(offset)
            lengths.append(length)
        return positions, offsets, lengths

    def submit_store_task(self, keys: list[Any], objects: list[Any]) -> int:
        task = self._enter("submit_store_task")
        try:
            taken, offsets, sizes = self._extents(objects)
            if len(keys) != len(objects) or len(taken) < len(objects):
                logger.warning(
                    "%s: store task %d refused: %d keys, %d objects, %d outside the L1 arena "
                    "or over block_bytes=%d", _OWNER, task, len(keys), len(objects),
                    len(objects) - len(taken), self.block_bytes,
                )
                self._finish_store(task, L2StoreResult(False, 0))
                return task
            if not keys:
                self._finish_store(task, L2StoreResult(True, 0))
                return task
            tkeys = tier_keys(keys)
            self._books.store_submitted(tkeys, keys, sizes)
            with self._mutex:
                self._jobs[task] = _Job(_STORE, list(keys), tkeys, sizes, num_keys=len(keys))
            try:
                if self.extents:
                    self._tier.submit_store_extents(task, tkeys, offsets, sizes)
                else:
                    self._tier.submit_store(task, tkeys, [o // self.block_bytes for o in offsets])
            except KVTierError as exc:
                self._log.failed("submit_store_extents", exc)
                with self._mutex:
                    self._jobs.pop(task, None)
                self._books.store_finished(tkeys, [False] * len(tkeys), Change([], []))
                self._finish_store(task, L2StoreResult(False, 0))
            return task
        finally:
            self._leave()

    def _finish_store(self, task: int, result: L2StoreResult) -> None:
        with self._mutex:
            self._stores_done[task] = result
        self._store_fd.notify()

    def pop_completed_store_tasks(self) -> dict[int, L2StoreResult]:
        self._collect_now(only_if_results=True)
        with self._mutex:
            done, self._stores_done = self._stores_done, {}
        return done

    def submit_lookup_and_lock_task(self, keys: list[Any], group_layout_descs: Any = None) -> int:
        task = self._enter("submit_lookup_and_lock_task")
        try:
            bitmap = Bitmap(len(keys))
            if keys:
                try:
                    found = self._books.lock(tier_keys(keys), self._pin)
                except KVTierError as exc:
                    self._log.failed("pin", exc)
                    found = []
                for i, hit in enumerate(found):
                    if hit:
                        bitmap.set(i)
            with self._mutex:
                self._lookups_done[task] = bitmap
            self._lookup_fd.notify()
            return task
        finally:
            self._leave()

    def _pin(self, tkeys: list[bytes]) -> list[bool]:
        return [state == LookupState.HIT for state in self._tier.pin(tkeys)]

    def query_lookup_and_lock_result(self, task_id: int) -> Any:
        with self._mutex:
            return self._lookups_done.pop(task_id, None)

    def submit_unlock(self, keys: list[Any]) -> None:
        """Never raises: LMCache never retries an unlock. Keys never locked,
        and any call after close, are ignored."""
        try:
            if keys and not self._closed:
                self._books.unlock(tier_keys(keys), self._tier.unpin)
        except Exception as exc:
            self._log.failed("submit_unlock", exc)

    def submit_load_task(self, keys: list[Any], objects: list[Any]) -> int:
        task = self._enter("submit_load_task")
        try:
            index, offsets, sizes = self._extents(objects[: len(keys)])
            if len(index) < len(keys):
                logger.warning(
                    "%s: load task %d: %d of %d objects outside the L1 arena or over "
                    "block_bytes=%d are not loaded", _OWNER, task, len(keys) - len(index),
                    len(keys), self.block_bytes,
                )
            if not index:
                self._finish_load(task, Bitmap(len(keys)))
                return task
            tkeys = tier_keys([keys[i] for i in index] if len(index) < len(keys) else keys)
            if not self.extents:
                # A row load stops at its first miss: load only what is there.
                try:
                    states = self._tier.lookup(tkeys)
                except KVTierError as exc:
                    self._log.failed("lookup", exc)
                    states = []
                hits = [j for j, state in enumerate(states) if state == LookupState.HIT]
                index = [index[j] for j in hits]
                offsets = [offsets[j] for j in hits]
                sizes = [sizes[j] for j in hits]
                tkeys = [tkeys[j] for j in hits]
                if not index:
                    self._finish_load(task, Bitmap(len(keys)))
                    return task
            with self._mutex:
                self._jobs[task] = _Job(
                    _LOAD, [keys[i] for i in index], tkeys, sizes, index=index, num_keys=len(keys)
                )
            try:
                if self.extents:
                    self._tier.submit_load_extents(task, tkeys, offsets, sizes)
                else:
                    self._tier.submit_load(task, tkeys, [o // self.block_bytes for o in offsets])
            except KVTierError as exc:
                self._log.failed("submit_load_extents", exc)
                with self._mutex:
                    self._jobs.pop(task, None)
                self._finish_load(task, Bitmap(len(keys)))
            return task
        finally:
            self._leave()

    def _finish_load(self, task: int, bitmap: Any) -> None:
        with self._mutex:
            self._loads_done[task] = bitmap
        self._load_fd.notify()

    def query_load_result(self, task_id: int) -> Any:
        with self._mutex:
            bitmap = self._loads_done.pop(task_id, None)
        if bitmap is None:
            self._collect_now(only_if_results=True)
            with self._mutex:
                bitmap = self._loads_done.pop(task_id, None)
        return bitmap

    # -- delete, usage, listing ------------------------------------------------

    def delete(self, keys: list[Any]) -> None:
        """Deletes the keys' objects and returns once the tier has (at most
        30 s). A locked key (being loaded) is kept, as is one being stored.
        Listeners and the byte counts hear of every object removed. After
        close, nothing."""
        if not keys:
            return
        try:
            task = self._enter("delete")
        except RuntimeError:
            return
        done = threading.Event()
        try:
            tkeys = tier_keys(keys)
            with self._mutex:
                self._jobs[task] = _Job(_DELETE, list(keys), tkeys, [], num_keys=len(keys), done=done)
            try:
                self._tier.submit_delete(task, tkeys)
            except KVTierError as exc:
                self._log.failed("submit_delete", exc)
                with self._mutex:
                    self._jobs.pop(task, None)
                return
        finally:
            self._leave()
        if not done.wait(_DELETE_WAIT_S):
            logger.warning("%s: delete of %d keys still running after %.0f s", _OWNER, len(keys), _DELETE_WAIT_S)

    def list_l2_keys(
        self, model_name: str | None = None, page_size: int = 500, cursor: str | None = None
    ) -> KeyListPage:
        """The objects this adapter counts (stored, or found by a load, since
        it opened), by key, ``page_size`` at a time."""
        if page_size <= 0:
            raise ValueError(f"page_size must be positive (got {page_size})")
        after = None
        if cursor is not None:
            try:
                after = bytes.fromhex(cursor)
            except ValueError:
                after = None
            if after is None or len(after) != KEY_BYTES:
                raise ValueError(f"{_OWNER}: malformed cursor {cursor!r}")
        items, last = self._books.page(model_name, page_size, after)
        entries = tuple(KeyEntry(key=k.to_encoded_object_key(), size_bytes=size) for k, size in items)
        return KeyListPage(entries=entries, next_page_token=None if last is None else last.hex())

    # -- completions ---------------------------------------------------------------

    def _serve(self) -> None:
        """Collects when a delete finishes (the library counts it on
        ``_wake``), at close, and every ``_IDLE_POLL_MS``."""
        poller = select.poll()
        poller.register(self._wake.fileno(), select.POLLIN)
        while True:
            if poller.poll(_IDLE_POLL_MS):
                consume_fd(self._wake.fileno())
            if self._is_closed():
                return
            self._collect_now()

    def _collect_now(self, only_if_results: bool = False) -> None:
        """Files every finished job and event the tier holds; on any thread,
        one at a time. With ``only_if_results``, nothing unless results wait
        (a select on the completion fd, far cheaper than polling the tier).
        After close, nothing."""
        # The check under the lock: a collect in progress elsewhere may hold
        # the caller's result, polled and not yet filed.
        with self._collecting:
            if self._closed:  # the tier and its completion fd are gone
                return
            if only_if_results and not select.select([self._results_fd], [], [], 0)[0]:
                return
            try:
                self._collect()
            except Exception as exc:  # a caller's query must outlive one bad batch
                if not self._closed:
                    self._log.failed("collecting completions", exc)

    def _collect(self) -> None:
        change = Change([], [])
        lost = False
        for event in self._tier.poll_events():
            if event.kind == EventKind.STORED:
                self._books.stored(event.key, change)
            elif event.kind == EventKind.REMOVED:
                self._books.removed(event.key, change)
            else:
                lost = True
        if lost:
            self._reconcile(change)
        finished: list[tuple[_Job, int, Any]] = []
        for result in self._tier.poll():
            with self._mutex:
                job = self._jobs.pop(result.job_id, None)
            if job is not None:
                finished.append((job, result.job_id, result))
        stores: dict[int, L2StoreResult] = {}
        loads: dict[int, Any] = {}
        accessed: list[Any] = []
        deletes: list[threading.Event] = []
        for job, task, result in finished:
            n = len(job.tkeys)
            if result.items is not None:
                items = result.items
                # Jobs that succeed whole share one OK item (Tier.poll): a C-speed count.
                if items and items.count(items[0]) == len(items) and items[0].status == ItemStatus.OK:
                    ok = [True] * len(items)
                else:
                    ok = [item.status == ItemStatus.OK for item in items]
            else:  # a row job: its leading num_done keys were done
                ok = [i < result.num_done for i in range(n)]
            ok += [False] * (n - len(ok))
            whole = all(ok)
            if job.kind == _STORE:
                self._books.store_finished(job.tkeys, ok, change)
                moved = sum(job.sizes) if whole else sum(size for size, good in zip(job.sizes, ok) if good)
                stores[task] = L2StoreResult(bool(result.ok) and whole, moved)
            elif job.kind == _LOAD:
                keys, tkeys, sizes = job.keys, job.tkeys, job.sizes
                if whole and n == job.num_keys:  # every key, so index is 0..n
                    bitmap = Bitmap(n, n)
                else:
                    bitmap = Bitmap(job.num_keys)
                    bitmap.batched_set(list(itertools.compress(job.index, ok)))
                    keys, tkeys, sizes = (list(itertools.compress(v, ok)) for v in (keys, tkeys, sizes))
                accessed += keys
                self._books.learned(tkeys, keys, sizes, change)
                loads[task] = bitmap
            else:
                for tkey, good in zip(job.tkeys, ok):
                    if good:
                        self._books.removed(tkey, change)
                if job.done is not None:
                    deletes.append(job.done)
        self._notify(change)
        if accessed:
            self._notify_keys_accessed(accessed)
        # Their waiters were woken by the library when each job finished.
        if stores:
            with self._mutex:
                self._stores_done.update(stores)
        if loads:
            with self._mutex:
                self._loads_done.update(loads)
        for done in deletes:
            done.set()

    def _reconcile(self, change: Change) -> None:
        """Events were dropped: every object the books hold that the tier no
        longer has is counted out."""
        logger.warning("%s: the tier dropped events; rechecking the objects it holds", _OWNER)
        tkeys = self._books.resident_keys()
        for start in range(0, len(tkeys), 4096):
            chunk = tkeys[start : start + 4096]
            for tkey, state in zip(chunk, self._tier.lookup(chunk)):
                if state == LookupState.MISS:
                    self._books.removed(tkey, change)

    def _notify(self, change: Change) -> None:
        if change.stored:
            self._notify_keys_stored([k for k, _ in change.stored], [s for _, s in change.stored])
        if change.deleted:
            self._notify_keys_deleted([k for k, _ in change.deleted], [s for _, s in change.deleted])

    def _is_closed(self) -> bool:
        return self._closed

    # -- status and close ----------------------------------------------------------

    def report_status(self) -> dict:
        usage = self.get_usage()
        status: dict[str, Any] = {
            "is_healthy": not self._closed and self._thread.is_alive(),
            "type": type(self).__name__,
            "namespace": self.namespace,
            "current_size_bytes": usage.total_bytes_used,
            "locked_key_count": self._books.locked(),
        }
        if not self._closed:
            try:
                status["tier"] = self._tier.stats().as_dict()
            except KVTierError as exc:
                status["is_healthy"] = False
                status["error"] = str(exc)
        return status

    def close(self) -> None:
        """Stops the completion thread, frees the tier (which never touches
        the L1 arena again once this returns), drops every lock and closes
        the event fds. Jobs in flight are abandoned. Idempotent."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            while self._active:
                self._mutex.wait()
            waiting = [job.done for job in self._jobs.values() if job.done is not None]
            self._jobs.clear()
        self._wake.notify()
        self._thread.join()
        with self._collecting:  # a query's collect in progress ends first
            self._books.release_all()
            self._tier.close()
        for done in waiting:
            done.set()
        for notifier in (self._store_fd, self._lookup_fd, self._load_fd, self._wake):
            notifier.close()
