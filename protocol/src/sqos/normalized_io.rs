//! Normalized I/O size ([MS-SQOS] 1.1 "normalized IOPS", 4.1).

/// [MS-SQOS] 3.1.3: LogicalFlow.BaseIoSize is initialized to 8192; note <9>:
/// Windows servers report 8192 for every flow.
pub const DEFAULT_BASE_IO_SIZE: u32 = 8192;

/// [MS-SQOS] 4.1: `NormalizedIoSize = (IoSizeInBytes + BaseIoSize - 1) /
/// BaseIoSize` in unsigned integers, i.e. the number of BaseIoSize blocks
/// the request covers, rounded up (a zero-byte request counts 0).
///
/// Computed without the intermediate sum, so it cannot overflow. A
/// `base_io_size` of 0 (never valid; a client keeps its previous value when a
/// server sends one) is treated as [`DEFAULT_BASE_IO_SIZE`].
pub const fn normalized_io_size(io_size_in_bytes: u64, base_io_size: u32) -> u64 {
    let base = if base_io_size == 0 {
        DEFAULT_BASE_IO_SIZE
    } else {
        base_io_size
    } as u64;
    io_size_in_bytes / base + (io_size_in_bytes % base != 0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized_size_rounds_up_and_never_overflows() {
        assert_eq!(normalized_io_size(0, 8192), 0);
        assert_eq!(normalized_io_size(1, 8192), 1);
        assert_eq!(normalized_io_size(8193, 8192), 2);
        assert_eq!(normalized_io_size(u64::MAX, 1), u64::MAX);
        assert_eq!(normalized_io_size(u64::MAX, 8192), u64::MAX / 8192 + 1);
        assert_eq!(normalized_io_size(4096, 0), 1);
        assert_eq!(normalized_io_size(4096, 4096), 1);
        assert_eq!(normalized_io_size(4097, 4096), 2);
    }
}
