"""Python arguments in the form the C calls take: config values as text,
keys packed back to back, block ids as native int64 bytes."""

from __future__ import annotations

import array
from typing import Any

from ._lib import TIER_ERR_CONFIG, TIER_ERR_INVALID_ARG, TIER_ERR_OUT_OF_RANGE
from .errors import KVTierError

try:  # numpy is optional; with it, block-id arrays pass without Python loops.
    import numpy as _np

    _ndarray: Any = _np.ndarray
    _INT64: Any = _np.dtype(_np.int64)
except ImportError:  # pragma: no cover - exercised only without numpy
    _ndarray = ()
    _INT64 = None


def config_text(key: str, value: Any) -> str:
    """A config value as ``tier_config_set`` takes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if key == "seal_key" and isinstance(value, (bytes, bytearray)):
        # 32 raw bytes, as a key store hands them out; the library checks the
        # length (and never repeats the value in its message).
        return bytes(value).hex()
    text = str(value)
    if "\0" in text or "\0" in key:
        raise KVTierError(TIER_ERR_CONFIG, f"config {key!r}: NUL byte in key or value", "Tier")
    return text


def pack_keys(keys: Any, function: str) -> tuple[bytes | None, int, int]:
    """Packs equal-length keys back to back: (packed, key_len, n)."""
    if isinstance(keys, (bytes, bytearray, memoryview, str)):
        raise KVTierError(
            TIER_ERR_INVALID_ARG,
            "keys must be a sequence of bytes keys, not a single key",
            function,
        )
    if type(keys) is not list and type(keys) is not tuple:
        keys = list(keys)  # sets, dict views, generators: any Collection
    n = len(keys)
    if n == 0:
        # key_len must be valid even for an empty call; NULL is legal at n = 0.
        return None, 1, 0
    first = keys[0]
    try:
        key_len = len(first)
        if n == 1:
            packed = first if type(first) is bytes else bytes(first)
        else:
            packed = b"".join(keys)
    except TypeError:
        raise KVTierError(TIER_ERR_INVALID_ARG, "keys must be bytes-like objects", function) from None
    if len(packed) != key_len * n or (n > 1 and len(set(map(len, keys))) != 1):
        lengths = sorted(set(map(len, keys)))
        raise KVTierError(
            TIER_ERR_INVALID_ARG,
            f"keys must all have the same length; got lengths {lengths}",
            function,
        )
    return packed, key_len, n


def count_packed(packed: Any, key_len: int, function: str) -> tuple[bytes, int]:
    """Checks keys already packed back to back: (packed as bytes, n)."""
    if type(packed) is not bytes:
        try:
            packed = bytes(packed)
        except TypeError:
            raise KVTierError(TIER_ERR_INVALID_ARG, "packed keys must be bytes-like", function) from None
    if type(key_len) is not int or key_len <= 0:
        raise KVTierError(TIER_ERR_INVALID_ARG, f"key_len must be a positive int, got {key_len!r}", function)
    n, rest = divmod(len(packed), key_len)
    if rest:
        raise KVTierError(
            TIER_ERR_INVALID_ARG,
            f"{len(packed)} bytes of packed keys are not whole keys of {key_len} bytes",
            function,
        )
    return packed, n


def pack_block_ids(block_ids: Any, function: str) -> tuple[Any, int]:
    """Block ids packed as native int64 bytes (passed as ``const int64_t *``),
    and their count."""
    if type(block_ids) is _ndarray or isinstance(block_ids, _ndarray):
        if block_ids.ndim != 1:
            raise KVTierError(
                TIER_ERR_INVALID_ARG,
                f"block_ids must be one-dimensional, got shape {block_ids.shape}",
                function,
            )
        if block_ids.dtype is not _INT64:
            if block_ids.dtype.kind not in "iu":
                raise KVTierError(
                    TIER_ERR_INVALID_ARG,
                    f"block_ids must be integers, got dtype {block_ids.dtype}",
                    function,
                )
            # uint64 ids >= 2**63 wrap negative, which the library rejects.
            block_ids = block_ids.astype(_INT64)
        # tobytes() is one memcpy; a bytes payload is 8-aligned in CPython, and
        # the library checks alignment anyway (INVALID_ARG, never a crash).
        return block_ids.tobytes(), block_ids.shape[0]
    try:
        arr = array.array("q", block_ids)
    except OverflowError:
        raise KVTierError(TIER_ERR_OUT_OF_RANGE, "a block id does not fit in int64", function) from None
    except TypeError:
        raise KVTierError(TIER_ERR_INVALID_ARG, "block_ids must be a sequence of integers", function) from None
    return arr.tobytes(), len(arr)


def count_extents(values: Any, what: str, function: str) -> tuple[Any, int]:
    """Offsets or lengths packed as native uint64 bytes (passed as
    ``const uint64_t *``), and their count."""
    if type(values) is _ndarray or isinstance(values, _ndarray):
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise KVTierError(
                TIER_ERR_INVALID_ARG,
                f"{what} must be a one-dimensional integer array, got {values.dtype} {values.shape}",
                function,
            )
        if values.dtype.kind == "i" and values.size and values.min() < 0:
            raise KVTierError(TIER_ERR_INVALID_ARG, f"{what}: a value is negative", function)
        return values.astype(_np.uint64).tobytes(), values.shape[0]
    try:
        arr = array.array("Q", values)
    except OverflowError:
        raise KVTierError(TIER_ERR_INVALID_ARG, f"{what}: a value is negative or above uint64", function) from None
    except TypeError:
        raise KVTierError(TIER_ERR_INVALID_ARG, f"{what} must be a sequence of integers", function) from None
    return arr.tobytes(), len(arr)
