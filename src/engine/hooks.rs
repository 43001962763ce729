//! Test hooks (feature `test-hooks`, off in the shipped library): a tier
//! whose jobs run only when a test says so, and a simulated full device.

use super::Tier;
use crate::config::TierConfig;
use crate::error::Result;
use crate::primary::PrimaryBuffer;

impl Tier {
    /// A tier whose jobs run only when [`Tier::run_queued_job`] is called: for
    /// deterministic tests of the job state machine.
    pub fn new_manual(config: &TierConfig, primary: PrimaryBuffer) -> Result<Tier> {
        Self::build(config, primary, false)
    }

    /// Test seam: makes backend writes fail as if the device were full.
    pub fn simulate_full_device(&self, full: bool) {
        self.shared.backend.simulate_full_device(full);
    }

    /// Runs all queued background work (probes, discards) on this thread
    /// (manual tiers only); returns how many items ran.
    pub fn run_background(&self) -> usize {
        if self.inherited() {
            return 0;
        }
        assert!(
            self.workers.is_empty(),
            "run_background is for manual tiers"
        );
        let work = self.shared.queue.take_background();
        let n = work.len();
        work.into_iter().for_each(|w| self.shared.run(w));
        n
    }

    /// Runs the queued task of job `job_id` on this thread (manual tiers only).
    /// False if that job has no queued task (finished, or waiting on a store).
    pub fn run_queued_job(&self, job_id: u64) -> bool {
        if self.inherited() {
            return false;
        }
        assert!(
            self.workers.is_empty(),
            "run_queued_job is for manual tiers"
        );
        match self.shared.queue.take_job(job_id) {
            Some(task) => {
                self.shared.run_task(task);
                true
            }
            None => false,
        }
    }
}
