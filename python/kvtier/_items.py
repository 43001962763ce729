"""The calls for engines whose objects are not rows (LMCache): extent stores
and loads, per-key deletes and pins, with a result per key. A mixin of
:class:`kvtier.Tier`, kept apart so each file reads on its own."""

from __future__ import annotations

import ctypes
import operator
from collections.abc import Iterable, Sequence
from typing import Any

from ._args import count_extents, pack_keys
from ._lib import TIER_ERR_DUPLICATE_JOB, TIER_ERR_INVALID_ARG, TIER_ERR_SHUTDOWN, lib
from .errors import KVTierError
from .records import ITEM_STRUCT, LOOKUP_STATES, FailReason, ItemResult, ItemStatus, JobResult, LookupState

_U64_LIMIT = 1 << 64
_ITEM_SIZE = ctypes.c_size_t(ITEM_STRUCT.size)
_ITEM_STATUSES = {s.value: s for s in ItemStatus}
_FAIL_REASONS = {r.value: r for r in FailReason}
_OK_ITEM = ItemResult(ItemStatus.OK, FailReason.NONE)
_OK_RAW = ITEM_STRUCT.pack(ItemStatus.OK, FailReason.NONE)


def _job_id(job_id: Any, name: str) -> int:
    if type(job_id) is not int:
        try:
            job_id = operator.index(job_id)
        except TypeError:
            raise KVTierError(TIER_ERR_INVALID_ARG, f"job_id must be an int, got {job_id!r}", name) from None
    if not 0 <= job_id < _U64_LIMIT:
        raise KVTierError(TIER_ERR_INVALID_ARG, f"job_id {job_id} is outside uint64", name)
    return int(job_id)


def _item(status: int, reason: int) -> ItemResult:
    return ItemResult(_ITEM_STATUSES.get(status, ItemStatus.FAILED), _FAIL_REASONS.get(reason, FailReason.IO_ERROR))


class ItemJobs:
    """Extent stores and loads, deletes and pins (see the C calls of the same
    names, added in KVTIER_1.1). Each extent or delete job's result, from
    :meth:`Tier.poll`, carries ``items``: one :class:`ItemResult` per key."""

    # Provided by Tier.
    _call: Any
    _handle: int | None
    nbytes: int
    #: Per-item result arrays of the jobs in flight, by job id: the library
    #: writes them before the job is reported; poll reads and drops them.
    _item_arrays: dict[int, tuple[Any, int]]

    def _submit_items(self, name: str, job_id: Any, keys: Any, run: Any) -> None:
        """Registers the job's result array, then runs the submit; a rejected
        submit takes the array back."""
        job_id = _job_id(job_id, name)
        packed, key_len, n = pack_keys(keys, name)
        results = (ctypes.c_uint32 * (2 * n))() if n else None
        entry = (results, n)
        # Before the call: another thread may poll the result before it returns.
        if self._item_arrays.setdefault(job_id, entry) is not entry:
            raise KVTierError(TIER_ERR_DUPLICATE_JOB, f"job {job_id} is in flight", name)
        try:
            run(job_id, packed, key_len, n, results)
        except BaseException:
            self._item_arrays.pop(job_id, None)
            raise

    def _submit_extents(self, fn: Any, name: str, job_id: Any, keys: Any, offsets: Any, lengths: Any) -> None:
        def run(job_id: int, packed: Any, key_len: int, n: int, results: Any) -> None:
            offs, n_offs = count_extents(offsets, "offsets", name)
            lens, n_lens = count_extents(lengths, "lengths", name)
            if n_offs != n or n_lens != n:
                raise KVTierError(
                    TIER_ERR_INVALID_ARG, f"{n} keys but {n_offs} offsets and {n_lens} lengths", name
                )
            offs, lens = (offs, lens) if n else (None, None)
            self._call(name, fn, job_id, packed, key_len, offs, lens, n, results, _ITEM_SIZE)

        self._submit_items(name, job_id, keys, run)

    def submit_store_extents(
        self, job_id: int, keys: Sequence[bytes], offsets: Sequence[int], lengths: Sequence[int]
    ) -> None:
        """Stores ``keys[i]`` from the ``lengths[i]`` bytes at byte
        ``offsets[i]`` of the tier's buffer (1 to ``block_bytes`` long,
        anywhere in the buffer); the length is stored with the block. Reported
        once by :meth:`poll`, with ``items``. Do not modify those bytes until
        the job is polled."""
        self._submit_extents(
            lib.tier_submit_store_extents, "tier_submit_store_extents", job_id, keys, offsets, lengths
        )

    def submit_load_extents(
        self, job_id: int, keys: Sequence[bytes], offsets: Sequence[int], lengths: Sequence[int]
    ) -> None:
        """Loads ``keys[i]`` into the ``lengths[i]`` bytes at ``offsets[i]``
        (the length it was stored with, else that key fails with
        ``LENGTH_MISMATCH``). Goes on past a key that misses or fails:
        ``items`` says which loaded. Extents must not overlap. Do not read
        them until the job is polled."""
        self._submit_extents(
            lib.tier_submit_load_extents, "tier_submit_load_extents", job_id, keys, offsets, lengths
        )

    def submit_delete(self, job_id: int, keys: Sequence[bytes]) -> None:
        """Deletes ``keys`` from the tier and its storage; reported by
        :meth:`poll` with ``items``: OK (removed), MISS (absent) or BUSY
        (pinned, being loaded or stored: kept)."""
        name = "tier_submit_delete"

        def run(job_id: int, packed: Any, key_len: int, n: int, results: Any) -> None:
            self._call(name, lib.tier_submit_delete, job_id, packed, key_len, n, results, _ITEM_SIZE)

        self._submit_items(name, job_id, keys, run)

    def pin(self, keys: Iterable[bytes]) -> list[LookupState]:
        """Looks up ``keys`` and pins every HIT: not evicted nor deleted until
        as many :meth:`unpin` calls. Pins belong to this tier, in this
        process."""
        packed, key_len, n = pack_keys(keys, "tier_pin")
        out = ctypes.create_string_buffer(n) if n else None
        self._call("tier_pin", lib.tier_pin, packed, key_len, n, out)
        if out is None:
            return []
        return [LOOKUP_STATES[s] for s in out.raw]

    def unpin(self, keys: Iterable[bytes]) -> None:
        """Drops one pin of each key; keys never pinned or gone are ignored,
        and on a closed tier it does nothing."""
        packed, key_len, n = pack_keys(keys, "tier_unpin")
        if self._handle is None:
            return
        try:
            self._call("tier_unpin", lib.tier_unpin, packed, key_len, n)
        except KVTierError as exc:
            if exc.status != TIER_ERR_SHUTDOWN:
                raise

    def _with_items(self, result: JobResult) -> JobResult:
        """``result`` with its per-key results, if its job has them."""
        entry = self._item_arrays.pop(result.job_id, None)
        if entry is None:
            return result
        results, n = entry
        if not n:
            return result._replace(items=[])
        raw = memoryview(results).cast("B")
        # Most jobs succeed whole: one comparison of their bytes instead of an
        # object per key (ItemResult is immutable, so one serves them all).
        if raw == _OK_RAW * n:
            return result._replace(items=[_OK_ITEM] * n)
        items = [_item(s, r) for s, r in ITEM_STRUCT.iter_unpack(raw)]
        return result._replace(items=items)

