//! The file-system commands of the `smb2` upper layer: QUERY_INFO
//! ([MS-SMB2] 3.3.5.20), SET_INFO (3.3.5.21), QUERY_DIRECTORY (3.3.5.18) and
//! LOCK (3.3.5.14), over the share's [`Store`](super::store::Store).

use super::{Conn, Core, Exec, Step};
use smbdirect_protocol::ntstatus::*;
use smbdirect_protocol::smb2::*;

/// Byte-range locks ([MS-SMB2] 3.3.5.14) of every file of the share, shared
/// by all workers.
#[derive(Debug, Default)]
pub struct LockTable {}

/// QUERY_DIRECTORY enumeration state of a directory Open.
#[derive(Debug, Default)]
pub(super) struct DirCursor {}

impl Core {
    /// [MS-SMB2] 3.3.5.20.
    pub(super) fn query_info<'a>(
        &mut self,
        _c: &mut Conn,
        _fid: FileId,
        _r: &QueryInfoRequestRepr<'_>,
        _ex: &mut Exec,
        _w: &mut CompoundWriter<'_>,
        _ok: HeaderRepr,
    ) -> Result<Step<'a>, NtStatus> {
        Err(STATUS_NOT_SUPPORTED)
    }

    /// [MS-SMB2] 3.3.5.21.
    pub(super) fn set_info<'a>(
        &mut self,
        _c: &mut Conn,
        _fid: FileId,
        _r: &SetInfoRequestRepr<'_>,
        _ex: &mut Exec,
        _w: &mut CompoundWriter<'_>,
        _ok: HeaderRepr,
    ) -> Result<Step<'a>, NtStatus> {
        Err(STATUS_NOT_SUPPORTED)
    }

    /// [MS-SMB2] 3.3.5.18.
    pub(super) fn query_directory<'a>(
        &mut self,
        _c: &mut Conn,
        _fid: FileId,
        _r: &QueryDirectoryRequestRepr<'_>,
        _ex: &mut Exec,
        _w: &mut CompoundWriter<'_>,
        _ok: HeaderRepr,
    ) -> Result<Step<'a>, NtStatus> {
        Err(STATUS_NOT_SUPPORTED)
    }

    /// [MS-SMB2] 3.3.5.14.
    pub(super) fn lock<'a>(
        &mut self,
        _c: &mut Conn,
        _fid: FileId,
        _r: &LockRequestRepr<'_>,
        _ex: &mut Exec,
        _w: &mut CompoundWriter<'_>,
        _ok: HeaderRepr,
    ) -> Result<Step<'a>, NtStatus> {
        Err(STATUS_NOT_SUPPORTED)
    }
}
