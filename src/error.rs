//! Error kinds and the error value every fallible call returns.
//!
//! The numeric codes are part of the C ABI (`TIER_ERR_*`): they are stable and a
//! retired number is never reused.

use std::ffi::CStr;
use std::fmt;

/// Declares [`ErrorKind`] from one list of `Variant = TIER_ERR_CONSTANT`:
/// the numbers live only in the C constants (src/status.rs, which cbindgen
/// turns into the header), and the enum, [`ErrorKind::ALL`] and the C names
/// all come from this list, so none can drift from another.
macro_rules! error_kinds {
    ($( $(#[$doc:meta])* $variant:ident = $constant:ident, )*) => {
        /// What went wrong. The discriminant is the C status code.
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
        #[repr(i32)]
        pub enum ErrorKind {
            $( $(#[$doc])* $variant = crate::status::$constant, )*
        }

        impl ErrorKind {
            /// Every kind, for tables and tests.
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$variant),*];

            /// The constant's name as a C string (what `tier_status_str`
            /// returns).
            pub(crate) fn c_name(self) -> &'static CStr {
                match self {
                    $( ErrorKind::$variant => {
                        const NAME: &CStr = match CStr::from_bytes_with_nul(
                            concat!(stringify!($constant), "\0").as_bytes(),
                        ) {
                            Ok(name) => name,
                            Err(_) => panic!("a constant name has no NUL"),
                        };
                        NAME
                    } )*
                }
            }
        }
    };
}

error_kinds! {
    /// A required pointer argument was NULL.
    NullArg = TIER_ERR_NULL_ARG,
    /// An argument has an invalid value (length, size, alignment…).
    InvalidArg = TIER_ERR_INVALID_ARG,
    /// A block id lies outside the primary buffer.
    OutOfRange = TIER_ERR_OUT_OF_RANGE,
    /// A job id is already in flight (submitted and not yet polled).
    DuplicateJob = TIER_ERR_DUPLICATE_JOB,
    /// A store could not get space, even after eviction.
    NoSpace = TIER_ERR_NO_SPACE,
    /// A load asked for a key that is not stored.
    NotFound = TIER_ERR_NOT_FOUND,
    /// The backend failed to read or write.
    Io = TIER_ERR_IO,
    /// Stored data failed verification.
    Corrupt = TIER_ERR_CORRUPT,
    /// An unknown configuration key or an unparsable value.
    Config = TIER_ERR_CONFIG,
    /// The tier is shutting down.
    Shutdown = TIER_ERR_SHUTDOWN,
    /// A panic inside the library was caught at the boundary.
    Panic = TIER_ERR_PANIC,
    /// Memory (or another resource) could not be allocated.
    Alloc = TIER_ERR_ALLOC,
}

impl ErrorKind {
    /// The C status code.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The kind for a C status code, if it is one.
    pub fn from_code(code: i32) -> Option<ErrorKind> {
        Self::ALL.iter().copied().find(|k| k.code() == code)
    }

    /// The constant's name in the C header.
    pub fn name(self) -> &'static str {
        self.c_name().to_str().expect("ASCII")
    }
}

/// An error: its kind plus a message that names the offending argument or value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    /// The failed operation never reached storage (see [`Error::unsent`]).
    unsent: bool,
    /// Storage did not answer within its deadline (see [`Error::late`]).
    late: bool,
    /// The stored block's length is not the one asked for (see
    /// [`Error::wrong_length`]).
    wrong_length: bool,
}

