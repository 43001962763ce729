"""What the LMCache adapter's tests share: an L1 arena of LMCache's own
objects, the adapter built through LMCache's plugin factory, and waits on its
event fds. Imports LMCache and torch: a test module imports this after
``pytest.importorskip("lmcache")``."""

from __future__ import annotations

import os
import select
import time
from typing import Any

import torch
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.internal_api import L1MemoryDesc
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.plugin_l2_adapter import PluginL2AdapterConfig
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

ALIGN = 4096
WAIT_S = 30.0


class Arena:
    """A page-aligned CPU buffer standing for LMCache's L1 arena."""

    def __init__(self, nbytes: int) -> None:
        backing = torch.zeros(nbytes + ALIGN, dtype=torch.uint8)
        start = (-backing.data_ptr()) % ALIGN
        self.tensor = backing[start : start + nbytes]
        self.nbytes = nbytes
        self.desc = L1MemoryDesc(ptr=self.tensor.data_ptr(), size=nbytes, align_bytes=ALIGN)

    def obj(self, offset: int, length: int) -> TensorMemoryObj:
        """An L1 object of ``length`` bytes at ``offset``, as LMCache's
        allocator hands them out."""
        raw = self.tensor[offset : offset + length]
        meta = MemoryObjMetadata(
            shape=torch.Size([length]), dtype=torch.uint8, address=offset,
            phy_size=length, fmt=MemoryFormat.KV_2LTD, ref_count=1,
        )
        return TensorMemoryObj(raw, meta, parent_allocator=None)

    def fill(self, obj: TensorMemoryObj, seed: int) -> bytes:
        """Fills an object with a pattern of its own; returns the bytes."""
        n = obj.get_size()
        gen = torch.Generator().manual_seed(seed)
        data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
        obj.raw_data.copy_(data)
        return bytes(data.numpy())


def key(i: int, salt: str = "", model: str = "test/model", rank: int = 0) -> ObjectKey:
    return ObjectKey(
        chunk_hash=i.to_bytes(8, "big") + b"chunk", model_name=model, kv_rank=rank, cache_salt=salt
    )


def plugin_config(**params: Any) -> PluginL2AdapterConfig:
    """The config LMCache parses from ``{"type": "plugin", ...}``."""
    return PluginL2AdapterConfig.from_dict(
        {"module_path": "kvtier.lmcache", "class_name": "KVTierL2Adapter", "adapter_params": params}
    )


def make_adapter(arena: Arena, **params: Any) -> Any:
    """The adapter as LMCache builds it: its factory, the plugin config and
    the arena's ``L1MemoryDesc``."""
    return create_l2_adapter(plugin_config(**params), l1_memory_desc=arena.desc)


def wait_fd(fd: int, timeout_s: float = WAIT_S) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if not poller.poll(int(timeout_s * 1000)):
        return False
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass
    return True


def store(adapter: Any, keys: list, objs: list) -> Any:
    """Submits a store task and waits for its result."""
    task = adapter.submit_store_task(keys, objs)
    return wait_store(adapter, {task})[task]


def wait_store(adapter: Any, tasks: set[int]) -> dict[int, Any]:
    """Waits for the store results of ``tasks`` (popping them all)."""
    done: dict[int, Any] = {}
    deadline = time.monotonic() + WAIT_S
    while not tasks <= done.keys():
        assert time.monotonic() < deadline, f"store tasks {tasks - done.keys()} never completed"
        wait_fd(adapter.get_store_event_fd(), 0.2)
        done.update(adapter.pop_completed_store_tasks())
    return done


def _wait_query(fd: int, query: Any, task: int) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        result = query(task)
        if result is not None:
            return result
        assert time.monotonic() < deadline, f"task {task} never completed"
        wait_fd(fd, 0.2)


def lookup(adapter: Any, keys: list) -> list[bool]:
    """Lookup-and-lock: which keys were found (and are now locked)."""
    task = adapter.submit_lookup_and_lock_task(keys, {})
    bitmap = _wait_query(adapter.get_lookup_and_lock_event_fd(), adapter.query_lookup_and_lock_result, task)
    return [bitmap.test(i) for i in range(len(keys))]


def load(adapter: Any, keys: list, objs: list) -> list[bool]:
    """A load task's bitmap, as a list."""
    task = adapter.submit_load_task(keys, objs)
    return wait_load(adapter, task, len(keys))


def wait_load(adapter: Any, task: int, n: int) -> list[bool]:
    bitmap = _wait_query(adapter.get_load_event_fd(), adapter.query_load_result, task)
    return [bitmap.test(i) for i in range(n)]


def present(adapter: Any, keys: list) -> list[bool]:
    """Which keys the adapter holds now (lookup-and-lock, then unlock)."""
    found = lookup(adapter, keys)
    adapter.submit_unlock(keys)
    return found
