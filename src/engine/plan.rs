//! Planning under the index lock: which keys a store skips, evicts and
//! claims, which blocks a load pins and which stores it waits for. Every
//! allocation comes before the index changes, so a job that cannot get memory
//! is rejected and leaves no trace.

use super::jobs::{Item, Job};
use super::{Shared, State, Tier, WaitingLoad};
use crate::error::{alloc_error, bail, try_reserve, try_vec, ErrorKind, Result};
use crate::index::{try_long_tail, SlotState, INLINE_KEY};
use crate::stats::Counters;
use std::sync::Arc;

/// A load job writes each of its rows once: naming a row twice would make
/// the job's own copies race in that row. Small jobs (the common case) are
/// checked pairwise without allocating; larger ones mark rows in a bitmap
/// (one bit per row of the primary buffer) when that is smaller than a
/// sorted copy of the ids, so the check never needs more memory than the job.
pub(super) fn check_distinct_rows(block_ids: &[i64], rows: usize) -> Result<()> {
    const PAIRWISE_UP_TO: usize = 32;
    let what = "checking the job's rows for repeats";
    let repeated = if block_ids.len() <= PAIRWISE_UP_TO {
        block_ids
            .iter()
            .enumerate()
            .find_map(|(i, id)| block_ids[..i].contains(id).then_some(*id))
    } else if rows.div_ceil(64) <= block_ids.len() {
        let words = rows.div_ceil(64);
        let mut seen = try_vec::<u64>(words, what)?;
        seen.resize(words, 0);
        // Ids were checked against the row count: every one indexes `seen`.
        block_ids.iter().copied().find(|&id| {
            let (word, bit) = (id as usize / 64, 1u64 << (id as usize % 64));
            let repeat = seen[word] & bit != 0;
            seen[word] |= bit;
            repeat
        })
    } else {
        let mut sorted = try_vec::<i64>(block_ids.len(), what)?;
        sorted.extend_from_slice(block_ids);
        sorted.sort_unstable();
        sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
    };
    if let Some(row) = repeated {
        bail!(
            InvalidArg,
            "block_ids: row {row} appears twice; a load writes each row once"
        );
    }
    Ok(())
}

impl Tier {
    pub(super) fn check_rows(&self, block_ids: &[i64]) -> Result<()> {
        let rows = self.rows();
        if let Some((i, &id)) = block_ids
            .iter()
            .enumerate()
            .find(|&(_, &id)| id < 0 || id as u64 >= rows as u64)
        {
            bail!(
                OutOfRange,
                "block_ids[{i}]: {id} is not a row of the primary buffer (rows are 0 to {}, {rows} in all)",
                rows - 1
            );
        }
        Ok(())
    }
}

