//! Page-locked host memory shared with vgpud (unix socket transport): a `cuMemHostAlloc` /
//! `cuMemAllocHost` buffer is a sealed memfd mapped here and, through `HostShare`, in vgpud.
//! Copies whose host range lies inside such a buffer send `MemcpyHtoDShared` /
//! `MemcpyDtoHShared`, which carry no bytes: vgpud copies between its mapping and device memory
//! in one go, and a device-to-host copy to pinned memory is asynchronous, as in CUDA.
//!
//! Anything that fails on the way (no unix socket, an older vgpud, a refusal) leaves the buffer
//! to the ordinary path (`VGPU_LOG=debug` says why); `VGPU_SHARE_PINNED=0` turns sharing off.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use thiserror::Error;
use vgpu_hugemem::{HUGE_PAGE, HugeMapping};
use vgpu_proto::msg;

use crate::client::{CallError, Client};

/// Name of the memfds (shown in `/proc/PID/maps`).
const MEMFD_NAME: &CStr = c"vgpu-pinned";
/// Seals that make the buffer's size fixed for good. Not `F_SEAL_SEAL`: vgpud adds
/// `F_SEAL_FUTURE_WRITE` once it has mapped the buffer, so that no hole can be punched into it.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
/// The environment variable that turns sharing off (`0`).
pub const SHARE_ENV: &str = "VGPU_SHARE_PINNED";

/// Why a buffer could not be shared.
#[derive(Debug, Error)]
pub enum ShareError {
    /// A system call failed.
    #[error("{call} failed")]
    Sys {
        /// Which call.
        call: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// vgpud refused or the transport cannot pass descriptors.
    #[error("vgpud did not take the buffer (CUresult {code}): {message}")]
    Refused {
        /// The `CUresult`.
        code: u32,
        /// vgpud's reason.
        message: String,
    },
}

fn sys(call: &'static str) -> ShareError {
    ShareError::Sys {
        call,
        source: std::io::Error::last_os_error(),
    }
}

/// Whether sharing is enabled (`VGPU_SHARE_PINNED` is not `0`).
pub fn enabled() -> bool {
    std::env::var(SHARE_ENV).map_or(true, |v| v != "0")
}

/// A pinned buffer shared with vgpud: this process's mapping and vgpud's region id.
#[derive(Debug)]
pub struct SharedBuffer {
    ptr: NonNull<u8>,
    /// Bytes the application asked for.
    len: usize,
    /// Bytes of the memfd and the mapping (from [`HUGE_PAGE`] on, whole huge pages).
    mapped: usize,
    region: u64,
    /// From [`HUGE_PAGE`] on: the huge-page-aligned, advised address range the memfd is mapped
    /// over (its `Drop` unmaps the range); `None`: the mapping is unmapped by our `Drop`.
    reservation: Option<HugeMapping>,
}

// SAFETY: the mapping is owned by this value; the application reaches it through the raw
// pointer it was handed, the shim only through that pointer's address.
unsafe impl Send for SharedBuffer {}
// SAFETY: as above; `&SharedBuffer` exposes only the address, length and region id.
unsafe impl Sync for SharedBuffer {}

impl SharedBuffer {
    /// Creates a sealed memfd of `len` bytes, maps it and shares it over `client`.
    pub fn create(client: &mut Client, len: usize) -> Result<Self, ShareError> {
        let len = len.max(1);
        // Large buffers are whole huge pages, aligned and advised, like the shim's private ones.
        let reservation = if len >= HUGE_PAGE {
            Some(HugeMapping::new(len).map_err(|e| ShareError::Sys {
                call: "mmap",
                source: std::io::Error::other(e.to_string()),
            })?)
        } else {
            None
        };
        let size = if reservation.is_some() {
            len.next_multiple_of(HUGE_PAGE)
        } else {
            len
        };
        // SAFETY: a NUL-terminated name and flags; the result is checked.
        let raw = unsafe {
            libc::memfd_create(
                MEMFD_NAME.as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(sys("memfd_create"));
        }
        // SAFETY: a fresh descriptor we own (closed when `fd` drops, after vgpud has its copy).
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let flen = libc::off_t::try_from(size).map_err(|_| ShareError::Sys {
            call: "ftruncate",
            source: std::io::Error::from_raw_os_error(libc::EFBIG),
        })?;
        // SAFETY: plain calls on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), flen) } != 0 {
            return Err(sys("ftruncate"));
        }
        // Every page allocated now (and faulted in by MAP_POPULATE below), charged to this
        // process: vgpud refuses a file with holes, which its copies would fill at its own
        // cost. A real driver's page-locking allocates pinned memory up front too.
        // SAFETY: as above.
        if unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, flen) } != 0 {
            return Err(sys("fallocate"));
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(sys("fcntl(F_ADD_SEALS)"));
        }
        let (at, fixed) = match &reservation {
            Some(r) => (r.as_non_null().as_ptr().cast(), libc::MAP_FIXED),
            None => (std::ptr::null_mut(), 0),
        };
        // SAFETY: a shared mapping of our sealed file (it cannot shrink under us): at an address
        // of the kernel's choosing, or over the whole of our own reservation (`size` bytes),
        // which nothing else uses; checked below.
        let p = unsafe {
            libc::mmap(
                at,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                // Populated: every page faulted in now (vgpud checks that the file has no holes).
                libc::MAP_SHARED | libc::MAP_POPULATE | fixed,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys("mmap"));
        }
        let Some(ptr) = NonNull::new(p.cast::<u8>()) else {
            return Err(sys("mmap"));
        };
        if reservation.is_some() {
            // Advice only: shared memory uses huge pages where the host's shmem THP mode allows.
            // SAFETY: our own mapping; the advice changes no contents.
            unsafe { libc::madvise(p, size, libc::MADV_HUGEPAGE) };
        }
        let mut buf = SharedBuffer {
            ptr,
            len,
            mapped: size,
            region: 0,
            reservation,
        };
        let req = msg::HostShare { size: size as u64 };
        let reply = client
            .call_with_fd(&req, fd.as_fd())
            .map_err(|CallError { code, message }| ShareError::Refused { code, message })?;
        buf.region = reply.handle;
        Ok(buf)
    }

    /// Where the application's buffer starts.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// vgpud's name for it.
    pub fn region(&self) -> u64 {
        self.region
    }
}

