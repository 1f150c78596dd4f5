//! The macro that turns the one declaration of the protocol's messages (`message.rs`) into
//! the `Message` enum, its frame type numbers ([`super::ty`]), its encoder and its decoder,
//! and (with the `arbitrary` feature) the fuzzers' generator of arbitrary messages.
//!
//! A declaration reads
//!
//! ```text
//! /// docs
//! 7 => HEARTBEAT, Heartbeat { /// docs
//!                             seq: u64 },
//! 4 => MEM_TABLE, MemTable(regions: Vec<RemoteRegion> => Entries(28)),
//! ```
//!
//! a frame type number, the name of its constant in [`super::ty`], and a variant with named
//! fields or one unnamed field (whose name is only the decoder's label for it). A field is
//! written by its type's own encoding ([`super::codec::Field`]) unless a codec follows
//! `=>` (a bound on text, bytes, payload lengths or entries). Frame type numbers run 1, 2, 3
//! … in declaration order: the build fails otherwise.

/// See the module documentation.
macro_rules! messages {
    (@codec) => { $crate::wire::codec::Plain };
    (@codec $c:expr) => { $c };
    ($(
        $(#[$vm:meta])*
        $code:literal => $C:ident, $V:ident
        $( { $( $(#[$fm:meta])* $f:ident : $ft:ty $(=> $fc:expr)? ),* $(,)? } )?
        $( ( $b:ident : $bt:ty $(=> $bc:expr)? ) )?
    ),* $(,)?) => {
        /// Every message of the protocol.
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
        pub enum Message {
            $(
                $(#[$vm])*
                $V $( { $( $(#[$fm])* $f: $ft ),* } )? $( ( $bt ) )?,
            )*
        }

        /// Frame type numbers.
        pub mod ty {
            $(
                #[doc = concat!("[`super::Message::", stringify!($V), "`]")]
                pub const $C: u8 = $code;
            )*
            /// The highest type number: every number from 1 to it is a message.
            pub const LAST: u8 = [$($code),*].len() as u8;
        }

        const _: () = {
            let codes: &[u8] = &[$($code),*];
            let mut i = 0;
            while i < codes.len() {
                assert!(codes[i] as usize == i + 1, "frame type numbers must run 1, 2, 3 ...");
                i += 1;
            }
        };

        impl Message {
            /// This message's frame type number.
            pub const fn ty(&self) -> u8 {
                match self {
                    $( Message::$V { .. } => ty::$C, )*
                }
            }

            /// The variant's name, for logs and errors.
            pub const fn name(&self) -> &'static str {
                match self {
                    $( Message::$V { .. } => stringify!($V), )*
                }
            }

            pub(super) fn put_body(&self, out: &mut bytes::BytesMut) {
                #[allow(unused_imports)]
                use $crate::wire::codec::Codec as _;
                match self {
                    $(
                        Message::$V $( { $($f),* } )? $( ($b) )? => {
                            $( $( messages!(@codec $($fc)?).put($f, out); )* )?
                            $( messages!(@codec $($bc)?).put($b, out); )?
                        }
                    )*
                }
            }

            /// Decodes the body of a frame of type `ty`.
            ///
            /// # Errors
            /// [`WireError`](super::WireError) for any body that is not exactly a valid
            /// message of that type.
            pub fn decode_body(ty: u8, body: &[u8]) -> Result<Message, super::WireError> {
                #[allow(unused_imports)]
                use $crate::wire::codec::Codec as _;
                let mut r = $crate::wire::codec::Reader(body);
                let m = match ty {
                    $(
                        ty::$C => Message::$V
                            $( { $( $f: messages!(@codec $($fc)?).get(&mut r, stringify!($f))? ),* } )?
                            $( ( messages!(@codec $($bc)?).get(&mut r, stringify!($b))? ) )?,
                    )*
                    other => return Err(super::WireError::BadType(other)),
                };
                if !r.0.is_empty() {
                    return Err(super::WireError::Trailing(r.0.len()));
                }
                Ok(m)
            }
        }
    };
}

pub(super) use messages;
