//! The choice of data transport.

/// Which data transport hixl uses (`hixl.Transport`, a hixl extension).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TransportChoice {
    /// Pick the best transport available to both peers (`auto`).
    #[default]
    Auto,
    /// Host TCP streams (`tcp`).
    Tcp,
    /// The fabric transport (`fabric`).
    Fabric,
    /// RDMA verbs (`verbs`).
    Verbs,
}

impl TransportChoice {
    /// Parses `auto`, `tcp`, `fabric` or `verbs`, ignoring ASCII case.
    pub fn from_name(s: &str) -> Option<Self> {
        [Self::Auto, Self::Tcp, Self::Fabric, Self::Verbs]
            .into_iter()
            .find(|t| t.as_str().eq_ignore_ascii_case(s))
    }

    /// The lower-case name, as accepted by [`TransportChoice::from_name`].
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Tcp => "tcp",
            Self::Fabric => "fabric",
            Self::Verbs => "verbs",
        }
    }
}

/// How the TCP data path moves bytes (`hixl.TcpIo`, a hixl extension).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TcpIo {
    /// Nonblocking `sendmsg`/`recv` driven by readiness (`epoll`, the default).
    #[default]
    Epoll,
    /// io_uring submissions and completions, one ring per data connection (`uring`); falls
    /// back to `epoll` where the kernel refuses io_uring (the reason is logged and shown by
    /// `hixl info`).
    Uring,
}

impl TcpIo {
    /// Parses `epoll` or `uring` (also `io_uring`), ignoring ASCII case.
    pub fn from_name(s: &str) -> Option<Self> {
        if s.eq_ignore_ascii_case("io_uring") {
            return Some(Self::Uring);
        }
        [Self::Epoll, Self::Uring]
            .into_iter()
            .find(|t| t.as_str().eq_ignore_ascii_case(s))
    }

    /// The lower-case name, as accepted by [`TcpIo::from_name`].
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Epoll => "epoll",
            Self::Uring => "uring",
        }
    }
}
