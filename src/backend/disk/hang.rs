//! Test seam (feature `test-hooks`): makes the disk backend's storage calls
//! hang at a chosen point, as a call on a hung mount would, until the test
//! lets them go. For the exact interleavings of a deadline with a call that
//! returns late.

use crate::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Where a storage call hangs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HangPoint {
    /// A store, after it created its temporary file and before it read a byte
    /// of its row: an `open` that completes late.
    Create,
    /// A load, after a read returned the block's bytes (under a deadline,
    /// each read of a piece of a block larger than a piece): a `pread` that
    /// completes late.
    Read,
    /// A store, after it wrote its temporary file, before publishing it: a
    /// `pwrite` that completes late.
    Write,
    /// A store, after the rename that published its file: a rename that
    /// completes late.
    Publish,
}

#[derive(Default)]
struct Held {
    point: Option<HangPoint>,
    /// Calls at `point` that will pass before the next ones hang.
    pass: usize,
    /// Calls at `point` that will still hang.
    budget: usize,
    /// Calls hanging now.
    hanging: usize,
    /// Calls that hung since the tier opened.
    hung: usize,
}

/// Storage calls that hang at a point, a given number of them.
#[derive(Default)]
pub(crate) struct HangSeam {
    held: Mutex<Held>,
    changed: Condvar,
}

impl HangSeam {
    /// Called by the backend at `at`: hangs while the seam is set there.
    pub(crate) fn pause(&self, at: HangPoint) {
        let mut held = self.held.lock();
        if held.point != Some(at) || held.budget == 0 {
            return;
        }
        if held.pass > 0 {
            held.pass -= 1;
            return;
        }
        held.budget -= 1;
        held.hanging += 1;
        held.hung += 1;
        self.changed.notify_all();
        while held.point == Some(at) {
            self.changed.wait(&mut held);
        }
        held.hanging -= 1;
        self.changed.notify_all();
    }

    /// After `pass` more storage calls reach `point`, the next `calls` hang
    /// there until [`HangSeam::release`].
    pub(crate) fn set(&self, point: HangPoint, pass: usize, calls: usize) {
        let mut held = self.held.lock();
        held.point = Some(point);
        held.pass = pass;
        held.budget = calls;
        self.changed.notify_all();
    }

    /// Lets every hanging call go, and no more hang.
    pub(crate) fn release(&self) {
        let mut held = self.held.lock();
        held.point = None;
        held.budget = 0;
        self.changed.notify_all();
    }

    /// Waits up to `timeout` until `n` calls have hung since the tier
    /// opened; returns how many have.
    pub(crate) fn wait_hung(&self, n: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut held = self.held.lock();
        while held.hung < n && !self.changed.wait_until(&mut held, deadline).timed_out() {}
        held.hung
    }

    /// Waits up to `timeout` until no call hangs; true if none does.
    pub(crate) fn wait_released(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut held = self.held.lock();
        while held.hanging > 0 && !self.changed.wait_until(&mut held, deadline).timed_out() {}
        held.hanging == 0
    }
}
