//! Page-locked guest memory shared with vgpud (issue 22): on a unix-socket session the shim
//! backs `cuMemHostAlloc`/`cuMemAllocHost` buffers with a sealed memfd and passes it with
//! `HostShare`; copies from and to such a buffer (`MemcpyHtoDShared`, `MemcpyDtoHShared`) carry
//! no bytes and run as one copy between the mapping and device memory.
//!
//! The guest is hostile, so a descriptor is mapped only when
//!
//! - it is a memfd (sealing works only there) sealed against shrinking and growing: a guest that
//!   could shrink the file under the mapping would make vgpud's copies fault (`SIGBUS`);
//! - it is at least as large as the size declared, which is bounded ([`MAX_REGION_BYTES`]).
//!
//! Descriptors wait in a bounded per-session queue ([`FdInbox`]) between the reader that
//! received them and the `HostShare` that takes them; past [`MAX_QUEUED_FDS`] they are closed
//! and the session ends with a protocol error. Regions are counted per session
//! ([`MAX_SHARED_REGIONS`], [`MAX_SHARED_BYTES`]) and against the VM's `handles` budget; queued
//! copies hold their region through an `Arc`, so unsharing (or the session ending) never pulls
//! the memory from under a copy that has not run yet.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use thiserror::Error;
use tracing::{debug, warn};
use vgpu_proto::fdpass::FdSink;

use crate::device::DeviceContext;
use crate::engine::Work;
use crate::error::CuError;

/// Descriptors a session may have received and not yet used.
pub const MAX_QUEUED_FDS: usize = 16;
/// Shared regions one session may hold.
pub const MAX_SHARED_REGIONS: usize = 1024;
/// Largest single region.
pub const MAX_REGION_BYTES: u64 = 64 << 30;
/// Address space all of a session's regions may take in vgpud.
pub const MAX_SHARED_BYTES: u64 = 256 << 30;
/// Seals a region's memfd must carry.
pub const REQUIRED_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// Why a descriptor was not mapped.
#[derive(Debug, Error)]
pub enum ShareError {
    /// The request came without a descriptor.
    #[error("HostShare came without a descriptor (SCM_RIGHTS)")]
    NoDescriptor,
    /// This transport carries no descriptors (vsock, virtio-vgpu).
    #[error("this transport cannot share host memory")]
    Unsupported,
    /// Not a memfd (or another file that cannot be sealed).
    #[error("the descriptor is not a sealable memfd")]
    NotMemfd(#[source] std::io::Error),
    /// Missing seals.
    #[error("the memfd is not sealed against shrinking and growing (seals {0:#x})")]
    NotSealed(libc::c_int),
    /// The file is smaller than declared.
    #[error("the memfd holds {have} bytes, fewer than the {want} declared")]
    TooSmall {
        /// Bytes in the file.
        have: u64,
        /// Bytes declared.
        want: u64,
    },
    /// A size of 0 or past [`MAX_REGION_BYTES`].
    #[error("a shared region must hold 1 to {MAX_REGION_BYTES} bytes, not {0}")]
    BadSize(u64),
    /// `fstat` or `mmap` failed.
    #[error("cannot map the memfd")]
    Map(#[source] std::io::Error),
}

impl From<ShareError> for CuError {
    fn from(e: ShareError) -> Self {
        let mut m = e.to_string();
        if let Some(s) = std::error::Error::source(&e) {
            m = format!("{m}: {s}");
        }
        match e {
            ShareError::Unsupported => CuError::not_supported(m),
            _ => CuError::invalid_value(m),
        }
    }
}

/// Descriptors received on a session's socket, waiting for the `HostShare` they came with.
#[derive(Debug, Default)]
pub struct FdInbox {
    queue: Mutex<VecDeque<OwnedFd>>,
    overflowed: AtomicBool,
}

impl FdInbox {
    /// An empty inbox.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The oldest descriptor received.
    pub fn take(&self) -> Option<OwnedFd> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    /// Whether descriptors were closed because the queue was full (the session must end).
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Relaxed)
    }

