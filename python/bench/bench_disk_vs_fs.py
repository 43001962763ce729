"""Benchmark: kvtier's disk backend through the vLLM adapter, side by side with
vLLM's own file-system tier and a raw O_DIRECT bound, in one process.

    cargo build --release --lib
    KVTIER_LIBRARY=target/release/libkvtier.so \\
        "$(scripts/kvcr_env.sh)" python/bench/bench_disk_vs_fs.py [--anon] [--dir D] [--quick] [--json]

(``--lib``: a build with ``--all-targets`` leaves a library with the test
seams compiled in, as the tests' dev-dependency turns them on.)

Every tier is built as vLLM 0.33 builds it (``vllm_tiers.py``): a real
``OffloadingConfig``, ``TieringOffloadingSpec`` and its ``get_manager()``,
which maps vLLM's own primary buffer (``SharedOffloadRegion``, a fresh one
per contender and repetition) and makes the tier through
``SecondaryTierFactory`` with its defaults (nothing tuned), in a fresh
directory under ``--dir`` (default: a new one under /var/tmp, which is on
the same device as /tmp here). The raw rows do their I/O into such a
region too. ``--anon`` adds ``vllm-fs`` and ``kvtier`` over an anonymous
mapping of the bench's own, labelled ``[anon mmap]`` (what this bench
measured before). Where ``kvcr`` imports (``scripts/kvcr_env.sh``), NVIDIA's
KVCR joins as vLLM's built-in ``kvcr`` tier: ``kvcr dram`` (its local DRAM
pool) beside ``kvtier memory``, and ``kvcr g3 posix`` (its file tier, POSIX
backend, 256 DRAM slots in front that it needs; after each store pass 256
other blocks are stored untimed so that every block loaded comes from the
file) beside kvtier's disk; with the lookup cost of every tier. At the end,
the idle CPU of each kind of tier (``--idle-seconds``).

Contenders:

- ``vllm-fs``: ``{"type": "fs", "root_dir": ...}`` (16 read + 16 write
  threads, O_DIRECT, one file per block, ``vllm.fs_io_C`` when built);
- ``kvtier``: ``{"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm",
  "backend": "disk", "path": ...}``, plus ``capacity_bytes`` (which has no
  neutral default) and any ``--kvtier KEY=VALUE`` given (to try a setting);
- ``raw-N``: one O_DIRECT file per row, spread over 256 directories made
  before the clock starts, open + pwrite/pread + close, on N C threads
  (``raw_odirect.c``, built here with ``cc``; N = 4, 16, 32 and 64 by
  default, 64 being kvtier's io_threads): no checksum, no header, no
  rename. The bound is the best of the raw rows, per repetition;
- ``raw-64 publishing``: raw-64's stores, each published as kvtier
  publishes a block (a temporary name, a 56-byte header attribute, then
  rename; ``raw_publish_pass``), its loads raw-64's: not a bound (a raw
  file is not crash-safe), but what the publication itself costs the
  device, so that ``kvtier/raw publishing`` is the cost of kvtier's code;
- ``raw on kvtier's files``: after kvtier's load pass, the same raw reads
  (64 threads, O_DIRECT, header and payload in one ``preadv``, oldest file
  first) of the block files kvtier wrote in that repetition: what kvtier's
  code costs against its own files, whatever their layout (size, fan-out,
  placement) does to the device.

For each row size (2 MiB and 64 KiB by default) and repetition: every
contender stores the same source rows under fresh keys in 16-row jobs with
16 jobs in flight, then loads them back into the destination rows; the page
cache is dropped (``sync; echo 3 > /proc/sys/vm/drop_caches``, when writable)
before each pass, the contenders' order rotates every repetition, and
everything loaded is compared with the source (untimed). Both tiers are
polled the same way: ``get_finished_jobs()``, then a 100 us sleep when
nothing finished (vLLM steps its scheduler; neither tier gets a blocking
wait). GB/s = 10^9 bytes per second of payload; medians of ``--repeat``;
ratios ``kvtier/vllm-fs`` and ``kvtier/raw`` are taken per repetition, and
their medians reported. Beside the rates, each contender's CPU per GB
moved: this process's CPU time (every thread: the tier's workers, the C
threads, the polling loop both tiers share) and the whole machine's busy
time (which adds the kernel threads doing the I/O: a loop device copies
every byte on one) over the same pass. Where the device is not the limit,
that is what caps a contender.

Not a test: on a shared machine the disk and the cores are noisy; read the
min/max columns and run it again when it is quiet.
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
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import kvtier  # noqa: E402

try:
    import vllm.v1.kv_offload.tiering.spec  # noqa: F401
except Exception as exc:  # pragma: no cover
    sys.exit(f"bench_disk_vs_fs.py needs vLLM 0.33 importable: {exc!r}")
from disk_contenders import (  # noqa: E402
    JOB_ROWS,
    WINDOW,
    RawContender,
    TierContender,
    block_hash,
    build_raw,
    page_aligned_rows,
    read_tier_files,
)
from disk_vs_fs_report import SAME_FILES, print_report  # noqa: E402
from page_cache import drop_caches  # noqa: E402
from vllm_tiers import (  # noqa: E402
    G3_FRONT_SLOTS,
    idle_cpu,
    kvcr_config,
    kvcr_importable,
)

# The label of the rows over the bench's anonymous mapping, not vLLM's region.
ANON = "[anon mmap]"
# Rows over a new anonymous mapping per contender and repetition.
ANON_FRESH = "[anon fresh]"
KVCR_G3 = "kvcr g3 posix"
# kvtier's default io_threads for disk.
KVTIER_DISK_THREADS = 64
PUBLISHING = f"raw-{KVTIER_DISK_THREADS} publishing"

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> tuple[float, float, float, float]:
    """(this process's CPU seconds, all threads; the machine's busy CPU
    seconds, in clock ticks of 10 ms; the process's kernel-mode share of the
    first; its minor page faults). The second counts what the process
    cannot see: kernel threads doing its I/O (a loop device's copies, block
    completions), and any other load, so read it beside the first. The last
    two say where a buffer costs more: pinning its pages for O_DIRECT is
    kernel time, and a page touched for the first time is a fault."""
    own = resource.getrusage(resource.RUSAGE_SELF)  # microseconds, unlike os.times
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    # user, nice, system, irq, softirq: not idle, iowait, steal (the
    # hypervisor's), nor guest (already in user).
    busy = sum(ticks[i] for i in (0, 1, 2, 5, 6))
    return own.ru_utime + own.ru_stime, busy / CLOCK_TICKS, own.ru_stime, float(own.ru_minflt)


# The block device's I/O counters (/sys/dev/block/MAJ:MIN/stat) of the
# scratch directory, set by main(): requests completed tell how many device
# requests a pass's reads and writes became, which a row's physical pages
# decide (4 KiB pages merge into one request only where they are contiguous).
DEVICE_STAT: str | None = None


def device_requests() -> float:
    if DEVICE_STAT is None:
        return 0.0
    with open(DEVICE_STAT) as f:
        fields = f.read().split()
    return float(int(fields[0]) + int(fields[4]))  # reads and writes completed


def timed_pass(c, jobs: list, load: bool, cpu: dict) -> float:
    """Runs one pass; appends its CPU seconds (process, machine, process in
    the kernel), minor faults and device requests to cpu."""
    before = (*cpu_seconds(), device_requests())
    secs = c.run(jobs, load=load)
    after = (*cpu_seconds(), device_requests())
    for i, what in enumerate(("process", "machine", "process_sys", "minflt", "requests")):
        cpu.setdefault(what, []).append(after[i] - before[i])
    return secs


def stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def fill_source(buffer: np.ndarray, n_rows: int) -> None:
    """Distinct rows: the row number in every 8-byte word, plus a pattern."""
    words = buffer[:n_rows].view(np.uint64)
    words[:] = np.arange(n_rows, dtype=np.uint64)[:, None] * 0x9E3779B97F4A7C15
    words ^= np.arange(words.shape[1], dtype=np.uint64)[None, :]


def contenders_for(args, row: int, n_rows: int, raw_lib) -> list:
    kv_extra = dict(kv.split("=", 1) for kv in args.kvtier)
    kvtier_disk = {
        "type": "KVTierSecondaryTier",
        "module_path": "kvtier.vllm",
        "backend": "disk",
        "capacity_bytes": str(4 * n_rows * row),
        **kv_extra,
    }
    contenders = [TierContender("vllm-fs", {"type": "fs"}), TierContender("kvtier", kvtier_disk)]
    for variant in args.variant:
        extra = dict(kv.split("=", 1) for kv in variant.split(","))
        contenders.append(TierContender(f"kvtier[{variant}]", {**kvtier_disk, **extra}))
    if "anon" in args.primary:
        contenders += [
            TierContender(f"vllm-fs {ANON}", {"type": "fs"}, primary="anon"),
            TierContender(f"kvtier {ANON}", kvtier_disk, primary="anon"),
        ]
    if "anon-fresh" in args.primary:
        contenders += [
            TierContender(f"vllm-fs {ANON_FRESH}", {"type": "fs"}, primary="anon-fresh"),
            TierContender(f"kvtier {ANON_FRESH}", kvtier_disk, primary="anon-fresh"),
        ]
    if args.kvcr:
        kvtier_memory = {**kvtier_disk, "backend": "memory"}
        contenders += [
            TierContender("kvtier memory", kvtier_memory),
            TierContender("kvcr dram", kvcr_config(2 * n_rows, row, None)),
            TierContender(KVCR_G3, kvcr_config(2 * n_rows, row, "")),
        ]
    if raw_lib is not None:
        contenders += [RawContender(raw_lib, t) for t in args.raw_threads]
        contenders.append(RawContender(raw_lib, KVTIER_DISK_THREADS, publish=True))
    return contenders


def push_to_g3(c, row: int, rep: int, n_rows: int) -> None:
    """Stores G3_FRONT_SLOTS other blocks into KVCR, untimed, which pushes
    every block of the pass out of its G2 into its G3."""
    rows = [i % n_rows for i in range(G3_FRONT_SLOTS)]
    keys = [block_hash(row, rep, -1 - i) for i in range(G3_FRONT_SLOTS)]
    c.run([(keys[i : i + JOB_ROWS], rows[i : i + JOB_ROWS]) for i in range(0, len(rows), JOB_ROWS)], load=False)


def measure(args, row: int, n_rows: int, raw_lib, workdir: str) -> dict:
    # The anonymous mapping: the buffer of the "[anon mmap]" rows, and the
    # shape every vLLM region is made to.
    anon = page_aligned_rows(2 * n_rows, row)
    contenders = contenders_for(args, row, n_rows, raw_lib)
    times = {c.name: {"store": [], "load": []} for c in contenders}
    # CPU seconds per pass, (contender, direction) -> {"process", "machine"}.
    cpu = {(c.name, k): {} for c in contenders for k in ("store", "load")}
    lookups = {c.name: [] for c in contenders if isinstance(c, TierContender)}
    # kvtier's load and the raw read of its files, per repetition.
    same_files = []
    dropped = True
    for rep in range(args.repeat):
        # Fresh keys per repetition (nothing is skipped as already stored),
        # uniformly spread like vLLM's block hashes: the fs tier names its
        # directories after the key's first bytes.
        store_jobs = [
            (
                [block_hash(row, rep, j * JOB_ROWS + i) for i in range(JOB_ROWS)],
                [j * JOB_ROWS + i for i in range(JOB_ROWS)],
            )
            for j in range(n_rows // JOB_ROWS)
        ]
        load_jobs = [(keys, [n_rows + r for r in rows]) for keys, rows in store_jobs]
        shift = rep % len(contenders)
        for c in contenders[shift:] + contenders[:shift]:
            directory = os.path.join(workdir, f"{c.name}-{row}-{rep}".replace(" ", "_"))
            os.makedirs(directory)
            primary = c.open(directory, anon)
            try:
                fill_source(primary, n_rows)
                dropped &= drop_caches(args.drop_caches)
                times[c.name]["store"].append(timed_pass(c, store_jobs, False, cpu[c.name, "store"]))
                if c.name == KVCR_G3:
                    push_to_g3(c, row, rep, n_rows)
                primary[n_rows:] = 0
                dropped &= drop_caches(args.drop_caches)
                times[c.name]["load"].append(timed_pass(c, load_jobs, True, cpu[c.name, "load"]))
                if not np.array_equal(primary[n_rows:], primary[:n_rows]):
                    raise RuntimeError(f"{c.name}: loaded bytes differ from the stored rows")
                if c.name in lookups:
                    lookups[c.name].append(c.lookup_ns([k for keys, _ in store_jobs for k in keys]))
                if c.name == "kvtier" and raw_lib is not None:
                    secs = read_tier_files(
                        raw_lib, directory, primary, n_rows, args.drop_caches, KVTIER_DISK_THREADS
                    )
                    if secs is not None:
                        same_files.append((times[c.name]["load"][-1], secs))
            finally:
                primary = None
                c.close()
            shutil.rmtree(directory)
        line = "  ".join(
            f"{name} {n_rows * row / d['store'][-1] / 1e9:5.2f}/"
            f"{n_rows * row / d['load'][-1] / 1e9:5.2f}"
            for name, d in times.items()
        )
        print(f"  {row >> 10} KiB rep {rep + 1}/{args.repeat} store/load GB/s: {line}", file=sys.stderr)
        print(f"    {uptime()}", file=sys.stderr)

    total = n_rows * row
    out = {"row_bytes": row, "rows": n_rows, "bytes_per_pass": total, "page_cache_dropped": dropped}
    for name, d in times.items():
        out[name] = {k: stats([total / t / 1e9 for t in v]) for k, v in d.items()}
        # CPU milliseconds per GB moved: what a contender costs the cores,
        # which caps it where the device does not (a fast device, or one
        # whose driver copies, as a loop device does).
        out[name]["cpu_ms_per_gb"] = {
            k: {
                w: stats([secs * 1e3 / (total / 1e9) for secs in v])
                for w, v in cpu[name, k].items()
                if w not in ("minflt", "requests")
            }
            for k in d
        }
        out[name]["minflt_per_pass"] = {k: stats(cpu[name, k]["minflt"]) for k in d}
        out[name]["device_requests_per_row"] = {k: stats([n / n_rows for n in cpu[name, k]["requests"]]) for k in d}
        if lookups.get(name):
            out[name]["lookup_ns"] = stats(lookups[name])
    if same_files:
        out[SAME_FILES] = {"load": stats([total / raw / 1e9 for _, raw in same_files])}
        out["load_kvtier_over_raw_on_its_files"] = stats([raw / t for t, raw in same_files])
    raw_names = [c.name for c in contenders if isinstance(c, RawContender) and not c.publish]
    for k in ("store", "load"):
        kv = times["kvtier"][k]
        out[f"{k}_kvtier_over_vllm_fs"] = stats([f / t for t, f in zip(kv, times["vllm-fs"][k])])
        out[f"{k}_cpu_kvtier_over_vllm_fs"] = stats(
            [t / f for t, f in zip(cpu["kvtier", k]["process"], cpu["vllm-fs", k]["process"])]
        )
        if f"kvtier {ANON}" in times:
            anon_kv, anon_fs = times[f"kvtier {ANON}"][k], times[f"vllm-fs {ANON}"][k]
            out[f"{k}_kvtier {ANON}_over_vllm-fs {ANON}"] = stats([f / t for t, f in zip(anon_kv, anon_fs)])
        if "kvcr dram" in times:
            for ours, theirs in (("kvtier memory", "kvcr dram"), ("kvtier", KVCR_G3)):
                out[f"{k}_{ours}_over_{theirs}"] = stats(
                    [o / t for t, o in zip(times[ours][k], times[theirs][k])]
                )
        if raw_names:
            best = [min(times[n][k][i] for n in raw_names) for i in range(args.repeat)]
            out[f"{k}_kvtier_over_raw"] = stats([b / t for t, b in zip(kv, best)])
    if PUBLISHING in times:
        kv, pub = times["kvtier"]["store"], times[PUBLISHING]["store"]
        out["store_kvtier_over_raw_publishing"] = stats([p / t for t, p in zip(kv, pub)])
        plain = times.get(f"raw-{KVTIER_DISK_THREADS}")
        if plain:
            out["store_raw_publishing_over_raw"] = stats([r / p for p, r in zip(pub, plain["store"])])
    return out


def uptime() -> str:
    with open("/proc/loadavg") as f:
        return "load average " + " ".join(f.read().split()[:3])


def idle_cpus(args, workdir: str) -> dict:
    """Cores each kind of tier burns idle, built as vLLM builds it."""
    kvtier = {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm", "capacity_bytes": "64MiB"}
    kinds = {
        "vllm-fs": {"type": "fs"},
        "kvtier memory": {**kvtier, "backend": "memory"},
        "kvtier disk": {**kvtier, "backend": "disk"},
    }
    if args.kvcr:
        kinds["kvcr dram"] = kvcr_config(64, 64 << 10, None)
        kinds["kvcr g3 posix"] = kvcr_config(64, 64 << 10, "")
    out = {}
    for name, config in kinds.items():
        directory = os.path.join(workdir, f"idle-{name}".replace(" ", "_"))
        os.makedirs(directory)
        out[name] = idle_cpu(config, directory, args.idle_seconds)
        print(f"  idle {name}: {out[name]:.3f} cores over {args.idle_seconds:g} s; {uptime()}", file=sys.stderr)
        shutil.rmtree(directory)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", help="parent of the scratch directories (default: a new one under /var/tmp)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--mib-per-pass", type=int, default=512, help="bytes per pass for 2 MiB rows (64 KiB rows: half)")
    p.add_argument("--row-kib", type=int, action="append", help="row sizes in KiB (default: 2048 and 64)")
    p.add_argument(
        "--raw-threads",
        type=int,
        action="append",
        help="raw bound thread counts (default: 4, 16, 32 and 64, the last being kvtier's default io_threads for disk)",
    )
    p.add_argument("--kvtier", action="append", default=[], metavar="KEY=VALUE", help="extra kvtier config")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="another kvtier contender with these settings (to find where time goes)",
    )
    p.add_argument(
        "--anon",
        dest="primary",
        action="store_const",
        const=["vllm", "anon"],
        default=["vllm"],
        help=f"also vllm-fs and kvtier over an anonymous mapping of the bench's, rows labelled {ANON}",
    )
    p.add_argument(
        "--anon-fresh",
        dest="primary",
        action="store_const",
        const=["vllm", "anon", "anon-fresh"],
        help=f"--anon, and rows labelled {ANON_FRESH} over a new anonymous mapping per contender and repetition",
    )
    p.add_argument(
        "--no-kvcr",
        dest="kvcr",
        action="store_false",
        default=kvcr_importable(),
        help="leave out KVCR (left out anyway where kvcr does not import: scripts/kvcr_env.sh)",
    )
    p.add_argument(
        "--idle-seconds", type=float, default=10, help="idle CPU of each kind of tier over this long (0: skip)"
    )
    p.add_argument("--no-drop-caches", dest="drop_caches", action="store_false")
    p.add_argument("--quick", action="store_true", help="small and fast (smoke test)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--report", metavar="FILE", help="print the tables of a --json output, and nothing else")
    args = p.parse_args()
    if args.report:
        with open(args.report) as f:
            text = f.read()
        # NIXL (KVCR's transport) logs to stdout: the JSON is the object
        # that starts a line.
        saved = json.loads(text[text.index("{") if text.startswith("{") else text.index("\n{") :])
        print_report(saved["results"], saved.get("idle_cores", {}))
        return
    args.row_kib = args.row_kib or [2048, 64]
    args.raw_threads = args.raw_threads or [4, 16, 32, 64]
    if args.quick:
        args.repeat, args.mib_per_pass = 1, 64

    workdir = tempfile.mkdtemp(prefix="kvtier-vs-fs-", dir=args.dir or "/var/tmp")
    global DEVICE_STAT
    dev = os.stat(workdir).st_dev
    stat = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat"
    DEVICE_STAT = stat if os.path.exists(stat) else None
    try:
        raw_lib, raw_note = build_raw(workdir)
        if raw_note:
            print(raw_note, file=sys.stderr)
        print(
            f"kvtier {kvtier.library_version()} ({kvtier.library_path}); in {workdir}; "
            f"{JOB_ROWS}-row jobs, {WINDOW} in flight, {args.repeat} reps; extra kvtier config {args.kvtier}",
            file=sys.stderr,
        )
        results = []
        for kib in args.row_kib:
            row = kib << 10
            mib = args.mib_per_pass if kib >= 1024 else max(args.mib_per_pass // 2, 16)
            n_rows = max((mib << 20) // row // JOB_ROWS, 1) * JOB_ROWS
            results.append(measure(args, row, n_rows, raw_lib, workdir))
        idle = idle_cpus(args, workdir) if args.idle_seconds > 0 else {}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    if args.json:
        print(json.dumps({"kvtier_config_extra": args.kvtier, "results": results, "idle_cores": idle}, indent=1))
        return
    print_report(results, idle)


if __name__ == "__main__":
    main()
