//! Core lists as operators write them: `2,3,6-9` or an SPDK-style hex mask
//! `0xC`.

/// Parses a core list or mask into sorted, distinct core ids.
pub fn parse_cores(s: &str) -> Result<Vec<usize>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty core list".into());
    }
    let mut cores = Vec::new();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if hex.is_empty() || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!("invalid core mask '{s}'"));
        }
        // Bit i of the mask (counted from the least significant hex digit) is core i.
        for (digit_idx, c) in hex.chars().rev().enumerate() {
            let v = c.to_digit(16).unwrap_or(0);
            for bit in 0..4 {
                if v & (1 << bit) != 0 {
                    cores.push(digit_idx * 4 + bit);
                }
            }
        }
    } else {
        for part in s.split(',') {
            let part = part.trim();
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (part, part),
            };
            let a: usize = a
                .parse()
                .map_err(|_| format!("invalid core '{a}' in '{s}'"))?;
            let b: usize = b
                .parse()
                .map_err(|_| format!("invalid core '{b}' in '{s}'"))?;
            if a > b {
                return Err(format!("invalid core range '{part}' (start after end)"));
            }
            if b - a > 4096 {
                return Err(format!("core range '{part}' is too large"));
            }
            cores.extend(a..=b);
        }
    }
    cores.sort_unstable();
    cores.dedup();
    if cores.is_empty() {
        return Err(format!("core list '{s}' selects no core"));
    }
    Ok(cores)
}

/// Checks `cores` against the cores this process may run on.
pub fn check_available(cores: &[usize], available: &[usize]) -> Result<(), String> {
    for c in cores {
        if !available.contains(c) {
            return Err(format!(
                "core {c} is not available to this process (available: {})",
                format_cores(available)
            ));
        }
    }
    Ok(())
}

/// Formats a core list compactly (`0-3,6`); the data plane's, which also
/// names cores in its own messages.
pub use smbdirect_dataplane::cores::format_cores;

/// The cores this process may run on.
pub fn available_cores() -> Vec<usize> {
    let mut v: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    v.sort_unstable();
    v
}

/// Default worker cores: all but the first (which stays for the control
/// plane and the OS); the only core when there is one.
pub fn default_worker_cores(available: &[usize]) -> Vec<usize> {
    if available.len() <= 1 {
        available.to_vec()
    } else {
        available[1..].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_ranges_and_masks_parse() {
        assert_eq!(parse_cores("2,3,6-9").unwrap(), vec![2, 3, 6, 7, 8, 9]);
        assert_eq!(parse_cores("0xC").unwrap(), vec![2, 3]);
        assert_eq!(parse_cores("0x1").unwrap(), vec![0]);
        assert_eq!(parse_cores("0x10").unwrap(), vec![4]);
        assert_eq!(parse_cores("1,1,0").unwrap(), vec![0, 1]);
        assert!(parse_cores("").is_err());
        assert!(parse_cores("3-1").is_err());
        assert!(parse_cores("0x").is_err());
        assert!(parse_cores("0x0").is_err());
        assert!(parse_cores("a").is_err());
        assert_eq!(format_cores(&[0, 1, 2, 3, 6]), "0-3,6");
        assert_eq!(default_worker_cores(&[0, 1]), vec![1]);
        assert_eq!(default_worker_cores(&[0]), vec![0]);
        assert!(check_available(&[5], &[0, 1]).is_err());
    }
}
