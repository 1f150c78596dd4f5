//! Library side of the `hixl` command: the pieces its subcommands share, also used by the
//! two-process integration tests.
#![warn(missing_docs)]

pub mod child;
pub mod util;
