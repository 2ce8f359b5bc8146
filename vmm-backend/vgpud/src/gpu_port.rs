//! The GPU port of a VM's vsock device: guest connections to
//! [`vgpu_proto::GPU_VSOCK_PORT`] become broker sessions of that VM, served
//! in-process; every other port is forwarded to `<vsock_uds_path>_<port>`.

use std::io;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use tracing::warn;
use vgpu_broker::Broker;
use vgpu_broker::tenant::Tenant;

use crate::session_hub::SessionHub;
use vgpu_vhost_vsock::PortConnector;

/// Serves the GPU port of one VM in-process.
pub struct GpuPortConnector {
    hub: Arc<SessionHub>,
    broker: Arc<Broker>,
    tenant: Arc<Tenant>,
    transport: String,
}

impl std::fmt::Debug for GpuPortConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPortConnector")
            .field("tenant", &self.tenant.name)
            .finish()
    }
}

impl GpuPortConnector {
    /// A connector for `tenant`, whose guest has context id `cid`; `hub`
    /// runs the sessions.
    pub fn new(hub: Arc<SessionHub>, broker: Arc<Broker>, tenant: Arc<Tenant>, cid: u64) -> Self {
        Self {
            hub,
            broker,
            tenant,
            transport: format!("vsock:{cid}"),
        }
    }
}

impl PortConnector for GpuPortConnector {
    fn connect(&self, port: u32) -> Option<io::Result<UnixStream>> {
        if port != vgpu_proto::GPU_VSOCK_PORT {
            return None;
        }
        if !self.tenant.is_open() {
            // The session would be refused at its handshake anyway; refuse the
            // connection right away so the guest sees ECONNRESET.
            return Some(Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("VM `{}` is not accepting sessions", self.tenant.name),
            )));
        }
        // The device never blocks: the session runs on its own thread and
        // talks to the device through a socket pair.
        Some(UnixStream::pair().map(|(device_end, session_end)| {
            // The requests come through the device's own thread, which needs a CPU to move
            // them: the session thread blocks at once rather than compete with it.
            self.hub.spawn(
                Arc::clone(&self.broker),
                Arc::clone(&self.tenant),
                session_end,
                self.transport.clone(),
                std::time::Duration::ZERO,
                // The peer is the device's thread: no descriptors come this way.
                false,
            );
            device_end
        }))
        .map(|r| {
            r.inspect_err(|e| warn!(tenant = %self.tenant.name, error = %e, "cannot create a session socket pair"))
        })
    }
}
