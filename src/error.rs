//! Error kinds and the error value every fallible call returns.
//!
//! The numeric codes are part of the C ABI (`TIER_ERR_*`): they are stable and a
//! retired number is never reused.

use std::fmt;

/// What went wrong. The discriminant is the C status code.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ErrorKind {
    /// A required pointer argument was NULL.
    NullArg = -1,
    /// An argument has an invalid value (length, size, alignment…).
    InvalidArg = -2,
    /// A block id lies outside the primary buffer.
    OutOfRange = -3,
    /// A job id is already in flight (submitted and not yet polled).
    DuplicateJob = -4,
    /// A store could not get space, even after eviction.
    NoSpace = -5,
    /// A load asked for a key that is not stored.
    NotFound = -6,
    /// The backend failed to read or write.
    Io = -7,
    /// Stored data failed verification.
    Corrupt = -8,
    /// An unknown configuration key or an unparsable value.
    Config = -9,
    /// The tier is shutting down.
    Shutdown = -10,
    /// A panic inside the library was caught at the boundary.
    Panic = -11,
    /// Memory (or another resource) could not be allocated.
    Alloc = -12,
}

impl ErrorKind {
    /// Every kind, for tables and tests.
    pub const ALL: [ErrorKind; 12] = [
        ErrorKind::NullArg,
        ErrorKind::InvalidArg,
        ErrorKind::OutOfRange,
        ErrorKind::DuplicateJob,
        ErrorKind::NoSpace,
        ErrorKind::NotFound,
        ErrorKind::Io,
        ErrorKind::Corrupt,
        ErrorKind::Config,
        ErrorKind::Shutdown,
        ErrorKind::Panic,
        ErrorKind::Alloc,
    ];

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

    /// The constant's name as a C string (what `tier_status_str` returns).
    pub(crate) fn c_name(self) -> &'static std::ffi::CStr {
        match self {
            ErrorKind::NullArg => c"TIER_ERR_NULL_ARG",
            ErrorKind::InvalidArg => c"TIER_ERR_INVALID_ARG",
            ErrorKind::OutOfRange => c"TIER_ERR_OUT_OF_RANGE",
            ErrorKind::DuplicateJob => c"TIER_ERR_DUPLICATE_JOB",
            ErrorKind::NoSpace => c"TIER_ERR_NO_SPACE",
            ErrorKind::NotFound => c"TIER_ERR_NOT_FOUND",
            ErrorKind::Io => c"TIER_ERR_IO",
            ErrorKind::Corrupt => c"TIER_ERR_CORRUPT",
            ErrorKind::Config => c"TIER_ERR_CONFIG",
            ErrorKind::Shutdown => c"TIER_ERR_SHUTDOWN",
            ErrorKind::Panic => c"TIER_ERR_PANIC",
            ErrorKind::Alloc => c"TIER_ERR_ALLOC",
        }
    }
}

/// An error: its kind plus a message that names the offending argument or value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// An error of `kind` with a specific message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
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
        for kind in ErrorKind::ALL {
            assert!(kind.code() < 0, "{kind:?}");
            assert!(seen.insert(kind.code()), "{kind:?} reuses a code");
            assert_eq!(ErrorKind::from_code(kind.code()), Some(kind));
        }
        assert_eq!(ErrorKind::from_code(0), None);
        assert_eq!(ErrorKind::from_code(-1000), None);
    }

    #[test]
    fn display_names_the_kind() {
        let e = Error::new(ErrorKind::Config, "bad value");
        assert_eq!(e.to_string(), "TIER_ERR_CONFIG: bad value");
    }
}
