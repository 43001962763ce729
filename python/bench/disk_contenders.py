"""The contenders of bench_disk_vs_fs.py: a vLLM secondary tier made by
vLLM's factory (``TierContender``), and raw O_DIRECT file I/O into vLLM's
primary region (``RawContender``, ``raw_odirect.c``), with the job shapes
and keys every contender shares."""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
from page_cache import drop_caches
from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm_tiers import VllmBuilt, offloading_config, with_directory

JOB_ROWS = 16
WINDOW = 16


def block_hash(row: int, rep: int, i: int):
    digest = hashlib.sha256(f"{row}:{rep}:{i}".encode()).digest()
    return make_offload_key(digest, 0)


def page_aligned_rows(rows: int, row: int) -> np.ndarray:
    """O_DIRECT needs aligned memory (vLLM's pinned buffer is): an anonymous
    mapping, not numpy's malloc."""
    buf = mmap.mmap(-1, rows * row)
    return np.frombuffer(buf, dtype=np.uint8).reshape(rows, row)


class TierContender:
    """A vLLM SecondaryTierManager made by vLLM's factory from `config`: by
    default as vLLM makes it, over vLLM's own primary region (a fresh one per
    pass pair, see `vllm_tiers.VllmBuilt`); with ``primary="anon"`` over the
    bench's anonymous mapping instead (the labelled second row)."""

    def __init__(self, name: str, config: dict, primary: str = "vllm"):
        self.name, self.config, self.primary = name, config, primary
        self.tier = self.built = None

    def open(self, directory: str, anon: np.ndarray) -> np.ndarray:
        """Builds the tier; returns the primary buffer it moves rows of."""
        cfg = with_directory(self.config, directory)
        if self.primary in ("anon", "anon-fresh"):
            if self.primary == "anon-fresh":
                # A new mapping per pass pair, as each vLLM region is new.
                anon = page_aligned_rows(anon.shape[0], anon.shape[1])
                anon[:] = 0
            # vLLM's own spec (not its region): only the buffer differs.
            spec = TieringOffloadingSpec(offloading_config([cfg], anon.shape[0], anon.shape[1]))
            self.tier = SecondaryTierFactory.create_secondary_tier(cfg, memoryview(anon), spec)
            return anon
        self.built = VllmBuilt(cfg, anon.shape[0], anon.shape[1])
        self.tier = self.built.tier
        return self.built.buffer

    def run(self, jobs: list, load: bool) -> float:
        tier = self.tier
        submit = tier.submit_load if load else tier.submit_store
        ctx = ReqContext("bench")
        transfer = [
            TransferJob(
                job_id=i,
                keys=list(keys),
                chunk_ids=np.asarray(rows, dtype=np.int32),
                is_promotion=load,
                req_context=ctx,
            )
            for i, (keys, rows) in enumerate(jobs)
        ]
        t0 = time.perf_counter()
        nxt = done = inflight = 0
        while done < len(transfer):
            while inflight < WINDOW and nxt < len(transfer):
                submit(transfer[nxt])
                nxt += 1
                inflight += 1
            results = list(tier.get_finished_jobs())
            for r in results:
                if not r.success:
                    raise RuntimeError(f"{self.name}: job {r.job_id} failed")
            if not results:
                time.sleep(0.0001)
            done += len(results)
            inflight -= len(results)
        return time.perf_counter() - t0

    def lookup_ns(self, keys: list) -> float:
        """Nanoseconds per scheduler lookup of stored keys (median of 5
        sweeps over them all, after one sweep that may settle probes)."""
        ctx = ReqContext("bench-lookup")
        sweeps = []
        for _ in range(6):
            t0 = time.perf_counter_ns()
            for key in keys:
                self.tier.lookup(key, ctx)
            sweeps.append((time.perf_counter_ns() - t0) / len(keys))
        return statistics.median(sweeps[1:])

    def close(self) -> None:
        if self.built is not None:
            self.built.close()
        elif self.tier is not None:
            self.tier.shutdown()
        self.tier = self.built = None


