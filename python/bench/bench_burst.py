"""Benchmark: bursts of jobs submitted at once, as an engine submits a step's
loads and stores together and then waits for all of them.

    python3 python/bench/bench_burst.py --url redis://127.0.0.1:PORT \\
        [--library A.so --library B.so] [--jobs 8] [--blocks 16] [--kib 64]

Each burst submits ``--jobs`` jobs of ``--blocks`` blocks, then polls (and
waits in ``tier_wait``) until every one is reported. Loads read back blocks
stored once before the clock starts; stores go to new keys every burst (a
tier skips keys it holds) into a tier of four bursts' capacity, so each
evicts as many blocks as it stores. Prints the median burst time and the payload
rate per direction, for each library given (``--library`` more than once:
they run in turns, ABAB..., each in a subprocess of its own, so that two
builds are compared on the same machine state). Without ``--url`` the tier
is the memory backend.

A Redis job is one task (its blocks travel in one pipeline), so a burst of
them is where the workers' wake-ups show: a burst queued while one worker
polls must wake the sleeping ones (the runs: docs/runs/redis.md).

Not a test: the machine is noisy; run it more than once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run_one(args: argparse.Namespace) -> None:
    sys.path.insert(0, os.path.join(HERE, ".."))
    import kvtier

    block = args.kib << 10
    rows = args.jobs * args.blocks
    buffer = bytearray(block * rows)
    for i in range(rows):
        buffer[i * block] = i % 251
    # Room for four bursts: stores into a full tier, as an engine's cascades are.
    config = {"capacity_bytes": block * rows * 4}
    if args.url:
        config.update(backend="redis", url=args.url, key_prefix=f"burst{os.getpid()}")
    tier = kvtier.Tier(buffer, block_bytes=block, **config)
    next_job = 0

    def keys_of(burst: int, job: int) -> list[bytes]:
        return [b"%08d-%08d-%08d" % (burst, job, b) for b in range(args.blocks)]

    def burst(kind: str, generation: int) -> float:
        nonlocal next_job
        submit = tier.submit_store if kind == "store" else tier.submit_load
        started = time.perf_counter()
        for j in range(args.jobs):
            next_job += 1
            submit(next_job, keys_of(generation, j), range(j * args.blocks, (j + 1) * args.blocks))
        done = 0
        while done < args.jobs:
            results = tier.poll()
            for r in results:
                if r.status != 0:
                    raise SystemExit(f"job {r.job_id} failed: status {r.status}")
            done += len(results)
            if not results:
                tier.wait(0.01)
        return time.perf_counter() - started

    burst("store", 0)
    payload = args.jobs * args.blocks * block
    for kind in ("load", "store"):
        times = [burst(kind, 0 if kind == "load" else g + 1) for g in range(args.bursts)]
        median = statistics.median(times)
        print(
            f"  {kind:5} burst of {args.jobs} x {args.blocks} x {args.kib} KiB: "
            f"median {median * 1e3:.2f} ms, {payload / median / 1e9:.2f} GB/s "
            f"[min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f} ms]"
        )
    tier.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a Redis server (else the memory backend)")
    p.add_argument("--library", action="append", help="libkvtier.so to load (repeatable)")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--blocks", type=int, default=16)
    p.add_argument("--kib", type=int, default=64)
    p.add_argument("--bursts", type=int, default=300)
    p.add_argument("--turns", type=int, default=3, help="turns per library")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        run_one(args)
        return
    libraries = args.library or [os.environ.get("KVTIER_LIBRARY", "")]
    passed = [f"--jobs={args.jobs}", f"--blocks={args.blocks}", f"--kib={args.kib}"]
    passed.append(f"--bursts={args.bursts}")
    if args.url:
        passed.append(f"--url={args.url}")
    for turn in range(args.turns):
        for lib in libraries:
            env = dict(os.environ)
            if lib:
                env["KVTIER_LIBRARY"] = lib
            print(f"turn {turn + 1}, {lib or 'default library'}:", flush=True)
            subprocess.run([sys.executable, __file__, "--one", *passed], env=env, check=True)


if __name__ == "__main__":
    main()
