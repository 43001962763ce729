"""What the engine adapters (vllm.py, sglang.py) share: their own flags,
the library's check of its config, what storage a config opens, and
failure logging that does not flood an engine's log."""

from __future__ import annotations

import logging
import time
from typing import Any

from . import _lib
from ._args import config_text
from .errors import KVTierError, fail

# The spellings of a flag, as the library's own boolean parser reads them
# (trimmed, any case), for the adapters' keys the library does not know.
_TRUE = frozenset({"true", "1", "on", "yes"})
_FALSE = frozenset({"false", "0", "off", "no"})

# Backend names the library accepts (trimmed, any case), by the kind it runs.
_BACKENDS = {"memory": "memory", "disk": "disk", "redis": "redis", "valkey": "redis"}


def parse_bool(owner: str, name: str, value: Any) -> bool:
    """An adapter's flag from JSON config: a bool, 0/1, or true/false/on/off/
    yes/no in any case. Anything else is a ValueError naming ``owner``, so
    that the string "false" never reads as true."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise ValueError(
        f"{owner}: {name} must be true or false "
        f"(a bool, or one of {sorted(_TRUE | _FALSE)}), got {value!r}"
    )


def check_config(config: dict[str, Any]) -> None:
    """Raises :class:`KVTierError` (``TIER_ERR_CONFIG``, the library's
    message) on the first key or value the library refuses: the library is
    the one judge of its keys. ``None`` values are skipped, as ``Tier`` does."""
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
    finally:
        lib.tier_config_free(cfg)


def backend_of(config: dict[str, Any]) -> str:
    """The backend kind ("memory", "disk", "redis") the library will run, or
    the raw text if unknown (the library then refuses it with its message)."""
    text = str(config.get("backend", "memory")).strip().lower()
    return _BACKENDS.get(text, text)


def is_shared(config: dict[str, Any]) -> bool:
    """Whether others may write the storage this config opens (disk
    ``shared``, redis ``sharing=shared``), read as the library reads it
    (trimmed, any case). A value the library refuses counts as shared: no
    tier opens with it."""
    backend = backend_of(config)
    if backend == "disk":
        text = str(config_text("shared", config.get("shared", False))).strip().lower()
        return text not in _FALSE
    if backend == "redis":
        return str(config.get("sharing", "owned")).strip().lower() != "owned"
    return False


class FailureLog:
    """Logs an adapter's failed calls without flooding the engine's log.

    With ``interval_s``, a call's failures are logged at most once per that
    many seconds (an engine's hot loop may fail on every step); without it,
    each kind of failure (call, exception type, status) is logged once, with
    its traceback, and repeats go to DEBUG.
    """

    def __init__(self, logger: logging.Logger, label: str, interval_s: float | None) -> None:
        self._logger = logger
        self._label = label
        self._interval_s = interval_s
        self._last: dict[str, float] = {}

    def failed(self, what: str, exc: BaseException) -> None:
        interval = self._interval_s
        if interval is not None:
            now = time.monotonic()
            if now - self._last.get(what, -interval) >= interval:
                self._last[what] = now
                self._logger.warning("%s: %s failed: %s", self._label, what, exc)
            return
        kind = f"{what}:{type(exc).__name__}:{getattr(exc, 'status', '')}"
        if kind in self._last:
            self._logger.debug("%s %s failed: %r", self._label, what, exc)
            return
        self._last[kind] = 0.0
        self._logger.warning("%s %s failed (a miss; logged once): %r", self._label, what, exc, exc_info=exc)