impl Drop for SharedBuffer {
    fn drop(&mut self) {
        if self.reservation.is_none() {
            // SAFETY: the mapping made in `create`, unmapped once; vgpud's own mapping is
            // separate. (A reservation unmaps its whole range itself.)
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
        }
    }
}

/// The region and offset of `[addr, addr + len)` if it lies inside one shared buffer, from a
/// map of buffer start → (length, region).
pub fn lookup(
    shared: &std::collections::BTreeMap<usize, (usize, u64)>,
    addr: usize,
    len: usize,
) -> Option<(u64, u64)> {
    let (&base, &(size, region)) = shared.range(..=addr).next_back()?;
    let off = addr - base;
    (off.checked_add(len)? <= size).then_some((region, off as u64))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn only_ranges_wholly_inside_a_buffer_are_shared() {
        let m = BTreeMap::from([(0x1000, (0x1000, 7)), (0x4000, (0x100, 9))]);
        assert_eq!(lookup(&m, 0x1000, 0x1000), Some((7, 0)));
        assert_eq!(lookup(&m, 0x1800, 0x10), Some((7, 0x800)));
        assert_eq!(lookup(&m, 0x1800, 0x801), None, "straddles the end");
        assert_eq!(lookup(&m, 0x0fff, 1), None);
        assert_eq!(lookup(&m, 0x40ff, 1), Some((9, 0xff)));
        assert_eq!(lookup(&m, 0x4100, 1), None);
        assert_eq!(lookup(&m, usize::MAX, usize::MAX), None);
    }
}
