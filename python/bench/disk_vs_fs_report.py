"""The tables `bench_disk_vs_fs.py` prints, from the results it gathers (or
that its ``--json`` printed: ``--report FILE``)."""

from __future__ import annotations

SAME_FILES = "raw on kvtier's files"
# The same rows and ratio under the names of runs from before io_threads=64.
OLD_SAME_FILES = "raw-32 on kvtier's files"


def print_report(results: list, idle: dict) -> None:
    """The tables, from what `--json` prints (`--report FILE` reads it back)."""
    for r in results:
        print(
            f"\n{r['row_bytes'] >> 10} KiB rows, {r['bytes_per_pass'] / 2**20:.0f} MiB per pass, "
            f"page cache {'dropped' if r['page_cache_dropped'] else 'NOT dropped (not root?)'} "
            "before each pass; GB/s median [min, max]"
        )
        for name, d in r.items():
            if isinstance(d, dict) and "store" in d:
                s, lo = d["store"], d["load"]
                print(
                    f"  {name:24} store {s['median']:5.2f} [{s['min']:.2f}, {s['max']:.2f}]"
                    f"   load {lo['median']:5.2f} [{lo['min']:.2f}, {lo['max']:.2f}]"
                )
        for same in (SAME_FILES, OLD_SAME_FILES):
            if same in r:
                lo = r[same]["load"]
                print(f"  {same:24} {'store     -':24}   load {lo['median']:5.2f} [{lo['min']:.2f}, {lo['max']:.2f}]")
        for k in ("store", "load"):
            fs = r[f"{k}_kvtier_over_vllm_fs"]
            line = f"  {k}: kvtier/vllm-fs {fs['median']:.3f} [{fs['min']:.2f}, {fs['max']:.2f}]"
            if f"{k}_kvtier_over_raw" in r:
                raw = r[f"{k}_kvtier_over_raw"]
                line += f"   kvtier/raw {raw['median']:.3f} [{raw['min']:.2f}, {raw['max']:.2f}]"
            if k == "store" and "store_kvtier_over_raw_publishing" in r:
                pub = r["store_kvtier_over_raw_publishing"]
                line += f"   kvtier/raw publishing {pub['median']:.3f} [{pub['min']:.2f}, {pub['max']:.2f}]"
            for plain in ("store_raw_publishing_over_raw", "store_raw_publishing_over_raw_32"):
                if k == "store" and plain in r:
                    line += f"   (raw publishing/raw {r[plain]['median']:.3f})"
            if k == "load" and "load_kvtier_over_raw_on_its_files" in r:
                same = r["load_kvtier_over_raw_on_its_files"]
                line += f"   kvtier/raw on its files {same['median']:.3f} [{same['min']:.2f}, {same['max']:.2f}]"
            print(line)
            cpu = r[f"{k}_cpu_kvtier_over_vllm_fs"]
            print(f"  {k}: process CPU kvtier/vllm-fs {cpu['median']:.3f} [{cpu['min']:.2f}, {cpu['max']:.2f}]")
            extra = []
            for key, ratio in r.items():
                if key.startswith(f"{k}_") and key not in (
                    f"{k}_kvtier_over_vllm_fs",
                    f"{k}_cpu_kvtier_over_vllm_fs",
                    f"{k}_kvtier_over_raw",
                    "store_kvtier_over_raw_publishing",
                    "store_raw_publishing_over_raw",
                    "store_raw_publishing_over_raw_32",
                    "load_kvtier_over_raw_on_its_files",
                ):
                    label = key[len(k) + 1 :].replace("_over_", "/").replace("_", " ")
                    extra.append(f"{label} {ratio['median']:.3f} [{ratio['min']:.2f}, {ratio['max']:.2f}]")
            if extra:
                print(f"  {k}: " + "   ".join(extra))
        print("  CPU ms per GB, median: this process (every thread) / the whole machine (kernel threads too)")
        for name, d in r.items():
            if isinstance(d, dict) and "cpu_ms_per_gb" in d:
                c = d["cpu_ms_per_gb"]
                print(
                    f"  {name:24} store {c['store']['process']['median']:4.0f} / {c['store']['machine']['median']:4.0f}"
                    f"   load {c['load']['process']['median']:4.0f} / {c['load']['machine']['median']:4.0f}"
                    + (
                        f"   (load: kernel {c['load']['process_sys']['median']:4.0f},"
                        f" minor faults {d['minflt_per_pass']['load']['median']:.0f} a pass,"
                        f" device requests a row {d['device_requests_per_row']['load']['median']:.2f})"
                        if "device_requests_per_row" in d
                        else ""
                    )
                )
        looked = {name: d["lookup_ns"] for name, d in r.items() if isinstance(d, dict) and "lookup_ns" in d}
        if looked:
            print("  lookup ns per key, median [min, max]: " + "   ".join(
                f"{name} {v['median']:.0f} [{v['min']:.0f}, {v['max']:.0f}]" for name, v in looked.items()))
    if idle:
        print("\nidle cores (process CPU seconds per second, tier built and left alone): " + "   ".join(
            f"{name} {cores:.3f}" for name, cores in idle.items()))
