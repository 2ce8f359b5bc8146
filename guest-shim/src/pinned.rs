//! Page-locked host memory shared with vgpud (unix socket transport): a `cuMemHostAlloc` /
//! `cuMemAllocHost` buffer is a sealed memfd mapped here and, through `HostShare`, in vgpud.
//! Copies whose host range lies inside such a buffer send `MemcpyHtoDShared` /
//! `MemcpyDtoHShared`, which carry no bytes: vgpud copies between its mapping and device memory
//! in one go, and a device-to-host copy to pinned memory is asynchronous, as in CUDA.
//!
//! Anything that fails on the way (no unix socket, an older vgpud, a refusal) leaves the buffer
//! to the ordinary path (`VGPU_LOG=debug` says why); `VGPU_SHARE_PINNED=0` turns sharing off.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::ptr::NonNull;
use std::sync::{Mutex, Once};

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

/// A memfd of `size` bytes named `name`, every page allocated, sealed against shrinking and
/// growing: what vgpud maps (`HostShare`).
fn sealed_memfd(name: &CStr, size: usize) -> Result<OwnedFd, ShareError> {
    // SAFETY: a NUL-terminated name and flags; the result is checked.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
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
    // Every page allocated now (and faulted in by MAP_POPULATE where it is mapped), charged to
    // this process: vgpud refuses a file with holes, which its copies would fill at its own
    // cost. A real driver's page-locking allocates pinned memory up front too.
    // SAFETY: as above.
    if unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, flen) } != 0 {
        return Err(sys("fallocate"));
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
        return Err(sys("fcntl(F_ADD_SEALS)"));
    }
    Ok(fd)
}

impl SharedBuffer {
    /// Creates a sealed memfd of `len` bytes, maps it and shares it over `client`.
    pub fn create(client: &mut Client, len: usize) -> Result<Self, ShareError> {
        Self::create_at(client, len, None)
    }

