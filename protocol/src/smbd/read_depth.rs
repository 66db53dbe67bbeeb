//! The rule that outstanding RDMA Reads never exceed the negotiated ORD
//! ([MS-SMBD] Appendix A 6.2; IBA initiator depth). The worker asks
//! before posting each RDMA Read and reports each completion.

/// Counts RDMA Reads in flight on one queue pair against its ORD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadDepth {
    ord: u32,
    outstanding: u32,
}

impl ReadDepth {
    /// A limiter for a queue pair whose negotiated ORD is `ord` (≥ 1).
    pub fn new(ord: u32) -> Self {
        ReadDepth {
            ord: ord.max(1),
            outstanding: 0,
        }
    }

    /// The negotiated ORD.
    pub fn ord(&self) -> u32 {
        self.ord
    }

    /// Reads in flight.
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// Reserves a slot for one RDMA Read; false when ORD reads are already
    /// outstanding (queue the read and retry after a completion).
    pub fn try_start(&mut self) -> bool {
        if self.outstanding < self.ord {
            self.outstanding += 1;
            true
        } else {
            false
        }
    }

    /// One RDMA Read completed (successfully or not).
    pub fn complete(&mut self) {
        self.outstanding = self.outstanding.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_reads_never_exceed_ord() {
        let mut d = ReadDepth::new(2);
        assert!(d.try_start());
        assert!(d.try_start());
        assert!(!d.try_start());
        d.complete();
        assert!(d.try_start());
        assert_eq!(d.outstanding(), 2);
        assert_eq!(ReadDepth::new(0).ord(), 1);
    }
}
