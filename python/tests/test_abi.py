"""The binding's ABI check at import: every ctypes struct's size against what
the library reports through tier_abi_info, and the reason code of a failed
job."""

import ctypes
import re
import subprocess
import sys
from pathlib import Path

import pytest
from child import child_env

import kvtier
from kvtier import _lib


class FakeLibrary:
    """A library whose tier_abi_info reports `changes` over the real one's."""

    def __init__(self, **changes):
        real = _lib.tier_abi_info_t()
        assert _lib.lib.tier_abi_info(ctypes.byref(real), ctypes.sizeof(real)) == 0

        @ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(_lib.tier_abi_info_t), ctypes.c_size_t)
        def tier_abi_info(out, size):
            ctypes.memmove(out, ctypes.byref(real), min(size, ctypes.sizeof(real)))
            for name, value in changes.items():
                setattr(out[0], name, value)
            return 0

        self.tier_abi_info = tier_abi_info


def test_the_library_matches_every_ctypes_struct():
    info = _lib.tier_abi_info_t()
    assert _lib.lib.tier_abi_info(ctypes.byref(info), ctypes.sizeof(info)) == 0
    assert info.abi_version == _lib.TIER_ABI_VERSION
    for field, struct in _lib.ABI_STRUCTS.items():
        assert getattr(info, field) == ctypes.sizeof(struct), struct.__name__
    _lib.check_abi(_lib.lib, kvtier.library_path)
    _lib.check_abi(FakeLibrary(), "fake")


@pytest.mark.parametrize(
    "field, struct", [(f, s.__name__) for f, s in _lib.ABI_STRUCTS.items()]
)
def test_a_struct_of_another_size_is_refused(field, struct):
    ours = ctypes.sizeof(_lib.ABI_STRUCTS[field])
    with pytest.raises(kvtier.AbiMismatchError) as err:
        _lib.check_abi(FakeLibrary(**{field: ours + 8}), "/somewhere/libkvtier.so")
    message = str(err.value)
    assert "refusing /somewhere/libkvtier.so" in message
    assert f"{struct} is {ours + 8} bytes there, {ours} here" in message
    assert "KVTIER_LIBRARY" in message


def test_another_abi_version_is_refused():
    with pytest.raises(kvtier.AbiMismatchError, match="ABI version 2, this binding speaks 1"):
        _lib.check_abi(FakeLibrary(abi_version=2), "fake")


def test_a_library_lacking_a_later_function_is_refused():
    # FakeLibrary has tier_abi_info alone: an ABI 1 library older than the
    # binding's KVTIER_1.1 functions.
    _lib.check_functions(_lib.lib, kvtier.library_path)
    with pytest.raises(kvtier.AbiMismatchError, match="lacks .*tier_config_get") as err:
        _lib.check_functions(FakeLibrary(), "/old/libkvtier.so")
    assert "refusing /old/libkvtier.so" in str(err.value) and "KVTIER_LIBRARY" in str(err.value)


def _loaded_libc() -> Path:
    """The C library this process runs with, as the loader mapped it."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if re.search(r"/libc(\.so|-[0-9.]+\.so)", path):
                return Path(path)
    raise AssertionError("no libc in /proc/self/maps")


def test_import_refuses_a_library_without_tier_abi_info():
    # A shared library without tier_abi_info stands for one older than ABI 1.
    older = _loaded_libc()
    env = child_env(KVTIER_LIBRARY=str(older))
    proc = subprocess.run(
        [sys.executable, "-c", "import kvtier"], env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "AbiMismatchError" in proc.stderr
    assert "has no tier_abi_info" in proc.stderr
    assert str(older) in proc.stderr


def test_failed_jobs_carry_a_reason():
    np = pytest.importorskip("numpy")
    primary = np.zeros((4, 4096), dtype=np.uint8)
    with kvtier.Tier(primary, capacity_bytes="8KiB", io_threads=1) as tier:
        tier.submit_load(1, [b"missing-key"], [0])
        tier.drain()
        [result] = tier.poll()
        assert result.status == kvtier.TIER_ERR_NOT_FOUND
        assert result.reason == kvtier.FailReason.NOT_FOUND
        tier.submit_store(2, [b"a", b"b", b"c"], [0, 1, 2])
        tier.drain()
        [result] = tier.poll()
        assert result.status == kvtier.TIER_ERR_NO_SPACE
        assert result.reason == kvtier.FailReason.NO_SPACE
        tier.submit_store(3, [b"a"], [0])
        tier.drain()
        [result] = tier.poll()
        assert result.ok and result.reason == kvtier.FailReason.NONE
