//! The pieces every SMB2 body shares: the [`Smb2Body`] trait the builders
//! implement, and the macros that generate the smoltcp-style views.

use super::error::Smb2Error;
use super::header::Command;

/// An SMB2 body `Repr` that can be emitted after a header
/// ([`emit_message`](super::emit_message), [`CompoundWriter`](super::CompoundWriter)).
pub trait Smb2Body {
    /// The command whose body this is; `None` for the ERROR response
    /// ([MS-SMB2] 2.2.2), which answers any command.
    fn command(&self) -> Option<Command>;
    /// Bytes [`emit`](Self::emit) writes.
    fn buffer_len(&self) -> usize;
    /// Writes the body (StructureSize first) into `buf`, which starts right
    /// after the 64-byte header; returns the bytes written.
    fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error>;
}

/// Generates a body view: the struct, `new_unchecked`, `new_checked` (fixed
/// part via `layout::check_fixed`, then the type's own `check_variable`),
/// `into_inner`, StructureSize access and one getter/setter pair per field.
macro_rules! body_view {
    (
        $(#[$meta:meta])*
        pub struct $name:ident;
        what: $what:expr,
        structure_size: $ss:expr,
        accessors {
            $( $(#[$fmeta:meta])* $get:ident, $set:ident: $ty:ty = $field:expr; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        #[allow(dead_code)]
        impl<T: AsRef<[u8]>> $name<T> {
            /// The StructureSize [MS-SMB2] fixes for this structure.
            pub const STRUCTURE_SIZE: u16 = $ss;
            /// Length of the fixed part (StructureSize without the one byte of
            /// Buffer an odd StructureSize counts).
            pub const FIXED_LEN: usize = ($ss as usize) & !1;
            /// Name used in errors.
            pub const WHAT: &'static str = $what;

            /// Wraps `buffer` (the body: the bytes after the SMB2 header)
            /// without checking it. Accessors never panic; on a buffer
            /// `new_checked` would refuse they read zeros or empty slices.
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }

            /// Wraps `buffer` after checking StructureSize, the fixed part and
            /// every variable buffer's offset and length.
            pub fn new_checked(buffer: T) -> Result<Self, $crate::smb2::Smb2Error> {
                let v = Self::new_unchecked(buffer);
                v.check()?;
                Ok(v)
            }

            /// The checks of [`new_checked`](Self::new_checked), on a view
            /// made with `new_unchecked` (every `Repr::parse` runs them).
            pub fn check(&self) -> Result<(), $crate::smb2::Smb2Error> {
                $crate::smb2::layout::check_fixed(Self::WHAT, self.buffer.as_ref(), $ss)?;
                self.check_variable()
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The body bytes.
            pub fn as_bytes(&self) -> &[u8] {
                self.buffer.as_ref()
            }

            /// StructureSize as received.
            pub fn structure_size(&self) -> u16 {
                <u16 as $crate::smb2::Scalar>::read(self.buffer.as_ref(), 0..2)
            }

            $(
                $(#[$fmeta])*
                #[inline]
                pub fn $get(&self) -> $ty {
                    <$ty as $crate::smb2::Scalar>::read(self.buffer.as_ref(), $field)
                }
            )*
        }

        #[allow(dead_code)]
        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            /// Sets StructureSize.
            pub fn set_structure_size(&mut self, v: u16) {
                <u16 as $crate::smb2::Scalar>::write(v, self.buffer.as_mut(), 0..2)
            }

            $(
                #[doc = concat!("Sets the field [`", stringify!($get), "`](Self::", stringify!($get), ") reads.")]
                #[inline]
                pub fn $set(&mut self, v: $ty) {
                    <$ty as $crate::smb2::Scalar>::write(v, self.buffer.as_mut(), $field)
                }
            )*

            /// The whole body, for writing variable-length buffers.
            pub fn as_bytes_mut(&mut self) -> &mut [u8] {
                self.buffer.as_mut()
            }
        }
    };
}

/// Implements [`Smb2Body`] for a `Repr` (delegating to its inherent
/// `buffer_len`/`emit`) and adds `from_body` (`parse` of the body's view,
/// which checks it: every `Repr::parse` starts with the view's `check`, and
/// tests/smb2_wire.rs holds every body's decoder to it).
macro_rules! impl_body {
    ($repr:ident<$lt:lifetime>, $view:ident, $cmd:expr) => {
        impl<$lt> $repr<$lt> {
            /// Checks and parses a body (the bytes after the SMB2 header).
            /// `parse` runs the view's checks (every `Repr::parse` does,
            /// as `new_checked` would): once, not twice.
            pub fn from_body(body: &$lt [u8]) -> Result<Self, $crate::smb2::Smb2Error> {
                Self::parse(&$view::new_unchecked(body))
            }
        }
        impl<$lt> $crate::smb2::Smb2Body for $repr<$lt> {
            fn command(&self) -> Option<$crate::smb2::Command> {
                $cmd
            }
            fn buffer_len(&self) -> usize {
                $repr::buffer_len(self)
            }
            fn emit(&self, buf: &mut [u8]) -> Result<usize, $crate::smb2::Smb2Error> {
                $repr::emit(self, buf)
            }
        }
    };
    ($repr:ident, $view:ident, $cmd:expr) => {
        impl $repr {
            /// Checks and parses a body (the bytes after the SMB2 header);
            /// `parse` runs the view's checks, once.
            pub fn from_body(body: &[u8]) -> Result<Self, $crate::smb2::Smb2Error> {
                Self::parse(&$view::new_unchecked(body))
            }
        }
        impl $crate::smb2::Smb2Body for $repr {
            fn command(&self) -> Option<$crate::smb2::Command> {
                $cmd
            }
            fn buffer_len(&self) -> usize {
                $repr::buffer_len(self)
            }
            fn emit(&self, buf: &mut [u8]) -> Result<usize, $crate::smb2::Smb2Error> {
                $repr::emit(self, buf)
            }
        }
    };
}

/// A body that is StructureSize (4) and a 2-byte Reserved field and nothing
/// else (LOGOFF, TREE_DISCONNECT, ECHO, CANCEL, FLUSH response).
macro_rules! reserved_body {
    (
        $(#[$vmeta:meta])*
        view $view:ident;
        $(#[$rmeta:meta])*
        repr $repr:ident;
        what: $what:expr,
        command: $cmd:expr
    ) => {
        body_view! {
            $(#[$vmeta])*
            pub struct $view;
            what: $what,
            structure_size: 4,
            accessors {
                /// Reserved: the sender sets 0, the receiver ignores it.
                reserved, set_reserved: u16 = 2..4;
            }
        }

        impl<T: AsRef<[u8]>> $view<T> {
            fn check_variable(&self) -> Result<(), $crate::smb2::Smb2Error> {
                Ok(())
            }
        }

        $(#[$rmeta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct $repr;

        impl $repr {
            /// Reads a checked view (nothing to read: Reserved is ignored).
            pub fn parse<T: AsRef<[u8]>>(view: &$view<T>) -> Result<Self, $crate::smb2::Smb2Error> {
                view.check()?;
                Ok($repr)
            }
            /// 4 bytes.
            pub const fn buffer_len(&self) -> usize {
                4
            }
            /// Writes StructureSize 4 and Reserved 0.
            pub fn emit(&self, buf: &mut [u8]) -> Result<usize, $crate::smb2::Smb2Error> {
                $crate::smb2::layout::room($what, buf, 4)?;
                let mut v = $view::new_unchecked(&mut buf[..4]);
                v.set_structure_size(4);
                v.set_reserved(0);
                Ok(4)
            }
        }

        impl_body!($repr, $view, $cmd);
    };
}