    /// [`SharedBuffer::create`], mapped at `at` when given (an address the caller reserved;
    /// never over an existing mapping).
    pub fn create_at(
        client: &mut Client,
        len: usize,
        at: Option<usize>,
    ) -> Result<Self, ShareError> {
        let len = len.max(1);
        // Large buffers are whole huge pages, aligned and advised, like the shim's private ones.
        let reservation = if len >= HUGE_PAGE && at.is_none() {
            Some(HugeMapping::new(len).map_err(|e| ShareError::Sys {
                call: "mmap",
                source: std::io::Error::other(e.to_string()),
            })?)
        } else {
            None
        };
        // Large buffers are whole huge pages wherever they go (a placed one's reserved range
        // has room: it is made of 2 MiB granules).
        let size = if len >= HUGE_PAGE {
            len.next_multiple_of(HUGE_PAGE)
        } else {
            len
        };
        let fd = sealed_memfd(MEMFD_NAME, size)?;
        let (at, fixed) = match (&reservation, at) {
            (Some(r), _) => (r.as_non_null().as_ptr().cast(), libc::MAP_FIXED),
            (None, Some(a)) => (a as *mut libc::c_void, libc::MAP_FIXED_NOREPLACE),
            (None, None) => (std::ptr::null_mut(), 0),
        };
        // SAFETY: a shared mapping of our sealed file (it cannot shrink under us): at an address
        // of the kernel's choosing, over the whole of our own reservation (`size` bytes), which
        // nothing else uses, or at the caller's address without replacing a mapping; checked
        // below.
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
        if fixed == libc::MAP_FIXED_NOREPLACE && p != at {
            // A kernel that ignored the flag (before Linux 4.17) placed it elsewhere.
            // SAFETY: the mapping just made, of `size` bytes.
            unsafe { libc::munmap(p, size) };
            return Err(ShareError::Sys {
                call: "mmap",
                source: std::io::Error::other("the address is taken"),
            });
        }
        if size >= HUGE_PAGE {
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

/// Name of the memfds that take over `cuMemHostRegister`ed ranges (shown in `/proc/PID/maps`).
const REGISTERED_NAME: &CStr = c"vgpu-registered";
/// A registered range with fewer whole pages than this stays private: sharing it costs two
/// copies and two mappings, and a copy that small is mostly the round trip anyway.
pub const ADOPT_MIN: usize = 64 * 1024;
/// Most ranges adopted at once: each keeps its memfd open (for a child of `fork`), and the
/// application's descriptor limit is the application's. Past it, registered ranges stay private.
pub const MAX_ADOPTED: usize = 64;
/// Where the kernel lists this process's mappings.
const SELF_MAPS: &str = "/proc/self/maps";

fn lock_adopted() -> std::sync::MutexGuard<'static, Vec<(usize, usize, RawFd)>> {
    ADOPTED.lock().unwrap_or_else(|p| p.into_inner())
}

/// The system's page size.
fn page_size() -> usize {
    // SAFETY: sysconf reads a constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// Memory left free beside a second copy of an adopted range, at least.
const COPY_MARGIN: u64 = 64 << 20;
/// Where cgroup file systems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Limits at least this large mean none (cgroup v1 writes "no limit" as a page-rounded
/// `i64::MAX`).
const NO_LIMIT: u64 = 1 << 62;

/// `MemAvailable` of `/proc/meminfo`, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_ascii_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// A cgroup level's room left: its limit (`max` or a number) less its usage; `None` without a
/// limit or with unreadable figures.
fn headroom(limit: &str, usage: &str) -> Option<u64> {
    let limit: u64 = limit.trim().parse().ok().filter(|&l| l < NO_LIMIT)?;
    let usage: u64 = usage.trim().parse().ok()?;
    Some(limit.saturating_sub(usage))
}

/// The memory cgroup directories of this process, from its own up to the hierarchy's root, and
/// the names of their limit and usage files (cgroup v2, else v1's memory controller).
fn memory_cgroup_dirs(proc_cgroup: &str) -> Vec<(std::path::PathBuf, &'static str, &'static str)> {
    let root = std::path::Path::new(CGROUP_ROOT);
    let mut found = None;
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let path = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            found = Some((
                root.join("memory"),
                path,
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            ));
            break;
        }
        if controllers.is_empty() && found.is_none() {
            let base = if root.join("cgroup.controllers").exists() {
                root.to_path_buf()
            } else {
                root.join("unified")
            };
            found = Some((base, path, "memory.max", "memory.current"));
        }
    }
    let Some((base, path, limit, usage)) = found else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    let mut dir = base.join(path);
    while dir.starts_with(&base) {
        dirs.push((dir.clone(), limit, usage));
        if !dir.pop() {
            break;
        }
    }
    dirs
}

/// Whether this process can hold a second copy of `len` bytes for a while: adopting a range and
/// giving it back each hold the old pages and the new ones at once. Checked against the
/// system's available memory and the room left under this process's memory cgroup limits, so
/// that registering a large buffer in a tight container does not end in the OOM killer.
fn can_afford_copy(len: usize) -> bool {
    let need = (len as u64).saturating_add(COPY_MARGIN);
    let read = |p: &std::path::Path| std::fs::read_to_string(p).ok();
    if read(std::path::Path::new("/proc/meminfo"))
        .and_then(|m| mem_available(&m))
        .is_some_and(|a| a < need)
    {
        return false;
    }
    let cgroup = read(std::path::Path::new("/proc/self/cgroup")).unwrap_or_default();
    memory_cgroup_dirs(&cgroup)
        .iter()
        .all(
            |(dir, limit, usage)| match (read(&dir.join(limit)), read(&dir.join(usage))) {
                (Some(l), Some(u)) => headroom(&l, &u).is_none_or(|h| h >= need),
                _ => true,
            },
        )
}

/// One line of `/proc/PID/maps`: its range, whether it is private and writable, its inode and
/// its path (empty for anonymous memory).
#[derive(Debug, PartialEq, Eq)]
struct Vma<'a> {
    start: usize,
    end: usize,
    private_rw: bool,
    inode: u64,
    path: &'a str,
}

