"""How the vLLM adapter presents itself to vLLM: the base class's arguments,
medium, cache-hit source and locality by backend, back-pressure defaults as
vLLM gives its own storage tiers, and whether vLLM KV events are published."""

from __future__ import annotations

from typing import Any, NamedTuple

from ._vllm_compat import (
    SUPER_PARAMS,
    CacheHitSource,
    EMABackpressureDetector,
    Locality,
    Medium,
    logger,
)


def base_args(spec: Any, view: Any, tier_type: str, detector: Any) -> list[Any]:
    """The installed base class's positional arguments, by its own parameter
    names: 0.33 has (offloading_spec, primary_kv_view, tier_type,
    backpressure_detector), older releases (vllm_config, primary_kv_view[,
    tier_type])."""
    by_name = {
        "offloading_spec": spec,
        "vllm_config": spec,
        "primary_kv_view": view,
        "tier_type": tier_type,
        "tier_name": tier_type,
        "backpressure_detector": detector,
    }
    args = []
    for name in SUPER_PARAMS:
        if name not in by_name:
            break
        args.append(by_name[name])
    return args


class Placement(NamedTuple):
    """What vLLM's load_tier_filter, cache-hit metrics and KV events see."""

    medium: Any
    #: None on a vLLM without CacheHitSource (the attribute is then left alone).
    cache_hit_source: Any
    locality: Any


def placement(backend: str, shared: bool, locality: str | None) -> Placement:
    """memory: host memory of this process (CPU, HOST, LOCAL). disk: storage
    (STORAGE, DISK; LOCAL unless shared, which may be a network file system:
    then unset unless configured). redis: a server's memory that a fleet may
    share (STORAGE, reported as a remote store, REMOTE)."""
    default_locality: str | None
    if backend == "memory":
        medium, source, default_locality = Medium.CPU, "HOST", "LOCAL"
    elif backend == "disk":
        medium, source, default_locality = Medium.STORAGE, "DISK", (None if shared else "LOCAL")
    else:  # redis (or an unknown name, which the library refuses)
        medium, source, default_locality = Medium.STORAGE, "EXTERNAL_UNSPECIFIED", "REMOTE"
    hit_source = CacheHitSource[source] if CacheHitSource is not None else None
    if Locality is None:
        if locality is not None:
            raise ValueError("this vLLM has no Locality; drop 'locality'")
        return Placement(medium, hit_source, None)
    chosen = locality if locality is not None else default_locality
    # Exact names, as vLLM's fs tier: "local" is a ValueError.
    return Placement(medium, hit_source, Locality(chosen) if chosen is not None else None)


def tune_backpressure(detector: Any, backend: str, locality: str | None) -> None:
    """Storage backends get the defaults vLLM gives its own storage tiers.

    vLLM's factory fills the detector's defaults by tier type, and knows
    only "fs" and "obj" as storage: for this tier it leaves out the
    failure threshold and picks local-disk water marks. A disk backend
    gets fs's failure threshold; redis also gets the network water marks
    vLLM gives "obj" (unless 'locality' is "LOCAL", which the factory
    already honoured). The failure threshold is added only when unset,
    the water marks only when they are the factory's local defaults.
    """
    if EMABackpressureDetector is None or not isinstance(detector, EMABackpressureDetector):
        return
    if backend not in ("disk", "redis"):
        return
    ema = EMABackpressureDetector
    if getattr(detector, "_failure_threshold", 0) is None:
        detector._failure_threshold = ema.DEFAULT_FAILURE_THRESHOLD
    if (
        backend == "redis"
        and locality is None
        and (detector._high, detector._low) == (ema.LOCAL_HIGH_WATER_S, ema.LOCAL_LOW_WATER_S)
    ):
        detector._high = ema.NETWORK_HIGH_WATER_S
        detector._low = ema.NETWORK_LOW_WATER_S


def publishes_events(spec: Any, wanted: bool, tier_type: str) -> bool:
    """vLLM KV events: only with vLLM's global KV-events flag too, as vLLM's tiers."""
    if not wanted:
        return False
    kv_events = getattr(spec, "kv_events_config", None)
    if kv_events is not None and getattr(kv_events, "enable_kv_cache_events", False):
        return True
    logger.warning(
        "enable_kv_events is set on secondary tier '%s' but KV cache "
        "events are disabled globally; the tier will not emit events.",
        tier_type,
    )
    return False
