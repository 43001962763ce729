"""What the LMCache adapter (lmcache.py) knows of the tier's contents: which
LMCache object each kvtier key stands for, its size, and who holds a lock on
it. Pure bookkeeping under one lock; it never calls the tier, so that
lmcache.py decides when the tier is asked and the adapter's byte accounting
can be tested without one.

LMCache counts bytes per ``cache_salt`` from what an adapter reports through
``_notify_keys_stored`` and ``_notify_keys_deleted``. kvtier reports stores,
evictions and deletions as block events without sizes, so the books keep the
size a store was submitted with until the block's STORED event (or, for a
block the store found already there, its completion) turns it into a resident
object, and drop the object when its REMOVED event (or its delete) comes.
Every method returns what changed, for the caller to notify LMCache outside
the lock.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from dataclasses import dataclass
from typing import Any

# A kvtier key is this many bytes of BLAKE2b over every ObjectKey field: the
# tier packs keys of one length, and an ObjectKey's model name and salt are of
# any length up to what no 128-byte key could hold verbatim.
KEY_BYTES = 32
# Bumped if the fields hashed into a key change (the namespace names it).
KEY_FORMAT = 1


# The hash state after a key's fields up to its chunk hash, by those fields:
# the objects of one task share them, and resuming a copy of that state costs
# less than hashing them again for every object. Emptied when it grows past
# _PREFIX_LIMIT (many salts), so it stays small.
_prefixes: dict[tuple[str, int, int, str], Any] = {}
_PREFIX_LIMIT = 4096
_CHUNK_LEN = struct.Struct("<I").pack


def _prefix(model_name: str, kv_rank: int, group: int, cache_salt: str) -> Any:
    model = model_name.encode()
    salt = cache_salt.encode()
    state = hashlib.blake2b(digest_size=KEY_BYTES)
    state.update(struct.pack("<BI", KEY_FORMAT, len(model)))
    state.update(model)
    state.update(struct.pack("<qqI", kv_rank, group, len(salt)))
    state.update(salt)
    if len(_prefixes) >= _PREFIX_LIMIT:
        _prefixes.clear()
    _prefixes[(model_name, kv_rank, group, cache_salt)] = state
    return state


def tier_keys(keys: list[Any]) -> list[bytes]:
    """The kvtier keys of LMCache ``ObjectKey``s: each a digest of its model
    name, kv rank, object group, cache salt and chunk hash, each
    length-prefixed so that no two field tuples hash the same bytes."""
    out = []
    for key in keys:
        fields = (key.model_name, key.kv_rank, key.object_group_id, key.cache_salt)
        state = _prefixes.get(fields)
        if state is None:
            state = _prefix(*fields)
        state = state.copy()
        chunk = key.chunk_hash
        state.update(_CHUNK_LEN(len(chunk)))
        state.update(chunk)
        out.append(state.digest())
    return out


def tier_key(key: Any) -> bytes:
    """The kvtier key of one ``ObjectKey`` (see :func:`tier_keys`)."""
    return tier_keys([key])[0]


@dataclass
class Change:
    """Objects that became resident, and objects that stopped being, as
    (ObjectKey, size) pairs, for ``_notify_keys_stored``/``_deleted``."""

    stored: list[tuple[Any, int]]
    deleted: list[tuple[Any, int]]

    def __bool__(self) -> bool:
        return bool(self.stored or self.deleted)


class Books:
    """The resident objects, the stores in flight, and the locks."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        # kvtier key -> (ObjectKey, bytes): what the tier holds for LMCache.
        self._resident: dict[bytes, tuple[Any, int]] = {}
        # kvtier key -> [ObjectKey, bytes, jobs in flight that store it,
        # whether its STORED event came].
        self._pending: dict[bytes, list[Any]] = {}
        # kvtier key -> locks held (lookup-and-lock minus unlocks).
        self._locks: dict[bytes, int] = {}

    # -- stores --------------------------------------------------------------

    def store_submitted(self, tkeys: list[bytes], keys: list[Any], sizes: list[int]) -> None:
        with self._mutex:
            for tkey, key, size in zip(tkeys, keys, sizes):
                entry = self._pending.get(tkey)
                if entry is None:
                    self._pending[tkey] = [key, size, 1, False]
                else:
                    entry[0], entry[1] = key, size
                    entry[2] += 1

    def stored(self, tkey: bytes, change: Change) -> None:
        """A STORED event: the object of a store in flight is resident."""
        with self._mutex:
            entry = self._pending.get(tkey)
            if entry is None or tkey in self._resident:
                return  # recovered or found in storage: its size is unknown
            entry[3] = True
            self._resident[tkey] = (entry[0], entry[1])
            change.stored.append((entry[0], entry[1]))

    def store_finished(self, tkeys: list[bytes], present: list[bool], change: Change) -> None:
        """A store job finished; ``present[i]`` says its item i is in the tier
        (stored by it, or already there: then it had no STORED event). A key
        whose STORED event came is left to its events: it may already have
        been evicted again."""
        with self._mutex:
            for tkey, here in zip(tkeys, present):
                entry = self._pending.get(tkey)
                if entry is None:
                    continue
                if here and not entry[3] and tkey not in self._resident:
                    self._resident[tkey] = (entry[0], entry[1])
                    change.stored.append((entry[0], entry[1]))
                entry[2] -= 1
                if entry[2] <= 0:
                    del self._pending[tkey]

    def learned(self, tkeys: list[bytes], keys: list[Any], sizes: list[int], change: Change) -> None:
        """A load found these objects: those the books did not know (stored
        before this adapter opened) are counted from now on."""
        with self._mutex:
            resident = self._resident
            for tkey, key, size in zip(tkeys, keys, sizes):
                if tkey not in resident:
                    resident[tkey] = (key, size)
                    change.stored.append((key, size))

    # -- removals ------------------------------------------------------------

    def removed(self, tkey: bytes, change: Change) -> None:
        """A REMOVED event or a finished delete: the object is gone."""
        with self._mutex:
            item = self._resident.pop(tkey, None)
        if item is not None:
            change.deleted.append(item)

    def resident_keys(self) -> list[bytes]:
        with self._mutex:
            return list(self._resident)

    # -- locks ---------------------------------------------------------------

    def lock(self, tkeys: list[bytes], pin: Any) -> list[bool]:
        """Locks keys: a key already locked is resident (a pinned block is
        never evicted nor deleted) and gets one more lock; the others are
        pinned through ``pin`` (keys -> one bool per key: pinned, i.e. a HIT)
        and locked if pinned.
        Under the mutex, so that an unlock cannot unpin between the two."""
        found = [False] * len(tkeys)
        with self._mutex:
            ask = [i for i, tkey in enumerate(tkeys) if tkey not in self._locks]
            # One pin per distinct key: the second of a pair is a count.
            distinct: dict[bytes, int] = {}
            for i in ask:
                distinct.setdefault(tkeys[i], i)
            hits: set[bytes] = set()
            if distinct:
                states = pin(list(distinct))
                hits = {tkey for tkey, hit in zip(distinct, states) if hit}
            for i, tkey in enumerate(tkeys):
                if tkey in self._locks or tkey in hits:
                    self._locks[tkey] = self._locks.get(tkey, 0) + 1
                    found[i] = True
        return found

    def unlock(self, tkeys: list[bytes], unpin: Any) -> None:
        """Drops one lock per key; keys whose last lock goes are unpinned
        through ``unpin``. Keys never locked are ignored."""
        with self._mutex:
            free = []
            for tkey in tkeys:
                held = self._locks.get(tkey)
                if held is None:
                    continue
                if held <= 1:
                    del self._locks[tkey]
                    free.append(tkey)
                else:
                    self._locks[tkey] = held - 1
            if free:
                unpin(free)

    def locked(self) -> int:
        with self._mutex:
            return len(self._locks)

    def release_all(self) -> list[bytes]:
        """Forgets every lock (at close); returns the keys that were pinned."""
        with self._mutex:
            keys = list(self._locks)
            self._locks.clear()
            return keys

    # -- listing -------------------------------------------------------------

    def page(
        self, model_name: str | None, page_size: int, after: bytes | None
    ) -> tuple[list[tuple[Any, int]], bytes | None]:
        """Up to ``page_size`` resident objects in key order after ``after``,
        and the last key if more may follow."""
        with self._mutex:
            items = sorted(self._resident.items())
        out: list[tuple[Any, int]] = []
        last: bytes | None = None
        for tkey, (key, size) in items:
            if after is not None and tkey <= after:
                continue
            if model_name is not None and key.model_name != model_name:
                continue
            if len(out) == page_size:
                return out, last
            out.append((key, size))
            last = tkey
        return out, None