impl Shared {
    /// Plans a store under the index lock: skips keys present or in flight and
    /// duplicates, makes room by evicting LRU blocks that are not pinned, in
    /// flight, or part of this job, and claims slots. If there is not enough
    /// room, records NO_SPACE and changes nothing.
    ///
    /// Every allocation comes first: if one fails, returns `Alloc` and the
    /// tier is unchanged.
    pub(super) fn plan_store(
        &self,
        st: &mut State,
        job: &mut Job,
        block_ids: &[i64],
    ) -> Result<()> {
        let State { index, victims, .. } = st;
        let mut new: Vec<(u32, u64)> = try_vec(job.num_blocks as usize, "the store's new keys")?;
        let mut pinned = Vec::new();
        for pos in 0..job.num_blocks {
            let key = job.key(pos);
            let hash = index.hash(key);
            match index.find(key, hash) {
                Some(slot) => {
                    try_reserve(&mut pinned, 1, "the store's present keys")?;
                    pinned.push(slot);
                }
                None => new.push((pos, hash)),
            }
        }
        if new.len() > 1 {
            // Unstable sorts do not allocate; the order is total (the position
            // breaks ties), so it is the one a stable sort would give.
            new.sort_unstable_by(|a, b| {
                a.1.cmp(&b.1)
                    .then_with(|| job.key(a.0).cmp(job.key(b.0)))
                    .then(a.0.cmp(&b.0))
            });
            new.dedup_by(|later, first| later.1 == first.1 && job.key(later.0) == job.key(first.0));
            new.sort_unstable_by_key(|e| e.0);
        }
        let free = index.free_slots() as usize;
        let need = new.len().saturating_sub(free);
        let mut items = try_vec(new.len(), "the store's blocks")?;
        let mut tails = Vec::new();
        if job.key_len > INLINE_KEY {
            tails = try_vec(new.len(), "the store's long keys")?;
            for &(pos, _) in &new {
                tails.push(try_long_tail(job.key(pos))?);
            }
        }
        victims.clear();
        try_reserve(victims, need, "eviction victims")?;
        index.reserve(new.len(), need, job.key_len)?;

        // Nothing below allocates.
        // Keys of the job are not evicted while it runs, by its own evictions
        // or anyone else's.
        for &slot in &pinned {
            index.pin(slot);
        }
        let enough = need == 0 || index.pick_victims(need, victims);
        if !enough {
            for &slot in &pinned {
                index.unpin(slot);
            }
            job.fail(0, ErrorKind::NoSpace);
            return Ok(());
        }
        Counters::add(&self.counters.evictions, need as u64);
        for &v in &victims[..need] {
            index.evict(v);
        }
        job.pinned = pinned;
        let mut tails = tails.into_iter();
        items.extend(new.into_iter().map(|(pos, hash)| Item {
            pos,
            row: block_ids[pos as usize] as usize,
            slot: index.insert_storing_with(job.key(pos), hash, tails.next().flatten()),
        }));
        job.items = items;
        Ok(())
    }

    /// Plans a load under the index lock: pins each key's block up to the first
    /// missing key. Returns the job if it can run now; a job waiting for stores
    /// in flight is parked and dispatched when they finish.
    ///
    /// Every allocation comes first (`Job::new` made room for the items): if
    /// one fails, returns `Alloc` and the tier is unchanged.
    pub(super) fn plan_load(
        &self,
        st: &mut State,
        mut job: Job,
        block_ids: &[i64],
    ) -> Result<Option<Arc<Job>>> {
        debug_assert!(job.items.capacity() >= job.num_blocks as usize);
        let mut storing = Vec::new();
        for pos in 0..job.num_blocks {
            let key = job.key(pos);
            let slot = st.index.find(key, st.index.hash(key));
            let Some(slot) = slot.filter(|&s| st.index.state(s) != SlotState::Dead) else {
                job.fail(pos, ErrorKind::NotFound);
                break;
            };
            if st.index.state(slot) == SlotState::Storing {
                try_reserve(&mut storing, 1, "the load's keys in flight")?;
                storing.push((slot, pos));
            }
            job.items.push(Item {
                pos,
                row: block_ids[pos as usize] as usize,
                slot,
            });
        }
        let wait_id = st.next_wait_id;
        if !storing.is_empty() {
            let no_room = |n: usize| alloc_error::<(u64, u32)>(n, "the load's waits");
            if st.waiting.try_reserve(1).is_err() || st.waiters.try_reserve(storing.len()).is_err()
            {
                return Err(no_room(storing.len()));
            }
            for (i, &(slot, pos)) in storing.iter().enumerate() {
                let waiters = st.waiters.entry(slot).or_default();
                if waiters.try_reserve(1).is_err() {
                    // Take back the waits registered so far.
                    for &(slot, _) in &storing[..=i] {
                        if let Some(waiters) = st.waiters.get_mut(&slot) {
                            waiters.retain(|&(w, _)| w != wait_id);
                            if waiters.is_empty() {
                                st.waiters.remove(&slot);
                            }
                        }
                    }
                    return Err(no_room(storing.len()));
                }
                waiters.push((wait_id, pos));
            }
        }

        // Nothing below allocates.
        for item in &job.items {
            st.index.pin(item.slot);
        }
        let job = Arc::new(job);
        if storing.is_empty() {
            return Ok(Some(job));
        }
        st.next_wait_id += 1;
        st.waiting.insert(
            wait_id,
            WaitingLoad {
                job,
                deps: storing.len(),
            },
        );
        Ok(None)
    }
}
