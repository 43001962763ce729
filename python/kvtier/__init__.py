"""kvtier: a native secondary tier for LLM KV-cache offloading (ctypes binding).

    import numpy as np, kvtier
    primary = np.zeros((64, 2 << 20), dtype=np.uint8)   # 64 rows of 2 MiB
    with kvtier.Tier(primary, capacity_bytes="1GiB") as tier:
        tier.submit_store(1, [b"key-0001"], [0])
        tier.wait(1.0)
        [result] = tier.poll()

The shared library is found through $KVTIER_LIBRARY, else inside this package,
else in the repository's target/release or target/debug. ``kvtier.vllm`` holds
the vLLM secondary tier (``KVTierSecondaryTier``).
"""

from ._config import config_keys
from ._lib import (
    STATUS_CODES,
    TIER_MAX_KEY_LEN,
    AbiMismatchError,
    LibraryNotFoundError,
    library_path,
    library_version,
    status_name,
)
from .errors import KVTierError
from .records import (
    Event,
    EventKind,
    FailReason,
    Feature,
    ItemResult,
    ItemStatus,
    JobKind,
    JobResult,
    LookupState,
    RemovedReason,
    StoredReason,
    TierStats,
)
from .tier import Tier

# TIER_OK, TIER_TIMEOUT and every TIER_ERR_*: the library's own table.
globals().update(STATUS_CODES)

__version__ = "0.2.0"

__all__ = [
    "Event",
    "EventKind",
    "FailReason",
    "Feature",
    "ItemResult",
    "ItemStatus",
    "RemovedReason",
    "StoredReason",
    "JobKind",
    "JobResult",
    "KVTierError",
    "AbiMismatchError",
    "LibraryNotFoundError",
    "LookupState",
    "Tier",
    "TierStats",
    "config_keys",
    "library_path",
    "library_version",
    "status_name",
    "TIER_MAX_KEY_LEN",
    *STATUS_CODES,
]
