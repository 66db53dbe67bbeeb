//! [MS-SMB2] 2.2.28 SMB2 ECHO Request and 2.2.29 SMB2 ECHO Response: both are
//! StructureSize (4) and Reserved (2).

use super::Command;

reserved_body! {
    /// A zero-copy view of an SMB2 ECHO Request body ([MS-SMB2] 2.2.28).
    view EchoRequest;
    /// The SMB2 ECHO Request ([MS-SMB2] 2.2.28): no values.
    repr EchoRequestRepr;
    what: "SMB2 ECHO request",
    command: Some(Command::Echo)
}

reserved_body! {
    /// A zero-copy view of an SMB2 ECHO Response body ([MS-SMB2] 2.2.29).
    view EchoResponse;
    /// The SMB2 ECHO Response ([MS-SMB2] 2.2.29): no values.
    repr EchoResponseRepr;
    what: "SMB2 ECHO response",
    command: Some(Command::Echo)
}
