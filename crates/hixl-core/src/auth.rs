//! Mutual authentication of a control connection with a shared secret (sans-io).
//!
//! When an engine has a secret (`hixl.AuthSecret`, or the `HIXL_AUTH_SECRET` environment
//! variable), connect runs a challenge-response before any memory table is sent:
//!
//! 1. initiator → target: `Hello`.
//! 2. target → initiator: `AuthChallenge { nonce_t }` (32 random bytes).
//! 3. initiator → target: `AuthResponse { nonce_i, mac_i }` with
//!    `mac_i = HMAC-SHA256(secret, "hixl-auth-v1 initiator" ‖ nonce_t ‖ nonce_i)`.
//! 4. target checks `mac_i` in constant time; on success it sends `AuthProof { mac_t }` with
//!    `mac_t = HMAC-SHA256(secret, "hixl-auth-v1 target" ‖ nonce_t ‖ nonce_i)`, then `Welcome`
//!    and the memory table. On failure it sends `Refuse` and closes.
//! 5. initiator checks `mac_t` in constant time before it reads anything else.
//!
//! Both nonces are fresh per connection, so a recorded exchange cannot be replayed, and the
//! different labels keep a target's proof from being reflected as an initiator's. This proves
//! that both ends know the secret; it does not encrypt or sign the traffic that follows.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of a MAC (HMAC-SHA256).
pub const MAC_LEN: usize = 32;
/// Environment variable read for the secret when `hixl.AuthSecret` is not given.
pub const SECRET_ENV: &str = "HIXL_AUTH_SECRET";

const INITIATOR: &[u8] = b"hixl-auth-v1 initiator";
const TARGET: &[u8] = b"hixl-auth-v1 target";

/// A shared secret. Its `Debug` never shows the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps a secret.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn mac(&self, label: &[u8], nonce_t: &[u8], nonce_i: &[u8]) -> Hmac<Sha256> {
        // HMAC takes keys of any length, so new_from_slice cannot fail here; the fallback
        // keeps the type total anyway (an empty key MACs like any other).
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| <Hmac<Sha256> as Mac>::new(&Default::default()));
        m.update(label);
        m.update(nonce_t);
        m.update(nonce_i);
        m
    }

    /// The initiator's answer to a challenge.
    pub fn initiator_mac(&self, nonce_t: &[u8], nonce_i: &[u8]) -> [u8; MAC_LEN] {
        self.mac(INITIATOR, nonce_t, nonce_i)
            .finalize()
            .into_bytes()
            .into()
    }

    /// The target's proof.
    pub fn target_mac(&self, nonce_t: &[u8], nonce_i: &[u8]) -> [u8; MAC_LEN] {
        self.mac(TARGET, nonce_t, nonce_i)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Checks an initiator's MAC in constant time.
    pub fn verify_initiator(&self, nonce_t: &[u8], nonce_i: &[u8], mac: &[u8]) -> bool {
        self.mac(INITIATOR, nonce_t, nonce_i)
            .verify_slice(mac)
            .is_ok()
    }

    /// Checks a target's proof in constant time.
    pub fn verify_target(&self, nonce_t: &[u8], nonce_i: &[u8], mac: &[u8]) -> bool {
        self.mac(TARGET, nonce_t, nonce_i).verify_slice(mac).is_ok()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(<{} bytes>)", self.0.len())
    }
}

/// A fresh nonce from the OS CSPRNG.
///
/// # Errors
/// When the OS has no entropy source: authentication must not run on predictable nonces.
pub fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut b = [0u8; NONCE_LEN];
    getrandom::getrandom(&mut b).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_verify_only_with_the_same_secret_nonces_and_role() {
        let (s, other) = (Secret::new("correct horse"), Secret::new("battery staple"));
        let (t, i) = (nonce().unwrap(), nonce().unwrap());
        let mi = s.initiator_mac(&t, &i);
        assert!(s.verify_initiator(&t, &i, &mi));
        assert!(!other.verify_initiator(&t, &i, &mi), "other secret");
        assert!(!s.verify_initiator(&i, &t, &mi), "swapped nonces");
        assert!(
            !s.verify_target(&t, &i, &mi),
            "an initiator MAC is not a target proof"
        );
        assert!(!s.verify_initiator(&t, &i, &mi[..31]), "truncated");
        assert!(!s.verify_initiator(&t, &i, &[]), "empty");
        let mt = s.target_mac(&t, &i);
        assert!(s.verify_target(&t, &i, &mt));
        assert_ne!(mi, mt);
        let t2 = nonce().unwrap();
        assert_ne!(t, t2, "fresh nonces");
        assert!(
            !s.verify_initiator(&t2, &i, &mi),
            "replayed against a new challenge"
        );
    }

    #[test]
    fn debug_hides_the_secret() {
        let d = format!("{:?}", Secret::new("hunter2-hunter2"));
        assert!(!d.contains("hunter2"), "{d}");
        assert!(d.contains("15 bytes"));
    }
}
