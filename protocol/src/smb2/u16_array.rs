//! Arrays of 16-bit little-endian values (dialects, cipher and hash
//! algorithm IDs, ...), zero-copy on parse and slice-backed on emit.

/// An array of `u16`: borrowed wire bytes (even length) or a borrowed slice.
/// Two values are equal when their elements are.
#[derive(Clone, Copy)]
pub struct U16Array<'a>(Inner<'a>);

#[derive(Clone, Copy)]
enum Inner<'a> {
    Le(&'a [u8]),
    Slice(&'a [u16]),
}

impl<'a> U16Array<'a> {
    /// The empty array.
    pub const EMPTY: U16Array<'static> = U16Array(Inner::Slice(&[]));

    /// Wire bytes; a trailing odd byte is not an element.
    pub const fn from_le_bytes(bytes: &'a [u8]) -> Self {
        U16Array(Inner::Le(bytes))
    }

    /// Values to emit.
    pub const fn new(values: &'a [u16]) -> Self {
        U16Array(Inner::Slice(values))
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self.0 {
            Inner::Le(b) => b.len() / 2,
            Inner::Slice(s) => s.len(),
        }
    }

    /// True when there is no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes on the wire.
    pub fn byte_len(&self) -> usize {
        self.len() * 2
    }

    /// Element `i`.
    pub fn get(&self, i: usize) -> Option<u16> {
        match self.0 {
            Inner::Le(b) => {
                let c = b.get(i.checked_mul(2)?..i.checked_mul(2)?.checked_add(2)?)?;
                Some(u16::from_le_bytes([c[0], c[1]]))
            }
            Inner::Slice(s) => s.get(i).copied(),
        }
    }

    /// The elements in order.
    pub fn iter(&self) -> impl Iterator<Item = u16> + 'a {
        let (b, s): (&'a [u8], &'a [u16]) = match self.0 {
            Inner::Le(b) => (b, &[]),
            Inner::Slice(s) => (&[], s),
        };
        b.chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .chain(s.iter().copied())
    }

    /// True when `v` is an element.
    pub fn contains(&self, v: u16) -> bool {
        self.iter().any(|x| x == v)
    }

    /// Writes the elements little-endian to the start of `dst`.
    pub(crate) fn write_to(&self, dst: &mut [u8]) {
        for (d, v) in dst.chunks_exact_mut(2).zip(self.iter()) {
            d.copy_from_slice(&v.to_le_bytes());
        }
    }
}

impl PartialEq for U16Array<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for U16Array<'_> {}

impl core::fmt::Debug for U16Array<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|v| format!("{v:#06x}")))
            .finish()
    }
}

impl Default for U16Array<'_> {
    fn default() -> Self {
        U16Array::EMPTY
    }
}
