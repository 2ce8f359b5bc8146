//! The GPU port of a VM's vsock device: guest connections to
//! [`vgpu_proto::GPU_VSOCK_PORT`] become broker sessions of that VM, served
//! in-process; every other port is forwarded to `<vsock_uds_path>_<port>`.

use std::io;
use std::sync::Arc;

use tracing::warn;
use vgpu_broker::Broker;
use vgpu_broker::tenant::Tenant;

use crate::session_hub::SessionHub;
use vgpu_vhost_vsock::{Endpoint, PortConnector, inproc};

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
    fn connect(&self, port: u32) -> Option<io::Result<Endpoint>> {
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
        // talks to the device thread through the shared rings of an in-process
        // endpoint (no socket, no system call per packet).
        Some(
            inproc::pair(inproc::DEFAULT_RING_CAPACITY)
                .map(|(device_end, session_end)| {
                    self.hub.spawn_in_process(
                        Arc::clone(&self.broker),
                        Arc::clone(&self.tenant),
                        session_end,
                        self.transport.clone(),
                    );
                    Endpoint::from(device_end)
                })
                .inspect_err(|e| warn!(tenant = %self.tenant.name, error = %e, "cannot create an in-process endpoint")),
        )
    }
}
