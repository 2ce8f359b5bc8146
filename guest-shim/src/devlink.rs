//! The virtio-vgpu device transport: `/dev/vgpuN` of the `vgpu` guest kernel module
//! (`guest-shim/kmod`). Each open file is one session; each protocol frame is one
//! `VGPU_IOC_CALL` ioctl whose bulk bytes stay in the caller's memory (the module pins those
//! pages and vgpud reads or writes them in place), or several small asynchronous frames go in
//! one `VGPU_CALL_BATCH`.
//!
//! The structures mirror `guest-shim/kmod/vgpu_uapi.h` (a test compiles the header and compares).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// `_IOC` direction bits.
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
/// `VGPU_IOC_MAGIC`.
const IOC_MAGIC: u64 = b'V' as u64;

const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (IOC_MAGIC << 8) | nr
}

/// `struct vgpu_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VgpuInfo {
    /// Version of the device interface.
    pub device_version: u32,
    /// vgpu protocol version of the device.
    pub protocol_version: u32,
    /// The VM's memory slice in bytes.
    pub slice_size: u64,
    /// Descriptors per request.
    pub max_segments: u32,
    /// Most bytes of header and fields per frame.
    pub max_inline: u32,
    /// Most bulk bytes per frame.
    pub max_data: u32,
    /// Bulk bytes of a reply (or of pinned request data) one call always fits.
    pub max_transfer: u32,
    /// The virtio device ID.
    pub device_id: u32,
    /// This file's session id.
    pub session: u32,
    /// N of `/dev/vgpuN`.
    pub index: u32,
    /// `VGPU_INFO_*`.
    pub flags: u32,
    /// The GPU's name, NUL-terminated.
    pub name: [u8; 64],
}

/// `struct vgpu_call`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct VgpuCall {
    /// Frame header and fields.
    pub req: u64,
    /// Bulk bytes.
    pub data: u64,
    /// Reply frame buffer.
    pub reply: u64,
    /// Reply bulk buffer.
    pub out: u64,
    /// Bytes at `req`.
    pub req_len: u32,
    /// Bytes at `reply`.
    pub reply_cap: u32,
    /// Bytes at `data`.
    pub data_len: u64,
    /// Bytes at `out`.
    pub out_len: u64,
    /// Zero.
    pub flags: u32,
    /// Out: reply frame bytes.
    pub reply_len: u32,
    /// Out: reply bulk bytes.
    pub out_done: u64,
    /// Out: with [`VGPU_CALL_NOWAIT`] and a synchronous frame, the ticket for [`VGPU_IOC_WAIT`].
    pub ticket: u64,
}

impl VgpuCall {
    /// A call describing these buffers (empty ones: none) with `flags`.
    fn new(frame: &[u8], data: &[u8], reply: &mut [u8], out: &mut [u8], flags: u32) -> Self {
        VgpuCall {
            req: frame.as_ptr() as u64,
            req_len: frame.len() as u32,
            data: data.as_ptr() as u64,
            data_len: data.len() as u64,
            reply: if reply.is_empty() {
                0
            } else {
                reply.as_mut_ptr() as u64
            },
            reply_cap: reply.len() as u32,
            out: if out.is_empty() {
                0
            } else {
                out.as_mut_ptr() as u64
            },
            out_len: out.len() as u64,
            flags,
            ..Default::default()
        }
    }
}

/// `struct vgpu_wait`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct VgpuWait {
    /// The ticket.
    pub ticket: u64,
    /// Out: reply frame bytes.
    pub reply_len: u32,
    /// Zero.
    pub reserved: u32,
    /// Out: reply bulk bytes.
    pub out_done: u64,
}

/// `VGPU_CALL_NOWAIT`: return once queued.
pub const VGPU_CALL_NOWAIT: u32 = 1;
/// `VGPU_CALL_BATCH`: `req` holds several asynchronous frames; one request.
pub const VGPU_CALL_BATCH: u32 = 2;
/// `VGPU_INFO_BATCH`: the device takes [`VGPU_CALL_BATCH`].
pub const VGPU_INFO_BATCH: u32 = 1;
/// `VIRTIO_VGPU_MAX_BATCH_FRAMES`: most frames in one batch.
pub const MAX_BATCH_FRAMES: usize = 512;

/// `VGPU_IOC_INFO`.
pub const VGPU_IOC_INFO: u64 = ioc(IOC_READ, 1, std::mem::size_of::<VgpuInfo>());
/// `VGPU_IOC_CALL`.
pub const VGPU_IOC_CALL: u64 = ioc(IOC_READ | IOC_WRITE, 2, std::mem::size_of::<VgpuCall>());
/// `VGPU_IOC_WAIT`.
pub const VGPU_IOC_WAIT: u64 = ioc(IOC_READ | IOC_WRITE, 3, std::mem::size_of::<VgpuWait>());

