"""What the engine adapters (vllm.py, sglang.py) share: their own flags,
the library's check of its config, what storage a config opens, and
failure logging that does not flood an engine's log."""

from __future__ import annotations

import logging
import time
from typing import Any

from ._config import read_back
from .errors import KVTierError

# A flag of the library's, set to an adapter's flag value to have the
# library's own boolean parser judge the spelling (it reads back "true" or
# "false"); prepare_dirs only because it is a plain boolean.
_LIBRARY_FLAG = "prepare_dirs"


def parse_bool(owner: str, name: str, value: Any) -> bool:
    """An adapter's flag from JSON config: a bool, 0/1, or any spelling the
    library's boolean parser takes (true/false/on/off/yes/no, any case).
    Anything else is a ValueError naming ``owner``, so that the string
    "false" never reads as true."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        try:
            return read_back({_LIBRARY_FLAG: value}, (_LIBRARY_FLAG,))[_LIBRARY_FLAG] == "true"
        except KVTierError:
            pass
    raise ValueError(f"{owner}: {name} must be true or false (a bool, or on/off, yes/no, 1/0), got {value!r}")


def check_config(config: dict[str, Any]) -> None:
    """Raises :class:`KVTierError` (``TIER_ERR_CONFIG``, the library's
    message) on the first key or value the library refuses: the library is
    the one judge of its keys. ``None`` values are skipped, as ``Tier`` does."""
    read_back(config, ())


def _storage_keys(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config[k] for k in ("backend", "shared", "sharing") if k in config}


def backend_of(config: dict[str, Any]) -> str:
    """The backend kind ("memory", "disk", "redis") the library will run, as
    it reads the config, or the raw text if it refuses it (the library then
    refuses the config with its message when the tier is built)."""
    try:
        return read_back({"backend": config.get("backend")}, ("backend",))["backend"]
    except KVTierError:
        return str(config.get("backend"))


def is_shared(config: dict[str, Any]) -> bool:
    """Whether others may write the storage this config opens (disk
    ``shared``, redis ``sharing=shared``), as the library reads it. A value
    the library refuses counts as shared: no tier opens with it."""
    try:
        values = read_back(_storage_keys(config), ("backend", "shared", "sharing"))
    except KVTierError:
        return True
    if values["backend"] == "disk":
        return values["shared"] == "true"
    if values["backend"] == "redis":
        return values["sharing"] == "shared"
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
