"""The presence mirror (kvtier._mirror) on its own, over a real memory tier
and without any engine: its answers are the library's, it asks the library
exactly when it cannot know, and it counts what it answered."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from kvtier import LookupState, Tier
from kvtier._mirror import PresenceMirror

ROW = 4096
ANSWERS = ("MISS", "HIT", "PENDING")


class Req:
    def __init__(self, req_id: str) -> None:
        self.req_id = req_id


REQ = Req("r")


def key(n: int) -> bytes:
    return n.to_bytes(8, "big") * 2


class Owner:
    """Drives a tier and its mirror the way an engine adapter does: touch
    promised keys before a store, record submitted jobs, settle reported
    ones, then drain the events and resync."""

    def __init__(self, rows: int = 16, capacity_blocks: int = 8, enabled: bool = True, shared: bool = False,
                 emit: bool = False, lease_s: float = 1.0, tier_config: dict | None = None, **config):
        self.buf = np.zeros((rows, ROW), dtype=np.uint8)
        config.update(tier_config or {})
        self.tier = Tier(self.buf, capacity_bytes=capacity_blocks * ROW, io_threads=1, events=True, **config)
        self.failed_keys: dict[str, set[bytes]] = {}
        self.errors: list[tuple[str, BaseException]] = []
        self.runs: list[tuple[bool, list[bytes]]] = []
        self.mirror = PresenceMirror(
            self.tier, enabled=enabled, shared=shared, answers=ANSWERS, failed_keys=self.failed_keys, lease_s=lease_s,
            on_error=lambda what, exc: self.errors.append((what, exc)),
            emit=(lambda removed, keys: self.runs.append((removed, list(keys)))) if emit else None,
        )
        self.jobs: dict[int, tuple[bool, list[bytes], set[bytes] | None]] = {}
        self.next_id = 1

    def submit(self, keys: list[bytes], rows: list[int], load: bool = False) -> int:
        job_id, self.next_id = self.next_id, self.next_id + 1
        if load:
            self.tier.submit_load(job_id, keys, rows)
        else:
            self.mirror.before_store()
            self.tier.submit_store(job_id, keys, rows)
        self.jobs[job_id] = (load, keys, self.mirror.submitted(keys, load))
        return job_id

    def finish(self) -> list:
        self.tier.drain()
        results = self.tier.poll()
        for r in results:
            load, keys, promised = self.jobs.pop(r.job_id)
            self.mirror.settled(keys)
            if load and not r.ok:
                self.mirror.load_failed(promised, keys[r.num_done:])
        self.mirror.drain_events()
        self.mirror.resync(len(self.jobs))
        return results

    def library(self, k: bytes) -> str:
        return ANSWERS[self.tier.lookup_one(k)]

    def close(self) -> None:
        self.tier.close()


@pytest.fixture
def owner():
    made = []

    def make(**kw):
        o = Owner(**kw)
        made.append(o)
        return o

    yield make
    for o in made:
        o.close()


def test_a_complete_mirror_answers_without_the_library(owner):
    o = owner()
    o.submit([key(1), key(2)], [0, 1])
    o.finish()
    assert o.mirror.complete
    assert [o.mirror.lookup(key(n), REQ) for n in (1, 2, 3)] == ["HIT", "HIT", "MISS"]
    stats = o.mirror.stats()
    assert (stats["mirror_lookups"], stats["mirror_hits"], stats["library_lookups"]) == (3, 2, 0)
    assert stats["keys"] == 2 and stats["unsettled"] == 0


def test_keys_of_unreported_jobs_are_asked_of_the_library(owner):
    o = owner()
    o.submit([key(1)], [0])
    o.tier.drain()  # done in the library, not yet reported to the owner
    assert o.mirror.lookup(key(1), REQ) == "HIT"
    assert o.mirror.stats()["library_lookups"] == 1
    o.finish()
    assert o.mirror.lookup(key(1), REQ) == "HIT"
    assert o.mirror.stats()["library_lookups"] == 1


def fill(o: Owner, *ns: int) -> None:
    """Stores one key per job, in order: the first is the least recently used."""
    for n in ns:
        o.submit([key(n)], [n])
        o.finish()


def test_evictions_made_at_submit_are_in_the_mirror_at_once(owner):
    o = owner(capacity_blocks=2)
    fill(o, 1, 2)
    o.submit([key(3)], [2])  # evicts key(1), the least recently used, at submit
    assert o.mirror.lookup(key(1), REQ) == "MISS" == o.library(key(1))
    assert o.mirror.stats()["library_lookups"] == 0


def test_a_promised_hit_is_kept_by_the_next_store_and_counted_if_its_load_fails(owner):
    o = owner(capacity_blocks=2)
    fill(o, 1, 2)
    assert o.mirror.lookup(key(1), REQ) == "HIT"  # promised: touched before the store
    o.submit([key(3)], [2])
    o.finish()
    assert (o.library(key(1)), o.library(key(2))) == ("HIT", "MISS")
    assert o.mirror.lookup(key(3), REQ) == "HIT"
    o.tier.clear()  # the promised block goes before its load
    o.submit([key(3)], [4], load=True)
    [r] = o.finish()
    assert not r.ok
    assert o.mirror.stats()["mirror_hit_failed_loads"] == 1


def test_end_step_forgets_promises(owner):
    o = owner(capacity_blocks=2)
    fill(o, 1, 2)
    assert o.mirror.lookup(key(1), REQ) == "HIT"
    o.mirror.end_step()  # not loaded this step: no longer kept
    o.submit([key(3)], [2])
    o.finish()
    assert (o.library(key(1)), o.library(key(2))) == ("MISS", "HIT")


def test_a_failed_load_misses_for_its_request_only(owner):
    o = owner()
    o.submit([key(1)], [0])
    o.finish()
    o.failed_keys["r"] = {key(1)}
    assert o.mirror.lookup(key(1), REQ) == "MISS"
    assert o.mirror.lookup(key(1), Req("other")) == "HIT"


def test_lost_events_make_it_ask_the_library_until_it_is_whole_again(owner):
    o = owner(capacity_blocks=8, events_capacity=2)
    o.submit([key(n) for n in range(6)], list(range(6)))
    o.tier.drain()
    o.mirror.drain_events()  # a LOST event, then the last STORED events the ring kept
    known = o.mirror.stats()["keys"]
    assert not o.mirror.complete and known < 6
    o.finish()
    assert not o.mirror.complete
    assert [o.mirror.lookup(key(n), REQ) for n in range(7)] == ["HIT"] * 6 + ["MISS"]
    assert o.mirror.stats()["library_lookups"] == 7 - known
    o.finish()  # six keys known, six blocks held, nothing in flight
    assert o.mirror.complete
    assert o.mirror.lookup(key(9), REQ) == "MISS"
    assert o.mirror.stats()["library_lookups"] == 7 - known


def test_shared_storage_is_never_complete(owner):
    o = owner(shared=True)
    o.submit([key(1)], [0])
    o.finish()
    assert not o.mirror.complete
    # No library answer vouches for the mirror yet (another process may have
    # cleared the namespace): the first HIT is asked too, then one lease of
    # mirror HITs follows.
    assert o.mirror.lookup(key(1), REQ) == "HIT"
    assert o.mirror.lookup(key(2), REQ) == "MISS"
    assert o.mirror.stats()["library_lookups"] == 2
    assert o.mirror.lookup(key(1), REQ) == "HIT"
    assert o.mirror.stats()["library_lookups"] == 2


def test_after_a_shared_tiers_probe_ends_the_mirror_answers_alone_again(owner, tmp_path):
    """A PENDING answer means a probe of shared storage may run (and evict on
    a worker), so the mirror defers to the library; once the library has no
    probe queued or running (probes_in_flight, a gauge) and the owner has
    resynced, a key the mirror holds is answered with no library call at all.
    (lookups_pending counts every PENDING answer ever given, so a mirror that
    waits for it to reach 0 defers for the tier's whole life.)"""
    o = owner(shared=True, lease_s=600.0, tier_config={
        "backend": "disk", "path": str(tmp_path / "shared"), "shared": True, "namespace": "t",
        "probe_ttl_ms": 600_000,  # the probe's "not stored" answer is kept for the test
    })
    o.submit([key(1)], [0])
    o.finish()
    assert o.mirror.lookup(key(1), REQ) == "HIT"  # a library answer: trusted for a lease
    assert o.mirror.lookup(key(2), REQ) == "PENDING"  # unknown here: storage is probed
    deadline = time.monotonic() + 10
    while o.library(key(2)) == "PENDING":  # until the probe's answer is in
        assert time.monotonic() < deadline, "the probe did not finish"
        time.sleep(0.005)
    o.finish()  # drain, poll, events, resync: what the adapter does each step
    before = o.mirror.stats()["library_lookups"]
    calls: list[str] = []
    for name in ("lookup_one", "lookup", "poll_events", "stats"):
        real = getattr(o.tier, name)
        setattr(o.tier, name, lambda *a, _real=real, _name=name, **k: (calls.append(_name), _real(*a, **k))[1])
    assert [o.mirror.lookup(key(1), REQ) for _ in range(3)] == ["HIT"] * 3
    assert calls == [], "the mirror asked the library after the probe ended"
    assert o.mirror.stats()["library_lookups"] == before


def test_disabled_it_holds_nothing_and_asks_the_library(owner):
    o = owner(enabled=False, emit=True)
    o.submit([key(1)], [0])
    o.finish()
    assert o.mirror.reads_events and o.mirror.stats()["keys"] == 0
    assert [o.mirror.lookup(key(n), REQ) for n in (1, 2)] == ["HIT", "MISS"]
    assert o.mirror.stats()["library_lookups"] == 2
    assert o.runs == [(False, [key(1)])]


def test_events_are_emitted_as_runs_of_one_kind(owner):
    o = owner(capacity_blocks=2, emit=True)
    fill(o, 1, 2)
    o.submit([key(3)], [3])  # evicts key(1), read at once
    o.submit([key(4)], [4])  # evicts key(2), read at once
    o.finish()  # both stores' STORED events: one run
    stored_together = [(True, [key(1)]), (True, [key(2)]), (False, [key(3), key(4)])]
    # The I/O thread may finish key(3)'s store before key(4)'s submit reads
    # the events: then each read holds one run of each kind.
    stored_apart = [(True, [key(1)]), (False, [key(3)]), (True, [key(2)]), (False, [key(4)])]
    assert o.runs[:2] == [(False, [key(1)]), (False, [key(2)])]
    assert o.runs[2:] in (stored_together, stored_apart)


def test_a_failing_lookup_is_a_miss_and_is_reported(owner):
    o = owner(enabled=False)
    o.tier.close()
    assert o.mirror.lookup(key(1), REQ) == "MISS"  # asked of the closed tier
    [(what, exc)] = o.errors
    assert what == "lookup" and "closed" in str(exc)


def test_it_answers_as_the_library_under_random_jobs(owner):
    rng = random.Random(58)
    o = owner(rows=16, capacity_blocks=6)
    for _ in range(120):
        keys = rng.sample(range(14), rng.randint(1, 4))
        rows = rng.sample(range(16), len(keys))
        if rng.random() < 0.6:
            o.submit([key(n) for n in keys], rows)
        else:
            hits = [key(n) for n in keys if o.mirror.lookup(key(n), REQ) == "HIT"]
            if hits:
                o.submit(hits, rows[: len(hits)], load=True)
        o.finish()
        o.mirror.end_step()
        for n in range(14):
            assert o.mirror.lookup(key(n), REQ) == o.library(key(n)), n
        o.mirror.end_step()
    assert o.mirror.complete and o.mirror.stats()["library_lookups"] == 0
    assert o.mirror.stats()["mirror_hit_failed_loads"] == 0
    assert LookupState.HIT == 1  # the answers above index by the library's numbers
