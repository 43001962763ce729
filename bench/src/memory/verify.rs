//! Checking a load pass of the memory phases: every byte loaded back is
//! compared with what its source row was filled with. Bandwidth and first
//! fill both use it, so it sits below them.

use crate::buffer::{for_each_parallel, MappedBuf};
use crate::capi::Tier;
use crate::data::check_row;
use crate::jobs::{JobIds, Stream};
use crate::progress::Progress;

/// Untimed: poisons the destination rows, loads every key into them and
/// compares every byte with the data its source row was filled with.
#[allow(clippy::too_many_arguments)]
pub(super) fn verify(
    tier: &Tier,
    buf: &MappedBuf,
    load: &Stream,
    n: usize,
    block: usize,
    helpers: usize,
    ids: &mut JobIds,
    bar: &mut Progress,
) -> Result<u64, String> {
    for_each_parallel(helpers, n, |i| {
        // SAFETY: one thread per row; no job is in flight.
        unsafe { buf.slice_mut((n + i) * block, block) }.fill(0xa5);
        Ok::<(), String>(())
    })?;
    load.run(tier, ids, |b| bar.add(b))?;
    for_each_parallel(helpers, n, |i| {
        // SAFETY: the loads into these rows were all polled.
        let row = unsafe { buf.slice((n + i) * block, block) };
        match check_row(i as u64, row) {
            None => Ok(()),
            Some(at) => Err(format!(
                "verification failed: key {i} loaded into row {} differs from what was stored at byte {at}",
                n + i
            )),
        }
    })?;
    bar.add((n * block) as u64);
    Ok((n * block) as u64)
}
