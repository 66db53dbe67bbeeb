//! Per-connection initial values of [MS-SMBD] 3.1.4.1 (active side) and
//! 3.1.7.2 (passive side), defaulting to the Windows values of Appendix B
//! notes <2> and <7>. Every value is overridable by the operator.

use crate::time::Duration;

/// The protocol version this implementation speaks ([MS-SMBD] 1.7).
pub const SMBD_VERSION_1: u16 = 0x0100;

/// [MS-SMBD] 3.1.4.1 / 3.1.7.2: "Post one receive buffer of at least 512 bytes"
/// before negotiation.
pub const NEGOTIATE_RECEIVE_MIN: u32 = 512;

/// [MS-SMBD] 3.1.5.6 / 3.1.5.7: smallest acceptable MaxReceiveSize.
pub const MIN_RECEIVE_SIZE: u32 = 128;

/// [MS-SMBD] 3.1.5.6 / 3.1.5.7: smallest acceptable MaxFragmentedSize.
pub const MIN_FRAGMENTED_SIZE: u32 = 131_072;

/// [MS-SMBD] Appendix B note <5>: Windows Server 2012 R2 and later fail a
/// Negotiate Request whose PreferredSendSize exceeds this.
pub const WINDOWS_MAX_PREFERRED_SEND_SIZE: u32 = 8136;

/// Data Transfer header length before padding ([MS-SMBD] 2.2.3).
pub const DATA_TRANSFER_HEADER_LEN: usize = 20;

/// The DataOffset a sender SHOULD use ([MS-SMBD] 3.1.5.4): 20 header bytes
/// plus 4 bytes of padding.
pub const DATA_TRANSFER_PAYLOAD_OFFSET: usize = 24;

/// Initial values for one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmbdConfig {
    /// Connection.ReceiveCreditMax (note <2>/<7>: 255).
    pub receive_credit_max: u16,
    /// Connection.SendCreditTarget (note <2>/<7>: 255).
    pub send_credit_target: u16,
    /// Connection.MaxSendSize (note <2>/<7>: 1364).
    pub max_send_size: u32,
    /// Connection.MaxReceiveSize (note <2>/<7>: 8192).
    pub max_receive_size: u32,
    /// Connection.MaxFragmentedRecvSize (note <2>/<7>: 1 MiB).
    pub max_fragmented_recv_size: u32,
    /// Connection.MaxReadWriteSize on the passive side (note <7>: 8 MiB), and
    /// the implementation-specific cap of 3.1.5.7 on the active side (note <6>).
    pub max_read_write_size: u32,
    /// Connection.KeepaliveInterval (note <1>/<2>/<7>: 120 s).
    pub keepalive_interval: Duration,
    /// Negotiation Timer on the active side (3.1.4.1: 120 s).
    pub negotiate_timeout_active: Duration,
    /// Negotiation Timer on the passive side (3.1.7.2: 5 s).
    pub negotiate_timeout_passive: Duration,
    /// Idle Connection Timer value after a keepalive request was sent
    /// (3.1.5.1, note <3>: 5 s): how long the peer has to answer.
    pub keepalive_response_timeout: Duration,
    /// Note <5>: fail a Negotiate Request whose PreferredSendSize > 8136 with
    /// STATUS_INSUFFICIENT_RESOURCES, as Windows Server 2012 R2+ does.
    /// Off by default: the normative rule clamps instead.
    pub strict_preferred_send_size: bool,
    /// Capacity of Connection.SendQueue, in upper-layer messages. The queue
    /// is allocated once when the connection is created; a full queue is
    /// backpressure to the upper layer, never growth.
    pub send_queue_capacity: u16,
}

impl Default for SmbdConfig {
    fn default() -> Self {
        SmbdConfig {
            receive_credit_max: 255,
            send_credit_target: 255,
            max_send_size: 1364,
            max_receive_size: 8192,
            max_fragmented_recv_size: 1024 * 1024,
            max_read_write_size: 8 * 1024 * 1024,
            keepalive_interval: Duration::from_secs(120),
            negotiate_timeout_active: Duration::from_secs(120),
            negotiate_timeout_passive: Duration::from_secs(5),
            keepalive_response_timeout: Duration::from_secs(5),
            strict_preferred_send_size: false,
            send_queue_capacity: 256,
        }
    }
}

/// A configuration the operator asked for that cannot work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl SmbdConfig {
    /// Checks that the values can be negotiated at all: a peer applying the
    /// 3.1.5.6/3.1.5.7 checks to what we send must not terminate us.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |s: String| Err(ConfigError(s));
        if self.receive_credit_max == 0 {
            return err("receive-credit-max must be at least 1".into());
        }
        if self.send_credit_target == 0 {
            return err(
                "send-credit-target must be at least 1 (a peer terminates on CreditsRequested 0)"
                    .into(),
            );
        }
        if self.max_receive_size < NEGOTIATE_RECEIVE_MIN {
            return err(format!(
                "max-receive-size {} is below {} (the negotiate receive buffer, [MS-SMBD] 3.1.4.1)",
                self.max_receive_size, NEGOTIATE_RECEIVE_MIN
            ));
        }
        if (self.max_send_size as usize) <= DATA_TRANSFER_PAYLOAD_OFFSET {
            return err(format!(
                "max-send-size {} leaves no room for payload after the 24-byte header",
                self.max_send_size
            ));
        }
        if self.max_fragmented_recv_size < MIN_FRAGMENTED_SIZE {
            return err(format!(
                "max-fragmented-size {} is below {} ([MS-SMBD] 3.1.5.6)",
                self.max_fragmented_recv_size, MIN_FRAGMENTED_SIZE
            ));
        }
        if self.max_read_write_size == 0 {
            return err("max-read-write-size must be at least 1".into());
        }
        if self.send_queue_capacity == 0 {
            return err("send queue capacity must be at least 1".into());
        }
        if self.keepalive_interval == Duration::ZERO {
            return err("keepalive-interval must be at least 1 second".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_windows_values_of_notes_2_and_7() {
        let c = SmbdConfig::default();
        assert_eq!(c.receive_credit_max, 255);
        assert_eq!(c.send_credit_target, 255);
        assert_eq!(c.max_send_size, 1364);
        assert_eq!(c.max_fragmented_recv_size, 1_048_576);
        assert_eq!(c.max_receive_size, 8192);
        assert_eq!(c.max_read_write_size, 8_388_608);
        assert_eq!(c.keepalive_interval, Duration::from_secs(120));
        assert_eq!(c.negotiate_timeout_active, Duration::from_secs(120));
        assert_eq!(c.negotiate_timeout_passive, Duration::from_secs(5));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn config_rejects_unnegotiable_values() {
        let mut c = SmbdConfig {
            max_fragmented_recv_size: 1000,
            ..SmbdConfig::default()
        };
        assert!(c.validate().is_err());
        c = SmbdConfig {
            send_credit_target: 0,
            ..SmbdConfig::default()
        };
        assert!(c.validate().is_err());
        c = SmbdConfig {
            max_receive_size: 200,
            ..SmbdConfig::default()
        };
        assert!(c.validate().is_err());
    }
}
