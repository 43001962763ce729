"""kvtier: a native secondary tier for LLM KV-cache offloading (ctypes binding).

    import numpy as np, kvtier
    primary = np.zeros((64, 2 << 20), dtype=np.uint8)   # 64 rows of 2 MiB
    with kvtier.Tier(primary, capacity_bytes="1GiB", io_threads=2) as tier:
        tier.submit_store(1, [b"key-0001"], [0])
        tier.wait(1.0)
        [result] = tier.poll()

The shared library is found through $KVTIER_LIBRARY, else inside this package,
else in the repository's target/release or target/debug. ``kvtier.vllm`` holds
the vLLM secondary tier (``KVTierSecondaryTier``).
"""

from ._lib import (
    TIER_ERR_ALLOC,
    TIER_ERR_CONFIG,
    TIER_ERR_CORRUPT,
    TIER_ERR_DUPLICATE_JOB,
    TIER_ERR_INVALID_ARG,
    TIER_ERR_IO,
    TIER_ERR_NO_SPACE,
    TIER_ERR_NOT_FOUND,
    TIER_ERR_NULL_ARG,
    TIER_ERR_OUT_OF_RANGE,
    TIER_ERR_PANIC,
    TIER_ERR_SHUTDOWN,
    TIER_MAX_KEY_LEN,
    TIER_OK,
    TIER_TIMEOUT,
    LibraryNotFoundError,
    library_path,
    library_version,
    status_name,
)
from .tier import JobKind, JobResult, KVTierError, LookupState, Tier, TierStats

__version__ = "0.1.0"

__all__ = [
    "JobKind",
    "JobResult",
    "KVTierError",
    "LibraryNotFoundError",
    "LookupState",
    "Tier",
    "TierStats",
    "library_path",
    "library_version",
    "status_name",
    "TIER_OK",
    "TIER_TIMEOUT",
    "TIER_ERR_NULL_ARG",
    "TIER_ERR_INVALID_ARG",
    "TIER_ERR_OUT_OF_RANGE",
    "TIER_ERR_DUPLICATE_JOB",
    "TIER_ERR_NO_SPACE",
    "TIER_ERR_NOT_FOUND",
    "TIER_ERR_IO",
    "TIER_ERR_CORRUPT",
    "TIER_ERR_CONFIG",
    "TIER_ERR_SHUTDOWN",
    "TIER_ERR_PANIC",
    "TIER_ERR_ALLOC",
    "TIER_MAX_KEY_LEN",
]
