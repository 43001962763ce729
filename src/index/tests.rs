//! Unit tests of the index structures.

use super::*;
use crate::events::EventKind;
use crate::key::PackedKeys;

fn key(i: u32) -> Vec<u8> {
    let mut k = vec![0u8; 36];
    k[..4].copy_from_slice(&i.to_be_bytes());
    k
}

fn store(ix: &mut Index, k: &[u8]) -> u32 {
    let h = ix.hash(k);
    let s = ix.insert_storing(k, h);
    ix.finish_store(s, true);
    s
}

fn lookup(ix: &Index, k: &[u8]) -> LookupState {
    let mut out = [9u8];
    ix.lookup_batch(k, k.len(), &mut out);
    assert!(out[0] <= 2, "bad state {}", out[0]);
    LookupState::from_byte(out[0])
}

#[test]
fn insert_find_evict_many_with_a_tiny_table() {
    // A fixed seed and many keys force long probe runs, table growth and
    // backward shifts.
    let mut ix = Index::new(5000, KeyHasher::with_seed(7));
    let slots: Vec<u32> = (0..5000).map(|i| store(&mut ix, &key(i))).collect();
    assert_eq!(ix.ready(), 5000);
    assert_eq!(ix.free_slots(), 0);
    for i in (0..5000).step_by(3) {
        ix.evict(slots[i as usize]);
    }
    for i in 0..5000u32 {
        let want = if i % 3 == 0 {
            LookupState::Miss
        } else {
            LookupState::Hit
        };
        assert_eq!(lookup(&ix, &key(i)), want, "key {i}");
        let found = ix.find(&key(i), ix.hash(&key(i)));
        assert_eq!(found.is_some(), i % 3 != 0);
    }
}

#[test]
fn batch_lookup_matches_single_lookups_including_tag_collisions() {
    let mut ix = Index::new(10_000, KeyHasher::with_seed(3));
    for i in 0..2000 {
        store(&mut ix, &key(i * 2));
    }
    let keys: Vec<u8> = (0..4000).flat_map(key).collect();
    let mut out = vec![9u8; 4000];
    let counts = ix.lookup_batch(&keys, 36, &mut out);
    assert_eq!(counts.hits, 2000);
    assert_eq!(counts.misses, 2000);
    for (i, &s) in out.iter().enumerate() {
        assert_eq!(s, (i % 2 == 0) as u8, "key {i}");
    }
}

#[test]
fn long_and_short_keys_coexist() {
    let mut ix = Index::new(100, KeyHasher::with_seed(1));
    let long_a = vec![1u8; 128];
    let mut long_b = vec![1u8; 128];
    long_b[127] = 2;
    let short = vec![1u8; 1];
    for k in [&long_a, &long_b, &short] {
        store(&mut ix, k);
    }
    assert_eq!(lookup(&ix, &long_a), LookupState::Hit);
    assert_eq!(lookup(&ix, &long_b), LookupState::Hit);
    assert_eq!(lookup(&ix, &short), LookupState::Hit);
    assert_eq!(lookup(&ix, &[1u8; 127]), LookupState::Miss);
    let mut buf = [0u8; MAX_KEY_LEN];
    let s = ix.find(&long_b, ix.hash(&long_b)).unwrap();
    let len = ix.key_of(s, &mut buf);
    assert_eq!(&buf[..len], &long_b[..]);
    ix.evict(s);
    assert_eq!(lookup(&ix, &long_b), LookupState::Miss);
    assert_eq!(lookup(&ix, &long_a), LookupState::Hit);
}

#[test]
fn lru_order_follows_store_touch_and_skips_pins() {
    let mut ix = Index::new(10, KeyHasher::with_seed(1));
    for i in 0..4 {
        store(&mut ix, &key(i));
    }
    assert_eq!(ix.lru_order(), vec![key(0), key(1), key(2), key(3)]);
    // Touch [1, 0]: key 1 (first) ends most recent.
    let keys: Vec<u8> = [key(1), key(0), key(99)].concat();
    assert_eq!(ix.touch_batch(&keys, 36), 2);
    assert_eq!(ix.lru_order(), vec![key(2), key(3), key(0), key(1)]);
    let s2 = ix.find(&key(2), ix.hash(&key(2))).unwrap();
    ix.pin(s2);
    let mut victims = Vec::new();
    assert!(ix.pick_victims(2, &mut victims));
    let names: Vec<u32> = victims.clone();
    assert!(!names.contains(&s2));
    assert!(!ix.pick_victims(4, &mut victims));
    assert!(!ix.unpin(s2));
}