impl Error {
    /// An error of `kind` with a specific message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            unsent: false,
            late: false,
            wrong_length: false,
        }
    }

    /// Marks a block I/O failure whose request never went to storage: the
    /// backend failed it at once (a server known to be silent or down, no
    /// connection free). Such a failure proves nothing about the block, so a
    /// load that meets it does not count towards forgetting the key
    /// (`MAX_TRANSIENT_LOAD_FAILURES`). Reported by the Redis backend only.
    #[cfg_attr(not(feature = "redis-backend"), allow(dead_code))]
    pub(crate) fn unsent(mut self) -> Error {
        self.unsent = true;
        self
    }

    /// Marks a block I/O failure as storage not answering within its
    /// deadline (`io_timeout_ms`): the job fails with `TIER_FAIL_DEADLINE`.
    /// Reported by the Redis backend only (the disk's watchdog reports its
    /// own deadlines).
    #[cfg_attr(not(feature = "redis-backend"), allow(dead_code))]
    pub(crate) fn late(mut self) -> Error {
        self.late = true;
        self
    }

    /// Marks a load whose destination length differs from the length stored
    /// with the block (an extent load): the job fails that item with
    /// `TIER_FAIL_LENGTH_MISMATCH` and the stored block stays as it is.
    pub(crate) fn wrong_length(mut self) -> Error {
        self.wrong_length = true;
        self
    }

    /// Whether a load asked for another length than stored (see
    /// [`Error::wrong_length`]).
    pub(crate) fn is_wrong_length(&self) -> bool {
        self.wrong_length
    }

    /// Whether storage missed its deadline (see [`Error::late`]).
    pub(crate) fn missed_deadline(&self) -> bool {
        self.late
    }

    /// Whether the failed operation reached storage (see [`Error::unsent`]).
    pub(crate) fn reached_storage(&self) -> bool {
        !self.unsent
    }

    /// The kind (and so the C status code).
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind's name.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.message)
    }
}

impl std::error::Error for Error {}

/// Shorthand used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

macro_rules! bail {
    ($kind:ident, $($fmt:tt)+) => {
        return Err($crate::error::Error::new($crate::error::ErrorKind::$kind, format!($($fmt)+)))
    };
}
pub(crate) use bail;

/// The `Alloc` error for `count` items of `T` that could not be allocated.
pub(crate) fn alloc_error<T>(count: usize, what: &str) -> Error {
    let bytes = count.saturating_mul(std::mem::size_of::<T>());
    Error::new(
        ErrorKind::Alloc,
        format!("could not allocate {bytes} bytes for {what}"),
    )
}

/// An empty vector with room for exactly `n` items, or `Alloc`: for buffers
/// whose size the caller controls, which must fail the call, not abort.
pub(crate) fn try_vec<T>(n: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| alloc_error::<T>(n, what))?;
    Ok(v)
}

/// Makes room for `additional` more items in `v` (growing it geometrically,
/// like `push`), or returns `Alloc`.
pub(crate) fn try_reserve<T>(v: &mut Vec<T>, additional: usize, what: &str) -> Result<()> {
    if v.capacity() - v.len() >= additional {
        return Ok(());
    }
    v.try_reserve(additional)
        .map_err(|_| alloc_error::<T>(v.len().saturating_add(additional), what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_negative_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for &kind in ErrorKind::ALL {
            assert!(kind.code() < 0, "{kind:?}");
            assert!(seen.insert(kind.code()), "{kind:?} reuses a code");
            assert_eq!(ErrorKind::from_code(kind.code()), Some(kind));
        }
        assert_eq!(ErrorKind::from_code(0), None);
        assert_eq!(ErrorKind::from_code(-1000), None);
    }

    /// Every TIER_ERR_ constant of the header is a kind, and the other way
    /// round: a new code cannot be added on one side only.
    #[test]
    fn kinds_are_exactly_the_header_error_codes() {
        let header = include_str!("../include/kvtier.h");
        let mut in_header: Vec<&str> = header
            .lines()
            .filter_map(|l| l.strip_prefix("#define "))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|name| name.starts_with("TIER_ERR_"))
            .collect();
        let mut kinds: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.name()).collect();
        in_header.sort_unstable();
        kinds.sort_unstable();
        assert_eq!(in_header, kinds);
    }

    #[test]
    fn display_names_the_kind() {
        let e = Error::new(ErrorKind::Config, "bad value");
        assert_eq!(e.to_string(), "TIER_ERR_CONFIG: bad value");
    }
}
