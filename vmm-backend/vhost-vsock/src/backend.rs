//! The `VhostUserBackend` glue between vhost-user-backend's vring worker and [`VsockDevice`].

use std::io;
use std::os::fd::RawFd;
use std::sync::{Mutex, MutexGuard};

use tracing::{debug, warn};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventNotifier};

use vgpu_proto::spin::{AdaptiveSpin, DEFAULT_SPIN};
use vgpu_vhost_user::{
    ExitEvents, VIRTIO_FEATURES, describe_ring, has_available, kick_pending, protocol_features,
    read_config, vring_ready, watch_rings,
};

use super::device::VsockDevice;
use super::packet::GuestMem;
use super::{EVENT_QUEUE, NUM_QUEUES, RX_QUEUE, TX_QUEUE};

/// Custom event id of the device's inner epoll fd in the vring worker. Ids `0..NUM_QUEUES` are the
/// queues and `NUM_QUEUES` is the worker's exit event.
pub const BACKEND_EVENT: u16 = NUM_QUEUES as u16 + 1;

/// Rounds in a row the device thread may poll the tx queue and answer what it finds there
/// before it goes back to its event loop (which also serves host sockets and the VMM).
const MAX_POLL_ROUNDS: usize = 1024;

/// One VMM connection's worth of backend: created when the VMM connects, dropped after it leaves.
pub struct VsockBackend {
    device: Mutex<VsockDevice>,
    epoll_fd: RawFd,
    queue_size: usize,
    config_space: [u8; 8],
    exit: ExitEvents,
    /// How long the device thread polls the tx queue after answering calls itself
    /// (`watch_rings`).
    spin: Mutex<AdaptiveSpin>,
}

impl std::fmt::Debug for VsockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VsockBackend")
            .field("queue_size", &self.queue_size)
            .finish_non_exhaustive()
    }
}

impl VsockBackend {
    /// Wraps `device`; the config space advertises `guest_cid`.
    pub fn new(device: VsockDevice, guest_cid: u64, queue_size: u16) -> io::Result<Self> {
        Ok(VsockBackend {
            epoll_fd: device.epoll_fd(),
            device: Mutex::new(device),
            queue_size: usize::from(queue_size),
            config_space: guest_cid.to_le_bytes(),
            exit: ExitEvents::new()?,
            spin: Mutex::new(AdaptiveSpin::new(DEFAULT_SPIN)),
        })
    }

    /// The fd the vring worker must watch (as [`BACKEND_EVENT`]) for host socket activity.
    pub fn epoll_fd(&self) -> RawFd {
        self.epoll_fd
    }

    /// Closes the exit-event descriptors vhost-user-backend leaked (one per VMM connection
    /// otherwise). Call only after the daemon is dropped, when its vring workers have exited.
    pub fn reclaim_exit_fds(&self) {
        self.exit.reclaim();
    }

    /// Locks the device; a panic on another thread does not make the state unusable for a reset.
    pub fn device(&self) -> MutexGuard<'_, VsockDevice> {
        self.device.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Handles one event of the vring worker; returns the calls answered on this thread meanwhile.
    fn process(&self, device_event: u16, rx: &VringRwLock, tx: &VringRwLock) -> u64 {
        let mut dev = self.device();
        let before = dev.calls_on_device_thread();
        match device_event {
            e if usize::from(e) == TX_QUEUE => {
                dev.process_tx(tx);
            }
            e if usize::from(e) == RX_QUEUE => {}
            e if usize::from(e) == EVENT_QUEUE => {
                // The driver posted event buffers; the device only ever needs them for transport
                // resets after migration, which vhost-user-vsock does not support.
            }
            BACKEND_EVENT => {
                dev.process_host_events(vring_ready(rx));
                // The wake-up audit ran: chains on the tx queue with no kick on its way, the
                // same as at the audit before, were missed (a kick lost, or a guest that
                // published without one). Not at the first audit that sees them: the guest may be
                // between publishing them and kicking.
                if dev.take_audit_ran()
                    && let Some(mem) = dev.memory()
                {
                    let mem = mem.memory();
                    let waiting = !kick_pending(tx) && has_available(tx, &mem);
                    let next = tx.get_ref().get_queue().next_avail();
                    if dev.tx_unannounced(waiting.then_some(next)) {
                        let before = describe_ring(tx, &mem);
                        let chains = dev.process_tx(tx);
                        if chains > 0 {
                            dev.found_unannounced_tx(chains, &before);
                        }
                    }
                }
            }
            other => debug!(event = other, "unexpected vsock backend event"),
        }
        dev.process_rx(rx);
        dev.calls_on_device_thread() - before
    }
}

