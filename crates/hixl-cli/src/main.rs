//! The `hixl` command.
fn main() {}
