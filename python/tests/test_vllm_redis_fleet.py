"""Two vLLM engines (two processes, each with its own TieringOffloadingManager)
sharing one kvtier Redis keyspace: a prefix stored by one is a hit for the
other, and loads back byte-exact.

Needs vLLM 0.33 and redis-server; skipped without either (CI installs
neither vLLM nor runs this: see DEVELOPERS.md, "vLLM").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

from pathlib import Path

import pytest

PYTHON_DIR = Path(__file__).resolve().parent.parent

pytest.importorskip("vllm.v1.kv_offload.tiering.manager", reason="needs vLLM 0.33")
if shutil.which("redis-server") is None:
    pytest.skip("needs redis-server", allow_module_level=True)

ENGINE = textwrap.dedent(
    r'''
    import sys, time, uuid
    import numpy as np
    from types import SimpleNamespace
    from vllm.v1.kv_offload.base import (
        LookupResult, ReqContext, ScheduleEndContext, make_offload_key)
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    from vllm.v1.kv_offload.tiering.manager import (
        CPUPrimaryTierOffloadingManager, TieringOffloadingManager)

    role, url, prefix = sys.argv[1:4]
    rows, row = 4, 64 * 1024
    region = SharedOffloadRegion(engine_id=f"kvtier-fleet-{uuid.uuid4().hex[:12]}",
                                 num_chunks=rows, rank=None,
                                 kv_bytes_per_chunk=row, cpu_page_size=row)
    primary = CPUPrimaryTierOffloadingManager(num_chunks=rows, mmap_region=region)
    view = primary.get_kv_memoryview()
    spec = SimpleNamespace(kv_events_config=SimpleNamespace(
        enable_kv_cache_events=False, self_describing_kv_events=False))
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "KVTierSecondaryTier", "module_path": "kvtier.vllm",
         "locality": "REMOTE", "backend": "redis", "url": url, "sharing": "shared",
         "key_prefix": prefix, "probe_ttl_ms": 10, "capacity_bytes": "1MiB",
         "io_threads": 2},
        view, spec)
    manager = TieringOffloadingManager(primary_tier=primary, secondary_tiers=[tier])
    data = np.asarray(view)
    ks = [make_offload_key(n.to_bytes(8, "big"), 0) for n in range(4)]
    payload = np.random.default_rng(1).integers(-128, 128, size=(4, row), dtype=np.int8)

    def steps(limit=1000):
        for _ in range(limit):
            with manager.lock:
                manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
                if not manager.has_pending_work():
                    return
            time.sleep(0.005)
        raise AssertionError("the manager never went idle")

    try:
        if role == "writer":
            ctx = ReqContext("A")
            with manager.lock:
                manager.on_new_request(ctx)
                out = manager.prepare_store(ks, ctx)
                data[np.asarray(out.store_spec.chunk_ids)] = payload
                manager.complete_store(ks, ctx)  # cascades to kvtier, i.e. Redis
            steps()
            with manager.lock:
                manager.on_request_finished(ctx)
            assert tier.stats().stores_ok == 1, tier.stats()
        else:
            ctx = ReqContext("B")
            with manager.lock:
                manager.on_new_request(ctx)
            deadline = time.monotonic() + 20
            while True:
                with manager.lock:
                    got = [manager.lookup(k, ctx) for k in ks]
                if got == [LookupResult.HIT] * 4:
                    break
                assert all(g != LookupResult.MISS for g in got), got
                assert time.monotonic() < deadline, got
                steps()
            with manager.lock:
                spec_b = manager.prepare_load(ks, ctx)
                assert data[np.asarray(spec_b.chunk_ids)].tobytes() == payload.tobytes()
                manager.complete_load(ks, ctx)
                manager.on_request_finished(ctx)
            assert tier.stats().loads_ok >= 1, tier.stats()
        print(f"{role}: ok")
    finally:
        data = view = None
        manager.shutdown()
    '''
)


def test_two_engines_share_a_prefix_through_redis(redis_url, tmp_path):
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    prefix = f"fleet-{time.monotonic_ns()}"
    # The engines import this checkout's kvtier (and its library, through
    # KVTIER_LIBRARY when set).
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHON_DIR), env.get("PYTHONPATH")]))
    for role in ("writer", "reader"):
        done = subprocess.run(
            [sys.executable, str(script), role, redis_url, prefix],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and f"{role}: ok" in done.stdout, (
            f"{role} failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}"
        )
