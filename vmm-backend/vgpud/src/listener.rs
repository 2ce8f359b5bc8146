//! Unix-socket listeners: one per `[[vm]]` with `unix_socket`, for
//! containers, host processes and cloud-hypervisor's hybrid vsock. Every
//! accepted connection is a session of that VM: the VM's identity comes from
//! which socket it arrived on, never from what the client says.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
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
    /// The listening socket, shared with the accept loop: shutting it down wakes the loop.
    socket: Arc<UnixListener>,
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
        let socket = Arc::new(bind_socket(path, VM_SOCKET_MODE)?);
        let l = Arc::clone(&socket);
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
            socket,
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
        // Wake the accept loop: accept(2) on a listening socket that is shut down fails at
        // once. Connecting to the path, as this did before, cannot wake it once the socket
        // file is gone (removed by an operator or a cleaner of /run), and vgpud then hung on
        // its way out.
        // SAFETY: shutdown(2) of a socket this listener owns, open until `self.socket` drops.
        unsafe { libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;
    use std::sync::mpsc;
    use std::time::Duration;

    use vgpu_broker::testutils::{MemDevice, TestClient, vm};

    use super::*;

    /// How long a stopping listener may take; it takes microseconds.
    const STOP_DEADLINE: Duration = Duration::from_secs(20);

    fn listener(dir: &Path) -> Listener {
        let dev: Arc<dyn vgpu_broker::device::Device> =
            Arc::new(MemDevice::new(1 << 24, Duration::ZERO));
        let broker = Arc::new(Broker::new(vec![("gpu0".into(), dev)]));
        broker.add_tenant(&vm("vm1", 1 << 20)).unwrap();
        let tenant = broker.tenant("vm1").unwrap();
        let hub = Arc::new(SessionHub::new(None));
        Listener::start(hub, broker, tenant, &dir.join("vm1.sock")).unwrap()
    }

    /// Drops `l` on another thread and says whether that ended within the deadline.
    fn stops(l: Listener) -> bool {
        let (done, ended) = mpsc::channel();
        std::thread::spawn(move || {
            drop(l);
            let _ = done.send(());
        });
        ended.recv_timeout(STOP_DEADLINE).is_ok()
    }

    #[test]
    fn a_listener_serves_sessions_and_stops_removing_its_socket() {
        let dir = tempfile::tempdir().unwrap();
        let l = listener(dir.path());
        let mut c = TestClient::new(UnixStream::connect(l.path()).unwrap());
        assert!(c.hello().unwrap().session_id > 0);
        let path = l.path().to_path_buf();
        assert!(stops(l), "the listener did not stop");
        assert!(!path.exists(), "the socket file was left behind");
    }

    #[test]
    fn a_listener_whose_socket_file_was_removed_still_stops() {
        let dir = tempfile::tempdir().unwrap();
        let l = listener(dir.path());
        std::fs::remove_file(l.path()).unwrap();
        assert!(
            stops(l),
            "the listener did not stop once its socket file was gone"
        );
    }
}