#[test]
fn pending_then_hit_or_gone() {
    let mut ix = Index::new(10, KeyHasher::with_seed(1));
    let h = ix.hash(&key(1));
    let s = ix.insert_storing(&key(1), h);
    assert_eq!(lookup(&ix, &key(1)), LookupState::Pending);
    ix.finish_store(s, true);
    assert_eq!(lookup(&ix, &key(1)), LookupState::Hit);
    let h = ix.hash(&key(2));
    let s = ix.insert_storing(&key(2), h);
    ix.pin(s);
    ix.finish_store(s, false);
    assert_eq!(ix.state(s), SlotState::Dead);
    assert_eq!(lookup(&ix, &key(2)), LookupState::Miss);
    assert!(ix.unpin(s));
    assert_eq!(ix.allocated(), 1);
}

#[test]
fn clear_keeps_in_use_slots_until_released() {
    let mut ix = Index::new(10, KeyHasher::with_seed(1));
    let a = store(&mut ix, &key(1));
    store(&mut ix, &key(2));
    let h = ix.hash(&key(3));
    let c = ix.insert_storing(&key(3), h);
    ix.pin(a);
    ix.track_releases();
    ix.clear();
    assert!(
        ix.holds_key(&key(1)) && ix.holds_key(&key(3)),
        "still in use"
    );
    assert!(!ix.holds_key(&key(2)));
    assert_eq!(ix.take_released(), vec![(1, key(2))]);
    assert_eq!(ix.allocated(), 2);
    for i in 1..=3 {
        assert_eq!(lookup(&ix, &key(i)), LookupState::Miss);
    }
    assert!(ix.unpin(a));
    ix.finish_store(c, true);
    assert_eq!(ix.allocated(), 0);
    assert_eq!(ix.take_released(), vec![(a, key(1)), (c, key(3))]);
    assert!(!ix.holds_key(&key(1)) && ix.unlinked_keys.is_empty());
    // The same key can be stored again while nothing is left of the old one.
    store(&mut ix, &key(3));
    assert_eq!(lookup(&ix, &key(3)), LookupState::Hit);
}

#[test]
fn forget_drops_a_pinned_block_at_its_last_unpin() {
    let mut ix = Index::new(4, KeyHasher::with_seed(1));
    let s = store(&mut ix, &key(1));
    ix.pin(s);
    ix.forget(s, RemovedReason::Vanished);
    assert_eq!(lookup(&ix, &key(1)), LookupState::Miss);
    assert_eq!(ix.allocated(), 1);
    assert!(ix.unpin(s));
    assert_eq!(ix.allocated(), 0);
    let h = ix.hash(&key(2));
    ix.insert_ready(&key(2), h, StoredReason::Recovered);
    assert_eq!(lookup(&ix, &key(2)), LookupState::Hit);
}

