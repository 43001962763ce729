"""How much of each round the Redis server is busy, under kvtier's LMCache
adapter and under LMCache's ``resp`` adapter: whether 1.2x ``resp`` can
exist on this machine (docs/runs/2026-12-07-lmcache.md, run 3).

    KVTIER_LIBRARY=target/release/libkvtier.so <engines venv>/bin/python \\
        python/bench/lmcache_server_share.py SIZE_KB ROUNDS REPS

In one process, both adapters built by LMCache's factory over one L1 arena,
on one redis-server of bench_lmcache.py's (FLUSHALL before each contender):
rounds of 4 tasks x 32 objects as ``lmcache bench l2 --in-flight 4
--num-keys 32`` runs them, store rounds then load rounds, one warm-up each.
Per round: MB/s of the median round, the server's CPU (utime+stime of its
/proc/PID/stat, 10 ms ticks: use enough rounds) against the wall time, and
this process's CPU (all its threads). The contenders alternate.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "tests")]

import bench_lmcache as bench  # noqa: E402
from lmcache.v1.distributed.l2_adapters import create_l2_adapter  # noqa: E402
from lmcache.v1.distributed.l2_adapters.resp_l2_adapter import RESPL2AdapterConfig  # noqa: E402
from lmcache_helpers import Arena, key, make_adapter, wait_fd  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
IN_FLIGHT, NUM_KEYS = bench.IN_FLIGHT, bench.NUM_KEYS


def server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def one_round(adapter, phase: str, keys: list, objs: list) -> float:
    start = time.perf_counter()
    parts = [slice(b * NUM_KEYS, (b + 1) * NUM_KEYS) for b in range(IN_FLIGHT)]
    if phase == "store":
        tasks = {adapter.submit_store_task(keys[p], objs[p]) for p in parts}
        done: dict = {}
        while not tasks <= done.keys():
            assert wait_fd(adapter.get_store_event_fd(), 30), "store tasks never completed"
            done.update(adapter.pop_completed_store_tasks())
        assert all(r.is_successful() for r in done.values()), "a store failed"
    else:
        pending = {adapter.submit_load_task(keys[p], objs[p]) for p in parts}
        while pending:
            assert wait_fd(adapter.get_load_event_fd(), 30), "load tasks never completed"
            for task in list(pending):
                bitmap = adapter.query_load_result(task)
                if bitmap is not None:
                    assert bitmap.popcount() == NUM_KEYS, "a load missed"
                    pending.discard(task)
    return time.perf_counter() - start


def main() -> None:
    size_kb, rounds, reps = (int(a) for a in sys.argv[1:4])
    size = size_kb * 1024
    n = IN_FLIGHT * NUM_KEYS
    arena = Arena(2 * n * size)
    src = [arena.obj(i * size, size) for i in range(n)]
    dst = [arena.obj((n + i) * size, size) for i in range(n)]
    for i, obj in enumerate(src):
        obj.raw_data.fill_(i & 0xFF)
    redis = bench.Redis(Path(tempfile.mkdtemp(prefix="kvtier-share-", dir="/var/tmp")))

    def build(name: str):
        if name == "resp":
            config = RESPL2AdapterConfig.from_dict({"host": "127.0.0.1", "port": redis.port})
            return create_l2_adapter(config, l1_memory_desc=arena.desc)
        return make_adapter(arena, block_bytes=size, backend="redis",
                            url=f"redis://127.0.0.1:{redis.port}", capacity_bytes="8GiB")

    try:
        for rep in range(reps):
            for name in ["kvtier", "resp"][:: 1 if rep % 2 == 0 else -1]:
                redis.flush()
                adapter = build(name)
                line = f"  {size_kb:>4} KiB {name:>6}:"
                try:
                    for phase, objs in (("store", src), ("load", dst)):
                        one_round(adapter, phase, [key(i, model="warm") for i in range(n)], objs)
                        cpu0, srv0 = time.process_time(), server_cpu(redis.proc.pid)
                        walls = [one_round(adapter, phase, [key(i + r * n) for i in range(n)], objs)
                                 for r in range(rounds)]
                        cpu = (time.process_time() - cpu0) / rounds
                        srv = (server_cpu(redis.proc.pid) - srv0) / rounds
                        wall = statistics.median(walls)
                        line += (f" {phase} {n * size / 1e6 / wall:7.1f} MB/s server {srv * 1e3:6.1f}"
                                 f"/{wall * 1e3:6.1f} ms ({srv / wall:4.0%}) client cpu {cpu * 1e3:6.1f} ms |")
                finally:
                    adapter.close()
                print(line, f"load average {bench.load_average()}", flush=True)
    finally:
        redis.close()


if __name__ == "__main__":
    main()