/// The device node the shim uses when `VGPU_TRANSPORT` is not set and it exists.
pub const DEFAULT_DEVICE: &str = "/dev/vgpu0";

/// An open session on a virtio-vgpu device.
#[derive(Debug)]
pub struct DevLink {
    file: File,
    path: PathBuf,
    info: VgpuInfo,
}

impl DevLink {
    /// Opens `path` (a session starts) and reads the device's limits.
    pub fn open(path: &Path) -> io::Result<DevLink> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let mut link = DevLink {
            file,
            path: path.to_path_buf(),
            // SAFETY: VgpuInfo is plain old data; all zeroes is a valid value.
            info: unsafe { std::mem::zeroed() },
        };
        link.info = link.query()?;
        Ok(link)
    }

    /// Reads the device's limits and config space now (the slice size is live).
    pub fn query(&self) -> io::Result<VgpuInfo> {
        // SAFETY: VgpuInfo is plain old data; all zeroes is a valid value.
        let mut info: VgpuInfo = unsafe { std::mem::zeroed() };
        // SAFETY: VGPU_IOC_INFO writes exactly one `struct vgpu_info` to the pointer, which
        // points at a live VgpuInfo of that layout.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), VGPU_IOC_INFO as _, &mut info) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(info)
    }

    /// The limits read at open.
    pub fn info(&self) -> &VgpuInfo {
        &self.info
    }

    /// The device node.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GPU's name from the config space.
    pub fn gpu_name(&self) -> String {
        let n = &self.info.name;
        let end = n.iter().position(|&b| b == 0).unwrap_or(n.len());
        String::from_utf8_lossy(&n[..end]).into_owned()
    }

    /// Bulk bytes per call that always fit one request.
    pub fn max_transfer(&self) -> usize {
        self.info.max_transfer as usize
    }

    fn ioctl_call(&self, c: &mut VgpuCall) -> io::Result<()> {
        // SAFETY: `c` describes buffers (req, data, reply, out) that the caller keeps alive and
        // unaliased for the duration of this call; the module reads and writes only within
        // their stated lengths and writes back `reply_len` and `out_done` into `c`.
        let r = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                VGPU_IOC_CALL as _,
                c as *mut VgpuCall,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends an asynchronous frame (`frame`: header and fields; `data`: bulk bytes). Returns once
    /// the module holds the bytes (small ones are copied; large ones are read by the device before
    /// this returns).
    pub fn post(&self, frame: &[u8], data: &[u8]) -> io::Result<()> {
        self.ioctl_call(&mut VgpuCall::new(frame, data, &mut [], &mut [], 0))
    }

    /// Whether the device takes batches of asynchronous frames ([`DevLink::post_batch`]).
    pub fn batches(&self) -> bool {
        self.info.flags & VGPU_INFO_BATCH != 0
    }

    /// Sends several asynchronous frames (each header, fields and bulk bytes, back to back; at
    /// most [`MAX_BATCH_FRAMES`] and `max_inline` bytes) as one request. Returns once queued.
    pub fn post_batch(&self, frames: &[u8]) -> io::Result<()> {
        self.ioctl_call(&mut VgpuCall::new(
            frames,
            &[],
            &mut [],
            &mut [],
            VGPU_CALL_BATCH,
        ))
    }

    /// Queues an asynchronous frame and returns at once: the device reads `data` later, before
    /// any later synchronous frame of this session completes. The caller keeps `data` unchanged
    /// until then.
    pub fn post_deferred(&self, frame: &[u8], data: &[u8]) -> io::Result<()> {
        self.ioctl_call(&mut VgpuCall::new(
            frame,
            data,
            &mut [],
            &mut [],
            VGPU_CALL_NOWAIT,
        ))
    }

    /// Queues a synchronous frame and returns its ticket; [`DevLink::wait`] returns the outcome.
    ///
    /// # Safety
    ///
    /// The device writes `reply` and `out` until the ticket is waited for: the caller must not
    /// use, move or free them before [`DevLink::wait`] returned for this ticket (or the file is
    /// closed).
    pub unsafe fn submit(
        &self,
        frame: &[u8],
        data: &[u8],
        reply: &mut [u8],
        out: &mut [u8],
    ) -> io::Result<u64> {
        let mut c = VgpuCall::new(frame, data, reply, out, VGPU_CALL_NOWAIT);
        self.ioctl_call(&mut c)?;
        Ok(c.ticket)
    }

    /// Waits for a ticket of [`DevLink::submit`]: the reply frame's length and the bulk bytes
    /// written, or the call's error.
    pub fn wait(&self, ticket: u64) -> io::Result<(usize, usize)> {
        let mut w = VgpuWait {
            ticket,
            ..Default::default()
        };
        // SAFETY: VGPU_IOC_WAIT reads and writes exactly one `struct vgpu_wait` at the pointer,
        // which points at a live VgpuWait of that layout.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), VGPU_IOC_WAIT as _, &mut w) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((w.reply_len as usize, w.out_done as usize))
    }

    /// Sends a synchronous frame and waits: the reply frame lands in `reply`, the reply's bulk
    /// bytes in `out`. Returns the reply frame's length and the bulk bytes written.
    pub fn call(
        &self,
        frame: &[u8],
        data: &[u8],
        reply: &mut [u8],
        out: &mut [u8],
    ) -> io::Result<(usize, usize)> {
        let mut c = VgpuCall::new(frame, data, reply, out, 0);
        match self.ioctl_call(&mut c) {
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => {
                Err(io::Error::other(ReplyTooLarge {
                    needed: c.reply_len as usize,
                    cap: reply.len(),
                }))
            }
            Err(e) => Err(e),
            Ok(()) => Ok((c.reply_len as usize, c.out_done as usize)),
        }
    }
}

