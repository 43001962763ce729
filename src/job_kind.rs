//! Which direction a job moves data: a value every layer names (the FFI's
//! results, the engine's jobs, the workers' lanes, the metrics' labels), so
//! it lives below them all.

/// Which direction a job moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum JobKind {
    /// Primary rows into the tier.
    Store = 1,
    /// Tier blocks into primary rows.
    Load = 2,
    /// Keys removed from the tier and its storage; no data moves.
    Delete = 3,
}
