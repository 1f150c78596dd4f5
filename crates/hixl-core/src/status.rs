//! HIXL status codes with their numeric values, as returned by every HIXL call.

use std::fmt;

/// A HIXL status code (`hixl::Status`, a `uint32_t` in the C++ API).
///
/// The numeric values are HIXL's own, so a number logged by a HIXL deployment means the same
/// thing here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Status {
    /// The call succeeded.
    Success = 0,
    /// A parameter was invalid.
    ParamInvalid = 103_900,
    /// The operation timed out.
    Timeout = 103_901,
    /// There is no link to the remote engine.
    NotConnected = 103_902,
    /// A link to the remote engine already exists.
    AlreadyConnected = 103_903,
    /// A notify could not be delivered (reserved by HIXL).
    NotifyFailed = 103_904,
    /// The parameter or feature is not supported.
    Unsupported = 103_905,
    /// A resource (queue, stream, slot) is exhausted; retry later.
    ResourceExhausted = 203_900,
    /// Generic failure; also the answer to any call made before `initialize`.
    Failed = 503_900,
}

impl Status {
    /// Every status, in declaration order.
    pub const ALL: [Status; 9] = [
        Status::Success,
        Status::ParamInvalid,
        Status::Timeout,
        Status::NotConnected,
        Status::AlreadyConnected,
        Status::NotifyFailed,
        Status::Unsupported,
        Status::ResourceExhausted,
        Status::Failed,
    ];

    /// The numeric HIXL value.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The status with this numeric value, if HIXL defines one.
    pub fn from_code(code: u32) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.code() == code)
    }

    /// HIXL's constant name (`PARAM_INVALID`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Status::Success => "SUCCESS",
            Status::ParamInvalid => "PARAM_INVALID",
            Status::Timeout => "TIMEOUT",
            Status::NotConnected => "NOT_CONNECTED",
            Status::AlreadyConnected => "ALREADY_CONNECTED",
            Status::NotifyFailed => "NOTIFY_FAILED",
            Status::Unsupported => "UNSUPPORTED",
            Status::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Status::Failed => "FAILED",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_hixl() {
        assert_eq!(Status::Success.code(), 0);
        assert_eq!(Status::ParamInvalid.code(), 103900);
        assert_eq!(Status::Timeout.code(), 103901);
        assert_eq!(Status::NotConnected.code(), 103902);
        assert_eq!(Status::AlreadyConnected.code(), 103903);
        assert_eq!(Status::NotifyFailed.code(), 103904);
        assert_eq!(Status::Unsupported.code(), 103905);
        assert_eq!(Status::ResourceExhausted.code(), 203900);
        assert_eq!(Status::Failed.code(), 503900);
    }

    #[test]
    fn code_round_trip() {
        for s in Status::ALL {
            assert_eq!(Status::from_code(s.code()), Some(s));
        }
        assert_eq!(Status::from_code(1), None);
    }
}
