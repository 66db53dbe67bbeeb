//! [MS-SMB2] 2.2.11 SMB2 TREE_DISCONNECT Request and 2.2.12 SMB2 TREE_DISCONNECT Response: both are
//! StructureSize (4) and Reserved (2).

use super::Command;

reserved_body! {
    /// A zero-copy view of an SMB2 TREE_DISCONNECT Request body ([MS-SMB2] 2.2.11).
    view TreeDisconnectRequest;
    /// The SMB2 TREE_DISCONNECT Request ([MS-SMB2] 2.2.11): no values.
    repr TreeDisconnectRequestRepr;
    what: "SMB2 TREE_DISCONNECT request",
    command: Some(Command::TreeDisconnect)
}

reserved_body! {
    /// A zero-copy view of an SMB2 TREE_DISCONNECT Response body ([MS-SMB2] 2.2.12).
    view TreeDisconnectResponse;
    /// The SMB2 TREE_DISCONNECT Response ([MS-SMB2] 2.2.12): no values.
    repr TreeDisconnectResponseRepr;
    what: "SMB2 TREE_DISCONNECT response",
    command: Some(Command::TreeDisconnect)
}