#[test]
fn table_reserve_grows_to_the_size_inserts_would() {
    for n in [0usize, 1, 7, 100, 5000] {
        let (mut a, mut b) = (Table::with_capacity(8), Table::with_capacity(8));
        b.try_reserve(n).unwrap();
        let reserved = b.buckets.len();
        for i in 0..n as u32 {
            let tag = ((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32;
            a.insert(tag, i, 1);
            b.insert(tag, i, 1);
        }
        assert_eq!(b.buckets.len(), reserved, "{n} inserts after reserve");
        assert_eq!(a.buckets.len(), b.buckets.len(), "{n} inserts");
    }
}

#[test]
fn a_reserved_store_allocates_nothing() {
    for key_len in [36usize, 100] {
        let k = |i: u32| {
            let mut v = key(i);
            v.resize(key_len, 7);
            v
        };
        let mut ix = Index::new(5000, KeyHasher::with_seed(9));
        ix.track_releases();
        for i in 0..100 {
            store(&mut ix, &k(i));
        }
        ix.take_released();
        ix.reserve(3000, 10, key_len).unwrap();
        let room = |ix: &Index| {
            (
                ix.slots.capacity(),
                ix.links.capacity(),
                ix.free.capacity(),
                ix.table.buckets.as_ptr(),
                ix.long_keys.capacity(),
                ix.released.as_ref().unwrap().capacity(),
                ix.unlinked_keys.capacity(),
            )
        };
        let before = room(&ix);
        let mut victims = Vec::new();
        assert!(ix.pick_victims(10, &mut victims));
        for &v in &victims {
            ix.evict(v);
        }
        let mut slots = Vec::new();
        for i in 1000..4000 {
            let kk = k(i);
            let h = ix.hash(&kk);
            slots.push(ix.insert_storing_with(&kk, h, try_long_tail(&kk).unwrap()));
        }
        assert_eq!(room(&ix), before, "key_len {key_len}");
        assert!(ix.unlinked_keys.is_empty());
        assert_eq!(ix.take_released().len(), 10);
        // Every slot fits on the free list without growing it.
        assert!(ix.free.capacity() >= ix.slots.len());
        for s in slots {
            ix.finish_store(s, true);
        }
        assert_eq!(ix.ready(), 3090);
        assert_eq!(lookup(&ix, &k(1500)), LookupState::Hit);
        assert_eq!(lookup(&ix, &k(50)), LookupState::Hit);
    }
}

#[test]
fn slot_record_stays_small() {
    assert_eq!(std::mem::size_of::<Slot>(), 48);
    assert_eq!(std::mem::size_of::<Link>(), 8);
}

/// A store job's index stages (reserve, then commit with every copy done).
fn store_job(ix: &mut Index, ids: &[u32]) -> Option<Vec<Item>> {
    let packed: Vec<u8> = ids.iter().flat_map(|&i| key(i)).collect();
    let rows: Vec<i64> = (0..ids.len() as i64).collect();
    let mut victims = Vec::new();
    let reserved = ix
        .reserve_store(PackedKeys::new(&packed, 36), &rows, &mut victims)
        .unwrap()?;
    let keys = PackedKeys::new(&packed, 36);
    ix.commit_store(keys, &reserved.items, &reserved.pinned, |_| true, |_, _| {});
    Some(reserved.items)
}

/// A load job's index stages, each block ending with `outcome`.
fn load_job(ix: &mut Index, ids: &[u32], outcome: LoadOutcome) {
    let packed: Vec<u8> = ids.iter().flat_map(|&i| key(i)).collect();
    let rows: Vec<i64> = (0..ids.len() as i64).collect();
    let mut items = Vec::with_capacity(ids.len());
    let missing = ix
        .find_load(
            PackedKeys::new(&packed, 36),
            &rows,
            false,
            &mut items,
            &mut Vec::new(),
        )
        .unwrap();
    assert_eq!(missing, None);
    ix.pin_load(&items);
    ix.release_load(&items, |_| outcome);
}

fn taken_events(ix: &mut Index) -> Vec<(EventKind, u32)> {
    let events: Vec<_> = std::iter::from_fn(|| ix.take_event()).collect();
    events
        .iter()
        .map(|e| (e.kind, u32::from_be_bytes(e.key()[..4].try_into().unwrap())))
        .collect()
}

#[test]
fn a_block_is_announced_when_readable_and_withdrawn_once_with_its_reason() {
    use crate::events::EventKind::{Removed, Stored};
    let mut ix = Index::new(2, KeyHasher::with_seed(5));
    ix.enable_events(64).unwrap();
    store_job(&mut ix, &[1, 2]).unwrap();
    assert_eq!(
        taken_events(&mut ix),
        [
            (Stored(StoredReason::Written), 1),
            (Stored(StoredReason::Written), 2)
        ],
        "in the job's key order"
    );
    // Present keys are not stored again: no event.
    store_job(&mut ix, &[2]).unwrap();
    assert_eq!(taken_events(&mut ix), []);
    // LRU is 2 then 1 (the first key ends most recent).
    store_job(&mut ix, &[3]).unwrap();
    assert_eq!(
        taken_events(&mut ix),
        [
            (Removed(RemovedReason::Evicted), 2),
            (Stored(StoredReason::Written), 3)
        ]
    );
    load_job(&mut ix, &[1], LoadOutcome::Forget(RemovedReason::Corrupt));
    assert_eq!(
        taken_events(&mut ix),
        [(Removed(RemovedReason::Corrupt), 1)]
    );
    // A block being stored when cleared was never readable: no event for it,
    // neither at the clear nor when its store completes.
    let packed = key(4);
    let reserved = ix
        .reserve_store(PackedKeys::new(&packed, 36), &[0], &mut Vec::new())
        .unwrap()
        .unwrap();
    ix.clear();
    assert_eq!(
        taken_events(&mut ix),
        [(Removed(RemovedReason::Cleared), 3)]
    );
    let keys = PackedKeys::new(&packed, 36);
    ix.commit_store(keys, &reserved.items, &reserved.pinned, |_| true, |_, _| {});
    assert_eq!(taken_events(&mut ix), []);
    assert_eq!(lookup(&ix, &key(4)), LookupState::Miss);
}

#[test]
fn a_copied_block_becomes_most_recent_first_key_last() {
    let mut ix = Index::new(4, KeyHasher::with_seed(6));
    store_job(&mut ix, &[1]).unwrap();
    store_job(&mut ix, &[2]).unwrap();
    store_job(&mut ix, &[3]).unwrap();
    store_job(&mut ix, &[4]).unwrap();
    load_job(&mut ix, &[1, 2], LoadOutcome::Copied);
    assert_eq!(ix.lru_order(), [key(3), key(4), key(2), key(1)]);
    // A block not copied (an earlier failure, a transient error) keeps its place.
    load_job(&mut ix, &[3], LoadOutcome::Kept);
    assert_eq!(ix.lru_order(), [key(3), key(4), key(2), key(1)]);
    // Events off: nothing is recorded.
    assert!(ix.take_event().is_none());
}
