//! [MS-SMB2] 2.2.7 SMB2 LOGOFF Request and 2.2.8 SMB2 LOGOFF Response: both are
//! StructureSize (4) and Reserved (2).

use super::Command;

reserved_body! {
    /// A zero-copy view of an SMB2 LOGOFF Request body ([MS-SMB2] 2.2.7).
    view LogoffRequest;
    /// The SMB2 LOGOFF Request ([MS-SMB2] 2.2.7): no values.
    repr LogoffRequestRepr;
    what: "SMB2 LOGOFF request",
    command: Some(Command::Logoff)
}

reserved_body! {
    /// A zero-copy view of an SMB2 LOGOFF Response body ([MS-SMB2] 2.2.8).
    view LogoffResponse;
    /// The SMB2 LOGOFF Response ([MS-SMB2] 2.2.8): no values.
    repr LogoffResponseRepr;
    what: "SMB2 LOGOFF response",
    command: Some(Command::Logoff)
}
