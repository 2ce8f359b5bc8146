//! Page-locked guest memory shared with vgpud (issue 22): on a unix-socket session the shim
//! backs `cuMemHostAlloc`/`cuMemAllocHost` buffers with a sealed memfd and passes it with
//! `HostShare`; copies from and to such a buffer (`MemcpyHtoDShared`, `MemcpyDtoHShared`) carry
//! no bytes and run as one copy between the mapping and device memory.
//!
//! The guest is hostile, so a descriptor is mapped only when
//!
//! - it is a memfd (sealing works only there) sealed against shrinking and growing: a guest that
//!   could shrink the file under the mapping would make vgpud's copies fault (`SIGBUS`);
//! - it is at least as large as the size declared, which is bounded ([`MAX_REGION_BYTES`]);
//! - it is not on hugetlbfs (a page missing from the pool would fault vgpud too);
//! - once mapped and sealed by vgpud with `F_SEAL_FUTURE_WRITE` (no hole punching, no new
//!   writable mapping; the guest's own mapping still writes), it has no hole: every page is
//!   allocated and charged to the guest, never by vgpud's copies to vgpud.
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
/// `statfs.f_type` of hugetlbfs.
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

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
    /// A hugetlbfs memfd: a page missing from the pool would fault vgpud (`SIGBUS`).
    #[error("hugetlbfs memfds are not shared")]
    HugeTlb,
    /// vgpud could not seal the file against hole punching (the guest set `F_SEAL_SEAL`).
    #[error("cannot add F_SEAL_FUTURE_WRITE (leave F_SEAL_SEAL unset)")]
    Reseal(#[source] std::io::Error),
    /// Not every page of the region is allocated: vgpud's copies would allocate them, charged
    /// to vgpud instead of the guest.
    #[error("the memfd has a hole at byte {0}: allocate it whole (fallocate) before sharing")]
    Hole(u64),
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

/// What a unix-socket connection shares with its session besides the socket: the descriptors
/// its reader receives ([`FdInbox`]) and the doorbell its reader watches
/// ([`crate::doorbell::BellSlot`]).
#[derive(Debug, Clone, Default)]
pub struct HostSharing {
    /// Descriptors received (`SpinRead::receiving_fds`).
    pub fds: Arc<FdInbox>,
    /// The doorbell (`SpinRead::watching`).
    pub bell: Arc<crate::doorbell::BellSlot>,
}

impl HostSharing {
    /// An empty inbox and slot.
    pub fn new() -> Self {
        Self::default()
    }

    /// `reader`, receiving descriptors into the inbox and watching the doorbell.
    pub fn reader<S>(
        &self,
        reader: vgpu_proto::spin::SpinRead<S>,
    ) -> vgpu_proto::spin::SpinRead<S> {
        reader
            .receiving_fds(Arc::clone(&self.fds) as Arc<dyn FdSink>)
            .watching(Arc::clone(&self.bell) as Arc<dyn vgpu_proto::spin::Bell>)
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
        // SAFETY: `sf` is plain data filled by fstatfs on a descriptor we own.
        let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and a valid out pointer.
        if unsafe { libc::fstatfs(raw, &mut sf) } != 0 {
            return Err(ShareError::Map(std::io::Error::last_os_error()));
        }
        #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
        if i64::from(sf.f_type as i64) == HUGETLBFS_MAGIC {
            return Err(ShareError::HugeTlb);
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
        // Unmapped again on every failure below.
        let region = Self { ptr, len };
        // With our writable mapping made, no new writable mapping, no write(2) and, above all,
        // no hole punching (fallocate, MADV_REMOVE) any more: the guest's own mapping, made
        // before, still writes. So every page stays allocated, charged to the guest.
        // SAFETY: fcntl on a descriptor we own.
        if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_FUTURE_WRITE) } != 0 {
            return Err(ShareError::Reseal(std::io::Error::last_os_error()));
        }
        // SAFETY: lseek on a descriptor we own (the offset is not used after).
        let hole = unsafe { libc::lseek(raw, 0, libc::SEEK_HOLE) };
        let hole =
            u64::try_from(hole).map_err(|_| ShareError::Map(std::io::Error::last_os_error()))?;
        if hole < size {
            return Err(ShareError::Hole(hole));
        }
        Ok(region)
    }

    /// Where the mapping starts (page-aligned).
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Bytes mapped.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether it maps nothing (never: sizes are at least 1).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy of the region's bytes.
    #[cfg(test)]
    fn to_vec(&self) -> Vec<u8> {
        // SAFETY: the whole live mapping.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }.to_vec()
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
            std::slice::from_raw_parts(
                self.ptr.as_ptr().wrapping_add(offset as usize),
                len as usize,
            )
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
            std::slice::from_raw_parts_mut(
                self.ptr.as_ptr().wrapping_add(offset as usize),
                len as usize,
            )
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
        if size == 0 || size > MAX_REGION_BYTES {
            return Err(ShareError::BadSize(size).into());
        }
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
        let r = self.table.remove(region).ok_or_else(|| {
            CuError::invalid_handle(format!("{region:#x} is not a shared region"))
        })?;
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    use vgpu_proto::cuda;
    use vgpu_proto::msg::{self, Op, Request, decode_exact};

    use super::*;
    use crate::Broker;
    use crate::session::Session;
    use crate::session_loop::accept_hello;
    use crate::testutils::{self, MemDevice, TestClient, map_shared, vm};

    const MIB: u64 = 1 << 20;

    fn broker() -> Arc<Broker> {
        let dev: Arc<dyn crate::device::Device> = Arc::new(MemDevice::new(1 << 30, Duration::ZERO));
        let b = Arc::new(Broker::new(vec![("gpu0".into(), dev)]));
        b.add_tenant(&vm("vm1", 64 * MIB)).unwrap();
        b
    }

    /// A memfd of `len` bytes holding `fill` (0: a pattern), with `seals` added.
    fn memfd(len: u64, seals: libc::c_int, fill: u8) -> OwnedFd {
        testutils::memfd(
            len,
            seals,
            |i| if fill == 0 { (i % 251) as u8 } else { fill },
        )
    }

    fn session(b: &Arc<Broker>, inbox: Option<Arc<FdInbox>>) -> (Session, u64) {
        let hello = msg::Hello {
            protocol_version: vgpu_proto::PROTOCOL_VERSION,
            pid: 1,
            shim_version: "t".into(),
            process_name: "share".into(),
        };
        let (mut s, _) = accept_hello(b, b.tenant("vm1").unwrap(), &hello, "test").unwrap();
        if let Some(i) = inbox {
            s.accept_fds(i);
        }
        let mut out = Vec::new();
        let req = Request::CtxCreate(msg::CtxCreate {
            device: 0,
            flags: 0,
        });
        s.handle(&req, &[], &mut out, true).unwrap();
        (
            s,
            decode_exact::<msg::Handle>(&out, false).unwrap().0.handle,
        )
    }

    fn call(s: &mut Session, req: Request) -> Result<Vec<u8>, CuError> {
        let mut out = Vec::new();
        s.handle(&req, &[], &mut out, true).map(|()| out)
    }

    fn share(s: &mut Session, size: u64) -> Result<u64, CuError> {
        let out = call(s, Request::HostShare(msg::HostShare { size }))?;
        Ok(decode_exact::<msg::Handle>(&out, false).unwrap().0.handle)
    }

    const SEALED: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

    #[test]
    fn shared_copies_run_between_the_mapping_and_device_memory() {
        let b = broker();
        let inbox = FdInbox::new();
        let (mut s, ctx) = session(&b, Some(Arc::clone(&inbox)));
        let fd = memfd(MIB, SEALED, 0);
        let pattern = |i: u64| (i % 251) as u8;
        // The guest's own view of the buffer (a plain mapping, unmapped by the region's drop).
        let guest = SharedRegion {
            ptr: map_shared(&fd, MIB),
            len: MIB as usize,
        };
        let guest_fd = fd.try_clone().unwrap();
        inbox.accept(fd);
        let region = share(&mut s, MIB).unwrap();
        assert_eq!(s.shared_regions(), 1);
        // The guest can no longer punch holes into it; its own mapping still writes.
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: fallocate on our descriptor.
        let r = unsafe { libc::fallocate(guest_fd.as_raw_fd(), punch, 0, 4096) };
        assert_eq!(r, -1, "hole punching must be refused once shared");
        let out = call(&mut s, Request::MemAlloc(msg::MemAlloc { ctx, size: MIB })).unwrap();
        let p = decode_exact::<msg::Ptr>(&out, false).unwrap().0.ptr;
        // Host to device from an offset, then back to another offset, asynchronously.
        let htod = Request::MemcpyHtoDShared(msg::MemcpyHtoDShared {
            ctx,
            stream: 0,
            dst: p,
            region,
            offset: 4096,
            len: 8192,
        });
        let mut out = Vec::new();
        s.handle(&htod, &[], &mut out, false).unwrap();
        let dtoh = Request::MemcpyDtoHShared(msg::MemcpyDtoHShared {
            ctx,
            stream: 0,
            src: p + 100,
            region,
            offset: 0,
            len: 100,
        });
        // Unsharing does not pull the mapping from under queued copies.
        s.handle(&dtoh, &[], &mut out, false).unwrap();
        call(&mut s, Request::CtxSynchronize(msg::CtxSynchronize { ctx })).unwrap();
        let want: Vec<u8> = (4196..4296).map(pattern).collect();
        let seen = guest.to_vec();
        assert_eq!(&seen[..100], &want[..]);
        assert_eq!(seen[100], pattern(100));
        call(&mut s, Request::HostUnshare(msg::HostUnshare { region })).unwrap();
        assert_eq!(s.shared_regions(), 0);
        // A stale region is refused.
        let e = call(&mut s, htod).unwrap_err();
        assert_eq!(e.code, cuda::CUDA_ERROR_INVALID_VALUE, "{e:?}");
    }

    #[test]
    fn hostile_shares_get_clear_errors_and_hold_nothing() {
        let b = broker();
        let inbox = FdInbox::new();
        let (mut s, ctx) = session(&b, Some(Arc::clone(&inbox)));
        let inval = cuda::CUDA_ERROR_INVALID_VALUE;
        // No descriptor.
        let e = share(&mut s, 4096).unwrap_err();
        assert_eq!(e.code, inval);
        assert!(e.message.contains("without a descriptor"), "{e:?}");
        // Not sealed; sealed against growing only; not a memfd; too small; size 0 or huge.
        inbox.accept(memfd(4096, 0, 0));
        let e = share(&mut s, 4096).unwrap_err();
        assert!(e.message.contains("not sealed"), "{e:?}");
        inbox.accept(memfd(4096, libc::F_SEAL_GROW, 0));
        assert!(share(&mut s, 4096).is_err());
        let (a, _b) = UnixStream::pair().unwrap();
        inbox.accept(OwnedFd::from(a));
        let e = share(&mut s, 4096).unwrap_err();
        assert!(e.message.contains("not a sealable memfd"), "{e:?}");
        inbox.accept(memfd(4096, SEALED, 0));
        let e = share(&mut s, 8192).unwrap_err();
        assert!(e.message.contains("fewer than"), "{e:?}");
        inbox.accept(memfd(4096, SEALED, 0));
        assert_eq!(share(&mut s, 0).unwrap_err().code, inval);
        // Sealed with F_SEAL_SEAL (vgpud cannot forbid hole punching), or sparse.
        inbox.accept(memfd(4096, SEALED | libc::F_SEAL_SEAL, 0));
        let e = share(&mut s, 4096).unwrap_err();
        assert!(e.message.contains("F_SEAL_FUTURE_WRITE"), "{e:?}");
        let sparse = memfd(4096, 0, 0);
        // SAFETY: plain calls on our descriptor.
        let grown = unsafe { libc::ftruncate(sparse.as_raw_fd(), 3 * 4096) };
        assert_eq!(grown, 0);
        // SAFETY: as above.
        let sealed = unsafe { libc::fcntl(sparse.as_raw_fd(), libc::F_ADD_SEALS, SEALED) };
        assert_eq!(sealed, 0);
        inbox.accept(sparse);
        let e = share(&mut s, 3 * 4096).unwrap_err();
        assert!(e.message.contains("hole at byte 4096"), "{e:?}");
        inbox.accept(memfd(4096, SEALED, 0));
        assert_eq!(share(&mut s, u64::MAX).unwrap_err().code, inval);
        // Every refused descriptor was consumed and closed; nothing is held.
        assert!(inbox.is_empty());
        assert_eq!(s.shared_regions(), 0);
        // Offsets past the end, overflowing ranges, forged regions, foreign device pointers.
        inbox.accept(memfd(4096, SEALED, 0));
        let region = share(&mut s, 4096).unwrap();
        let out = call(&mut s, Request::MemAlloc(msg::MemAlloc { ctx, size: 8192 })).unwrap();
        let p = decode_exact::<msg::Ptr>(&out, false).unwrap().0.ptr;
        let copy = |region, offset, len, dst| {
            Request::MemcpyHtoDShared(msg::MemcpyHtoDShared {
                ctx,
                stream: 0,
                dst,
                region,
                offset,
                len,
            })
        };
        for req in [
            copy(region, 4000, 200, p),
            copy(region, u64::MAX, 2, p),
            copy(region, 1, u64::MAX, p),
            copy(region ^ 1, 0, 16, p),
            copy(0xdead_beef, 0, 16, p),
            copy(region, 0, 16, 0x10),
            copy(region, 0, 4096, p + 8000),
        ] {
            let e = call(&mut s, req).unwrap_err();
            assert_eq!(e.code, inval, "{e:?}");
        }
        let e = call(
            &mut s,
            Request::HostUnshare(msg::HostUnshare { region: 77 }),
        )
        .unwrap_err();
        assert_eq!(e.code, cuda::CUDA_ERROR_INVALID_HANDLE);
        // The region counts against the VM's handles and is returned with the session.
        let handles = b
            .tenant("vm1")
            .unwrap()
            .limits
            .used(vgpu_config::limits::Budget::Handles);
        drop(s);
        let after = b
            .tenant("vm1")
            .unwrap()
            .limits
            .used(vgpu_config::limits::Budget::Handles);
        assert!(after + 2 <= handles, "{handles} -> {after}");
    }

    #[test]
    fn sessions_without_an_inbox_refuse_to_share() {
        let b = broker();
        let (mut s, _) = session(&b, None);
        let e = share(&mut s, 4096).unwrap_err();
        assert_eq!(e.code, cuda::CUDA_ERROR_NOT_SUPPORTED, "{e:?}");
    }

    #[test]
    fn descriptors_past_the_inbox_end_the_session() {
        let b = broker();
        let (c, srv) = UnixStream::pair().unwrap();
        let b2 = Arc::clone(&b);
        let t = b.tenant("vm1").unwrap();
        let served = std::thread::spawn(move || {
            let sharing = HostSharing::new();
            let r = sharing.reader(vgpu_proto::spin::SpinRead::new(&srv));
            crate::session_loop::serve_with_fds(&b2, t, r, &srv, "test", None, Some(sharing))
        });
        let mut client = TestClient::new(&c);
        client.hello().unwrap();
        // One HostShare with its descriptor works over the socket.
        let fd = memfd(4096, SEALED, 1);
        let mut frame = Vec::new();
        let p = msg::encode(&msg::HostShare { size: 4096 });
        vgpu_proto::frame::write_frame(&mut frame, msg::HostShare::OPCODE, 0, 99, 0, &[&p])
            .unwrap();
        vgpu_proto::fdpass::send_with_fd(c.as_fd(), &frame, fd.as_fd()).unwrap();
        let mut payload = Vec::new();
        let h = vgpu_proto::frame::read_frame(&mut &c, &mut payload).unwrap();
        assert_eq!(h.status, 0, "{}", String::from_utf8_lossy(&payload));
        // A flood of descriptors with pings: the session ends with a protocol error.
        let ping = {
            let mut f = Vec::new();
            vgpu_proto::frame::write_frame(&mut f, msg::Ping::OPCODE, 0, 100, 0, &[]).unwrap();
            f
        };
        for _ in 0..=MAX_QUEUED_FDS {
            if vgpu_proto::fdpass::send_with_fd(c.as_fd(), &ping, fd.as_fd()).is_err() {
                break;
            }
        }
        let r = served.join().unwrap();
        assert!(
            matches!(&r, Err(crate::session_loop::ServeError::Protocol(m)) if m.contains("descriptors")),
            "{r:?}"
        );
        assert!(b.tenant("vm1").unwrap().sessions().is_empty());
    }
}
