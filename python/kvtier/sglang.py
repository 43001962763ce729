"""kvtier as SGLang's HiCache L3 storage backend (SGLang 0.5.23; the
zero-copy ``interface_v1`` of 0.5.6 and later).

Enable it through SGLang's ``dynamic`` backend, without patching SGLang::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KVTierStorage",
        "interface_v1": 1, "backend": "disk", "path": "/nvme/kvtier",
        "capacity_bytes": "200GiB"}'

Every extra-config key other than SGLang's own (``backend_name``,
``module_path``, ``class_name``, ``interface_v1``) and this adapter's
(``pending_wait_ms``) is a kvtier config key passed to the library as a
string, as in the vLLM adapter; an unknown one fails at construction.
``docs/sglang.md`` lists them.

Zero copy: rows per segment
---------------------------
The tier is built in ``register_mem_pool_host`` over the host pool's own
``kv_buffer`` (one contiguous CPU tensor). ``get_page_buffer_meta`` cuts a page
into segments of equal size: K and V (MHA page_first, page_first_direct), one
(MLA page-first), or one per layer and K/V (layer_first). A kvtier row is one
segment: the tier's ``block_bytes`` is the segment size and a segment's row
number is its offset in the buffer over that size. Per segment, not per page,
because no MHA layout makes a page contiguous (K and V live in separate
halves of the buffer); for MLA page-first layouts the one segment is the
page. The row of segment ``j`` of page ``p`` is affine in ``p``
(``row0[j] + p * stride[j]``), learned from ``get_page_buffer_meta`` at
registration and checked on the first, second, middle and last page, so a
batch maps to rows with a few numpy operations instead of a Python loop.

Keys: SGLang's 64-hex page hash in ASCII, plus ``.<segment>`` when a page has
more than one segment (the key of another form is first hashed to 64 hex).
A page is present only when all its segments are. Ranks are kept apart by the
kvtier ``namespace`` (which already separates directories and Redis keys):
model, layout, dtype, page size, the pool's geometry and, for MHA, the TP rank
(``kvtier.identity``); MLA ranks share one namespace, open their storage
shared and only the writer rank stores.

Every method SGLang's threads call returns a miss (``False``, ``0``, ``None``)
instead of raising; each kind of failure is logged once with its traceback.
The hybrid-model v2 calls raise ``NotImplementedError`` (SGLang's default).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
import time
from typing import Any

import numpy as np

from . import _lib, _sglang_metrics, identity
from ._adapter import FailureLog, backend_of, check_config, is_shared, parse_bool
from .errors import KVTierError
from .tier import Tier

try:
    import torch
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

    _SGLANG_IMPORT_ERROR: BaseException | None = None
except Exception as exc:  # ImportError, or an SGLang install that fails to import
    _SGLANG_IMPORT_ERROR = exc
    HiCacheStorage = object

StorageMetrics: Any = None
if _SGLANG_IMPORT_ERROR is None:
    for _where in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
        try:  # the first is 0.5.23's module, the second older releases'
            StorageMetrics = __import__(_where, fromlist=["StorageMetrics"]).StorageMetrics
            break
        except Exception:
            continue

logger = logging.getLogger(__name__)

# Extra-config keys that are SGLang's (the factory's and the controller's).
_SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size")
_HASH_LEN = 64  # SGLang's page keys: SHA-256 in hex
_HIT = bytes([_lib.TIER_HIT])
_PENDING = _lib.TIER_PENDING
# Legacy (non-v1) calls copy through a private buffer of at most this many
# bytes (and at least one page): SGLang's legacy values are separate tensors.
_BOUNCE_BYTES = 64 << 20
_OWNER = "kvtier sglang backend"


class _Geometry:
    """Where each page's segments are: kvtier rows of ``seg_bytes``."""

    def __init__(self, pool: Any) -> None:
        kv = pool.kv_buffer
        if kv.device.type != "cpu" or not kv.is_contiguous():
            raise ValueError("kvtier: the host pool's kv_buffer must be one contiguous CPU tensor")
        self.page_size: int = pool.page_size
        self.base: int = kv.data_ptr()
        self.nbytes: int = kv.numel() * kv.element_size()
        self.num_pages: int = getattr(pool, "page_num", None) or pool.size // pool.page_size
        seg0, rows0 = self._page_rows(pool, 0, None)
        self.seg_bytes: int = seg0
        self.rows0 = rows0
        self.segments: int = len(rows0)
        if self.num_pages > 1:
            self.stride = self._page_rows(pool, 1, seg0)[1] - rows0
        else:
            self.stride = np.zeros_like(rows0)
        for p in {self.num_pages // 2, self.num_pages - 1}:
            if not np.array_equal(self._page_rows(pool, p, seg0)[1], rows0 + p * self.stride):
                raise ValueError(f"kvtier: layout {pool.layout!r}: page segments are not evenly spaced")
        self.page_bytes = self.seg_bytes * self.segments
        self.flat_order = self._flat_order(pool)

    def _page_rows(self, pool: Any, page: int, seg: int | None) -> tuple[int, np.ndarray]:
        ps = self.page_size
        ptrs, sizes = pool.get_page_buffer_meta(torch.arange(page * ps, (page + 1) * ps, dtype=torch.int64))
        if not ptrs or len(set(sizes)) != 1 or (seg is not None and sizes[0] != seg):
            raise ValueError(f"kvtier: layout {pool.layout!r}: segments of unequal size {set(sizes)}")
        seg = int(sizes[0])
        offsets = np.asarray(ptrs, dtype=np.int64) - self.base
        if (offsets % seg).any() or (offsets < 0).any() or (offsets + seg > self.nbytes).any():
            raise ValueError(
                f"kvtier: layout {pool.layout!r}: a segment lies outside kv_buffer or off its "
                "segment grid (split K/V buffers are not supported)"
            )
        return seg, offsets // seg

    def _flat_order(self, pool: Any) -> np.ndarray | None:
        """For legacy values (a page flattened in the layout's order): which
        segment each seg_bytes chunk of it is, or None if chunks are not
        segments."""
        try:
            view = pool.get_data_page(0, flat=False)
            chunks = view.view(self.segments, -1)
            if chunks.stride(1) != 1 or chunks.shape[1] * chunks.element_size() != self.seg_bytes:
                return None
            rows = [(chunks[r].data_ptr() - self.base) // self.seg_bytes for r in range(self.segments)]
            where = {int(row): j for j, row in enumerate(self.rows0)}
            return np.asarray([where[row] for row in rows], dtype=np.int64)
        except Exception:
            return None

    def rows(self, pool: Any, host_indices: Any, n: int) -> np.ndarray:
        """Rows of n pages' segments, page-major."""
        ps = self.page_size
        idx = host_indices.numpy() if isinstance(host_indices, torch.Tensor) else np.asarray(host_indices)
        if idx.shape[0] < n * ps:
            raise ValueError(f"{n} keys need {n * ps} host indices, got {idx.shape[0]}")
        starts = idx[: n * ps : ps].astype(np.int64, copy=False)
        pages = starts // ps
        if (starts % ps).any() or (pages >= self.num_pages).any() or (pages < 0).any():
            # Not the allocator's page-aligned indices: ask the pool itself.
            seg, rows = self._meta_rows(pool, idx[: n * ps])
            return rows
        return (self.rows0[None, :] + pages[:, None] * self.stride[None, :]).ravel()

    def _meta_rows(self, pool: Any, idx: np.ndarray) -> tuple[int, np.ndarray]:
        ptrs, sizes = pool.get_page_buffer_meta(torch.from_numpy(np.ascontiguousarray(idx)))
        offsets = np.asarray(ptrs, dtype=np.int64) - self.base
        if set(sizes) != {self.seg_bytes} or (offsets % self.seg_bytes).any():
            raise ValueError("host indices do not map to whole segments")
        return self.seg_bytes, offsets // self.seg_bytes


class KVTierStorage(HiCacheStorage):
    """An SGLang ``HiCacheStorage`` backed by libkvtier (see the module docs)."""

    def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
        if _SGLANG_IMPORT_ERROR is not None:
            raise ImportError(
                "kvtier.sglang.KVTierStorage needs SGLang (>= 0.5.6); importing it failed: "
                f"{_SGLANG_IMPORT_ERROR!r}"
            ) from _SGLANG_IMPORT_ERROR
        extra = dict(storage_config.extra_config or {})
        self.interface_v1 = parse_bool(_OWNER, "interface_v1", extra.get("interface_v1", 0))
        self.pending_wait_s = float(extra.pop("pending_wait_ms", 1000)) / 1000.0
        config = {k: v for k, v in extra.items() if k not in _SGLANG_KEYS and v is not None}
        self.storage_config = storage_config
        self.is_mla: bool = bool(storage_config.is_mla_model)
        tp_rank, tp_size = storage_config.tp_rank, storage_config.tp_size
        writer = getattr(storage_config, "is_storage_writer", None)
        # Older SGLang has no is_storage_writer: MLA's writer is rank 0.
        self.is_writer: bool = (not self.is_mla or tp_rank == 0) if writer is None else bool(writer)
        self.backend = backend_of(config)
        if self.is_mla and tp_size > 1:
            self._share_mla_ranks(config, tp_rank, tp_size)
        self._user_namespace = str(config.pop("namespace", ""))
        check_config(config)
        self._config = config
        # SGLang 0.5.6's config has no metrics, pipeline nor context-parallel fields.
        self._metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._exporter = _sglang_metrics.Exporter(self.backend, tp_rank)
        self._prefetch_pgs: list[int] = []
        self._backup_pgs: list[int] = []
        self._prefetch_bw: list[float] = []
        self._backup_bw: list[float] = []
        self.mem_pool_host: Any = None
        self._geo: _Geometry | None = None
        self._tier: Tier | None = None
        self._bounce: np.ndarray | None = None
        self._bounce_pages = 0
        self._bounce_lock = threading.Lock()
        self._tags: np.ndarray | None = None
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._done: dict[int, Any] = {}
        self._polling = False
        self._closed = False
        self._log = FailureLog(logger, "kvtier", None)

    def _share_mla_ranks(self, config: dict[str, Any], tp_rank: int, tp_size: int) -> None:
        """MLA ranks share one namespace and only the writer stores, so the
        readers see its pages only through storage every rank opens shared."""
        key, value = {"disk": ("shared", True), "redis": ("sharing", "shared")}.get(self.backend, (None, None))
        if key is None:
            logger.warning(
                "kvtier: MLA with tp_size=%d on the %s backend: only the writer rank stores, so the "
                "other ranks (and so SGLang's agreed hit count) always miss; use the disk backend "
                "on a directory every rank reaches, or redis (the adapter opens either shared)",
                tp_size, self.backend,
            )
            return
        if key not in config:
            config[key] = value
            logger.info("kvtier: MLA with tp_size=%d: rank %d opens the %s storage with %s=%s, "
                        "where the writer rank's pages reach every rank", tp_size, tp_rank,
                        self.backend, key, value)
            return
        chosen = config[key]
        if not is_shared(config):  # a value the library refuses is left to it
            raise ValueError(
                f"{_OWNER}: MLA with tp_size={tp_size}: all ranks share one namespace "
                f"and only the writer rank stores, so every rank must open the storage shared; "
                f"{key}={chosen!r} would fail rank 1's open or hide the writer's pages. "
                f"Set {key}={value!r} (or leave it out: the adapter then sets it)"
            )

    # -- construction over the pool -------------------------------------------

    def namespace(self, pool: Any) -> str:
        """The kvtier namespace: what must match for two tiers to share pages
        (``kvtier.identity``), then the user's ``namespace`` if set."""
        derived = identity.sglang_namespace(self.storage_config, pool, self.is_mla, self._shared())
        return identity.with_user(derived, self._user_namespace)

    def _shared(self) -> bool:
        """Whether other processes may write this tier's storage."""
        return is_shared(self._config)

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        # Raising here fails SGLang's attach, which is what a pool this
        # backend cannot address should do.
        self.mem_pool_host = mem_pool_host
        geo = _Geometry(mem_pool_host)
        config = dict(self._config, namespace=self.namespace(mem_pool_host))
        if self.interface_v1:
            kv = mem_pool_host.kv_buffer
            buffer = kv.reshape(-1).view(torch.uint8).numpy()
        else:
            self._bounce_pages = max(1, min(128, _BOUNCE_BYTES // geo.page_bytes))
            buffer = np.zeros((self._bounce_pages * geo.segments, geo.seg_bytes), dtype=np.uint8)
            self._bounce = buffer
        self._tier = Tier(buffer, block_bytes=geo.seg_bytes, **config)
        self._geo = geo
        if geo.segments > 1:
            self._tags = np.frombuffer(
                b"".join(f".{j:03x}".encode() for j in range(geo.segments)), dtype=np.uint8
            ).reshape(geo.segments, 4)
        logger.info(
            "kvtier: %s backend over the %s host pool (%s): %d segment(s) of %d bytes per page, "
            "namespace %r, writer=%s, interface_v1=%s",
            self.backend, mem_pool_host.layout, type(mem_pool_host).__name__, geo.segments,
            geo.seg_bytes, config["namespace"], self.is_writer, self.interface_v1,
        )

    # -- helpers --------------------------------------------------------------

    def _pack(self, keys: list[str]) -> tuple[bytes, int, int]:
        """Packed kvtier keys of n pages' segments, page-major: (packed, key_len, count)."""
        n = len(keys)
        try:
            # SGLang's keys are all 64 ASCII characters: a total of 64 n and
            # no key shorter is exactly that, and cheaper than a set of lengths.
            joined = "".join(keys).encode("ascii")
            regular = len(joined) == _HASH_LEN * n and min(map(len, keys)) == _HASH_LEN
        except (UnicodeEncodeError, TypeError):
            regular = False
        if not regular:
            joined = "".join(
                k if isinstance(k, str) and len(k) == _HASH_LEN and k.isascii()
                else hashlib.sha256(str(k).encode()).hexdigest()
                for k in keys
            ).encode("ascii")
        tags = self._tags
        if tags is None:
            return joined, _HASH_LEN, n
        m = tags.shape[0]
        out = np.empty((n, m, _HASH_LEN + 4), dtype=np.uint8)
        out[:, :, :_HASH_LEN] = np.frombuffer(joined, dtype=np.uint8).reshape(n, 1, _HASH_LEN)
        out[:, :, _HASH_LEN:] = tags
        return out.tobytes(), _HASH_LEN + 4, n * m

    def _run(self, store: bool, packed: bytes, key_len: int, rows: np.ndarray) -> Any:
        """Submits one job and waits for its result. Threads share the polling:
        whoever polls hands the others their results."""
        tier = self._tier
        assert tier is not None  # callers check _ready()
        job_id = next(self._ids)
        rows = rows.astype(np.int64, copy=False)
        if store:
            name = "tier_submit_store"
            tier.submit_store_packed(job_id, packed, key_len, rows)
        else:
            name = "tier_submit_load"
            tier.submit_load_packed(job_id, packed, key_len, rows)
        with self._cond:
            while job_id not in self._done:
                if self._closed:
                    raise KVTierError(_lib.TIER_ERR_SHUTDOWN, "the backend is closed", name)
                if self._polling:
                    self._cond.wait(0.1)
                    continue
                self._polling = True
                self._cond.release()
                try:
                    tier.wait(0.1)
                    results = tier.poll(1024)
                finally:
                    self._cond.acquire()
                    self._polling = False
                for r in results:
                    self._done[r.job_id] = r
                self._cond.notify_all()
            return self._done.pop(job_id)

    def _ready(self) -> bool:
        return self._tier is not None and not self._closed

    # -- zero-copy interface (interface_v1) -------------------------------------

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many leading pages are present (every segment HIT). PENDING
        (a store or a shared tier's probe in flight) is asked again until it
        settles, for at most pending_wait_ms: it counts only if a load would
        find it."""
        try:
            if not keys or not self._ready():
                return 0
            packed, key_len, count = self._pack(keys)
            m = count // len(keys)
            done = 0  # leading keys found HIT
            deadline = None
            while True:
                states = self._tier.lookup_packed(packed[done * key_len:], key_len)  # type: ignore[union-attr]
                hits = len(states) - len(states.lstrip(_HIT))  # leading HITs, in C
                done += hits
                if done == count or states[hits] != _PENDING:
                    return done // m
                if deadline is None:
                    deadline = time.monotonic() + self.pending_wait_s
                elif time.monotonic() > deadline:
                    return done // m
                time.sleep(0.0002)
        except Exception as exc:
            self._log.failed("batch_exists", exc)
            return 0

    def batch_get_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        n = len(keys)
        if not n:
            return []
        try:
            if not self._ready() or not self.interface_v1:
                raise RuntimeError("batch_get_v1 needs interface_v1=1 and a registered host pool")
            start = time.perf_counter()
            geo = self._geo
            rows = geo.rows(self.mem_pool_host, host_indices, n)  # type: ignore[union-attr]
            packed, key_len, count = self._pack(keys)
            r = self._run(False, packed, key_len, rows)
            ok = n if r.status == _lib.TIER_OK else min(r.num_done, count) // geo.segments  # type: ignore[union-attr]
            if self._metrics:
                self._record(self._prefetch_pgs, self._prefetch_bw, ok, start)
            return [True] * ok + [False] * (n - ok)
        except Exception as exc:
            self._log.failed("batch_get_v1", exc)
            return [False] * n

    def batch_set_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        n = len(keys)
        if not n:
            return []
        if not self.is_writer:
            return [True] * n  # MLA: the writer rank stores these very pages
        try:
            if not self._ready() or not self.interface_v1:
                raise RuntimeError("batch_set_v1 needs interface_v1=1 and a registered host pool")
            start = time.perf_counter()
            rows = self._geo.rows(self.mem_pool_host, host_indices, n)  # type: ignore[union-attr]
            packed, key_len, count = self._pack(keys)
            r = self._run(True, packed, key_len, rows)
            if r.status != _lib.TIER_OK:
                raise KVTierError(r.status, f"store of {n} pages failed", "batch_set_v1")
            if self._metrics:
                self._record(self._backup_pgs, self._backup_bw, n, start)
            return [True] * n
        except Exception as exc:
            self._log.failed("batch_set_v1", exc)
            return [False] * n

    def _record(self, pages: list[int], bandwidth: list[float], n: int, start: float) -> None:
        elapsed = time.perf_counter() - start
        pages.append(n)
        bandwidth.append(n * self._geo.page_bytes / 1e9 / elapsed if elapsed > 0 else 0.0)  # type: ignore[union-attr]

    # -- legacy interface (a copy through a private buffer) ----------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def _legacy_ready(self, what: str) -> tuple[_Geometry, np.ndarray, np.ndarray]:
        """The geometry, the flat page's segment order and the private buffer."""
        geo, bounce = self._geo, self._bounce
        if not self._ready() or geo is None or bounce is None or geo.flat_order is None:
            raise RuntimeError(
                f"{what}: legacy data calls need interface_v1=0 (the tier is then over a private "
                "buffer) and a layout whose flat page is whole segments"
            )
        return geo, geo.flat_order, bounce

    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> list[Any]:
        n = len(keys)
        out: list[Any] = [None] * n
        try:
            geo, order, bounce = self._legacy_ready("batch_get")
            with self._bounce_lock:
                for first in range(0, n, self._bounce_pages):
                    chunk = keys[first:first + self._bounce_pages]
                    packed, key_len, count = self._pack(list(chunk))
                    r = self._run(False, packed, key_len, np.arange(count, dtype=np.int64))
                    ok = len(chunk) if r.status == _lib.TIER_OK else min(r.num_done, count) // geo.segments
                    for i in range(ok):
                        dst = target_locations[first + i] if target_locations else None
                        if dst is None:
                            dst = self.mem_pool_host.get_dummy_flat_data_page()
                        if dst.numel() * dst.element_size() != geo.page_bytes:
                            raise ValueError(
                                f"a target of {dst.numel() * dst.element_size()} bytes, pages are {geo.page_bytes}"
                            )
                        flat = dst.view(torch.uint8).numpy().reshape(geo.segments, geo.seg_bytes)
                        flat[:] = bounce[i * geo.segments + order]
                        out[first + i] = dst
                    if ok < len(chunk):
                        break
        except Exception as exc:
            self._log.failed("batch_get", exc)
        return out

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        if not self.is_writer:
            return True
        try:
            geo, order, bounce = self._legacy_ready("batch_set")
            if values is None or len(values) != len(keys):
                raise ValueError("batch_set needs one value per key")
            with self._bounce_lock:
                for first in range(0, len(keys), self._bounce_pages):
                    chunk = keys[first:first + self._bounce_pages]
                    for i, value in enumerate(values[first:first + len(chunk)]):
                        src = value.contiguous().reshape(-1).view(torch.uint8).numpy()
                        if src.nbytes != geo.page_bytes:
                            raise ValueError(f"a page of {src.nbytes} bytes, pages are {geo.page_bytes}")
                        bounce[i * geo.segments + order] = src.reshape(geo.segments, -1)
                    packed, key_len, count = self._pack(list(chunk))
                    r = self._run(True, packed, key_len, np.arange(count, dtype=np.int64))
                    if r.status != _lib.TIER_OK:
                        raise KVTierError(r.status, f"store of {len(chunk)} pages failed", "batch_set")
            return True
        except Exception as exc:
            self._log.failed("batch_set", exc)
            return False

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    # -- lifetime and metrics ---------------------------------------------------

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics; and the library's series updated in this
        process's prometheus_client registry (kvtier._sglang_metrics)."""
        self.export_metrics()
        if StorageMetrics is None:
            return None
        m = StorageMetrics()
        for mine, theirs in ((self._prefetch_pgs, m.prefetch_pgs), (self._backup_pgs, m.backup_pgs),
                             (self._prefetch_bw, m.prefetch_bandwidth), (self._backup_bw, m.backup_bandwidth)):
            taken = mine[:]
            del mine[:len(taken)]
            theirs.extend(taken)
        return m

    def export_metrics(self, force: bool = False) -> None:
        """Updates the ``sglang:kvtier_*`` series from the tier's metrics()
        (get_stats does, at most every second; ``force``: now)."""
        try:
            if self._tier is not None and not self._tier.closed:
                self._exporter.export(self._tier.metrics, force)
        except Exception as exc:
            self._log.failed("export_metrics", exc)

    @property
    def tier(self) -> Tier | None:
        """The kvtier Tier (after register_mem_pool_host): for its block
        events (``events=true``) and Prometheus text (``metrics()``)."""
        return self._tier

    def stats(self) -> Any:
        """The library's counters (kvtier.TierStats), for diagnostics."""
        return self._tier.stats() if self._tier is not None else None

    def clear(self) -> None:
        try:
            if self._ready():
                self._tier.clear()  # type: ignore[union-attr]
        except Exception as exc:
            self._log.failed("clear", exc)

    def close(self) -> None:
        # tier_free abandons queued jobs: waiters are told the backend closed.
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        tier = self._tier
        if tier is not None:
            try:
                tier.close()
            except Exception as exc:
                self._log.failed("close", exc)


__all__ = ["KVTierStorage"]
