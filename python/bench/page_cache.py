"""The page-cache drop the disk benches make before each pass, so that every
contender reads from the device."""

from __future__ import annotations

import os


def drop_caches(enabled: bool = True) -> bool:
    """`sync`, then drops the page cache; whether it was dropped (False when
    not `enabled`, or where /proc/sys/vm/drop_caches is not writable)."""
    if not enabled:
        return False
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False
