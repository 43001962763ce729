"""What a block means: the identity namespace the engine adapters give a tier.

Two engines may exchange KV blocks only when the blocks' bytes mean the same
thing: the same weights, KV dtype, tokens per block, layers and parallel
layout (``docs/sharing.md``). The prompt's block hashes say nothing of that,
so the adapters derive a kvtier ``namespace`` from the engine's own config
and the library keeps blocks of different namespaces apart (separate disk
directories, Redis key names and block headers).

A namespace is a readable prefix (engine, model, dtype, tokens, parallel
layout, rank) and a 12-hex SHA-256 digest of the canonical JSON of every
field, so that a person can tell whose blocks they are and two configs that
differ anywhere get different names without the name growing with the
number of layers.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

# Digest length: as vLLM's FileMapper names its directories.
_DIGEST_LEN = 12
# Bumped when the derivation changes what it covers, so an engine running an
# older rule never shares blocks with a newer one.
_FORMAT = 1
# A readable model name in a namespace: the tail of long paths is the part
# that tells models apart (the digest covers the whole name).
_MODEL_CHARS = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def digest(fields: dict[str, Any]) -> str:
    """The first 12 hex digits of the SHA-256 of the canonical JSON of fields."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:_DIGEST_LEN]


def readable(name: Any) -> str:
    """A name for a namespace part: '/' and other unsafe runs become '-'."""
    text = _UNSAFE.sub("-", str(name)).strip("-") or "unnamed"
    return text[-_MODEL_CHARS:].lstrip("-") or "unnamed"


def with_user(derived: str, user: str) -> str:
    """The user's namespace is added after the derived one, never instead."""
    return f"{derived}/{user}" if user else derived


def _canonical_format(layout: Any) -> str:
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.canonical_mapping import (
            canonical_format_id,
        )

        return str(canonical_format_id(layout))
    except Exception:  # an older vLLM, or a layout it cannot name
        return f"canonical-{layout}"


def vllm_fields(spec: Any) -> dict[str, Any] | None:
    """The identity fields of a vLLM ``OffloadingSpec``, by the rules of
    vLLM's ``FileMapper.from_offloading_spec`` as its fs tier calls it
    (``blocks_per_file=spec.blocks_per_chunk``, ``parallel_agnostic=True``),
    plus the rank and the KV-cache layout; None when the spec carries no
    ``OffloadingConfig`` (tests' stand-ins, vLLM before 0.33)."""
    config = getattr(spec, "config", None)
    model = getattr(config, "model", None)
    if config is None or model is None or not hasattr(config, "parallel"):
        return None
    parallel = config.parallel
    replicated = bool(getattr(config, "replicated_layout", False))
    # Parallel sizes and rank drop out only where the bytes are the same
    # under any topology (FileMapper's rule for the fs tier).
    agnostic = bool(getattr(parallel, "is_parallelism_agnostic", False)) or replicated
    blocks_per_chunk = getattr(spec, "blocks_per_chunk", None)
    if blocks_per_chunk is None:
        blocks_per_chunk = config.cache.blocks_per_chunk
    fields: dict[str, Any] = {
        "model_name": model.name,
        "tokens_per_hash": config.cache.tokens_per_hash,
        "blocks_per_file": blocks_per_chunk,
        "tp_size": 1 if agnostic else parallel.tp_size,
        "pp_size": 1 if agnostic else parallel.pp_size,
        "pcp_size": 1 if agnostic else parallel.pcp_size,
        "dcp_size": 1 if agnostic else parallel.dcp_size,
        "rank": 0 if agnostic else parallel.rank,
        "dtype": str(model.dtype),
        "kv_cache_groups": [
            {"tokens_per_block": g.tokens_per_block, "layer_names": list(g.layer_names)}
            for g in config.groups
        ],
        "inference_engine": "vllm",
        "kvtier_identity": _FORMAT,
    }
    if not agnostic:
        fields["parallel_agnostic"] = False
    if replicated:
        fields["replicated_layout"] = True
    layout = getattr(config, "kv_cache_layout", None)
    if getattr(config, "canonical_layout", False):
        fields["canonical_format"] = _canonical_format(layout)
    # Beyond FileMapper: the direct layout copies the worker's KV pages as
    # they are, whose byte order depends on the attention backend's layout.
    if layout is not None:
        fields["kv_cache_layout"] = str(layout)
    return fields


