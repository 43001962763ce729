"""The library's configuration vocabulary, asked of the library: its key
names (``tier_config_keys``) and a config's values read back in its own
spelling (``tier_config_get``), so the binding keeps no list of keys,
backend names or flag spellings of its own."""

from __future__ import annotations

import ctypes
from typing import Any

from . import _lib
from ._args import config_text
from .errors import KVTierError, fail


def config_keys() -> list[str]:
    """Every key ``tier_config_set`` accepts, in docs/configuration.md's order."""
    n = ctypes.c_size_t()
    names = _lib.lib.tier_config_keys(ctypes.byref(n))
    return [names[i].decode() for i in range(n.value)]


def read_back(config: dict[str, Any], keys: tuple[str, ...]) -> dict[str, str]:
    """Sets ``config`` through ``tier_config_set`` and reads ``keys`` back
    as the library spells them (``" Valkey"`` reads ``redis``, ``"1"``
    reads ``true``). Raises :class:`KVTierError` (``TIER_ERR_CONFIG``, the
    library's message) on the first key or value it refuses. ``None`` values
    are skipped, as ``Tier`` skips them."""
    lib = _lib.lib
    cfg = lib.tier_config_new()
    if not cfg:
        raise KVTierError(_lib.TIER_ERR_ALLOC, "tier_config_new returned NULL", "tier_config_new")
    try:
        for key, value in config.items():
            if value is None:
                continue
            st = lib.tier_config_set(cfg, key.encode(), config_text(key, value).encode())
            if st != _lib.TIER_OK:
                raise fail(st, "tier_config_set")
        values = {}
        for key in keys:
            size = ctypes.c_size_t()
            buf = ctypes.create_string_buffer(256)
            st = lib.tier_config_get(cfg, key.encode(), buf, len(buf), ctypes.byref(size))
            if st == _lib.TIER_OK and size.value >= len(buf):
                buf = ctypes.create_string_buffer(size.value + 1)
                st = lib.tier_config_get(cfg, key.encode(), buf, len(buf), ctypes.byref(size))
            if st != _lib.TIER_OK:
                raise fail(st, "tier_config_get")
            values[key] = buf.value.decode()
        return values
    finally:
        lib.tier_config_free(cfg)
