//! The response body QUERY_DIRECTORY ([MS-SMB2] 2.2.34), CHANGE_NOTIFY
//! (2.2.36) and QUERY_INFO (2.2.38) share: StructureSize 9,
//! OutputBufferOffset (2, from the header), OutputBufferLength (4), Buffer.

/// Byte ranges of the shared layout.
pub(crate) mod field {
    use crate::smb2::Field;
    pub const OUTPUT_BUFFER_OFFSET: Field = 2..4;
    pub const OUTPUT_BUFFER_LENGTH: Field = 4..8;
    /// Buffer starts here (header offset 72).
    pub const BUFFER: usize = 8;
}

/// Generates the view and `Repr` of one of those responses.
macro_rules! output_buffer_response {
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
            structure_size: 9,
            accessors {
                /// OutputBufferOffset, from the header.
                output_buffer_offset, set_output_buffer_offset: u16 = $crate::smb2::output_response::field::OUTPUT_BUFFER_OFFSET;
                /// OutputBufferLength.
                output_buffer_length, set_output_buffer_length: u32 = $crate::smb2::output_response::field::OUTPUT_BUFFER_LENGTH;
            }
        }

        impl<T: AsRef<[u8]>> $view<T> {
            fn output_region(&self) -> $crate::smb2::layout::Region {
                $crate::smb2::layout::Region::new(
                    "OutputBufferOffset",
                    u64::from(self.output_buffer_offset()),
                    u64::from(self.output_buffer_length()),
                )
            }

            fn check_variable(&self) -> Result<(), $crate::smb2::Smb2Error> {
                let b = self.buffer.as_ref();
                $crate::smb2::layout::resolve(Self::WHAT, b.len(), Self::FIXED_LEN, self.output_region())
                    .map(|_| ())
            }

            /// The output buffer.
            pub fn output(&self) -> &[u8] {
                $crate::smb2::layout::slice(self.buffer.as_ref(), Self::FIXED_LEN, self.output_region())
            }
        }

        $(#[$rmeta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct $repr<'a> {
            /// The output buffer.
            pub output: &'a [u8],
        }

        impl<'a> $repr<'a> {
            /// Body offset at which `emit` places the output (header
            /// offset 72): a server that builds the output in place writes
            /// it at `body[BUFFER_OFFSET..]` and calls
            /// [`emit_fixed`](Self::emit_fixed).
            pub const BUFFER_OFFSET: usize = $crate::smb2::output_response::field::BUFFER;

            /// Reads a checked view.
            pub fn parse(v: &$view<&'a [u8]>) -> Result<Self, $crate::smb2::Smb2Error> {
                v.check()?;
                let b: &'a [u8] = v.buffer;
                Ok($repr {
                    output: $crate::smb2::layout::slice(b, $view::<&[u8]>::FIXED_LEN, v.output_region()),
                })
            }

            /// Fixed part, then the output (at least 9 bytes).
            pub fn buffer_len(&self) -> usize {
                (Self::BUFFER_OFFSET + self.output.len()).max(9)
            }

            /// Writes the response: OutputBufferOffset 72 (also when the
            /// output is empty), the output right after the fixed part.
            pub fn emit(&self, buf: &mut [u8]) -> Result<usize, $crate::smb2::Smb2Error> {
                let len = self.buffer_len();
                $crate::smb2::layout::room($what, buf, len)?;
                $crate::smb2::layout::put(buf, Self::BUFFER_OFFSET, self.output);
                Self::emit_fixed(buf, self.output.len())
            }

            /// Writes the fixed part for `output_len` bytes of output the
            /// caller already placed at `buf[BUFFER_OFFSET..]` (zero copy);
            /// returns the body length (at least 9: with no output, the
            /// Buffer byte is zeroed).
            pub fn emit_fixed(buf: &mut [u8], output_len: usize) -> Result<usize, $crate::smb2::Smb2Error> {
                let len = (Self::BUFFER_OFFSET + output_len).max(9);
                $crate::smb2::layout::room($what, buf, len)?;
                let n: u32 = $crate::smb2::layout::fit($what, "OutputBufferLength", output_len)?;
                if output_len == 0 {
                    buf[Self::BUFFER_OFFSET] = 0;
                }
                let mut v = $view::new_unchecked(&mut buf[..Self::BUFFER_OFFSET]);
                v.set_structure_size(9);
                v.set_output_buffer_offset($crate::smb2::layout::hdr(Self::BUFFER_OFFSET) as u16);
                v.set_output_buffer_length(n);
                Ok(len)
            }
        }

        impl_body!($repr<'a>, $view, $cmd);
    };
}
