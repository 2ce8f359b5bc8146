//! The one socket binder of vgpud: every unix socket it listens on (the admin API, each VM's
//! unix socket, each vhost-user device socket) is bound by [`bind_socket`], with one rule set:
//! create the parent directory, refuse a socket another process still serves, replace a stale
//! one left by a dead process, never touch a file that is not a socket, and set the mode.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use thiserror::Error;
use tracing::debug;

/// Mode of VM-facing sockets (unix sockets and vhost-user sockets): owner and group may connect.
pub const SOCKET_MODE: u32 = 0o660;

/// Why a socket could not be set up.
#[derive(Debug, Error)]
pub enum SocketError {
    /// Another process is serving the path.
    #[error("{0} is in use by another running process (is another vgpud running?)")]
    InUse(PathBuf),
    /// The path exists and is not a socket.
    #[error("{0} exists and is not a socket; remove it or choose another path")]
    NotASocket(PathBuf),
    /// Creating, binding or configuring the socket failed.
    #[error("cannot listen on {path}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Binds a unix socket at `path`: creates the parent directory, replaces a
/// stale socket left by a dead process, refuses one that is alive, and sets
/// `mode`.
pub fn bind_socket(path: &Path, mode: u32) -> Result<UnixListener, SocketError> {
    let bind_err = |source| SocketError::Bind {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(bind_err)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(SocketError::InUse(path.to_path_buf()));
            }
            debug!(path = %path.display(), "removing a stale socket");
            std::fs::remove_file(path).map_err(bind_err)?;
        }
        Ok(_) => return Err(SocketError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_err(e)),
    }
    let l = UnixListener::bind(path).map_err(bind_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(bind_err)?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_socket_is_replaced_but_a_live_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/vm.sock");
        let l1 = bind_socket(&p, SOCKET_MODE).unwrap();
        assert!(matches!(
            bind_socket(&p, SOCKET_MODE),
            Err(SocketError::InUse(_))
        ));
        drop(l1);
        let _l2 = bind_socket(&p, SOCKET_MODE).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, SOCKET_MODE);
    }

    #[test]
    fn a_regular_file_is_not_clobbered() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("file");
        std::fs::write(&p, b"keep").unwrap();
        let e = bind_socket(&p, SOCKET_MODE).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"keep");
    }
}
