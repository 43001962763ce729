"""Benchmark: kvtier as SGLang's HiCache L3 backend, side by side with SGLang's
own ``file`` backend, through SGLang's controller path, in one process.

    cargo build --release --lib
    KVTIER_LIBRARY=target/release/libkvtier.so \\
        <engines venv>/bin/python python/bench/bench_sglang.py [--dir D] [--repeat N] [--quick] [--json]

One real SGLang CPU host pool per page size (``page_first``, the default
layout; a Llama-3-8B-like rank: 32 layers, 8 KV heads of 128, bf16, so 64 KiB
of K and 64 KiB of V per token): page size 1 token (SGLang's default, 128 KiB
pages) and 16 tokens (2 MiB pages). Pages ``[0, N)`` are filled with random
bytes; every contender stores them under fresh keys and loads them back into
pages ``[N, 2N)`` of the same pool, in batches of SGLang's
``STORAGE_BATCH_SIZE`` (128), through the functions SGLang's
``HiCacheController`` uses for that backend:

- ``file``: SGLang's ``HiCacheFile`` from ``StorageBackendFactory`` with its
  defaults (``file_storage_path`` under ``--dir``), driven by
  ``_generic_page_set`` / ``_generic_page_get`` (SGLang gives ``file`` no
  zero-copy path);
- ``kvtier-disk``: ``KVTierStorage`` through the ``dynamic`` config with
  ``interface_v1: 1``, ``backend: disk`` under ``--dir`` (kvtier defaults:
  O_DIRECT when the file system takes it, 8 I/O threads), driven by
  ``_page_set_zero_copy`` / ``_page_get_zero_copy``;
- ``kvtier-memory`` against ``memcpy``: the memory backend's stores and loads
  of the same pages, and numpy ``copyto`` of the same bytes (one thread)
  between the pool and a warm buffer;
- ``batch_exists``: one call over 128 stored keys (page_first: 256 segment
  lookups), memory backend, the median of 1000 calls per repetition, each
  timed alone.

Every load is compared with its source (untimed). The page cache is dropped
before each disk pass when ``/proc/sys/vm/drop_caches`` is writable (else
the ``file`` backend's loads come from the page cache: the run says which).
The contenders' order alternates per repetition; GB/s are 10^9 bytes of page
payload per second; ratios are taken per repetition and their medians
reported. ``others`` is the CPU (in cores) that other processes used during
the timed passes: above 0.25 the run is marked not conclusive.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from page_cache import drop_caches  # noqa: E402
from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE, HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

LAYERS, HEADS, HEAD_DIM = 32, 8, 128
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
OP = SimpleNamespace(request_id="bench", is_terminated=lambda: False)


def host_pool(page_size: int, pages: int) -> Any:
    dev = MHATokenToKVPool(pages * page_size, page_size, torch.bfloat16, HEADS, HEAD_DIM, LAYERS, "cpu",
                           False, start_layer=0, end_layer=LAYERS)
    pool = MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, page_size, "page_first",
                                pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                                start_layer=0, end_layer=LAYERS)
    del dev
    return pool


def storage_config(extra: dict[str, Any]) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                                model_name="bench/llama-3-8b", extra_config=extra)


def kvtier_backend(pool: Any, **config: Any) -> Any:
    extra = {"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KVTierStorage",
             "interface_v1": 1, **config}
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(extra), pool)
    backend.register_mem_pool_host(pool)
    return backend


def file_backend(pool: Any, path: str) -> Any:
    backend = StorageBackendFactory.create_backend("file", storage_config({"file_storage_path": path}), pool)
    backend.register_mem_pool_host(pool)
    return backend


class Contender:
    """A backend and the controller functions SGLang drives it with."""

    def __init__(self, name: str, backend: Any, pool: Any, zero_copy: bool) -> None:
        self.name = name
        self.backend = backend
        self.ctrl = SimpleNamespace(storage_backend=backend, storage_host_pool=pool, page_size=pool.page_size)
        self.set = HiCacheController._page_set_zero_copy if zero_copy else HiCacheController._generic_page_set
        self.get = HiCacheController._page_get_zero_copy if zero_copy else HiCacheController._generic_page_get

    def store(self, keys: list[str], hi: Any) -> None:
        ps = self.ctrl.page_size
        for i in range(0, len(keys), STORAGE_BATCH_SIZE):  # as _page_backup batches
            batch = keys[i:i + STORAGE_BATCH_SIZE]
            if not self.set(self.ctrl, batch, hi[i * ps:(i + len(batch)) * ps]):
                raise RuntimeError(f"{self.name}: a store failed")

    def load(self, keys: list[str], hi: Any) -> None:
        ps = self.ctrl.page_size
        for i in range(0, len(keys), STORAGE_BATCH_SIZE):  # as _page_transfer batches
            batch = keys[i:i + STORAGE_BATCH_SIZE]
            if self.get(self.ctrl, OP, batch, hi[i * ps:(i + len(batch)) * ps]) != len(batch):
                raise RuntimeError(f"{self.name}: a load missed")


def cpu_now() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return own.ru_utime + own.ru_stime, sum(ticks[i] for i in (0, 1, 2, 5, 6)) / CLOCK_TICKS


class Clock:
    """Times passes and the CPU other processes used meanwhile."""

    def __init__(self) -> None:
        self.others: list[float] = []

    def __call__(self, fn: Callable[[], Any]) -> float:
        own0, all0 = cpu_now()
        start = time.perf_counter()
        fn()
        secs = time.perf_counter() - start
        own1, all1 = cpu_now()
        self.others.append(max(0.0, (all1 - all0) - (own1 - own0)) / secs)
        return secs


def fresh_keys(n: int) -> list[str]:
    return [uuid.uuid4().hex + uuid.uuid4().hex for _ in range(n)]


def median_stats(xs: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def measure(page_size: int, pages: int, repeat: int, workdir: str, clock: Clock) -> dict[str, Any]:
    pool = host_pool(page_size, pages)
    pool.kv_buffer.view(torch.uint8).view(-1)[:] = torch.randint(0, 256, (pool.kv_buffer.numel() * 2,),
                                                                  dtype=torch.uint8)
    page_bytes = pool.get_data_page(0, flat=True).numel() * pool.kv_buffer.element_size()
    src = torch.arange(0, pages * page_size, dtype=torch.int64)
    dst = torch.arange(pages * page_size, 2 * pages * page_size, dtype=torch.int64)
    payload = pages * page_bytes

    def check(name: str) -> None:
        for i in range(pages):
            # As bytes: random bf16 bytes include NaNs, which never equal themselves.
            a = pool.get_data_page(i * page_size, flat=True).view(torch.uint8)
            b = pool.get_data_page((pages + i) * page_size, flat=True).view(torch.uint8)
            if not torch.equal(a, b):
                raise RuntimeError(f"{name}: page {i} loaded wrong bytes")
        pool.kv_buffer[:, pages * page_size:].zero_()

    file_dir, kv_dir = tempfile.mkdtemp(dir=workdir), tempfile.mkdtemp(dir=workdir)
    disk = [
        Contender("file", file_backend(pool, file_dir), pool, zero_copy=False),
        Contender("kvtier-disk", kvtier_backend(pool, backend="disk", path=kv_dir,
                                                capacity_bytes=4 * payload), pool, zero_copy=True),
    ]
    rates: dict[str, list[float]] = {}
    dropped = True
    for rep in range(repeat):
        order = disk if rep % 2 == 0 else disk[::-1]
        for c in order:
            keys = fresh_keys(pages)
            dropped &= drop_caches()
            rates.setdefault(f"{c.name} store", []).append(payload / clock(lambda: c.store(keys, src)) / 1e9)
            dropped &= drop_caches()
            rates.setdefault(f"{c.name} load", []).append(payload / clock(lambda: c.load(keys, dst)) / 1e9)
            check(c.name)
            c.backend.clear()  # untimed: the next repetition starts from an empty store
    for c in disk:
        if hasattr(c.backend, "close"):  # HiCacheFile has none (SGLang checks the same way)
            c.backend.close()
    shutil.rmtree(file_dir, ignore_errors=True)
    shutil.rmtree(kv_dir, ignore_errors=True)

    mem = Contender("kvtier-memory", kvtier_backend(pool, backend="memory",
                                                    capacity_bytes=max(2 * payload, 256 * page_bytes)),
                    pool, zero_copy=True)
    flat = pool.kv_buffer.view(-1).view(torch.uint8).numpy()
    half = flat.shape[0] // 2  # page_first: K of every page, then V
    span = pages * page_bytes // 2
    k_src, v_src = flat[:span], flat[half:half + span]
    bounce = np.empty(2 * span, dtype=np.uint8)
    bounce[:] = 1  # warm, as the tier's arena is after the first repetition

    def memcpy_out() -> None:
        np.copyto(bounce[:span], k_src)
        np.copyto(bounce[span:], v_src)

    def memcpy_in() -> None:
        np.copyto(flat[pages * page_bytes // 2: pages * page_bytes], bounce[:span])
        np.copyto(flat[half + span: half + 2 * span], bounce[span:])

    for rep in range(repeat + 1):  # the first repetition warms the arena: not counted
        keys = fresh_keys(pages)
        tiers = [("kvtier-memory", lambda: mem.store(keys, src), lambda: mem.load(keys, dst)),
                 ("memcpy", memcpy_out, memcpy_in)]
        for name, out, back in (tiers if rep % 2 == 0 else tiers[::-1]):
            s, l_ = clock(out), clock(back)
            if rep:
                rates.setdefault(f"{name} store", []).append(payload / s / 1e9)
                rates.setdefault(f"{name} load", []).append(payload / l_ / 1e9)
        mem.backend.clear()

    exists_keys = fresh_keys(128)
    # 128 keys even when the pool has fewer pages: a page may back several keys.
    some = (torch.arange(128) % pages)[:, None] * page_size + torch.arange(page_size)[None, :]
    mem.store(exists_keys, some.reshape(-1))
    exists_us = []
    if mem.backend.batch_exists(exists_keys) != 128:
        raise RuntimeError("batch_exists: stored keys not found")
    # Each call timed alone: on a loaded machine a window of many calls is
    # mostly other processes' time slices; the median call is the call.
    exists = mem.backend.batch_exists
    for _ in range(repeat * 1000):
        start = time.perf_counter()
        exists(exists_keys)
        exists_us.append((time.perf_counter() - start) * 1e6)
    mem.backend.close()

    out: dict[str, Any] = {"page_size_tokens": page_size, "page_bytes": page_bytes, "pages": pages,
                           "page_cache_dropped": dropped,
                           "gbps": {k: median_stats(v) for k, v in rates.items()},
                           "batch_exists_128_us": {**median_stats(exists_us), "runs": None,
                                                   "p90": float(np.percentile(exists_us, 90))}}
    ratios = {}
    for op in ("store", "load"):
        ratios[f"kvtier-disk/file {op}"] = median_stats(
            [a / b for a, b in zip(rates[f"kvtier-disk {op}"], rates[f"file {op}"])])
        ratios[f"kvtier-memory/memcpy {op}"] = median_stats(
            [a / b for a, b in zip(rates[f"kvtier-memory {op}"], rates[f"memcpy {op}"])])
    out["ratios"] = ratios
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp", help="where both disk contenders write (same device)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer pages and repetitions")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    repeat = 2 if args.quick else args.repeat
    workdir = tempfile.mkdtemp(prefix="kvtier-sglang-bench-", dir=args.dir)
    clock = Clock()
    load_before = os.getloadavg()
    results = []
    try:
        # (tokens per page, pages): 256 MiB of pages at each size.
        for page_size, pages in ((1, 512 if args.quick else 2048), (16, 32 if args.quick else 128)):
            results.append(measure(page_size, pages, repeat, workdir, clock))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    others = statistics.median(clock.others)
    report = {"repeat": repeat, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
              "others_cores_median": others, "conclusive": others <= 0.25, "results": results}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"load average before {load_before}, after {report['loadavg_after']}; "
          f"other processes used {others:.2f} cores (median over passes)"
          + ("" if report["conclusive"] else ": NOT CONCLUSIVE"))
    for r in results:
        print(f"\npage {r['page_size_tokens']} token(s) = {r['page_bytes'] >> 10} KiB, {r['pages']} pages, "
              f"median of {repeat} (page cache dropped: {r['page_cache_dropped']})")
        for name, s in r["gbps"].items():
            print(f"  {name:<22} {s['median']:7.2f} GB/s  (min {s['min']:.2f}, max {s['max']:.2f})")
        for name, s in r["ratios"].items():
            print(f"  {name:<28} {s['median']:6.2f}x  (min {s['min']:.2f}, max {s['max']:.2f})")
        e = r["batch_exists_128_us"]
        print(f"  batch_exists over 128 keys  {e['median']:6.1f} us  (min {e['min']:.1f}, p90 {e['p90']:.1f})")


if __name__ == "__main__":
    main()
