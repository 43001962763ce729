"""Tier's calls on keys packed back to back (lookup_packed,
submit_store_packed, submit_load_packed): the C API's own form, for engines
that hold a batch's keys in one buffer."""

import numpy as np
import pytest

import kvtier
from kvtier import LookupState, Tier

KEY_LEN = 16


def packed(*ns: int) -> bytes:
    return b"".join(n.to_bytes(KEY_LEN, "big") for n in ns)


@pytest.fixture
def tier():
    buf = np.zeros((8, 4096), dtype=np.uint8)
    with Tier(buf, capacity_bytes="64KiB", io_threads=1) as t:
        t.buf = buf
        yield t


def finish(tier: Tier) -> kvtier.JobResult:
    tier.drain()
    [r] = tier.poll()
    return r


def test_store_lookup_load_on_packed_keys(tier):
    tier.buf[0], tier.buf[1] = 7, 9
    tier.submit_store_packed(1, packed(1, 2), KEY_LEN, np.array([0, 1]))
    assert finish(tier).ok
    states = tier.lookup_packed(packed(1, 3, 2), KEY_LEN)
    assert list(states) == [LookupState.HIT, LookupState.MISS, LookupState.HIT]
    assert tier.lookup_packed(b"", KEY_LEN) == b""
    tier.submit_load_packed(2, packed(2, 1), KEY_LEN, [4, 5])
    assert finish(tier).ok
    assert (tier.buf[4] == 9).all() and (tier.buf[5] == 7).all()
    # Packed or listed, the same bytes name the same blocks.
    assert tier.lookup([k.to_bytes(KEY_LEN, "big") for k in (1, 2)]) == [LookupState.HIT] * 2


def test_packed_arguments_are_checked(tier):
    with pytest.raises(kvtier.KVTierError, match="not whole keys of 16 bytes"):
        tier.lookup_packed(packed(1)[:-1], KEY_LEN)
    with pytest.raises(kvtier.KVTierError, match="key_len must be a positive int"):
        tier.lookup_packed(packed(1), 0)
    with pytest.raises(kvtier.KVTierError, match="2 keys but 1 block ids"):
        tier.submit_store_packed(3, packed(1, 2), KEY_LEN, [0])
    with pytest.raises(kvtier.KVTierError) as err:  # the library's own limit
        tier.lookup_packed(bytes(129), 129)
    assert err.value.status == kvtier.TIER_ERR_INVALID_ARG
    tier.close()
    with pytest.raises(kvtier.KVTierError) as err:
        tier.lookup_packed(packed(1), KEY_LEN)
    assert err.value.status == kvtier.TIER_ERR_SHUTDOWN
