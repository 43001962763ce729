//! What a tier can do, read from its backend's capabilities (fixed when it
//! opens), so an engine asks instead of trying a call and reading the error.

use super::Tier;
use crate::codes::c_codes;

c_codes! {
    /// One thing a tier can do or is; the discriminant is the C
    /// `TIER_FEATURE_*` bit, so a set of them is a bitmask.
    pub enum Feature: u64 {
        /// Takes extent jobs (stores and loads of shorter blocks).
        Extents = TIER_FEATURE_EXTENTS,
        /// Other processes may store into its storage; lookups probe it.
        Shared = TIER_FEATURE_SHARED,
        /// Blocks are sealed with a seal key.
        Sealed = TIER_FEATURE_SEALED,
        /// Stored blocks outlive the tier.
        Persistent = TIER_FEATURE_PERSISTENT,
    }
}

impl Tier {
    /// Whether the tier has `feature`. Takes no lock: the answer is the
    /// backend's, fixed since it opened.
    pub fn has_feature(&self, feature: Feature) -> bool {
        let backend = &self.shared.backend;
        match feature {
            Feature::Extents => backend.stores_extents(),
            Feature::Shared => backend.probes().is_some(),
            Feature::Sealed => backend.seals(),
            Feature::Persistent => backend.persistence().is_some(),
        }
    }

    /// Every feature the tier has, as the bitmask of their
    /// `TIER_FEATURE_*` bits.
    pub fn features(&self) -> u64 {
        Feature::ALL
            .iter()
            .filter(|&&f| self.has_feature(f))
            .fold(0, |bits, f| bits | f.code())
    }
}
