//! Which direction a job moves data: a value every layer names (the FFI's
//! results, the engine's jobs, the workers' lanes, the metrics' labels), so
//! it lives below them all.

use crate::codes::c_codes;

c_codes! {
    /// Which direction a job moves data.
    pub enum JobKind: u32 {
        /// Primary rows into the tier.
        Store = TIER_JOB_STORE,
        /// Tier blocks into primary rows.
        Load = TIER_JOB_LOAD,
        /// Keys removed from the tier and its storage; no data moves.
        Delete = TIER_JOB_DELETE,
    }
}