fn parse_vma(line: &str) -> Option<Vma<'_>> {
    // range, perms, offset, dev, inode; the path is the rest of the line (it may hold spaces).
    let mut fields = [""; 5];
    let mut rest = line;
    for f in &mut fields {
        rest = rest.trim_start();
        let end = rest
            .find(|c: char| c.is_ascii_whitespace())
            .unwrap_or(rest.len());
        (*f, rest) = rest.split_at(end);
    }
    let [range, perms, _offset, _dev, inode] = fields;
    let (lo, hi) = range.split_once('-')?;
    let perms = perms.as_bytes();
    Some(Vma {
        start: usize::from_str_radix(lo, 16).ok()?,
        end: usize::from_str_radix(hi, 16).ok()?,
        private_rw: perms.len() >= 4 && &perms[..2] == b"rw" && perms[3] == b'p',
        inode: inode.parse().ok()?,
        path: rest.trim(),
    })
}

/// Whether `[start, end)` is covered, without a gap, by mappings that all satisfy `ok`.
fn covered_by(maps: &str, start: usize, end: usize, ok: impl Fn(&Vma<'_>) -> bool) -> bool {
    let mut at = start;
    for v in maps.lines().filter_map(parse_vma) {
        if v.end <= at || v.start >= end {
            continue;
        }
        if v.start > at || !ok(&v) {
            return false;
        }
        at = v.end;
        if at >= end {
            return true;
        }
    }
    false
}

/// Whether `[start, end)` is private anonymous read-write memory (the heap, `mmap`ed anonymous
/// memory, named or not; not the main thread's stack or a file): memory the shim may move into a
/// memfd without anyone else seeing a difference.
fn is_private_anonymous(maps: &str, start: usize, end: usize) -> bool {
    covered_by(maps, start, end, |v| {
        v.private_rw
            && v.inode == 0
            && (v.path.is_empty() || v.path == "[heap]" || v.path.starts_with("[anon:"))
    })
}

/// Whether `[start, end)` is still mapped from the memfd with inode `inode` only.
fn is_mapped_from(maps: &str, start: usize, end: usize, inode: u64) -> bool {
    covered_by(maps, start, end, |v| {
        v.inode == inode && v.path.contains("memfd:")
    })
}

fn read_maps() -> Result<String, ShareError> {
    std::fs::read_to_string(SELF_MAPS).map_err(|source| ShareError::Sys {
        call: "reading /proc/self/maps",
        source,
    })
}

/// Maps `len` bytes read-write at an address of the kernel's choosing, from `fd` (shared) or
/// anonymous memory (private), every page faulted in.
fn map_populated(len: usize, fd: Option<&OwnedFd>) -> Result<NonNull<u8>, ShareError> {
    let (flags, raw) = match fd {
        Some(fd) => (libc::MAP_SHARED, fd.as_raw_fd()),
        None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
    };
    // SAFETY: a new mapping at an address the kernel picks; nothing is replaced.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags | libc::MAP_POPULATE,
            raw,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(sys("mmap"));
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| sys("mmap"))
}

/// Copies `[at, at + len)` into the fresh mapping `fresh` (of `len` bytes) and moves `fresh`
/// over it: the range keeps its addresses and bytes, its memory is `fresh`'s from now on. On
/// failure `fresh` is unmapped and the range is as it was.
///
/// # Safety
///
/// `[at, at + len)` must be mapped and readable, and nobody may write to it meanwhile (a write
/// between the copy and the move would be lost); `fresh` must be a mapping of `len` bytes that
/// nothing else uses.
unsafe fn replace_pages(at: usize, len: usize, fresh: NonNull<u8>) -> Result<(), ShareError> {
    // SAFETY: both ranges are mapped for `len` bytes (the caller's contract) and distinct
    // (`fresh` is a mapping of its own).
    unsafe { std::ptr::copy_nonoverlapping(at as *const u8, fresh.as_ptr(), len) };
    // SAFETY: moves our own mapping `fresh` over `[at, at + len)`, which the caller lets us
    // replace; the kernel unmaps what was there only if the move can be made.
    let moved = unsafe {
        libc::mremap(
            fresh.as_ptr().cast(),
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            at as *mut libc::c_void,
        )
    };
    if moved == libc::MAP_FAILED {
        let e = sys("mremap");
        // SAFETY: `fresh` is still ours (the move failed).
        unsafe { libc::munmap(fresh.as_ptr().cast(), len) };
        return Err(e);
    }
    Ok(())
}

