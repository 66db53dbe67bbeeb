//! The memory store behind the `data` share: a bounded map of file name to
//! contents. First slice: files are plain `Vec<u8>`s that grow on CREATE and
//! WRITE (allocation on the I/O path, accepted for now); the pool-backed
//! store sized by `--store-size` is next.

use std::collections::HashMap;

/// Default bound on the bytes all files of one store may hold.
pub const DEFAULT_STORE_BYTES: u64 = 256 << 20;

/// Why a store operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// No such file.
    NotFound,
    /// The store's byte bound would be exceeded.
    Full,
}

/// A bounded in-memory file map (names are case-sensitive).
#[derive(Debug)]
pub struct MemStore {
    files: HashMap<String, Vec<u8>>,
    used: u64,
    limit: u64,
}

impl MemStore {
    /// An empty store holding at most `limit` bytes.
    pub fn new(limit: u64) -> Self {
        MemStore {
            files: HashMap::new(),
            used: 0,
            limit,
        }
    }

    /// True when `name` exists.
    pub fn exists(&self, name: &str) -> bool {
        self.files.contains_key(name)
    }

    /// Creates `name` empty, or truncates it to zero bytes.
    pub fn create_or_truncate(&mut self, name: &str) {
        match self.files.get_mut(name) {
            Some(f) => {
                self.used -= f.len() as u64;
                f.clear();
            }
            None => {
                self.files.insert(name.to_string(), Vec::new());
            }
        }
    }

    /// Size of `name`.
    pub fn size(&self, name: &str) -> Option<u64> {
        self.files.get(name).map(|f| f.len() as u64)
    }

    /// Bytes of `name` from `offset`, at most `len` (fewer at the end of the
    /// file; empty at or past it).
    pub fn read(&self, name: &str, offset: u64, len: usize) -> Result<&[u8], StoreError> {
        let f = self.files.get(name).ok_or(StoreError::NotFound)?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(f.len());
        let end = start.saturating_add(len).min(f.len());
        Ok(&f[start..end])
    }

    /// Writes `data` at `offset`, growing the file (zero-filled) as needed.
    pub fn write(&mut self, name: &str, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        let f = self.files.get_mut(name).ok_or(StoreError::NotFound)?;
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(StoreError::Full)?;
        let old = f.len() as u64;
        if end > old {
            if self.used + (end - old) > self.limit {
                return Err(StoreError::Full);
            }
            f.resize(end as usize, 0);
            self.used += end - old;
        }
        f[offset as usize..end as usize].copy_from_slice(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_truncate_and_bound() {
        let mut s = MemStore::new(100);
        assert_eq!(s.write("a", 0, b"x"), Err(StoreError::NotFound));
        s.create_or_truncate("a");
        s.write("a", 10, b"hello").unwrap();
        assert_eq!(s.size("a"), Some(15));
        assert_eq!(s.read("a", 8, 4).unwrap(), b"\0\0he");
        assert_eq!(s.read("a", 100, 4).unwrap(), b"");
        assert_eq!(s.write("a", 96, b"12345"), Err(StoreError::Full));
        s.create_or_truncate("a");
        assert_eq!(s.size("a"), Some(0));
        s.write("a", 95, b"12345").unwrap();
        assert!(!s.exists("A"));
    }
}