class RawContender:
    """Raw O_DIRECT file I/O (`raw_odirect.c`) into vLLM's primary region,
    made as for a tier."""

    primary = "vllm"

    def __init__(self, lib, threads: int, publish: bool = False):
        self.name = f"raw-{threads}" + (" publishing" if publish else "")
        self.lib, self.threads = lib, threads
        self.publish = publish
        self.directory = self.built = self.buffer = None

    def open(self, directory: str, anon: np.ndarray) -> np.ndarray:
        # The fan-out the C side expects, made before the clock starts.
        for i in range(256):
            os.mkdir(os.path.join(directory, str(i)))
        self.directory = directory
        self.built = VllmBuilt(None, anon.shape[0], anon.shape[1])
        self.buffer = self.built.buffer
        return self.buffer

    def run(self, jobs: list, load: bool) -> float:
        rows = np.asarray([r for _, rs in jobs for r in rs], dtype=np.int64)
        row_bytes = self.buffer.shape[1]
        common = (
            self.directory.encode(),
            ctypes.c_void_p(self.buffer.ctypes.data),
            row_bytes,
            rows.ctypes.data_as(ctypes.POINTER(ctypes.c_long)),
            len(rows),
            self.threads,
        )
        assert self.buffer.strides[0] == row_bytes, "raw I/O needs rows back to back"
        if self.publish and not load:
            secs = self.lib.raw_publish_pass(*common)
        else:
            secs = self.lib.raw_pass(*common, int(load))
        if secs < 0:
            raise OSError(int(-secs), os.strerror(int(-secs)))
        return secs

    def close(self) -> None:
        if self.built is not None:
            self.built.close()
        self.built = self.buffer = None


def build_raw(workdir: str):
    src = Path(__file__).with_name("raw_odirect.c")
    out = os.path.join(workdir, "raw_odirect.so")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler on PATH: raw bound skipped"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-pthread", "-o", out, str(src)], check=True)
    lib = ctypes.CDLL(out)
    lib.raw_read_files.restype = ctypes.c_double
    lib.raw_read_files.argtypes = [
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_long),
        ctypes.c_size_t,
        ctypes.c_int,
    ]
    # dir, rows' base, row bytes, row numbers, how many, threads.
    pass_args = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_long),
        ctypes.c_size_t,
        ctypes.c_int,
    ]
    lib.raw_publish_pass.restype = ctypes.c_double
    lib.raw_publish_pass.argtypes = pass_args
    lib.raw_pass.restype = ctypes.c_double
    lib.raw_pass.argtypes = pass_args + [ctypes.c_int]  # and load or store
    return lib, None




def read_tier_files(
    raw_lib, directory: str, primary: np.ndarray, n_rows: int, drop: bool, threads: int
) -> float | None:
    """Seconds for raw O_DIRECT reads of the block files kvtier left in
    `directory` into the destination rows (oldest file first, as kvtier
    loads them in store order) on `threads` threads, the page cache dropped
    first; None if they are not one file per row."""
    files = sorted(Path(directory).rglob("*.kvb"), key=lambda f: (f.stat().st_mtime_ns, f.name))
    row = primary.shape[1]
    if len(files) != n_rows or files[0].stat().st_size < row:
        return None
    # 0 when the header is the file's extended attribute (block_header).
    header = files[0].stat().st_size - row
    paths = (ctypes.c_char_p * n_rows)(*[str(f).encode() for f in files])
    rows = np.arange(n_rows, 2 * n_rows, dtype=np.int64)
    drop_caches(drop)
    secs = raw_lib.raw_read_files(
        paths,
        header,
        ctypes.c_void_p(primary.ctypes.data),
        row,
        rows.ctypes.data_as(ctypes.POINTER(ctypes.c_long)),
        n_rows,
        threads,
    )
    if secs < 0:
        raise OSError(int(-secs), os.strerror(int(-secs)))
    return secs
