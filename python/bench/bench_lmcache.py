"""Benchmark: kvtier's LMCache L2 adapter against LMCache's own adapters,
with LMCache's own bench (``lmcache bench l2``), and kvtier's memory backend
against a plain memcpy of the same objects in one process.

    cargo build --release --lib
    KVTIER_LIBRARY=target/release/libkvtier.so \\
        <engines venv>/bin/python python/bench/bench_lmcache.py [--reps 3] [--dir D] [--only redis,disk,memory]

Runs, per object size (2 MiB and 64 KiB), ``--reps`` repetitions, the
contenders' order alternating every repetition, each a fresh process of
``lmcache bench l2 --in-flight 4 --num-keys 32`` (one warm-up and
``--rounds`` measured rounds of 128 objects):

- redis: ``kvtier`` (the plugin, ``backend=redis``) and LMCache's ``resp``
  on one redis-server of this script's (loopback, no persistence), emptied
  with FLUSHALL before every run; store, then load.
- disk: ``kvtier`` (``backend=disk``) and LMCache's ``fs_native``, each in a
  fresh directory under ``--dir``; store and load are separate processes
  (``--only store``, then ``--only load``, which reuse the same keys) and the
  page cache is dropped before each (``sync; echo 3 >
  /proc/sys/vm/drop_caches``; the script refuses to run the disk pair where
  that file is not writable, as the figures would be the page cache's).
  Both get 4 KiB-aligned L1 objects (``--l1-align-bytes 4096``).
- memory: in this process, kvtier's memory backend loads 4 tasks of 32
  objects into LMCache-style L1 objects, alternated with a single-threaded
  ``ctypes.memmove`` of the same bytes into the same objects (the bound).
  A repetition is ``--memory-rounds`` such rounds back to back, each
  waiting for its 4 tasks (default 1, the measure the issue's targets were
  first reported with; over many rounds memmove's 16 MiB at 64 KiB stay in
  the cache and it copies at twice the rate of one round, while kvtier's
  rate does not change: docs/runs/2026-12-07-lmcache.md, run 5).

Every run is printed with ``uptime``'s load average, then the medians and
their ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES_KB = (2048, 64)
IN_FLIGHT = 4
NUM_KEYS = 32
DROP = Path("/proc/sys/vm/drop_caches")


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    DROP.write_text("3\n")


def plugin(params: dict) -> dict:
    return {"type": "plugin", "module_path": "kvtier.lmcache", "class_name": "KVTierL2Adapter",
            "adapter_params": params}


def lmcache_bench(spec: dict, size_kb: int, rounds: int, only: str | None = None,
                  align: int = 1) -> dict[str, dict]:
    """One ``lmcache bench l2`` process; its ops by name (Store, Load...)."""
    lmcache = shutil.which("lmcache", path=str(Path(sys.executable).parent)) or "lmcache"
    cmd = [lmcache, "bench", "l2", "--l2-adapter", json.dumps(spec), "--data-size-kb", str(size_kb),
           "--in-flight", str(IN_FLIGHT), "--num-keys", str(NUM_KEYS), "--rounds", str(rounds),
           "--l1-align-bytes", str(align), "--format", "json"]
    if only:
        cmd += ["--only", only]
    env = dict(os.environ, LMCACHE_DISABLE_BANNER="1", PYTHONPATH=str(HERE.parent))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    out = proc.stdout
    start = out.find("\n{")
    if proc.returncode != 0 or start < 0:
        raise SystemExit(f"lmcache bench failed ({proc.returncode}): {' '.join(cmd)}\n{out}\n{proc.stderr}")
    metrics = json.JSONDecoder().raw_decode(out[start:].lstrip())[0]["metrics"]
    ops = {v["operation"]: v for k, v in metrics.items() if k.startswith("op_")}
    for name, op in ops.items():
        if name != "Lookup" and op["total_success"] != op["total_keys"]:
            raise SystemExit(f"{name}: {op['total_success']}/{op['total_keys']} keys succeeded: {' '.join(cmd)}")
    return ops


class Redis:
    def __init__(self, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(self.port), "PING"], capture_output=True,
                             text=True).stdout.strip() != "PONG":
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def flush(self) -> None:
        subprocess.run(["redis-cli", "-p", str(self.port), "FLUSHALL"], check=True, capture_output=True)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run_redis(redis: Redis, size_kb: int, rounds: int, order: list[str]) -> dict[str, tuple[float, float]]:
    specs = {
        "kvtier": plugin({"block_bytes": size_kb * 1024, "backend": "redis",
                          "url": f"redis://127.0.0.1:{redis.port}", "capacity_bytes": "8GiB"}),
        "resp": {"type": "resp", "host": "127.0.0.1", "port": redis.port},
    }
    out = {}
    for name in order:
        redis.flush()
        ops = lmcache_bench(specs[name], size_kb, rounds)
        out[name] = (ops["Store"]["throughput_avg_mbps"], ops["Load"]["throughput_avg_mbps"])
        print(f"  redis {size_kb:>4} KiB {name:>9}: store {out[name][0]:8.1f} MB/s  load "
              f"{out[name][1]:8.1f} MB/s  (load average {load_average()})", flush=True)
    return out


def run_disk(base: Path, size_kb: int, rounds: int, order: list[str]) -> dict[str, tuple[float, float]]:
    out = {}
    for name in order:
        path = base / f"{name}-{size_kb}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        if name == "kvtier":
            spec = plugin({"block_bytes": size_kb * 1024, "backend": "disk", "path": str(path / "kv"),
                           "capacity_bytes": "16GiB"})
        else:
            spec = {"type": "fs_native", "base_path": str(path)}
        drop_caches()
        store = lmcache_bench(spec, size_kb, rounds, only="store", align=4096)["Store"]
        drop_caches()
        load = lmcache_bench(spec, size_kb, rounds, only="load", align=4096)["Load"]
        out[name] = (store["throughput_avg_mbps"], load["throughput_avg_mbps"])
        print(f"  disk  {size_kb:>4} KiB {name:>9}: store {out[name][0]:8.1f} MB/s  load "
              f"{out[name][1]:8.1f} MB/s  (load average {load_average()})", flush=True)
        shutil.rmtree(path, ignore_errors=True)
    return out


def run_memory(size_kb: int, reps: int, rounds: int) -> list[tuple[float, float]]:
    """(kvtier load MB/s, memmove MB/s) per repetition of ``rounds`` rounds
    each, alternated in one process."""
    import ctypes

    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE.parent / "tests"))
    from lmcache_helpers import Arena, key, store, wait_fd

    size = size_kb * 1024
    n = IN_FLIGHT * NUM_KEYS
    arena = Arena(2 * n * size)
    from lmcache_helpers import make_adapter

    adapter = make_adapter(arena, block_bytes=size, backend="memory", capacity_bytes=2 * n * size,
                           prefault="full")
    try:
        src = [arena.obj(i * size, size) for i in range(n)]
        dst = [arena.obj((n + i) * size, size) for i in range(n)]
        keys = [key(i) for i in range(n)]
        for i, o in enumerate(src):
            o.raw_data.fill_(i & 0xFF)
        for b in range(IN_FLIGHT):
            part = slice(b * NUM_KEYS, (b + 1) * NUM_KEYS)
            assert store(adapter, keys[part], src[part]).is_successful()
        pairs = [(d.data_ptr, s.data_ptr) for d, s in zip(dst, src)]
        fd = adapter.get_load_event_fd()

        def kvtier_load() -> float:
            start = time.perf_counter()
            for _ in range(rounds):
                kvtier_round()
            return rounds * n * size / (time.perf_counter() - start) / 1e6

        def kvtier_round() -> None:
            tasks = [adapter.submit_load_task(keys[b * NUM_KEYS:(b + 1) * NUM_KEYS],
                                              dst[b * NUM_KEYS:(b + 1) * NUM_KEYS]) for b in range(IN_FLIGHT)]
            pending = set(tasks)
            while pending:
                for t in list(pending):
                    bitmap = adapter.query_load_result(t)
                    if bitmap is not None:
                        assert all(bitmap.test(i) for i in range(NUM_KEYS)), "a load missed"
                        pending.discard(t)
                if pending:
                    poller = select.poll()
                    poller.register(fd, select.POLLIN)
                    poller.poll(1000)
                    wait_fd(fd, 0)

        def memmove() -> float:
            start = time.perf_counter()
            for _ in range(rounds):
                for d, s in pairs:
                    ctypes.memmove(d, s, size)
            return rounds * n * size / (time.perf_counter() - start) / 1e6

        kvtier_load()
        memmove()  # warm both (page faults of the destination)
        runs = []
        for rep in range(reps):
            first, second = (kvtier_load, memmove) if rep % 2 == 0 else (memmove, kvtier_load)
            a = first()
            b = second()
            kv, mm = (a, b) if first is kvtier_load else (b, a)
            runs.append((kv, mm))
            print(f"  memory {size_kb:>4} KiB rep {rep} ({rounds} rounds): kvtier load {kv:8.1f} MB/s"
                  f"  memmove {mm:8.1f} MB/s  ratio {kv / mm:.2f}  (load average {load_average()})", flush=True)
        return runs
    finally:
        adapter.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="measured rounds per bench run")
    ap.add_argument("--memory-rounds", type=int, default=1,
                    help="rounds per memory repetition (more: memmove's objects stay in the cache)")
    ap.add_argument("--dir", type=Path, default=None, help="disk runs' directory (default: under /var/tmp)")
    ap.add_argument("--only", default="redis,disk,memory")
    args = ap.parse_args()
    which = set(args.only.split(","))
    if "disk" in which and not os.access(DROP, os.W_OK):
        raise SystemExit(f"{DROP} is not writable: the disk pair needs the page cache dropped (run as root)")
    work = Path(tempfile.mkdtemp(prefix="kvtier-lmcache-bench-", dir=args.dir or "/var/tmp"))
    summary: list[str] = []
    try:
        for size_kb in SIZES_KB:
            if "redis" in which:
                redis = Redis(work)
                try:
                    runs = [run_redis(redis, size_kb, args.rounds, ["kvtier", "resp"][:: 1 if r % 2 == 0 else -1])
                            for r in range(args.reps)]
                finally:
                    redis.close()
                summary += ratios("redis", size_kb, runs, "resp", 1.2)
            if "disk" in which:
                runs = [run_disk(work, size_kb, args.rounds, ["kvtier", "fs_native"][:: 1 if r % 2 == 0 else -1])
                        for r in range(args.reps)]
                summary += ratios("disk", size_kb, runs, "fs_native", 1.0)
            if "memory" in which:
                mem = run_memory(size_kb, args.reps, max(1, args.memory_rounds))
                kv = statistics.median(r[0] for r in mem)
                mm = statistics.median(r[1] for r in mem)
                summary.append(f"memory {size_kb:>4} KiB: kvtier load {kv:.1f} MB/s, memmove {mm:.1f} MB/s, "
                               f"ratio {kv / mm:.2f} (target >= 0.8)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\nmedians of", args.reps)
    for line in summary:
        print(line)


def ratios(kind: str, size_kb: int, runs: list[dict[str, tuple[float, float]]], other: str,
           target: float) -> list[str]:
    lines = []
    for phase, idx in (("store", 0), ("load", 1)):
        kv = statistics.median(r["kvtier"][idx] for r in runs)
        them = statistics.median(r[other][idx] for r in runs)
        lines.append(f"{kind:<6} {size_kb:>4} KiB {phase:<5}: kvtier {kv:.1f} MB/s, {other} {them:.1f} MB/s, "
                     f"ratio {kv / them:.2f} (target >= {target})")
    return lines


if __name__ == "__main__":
    main()
