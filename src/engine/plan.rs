//! Planning under the index lock: which keys a store skips, evicts and
//! claims, which blocks a load pins and which stores it waits for. Every
//! allocation comes before the index changes, so a job that cannot get memory
//! is rejected and leaves no trace.

use super::jobs::{FailReason, Job};
use super::shared::{Shared, State, WaitingLoad};
use super::Tier;
use crate::error::{alloc_error, bail, try_vec, ErrorKind, Result};
use crate::key::PackedKeys;
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
    /// Plans a store under the index lock (see [`Index::reserve_store`]): on
    /// success the job holds its blocks to copy and its pinned present keys;
    /// without room it records NO_SPACE and nothing changed; `Alloc` changes
    /// nothing either.
    ///
    /// [`Index::reserve_store`]: crate::index::Index::reserve_store
    pub(super) fn plan_store(
        &self,
        st: &mut State,
        job: &mut Job,
        block_ids: &[i64],
    ) -> Result<()> {
        let State { index, victims, .. } = st;
        match index.reserve_store(job.keys(), block_ids, victims)? {
            Some(reserved) => {
                Counters::add(&self.counters.evictions, reserved.evicted as u64);
                job.items = reserved.items;
                job.pinned = reserved.pinned;
                job.evicts_nothing = reserved.evicted == 0;
            }
            None => job.fail_all_with(ErrorKind::NoSpace, FailReason::NoSpace),
        }
        Ok(())
    }

    /// Plans a load under the index lock: pins each key's block up to the
    /// first missing key. Returns the job if it can run now; a job waiting for
    /// stores in flight is parked and dispatched when they finish.
    ///
    /// Every allocation comes first (`Job::new` made room for the items): if
    /// one fails, returns `Alloc` and the tier is unchanged.
    pub(super) fn plan_load(
        &self,
        st: &mut State,
        mut job: Job,
        block_ids: &[i64],
    ) -> Result<Option<Arc<Job>>> {
        let mut storing = Vec::new();
        let keys = PackedKeys::new(&job.keys, job.key_len);
        let per_item = job.per_item();
        let missing =
            st.index
                .find_load(keys, block_ids, per_item, &mut job.items, &mut storing)?;
        if missing.is_some() {
            // Every key without an item (in key order) is a miss; a load
            // with a result per key goes on past them.
            let mut found = job.items.iter().map(|item| item.pos).peekable();
            for pos in 0..job.num_blocks {
                if found.next_if_eq(&pos).is_some() {
                    continue;
                }
                job.fail(pos, ErrorKind::NotFound);
                if !per_item {
                    break;
                }
            }
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
        st.index.pin_load(&job.items);
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
