"""Benchmark: kvtier through the vLLM adapter vs the C API, in one process.

    cargo build --release --lib
    KVTIER_LIBRARY=target/release/libkvtier.so \
        /path/to/vllm-venv/bin/python python/bench/bench_adapter.py [--quick] [--json]

(``--lib``: a build with ``--all-targets`` leaves a library with the test
seams compiled in, as the tests' dev-dependency turns them on.)

1. Bandwidth, 2 MiB rows in 16-row jobs, `--window` jobs in flight:
   - "C API": the library's functions called directly through ctypes with
     pre-packed arguments (tier_submit_* / tier_wait / tier_poll_finished);
   - "adapter": KVTierSecondaryTier.submit_store / submit_load with vLLM
     TransferJob objects (int32 chunk_ids, as vLLM passes them) and
     get_finished_jobs(), which builds vLLM JobResults.
   Both drivers block in tier_wait when their window is full (a scheduler does
   not spin either), use separate tiers over the same primary buffer, and
   run back to back in each repetition (ABBA order, flipped every time) so
   both see the same machine. Every store starts from a cleared tier (fresh
   copies, warm arena). Medians of --repeat runs; the ratio adapter/C is taken
   per repetition, and its median reported.
2. Lookup cost per key from Python: the adapter's lookup() (with its presence
   mirror, and without) beside vLLM's ExampleSecondaryTierManager.lookup (a
   dict lookup) and FileSystemTierManager.lookup (cached verdicts) on the same
   keys (half present), in rotating order per rep, plus the binding's own
   calls for reference.
3. Per-call overhead of the binding's methods.

Not a test: the machine is noisy (2 cores); read the min/max columns.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kvtier  # noqa: E402
from kvtier import _lib  # noqa: E402

RESULT_SIZE = ctypes.sizeof(_lib.tier_job_result_t)

try:
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob
    from vllm.v1.kv_offload.tiering.example.manager import ExampleSecondaryTierManager

    from kvtier.vllm import KVTierSecondaryTier
except Exception as exc:  # pragma: no cover
    sys.exit(f"bench_adapter.py needs vLLM 0.33 importable: {exc!r}")

ROW = 2 << 20
KEY_LEN = 36


def key(n: int) -> bytes:
    return make_offload_key(n.to_bytes(32, "big"), 0)


def median_min_max(xs):
    return statistics.median(xs), min(xs), max(xs)


class CDriver:
    """The C API in a tight loop: arguments packed before the clock starts."""

    def __init__(self, primary: np.ndarray, capacity: int, io_threads: int):
        lib = _lib.lib
        cfg = lib.tier_config_new()
        for k, v in (("capacity_bytes", str(capacity)), ("io_threads", str(io_threads))):
            assert lib.tier_config_set(cfg, k.encode(), v.encode()) == 0, _lib.last_error()
        out = ctypes.c_void_p()
        st = lib.tier_new(cfg, primary.ctypes.data, primary.nbytes, ROW, ctypes.byref(out))
        lib.tier_config_free(cfg)
        assert st == 0, _lib.last_error()
        self.lib, self.h = lib, out.value
        self.results = (_lib.tier_job_result_t * 256)()
        self.got = ctypes.c_size_t()

    def pack(self, jobs):
        return [
            (b"".join(ks), np.asarray(rows, dtype=np.int64), len(ks)) for ks, rows in jobs
        ]

    def run(self, packed, load: bool, window: int) -> float:
        lib, h = self.lib, self.h
        submit = lib.tier_submit_load if load else lib.tier_submit_store
        ptrs = [(k, ids.ctypes.data, n) for k, ids, n in packed]
        total = len(ptrs)
        t0 = time.perf_counter()
        nxt = done = inflight = 0
        while done < total:
            while inflight < window and nxt < total:
                k, ids, n = ptrs[nxt]
                st = submit(h, nxt, k, KEY_LEN, ids, n)
                assert st == 0, _lib.last_error()
                nxt += 1
                inflight += 1
            lib.tier_wait(h, 1000)
            lib.tier_poll_finished(h, self.results, RESULT_SIZE, 256, ctypes.byref(self.got))
            for r in self.results[: self.got.value]:
                assert r.status == 0, r.status
            done += self.got.value
            inflight -= self.got.value
        return time.perf_counter() - t0

    def clear(self):
        self.lib.tier_clear(self.h)

    def close(self):
        self.lib.tier_free(self.h)


class AdapterDriver:
    def __init__(self, primary: np.ndarray, capacity: int, io_threads: int):
        self.tier = KVTierSecondaryTier(
            offloading_spec=SimpleNamespace(kv_events_config=None),
            primary_kv_view=memoryview(primary),
            tier_type="KVTierSecondaryTier",
            capacity_bytes=capacity,
            io_threads=io_threads,
        )
        self.ctx = ReqContext("bench")

    def pack(self, jobs, load: bool):
        return [
            TransferJob(
                job_id=j,
                keys=list(ks),
                chunk_ids=np.asarray(rows, dtype=np.int32),
                is_promotion=load,
                req_context=self.ctx,
            )
            for j, (ks, rows) in enumerate(jobs)
        ]

    def run(self, transfer_jobs, load: bool, window: int) -> float:
        tier = self.tier
        submit = tier.submit_load if load else tier.submit_store
        wait = tier._tier.wait  # the adapter has no blocking call; vLLM steps instead
        total = len(transfer_jobs)
        t0 = time.perf_counter()
        nxt = done = inflight = 0
        while done < total:
            while inflight < window and nxt < total:
                submit(transfer_jobs[nxt])
                nxt += 1
                inflight += 1
            wait(1.0)
            results = tier.get_finished_jobs()
            for r in results:
                assert r.success, r
            done += len(results)
            inflight -= len(results)
        return time.perf_counter() - t0

    def clear(self):
        self.tier._tier.clear()

    def close(self):
        self.tier.shutdown()


def bandwidth(args) -> dict:
    n_rows = args.rows
    jr = args.job_rows
    primary = np.empty((2 * n_rows, ROW), dtype=np.uint8)
    # Distinct, cheap-to-make contents per source row; destination rows faulted in.
    primary[:n_rows] = (np.arange(n_rows, dtype=np.uint64)[:, None] * 2654435761 % 251).astype(np.uint8)
    primary[:n_rows, ::4096] = np.arange(ROW // 4096, dtype=np.uint8)[None, :]
    primary[n_rows:] = 0
    capacity = n_rows * ROW
    store_jobs = [
        ([key(j * jr + i) for i in range(jr)], [j * jr + i for i in range(jr)])
        for j in range(n_rows // jr)
    ]
    load_jobs = [(ks, [n_rows + r for r in rows]) for ks, rows in store_jobs]
    total_bytes = (n_rows // jr) * jr * ROW

    c = CDriver(primary, capacity, args.io_threads)
    a = AdapterDriver(primary, capacity, args.io_threads)
    c_store, c_load = c.pack(store_jobs), c.pack(load_jobs)
    a_store, a_load = a.pack(store_jobs, False), a.pack(load_jobs, True)
    times = {"c_store": [], "c_load": [], "a_store": [], "a_load": []}
    ratios = {"store": [], "load": []}

    # Warm-up: the first store faults each tier's arena in.
    for d, s in ((c, c_store), (a, a_store)):
        d.run(s, False, args.window)
    # Each repetition times both drivers back to back (ABBA order, flipped
    # every repetition) so that both see the same machine; the ratio is taken
    # per repetition, then its median.
    for rep in range(args.repeat):
        pair = [("c", c, c_store, c_load), ("a", a, a_store, a_load)]
        if rep % 2:
            pair.reverse()
        for name, d, s, _ in pair:
            d.clear()
            times[f"{name}_store"].append(d.run(s, False, args.window))
        for name, d, _, l in reversed(pair):
            times[f"{name}_load"].append(d.run(l, True, args.window))
        for k in ("store", "load"):
            ratios[k].append(times[f"c_{k}"][-1] / times[f"a_{k}"][-1])
        print(
            f"  rep {rep + 1}/{args.repeat} GB/s: "
            + "  ".join(f"{k} {total_bytes / v[-1] / 1e9:5.2f}" for k, v in times.items()),
            file=sys.stderr,
        )

    # Untimed check: the last loads (either driver) put the source bytes back.
    for name, d, _, l in (("C API", c, None, c_load), ("adapter", a, None, a_load)):
        primary[n_rows:] = 0
        d.run(l, True, args.window)
        assert np.array_equal(primary[n_rows:], primary[:n_rows]), f"{name}: bytes differ"
    c.close()
    a.close()

    out = {}
    for k, ts in times.items():
        gbps = [total_bytes / t / 1e9 for t in ts]
        out[k] = median_min_max(gbps)
    out["store_ratio"] = median_min_max(ratios["store"])
    out["load_ratio"] = median_min_max(ratios["load"])
    out["bytes_per_rep"] = total_bytes
    return out


def per_key_ns(fn, items, reps: int) -> tuple[float, float, float]:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for x in items:
            fn(x)
        samples.append((time.perf_counter_ns() - t0) / len(items))
    return median_min_max(samples)


def fs_tier(view: memoryview, root: str):
    """vLLM's own FileSystemTierManager over `view`, with the smallest
    offloading spec its FileMapper accepts (one group, TP1)."""
    from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

    config = SimpleNamespace(
        groups=[SimpleNamespace(tokens_per_block=16, layer_names=["layer0"])],
        parallel=SimpleNamespace(
            tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, rank=0, is_parallelism_agnostic=False
        ),
        canonical_layout=False,
        kv_cache_layout=None,
        replicated_layout=False,
        model=SimpleNamespace(name="bench/model", dtype="bfloat16"),
        cache=SimpleNamespace(tokens_per_hash=16),
    )
    spec = SimpleNamespace(
        config=config,
        blocks_per_chunk=1,
        kv_events_config=SimpleNamespace(enable_kv_cache_events=False, self_describing_kv_events=False),
    )
    return FileSystemTierManager(
        offloading_spec=spec, primary_kv_view=view, tier_type="fs", root_dir=root,
        n_read_threads=1, n_write_threads=1,
    )


def lookup_costs(args) -> dict:
    """Per-key lookup through each tier's lookup(key, req_context), as vLLM's
    manager calls it, over the same keys (half present), in one process:
    kvtier's adapter (its presence mirror, the default, and without it: one
    library call per key), vLLM's example tier (a dict) and vLLM's fs tier
    (verdicts cached by its async lookup manager: the steady state of a
    request that waits for more than one step). Each rep times every tier
    once, in an order that rotates, and the ratio to each peer is taken per
    rep (then its median)."""
    import tempfile

    from vllm.v1.kv_offload.base import LookupResult
    from vllm.v1.kv_offload.base import ScheduleEndContext

    import mmap

    rows = 64
    # Page-aligned rows (an anonymous mapping): vLLM's fs tier uses O_DIRECT.
    arena = mmap.mmap(-1, rows * 4096)
    primary = np.frombuffer(arena, dtype=np.uint8).reshape(rows, 4096)
    view = memoryview(primary)
    n = args.lookup_keys
    present = [key(i) for i in range(1000)]
    absent = [key(10**6 + i) for i in range(1000)]
    probe = (present + absent) * max(1, n // 2000)
    ctx = ReqContext("bench")

    def store_all(tier):
        for j in range(0, 1000, 50):
            ks = present[j : j + 50]
            tier.submit_store(TransferJob(j, ks, np.arange(50, dtype=np.int32) % rows, False, ctx))
        tier.drain_jobs()
        assert all(r.success for r in tier.get_finished_jobs())

    def adapter(**extra):
        t = KVTierSecondaryTier(
            offloading_spec=SimpleNamespace(kv_events_config=None),
            primary_kv_view=view,
            tier_type="KVTierSecondaryTier",
            capacity_bytes=2000 * 4096,
            io_threads=1,
            **extra,
        )
        store_all(t)
        return t

    mirrored = adapter()
    unmirrored = adapter(lookup_mirror=False)
    example = ExampleSecondaryTierManager(
        offloading_spec=SimpleNamespace(), primary_kv_view=view, tier_type="example"
    )
    example.chunks.update(dict.fromkeys(present, True))
    root = tempfile.mkdtemp(prefix="kvtier-bench-fs-")
    fs = fs_tier(view, root)
    store_all(fs)
    # fs answers RETRY until its lookup thread has checked a key: steps of
    # lookups and on_schedule_end (which posts the batch) until none is RETRY.
    deadline = time.monotonic() + 30
    while [fs.lookup(k, ctx) for k in present + absent].count(LookupResult.RETRY):
        assert time.monotonic() < deadline, "fs lookups never resolved"
        fs.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
        time.sleep(0.05)

    for t in (mirrored, unmirrored, example, fs):
        assert t.lookup(present[0], ctx) is LookupResult.HIT, t
        assert t.lookup(absent[0], ctx) is LookupResult.MISS, t

    tiers = {
        "adapter.lookup (mirror)": mirrored.lookup,
        "adapter.lookup (lookup_mirror=false)": unmirrored.lookup,
        "example.lookup": example.lookup,
        "fs.lookup (cached verdicts)": fs.lookup,
    }
    samples: dict[str, list[float]] = {name: [] for name in tiers}
    names = list(tiers)
    for rep in range(args.repeat):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            fn = tiers[name]
            t0 = time.perf_counter_ns()
            for k in probe:
                fn(k, ctx)
            samples[name].append((time.perf_counter_ns() - t0) / len(probe))
    res = {name: median_min_max(v) for name, v in samples.items()}
    mine = samples["adapter.lookup (mirror)"]
    for peer in ("example.lookup", "fs.lookup (cached verdicts)"):
        ratios = [a / b for a, b in zip(mine, samples[peer])]
        res[f"ratio adapter(mirror)/{peer.split('.')[0]}"] = median_min_max(ratios)
    t = mirrored._tier
    res["Tier.lookup_one"] = per_key_ns(t.lookup_one, probe, args.repeat)
    # Batched: 64 keys per call, cost per key.
    batches = [probe[i : i + 64] for i in range(0, len(probe), 64)]
    m = per_key_ns(t.lookup, batches, args.repeat)
    res["Tier.lookup(64 keys), per key"] = tuple(x / 64 for x in m)
    # Empty loop: what the harness itself costs per key.
    res["(loop + lambda only)"] = per_key_ns(lambda k: None, probe, args.repeat)
    res["mirror"] = mirrored.stats_mirror()
    assert res["mirror"]["library_lookups"] == 0, res["mirror"]  # all answered by the mirror
    mirrored.shutdown()
    unmirrored.shutdown()
    fs.shutdown()
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return res


def call_overheads(args) -> dict:
    primary = np.zeros((16, 4096), dtype=np.uint8)
    res = {}
    with kvtier.Tier(primary, capacity_bytes="1MiB", io_threads=1) as t:
        k1 = [key(1)]
        k16 = [key(i) for i in range(16)]
        ids16 = np.arange(16, dtype=np.int32)
        t.submit_store(0, k16, np.arange(16))
        t.drain()
        t.poll()
        out = ctypes.c_uint8()
        raw = _lib.lib.tier_lookup
        h = t._handle
        kb = key(1)
        ids16_list = list(range(16))

        def timeit(fn, n=20000):
            samples = []
            for _ in range(args.repeat):
                t0 = time.perf_counter_ns()
                for _ in range(n):
                    fn()
                samples.append((time.perf_counter_ns() - t0) / n)
            return median_min_max(samples)

        res["raw ctypes tier_lookup, argtypes (1 key)"] = timeit(lambda: raw(h, kb, 36, 1, ctypes.byref(out)))
        res["Tier.lookup_one"] = timeit(lambda: t.lookup_one(kb))
        res["Tier.lookup([1 key])"] = timeit(lambda: t.lookup(k1))
        res["Tier.lookup([16 keys])"] = timeit(lambda: t.lookup(k16))
        res["Tier.touch([16 keys])"] = timeit(lambda: t.touch(k16))
        res["Tier.poll() (nothing ready)"] = timeit(lambda: t.poll())
        res["Tier.stats()"] = timeit(lambda: t.stats())
        job = iter(range(1, 10**9))

        def submit_poll(ids):
            t.submit_load(next(job), k16, ids)
            t.wait(1.0)
            assert len(t.poll()) == 1

        res["submit_load(16, int32 ndarray)+wait+poll"] = timeit(lambda: submit_poll(ids16), 5000)
        res["submit_load(16, list)+wait+poll"] = timeit(lambda: submit_poll(ids16_list), 5000)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=256, help="source rows of 2 MiB (default 256 = 512 MiB)")
    p.add_argument("--job-rows", type=int, default=16)
    p.add_argument("--io-threads", type=int, default=2)
    p.add_argument("--window", type=int, default=4, help="jobs in flight (default 2 x io_threads)")
    p.add_argument("--repeat", type=int, default=25)
    p.add_argument("--lookup-keys", type=int, default=200_000)
    p.add_argument("--quick", action="store_true", help="small and fast (smoke test)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--lookup-only", action="store_true", help="only section 2 (lookup cost per key)")
    args = p.parse_args()
    if args.quick:
        args.rows, args.repeat, args.lookup_keys = 64, 3, 20_000

    print(
        f"kvtier {kvtier.library_version()} ({kvtier.library_path}); "
        f"{args.rows} x 2 MiB rows, {args.job_rows}-row jobs, window {args.window}, "
        f"io_threads {args.io_threads}, {args.repeat} reps",
        file=sys.stderr,
    )
    if args.lookup_only:
        lk = lookup_costs(args)
        if args.json:
            print(json.dumps({"lookup_ns": lk}, indent=1))
        else:
            print_lookups(lk)
        return
    bw = bandwidth(args)
    lk = lookup_costs(args)
    ov = call_overheads(args)
    if args.json:
        print(json.dumps({"bandwidth": bw, "lookup_ns": lk, "call_ns": ov}, indent=1))
        return

    print(f"\nBandwidth, GB/s (10^9 B/s), {bw['bytes_per_rep'] / 2**30:.2f} GiB per rep: median [min, max]")
    for label, k in (("store", "store"), ("load", "load")):
        c, a = bw[f"c_{k}"], bw[f"a_{k}"]
        print(
            f"  {label:5}  C API {c[0]:6.2f} [{c[1]:.2f}, {c[2]:.2f}]   "
            f"adapter {a[0]:6.2f} [{a[1]:.2f}, {a[2]:.2f}]   "
            f"ratio adapter/C {bw[f'{k}_ratio'][0]:.3f} [{bw[f'{k}_ratio'][1]:.2f}, {bw[f'{k}_ratio'][2]:.2f}]"
        )
    print_lookups(lk)
    print("\nBinding call overhead, ns per call: median [min, max]")
    for name, v in ov.items():
        print(f"  {name:42} {v[0]:8.0f} [{v[1]:.0f}, {v[2]:.0f}]")


def print_lookups(lk: dict) -> None:
    print("\nLookup, ns per key (half present), each tier's lookup(key, ctx): median [min, max]")
    for name, v in lk.items():
        if isinstance(v, tuple) and not name.startswith("ratio"):
            print(f"  {name:40} {v[0]:8.0f} [{v[1]:.0f}, {v[2]:.0f}]")
    for name, v in lk.items():
        if name.startswith("ratio"):
            print(f"  {name:40} {v[0]:8.2f} [{v[1]:.2f}, {v[2]:.2f}]  (per-rep ratio)")
    m = lk["mirror"]
    print(
        f"  (mirror: {m['mirror_lookups']} answers, {m['library_lookups']} library lookups, "
        f"complete={m['complete']})"
    )


if __name__ == "__main__":
    main()
