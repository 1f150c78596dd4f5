//! Examples of hixl (see the files next to this one; run with `cargo run -p hixl-examples --example NAME`).