/// The whole pages of a `cuMemHostRegister`ed range, moved into a memfd shared with vgpud, so
/// that copies from and to them are the same one-copy requests as those of a `cuMemHostAlloc`
/// buffer. The addresses and the bytes stay as they were; [`AdoptedRange::restore`] gives the
/// pages back to private anonymous memory when the range is unregistered.
#[derive(Debug)]
pub struct AdoptedRange {
    start: usize,
    len: usize,
    region: u64,
    inode: u64,
    /// The memfd, kept open for a child of `fork` ([`privatize_in_child`]).
    _fd: OwnedFd,
}

/// The ranges adopted now: start, length and memfd, for [`privatize_in_child`].
static ADOPTED: Mutex<Vec<(usize, usize, RawFd)>> = Mutex::new(Vec::new());
/// Installs [`privatize_in_child`] once.
static FORK_HANDLER: Once = Once::new();

/// Runs in the child of a `fork`: each adopted range becomes a private (copy-on-write) mapping
/// of its memfd, as the anonymous memory it was would have been, so that the child's writes do
/// not reach the parent's buffer (nor the parent's later writes to pages the child wrote). No
/// allocation, no lock that may wait: a child has only the forking thread.
extern "C" fn privatize_in_child() {
    let Ok(list) = ADOPTED.try_lock() else {
        return;
    };
    for &(start, len, fd) in list.iter() {
        // SAFETY: replaces the adopted range (ours, mapped from `fd`) with a private mapping of
        // the same file and bytes; nothing else in the child uses the old mapping's sharing.
        unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                fd,
                0,
            )
        };
    }
}

impl AdoptedRange {
    /// Moves the whole pages of `[addr, addr + len)` into a memfd and shares it over `client`.
    /// `Ok(None)`: nothing to gain or not safely possible (fewer than [`ADOPT_MIN`] bytes of
    /// whole pages, [`MAX_ADOPTED`] ranges adopted already, too little memory for a second copy
    /// of them for a while, or pages that are not private anonymous memory, such as a file
    /// mapping, whose writes must reach the file). The caller makes sure no copy uses the range
    /// meanwhile; the application must not write to it while it registers it.
    pub fn adopt(client: &mut Client, addr: usize, len: usize) -> Result<Option<Self>, ShareError> {
        let page = page_size();
        let Some(start) = addr.checked_next_multiple_of(page) else {
            return Ok(None);
        };
        let end = addr.saturating_add(len) / page * page;
        if end <= start || end - start < ADOPT_MIN {
            return Ok(None);
        }
        let n = end - start;
        if lock_adopted().len() >= MAX_ADOPTED
            || !can_afford_copy(n)
            || !is_private_anonymous(&read_maps()?, start, end)
        {
            return Ok(None);
        }
        let file = std::fs::File::from(sealed_memfd(REGISTERED_NAME, n)?);
        let inode = file
            .metadata()
            .map_err(|source| ShareError::Sys {
                call: "fstat",
                source,
            })?
            .ino();
        let fd = OwnedFd::from(file);
        let fresh = map_populated(n, Some(&fd))?;
        let req = msg::HostShare { size: n as u64 };
        let region = match client.call_with_fd(&req, fd.as_fd()) {
            Ok(reply) => reply.handle,
            Err(CallError { code, message }) => {
                // SAFETY: our own mapping, unused.
                unsafe { libc::munmap(fresh.as_ptr().cast(), n) };
                return Err(ShareError::Refused { code, message });
            }
        };
        // SAFETY: the pages were checked to be mapped private anonymous memory (readable and
        // writable); the application does not write to a range while registering it; `fresh`
        // is ours.
        if let Err(e) = unsafe { replace_pages(start, n, fresh) } {
            let _ = client.call(&msg::HostUnshare { region }, &[]);
            return Err(e);
        }
        FORK_HANDLER.call_once(|| {
            // SAFETY: registers a handler that only makes system calls (see its comment).
            unsafe { libc::pthread_atfork(None, None, Some(privatize_in_child)) };
        });
        lock_adopted().push((start, n, fd.as_raw_fd()));
        Ok(Some(AdoptedRange {
            start,
            len: n,
            region,
            inode,
            _fd: fd,
        }))
    }

