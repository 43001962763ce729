//! Shared storage (a disk directory several processes use): a key absent
//! from this process's index may have been stored by another. A lookup
//! answers PENDING and a worker asks storage; the answer (found: the key
//! joins the index; not found: remembered for `probe_ttl_ms`) is kept in a
//! bounded LRU map, the least recently asked forgotten first.

use super::jobs::Work;
use super::shared::{Probe, Shared, State};
use crate::events::StoredReason;
use crate::index::{Admitted, LookupCounts, LookupState};
use crate::stats::Counters;
use crate::workers::Lane;
use hashlink::LruCache;
use std::time::Instant;

/// How many keys' probe answers (in flight, or "not in storage") are
/// remembered; beyond it the least recently asked are forgotten.
pub(super) const MAX_PROBE_MEMORY: usize = 65_536;

/// Most keys one probe asks storage about, for a backend that asks for many
/// in one round trip: a lookup of a long prefix, all PENDING, gets its
/// verdicts in one round trip per batch instead of one per key per worker.
const PROBE_BATCH: usize = 64;

impl Shared {
    /// Turns the MISS answers of a lookup in a shared tier into PENDING for
    /// keys storage should be asked about (not asked recently), and returns
    /// those keys; a key whose "not in storage" answer is fresh stays MISS.
    pub(super) fn probe_misses(
        st: &mut State,
        keys: &[u8],
        key_len: usize,
        out: &mut [u8],
        counts: &mut LookupCounts,
    ) -> Vec<Vec<u8>> {
        let mut to_probe = Vec::new();
        let now = Instant::now();
        for (i, state) in out.iter_mut().enumerate() {
            if *state != LookupState::Miss as u8 {
                continue;
            }
            let key = &keys[i * key_len..][..key_len];
            // `get` makes the answer most recent: a key looked up often keeps
            // its cached MISS however many others pass.
            let cached = st.probes.get(key).map(|p| match p {
                Probe::InFlight => None,
                Probe::Missing(until) => Some(*until),
            });
            match cached {
                Some(Some(until)) if now < until => continue,
                Some(None) => {}
                _ => {
                    if !Shared::note_probe(&mut st.probes, &mut to_probe, key) {
                        // Out of memory: no more probes this time.
                        break;
                    }
                }
            }
            *state = LookupState::Pending as u8;
            counts.misses -= 1;
            counts.pending += 1;
        }
        to_probe
    }

    /// Queues probes of `keys` for the workers: one per key, or batches of
    /// up to [`PROBE_BATCH`] for a backend that asks for many keys in one
    /// round trip.
    pub(super) fn queue_probes(&self, keys: Vec<Vec<u8>>) {
        if keys.is_empty() {
            return;
        }
        // Counted before a worker can finish them, so the gauge never dips
        // below the probes still to run.
        Counters::add(&self.counters.probes_in_flight, keys.len() as u64);
        let per_work = match self.backend.probes() {
            Some(probes) if probes.probes_in_batches() => PROBE_BATCH,
            _ => 1,
        };
        let mut batches = Vec::new();
        if batches.try_reserve(keys.len().div_ceil(per_work)).is_err() {
            self.forget_probes(keys.into_iter());
            return;
        }
        let mut keys = keys.into_iter().peekable();
        while keys.peek().is_some() {
            batches.push(Work::Probe(keys.by_ref().take(per_work).collect()));
        }
        if let Err(unqueued) = self.queue.push_all(Lane::Probes, batches.into_iter()) {
            // No memory to queue them.
            self.forget_probes(unqueued.flat_map(|work| match work {
                Work::Probe(keys) => keys,
                _ => Vec::new(),
            }));
        }
    }

    /// Forgets that `keys` are being probed, so that a later lookup asks for
    /// them again (they were answered PENDING and counted in flight).
    fn forget_probes(&self, keys: impl Iterator<Item = Vec<u8>>) {
        let mut forgotten = 0;
        {
            let mut st = self.state.lock();
            for key in keys {
                st.probes.remove(&key);
                forgotten += 1;
            }
        }
        self.probes_finished(forgotten);
    }

    /// `n` probes counted in flight have entered their answers (or will
    /// never run).
    fn probes_finished(&self, n: u64) {
        self.counters
            .probes_in_flight
            .fetch_sub(n, std::sync::atomic::Ordering::Release);
    }

    /// Remembers that `key` is being probed and queues it in `to_probe`;
    /// false (changing nothing) if there is no memory for that.
    pub(super) fn note_probe(
        probes: &mut LruCache<Vec<u8>, Probe>,
        to_probe: &mut Vec<Vec<u8>>,
        key: &[u8],
    ) -> bool {
        let copy = || {
            let mut v = Vec::new();
            v.try_reserve_exact(key.len()).ok()?;
            v.extend_from_slice(key);
            Some(v)
        };
        // The cache's own node is allocated infallibly: it holds at most
        // MAX_PROBE_MEMORY small entries, a bound the caller does not move.
        if to_probe.try_reserve(1).is_err() {
            return false;
        }
        let (Some(a), Some(b)) = (copy(), copy()) else {
            return false;
        };
        probes.insert(a, Probe::InFlight);
        to_probe.push(b);
        true
    }

    /// Asks storage for keys another process may have stored; a block found
    /// joins the index (making room like a store would). The index is updated
    /// inside the backend's answer for each key, while the backend holds off
    /// deleting that key.
    pub(super) fn run_probes(&self, keys: &[Vec<u8>]) {
        // Queued only for a backend with probes (see `Tier::lookup_into`).
        let Some(probes) = self.backend.probes() else {
            self.forget_probes(keys.iter().cloned());
            return;
        };
        let mut released = Vec::new();
        probes.probe_many(keys, &mut |i, found| {
            let key = &keys[i];
            let mut st = self.state.lock();
            let State {
                index,
                probes,
                victims,
                ..
            } = &mut *st;
            probes.remove(key);
            let admitted = if found {
                index.admit_found(key, victims, StoredReason::Found)
            } else if index.contains(key) {
                Admitted::Present
            } else {
                Admitted::NoRoom
            };
            match admitted {
                Admitted::Added { evicted, .. } => {
                    Counters::add(&self.counters.evictions, evicted as u64);
                }
                Admitted::Present => {}
                // Not in storage, or no room for it: MISS for a while.
                Admitted::NoRoom => {
                    probes.insert(key.clone(), Probe::Missing(Instant::now() + self.probe_ttl));
                }
            }
            released.append(&mut index.take_released());
        });
        // After the index holds every answer: a reader that sees the gauge
        // at 0 finds their admissions (and their events) in the tier.
        self.probes_finished(keys.len() as u64);
        self.discard(released);
    }
}