    /// Descriptors waiting.
    pub fn len(&self) -> usize {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl FdSink for FdInbox {
    fn accept(&self, fd: OwnedFd) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= MAX_QUEUED_FDS {
            drop(fd);
            self.overflowed.store(true, Ordering::Relaxed);
            return;
        }
        q.push_back(fd);
    }

    fn overflow(&self) {
        self.overflowed.store(true, Ordering::Relaxed);
    }
}

/// A guest memfd mapped into vgpud (`MAP_SHARED`), unmapped when the last holder drops it.
#[derive(Debug)]
pub struct SharedRegion {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is a plain shared mapping owned by this value; it is only reached through
// the raw pointer by copies (`copy_in`/`copy_out`), which any thread may make.
unsafe impl Send for SharedRegion {}
// SAFETY: as above; `&SharedRegion` offers no mutation of Rust-visible state.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Checks `fd` (a sealed memfd of at least `size` bytes) and maps its first `size` bytes.
    pub fn map(fd: &OwnedFd, size: u64) -> Result<Self, ShareError> {
        if size == 0 || size > MAX_REGION_BYTES {
            return Err(ShareError::BadSize(size));
        }
        let raw = fd.as_raw_fd();
        // SAFETY: fcntl(F_GET_SEALS) on a descriptor we own reads its seals and changes nothing.
        let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(ShareError::NotMemfd(std::io::Error::last_os_error()));
        }
        if seals & REQUIRED_SEALS != REQUIRED_SEALS {
            return Err(ShareError::NotSealed(seals));
        }
        // SAFETY: `st` is plain data filled by fstat on a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and a valid out pointer.
        if unsafe { libc::fstat(raw, &mut st) } != 0 {
            return Err(ShareError::Map(std::io::Error::last_os_error()));
        }
        let have = u64::try_from(st.st_size).unwrap_or(0);
        if have < size {
            return Err(ShareError::TooSmall { have, want: size });
        }
        let len = usize::try_from(size).map_err(|_| ShareError::BadSize(size))?;
        // SAFETY: a fresh shared mapping of a file we hold open, at an address the kernel
        // picks; the result is checked. The file cannot shrink (sealed), so every byte of the
        // mapping stays backed for as long as it lives.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ShareError::Map(std::io::Error::last_os_error()));
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| ShareError::Map(std::io::Error::other("mmap returned null")))?;
        Ok(Self { ptr, len })
    }

    /// Bytes mapped.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether it maps nothing (never: sizes are at least 1).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks that `[offset, offset + len)` lies inside the region.
    pub fn check(&self, offset: u64, len: u64) -> Result<(), CuError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(CuError::invalid_value(format!(
                "bytes {offset}..+{len} are outside the shared region of {} bytes",
                self.len
            ))),
        }
    }

    /// Writes `len` bytes at `offset` of the region to device memory at `dst`.
    pub fn copy_in(
        &self,
        dev: &dyn DeviceContext,
        dst: u64,
        offset: u64,
        len: u64,
    ) -> Result<(), CuError> {
        self.check(offset, len)?;
        // SAFETY: `[offset, offset + len)` lies inside the live mapping (checked above; the
        // mapping lives as long as `self`, and the sealed file keeps every page backed). The
        // guest may write these bytes concurrently: the copy then sees some mix of old and new
        // bytes, as a DMA engine would, which the device copies as plain bytes.
        let src = unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr().add(offset as usize), len as usize)
        };
        dev.write(dst, src).map_err(CuError::from)
    }

    /// Reads `len` bytes of device memory at `src` into the region at `offset`.
    pub fn copy_out(
        &self,
        dev: &dyn DeviceContext,
        src: u64,
        offset: u64,
        len: u64,
    ) -> Result<(), CuError> {
        self.check(offset, len)?;
        // SAFETY: as in `copy_in`; vgpud keeps no other reference into the mapping while the
        // device fills these bytes (each copy builds its own slice for its duration).
        let dst = unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset as usize), len as usize)
        };
        dev.read(src, dst).map_err(CuError::from)
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping made in `map`, unmapped once, here.
        if unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) } != 0 {
            warn!(error = %std::io::Error::last_os_error(), "cannot unmap a shared host region");
        }
    }
}

