//! Criterion benches of hixl (see benches/*.rs).
