//! Test hooks (feature `test-hooks`, off in the shipped library): a tier
//! whose jobs run only when a test says so, and a simulated full device.

use super::Tier;
pub use crate::backend::disk::hang::HangPoint;
use crate::config::TierConfig;
use crate::error::Result;
use crate::primary::PrimaryBuffer;
use std::time::Duration;

impl Tier {
    /// A tier whose jobs run only when [`Tier::run_queued_job`] is called: for
    /// deterministic tests of the job state machine.
    pub fn new_manual(config: &TierConfig, primary: PrimaryBuffer) -> Result<Tier> {
        Self::build(config, primary, false)
    }

    /// Test seam: makes backend writes fail as if the device were full.
    pub fn simulate_full_device(&self, full: bool) {
        if let Some(seams) = self.shared.backend.test_seams() {
            seams.simulate_full_device(full);
        }
    }

    /// Runs all queued background work (probes, discards) on this thread
    /// (manual tiers only); returns how many items ran.
    pub fn run_background(&self) -> usize {
        if self.inherited() {
            return 0;
        }
        assert!(
            self.shared.crew.is_empty(),
            "run_background is for manual tiers"
        );
        let work = self.shared.queue.take_background();
        let n = work.len();
        work.into_iter().for_each(|w| self.shared.run(w, None));
        n
    }

    /// Runs the queued task of job `job_id` on this thread (manual tiers only).
    /// False if that job has no queued task (finished, or waiting on a store).
    pub fn run_queued_job(&self, job_id: u64) -> bool {
        if self.inherited() {
            return false;
        }
        assert!(
            self.shared.crew.is_empty(),
            "run_queued_job is for manual tiers"
        );
        match self.shared.queue.take_job(job_id) {
            Some(task) => {
                self.shared.run_task(task, None);
                true
            }
            None => false,
        }
    }
}

impl Tier {
    /// Test seam (disk only): after `pass` more storage calls reach
    /// `point`, the next `calls` hang there, as calls on a hung mount would,
    /// until [`Tier::release_disk_io`].
    pub fn hang_disk_io(&self, point: HangPoint, pass: usize, calls: usize) {
        self.seam().set(point, pass, calls);
    }

    /// Lets every storage call hanging at the seam go (the device recovers).
    pub fn release_disk_io(&self) {
        self.seam().release();
    }

    /// Waits up to `timeout` until `n` storage calls have hung at the seam
    /// since the tier opened; returns how many have.
    pub fn wait_disk_io_hung(&self, n: usize, timeout: Duration) -> usize {
        self.seam().wait_hung(n, timeout)
    }

    /// Waits up to `timeout` until no storage call hangs at the seam.
    pub fn wait_disk_io_released(&self, timeout: Duration) -> bool {
        self.seam().wait_released(timeout)
    }

    /// Where a disk tier stores the block of `key` (it need not exist).
    pub fn disk_block_path(&self, key: &[u8]) -> std::path::PathBuf {
        self.shared
            .backend
            .test_seams()
            .and_then(|seams| seams.block_path(key))
            .expect("disk_block_path is for the disk backend")
    }

    /// A handle on the disk seam that outlives the tier: a test frees the
    /// tier while calls hang there, then lets them go.
    pub fn disk_io_seam(&self) -> DiskIoSeam {
        DiskIoSeam(std::sync::Arc::clone(self.seam()))
    }

    /// Worker threads alive now (serving or stuck past the deadline).
    pub fn io_threads_alive(&self) -> usize {
        self.shared.crew.alive()
    }

    fn seam(&self) -> &std::sync::Arc<crate::backend::disk::hang::HangSeam> {
        self.shared
            .backend
            .test_seams()
            .and_then(|seams| seams.hang_seam())
            .expect("hang_disk_io is for the disk backend")
    }
}

/// The disk backend's hang seam, held apart from its tier (see
/// [`Tier::disk_io_seam`]).
pub struct DiskIoSeam(std::sync::Arc<crate::backend::disk::hang::HangSeam>);

impl DiskIoSeam {
    /// Lets every storage call hanging at the seam go.
    pub fn release(&self) {
        self.0.release();
    }

    /// Waits up to `timeout` until no storage call hangs at the seam.
    pub fn wait_released(&self, timeout: Duration) -> bool {
        self.0.wait_released(timeout)
    }
}
