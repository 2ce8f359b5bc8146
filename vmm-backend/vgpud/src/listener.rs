//! Unix-socket listeners: one per `[[vm]]` with `unix_socket`, for
//! containers, host processes and cloud-hypervisor's hybrid vsock. Every
//! accepted connection is a session of that VM: the VM's identity comes from
//! which socket it arrived on, never from what the client says.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use tracing::warn;
use vgpu_broker::Broker;
use vgpu_broker::tenant::Tenant;

pub use vgpu_vhost_user::{SocketError as ListenerError, bind_socket};

use crate::session_hub::SessionHub;

/// Mode of VM sockets: owner and group may connect.
pub const VM_SOCKET_MODE: u32 = vgpu_vhost_user::SOCKET_MODE;

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
        // The client writes its requests straight into the socket: polling for the next one
        // catches back-to-back calls without a wake-up.
        hub.spawn(
            Arc::clone(broker),
            Arc::clone(tenant),
            stream,
            transport.to_string(),
            vgpu_proto::spin::DEFAULT_SPIN,
            // The guest process itself: it may share page-locked memory by descriptor.
            true,
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
