//! The code families of the C ABI other than status codes (src/status.rs):
//! job failure reasons, lookup states, job kinds, event kinds, event
//! reasons and tier features. Each code's number and C documentation are
//! written once, here, as the constant cbindgen copies into the header; each
//! family's Rust enum names those constants through [`c_codes!`], so the
//! enum, its `ALL` list and its C names cannot drift from the header.
//! Numbers are ABI: never changed, never reused; a new code is one constant
//! and one enum line.

/// Declares a code family's enum from one list of `Variant = TIER_CONSTANT`:
/// the discriminant is the constant (so the number is written once), and
/// `ALL`, `code`, `from_code` and `c_name` come from the same list.
macro_rules! c_codes {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident: $repr:ty {
            $( $(#[$doc:meta])* $variant:ident = $constant:ident, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr($repr)]
        $vis enum $name {
            $( $(#[$doc])* $variant = $crate::codes::$constant, )*
        }

        impl $name {
            /// Every code of the family, in the header's order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The C code.
            pub const fn code(self) -> $repr {
                self as $repr
            }

            /// The member with C code `code`, if there is one.
            pub fn from_code(code: $repr) -> Option<$name> {
                Self::ALL.iter().copied().find(|c| c.code() == code)
            }

            /// The constant's name in the C header.
            pub fn c_name(self) -> &'static str {
                match self {
                    $( $name::$variant => stringify!($constant), )*
                }
            }
        }
    };
}
pub(crate) use c_codes;

/// Job result reason: the job succeeded.
pub const TIER_FAIL_NONE: u32 = 0;
/// Job result reason: a store found no room, even after eviction
/// (TIER_ERR_NO_SPACE).
pub const TIER_FAIL_NO_SPACE: u32 = 1;
/// Job result reason: a load's key is not stored, or storage no longer holds
/// its block (TIER_ERR_NOT_FOUND): a miss.
pub const TIER_FAIL_NOT_FOUND: u32 = 2;
/// Job result reason: a stored block failed verification (TIER_ERR_CORRUPT).
pub const TIER_FAIL_CORRUPT: u32 = 3;
/// Job result reason: storage returned an error (TIER_ERR_IO).
pub const TIER_FAIL_IO_ERROR: u32 = 4;
/// Job result reason: a storage call missed its deadline, io_timeout_ms
/// (TIER_ERR_IO): a hung device or server.
pub const TIER_FAIL_DEADLINE: u32 = 5;
/// Job result reason: storage was known to be unavailable, so nothing was
/// tried (TIER_ERR_IO): every I/O thread stuck on a hung device, a Redis
/// server down or being reconnected to.
pub const TIER_FAIL_UNAVAILABLE: u32 = 6;
/// Job result reason: the tier was shutting down (TIER_ERR_SHUTDOWN).
pub const TIER_FAIL_SHUTDOWN: u32 = 7;
/// Job result reason: no memory for the job's buffers (TIER_ERR_ALLOC).
pub const TIER_FAIL_ALLOC: u32 = 8;
/// Job result reason: a panic inside the library was caught (TIER_ERR_PANIC).
pub const TIER_FAIL_PANIC: u32 = 9;
/// Item reason: an extent load's length differs from the length stored
/// with the block; nothing was copied (KVTIER_1.1).
pub const TIER_FAIL_LENGTH_MISMATCH: u32 = 10;
/// Item reason: a delete found the block pinned (tier_pin), being loaded or
/// being stored, and left it (KVTIER_1.1).
pub const TIER_FAIL_BUSY: u32 = 11;

/// Item status: stored, loaded or deleted.
pub const TIER_ITEM_OK: u32 = 0;
/// Item status: the key is not in the tier (nothing to load or delete).
pub const TIER_ITEM_MISS: u32 = 1;
/// Item status: the item failed; `reason` says why.
pub const TIER_ITEM_FAILED: u32 = 2;
/// Item status: a delete left the block in place (TIER_FAIL_BUSY).
pub const TIER_ITEM_BUSY: u32 = 3;

/// Lookup state: the key is not stored.
pub const TIER_MISS: u8 = 0;
/// Lookup state: the key is stored and readable.
pub const TIER_HIT: u8 = 1;
/// Lookup state: the key is being stored; ask again later.
pub const TIER_PENDING: u8 = 2;

/// Job kind: primary rows copied into the tier.
pub const TIER_JOB_STORE: u32 = 1;
/// Job kind: tier blocks copied into primary rows.
pub const TIER_JOB_LOAD: u32 = 2;
/// Job kind: keys deleted from the tier and its storage (KVTIER_1.1).
pub const TIER_JOB_DELETE: u32 = 3;

/// Event kind: the key's block became readable in the tier (a lookup answers
/// TIER_HIT). `reason` is a TIER_STORED_* code.
pub const TIER_EVENT_STORED: u32 = 1;
/// Event kind: the key's block stopped being readable in the tier (a lookup
/// answers TIER_MISS). `reason` is a TIER_REMOVED_* code.
pub const TIER_EVENT_REMOVED: u32 = 2;
/// Event kind: the event ring was full and `dropped` events (sequence numbers
/// `seq` to `seq + dropped - 1`) were dropped at this place; `key_len` is 0
/// and `reason` 0. What the consumer mirrored is stale: forget it.
pub const TIER_EVENT_LOST: u32 = 3;

/// STORED reason: a store job of this tier wrote the block.
pub const TIER_STORED_WRITTEN: u32 = 1;
/// STORED reason: storage held the block when the tier was opened (disk
/// restart, Redis sharing=owned adopting its keys).
pub const TIER_STORED_RECOVERED: u32 = 2;
/// STORED reason: shared storage (disk shared=true, Redis sharing=shared): a
/// lookup's probe found a block another writer stored.
pub const TIER_STORED_FOUND: u32 = 3;

/// REMOVED reason: least recently used, evicted to make room.
pub const TIER_REMOVED_EVICTED: u32 = 1;
/// REMOVED reason: tier_clear.
pub const TIER_REMOVED_CLEARED: u32 = 2;
/// REMOVED reason: a load found the stored block corrupt (TIER_ERR_CORRUPT).
pub const TIER_REMOVED_CORRUPT: u32 = 3;
/// REMOVED reason: a load found that storage no longer holds the block
/// (TIER_ERR_NOT_FOUND: a file deleted, a Redis key expired or evicted).
pub const TIER_REMOVED_VANISHED: u32 = 4;
/// REMOVED reason: the block's loads failed transiently (TIER_ERR_IO)
/// MAX_TRANSIENT_LOAD_FAILURES times in a row (failures that never reached
/// storage, such as a server known to be down, not counted); storage may
/// still hold it.
pub const TIER_REMOVED_UNREADABLE: u32 = 5;
/// REMOVED reason: a delete job removed the block (tier_submit_delete,
/// KVTIER_1.1).
pub const TIER_REMOVED_DELETED: u32 = 6;

/// Feature bit (tier_features, KVTIER_1.1): the tier takes extent jobs
/// (tier_submit_store_extents, tier_submit_load_extents); without it they
/// are TIER_ERR_INVALID_ARG (a sealed disk or Redis tier).
pub const TIER_FEATURE_EXTENTS: u64 = 1;
/// Feature bit: other processes may store into the tier's storage (disk
/// shared=true, Redis sharing=shared), so a lookup of a key this process has
/// not seen may answer TIER_PENDING while storage is probed.
pub const TIER_FEATURE_SHARED: u64 = 2;
/// Feature bit: blocks are sealed with a seal_key (encrypted and
/// authenticated in storage).
pub const TIER_FEATURE_SEALED: u64 = 4;
/// Feature bit: stored blocks outlive the tier: a new tier over the same
/// storage finds them (disk, Redis, memory with persist_path).
pub const TIER_FEATURE_PERSISTENT: u64 = 8;

#[cfg(test)]
mod tests {
    use crate::{
        EventCode, FailReason, Feature, ItemStatus, JobKind, LookupState, RemovedReason,
        StoredReason,
    };

    /// The header's `#define`s whose names start with `prefix`, as (name, value).
    fn header_defines(prefix: &str) -> Vec<(String, i64)> {
        let header = include_str!("../include/kvtier.h");
        let mut found: Vec<(String, i64)> = header
            .lines()
            .filter_map(|l| l.strip_prefix("#define "))
            .filter_map(|l| l.split_once(' '))
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(name, value)| {
                let value = value.trim().trim_matches(|c| c == '(' || c == ')');
                (name.to_string(), value.parse().expect(name))
            })
            .collect();
        found.sort();
        found
    }

    fn listed(codes: impl Iterator<Item = (&'static str, i64)>) -> Vec<(String, i64)> {
        let mut out: Vec<(String, i64)> = codes.map(|(n, v)| (n.to_string(), v)).collect();
        out.sort();
        out
    }

    /// Every code family is exactly the header's constants of its prefix,
    /// numbers included: a code added, renumbered or dropped on one side
    /// only fails here.
    #[test]
    fn each_family_is_exactly_the_headers_codes() {
        let families: [(&str, Vec<(String, i64)>); 8] = [
            (
                "TIER_FEATURE_",
                listed(Feature::ALL.iter().map(|c| (c.c_name(), c.code() as i64))),
            ),
            (
                "TIER_ITEM_",
                listed(
                    ItemStatus::ALL
                        .iter()
                        .map(|c| (c.c_name(), c.code() as i64)),
                ),
            ),
            (
                "TIER_FAIL_",
                listed(
                    FailReason::ALL
                        .iter()
                        .map(|c| (c.c_name(), c.code() as i64)),
                ),
            ),
            (
                "TIER_JOB_",
                listed(JobKind::ALL.iter().map(|c| (c.c_name(), c.code() as i64))),
            ),
            (
                "TIER_EVENT_",
                listed(EventCode::ALL.iter().map(|c| (c.c_name(), c.code() as i64))),
            ),
            (
                "TIER_STORED_",
                listed(
                    StoredReason::ALL
                        .iter()
                        .map(|c| (c.c_name(), c.code() as i64)),
                ),
            ),
            (
                "TIER_REMOVED_",
                listed(
                    RemovedReason::ALL
                        .iter()
                        .map(|c| (c.c_name(), c.code() as i64)),
                ),
            ),
            (
                "TIER_",
                listed(
                    LookupState::ALL
                        .iter()
                        .map(|c| (c.c_name(), c.code() as i64)),
                ),
            ),
        ];
        for (prefix, codes) in families {
            let mut header = header_defines(prefix);
            if prefix == "TIER_" {
                let states = ["TIER_MISS", "TIER_HIT", "TIER_PENDING"];
                header.retain(|(n, _)| states.contains(&n.as_str()));
            } else {
                header.retain(|(n, _)| !n.ends_with("_SIZE_V1"));
            }
            assert_eq!(codes, header, "{prefix}*");
        }
    }

    #[test]
    fn codes_round_trip_and_unknown_codes_are_none() {
        for &reason in FailReason::ALL {
            assert_eq!(FailReason::from_code(reason.code()), Some(reason));
        }
        assert_eq!(FailReason::from_code(u32::MAX), None);
        assert_eq!(LookupState::from_byte(200), LookupState::Miss);
        for &state in LookupState::ALL {
            assert_eq!(LookupState::from_byte(state.code()), state);
        }
    }
}
