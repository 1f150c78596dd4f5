//! libibverbs is loaded at run time, on first use, and never linked: a binary built with verbs
//! starts on a host without rdma-core, and says why it has no device there.
//!
//! One test in its own binary, so that nothing else in the process has touched verbs before it
//! looks at its own mappings.

use std::path::Path;

/// Whether a file whose name starts with `libibverbs.so` is mapped into this process.
fn libibverbs_mapped() -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps is readable");
    maps.lines().any(|l| {
        l.split_whitespace()
            .nth(5)
            .and_then(|p| Path::new(p).file_name())
            .is_some_and(|f| f.to_string_lossy().starts_with("libibverbs.so"))
    })
}

#[test]
fn libibverbs_is_loaded_on_first_use_and_not_linked() {
    assert!(
        !libibverbs_mapped(),
        "libibverbs is mapped before any verb was called: the binary links it"
    );
    match hixl_verbs::query_devices() {
        // Loaded: the device list was read from it (even an empty one is an error below).
        Ok(_) => assert!(
            libibverbs_mapped(),
            "devices listed without libibverbs mapped"
        ),
        Err(hixl_verbs::VerbsError::NoDevice { reason }) if !libibverbs_mapped() => assert!(
            reason.contains("libibverbs.so.1"),
            "the reason names the library: {reason}"
        ),
        Err(e) => assert!(
            libibverbs_mapped(),
            "failed without loading libibverbs, and without saying so: {e}"
        ),
    }
}
