//! Block events at the index's state changes (see `crate::events`): a block
//! becoming readable (Ready and linked) or ceasing to be. Recorded under the
//! index lock the change holds, so a key's events are in the order of its
//! changes; costs one branch when events are off.

use super::{Index, MAX_KEY_LEN};
use crate::error::Result;
use crate::events::{Event, EventKind, EventLog, RemovedReason, StoredReason};

impl Index {
    /// Starts recording events into a ring of `capacity`, allocated now.
    pub(crate) fn enable_events(&mut self, capacity: usize) -> Result<()> {
        self.events = Some(EventLog::new(capacity)?);
        Ok(())
    }

    pub(crate) fn events_enabled(&self) -> bool {
        self.events.is_some()
    }

    /// The oldest event not yet taken (None when there is none, or events are
    /// off).
    pub(crate) fn take_event(&mut self) -> Option<Event> {
        self.events.as_mut()?.take()
    }

    /// Events dropped because the ring was full (0 when events are off).
    pub(crate) fn events_dropped(&self) -> u64 {
        self.events.as_ref().map_or(0, EventLog::dropped_total)
    }

    pub(super) fn note_stored(&mut self, s: u32, reason: StoredReason) {
        self.note(s, EventKind::Stored(reason));
    }

    pub(super) fn note_removed(&mut self, s: u32, reason: RemovedReason) {
        self.note(s, EventKind::Removed(reason));
    }

    #[inline]
    fn note(&mut self, s: u32, kind: EventKind) {
        if self.events.is_none() {
            return;
        }
        let mut buf = [0u8; MAX_KEY_LEN];
        let len = self.key_of(s, &mut buf);
        if let Some(events) = self.events.as_mut() {
            events.record(kind, &buf[..len]);
        }
    }
}
