"""Every ``#define TIER_`` of include/kvtier.h has its Python counterpart with
the same value: the binding's codes are copied from the header once, and this
test fails the day they drift (a new code, a renumbered one, a new family)."""

import ctypes
import re
from pathlib import Path

import pytest

import kvtier
from kvtier import _lib

HEADER = Path(__file__).resolve().parent.parent.parent / "include" / "kvtier.h"

# Each code family and the Python enum holding it, by the prefix of its names.
FAMILIES = {
    "TIER_FAIL_": kvtier.FailReason,
    "TIER_EVENT_": kvtier.EventKind,
    "TIER_STORED_": kvtier.StoredReason,
    "TIER_REMOVED_": kvtier.RemovedReason,
    "TIER_JOB_": kvtier.JobKind,
    "TIER_ITEM_": kvtier.ItemStatus,
    "TIER_FEATURE_": kvtier.Feature,
}
LOOKUP_STATES = ("TIER_MISS", "TIER_HIT", "TIER_PENDING")
# The least struct sizes of ABI 1: the binding's structs are at least that big
# (an ABI may append fields, never shrink them).
SIZES_V1 = {
    "TIER_STATS_SIZE_V1": _lib.tier_stats_t,
    "TIER_JOB_RESULT_SIZE_V1": _lib.tier_job_result_t,
    "TIER_EVENT_SIZE_V1": _lib.tier_event_t,
    "TIER_ABI_INFO_SIZE_V1": _lib.tier_abi_info_t,
    "TIER_ITEM_RESULT_SIZE_V1": _lib.tier_item_result_t,
}

pytestmark = pytest.mark.skipif(not HEADER.is_file(), reason="no repository header here")


def header_defines() -> dict[str, int]:
    text = HEADER.read_text()
    lines = re.findall(r"^#define (TIER_\w+)(.*)$", text, re.M)
    assert lines, "no #define TIER_ in the header"
    defines = {}
    for name, rest in lines:
        value = re.fullmatch(r"\s+\(?(-?\d+)\)?\s*", rest)
        assert value, f"{name}: {rest.strip()!r} is not an integer; give it a Python counterpart and a case here"
        defines[name] = int(value.group(1))
    return defines


def test_every_define_has_a_python_constant_of_its_value():
    unmatched = []
    for name, value in header_defines().items():
        if name in SIZES_V1:
            assert ctypes.sizeof(SIZES_V1[name]) >= value, name
            continue
        if getattr(_lib, name, None) != value:
            unmatched.append(f"{name} = {value} (kvtier._lib: {getattr(_lib, name, 'missing')})")
    assert not unmatched, "kvtier/_lib.py differs from the header:\n" + "\n".join(unmatched)


def test_status_codes_come_from_the_library_and_cover_the_header():
    defines = header_defines()
    status = {n: v for n, v in defines.items() if n in ("TIER_OK", "TIER_TIMEOUT") or n.startswith("TIER_ERR_")}
    assert status == _lib.STATUS_CODES
    for name, code in status.items():
        assert getattr(kvtier, name) == code and name in kvtier.__all__


@pytest.mark.parametrize("prefix", FAMILIES)
def test_each_code_family_is_one_enum(prefix):
    enum = FAMILIES[prefix]
    defines = {n[len(prefix):]: v for n, v in header_defines().items() if n.startswith(prefix) and n not in SIZES_V1}
    assert {m.name: m.value for m in enum} == defines, enum.__name__


def test_lookup_states_are_the_header_states():
    defines = header_defines()
    assert {m.name: m.value for m in kvtier.LookupState} == {
        n[len("TIER_"):]: defines[n] for n in LOOKUP_STATES
    }
    assert tuple(kvtier.records.LOOKUP_STATES) == tuple(sorted(kvtier.LookupState))


def test_every_define_belongs_to_a_checked_group():
    checked = set(SIZES_V1) | set(LOOKUP_STATES) | {"TIER_ABI_VERSION", "TIER_MAX_KEY_LEN", "TIER_OK", "TIER_TIMEOUT"}
    prefixes = (*FAMILIES, "TIER_ERR_")
    stray = [n for n in header_defines() if n not in checked and not n.startswith(prefixes)]
    assert not stray, f"new header codes without a Python enum or a case here: {stray}"


def test_the_header_version_defines_are_the_librarys():
    # The KVTIER_VERSION_* defines (the only ones not named TIER_): the
    # header and the library it was generated with are one version.
    text = HEADER.read_text()
    defines = dict(re.findall(r"^#define (KVTIER_VERSION_\w+) (.*)$", text, re.M))
    assert set(defines) == {f"KVTIER_VERSION_{part}" for part in ("MAJOR", "MINOR", "PATCH", "STRING")}
    version = defines["KVTIER_VERSION_STRING"].strip('"')
    assert version == kvtier.library_version() == kvtier.__version__
    parts = [defines[f"KVTIER_VERSION_{p}"] for p in ("MAJOR", "MINOR", "PATCH")]
    assert ".".join(parts) == version
    every = re.findall(r"^#define (\w+)", text, re.M)
    assert [n for n in every if not n.startswith(("TIER_", "KVTIER_VERSION_", "KVTIER_H"))] == []
