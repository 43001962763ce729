//! What a tier says it can do (`Tier::features`, `tier_features`) on each
//! backend and choice it can differ on, checked against what the tier then
//! does (an extent store accepted or refused); and the gauge of probes in
//! flight on shared storage (`Stats::probes_in_flight`), which returns to 0
//! once every probe has entered its answer, unlike the cumulative
//! `lookups_pending`.

mod common;

use common::redis::{redis_config_at, shared_server};
use common::*;
use kvtier::{ErrorKind, Extent, Feature, LookupState, TierConfig};

const BB: usize = 8192;
const ROWS: usize = 4;

/// The features a tier has, by name, for readable failures.
fn features_of(config: &TierConfig) -> Vec<Feature> {
    let h = Harness::new(config, ROWS, BB);
    let tier = h.tier();
    let bits = tier.features();
    let has: Vec<Feature> = Feature::ALL
        .iter()
        .copied()
        .filter(|&f| tier.has_feature(f))
        .collect();
    assert_eq!(
        bits,
        has.iter().fold(0, |b, f| b | f.code()),
        "the bitmask is the features' bits"
    );
    // The EXTENTS bit is what an extent store finds: accepted (and stored)
    // with it, refused as an invalid argument without it.
    let extent = [Extent {
        offset: 0,
        len: 100,
    }];
    h.write_row(0, &pattern(1, BB));
    match tier.submit_store_extents(1, &key(1), KEY_LEN, &extent, None) {
        Ok(()) => {
            assert!(
                has.contains(&Feature::Extents),
                "an extent store was accepted"
            );
            let r = h.result_of(1);
            assert_eq!((r.error, r.num_done), (None, 1), "{r:?}");
        }
        Err(e) => {
            assert!(!has.contains(&Feature::Extents), "refused: {e}");
            assert_eq!(e.kind(), ErrorKind::InvalidArg, "{e}");
        }
    }
    has
}

fn shared(mut config: TierConfig) -> TierConfig {
    config.disk.shared = true;
    config
}

fn sealed(mut config: TierConfig) -> TierConfig {
    config.set("seal_key", SEAL_A).unwrap();
    config
}

use Feature::{Extents, Persistent, Sealed, Shared};

#[test]
fn memory_takes_extents_and_keeps_nothing_past_the_process() {
    assert_eq!(features_of(&memory_config(8, BB)), [Extents]);
}

#[test]
fn a_persistent_arena_is_persistent() {
    assert_eq!(
        features_of(&memory_persist_config(8, BB)),
        [Extents, Persistent]
    );
}

#[test]
fn disk_is_persistent_and_shared_when_asked_and_sealed_takes_no_extents() {
    assert_eq!(features_of(&disk_config(8, BB)), [Extents, Persistent]);
    assert_eq!(
        features_of(&shared(disk_config(8, BB))),
        [Extents, Shared, Persistent]
    );
    assert_eq!(
        features_of(&sealed(disk_config(8, BB))),
        [Sealed, Persistent]
    );
    assert_eq!(
        features_of(&sealed(shared(disk_config(8, BB)))),
        [Shared, Sealed, Persistent]
    );
}

#[test]
fn redis_is_persistent_shared_when_asked_and_sealed_takes_no_extents() {
    if !common::redis::redis_available() {
        return;
    }
    let server = shared_server().expect("a Redis server");
    let owned = || redis_config_at(&server.url(), 8, BB);
    let shared = || {
        let mut c = owned();
        c.set("sharing", "shared").unwrap();
        c.set("namespace", "features").unwrap();
        c
    };
    assert_eq!(features_of(&owned()), [Extents, Persistent]);
    assert_eq!(features_of(&shared()), [Extents, Shared, Persistent]);
    assert_eq!(features_of(&sealed(owned())), [Sealed, Persistent]);
    assert_eq!(features_of(&sealed(shared())), [Shared, Sealed, Persistent]);
}

#[test]
fn probes_in_flight_counts_queued_probes_and_returns_to_zero() {
    // Manual: probes wait in the queue until the test runs them. A "not in
    // storage" answer is remembered for a minute, longer than the test.
    let mut config = shared(disk_config(8, BB));
    config.probe_ttl_ms = 60_000;
    let h = Harness::manual(&config, ROWS, BB);
    let tier = h.tier();
    assert_eq!(
        h.lookup(&[1, 2, 3]),
        [LookupState::Pending; 3],
        "unknown keys of shared storage are probed"
    );
    let s = tier.stats();
    assert_eq!((s.probes_in_flight, s.lookups_pending), (3, 3));
    // Asked again while queued: PENDING, but no second probe.
    assert_eq!(h.lookup(&[1]), [LookupState::Pending]);
    assert_eq!(tier.stats().probes_in_flight, 3);
    assert!(tier.run_background() > 0);
    let s = tier.stats();
    assert_eq!((s.probes_in_flight, s.lookups_pending), (0, 4));
    // The answers are in: not in storage, a MISS while it is remembered.
    assert_eq!(h.lookup(&[1, 2, 3]), [LookupState::Miss; 3]);
    assert_eq!(tier.stats().probes_in_flight, 0);
}

#[test]
fn probes_in_flight_is_zero_where_nothing_is_probed() {
    let h = Harness::new(&disk_config(8, BB), ROWS, BB);
    assert_eq!(h.lookup(&[1, 2]), [LookupState::Miss; 2]);
    assert_eq!(h.tier().stats().probes_in_flight, 0);
}
