//! Nothing to build. The build dependency `protoc-bin-vendored` is here so that cargo fetches
//! a protoc before etcd-client's build script runs: `tools/protoc` (PROTOC, set in
//! `.cargo/config.toml`) runs it on a machine that has no protoc of its own.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Referenced, so the dependency is not unused.
    let _ = protoc_bin_vendored::protoc_bin_path;
}