    /// Where the shared pages start.
    pub fn start(&self) -> usize {
        self.start
    }

    /// vgpud's name for them.
    pub fn region(&self) -> u64 {
        self.region
    }

    /// Their entry in a map of shared buffers: start → (length, region), as [`lookup`] and
    /// [`overlap`] take it.
    pub fn entry(&self) -> (usize, (usize, u64)) {
        (self.start, (self.len, self.region))
    }

    /// Gives the pages back to private anonymous memory, bytes unchanged. Call it once vgpud
    /// writes to them no more (no device-to-host copy into them queued). Pages the
    /// application unmapped or replaced meanwhile are left alone.
    pub fn restore(self) -> Result<(), ShareError> {
        lock_adopted().retain(|&(start, ..)| start != self.start);
        let end = self.start + self.len;
        if !is_mapped_from(&read_maps()?, self.start, end, self.inode) {
            return Ok(());
        }
        let fresh = map_populated(self.len, None)?;
        // SAFETY: the range is still our memfd's mapping (checked just now), readable; the
        // application does not write to a range while unregistering it; `fresh` is ours.
        unsafe { replace_pages(self.start, self.len, fresh) }
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

/// Where `[addr, addr + len)` overlaps a shared buffer (of a map of buffer start → (length,
/// region)) without lying inside it: the bytes before the overlap and the overlap's length,
/// when the overlap is at least `min` bytes. Only the last buffer that starts before the range
/// ends is considered; a copy split there finds earlier ones when its first part is copied.
pub fn overlap(
    shared: &std::collections::BTreeMap<usize, (usize, u64)>,
    addr: usize,
    len: usize,
    min: usize,
) -> Option<(usize, usize)> {
    let end = addr.checked_add(len)?;
    let (&base, &(size, _)) = shared.range(..end).next_back()?;
    let lo = base.max(addr);
    let hi = base.checked_add(size)?.min(end);
    (hi > lo && hi - lo >= min && (lo, hi) != (addr, end)).then(|| (lo - addr, hi - lo))
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
    const MAPS: &str = "\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000100000 rw-p 00000000 00:00 0 
7f0000100000-7f0000200000 rw-p 00000000 00:00 0                          [anon:arena]
7f0000200000-7f0000300000 rw-s 00000000 00:01 4242                       /memfd:vgpu-registered (deleted)
7f0000300000-7f0000400000 rw-p 00000000 fe:01 77                         /var/tmp/a file
7f0000400000-7f0000500000 r--p 00000000 00:00 0 
7f0000600000-7f0000700000 rw-p 00000000 00:00 0 
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn copies_partly_over_a_buffer_are_split_at_its_ends() {
        let m = BTreeMap::from([(0x10000, (0x20000, 7))]);
        let split = |a, l| overlap(&m, a, l, 0x1000);
        assert_eq!(
            split(0x0f000, 0x22000),
            Some((0x1000, 0x20000)),
            "both ends"
        );
        assert_eq!(
            split(0x0f000, 0x11000),
            Some((0x1000, 0x10000)),
            "the start"
        );
        assert_eq!(split(0x20000, 0x20000), Some((0, 0x10000)), "the end");
        assert_eq!(split(0x10000, 0x20000), None, "inside: no split");
        assert_eq!(split(0x2f800, 0x1000), None, "overlap below the minimum");
        assert_eq!(split(0x30000, 0x1000), None, "right past it");
        assert_eq!(split(0x40000, 0x1000), None, "far past it");
        assert_eq!(split(0x0, 0x10000), None, "before it");
        assert_eq!(split(usize::MAX, 2), None);
    }

    #[test]
    fn memory_figures_parse() {
        let meminfo = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(mem_available(meminfo), Some(2048 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(headroom("1073741824\n", "1000000000\n"), Some(73_741_824));
        assert_eq!(headroom("max\n", "5"), None, "v2: no limit");
        assert_eq!(headroom("9223372036854771712", "5"), None, "v1: no limit");
        assert_eq!(headroom("100", "200"), Some(0), "over the limit");
        assert!(!can_afford_copy(1 << 60), "more than any machine has");
    }

    #[test]
    fn the_memory_cgroup_is_found_for_v1_and_v2() {
        let v1 = "5:devices:/\n4:memory:/a/b\n0::/\n";
        let dirs: Vec<_> = memory_cgroup_dirs(v1).into_iter().map(|d| d.0).collect();
        let m = std::path::Path::new(CGROUP_ROOT).join("memory");
        assert_eq!(dirs, vec![m.join("a/b"), m.join("a"), m.clone()]);
        assert!(
            memory_cgroup_dirs(v1)
                .iter()
                .all(|d| d.1 == "memory.limit_in_bytes")
        );
        let v2 = memory_cgroup_dirs("0::/user.slice/x.scope\n");
        assert_eq!(v2.len(), 3, "{v2:?}");
        assert!(
            v2.iter()
                .all(|d| d.1 == "memory.max" && d.2 == "memory.current")
        );
        assert!(v2[0].0.ends_with("user.slice/x.scope"));
        assert!(memory_cgroup_dirs("").is_empty());
    }

    #[test]
    fn maps_lines_parse_with_their_paths() {
        let v: Vec<Vma<'_>> = MAPS.lines().filter_map(parse_vma).collect();
        assert_eq!(v.len(), 8);
        assert_eq!(v[3].path, "/memfd:vgpu-registered (deleted)");
        assert_eq!(v[3].inode, 4242);
        assert!(!v[3].private_rw && v[0].private_rw && !v[5].private_rw);
        assert_eq!(v[4].path, "/var/tmp/a file");
        assert_eq!(
            (v[1].start, v[1].end, v[1].path),
            (0x7f00_0000_0000, 0x7f00_0010_0000, "")
        );
        assert_eq!(parse_vma("garbage"), None);
    }

    #[test]
    fn only_private_anonymous_memory_is_adopted() {
        let ok = |a, b| is_private_anonymous(MAPS, a, b);
        assert!(ok(0x55d0_c0a0_1000, 0x55d0_c0a2_0000), "the heap");
        assert!(
            ok(0x7f00_0000_0000, 0x7f00_0020_0000),
            "anonymous, plain and named, adjacent"
        );
        assert!(
            !ok(0x7f00_0010_0000, 0x7f00_0030_0000),
            "into a shared memfd"
        );
        assert!(
            !ok(0x7f00_0030_0000, 0x7f00_0030_1000),
            "a private file mapping"
        );
        assert!(!ok(0x7f00_0040_0000, 0x7f00_0040_1000), "read-only");
        assert!(!ok(0x7f00_0050_0000, 0x7f00_0060_1000), "a gap");
        assert!(!ok(0x7ffc_0000_0000, 0x7ffc_0000_1000), "the stack");
        assert!(!ok(0x1000, 0x2000), "nothing mapped");
    }

    #[test]
    fn a_restore_needs_the_whole_range_still_from_its_memfd() {
        assert!(is_mapped_from(
            MAPS,
            0x7f00_0020_0000,
            0x7f00_0030_0000,
            4242
        ));
        assert!(!is_mapped_from(
            MAPS,
            0x7f00_0020_0000,
            0x7f00_0030_0000,
            4243
        ));
        assert!(!is_mapped_from(
            MAPS,
            0x7f00_001f_f000,
            0x7f00_0030_0000,
            4242
        ));
        assert!(!is_mapped_from(
            MAPS,
            0x7f00_0020_0000,
            0x7f00_0030_1000,
            4242
        ));
    }
}
