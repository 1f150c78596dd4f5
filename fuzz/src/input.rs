//! The input format: [`In`] reads a fuzz input, [`Out`] writes seeds in the same format.

use bytes::BytesMut;
use hixl_core::wire::Message;
use libfuzzer_sys::arbitrary::{Arbitrary, Unstructured};

/// Reads a fuzz input. Past its end every read yields zeros / empty slices, so any byte string
/// is a valid input.
pub struct In<'a>(pub &'a [u8]);

impl<'a> In<'a> {
    /// Whether the input is used up.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Up to `n` bytes.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        h
    }
    /// One byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }
    /// Little-endian u16.
    pub fn u16(&mut self) -> u16 {
        let mut b = [0u8; 2];
        let t = self.take(2);
        b[..t.len()].copy_from_slice(t);
        u16::from_le_bytes(b)
    }
    /// Little-endian u32.
    pub fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        let t = self.take(4);
        b[..t.len()].copy_from_slice(t);
        u32::from_le_bytes(b)
    }
    /// Little-endian u64.
    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        let t = self.take(8);
        b[..t.len()].copy_from_slice(t);
        u64::from_le_bytes(b)
    }
    /// A u16 length, then that many bytes.
    pub fn blob16(&mut self) -> &'a [u8] {
        let n = self.u16() as usize;
        self.take(n)
    }
    /// A u8 length, then that many bytes.
    pub fn blob8(&mut self) -> &'a [u8] {
        let n = self.u8() as usize;
        self.take(n)
    }
    /// A value built by `arbitrary` from a u8-length-prefixed slice (so it never eats the
    /// rest of the input). `None` when `arbitrary` refuses the bytes.
    pub fn arb<T: for<'x> Arbitrary<'x>>(&mut self) -> Option<T> {
        let b = self.blob8();
        T::arbitrary(&mut Unstructured::new(b)).ok()
    }
    /// A [`Message`] of any type with arbitrary fields (invalid ones included: its frame is
    /// well formed, its body may not be), from hixl-core's own `Arbitrary`.
    pub fn msg(&mut self) -> Option<Message> {
        self.arb::<Message>()
    }
}

/// Writes inputs in the format [`In`] reads (for the seed corpus).
#[derive(Default)]
pub struct Out(pub Vec<u8>);

impl Out {
    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// Little-endian u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Little-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Little-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A u16 length and the bytes.
    pub fn blob16(&mut self, b: &[u8]) -> &mut Self {
        let n = b.len().min(u16::MAX as usize);
        self.u16(n as u16);
        self.0.extend_from_slice(&b[..n]);
        self
    }
    /// A u8 length and the bytes.
    pub fn blob8(&mut self, b: &[u8]) -> &mut Self {
        let n = b.len().min(u8::MAX as usize);
        self.u8(n as u8);
        self.0.extend_from_slice(&b[..n]);
        self
    }
    /// The encoded frames of `msgs`, back to back.
    pub fn frames(msgs: &[Message]) -> Vec<u8> {
        let mut b = BytesMut::new();
        for m in msgs {
            m.encode(&mut b);
        }
        b.to_vec()
    }
}
