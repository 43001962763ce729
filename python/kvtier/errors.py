"""The binding's one exception: a library call (or its arguments) failed."""

from __future__ import annotations

from typing import Any

from . import _lib


class KVTierError(Exception):
    """A kvtier call failed.

    Attributes:
        status: the library's status code (negative ``TIER_ERR_*``).
        status_name: its name, e.g. ``"TIER_ERR_OUT_OF_RANGE"``.
        message: ``tier_last_error``'s text (or the binding's own, for
            argument problems found before calling the library).
        function: the C function (or Python method) that failed.

    """

    def __init__(self, status: int, message: str, function: str = "") -> None:
        self.status = status
        self.status_name = _lib.status_name(status)
        self.message = message
        self.function = function
        # Library messages already start with the function's name.
        if function and not message.startswith(function):
            message = f"{function}: {message}"
        super().__init__(f"{self.status_name} ({status}): {message}")

    def __reduce__(self) -> tuple[Any, ...]:  # picklable, e.g. across multiprocessing
        return (KVTierError, (self.status, self.message, self.function))


def fail(status: int, function: str) -> KVTierError:
    """The error of a call that returned ``status``, with this thread's last message."""
    return KVTierError(status, _lib.last_error(), function)