impl VhostUserBackend for VsockBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        self.queue_size
    }

    fn features(&self) -> u64 {
        VIRTIO_FEATURES | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        protocol_features()
    }

    fn reset_device(&self) {
        self.device().reset("driver reset the device");
    }

    fn set_event_idx(&self, enabled: bool) {
        self.device().set_event_idx(enabled);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        read_config(&self.config_space, offset, size)
    }

    fn set_config(&self, offset: u32, _buf: &[u8]) -> io::Result<()> {
        warn!(
            offset,
            "ignoring a write to the read-only vsock config space"
        );
        Ok(())
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMem>) -> io::Result<()> {
        debug!("guest memory table updated");
        self.device().set_memory(mem);
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        vec![(1 << NUM_QUEUES) - 1]
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        self.exit.hand_out()
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        // Errors are never returned: that would stop the vring worker for good. Everything the
        // guest or a host peer can cause is handled (and logged) inside the device.
        let (Some(rx), Some(tx)) = (vrings.get(RX_QUEUE), vrings.get(TX_QUEUE)) else {
            return Ok(());
        };
        if self.process(device_event, rx, tx) == 0 {
            return Ok(());
        }
        // A guest that got its answer from this thread often sends its next request within
        // microseconds: watch the tx queue for it a little while before sleeping. Not after
        // calls handed to session threads: they need the CPU more.
        let Some(mem) = self.device().memory() else {
            return Ok(());
        };
        for _ in 0..MAX_POLL_ROUNDS {
            if !watch_rings(&self.spin, &mem, &[tx]) || self.process(TX_QUEUE as u16, rx, tx) == 0 {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PortConnector, VsockStats};
    use std::sync::Arc;
    use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
    use virtio_bindings::bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

    struct Nothing;
    impl PortConnector for Nothing {
        fn connect(&self, _port: u32) -> Option<io::Result<crate::Endpoint>> {
            None
        }
    }

    fn backend() -> VsockBackend {
        let dev = VsockDevice::new(
            0x1234_5678_9abc,
            4096,
            "/nonexistent/vsock".into(),
            Arc::new(Nothing),
            Arc::new(VsockStats::default()),
            None,
        )
        .unwrap();
        VsockBackend::new(dev, 0x1234_5678_9abc, 256).unwrap()
    }

    #[test]
    fn config_space_is_the_le64_guest_cid_and_bounds_checked() {
        let b = backend();
        assert_eq!(
            b.get_config(0, 8),
            0x1234_5678_9abcu64.to_le_bytes().to_vec()
        );
        assert_eq!(b.get_config(4, 4), vec![0x34, 0x12, 0, 0]);
        assert!(b.get_config(4, 8).is_empty());
        assert!(b.get_config(u32::MAX, 2).is_empty());
    }

    #[test]
    fn features_and_queues() {
        let b = backend();
        let f = b.features();
        assert_ne!(f & (1 << VIRTIO_F_VERSION_1), 0);
        assert_ne!(f & (1 << VIRTIO_RING_F_EVENT_IDX), 0);
        assert_ne!(f & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(), 0);
        assert_eq!(b.num_queues(), 3);
        assert_eq!(b.max_queue_size(), 256);
        assert_eq!(b.queues_per_thread(), vec![0b111]);
        assert!(
            b.protocol_features()
                .contains(VhostUserProtocolFeatures::CONFIG)
        );
        assert!(b.exit_event(0).is_some());
    }
}
