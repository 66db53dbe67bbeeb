//! Hugepage counters from `/proc/meminfo`.
//!
//! Note that `/proc/meminfo` reports the *default* hugepage size only. The pools
//! always ask for 2 MiB pages (`MAP_HUGE_2MB` / `MFD_HUGE_2MB`), which is the
//! default on x86-64 unless the kernel was booted with `default_hugepagesz=1G`;
//! in that case check `/sys/kernel/mm/hugepages/hugepages-2048kB/` instead.

use std::io;

/// Path of the file [`HugepageInfo::read`] parses.
pub const MEMINFO_PATH: &str = "/proc/meminfo";

/// Hugepage state of the machine, as `/proc/meminfo` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugepageInfo {
    /// `HugePages_Total`: pages in the persistent pool (`/proc/sys/vm/nr_hugepages`).
    pub total: u64,
    /// `HugePages_Free`: pages not yet faulted in by anyone (includes reserved ones).
    pub free: u64,
    /// `HugePages_Rsvd`: pages promised to mappings but not yet faulted in.
    pub reserved: u64,
    /// `HugePages_Surp`: surplus pages above `nr_hugepages` (overcommit).
    pub surplus: u64,
    /// `Hugepagesize` in bytes (the default hugepage size, normally 2 MiB).
    pub page_size: u64,
}

impl HugepageInfo {
    /// Reads and parses [`MEMINFO_PATH`].
    pub fn read() -> io::Result<Self> {
        let text = std::fs::read_to_string(MEMINFO_PATH)?;
        Self::parse(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{MEMINFO_PATH} has no HugePages_Total/HugePages_Free/Hugepagesize lines"),
            )
        })
    }

    /// Parses the text of `/proc/meminfo`. Returns `None` when `HugePages_Total`,
    /// `HugePages_Free` or `Hugepagesize` is missing (kernel without hugetlb);
    /// `HugePages_Rsvd` and `HugePages_Surp` default to 0.
    pub fn parse(text: &str) -> Option<Self> {
        let (mut total, mut free, mut size) = (None, None, None);
        let (mut reserved, mut surplus) = (0, 0);
        for line in text.lines() {
            let Some((key, rest)) = line.split_once(':') else {
                continue;
            };
            let mut words = rest.split_whitespace();
            let Some(value) = words.next().and_then(|v| v.parse::<u64>().ok()) else {
                continue;
            };
            match key.trim() {
                "HugePages_Total" => total = Some(value),
                "HugePages_Free" => free = Some(value),
                "HugePages_Rsvd" => reserved = value,
                "HugePages_Surp" => surplus = value,
                "Hugepagesize" => {
                    let unit = match words.next() {
                        Some("kB") | Some("KB") | Some("kb") => 1024,
                        Some("mB") | Some("MB") => 1024 * 1024,
                        _ => 1,
                    };
                    size = value.checked_mul(unit);
                }
                _ => {}
            }
        }
        Some(Self {
            total: total?,
            free: free?,
            reserved,
            surplus,
            page_size: size?,
        })
    }

    /// Free pages that a new mapping can still reserve (`free - reserved`).
    pub fn available(&self) -> u64 {
        self.free.saturating_sub(self.reserved)
    }

    /// Bytes a new mapping can still reserve (`available() * page_size`).
    pub fn available_bytes(&self) -> u64 {
        self.available().saturating_mul(self.page_size)
    }
}

/// `HugePages_Total` from `/proc/meminfo`.
pub fn hugepages_total() -> io::Result<u64> {
    HugepageInfo::read().map(|i| i.total)
}

/// `HugePages_Free` from `/proc/meminfo`.
pub fn hugepages_free() -> io::Result<u64> {
    HugepageInfo::read().map(|i| i.free)
}

/// `Hugepagesize` from `/proc/meminfo`, in bytes.
pub fn hugepage_size() -> io::Result<u64> {
    HugepageInfo::read().map(|i| i.page_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "MemTotal:       16314368 kB\n\
        AnonHugePages:         0 kB\n\
        HugePages_Total:      64\n\
        HugePages_Free:       60\n\
        HugePages_Rsvd:        2\n\
        HugePages_Surp:        0\n\
        Hugepagesize:       2048 kB\n\
        Hugetlb:          131072 kB\n";

    #[test]
    fn meminfo_hugepage_lines_are_parsed() {
        let info = HugepageInfo::parse(SAMPLE).unwrap();
        assert_eq!(
            info,
            HugepageInfo {
                total: 64,
                free: 60,
                reserved: 2,
                surplus: 0,
                page_size: 2 << 20
            }
        );
        assert_eq!(info.available(), 58);
        assert_eq!(info.available_bytes(), 58 * (2 << 20));
    }

    #[test]
    fn meminfo_without_hugetlb_is_none() {
        assert_eq!(HugepageInfo::parse("MemTotal: 1 kB\nMemFree: 1 kB\n"), None);
    }

    #[test]
    fn this_machine_meminfo_is_readable() {
        let info = HugepageInfo::read().expect("/proc/meminfo readable with hugetlb lines");
        assert!(info.page_size >= 4096);
        assert!(info.free <= info.total + info.surplus);
        assert_eq!(hugepage_size().unwrap(), info.page_size);
    }
}
