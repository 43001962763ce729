"""What the engine adapters share (kvtier._adapter), without any engine: the
library judges every kvtier key, and the adapters read the few they need
(backend, shared, sharing) exactly as the library does."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest

import kvtier
from kvtier import _adapter, sglang, vllm
from kvtier._adapter import FailureLog, backend_of, check_config, is_shared, parse_bool

SPELLINGS = ["true", "True", " TRUE ", "1", "on", " yes", "false", "0", "off", "No ", "maybe", "", "2", "shared",
             "owned", " shared", "Shared ", "SHARED", " owned ", "tape"]


def library_accepts(key: str, value: object) -> bool:
    try:
        check_config({key: value})
    except kvtier.KVTierError as err:
        assert err.status == kvtier.TIER_ERR_CONFIG
        return False
    return True


def library_calls_shared(config: dict, tmp_path) -> bool:
    """The library's own verdict: shared storage without a namespace is
    refused at tier_new, before any storage is opened."""
    buf = np.zeros((2, 4096), dtype=np.uint8)
    try:
        with kvtier.Tier(buf, capacity_bytes="64KiB", **config):
            return False
    except kvtier.KVTierError as err:
        return "needs a namespace" in err.message


@pytest.mark.parametrize("value", SPELLINGS)
def test_disk_shared_is_read_as_the_library_reads_it(tmp_path, value):
    config = {"backend": "disk", "path": str(tmp_path / "kv"), "shared": value}
    if library_accepts("shared", value):
        assert is_shared(config) == library_calls_shared(config, tmp_path), value
    else:
        assert is_shared(config), "a value the library refuses opens nothing: counted shared"


@pytest.mark.parametrize("value", SPELLINGS)
def test_redis_sharing_is_read_as_the_library_reads_it(tmp_path, value):
    # Port 1: an owned tier's open fails on the connection, after the check.
    config = {"backend": "Valkey", "url": "redis://127.0.0.1:1", "sharing": value, "io_timeout_ms": 200}
    if library_accepts("sharing", value):
        assert is_shared(config) == library_calls_shared(config, tmp_path), value
    else:
        assert is_shared(config)


def test_memory_is_never_shared():
    assert not is_shared({"shared": True, "sharing": "shared"})


@pytest.mark.parametrize("name", ["memory", " Memory", "DISK", "redis", "valkey", " VALKEY ", "tape", ""])
def test_backend_kinds_are_the_librarys(name):
    kind = backend_of({"backend": name})
    assert (kind in ("memory", "disk", "redis")) == library_accepts("backend", name)
    assert backend_of({}) == "memory"


@pytest.mark.parametrize("value", [*SPELLINGS, True, False, 0, 1])
def test_the_adapters_flags_take_the_librarys_boolean_spellings(value):
    try:
        ours = parse_bool("owner", "flag", value)
    except ValueError as err:
        assert "owner: flag must be true or false" in str(err)
        ours = None
    theirs = library_accepts("prepare_dirs", value)
    assert (ours is not None) == theirs, value
    if theirs:
        assert ours == (str(value).strip().lower() in ("true", "1", "on", "yes")), value


def test_check_config_gives_the_librarys_message():
    with pytest.raises(kvtier.KVTierError) as err:
        check_config({"capacity_bytes": "1GiB", "no_such_key": 1})
    assert err.value.status == kvtier.TIER_ERR_CONFIG and "no_such_key" in str(err.value)
    with pytest.raises(kvtier.KVTierError, match="io_threads"):
        check_config({"io_threads": 0})
    check_config({"capacity_bytes": None, "seal_key": bytes(range(32)), "prepare_dirs": True})


def test_both_adapters_use_the_shared_readers():
    # One vocabulary: neither adapter keeps a parser of its own.
    for adapter in (vllm, sglang):
        for name in ("_parse_bool", "_is_shared", "_backend_of", "_check_config", "_TRUE", "_FALSE", "_BACKENDS"):
            assert not hasattr(adapter, name), (adapter.__name__, name)
    assert sglang.is_shared is _adapter.is_shared and sglang.backend_of is _adapter.backend_of
    assert vllm.is_shared is _adapter.is_shared and vllm.backend_of is _adapter.backend_of


CONFIGURATION_PAGE = Path(__file__).resolve().parent.parent.parent / "docs" / "configuration.md"


@pytest.mark.skipif(not CONFIGURATION_PAGE.is_file(), reason="no repository docs here")
def test_config_keys_are_the_documented_keys_in_order():
    documented = re.findall(r"^\| `(\w+)` \|", CONFIGURATION_PAGE.read_text(), re.M)
    assert kvtier.config_keys() == documented
    assert "io_timeout_ms" in documented and "backend" in documented


@pytest.mark.parametrize("value", [" shared", "Shared ", "SHARED", "shared", " owned ", "owned"])
def test_both_adapters_read_redis_sharing_alike(value):
    config = {"backend": "redis", "url": "redis://127.0.0.1:1", "sharing": value}
    expected = value.strip().lower() == "shared"
    assert vllm.is_shared(config) is sglang.is_shared(config) is expected, value


@pytest.mark.parametrize("value", [" true", "YES", " 1 ", "on", " false", "No", "0"])
def test_both_adapters_read_disk_shared_alike(value):
    config = {"backend": " Disk ", "path": "/nonexistent", "shared": value}
    expected = value.strip().lower() in ("true", "yes", "1", "on")
    assert vllm.is_shared(config) is sglang.is_shared(config) is expected, value
    assert vllm.backend_of(config) == sglang.backend_of(config) == "disk"


def test_the_library_reads_values_back_in_its_own_spelling():
    from kvtier._config import read_back

    values = read_back(
        {"backend": " Valkey", "sharing": " Shared", "shared": "YES", "io_threads": 3, "seal_key": bytes(range(32))},
        ("backend", "sharing", "shared", "io_threads", "io_timeout_ms", "seal_key", "seal_key_file"),
    )
    assert values == {
        "backend": "redis",
        "sharing": "shared",
        "shared": "true",
        "io_threads": "3",
        "io_timeout_ms": "auto",
        "seal_key": "set",
        "seal_key_file": "none",
    }
    with pytest.raises(kvtier.KVTierError, match="no_such_key") as err:
        read_back({}, ("no_such_key",))
    assert err.value.status == kvtier.TIER_ERR_CONFIG


def test_failure_log_throttles_by_interval(caplog):
    log = FailureLog(logging.getLogger("kvtier.test"), "kvtier tier 't'", 3600.0)
    with caplog.at_level(logging.DEBUG, logger="kvtier.test"):
        for _ in range(3):
            log.failed("lookup", RuntimeError("boom"))
        log.failed("touch", RuntimeError("boom"))
    assert [r.getMessage() for r in caplog.records] == [
        "kvtier tier 't': lookup failed: boom",
        "kvtier tier 't': touch failed: boom",
    ]


def test_failure_log_once_per_kind_with_traceback(caplog):
    log = FailureLog(logging.getLogger("kvtier.test"), "kvtier", None)
    with caplog.at_level(logging.DEBUG, logger="kvtier.test"):
        log.failed("batch_get", ValueError("x"))
        log.failed("batch_get", ValueError("y"))
        log.failed("batch_get", KeyError("z"))
    levels = [(r.levelno, r.exc_info is not None) for r in caplog.records]
    assert levels == [(logging.WARNING, True), (logging.DEBUG, False), (logging.WARNING, True)]
    assert "logged once" in caplog.records[0].getMessage()
