//! [MS-SMB2] 2.2.30 SMB2 CANCEL Request: StructureSize (4) and Reserved (2).
//! There is no CANCEL response (3.3.5.16); the request is matched by the
//! header's MessageId, or AsyncId when SMB2_FLAGS_ASYNC_COMMAND is set.

use super::Command;

reserved_body! {
    /// A zero-copy view of an SMB2 CANCEL Request body ([MS-SMB2] 2.2.30).
    view CancelRequest;
    /// The SMB2 CANCEL Request ([MS-SMB2] 2.2.30): no values.
    repr CancelRequestRepr;
    what: "SMB2 CANCEL request",
    command: Some(Command::Cancel)
}
