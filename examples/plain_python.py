"""kvtier from plain Python: store rows of a numpy buffer, load them back.

    pip install ./python numpy        # or: cargo build --release; PYTHONPATH=python
    python examples/plain_python.py
"""

import numpy as np

import kvtier

ROWS, ROW_BYTES = 32, 2 << 20  # 32 rows of 2 MiB: a typical vLLM chunk size

primary = np.zeros((ROWS, ROW_BYTES), dtype=np.uint8)
rng = np.random.default_rng(0)
primary[:8] = rng.integers(0, 256, size=(8, ROW_BYTES), dtype=np.uint8)

# Keys are bytes of one length (vLLM uses a 32-byte hash + 4-byte group index).
keys = [f"block-{i:04d}".encode() for i in range(8)]

with kvtier.Tier(primary, capacity_bytes="256MiB") as tier:
    print(f"kvtier {kvtier.library_version()} from {kvtier.library_path}")
    print(tier)

    tier.submit_store(1, keys, np.arange(8))  # rows 0..7 -> tier, on its threads
    tier.wait(timeout_s=5.0)
    [stored] = tier.poll()
    assert stored.ok, stored.status_name
    print(f"stored {stored.num_done} blocks, {stored.bytes >> 20} MiB in {stored.elapsed_ns / 1e6:.2f} ms")
    print("lookup:", [s.name for s in tier.lookup(keys[:2] + [b"block-9999"])])

    tier.submit_load(2, keys, np.arange(24, 32))  # tier -> rows 24..31
    tier.drain()  # or wait()/poll() from the engine's loop
    [loaded] = tier.poll()
    assert loaded.ok, loaded.status_name
    assert np.array_equal(primary[24:32], primary[:8]), "bytes differ"
    print(f"loaded {loaded.num_done} blocks back into rows 24..31: bytes identical")

    # A load of a key that was never stored fails; num_done says how many
    # leading blocks were copied before it.
    tier.submit_load(3, [keys[0], b"block-9999"], [20, 21])
    tier.drain()
    [partial] = tier.poll()
    print(f"partial load: {partial.status_name}, {partial.num_done} of {partial.num_blocks} copied")

    # Bad arguments raise at once and produce no result.
    try:
        tier.submit_store(4, keys[:1], [ROWS])
    except kvtier.KVTierError as err:
        print(f"rejected: {err.status_name}: {err.message}")

    print("stats:", {k: v for k, v in tier.stats().as_dict().items() if v})
