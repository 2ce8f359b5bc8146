//! Unix-socket listeners: one per `[[vm]]` with `unix_socket`, for
//! containers, host processes and cloud-hypervisor's hybrid vsock. Every
//! accepted connection is a session of that VM: the VM's identity comes from
//! which socket it arrived on, never from what the client says.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use thiserror::Error;
use tracing::{debug, warn};
use vgpu_broker::Broker;
use vgpu_broker::tenant::Tenant;

use crate::sessions::SessionHub;

/// Mode of VM sockets: owner and group may connect.
pub const VM_SOCKET_MODE: u32 = 0o660;

/// Why a socket could not be set up.
#[derive(Debug, Error)]
pub enum ListenerError {
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
pub fn bind_socket(path: &Path, mode: u32) -> Result<UnixListener, ListenerError> {
    let bind_err = |source| ListenerError::Bind {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(bind_err)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(ListenerError::InUse(path.to_path_buf()));
            }
            debug!(path = %path.display(), "removing a stale socket");
            std::fs::remove_file(path).map_err(bind_err)?;
        }
        Ok(_) => return Err(ListenerError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_err(e)),
    }
    let l = UnixListener::bind(path).map_err(bind_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(bind_err)?;
    Ok(l)
}

/// A running accept loop; stopping it removes the socket file.
pub struct Listener {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("path", &self.path)
            .finish()
    }
}

impl Listener {
    /// Serves sessions of `tenant` on `path`; `hub` runs them.
    pub fn start(
        hub: Arc<SessionHub>,
        broker: Arc<Broker>,
        tenant: Arc<Tenant>,
        path: &Path,
    ) -> Result<Listener, ListenerError> {
        let l = bind_socket(path, VM_SOCKET_MODE)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let transport = format!("unix:{}", path.display());
        let thread = std::thread::Builder::new()
            .name(format!("vgpu-listen-{}", tenant.name))
            .spawn(move || accept_loop(&l, &hub, &broker, &tenant, &transport, &stop2))
            .map_err(|source| ListenerError::Bind {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Listener {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn accept_loop(
    l: &UnixListener,
    hub: &Arc<SessionHub>,
    broker: &Arc<Broker>,
    tenant: &Arc<Tenant>,
    transport: &str,
    stop: &AtomicBool,
) {
    for conn in l.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                warn!(tenant = %tenant.name, error = %e, "accept failed");
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        hub.spawn(
            Arc::clone(broker),
            Arc::clone(tenant),
            stream,
            transport.to_string(),
        );
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_socket_is_replaced_but_a_live_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/vm.sock");
        let l1 = bind_socket(&p, VM_SOCKET_MODE).unwrap();
        assert!(matches!(
            bind_socket(&p, VM_SOCKET_MODE),
            Err(ListenerError::InUse(_))
        ));
        drop(l1);
        let _l2 = bind_socket(&p, VM_SOCKET_MODE).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, VM_SOCKET_MODE);
    }

    #[test]
    fn a_regular_file_is_not_clobbered() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("file");
        std::fs::write(&p, b"keep").unwrap();
        let e = bind_socket(&p, VM_SOCKET_MODE).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"keep");
    }
}
