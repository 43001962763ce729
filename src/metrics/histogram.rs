//! A latency histogram with fixed, log-spaced buckets, recorded with relaxed
//! atomic adds: no lock and no allocation on the path that records.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the buckets, in nanoseconds: 1, 2.5 and 5 times each power
/// of ten from 100 ns to 100 s. From a 4 KiB memory copy (a few hundred
/// nanoseconds) to a job stuck behind a slow server, every bucket is within a
/// factor of 2.5 of its neighbours.
pub(crate) const BOUNDS_NS: [u64; 28] = {
    let mut bounds = [0u64; 28];
    let mut decade = 100u64;
    let mut i = 0;
    while i < 27 {
        bounds[i] = decade;
        bounds[i + 1] = decade * 5 / 2;
        bounds[i + 2] = decade * 5;
        decade *= 10;
        i += 3;
    }
    bounds[27] = decade;
    bounds
};

/// Observations per bucket: `BOUNDS_NS` and one more for "above the last".
#[derive(Default)]
pub(crate) struct Histogram {
    /// Non-cumulative: bucket `i` counts observations in
    /// `(BOUNDS_NS[i-1], BOUNDS_NS[i]]`; the last one those above every bound.
    buckets: [AtomicU64; BOUNDS_NS.len() + 1],
    sum_ns: AtomicU64,
}

/// A histogram read at one moment: cumulative counts, as exposed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HistogramSnapshot {
    /// Observations at most `BOUNDS_NS[i]`.
    pub cumulative: [u64; BOUNDS_NS.len()],
    /// Every observation (the `+Inf` bucket).
    pub count: u64,
    pub sum_ns: u64,
}

fn bucket_of(ns: u64) -> usize {
    BOUNDS_NS.partition_point(|&bound| bound < ns)
}

impl Histogram {
    /// One observation of `ns` nanoseconds.
    pub(crate) fn observe(&self, ns: u64) {
        self.observe_spread(ns, 1);
    }

    /// `n` observations sharing `total_ns` evenly (blocks moved back to back,
    /// or in one batch, whose individual times are not measured).
    pub(crate) fn observe_spread(&self, total_ns: u64, n: u64) {
        if n == 0 {
            return;
        }
        self.buckets[bucket_of(total_ns / n)].fetch_add(n, Ordering::Relaxed);
        self.sum_ns.fetch_add(total_ns, Ordering::Relaxed);
    }

    /// The counts now. Observations recorded meanwhile may be seen in some
    /// buckets and the sum but not yet in others; the count is the sum of the
    /// buckets read, so `+Inf` and `_count` always agree.
    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        let mut snap = HistogramSnapshot {
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
            ..HistogramSnapshot::default()
        };
        let mut running = 0u64;
        for (i, bucket) in self.buckets.iter().enumerate() {
            running += bucket.load(Ordering::Relaxed);
            if let Some(slot) = snap.cumulative.get_mut(i) {
                *slot = running;
            }
        }
        snap.count = running;
        snap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_one_two_and_a_half_and_five_per_decade() {
        assert_eq!(&BOUNDS_NS[..4], &[100, 250, 500, 1_000]);
        assert_eq!(BOUNDS_NS[27], 100_000_000_000);
        assert!(BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn an_observation_lands_in_the_first_bucket_that_holds_it() {
        let h = Histogram::default();
        h.observe(250); // on a bound: that bucket (le is "less or equal")
        h.observe(251);
        h.observe(u64::MAX / 2); // above every bound: only +Inf
        let s = h.snapshot();
        assert_eq!(s.cumulative[0], 0);
        assert_eq!(s.cumulative[1], 1);
        assert_eq!(s.cumulative[2], 2);
        assert_eq!(s.cumulative[27], 2);
        assert_eq!(s.count, 3);
        assert_eq!(s.sum_ns, 501 + u64::MAX / 2);
    }

    #[test]
    fn a_spread_counts_each_block_at_the_mean_and_sums_the_total() {
        let h = Histogram::default();
        h.observe_spread(4_000, 8); // 500 ns each
        h.observe_spread(1_000, 0); // nothing moved: nothing recorded
        let s = h.snapshot();
        assert_eq!(s.cumulative[1], 0);
        assert_eq!(s.cumulative[2], 8);
        assert_eq!(s.count, 8);
        assert_eq!(s.sum_ns, 4_000);
    }
}
