"""What the installed vLLM offers the adapter (kvtier.vllm), by release.

0.33 has every name imported here; older releases lack some (``None`` here,
and the adapter does without them), and without vLLM at all ``IMPORT_ERROR``
says why, for the adapter to refuse construction with it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
from typing import Any

from .records import LOOKUP_STATES, LookupState

__all__ = [
    "ANSWERS",
    "HIT",
    "IMPORT_ERROR",
    "MISS",
    "RETRY",
    "SUPER_PARAMS",
    "CacheHitSource",
    "EMABackpressureDetector",
    "Locality",
    "Medium",
    "OffloadingConnectorStats",
    "OffloadingCounterMetadata",
    "OffloadingEvent",
    "OffloadingGaugeMetadata",
    "OffloadingHistogramMetadata",
    "RequestOffloadingContext",
    "SecondaryTierManager",
    "VllmJobResult",
    "job_result",
    "logger",
    "offloading_event",
]

# The adapter's logger keeps the adapter module's name, whichever file logs.
LOGGER_NAME = "kvtier.vllm"

IMPORT_ERROR: BaseException | None = None
SecondaryTierManager: Any = object
Medium: Any = None
OffloadingEvent: Any = None
VllmJobResult: Any = None
logger: Any = logging.getLogger(LOGGER_NAME)

try:
    from vllm.v1.kv_offload.base import Medium as _Medium
    from vllm.v1.kv_offload.base import OffloadingEvent as _OffloadingEvent
    from vllm.v1.kv_offload.tiering.base import JobResult as _JobResult
    from vllm.v1.kv_offload.tiering.base import SecondaryTierManager as _SecondaryTierManager
except Exception as exc:  # ImportError, or a vLLM install that fails to import
    IMPORT_ERROR = exc
else:
    from vllm.logger import init_logger

    SecondaryTierManager, Medium = _SecondaryTierManager, _Medium
    OffloadingEvent, VllmJobResult = _OffloadingEvent, _JobResult
    logger = init_logger(LOGGER_NAME)


def _optional(module: str, name: str) -> Any:
    """``module.name``, or None where this vLLM (or none) lacks it."""
    if IMPORT_ERROR is not None:
        return None
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


_BASE = "vllm.v1.kv_offload.base"
_TIERING = "vllm.v1.kv_offload.tiering.base"
Locality: Any = _optional(_BASE, "Locality")
RequestOffloadingContext: Any = _optional(_BASE, "RequestOffloadingContext") or _optional(
    _TIERING, "RequestOffloadingContext"
)
CacheHitSource: Any = _optional("vllm.v1.metrics.cache_hit_source", "CacheHitSource")
OffloadingCounterMetadata: Any = _optional(_BASE, "OffloadingCounterMetadata")
OffloadingGaugeMetadata: Any = _optional(_BASE, "OffloadingGaugeMetadata")
OffloadingHistogramMetadata: Any = _optional(_BASE, "OffloadingHistogramMetadata")
OffloadingConnectorStats: Any = _optional(
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics", "OffloadingConnectorStats"
)
if OffloadingCounterMetadata is None or OffloadingGaugeMetadata is None or OffloadingHistogramMetadata is None:
    OffloadingConnectorStats = None  # older vLLM: no tier metrics
EMABackpressureDetector: Any = _optional("vllm.v1.kv_offload.tiering.backpressure", "EMABackpressureDetector")

# vLLM's answers to a lookup (older vLLM: True / False / None).
_LookupResult = _optional(_BASE, "LookupResult")
MISS: Any = False if _LookupResult is None else _LookupResult.MISS
HIT: Any = True if _LookupResult is None else _LookupResult.HIT
RETRY: Any = None if _LookupResult is None else _LookupResult.RETRY

# vLLM's answer for each LookupState, indexed by it (an int): a tuple, not a
# dict, because hashing an enum member runs Python code.
_BY_STATE = {LookupState.MISS: MISS, LookupState.HIT: HIT, LookupState.PENDING: RETRY}
ANSWERS: tuple[Any, ...] = tuple(_BY_STATE[s] for s in LOOKUP_STATES)


def _field_names(cls: Any) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls)) if cls is not None else frozenset()


_RESULT_FIELDS = _field_names(VllmJobResult)
_EVENT_FIELDS = _field_names(OffloadingEvent)

# The base class's constructor parameters, by name, in order: they differ by release.
SUPER_PARAMS: list[str] = (
    [
        p.name
        for p in list(inspect.signature(SecondaryTierManager.__init__).parameters.values())[1:]
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if IMPORT_ERROR is None
    else []
)


def job_result(**fields: Any) -> Any:
    """vLLM's JobResult of the fields this release has."""
    return VllmJobResult(**{k: v for k, v in fields.items() if k in _RESULT_FIELDS})


def offloading_event(**fields: Any) -> Any:
    """vLLM's OffloadingEvent of the fields this release has."""
    return OffloadingEvent(**{k: v for k, v in fields.items() if k in _EVENT_FIELDS})
