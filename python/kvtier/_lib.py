"""Finding libkvtier.so and declaring its C functions (include/kvtier.h) once."""

from __future__ import annotations

import ctypes
import os
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_int32,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Any

LIBRARY_NAME = "libkvtier.so"
ENV_LIBRARY = "KVTIER_LIBRARY"

# The header's codes the library cannot be asked for (the status codes it
# can are read from it below); tests/test_header_constants.py holds every
# #define TIER_ of include/kvtier.h equal to these.
TIER_MISS = 0
TIER_HIT = 1
TIER_PENDING = 2

TIER_JOB_STORE = 1
TIER_JOB_LOAD = 2
TIER_JOB_DELETE = 3

TIER_MAX_KEY_LEN = 128
TIER_EVENT_STORED = 1
TIER_EVENT_REMOVED = 2
TIER_EVENT_LOST = 3
TIER_STORED_WRITTEN = 1
TIER_STORED_RECOVERED = 2
TIER_STORED_FOUND = 3
TIER_REMOVED_EVICTED = 1
TIER_REMOVED_CLEARED = 2
TIER_REMOVED_CORRUPT = 3
TIER_REMOVED_VANISHED = 4
TIER_REMOVED_UNREADABLE = 5
TIER_REMOVED_DELETED = 6

# The ABI this binding speaks (TIER_ABI_VERSION of include/kvtier.h).
TIER_ABI_VERSION = 1

# tier_job_result_t.reason: why a job failed (TIER_FAIL_*).
TIER_FAIL_NONE = 0
TIER_FAIL_NO_SPACE = 1
TIER_FAIL_NOT_FOUND = 2
TIER_FAIL_CORRUPT = 3
TIER_FAIL_IO_ERROR = 4
TIER_FAIL_DEADLINE = 5
TIER_FAIL_UNAVAILABLE = 6
TIER_FAIL_SHUTDOWN = 7
TIER_FAIL_ALLOC = 8
TIER_FAIL_PANIC = 9
TIER_FAIL_LENGTH_MISMATCH = 10
TIER_FAIL_BUSY = 11

# tier_item_result_t.status: what became of one key of an extent or delete
# job (TIER_ITEM_*).
TIER_ITEM_OK = 0
TIER_ITEM_MISS = 1
TIER_ITEM_FAILED = 2
TIER_ITEM_BUSY = 3
# sizeof(tier_item_result_t) when it was added, the least result_size the
# library accepts.
TIER_ITEM_RESULT_SIZE_V1 = 8

# tier_features bits: what a tier can do (TIER_FEATURE_*, KVTIER_1.1).
TIER_FEATURE_EXTENTS = 1
TIER_FEATURE_SHARED = 2
TIER_FEATURE_SEALED = 4
TIER_FEATURE_PERSISTENT = 8


class tier_job_result_t(Structure):
    _fields_ = [
        ("job_id", c_uint64),
        ("status", c_int32),
        ("kind", c_uint32),
        ("num_blocks", c_uint32),
        ("num_done", c_uint32),
        ("bytes", c_uint64),
        ("elapsed_ns", c_uint64),
        ("io_ns", c_uint64),
        ("reason", c_uint32),
        ("reserved", c_uint32),
    ]


class tier_item_result_t(Structure):
    _fields_ = [
        ("status", c_uint32),
        ("reason", c_uint32),
    ]


class tier_event_t(Structure):
    _fields_ = [
        ("seq", c_uint64),
        ("dropped", c_uint64),
        ("kind", c_uint32),
        ("reason", c_uint32),
        ("key_len", c_uint32),
        ("key", c_uint8 * TIER_MAX_KEY_LEN),
        ("reserved", c_uint32),
    ]


# In header order; the Python TierStats dataclass mirrors these names.
STATS_FIELDS = (
    "capacity_bytes",
    "used_bytes",
    "num_blocks",
    "lookups",
    "hits",
    "misses",
    "evictions",
    "stores_ok",
    "stores_failed",
    "loads_ok",
    "loads_failed",
    "bytes_stored",
    "bytes_loaded",
    "jobs_in_flight",
    "lookups_pending",
    "block_bytes",
    "capacity_blocks",
    "metadata_bytes",
    "results_queued",
    "io_threads",
    "events_dropped",
    "resident_bytes",
    "io_deadlines_missed",
    "io_threads_stuck",
    "probes_in_flight",
)


class tier_stats_t(Structure):
    _fields_ = [(name, c_uint64) for name in STATS_FIELDS]


class tier_abi_info_t(Structure):
    _fields_ = [
        ("abi_version", c_uint32),
        ("abi_info_size", c_uint32),
        ("stats_size", c_uint32),
        ("job_result_size", c_uint32),
        ("event_size", c_uint32),
    ]


