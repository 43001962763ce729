"""What the SGLang backend tests share: real CPU host pools, the backend made
by SGLang's own factory from the ``dynamic`` config, and the cache
controller's own page get/set functions (as SGLang's CPU test of its
SeaweedFS backend drives a backend)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest

try:
    import torch
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
except Exception as exc:  # ImportError, or an SGLang that fails to import
    pytest.skip(
        f"SGLang is not importable ({exc!r}); the SGLang backend tests need "
        "sglang==0.5.23 installed with --no-deps plus python/requirements-engines.txt "
        "into a venv with torch (CI's engines venv)",
        allow_module_level=True,
    )

LAYOUTS = ("page_first", "page_first_direct", "layer_first")
PAGE = 4  # tokens per page
LAYERS = 3
TOKENS = 64  # device pool; the host pool holds twice as many


def make_pool(layout: str, mla: bool = False, page_size: int = PAGE, head_dim: int = 64,
              heads: int = 2, layers: int = LAYERS, dtype: Any = None) -> Any:
    """A real SGLang host pool on CPU, built from a CPU device pool's buffer
    info as SGLang's pool assembler does."""
    dtype = torch.bfloat16 if dtype is None else dtype
    if mla:
        dev = MLATokenToKVPool(TOKENS, page_size, dtype, head_dim // 2, 16, layers, "cpu", False,
                               start_layer=0, end_layer=layers)
        return MLATokenToKVPoolHost(
            dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, page_size, layout,
            pin_memory=False, device="cpu", override_kv_cache_dim=dev.kv_cache_dim,
            device_capacity_tokens=dev.size, start_layer=0, end_layer=layers, target_layer_num=layers,
        )
    dev = MHATokenToKVPool(TOKENS, page_size, dtype, heads, head_dim, layers, "cpu", False,
                           start_layer=0, end_layer=layers)
    return MHATokenToKVPoolHost(
        dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, page_size, layout,
        pin_memory=False, device="cpu", device_capacity_tokens=dev.size, start_layer=0, end_layer=layers,
    )


def make_backend(kvtier_config: dict[str, Any] | None = None, *, tp_rank: int = 0, tp_size: int = 1,
                 mla: bool = False, v1: bool = True, metrics: bool = False, model: str = "org/model",
                 dp_rank: int = 0, pp: tuple[int, int] = (0, 1), cp: tuple[int, int] = (0, 1)) -> Any:
    """The backend as SGLang's attach makes it: the factory, then the pool later."""
    extra = {"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KVTierStorage",
             "interface_v1": int(v1), **(kvtier_config or {})}
    config = HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp[0], pp_size=pp[1], attn_cp_rank=cp[0], attn_cp_size=cp[1],
        is_mla_model=mla, enable_storage_metrics=metrics, is_page_first_layout=True,
        model_name=model, extra_config=extra, dp_rank=dp_rank,
    )
    return StorageBackendFactory.create_backend("dynamic", config, None)


def attach(backend: Any, pool: Any) -> SimpleNamespace:
    """What the controller's page functions read from the controller."""
    backend.register_mem_pool_host(pool)
    return SimpleNamespace(storage_backend=backend, storage_host_pool=pool, page_size=pool.page_size)


def fill(pool: Any, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape, generator=g).to(pool.kv_buffer.dtype))


def page(pool: Any, i: int) -> Any:
    return pool.get_data_page(i * pool.page_size, flat=True).view(torch.uint8).clone()


def new_keys(n: int) -> list[str]:
    """Page keys as SGLang makes them: 64 hex digits."""
    return [uuid.uuid4().hex + uuid.uuid4().hex for _ in range(n)]


def indices(pages: list[int] | range, page_size: int = PAGE) -> Any:
    return torch.cat([torch.arange(p * page_size, (p + 1) * page_size, dtype=torch.int64) for p in pages])


def store(ctrl: SimpleNamespace, keys: list[str], host_indices: Any, v1: bool = True) -> bool:
    fn = HiCacheController._page_set_zero_copy if v1 else HiCacheController._generic_page_set
    return fn(ctrl, keys, host_indices)


def load(ctrl: SimpleNamespace, keys: list[str], host_indices: Any, v1: bool = True) -> int:
    fn = HiCacheController._page_get_zero_copy if v1 else HiCacheController._generic_page_get
    operation = SimpleNamespace(request_id="r", is_terminated=lambda: False)
    return fn(ctrl, operation, keys, host_indices)


def round_trip(backend: Any, layout: str, mla: bool = False, v1: bool = True, n: int = 4) -> tuple[Any, list[str]]:
    """Stores n random pages through the controller, wipes the pool, loads
    them back and checks every byte."""
    pool = make_pool(layout, mla)
    ctrl = attach(backend, pool)
    fill(pool)
    expected = [page(pool, i) for i in range(n)]
    keys = new_keys(n)
    assert store(ctrl, keys, indices(range(n)), v1)
    assert backend.batch_exists(keys) == n
    pool.kv_buffer.zero_()
    assert load(ctrl, keys, indices(range(n)), v1) == n
    for i in range(n):
        assert torch.equal(page(pool, i), expected[i]), f"page {i} differs"
    return pool, keys
