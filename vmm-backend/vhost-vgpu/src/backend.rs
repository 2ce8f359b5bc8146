//! The `VhostUserBackend` glue between vhost-user-backend's vring worker and [`VgpuDevice`].

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing::{debug, warn};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock};
use vm_memory::GuestMemoryAtomic;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventNotifier};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::chain::GuestMem;
use super::device::VgpuDevice;
use super::exec::VgpuService;
use super::shared::RESCAN_EVENT;
use super::wire::{
    CONFIG_MAGIC, CTRL_QUEUE, ConfigSpace, DEVICE_VERSION, F_BATCH, MAX_DATA, MAX_INLINE,
    MAX_SEGMENTS, NUM_QUEUES, SUBMIT_QUEUE,
};
use vgpu_proto::spin::{AdaptiveSpin, DEFAULT_SPIN};
use vgpu_vhost_user::{ExitEvents, VIRTIO_FEATURES, protocol_features, read_config, watch_rings};

/// One VMM connection's worth of backend: created when the VMM connects, dropped after it leaves.
pub struct VgpuBackend {
    device: Mutex<VgpuDevice>,
    /// What stopping a queue does; needs no device lock (a paused device's queue thread may hold
    /// it while it waits).
    stop: Box<dyn Fn(usize) + Send + Sync>,
    service: Arc<dyn VgpuService>,
    queue_size: usize,
    exit: ExitEvents,
    /// Written by the device when it resumes (see [`RESCAN_EVENT`]); registered with the vring
    /// worker by [`VgpuBackend::rescan_fd`]'s user.
    rescan: EventFd,
    /// How long the queue thread polls the rings after answering frames itself (`watch_rings`).
    spin: Mutex<AdaptiveSpin>,
}

/// Polls in a row after which the queue thread goes back to its event loop (its exit and rescan
/// events) even while the guest keeps sending.
const MAX_POLL_ROUNDS: usize = 1024;

impl std::fmt::Debug for VgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VgpuBackend")
            .field("queue_size", &self.queue_size)
            .finish_non_exhaustive()
    }
}

impl VgpuBackend {
    /// Wraps `device`; `service` feeds the config space.
    pub fn new(
        device: VgpuDevice,
        service: Arc<dyn VgpuService>,
        queue_size: u16,
    ) -> io::Result<Self> {
        let rescan = EventFd::new(EFD_NONBLOCK)?;
        device.set_rescan_event(rescan.try_clone()?);
        Ok(VgpuBackend {
            rescan,
            stop: Box::new(device.stopper()),
            device: Mutex::new(device),
            service,
            queue_size: usize::from(queue_size),
            exit: ExitEvents::new()?,
            spin: Mutex::new(AdaptiveSpin::new(DEFAULT_SPIN)),
        })
    }

    /// Locks the device; a panic on another thread does not make the state unusable for a reset.
    pub fn device(&self) -> MutexGuard<'_, VgpuDevice> {
        self.device.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The config space as the guest reads it now.
    pub fn config_space(&self) -> ConfigSpace {
        ConfigSpace {
            device_version: DEVICE_VERSION,
            max_segments: MAX_SEGMENTS as u32,
            slice_size: self.service.slice_size(),
            max_inline: MAX_INLINE as u32,
            max_data: MAX_DATA as u32,
            protocol_version: vgpu_proto::PROTOCOL_VERSION,
            magic: CONFIG_MAGIC,
            name: self.service.gpu_name(),
        }
    }

    /// The descriptor to register with the vring worker's epoll as device event
    /// [`RESCAN_EVENT`] (`VringEpollHandler::register_listener`).
    pub fn rescan_fd(&self) -> RawFd {
        self.rescan.as_raw_fd()
    }

    /// Closes the exit-event descriptors vhost-user-backend leaked. Call only after the daemon is
    /// dropped, when its vring workers have exited.
    pub fn reclaim_exit_fds(&self) {
        self.exit.reclaim();
    }

    /// Takes the chains of both queues (either kick may carry frames the other queue's frames
    /// wait for: sequence order spans both); returns how many frames this thread answered
    /// itself.
    fn process_queues(&self, ctrl: &VringRwLock, submit: &VringRwLock) -> usize {
        let mut dev = self.device();
        dev.process_queue(SUBMIT_QUEUE, submit);
        dev.process_queue(CTRL_QUEUE, ctrl);
        dev.take_answered_here()
    }
}

impl VhostUserBackend for VgpuBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        self.queue_size
    }

    fn features(&self) -> u64 {
        VIRTIO_FEATURES | (1 << F_BATCH) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn acked_features(&self, features: u64) {
        self.device().set_batch(features & (1 << F_BATCH) != 0);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        protocol_features()
    }

    fn reset_device(&self) {
        self.device().reset("VHOST_USER_RESET_DEVICE");
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // QEMU's generic vhost-user device stops the queues when the guest driver resets the
        // device, the guest reboots (it sends no RESET_DEVICE) or the VM is paused: the device
        // pauses and decides when the queues run again (see `device`).
        if (queue_index as usize) < NUM_QUEUES {
            (self.stop)(queue_index as usize);
        }
        Ok(())
    }

    fn set_event_idx(&self, enabled: bool) {
        self.device().set_event_idx(enabled);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        read_config(&self.config_space().to_bytes(), offset, size)
    }

    fn set_config(&self, offset: u32, _buf: &[u8]) -> io::Result<()> {
        warn!(
            offset,
            "ignoring a write to the read-only virtio-vgpu config space"
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
        // guest can cause is handled (and logged) inside the device.
        let (Some(ctrl), Some(submit)) = (vrings.get(CTRL_QUEUE), vrings.get(SUBMIT_QUEUE)) else {
            return Ok(());
        };
        if device_event == RESCAN_EVENT {
            // The device resumed: consume the event, then look at both queues as after a kick.
            if let Err(e) = self.rescan.read()
                && e.kind() != io::ErrorKind::WouldBlock
            {
                warn!(error = %e, "cannot read the virtio-vgpu rescan event");
            }
        } else if usize::from(device_event) >= NUM_QUEUES {
            debug!(event = device_event, "unexpected virtio-vgpu backend event");
            return Ok(());
        }
        let mem = {
            let mut dev = self.device();
            dev.know_rings(ctrl, submit);
            dev.memory()
        };
        let Some(mem) = mem else {
            return Ok(());
        };
        // A guest that got its answer from this thread often sends its next request within
        // microseconds: watch the rings for it a little while before sleeping (`watch_rings`).
        // Not after frames handed to session threads: they need the CPU more.
        let mut rounds = 0;
        loop {
            let answered = self.process_queues(ctrl, submit);
            if answered == 0
                || rounds == MAX_POLL_ROUNDS
                || !watch_rings(&self.spin, &mem, &[ctrl, submit])
            {
                break;
            }
            rounds += 1;
        }
        Ok(())
    }
}
