//! The calls for engines whose objects are not rows (LMCache): stores and
//! loads of (key, offset, length) extents, per-key deletes, and pins
//! (lookup-and-lock), each with a result per key.

use super::jobs::{FailReason, ItemSink, ItemStatus, Job, JobKind};
use super::Tier;
use crate::error::{alloc_error, bail, try_vec, Result};
use crate::index::{Deleted, LookupState};
use crate::key::{check_keys, count_keys};
use crate::primary::Extent;
use std::sync::Arc;

/// A load's extents must not overlap: two copies into the same bytes would
/// race, as two items of one row would (see `check_distinct_rows`).
fn check_disjoint(extents: &[Extent]) -> Result<()> {
    let mut order = try_vec::<usize>(extents.len(), "checking the extents for overlaps")?;
    order.extend(0..extents.len());
    order.sort_unstable_by_key(|&i| extents[i].offset);
    if let Some(w) = order
        .windows(2)
        .find(|w| extents[w[0]].offset + extents[w[0]].len > extents[w[1]].offset)
    {
        bail!(
            InvalidArg,
            "offsets: extents {} and {} overlap; a load writes each byte once",
            w[0],
            w[1]
        );
    }
    Ok(())
}

impl Tier {
    /// Submits a store of `extents.len()` keys, key `i` from the `extents[i]`
    /// bytes of the primary buffer (1 to `block_bytes` long, anywhere in
    /// it); the length is stored with the block. Otherwise as
    /// [`Tier::submit_store`]; `sink` gets a result per key before the job
    /// is reported.
    pub fn submit_store_extents(
        &self,
        job_id: u64,
        keys: &[u8],
        key_len: usize,
        extents: &[Extent],
        sink: Option<Arc<dyn ItemSink>>,
    ) -> Result<()> {
        self.submit_extents(JobKind::Store, job_id, keys, key_len, extents, sink)
    }

    /// Submits a load of `extents.len()` keys, key `i` into the `extents[i]`
    /// bytes of the primary buffer, whose length must be the stored one (else
    /// that key fails with `FailReason::LengthMismatch` and nothing is
    /// copied for it). Unlike [`Tier::submit_load`], the job goes on past a
    /// key that misses or fails: `sink` says which keys loaded. Extents of
    /// one load must not overlap (`InvalidArg`).
    pub fn submit_load_extents(
        &self,
        job_id: u64,
        keys: &[u8],
        key_len: usize,
        extents: &[Extent],
        sink: Option<Arc<dyn ItemSink>>,
    ) -> Result<()> {
        self.submit_extents(JobKind::Load, job_id, keys, key_len, extents, sink)
    }

    fn submit_extents(
        &self,
        kind: JobKind,
        job_id: u64,
        keys: &[u8],
        key_len: usize,
        extents: &[Extent],
        sink: Option<Arc<dyn ItemSink>>,
    ) -> Result<()> {
        self.check_process()?;
        let n = extents.len();
        check_keys(keys, key_len, n)?;
        for (i, &extent) in extents.iter().enumerate() {
            self.shared.primary.check_extent(i, extent)?;
        }
        if !self.shared.backend.stores_extents() {
            bail!(
                InvalidArg,
                "the {} backend does not store extents yet; use rows",
                self.shared.backend_name
            );
        }
        if kind == JobKind::Load {
            check_disjoint(extents)?;
        }
        // An extent job's items name their extent by position.
        let mut positions = try_vec::<i64>(n, "the job's extents")?;
        positions.extend(0..n as i64);
        let job = Job::new(job_id, kind, n as u32, keys, key_len)?.with_items(extents, sink)?;
        self.enqueue(job, &positions)
    }

    /// Submits a delete of the keys packed in `keys` from the tier and its
    /// storage, reported by [`Tier::poll`] like any job (kind `Delete`,
    /// successful; `num_done` counts the keys removed). Per key, in `sink`:
    /// OK (removed: a REMOVED event with reason `Deleted`, storage deletes
    /// the block as it does an evicted one), MISS (not in the tier), or
    /// BUSY (pinned by [`Tier::pin`], being loaded or being stored: left in
    /// place).
    pub fn submit_delete(
        &self,
        job_id: u64,
        keys: &[u8],
        key_len: usize,
        sink: Option<Arc<dyn ItemSink>>,
    ) -> Result<()> {
        self.check_process()?;
        let n = count_keys(keys, key_len)?;
        let job =
            Job::new(job_id, JobKind::Delete, n as u32, keys, key_len)?.with_items(&[], sink)?;
        self.shared.done.register(job_id)?;
        let released = {
            let mut st = self.shared.state.lock();
            for pos in 0..n as u32 {
                match st.index.delete(job.key(pos)) {
                    Deleted::Removed => {}
                    Deleted::Missing => job.note_item(pos, ItemStatus::Miss, FailReason::NotFound),
                    Deleted::Busy => job.note_item(pos, ItemStatus::Busy, FailReason::Busy),
                }
            }
            st.index.take_released()
        };
        self.shared.discard(released);
        if job.claim_report() {
            self.shared.report(&job);
        }
        Ok(())
    }

