//! Block events: what an engine mirroring the tier's contents (a KV-aware
//! router) needs to know, namely that a block became readable (STORED) or
//! stopped being readable (REMOVED, and why).
//!
//! Events are recorded where the index changes a block's state, under the
//! index lock the change already holds, into a ring of fixed capacity
//! allocated when the tier is built: recording never allocates and never
//! waits for a consumer. A full ring drops its oldest event; the dropped
//! events are counted, and the consumer is told where they were by a LOST
//! event in their place, so it knows its mirror is stale and must start over.

use crate::error::{alloc_error, Result};
use crate::key::MAX_KEY_LEN;
use std::collections::VecDeque;

/// How a block became readable in this tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum StoredReason {
    /// A store job of this tier wrote it.
    Written = 1,
    /// Storage held it when the tier was opened (disk restart, Redis
    /// `sharing=owned` adopting its keys).
    Recovered = 2,
    /// Shared storage: a lookup's probe found a block another writer stored.
    Found = 3,
}

/// Why a readable block stopped being readable in this tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum RemovedReason {
    /// Least recently used, evicted to make room.
    Evicted = 1,
    /// `tier_clear`.
    Cleared = 2,
    /// A load found the stored block corrupt (and storage dropped it).
    Corrupt = 3,
    /// A load found storage no longer holds it (a file deleted by another
    /// process, a Redis key expired or evicted by the server).
    Vanished = 4,
    /// Its loads failed transiently too many times in a row
    /// ([`MAX_TRANSIENT_LOAD_FAILURES`](crate::MAX_TRANSIENT_LOAD_FAILURES));
    /// storage may still hold it.
    Unreadable = 5,
    /// A delete job removed it (`tier_submit_delete`).
    Deleted = 6,
}

/// What an [`Event`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The key's block became readable (a lookup answers HIT).
    Stored(StoredReason),
    /// The key's block stopped being readable (a lookup answers MISS).
    Removed(RemovedReason),
    /// `dropped` events (sequence numbers `seq..seq + dropped`) were dropped
    /// here because the ring was full: what the consumer mirrors is stale.
    Lost {
        /// How many events were dropped at this place.
        dropped: u64,
    },
}

/// One event, as [`Tier::poll_events`](crate::Tier::poll_events) hands it
/// out. Copy-sized: the key is inline.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Sequence number: events are numbered 0, 1, 2, … as they are recorded,
    /// dropped ones included (a LOST event carries the first dropped number),
    /// so pollers on several threads can restore the order.
    pub seq: u64,
    /// What happened.
    pub kind: EventKind,
    key_len: u8,
    key: [u8; MAX_KEY_LEN],
}

impl Event {
    fn new(seq: u64, kind: EventKind, key: &[u8]) -> Event {
        let mut event = Event {
            seq,
            kind,
            key_len: key.len() as u8,
            key: [0; MAX_KEY_LEN],
        };
        event.key[..key.len()].copy_from_slice(key);
        event
    }

    /// The block's key (empty for a LOST event).
    pub fn key(&self) -> &[u8] {
        &self.key[..self.key_len as usize]
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("seq", &self.seq)
            .field("kind", &self.kind)
            .field("key", &self.key())
            .finish()
    }
}

/// Default of the `events_capacity` key: events held before the oldest are
/// dropped (about 10 MiB of address space, touched only as it fills).
pub const DEFAULT_EVENTS_CAPACITY: usize = 65_536;
/// Largest accepted `events_capacity`.
pub const MAX_EVENTS_CAPACITY: usize = 1 << 22;

/// The ring of recorded events not yet polled.
pub(crate) struct EventLog {
    ring: VecDeque<Event>,
    capacity: usize,
    next_seq: u64,
    /// Events dropped in front of the ring's oldest one since the last poll
    /// handed out a LOST event for them.
    lost_in_front: u64,
    /// Events dropped since the tier was built.
    dropped_total: u64,
}

impl EventLog {
    /// A ring holding `capacity` events, allocated now; `Alloc` if memory is
    /// short.
    pub(crate) fn new(capacity: usize) -> Result<EventLog> {
        let mut ring = VecDeque::new();
        ring.try_reserve_exact(capacity)
            .map_err(|_| alloc_error::<Event>(capacity, "the event ring"))?;
        Ok(EventLog {
            ring,
            capacity,
            next_seq: 0,
            lost_in_front: 0,
            dropped_total: 0,
        })
    }

    /// Records an event for `key`, dropping the oldest if the ring is full.
    /// Never allocates.
    pub(crate) fn record(&mut self, kind: EventKind, key: &[u8]) {
        if self.ring.len() == self.capacity {
            self.ring.pop_front();
            self.lost_in_front += 1;
            self.dropped_total += 1;
        }
        self.ring.push_back(Event::new(self.next_seq, kind, key));
        self.next_seq += 1;
    }

    /// Takes the oldest event: first a LOST event for events dropped in front
    /// of the ring, if any.
    pub(crate) fn take(&mut self) -> Option<Event> {
        if self.lost_in_front > 0 {
            let first_kept = self.ring.front().map_or(self.next_seq, |e| e.seq);
            let dropped = std::mem::take(&mut self.lost_in_front);
            return Some(Event::new(
                first_kept - dropped,
                EventKind::Lost { dropped },
                &[],
            ));
        }
        self.ring.pop_front()
    }

    /// Events dropped since the tier was built.
    pub(crate) fn dropped_total(&self) -> u64 {
        self.dropped_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(log: &mut EventLog) -> Vec<Event> {
        std::iter::from_fn(|| log.take()).collect()
    }

    #[test]
    fn events_come_out_in_order_with_consecutive_numbers() {
        let mut log = EventLog::new(4).unwrap();
        log.record(EventKind::Stored(StoredReason::Written), b"a");
        log.record(EventKind::Removed(RemovedReason::Evicted), b"a");
        let got = drain(&mut log);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].seq, got[0].key()), (0, &b"a"[..]));
        assert_eq!(got[1].kind, EventKind::Removed(RemovedReason::Evicted));
        assert_eq!(got[1].seq, 1);
        assert!(log.take().is_none());
    }

    #[test]
    fn a_full_ring_drops_the_oldest_and_marks_the_place() {
        let mut log = EventLog::new(3).unwrap();
        let capacity_before = log.ring.capacity();
        for i in 0..10u8 {
            log.record(EventKind::Stored(StoredReason::Written), &[i]);
        }
        assert_eq!(log.ring.capacity(), capacity_before, "the ring never grew");
        assert_eq!(log.dropped_total(), 7);
        let got = drain(&mut log);
        assert_eq!(got[0].kind, EventKind::Lost { dropped: 7 });
        assert_eq!((got[0].seq, got[0].key()), (0, &[][..]));
        let kept: Vec<(u64, u8)> = got[1..].iter().map(|e| (e.seq, e.key()[0])).collect();
        assert_eq!(kept, vec![(7, 7), (8, 8), (9, 9)]);
        // Drops after a poll are marked again, at their own place.
        for i in 10..15u8 {
            log.record(EventKind::Stored(StoredReason::Written), &[i]);
        }
        let got = drain(&mut log);
        assert_eq!(got[0].kind, EventKind::Lost { dropped: 2 });
        assert_eq!(got[0].seq, 10);
        assert_eq!(got[1].seq, 12);
        assert_eq!(log.dropped_total(), 9);
    }
}
