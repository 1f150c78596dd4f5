//! Same-host identity: what two engines compare at connect to decide whether the fabric
//! backend can join them.

use std::io;
use std::os::unix::fs::MetadataExt;

/// Who this process is, as far as same-host transport is concerned.
///
/// Two processes are on the same host when they share the kernel boot (boot id) and the mount
/// namespace: then a memfd one exports can be mapped by the other, and a Unix socket path one
/// binds can be reached by the other. `pid` and `uid` tell the peer whether cross-memory attach
/// can work (same uid) and whom to attach to; a pid is only meaningful in the same PID
/// namespace, which a shared mount namespace almost always implies but does not guarantee, so
/// the engine confirms with [`crate::cma_probe`] before relying on it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostIdentity {
    /// `/proc/sys/kernel/random/boot_id`, changed by every boot.
    pub boot_id: String,
    /// Inode of the calling thread's mount namespace (`/proc/thread-self/ns/mnt`).
    pub mnt_ns: u64,
    /// This process's id.
    pub pid: i32,
    /// This process's real uid.
    pub uid: u32,
}

impl HostIdentity {
    /// Reads this process's identity from `/proc`.
    ///
    /// # Errors
    /// The I/O error of reading `/proc/sys/kernel/random/boot_id` or the mount namespace link
    /// (no `/proc` mounted, or not Linux); `InvalidData` for an empty boot id.
    pub fn current() -> io::Result<HostIdentity> {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
            .trim()
            .to_string();
        if boot_id.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "/proc/sys/kernel/random/boot_id is empty",
            ));
        }
        // Namespaces belong to threads: one that called unshare(CLONE_NEWNS) differs from the
        // main thread that /proc/self describes, and it is the calling thread's namespace that
        // resolves the socket paths the engine binds. thread-self needs Linux 3.17.
        let mnt_ns = std::fs::metadata("/proc/thread-self/ns/mnt")
            .or_else(|_| std::fs::metadata("/proc/self/ns/mnt"))?
            .ino();
        let pid = i32::try_from(std::process::id())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "pid exceeds i32"))?;
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        Ok(HostIdentity {
            boot_id,
            mnt_ns,
            pid,
            uid,
        })
    }

    /// Whether `other` runs on the same kernel boot and in the same mount namespace.
    pub fn same_host(&self, other: &HostIdentity) -> bool {
        self.boot_id == other.boot_id && self.mnt_ns == other.mnt_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_of_this_process() {
        let me = HostIdentity::current().unwrap();
        assert_eq!(me.boot_id.len(), 36, "a UUID: {}", me.boot_id);
        assert_ne!(me.mnt_ns, 0);
        assert_eq!(me.pid as u32, std::process::id());
        assert!(me.same_host(&HostIdentity::current().unwrap()));
    }

    #[test]
    fn boot_and_mount_namespace_decide() {
        let me = HostIdentity::current().unwrap();
        let other_process = HostIdentity {
            pid: me.pid + 1,
            uid: me.uid + 1,
            ..me.clone()
        };
        assert!(me.same_host(&other_process));
        let rebooted = HostIdentity {
            boot_id: "00000000-0000-0000-0000-000000000000".into(),
            ..me.clone()
        };
        assert!(!me.same_host(&rebooted));
        let container = HostIdentity {
            mnt_ns: me.mnt_ns + 1,
            ..me.clone()
        };
        assert!(!me.same_host(&container));
    }
}