    /// Looks up the keys packed in `keys` as [`Tier::lookup_into`] does, and
    /// pins every HIT: its block is never evicted nor deleted until as many
    /// [`Tier::unpin`]s. A pin belongs to this tier (this process), also on
    /// shared storage: another process may still delete the stored block.
    /// Fails as `lookup_into` does, or with `Alloc` (nothing pinned).
    pub fn pin_into(&self, keys: &[u8], key_len: usize, out: &mut [u8]) -> Result<()> {
        self.lookup_into(keys, key_len, out)?;
        let hits = out.iter().filter(|&&s| s == LookupState::Hit as u8).count();
        if hits == 0 {
            return Ok(());
        }
        let mut st = self.shared.state.lock();
        let mut pinned = try_vec::<(usize, u32)>(hits, "the pins")?;
        st.user_pins
            .try_reserve(hits)
            .map_err(|_| alloc_error::<(Vec<u8>, Vec<u32>)>(hits, "the pins"))?;
        let mut outcome = Ok(());
        for (pos, state) in out.iter_mut().enumerate() {
            if *state != LookupState::Hit as u8 {
                continue;
            }
            let key = &keys[pos * key_len..][..key_len];
            // Room for the pin comes before the pin.
            let room = match st.user_pins.get_mut(key) {
                Some(slots) => slots.try_reserve(1).is_ok(),
                None => match try_vec::<u32>(1, "a pin") {
                    Ok(slots) => {
                        let mut copy = match try_vec::<u8>(key_len, "a pinned key") {
                            Ok(copy) => copy,
                            Err(e) => {
                                outcome = Err(e);
                                break;
                            }
                        };
                        copy.extend_from_slice(key);
                        st.user_pins.insert(copy, slots);
                        true
                    }
                    Err(_) => false,
                },
            };
            if !room {
                outcome = Err(alloc_error::<u32>(1, "a pin"));
                break;
            }
            match st.index.pin_readable(key) {
                Some(slot) => {
                    st.user_pins.get_mut(key).expect("made above").push(slot);
                    pinned.push((pos, slot));
                }
                // Removed since the lookup: not pinned, not a HIT.
                None => {
                    *state = LookupState::Miss as u8;
                    if st.user_pins.get(key).is_some_and(|slots| slots.is_empty()) {
                        st.user_pins.remove(key);
                    }
                }
            }
        }
        if outcome.is_err() {
            for &(pos, _) in &pinned {
                let key = &keys[pos * key_len..][..key_len];
                Self::drop_pin(&mut st, key);
            }
        }
        outcome
    }

    /// The states of the keys packed in `keys`, pinning each HIT (see
    /// [`Tier::pin_into`]).
    pub fn pin(&self, keys: &[u8], key_len: usize) -> Result<Vec<LookupState>> {
        let n = count_keys(keys, key_len)?;
        let mut out = try_vec(n, "the pin's answer")?;
        out.resize(n, 0u8);
        self.pin_into(keys, key_len, &mut out)?;
        Ok(out.into_iter().map(LookupState::from_byte).collect())
    }

    /// Drops one pin of each key packed in `keys` ([`Tier::pin`]); keys
    /// never pinned, or pinned as often as unpinned already, are ignored.
    /// Fails only for invalid arguments; in a forked child, does nothing.
    pub fn unpin(&self, keys: &[u8], key_len: usize) -> Result<()> {
        let n = count_keys(keys, key_len)?;
        if self.inherited() || n == 0 {
            return Ok(());
        }
        let released = {
            let mut st = self.shared.state.lock();
            if st.user_pins.is_empty() {
                return Ok(());
            }
            for key in keys.chunks_exact(key_len) {
                Self::drop_pin(&mut st, key);
            }
            st.index.take_released()
        };
        self.shared.discard(released);
        Ok(())
    }

    fn drop_pin(st: &mut super::shared::State, key: &[u8]) {
        let Some(slots) = st.user_pins.get_mut(key) else {
            return;
        };
        if let Some(slot) = slots.pop() {
            st.index.unpin_slot(slot);
        }
        if slots.is_empty() {
            st.user_pins.remove(key);
        }
    }
}
