"""What LMCache's ``adapter_params`` become for the kvtier LMCache adapter:
its own ``block_bytes``, and the kvtier config with the namespace that names
the adapter's key format (docs/sharing.md)."""

from __future__ import annotations

import re
from typing import Any

from . import identity
from ._lmcache_books import KEY_FORMAT

_OWNER = "kvtier.lmcache"
_SIZE = re.compile(r"\s*(\d+)\s*(|B|KiB|MiB|GiB)\s*", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def _size(owner: str, name: str, raw: Any) -> int:
    """A positive byte count: an int, or digits with B/KiB/MiB/GiB."""
    value: Any = raw
    if isinstance(raw, str):
        match = _SIZE.fullmatch(raw)
        value = int(match.group(1)) * _UNITS[match.group(2).lower()] if match else None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive size (bytes, or with KiB/MiB/GiB), got {raw!r}")
    return value


def namespace(user: str = "") -> str:
    """The tier's namespace: ``lmcache/k<format>/<digest>`` of what a key
    means, then the user's ``namespace`` if set (docs/sharing.md)."""
    fields = {
        "inference_engine": "lmcache",
        "kvtier_identity": 1,
        "key_format": KEY_FORMAT,
        "key_fields": ["model_name", "kv_rank", "object_group_id", "cache_salt", "chunk_hash"],
    }
    return identity.with_user(f"lmcache/k{KEY_FORMAT}/{identity.digest(fields)}", user)


def split_params(params: Any) -> tuple[int, dict[str, Any]]:
    """(block_bytes, kvtier config) from LMCache's ``adapter_params``."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ValueError(f"{_OWNER}: adapter_params must be a JSON object, got {type(params).__name__}")
    config = {str(k): v for k, v in params.items()}
    raw = config.pop("block_bytes", None)
    if raw is None:
        raise ValueError(
            f"{_OWNER}: adapter_params needs block_bytes, the largest object LMCache "
            "stores (bytes, or a number with KiB/MiB/GiB)"
        )
    block_bytes = _size(_OWNER, "block_bytes", raw)
    events = str(config.get("events", "true")).strip().lower()
    if events not in ("true", "1", "on", "yes"):
        raise ValueError(f"{_OWNER}: events must stay on: the adapter counts bytes from them")
    config["events"] = True
    config["namespace"] = namespace(str(config.get("namespace") or ""))
    return block_bytes, config