/// Which way a shared copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Region to device.
    ToDevice,
    /// Device to region.
    ToHost,
}

/// A queued copy between a shared region and device memory. It holds the region, so the
/// mapping outlives an unshare; it holds no bytes, so it is not charged to `queued_bytes`.
#[derive(Debug)]
pub struct SharedCopy {
    /// The region.
    pub region: Arc<SharedRegion>,
    /// Which way.
    pub dir: Direction,
    /// Device address.
    pub dev: u64,
    /// Offset in the region.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

impl Work for SharedCopy {
    fn run(self: Box<Self>, dev: &dyn DeviceContext) -> Result<(), CuError> {
        match self.dir {
            Direction::ToDevice => self.region.copy_in(dev, self.dev, self.offset, self.len),
            Direction::ToHost => self.region.copy_out(dev, self.dev, self.offset, self.len),
        }
    }

    fn quick(&self) -> bool {
        self.len <= crate::engine::QUICK_BYTES
    }
}

/// A session's shared regions.
#[derive(Debug)]
pub struct SharedRegions {
    inbox: Option<Arc<FdInbox>>,
    table: crate::handles::HandleTable<Arc<SharedRegion>>,
    bytes: u64,
}

impl Default for SharedRegions {
    fn default() -> Self {
        Self {
            inbox: None,
            table: crate::handles::HandleTable::new(crate::handles::HandleKind::HostShare),
            bytes: 0,
        }
    }
}

impl SharedRegions {
    /// Counts the regions against `budget` (the VM's `handles`).
    pub fn set_budget(&mut self, budget: crate::limits::HandleBudget) {
        self.table.set_budget(budget);
    }

    /// Takes descriptors from `inbox` (only sessions on a unix socket have one).
    pub fn set_inbox(&mut self, inbox: Arc<FdInbox>) {
        self.inbox = Some(inbox);
    }

    /// The inbox, if the transport passes descriptors.
    pub fn inbox(&self) -> Option<&Arc<FdInbox>> {
        self.inbox.as_ref()
    }

    /// `HostShare`: maps the next received descriptor as a region of `size` bytes.
    pub fn share(&mut self, size: u64) -> Result<u64, CuError> {
        let inbox = self.inbox.as_ref().ok_or(ShareError::Unsupported)?;
        // The descriptor is taken (and closed on every failure below) even when the request is
        // refused, so that it cannot be used by a later request instead.
        let fd = inbox.take().ok_or(ShareError::NoDescriptor)?;
        if self.table.len() >= MAX_SHARED_REGIONS {
            return Err(CuError::out_of_memory(format!(
                "this process shares {MAX_SHARED_REGIONS} host regions already"
            )));
        }
        if self.bytes.saturating_add(size) > MAX_SHARED_BYTES {
            return Err(CuError::out_of_memory(format!(
                "this process shares {} bytes of host memory; {size} more would pass {MAX_SHARED_BYTES}",
                self.bytes
            )));
        }
        let region = SharedRegion::map(&fd, size)?;
        drop(fd);
        let h = self.table.insert(Arc::new(region))?;
        self.bytes += size;
        debug!(region = h, size, "host memory shared");
        Ok(h)
    }

    /// `HostUnshare`.
    pub fn unshare(&mut self, region: u64) -> Result<(), CuError> {
        let r = self
            .table
            .remove(region)
            .ok_or_else(|| CuError::invalid_handle(format!("{region:#x} is not a shared region")))?;
        self.bytes -= r.len();
        Ok(())
    }

    /// The region `region` names, checked to hold `[offset, offset + len)`.
    pub fn get(&self, region: u64, offset: u64, len: u64) -> Result<Arc<SharedRegion>, CuError> {
        let r = self
            .table
            .get(region)
            .ok_or_else(|| CuError::invalid_value(format!("{region:#x} is not a shared region")))?;
        r.check(offset, len)?;
        Ok(Arc::clone(r))
    }

    /// Regions held.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}
