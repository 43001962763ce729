//! Shared storage's clear generation, as a tier follows it (see `Probes` in
//! `backend::capabilities`): `clear()` raises the generation in storage for
//! every process, and a tier trusts the generation it knows for one lease
//! (`probe_ttl_ms`, at least `shared::MIN_LEASE`) after it last read it. A
//! lookup past half the lease has a worker read it again ahead of the end;
//! past the lease its lookups answer PENDING where they would answer HIT
//! until that read returns. A new generation empties the index (its blocks
//! are the old generation's); a job's copies read it first. `clear()`
//! returns two leases after it raised the generation: by then every lease
//! granted before has ended, so no tier of the namespace, in any process,
//! answers HIT for, or loads, a block stored before the clear.

use super::jobs::Work;
use super::shared::Shared;
use crate::error::{Error, ErrorKind, Result};
use crate::workers::Lane;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

/// Turns the first `hits` HIT answers in `out` into PENDING; how many.
pub(super) fn hold_hits(out: &mut [u8], hits: u64) -> u64 {
    use crate::index::LookupState;
    let mut held = 0;
    for state in out.iter_mut() {
        if held == hits {
            break;
        }
        if *state == LookupState::Hit as u8 {
            *state = LookupState::Pending as u8;
            held += 1;
        }
    }
    held
}

/// The longest a clear spends deleting the old generation's blocks beyond
/// its two leases; what is left then is unreadable to every tier and ages
/// out (a disk file is deleted by the first tier that reads it).
const SWEEP_BUDGET: Duration = Duration::from_secs(10);

impl Shared {
    /// Whether a shared tier's lookup must hold its HITs (as PENDING,
    /// [`hold_hits`]) because its lease has ended.
    pub(super) fn lease_ended(&self) -> bool {
        self.backend.probes().is_some() && !self.lease.valid()
    }

    /// Whether a shared tier's lookup that found HITs should have the
    /// generation read again: its lease has ended or is past its half.
    pub(super) fn lease_ending(&self) -> bool {
        self.backend.probes().is_some() && self.lease.ending()
    }

    /// Queues one read of the generation, unless one is queued or running
    /// (after a lookup held its HITs; outside the index lock).
    pub(super) fn queue_generation_check(&self) {
        if !self.lease.checking.swap(true, Ordering::AcqRel)
            && self
                .queue
                .push_all(Lane::Probes, [Work::Generation].into_iter())
                .is_err()
        {
            self.lease.checking.store(false, Ordering::Release);
        }
    }

    /// Reads the generation (worker thread) and follows it.
    pub(super) fn check_generation(&self) -> Result<()> {
        let result = self.read_and_follow_generation();
        self.lease.checking.store(false, Ordering::Release);
        result
    }

    /// Before a job's copies: the generation is read again if the lease
    /// has ended, so no block is named or checked by a stale one.
    pub(super) fn ensure_generation(&self) -> Result<()> {
        if self.backend.probes().is_none() || self.lease.valid() {
            return Ok(());
        }
        self.read_and_follow_generation()
    }

    fn read_and_follow_generation(&self) -> Result<()> {
        let Some(probes) = self.backend.probes() else {
            return Ok(());
        };
        let asked = Instant::now();
        let generation = probes.read_generation()?;
        if generation != probes.generation() {
            self.enter_generation(generation);
        }
        self.lease.renew(asked);
        Ok(())
    }

    /// Uses `generation` from now on and forgets every block the index
    /// holds: they are an older generation's. Their storage is not
    /// discarded here: a clearing tier deletes the old generation's blocks,
    /// and the same names may already hold the new one's.
    fn enter_generation(&self, generation: u64) {
        let Some(probes) = self.backend.probes() else {
            return;
        };
        probes.use_generation(generation);
        let mut st = self.state.lock();
        st.index.clear();
        st.probes.clear();
        st.load_failures.clear();
        drop(st.index.take_released());
    }

    /// `clear()` on shared storage: a new generation for every process,
    /// the old one's blocks deleted, and the return held until every
    /// lease granted before the new generation has ended.
    pub(super) fn clear_shared(&self) -> Result<()> {
        let Some(probes) = self.backend.probes() else {
            return Ok(());
        };
        let began = Instant::now();
        let began_wall = SystemTime::now();
        // This tier's own HITs wait for the new generation too.
        self.lease.end();
        let advanced = probes.advance_generation();
        let generation = probes.generation();
        self.enter_generation(generation);
        // Every lease another tier was granted before the new generation
        // was read from storage before it was raised, i.e. before now.
        let returns_at = Instant::now() + 2 * self.lease.length;
        let generation = match advanced {
            Ok(generation) => generation,
            Err(e) => {
                return Err(Error::new(
                    e.kind(),
                    format!(
                        "clear: this tier's blocks are dropped, but the namespace's generation \
                         could not be raised, so other tiers may still read them: {}",
                        e.message()
                    ),
                ))
            }
        };
        self.lease.renew(began);
        let swept =
            probes.sweep_before(generation, began_wall, returns_at.max(began + SWEEP_BUDGET));
        let now = Instant::now();
        if now < returns_at {
            std::thread::sleep(returns_at - now);
        }
        swept.map(drop).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!(
                    "clear: every tier now misses the blocks stored before it, but not all \
                     of them were deleted: {}",
                    e.message()
                ),
            )
        })
    }
}