# Every struct the library writes, by the tier_abi_info_t field giving its
# size in the library.
ABI_STRUCTS = {
    "abi_info_size": tier_abi_info_t,
    "stats_size": tier_stats_t,
    "job_result_size": tier_job_result_t,
    "event_size": tier_event_t,
}


class LibraryNotFoundError(ImportError):
    """libkvtier.so could not be found or loaded."""


class AbiMismatchError(ImportError):
    """The library found speaks another ABI than this binding."""


def check_abi(lib: Any, path: object) -> None:
    """Refuse a library whose ABI version or struct sizes differ from this
    binding's: the binding and the library must come from one kvtier build."""
    advice = (
        " Use the library built with this binding (pip install ./python, or "
        f"cargo build --release in the same checkout), or set {ENV_LIBRARY} to it."
    )
    try:
        abi_info = lib.tier_abi_info
    except AttributeError:
        raise AbiMismatchError(
            f"kvtier: refusing {path}: it has no tier_abi_info, so it predates "
            f"ABI {TIER_ABI_VERSION}, the one this binding speaks." + advice
        ) from None
    info = tier_abi_info_t()
    status = abi_info(ctypes.byref(info), ctypes.sizeof(info))
    if status != 0:
        raise AbiMismatchError(f"kvtier: refusing {path}: tier_abi_info failed ({status})." + advice)
    problems = []
    if info.abi_version != TIER_ABI_VERSION:
        problems.append(f"ABI version {info.abi_version}, this binding speaks {TIER_ABI_VERSION}")
    for field, struct in ABI_STRUCTS.items():
        theirs, ours = getattr(info, field), ctypes.sizeof(struct)
        if theirs != ours:
            problems.append(f"{struct.__name__} is {theirs} bytes there, {ours} here")
    if problems:
        raise AbiMismatchError(f"kvtier: refusing {path}: " + "; ".join(problems) + "." + advice)


def _repo_root() -> Path | None:
    # python/kvtier/_lib.py -> the repository holds Cargo.toml two levels up.
    root = Path(__file__).resolve().parent.parent.parent
    return root if (root / "Cargo.toml").is_file() else None


def candidate_paths() -> list[tuple[str, Path]]:
    """The places searched for the library, in order, with why each is tried."""
    env = os.environ.get(ENV_LIBRARY)
    if env:
        # An explicit choice is the only candidate: falling back silently
        # would hide a typo and test a different build than intended.
        return [(f"${ENV_LIBRARY}", Path(env))]
    places = [("installed package", Path(__file__).resolve().parent / LIBRARY_NAME)]
    root = _repo_root()
    if root is not None:
        places.append(("repository release build", root / "target" / "release" / LIBRARY_NAME))
        places.append(("repository debug build", root / "target" / "debug" / LIBRARY_NAME))
    return places


def _load() -> tuple[ctypes.CDLL, Path]:
    tried = []
    for why, path in candidate_paths():
        if not path.is_file():
            tried.append(f"  {path} ({why}): not found")
            continue
        try:
            return ctypes.CDLL(str(path)), path
        except OSError as exc:
            tried.append(f"  {path} ({why}): {exc}")
    raise LibraryNotFoundError(
        "kvtier: could not load libkvtier.so. Tried:\n"
        + "\n".join(tried)
        + f"\nBuild it with `cargo build --release` in the kvtier repository, "
        f"install the package with `pip install ./python`, or set {ENV_LIBRARY} "
        "to the library's path."
    )