/// A synchronous call ran but its reply frame did not fit the reply buffer (`EMSGSIZE`): what
/// [`DevLink::call`] fails with (inside an `io::Error`; see [`ReplyTooLarge::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyTooLarge {
    /// Bytes of the reply frame.
    pub needed: usize,
    /// Bytes of the buffer it did not fit.
    pub cap: usize,
}

impl ReplyTooLarge {
    /// The reply-too-large error inside `e`, if it is one.
    pub fn of(e: &io::Error) -> Option<ReplyTooLarge> {
        e.get_ref()?.downcast_ref::<ReplyTooLarge>().copied()
    }
}

impl std::fmt::Display for ReplyTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the reply is {} bytes, larger than the {}-byte reply buffer (the call ran)",
            self.needed, self.cap
        )
    }
}

impl std::error::Error for ReplyTooLarge {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// The ioctl numbers and structure sizes agree with `vgpu_uapi.h`, compiled by the host C
    /// compiler (skipped with a message when there is none).
    #[test]
    fn the_uapi_matches_the_c_header() {
        let dir = tempfile_dir();
        let src = dir.join("uapi.c");
        let header = Path::new(env!("CARGO_MANIFEST_DIR")).join("kmod/vgpu_uapi.h");
        std::fs::write(
            &src,
            format!(
                "#include <stdio.h>\n#include <stddef.h>\n#include \"{}\"\n#include \"{}\"\nint main(void) {{ printf(\"%zu %zu %lu %lu %zu %zu %lu %zu %d %d %d %d\\n\", sizeof(struct vgpu_info), sizeof(struct vgpu_call), (unsigned long)VGPU_IOC_INFO, (unsigned long)VGPU_IOC_CALL, offsetof(struct vgpu_call, reply_len), offsetof(struct vgpu_info, name), (unsigned long)VGPU_IOC_WAIT, sizeof(struct vgpu_wait), VGPU_CALL_NOWAIT, VGPU_CALL_BATCH, VGPU_INFO_BATCH, VIRTIO_VGPU_MAX_BATCH_FRAMES); return 0; }}\n",
                header.display(),
                header.with_file_name("vgpu_virtio.h").display()
            ),
        )
        .unwrap();
        let exe = dir.join("uapi");
        let built = Command::new("cc").arg("-o").arg(&exe).arg(&src).status();
        if !built.is_ok_and(|s| s.success()) {
            println!("SKIPPED: no C compiler to check vgpu_uapi.h against");
            return;
        }
        let out = Command::new(&exe).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let want = format!(
            "{} {} {} {} {} {} {} {} {} {} {} {}",
            std::mem::size_of::<VgpuInfo>(),
            std::mem::size_of::<VgpuCall>(),
            VGPU_IOC_INFO,
            VGPU_IOC_CALL,
            std::mem::offset_of!(VgpuCall, reply_len),
            std::mem::offset_of!(VgpuInfo, name),
            VGPU_IOC_WAIT,
            std::mem::size_of::<VgpuWait>(),
            VGPU_CALL_NOWAIT,
            VGPU_CALL_BATCH,
            VGPU_INFO_BATCH,
            MAX_BATCH_FRAMES,
        );
        assert_eq!(text.trim(), want);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("vgpu-uapi-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn opening_a_missing_device_is_an_error() {
        assert!(DevLink::open(Path::new("/nonexistent/vgpu0")).is_err());
        // A file that is not the device: the INFO ioctl fails.
        assert!(DevLink::open(Path::new("/dev/null")).is_err());
    }
}