def vllm_namespace(spec: Any) -> str | None:
    """``vllm/<model>/<dtype>/t<tokens per chunk>/<parallel>/r<rank>/<digest>``,
    or None when the spec has no ``OffloadingConfig``."""
    fields = vllm_fields(spec)
    if fields is None:
        return None
    groups = fields["kv_cache_groups"]
    per_block = groups[0]["tokens_per_block"] if groups else fields["tokens_per_hash"]
    if "parallel_agnostic" in fields:
        parallel = f"tp{fields['tp_size']}pp{fields['pp_size']}"
        parallel += "".join(
            f"{name}{fields[name + '_size']}" for name in ("pcp", "dcp") if fields[name + "_size"] > 1
        )
    else:
        parallel = "anytp"
    return "/".join(
        (
            "vllm",
            readable(fields["model_name"]),
            readable(fields["dtype"]),
            f"t{per_block * fields['blocks_per_file']}",
            parallel,
            f"r{fields['rank']}",
            digest(fields),
        )
    )


# Host-pool attributes (SGLang 0.5.x) that fix what a page's bytes are:
# geometry, the layers it holds and, under decode context parallelism, which
# tokens; those a pool lacks are left out.
_SGLANG_POOL_FIELDS = (
    "page_size", "layer_num", "start_layer", "end_layer", "head_num", "head_dim",
    "v_head_dim", "head_group_num", "kv_lora_rank", "qk_rope_head_dim", "kv_cache_dim",
    "dsa_kv_cache_store_fp8", "size_per_token", "dcp_size", "dcp_rank",
)


def sglang_namespace(config: Any, pool: Any, is_mla: bool, shared: bool) -> str:
    """``sglang/<model>/<layout>/<dtype>/<mha|mla>/p<page size>[/tp<rank>of<size>]
    [/dp<rank>][/pp<rank>of<size>][/cp<rank>of<size>]/<digest>`` for an SGLang
    ``HiCacheStorageConfig`` and host pool (``docs/sglang.md``)."""
    dtype = str(pool.dtype).replace("torch.", "")
    parts = ["sglang", readable(config.model_name or "model"), pool.layout, dtype,
             "mla" if is_mla else "mha", f"p{pool.page_size}"]
    fields: dict[str, Any] = {
        "inference_engine": "sglang",
        "kvtier_identity": _FORMAT,
        "model_name": config.model_name or "",
        "layout": pool.layout,
        "dtype": dtype,
        "mla": bool(is_mla),
        "pool": type(pool).__name__,
    }
    for name in _SGLANG_POOL_FIELDS:
        value = getattr(pool, name, None)
        if isinstance(value, (bool, int, str)):
            fields[name] = value
    if not is_mla:
        # MHA ranks hold other heads; MLA ranks hold the same latent KV.
        parts.append(f"tp{config.tp_rank}of{config.tp_size}")
        fields["tp"] = [config.tp_rank, config.tp_size]
    dp_rank = getattr(config, "dp_rank", 0) or 0
    if dp_rank and not shared:
        # Attention-DP replicas hold the same heads, but a directory or
        # keyspace that is not shared has one owner: one store each.
        parts.append(f"dp{dp_rank}")
        fields["dp_rank"] = dp_rank
    for name, short in (("pp", "pp"), ("attn_cp", "cp")):
        size = getattr(config, f"{name}_size", 1) or 1
        if size > 1:
            rank = getattr(config, f"{name}_rank")
            parts.append(f"{short}{rank}of{size}")
            fields[name] = [rank, size]
    return "/".join(parts + [digest(fields)])