def _signatures() -> dict[str, tuple[Any, list[Any]]]:
    P = c_void_p  # byte buffers, int64 arrays and handles all pass as void*
    return {
        "tier_abi_info": (c_int32, [POINTER(tier_abi_info_t), c_size_t]),
        "tier_version": (c_char_p, []),
        "tier_status_str": (c_char_p, [c_int32]),
        "tier_last_error": (c_size_t, [c_void_p, c_size_t]),
        "tier_config_new": (c_void_p, []),
        "tier_config_set": (c_int32, [P, c_char_p, c_char_p]),
        "tier_config_free": (None, [P]),
        "tier_config_keys": (POINTER(c_char_p), [POINTER(c_size_t)]),
        "tier_config_get": (c_int32, [P, c_char_p, c_void_p, c_size_t, POINTER(c_size_t)]),
        "tier_new": (c_int32, [P, P, c_size_t, c_size_t, POINTER(c_void_p)]),
        "tier_free": (None, [P]),
        "tier_lookup": (c_int32, [P, P, c_size_t, c_size_t, P]),
        "tier_touch": (c_int32, [P, P, c_size_t, c_size_t]),
        "tier_submit_store": (c_int32, [P, c_uint64, P, c_size_t, P, c_size_t]),
        "tier_submit_load": (c_int32, [P, c_uint64, P, c_size_t, P, c_size_t]),
        "tier_poll_finished": (c_int32, [P, P, c_size_t, c_size_t, POINTER(c_size_t)]),
        "tier_wait": (c_int32, [P, c_uint32]),
        "tier_drain": (c_int32, [P]),
        "tier_clear": (c_int32, [P]),
        "tier_stats": (c_int32, [P, POINTER(tier_stats_t), c_size_t]),
        "tier_poll_events": (c_int32, [P, P, c_size_t, c_size_t, POINTER(c_size_t)]),
        "tier_metrics": (c_size_t, [P, c_void_p, c_size_t]),
        "tier_completion_fd": (c_int32, [P]),
        # KVTIER_1.1
        "tier_submit_store_extents": (
            c_int32,
            [P, c_uint64, P, c_size_t, P, P, c_size_t, P, c_size_t],
        ),
        "tier_submit_load_extents": (
            c_int32,
            [P, c_uint64, P, c_size_t, P, P, c_size_t, P, c_size_t],
        ),
        "tier_submit_delete": (c_int32, [P, c_uint64, P, c_size_t, c_size_t, P, c_size_t]),
        "tier_pin": (c_int32, [P, P, c_size_t, c_size_t, P]),
        "tier_unpin": (c_int32, [P, P, c_size_t, c_size_t]),
        "tier_features": (c_int32, [P, POINTER(c_uint64)]),
        "tier_add_notify_fd": (c_int32, [P, c_uint32, c_int32]),
    }


def _declare(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in _signatures().items():
        fn = getattr(lib, name, None)
        if fn is None:
            continue  # check_abi refuses a library without tier_abi_info
        fn.restype = restype
        fn.argtypes = argtypes


lib, library_path = _load()
_declare(lib)
# Before any other call: a library of another ABI would write structs of
# another size into this binding's buffers.
check_abi(lib, library_path)


def check_functions(lib: Any, path: object) -> None:
    """Refuse a library of this ABI that lacks a function this binding calls
    (one older than the binding: a function added in a later version node,
    such as KVTIER_1.1's tier_config_get), at import rather than at the
    first call that needs it."""
    missing = [name for name in _signatures() if getattr(lib, name, None) is None]
    if missing:
        raise AbiMismatchError(
            f"kvtier: refusing {path}: it lacks {', '.join(missing)}, so it is older than this binding. "
            f"Use the library built with this binding, or set {ENV_LIBRARY} to it."
        )


check_functions(lib, library_path)


def _status_codes() -> dict[str, int]:
    """Every status code, by name, as the library itself names them
    (tier_status_str): the numbers are written once, in the library."""
    codes = {}
    for code in range(-255, 256):
        name = lib.tier_status_str(code).decode()
        if name != "TIER_UNKNOWN_STATUS":
            codes[name] = code
    return codes


STATUS_CODES: dict[str, int] = _status_codes()
globals().update(STATUS_CODES)
# Names the binding itself relies on (a library without them is not one
# this binding can drive).
TIER_OK: int = STATUS_CODES["TIER_OK"]
TIER_TIMEOUT: int = STATUS_CODES["TIER_TIMEOUT"]
TIER_ERR_INVALID_ARG: int = STATUS_CODES["TIER_ERR_INVALID_ARG"]
TIER_ERR_OUT_OF_RANGE: int = STATUS_CODES["TIER_ERR_OUT_OF_RANGE"]
TIER_ERR_DUPLICATE_JOB: int = STATUS_CODES["TIER_ERR_DUPLICATE_JOB"]
TIER_ERR_CONFIG: int = STATUS_CODES["TIER_ERR_CONFIG"]
TIER_ERR_SHUTDOWN: int = STATUS_CODES["TIER_ERR_SHUTDOWN"]
TIER_ERR_ALLOC: int = STATUS_CODES["TIER_ERR_ALLOC"]

_status_names: dict[int, str] = {}


def status_name(status: int) -> str:
    name = _status_names.get(status)
    if name is None:
        name = lib.tier_status_str(status).decode()
        _status_names[status] = name
    return name


def last_error() -> str:
    """This thread's message for the last failed call."""
    buf = ctypes.create_string_buffer(512)
    n = lib.tier_last_error(buf, len(buf))
    if n >= len(buf):
        buf = ctypes.create_string_buffer(n + 1)
        lib.tier_last_error(buf, len(buf))
    return buf.value.decode("utf-8", "replace")


def library_version() -> str:
    return lib.tier_version().decode()
