//! How the shim reaches vgpud: `VGPU_TRANSPORT=unix:/path`, `vsock:CID:PORT`
//! or `dev:/dev/vgpuN`; without it, inside a VM, the virtio-vgpu device
//! `/dev/vgpu0` when the `vgpu` module created it, else vsock to the host
//! (CID 2) at the GPU port.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use vgpu_proto::spin::{Expectation, SpinRead};
use vgpu_proto::{GPU_VSOCK_PORT, HOST_CID};

use crate::devlink::{DEFAULT_DEVICE, DevLink};

/// Where vgpud is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix socket.
    Unix(PathBuf),
    /// A vsock address.
    Vsock {
        /// Context id (2 = host).
        cid: u32,
        /// Port.
        port: u32,
    },
    /// A virtio-vgpu device node (`/dev/vgpuN`).
    Device(PathBuf),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Vsock { cid, port } => write!(f, "vsock:{cid}:{port}"),
            Endpoint::Device(p) => write!(f, "dev:{}", p.display()),
        }
    }
}

/// Parses a `VGPU_TRANSPORT` value.
pub fn parse_endpoint(s: &str) -> Result<Endpoint, String> {
    if let Some(p) = s.strip_prefix("unix:") {
        if p.is_empty() {
            return Err("VGPU_TRANSPORT=unix: needs a socket path".into());
        }
        return Ok(Endpoint::Unix(PathBuf::from(p)));
    }
    if let Some(rest) = s.strip_prefix("vsock:") {
        let (cid, port) = rest.split_once(':').ok_or_else(|| {
            format!("VGPU_TRANSPORT={s}: write vsock:CID:PORT, e.g. vsock:2:{GPU_VSOCK_PORT}")
        })?;
        let cid = cid
            .parse()
            .map_err(|_| format!("VGPU_TRANSPORT={s}: CID `{cid}` is not a number"))?;
        let port = port
            .parse()
            .map_err(|_| format!("VGPU_TRANSPORT={s}: port `{port}` is not a number"))?;
        return Ok(Endpoint::Vsock { cid, port });
    }
    if let Some(p) = s.strip_prefix("dev:") {
        if p.is_empty() {
            return Err(format!(
                "VGPU_TRANSPORT=dev: needs a device node, e.g. dev:{DEFAULT_DEVICE}"
            ));
        }
        return Ok(Endpoint::Device(PathBuf::from(p)));
    }
    Err(format!(
        "VGPU_TRANSPORT={s} is not understood: use unix:/path/to.sock, vsock:CID:PORT or dev:/dev/vgpuN"
    ))
}

/// The endpoint from the environment, or the default: the virtio-vgpu device when
/// [`DEFAULT_DEVICE`] exists, else vsock to the host at the GPU port.
pub fn endpoint_from_env() -> Result<Endpoint, String> {
    match std::env::var("VGPU_TRANSPORT") {
        Ok(s) if !s.is_empty() => parse_endpoint(&s),
        _ => Ok(default_endpoint(Path::new(DEFAULT_DEVICE))),
    }
}

/// `device` if that node exists, else vsock to the host at the GPU port.
pub fn default_endpoint(device: &Path) -> Endpoint {
    if device.exists() {
        Endpoint::Device(device.to_path_buf())
    } else {
        Endpoint::Vsock {
            cid: HOST_CID,
            port: GPU_VSOCK_PORT,
        }
    }
}

/// A connected byte stream.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// The receive buffer the shim asks its guest kernel for on a vsock connection (Linux's default,
/// 256 KiB, is what the guest advertises to vgpud as `buf_alloc`: replies of device-to-host copies
/// would stall for a credit update every 256 KiB, each a round of thread wake-ups).
pub const VSOCK_RECEIVE_BUFFER: u64 = 4 << 20;

/// Linux's `SO_VM_SOCKETS_BUFFER_SIZE` and `SO_VM_SOCKETS_BUFFER_MAX_SIZE` (`linux/vm_sockets.h`),
/// options of level `AF_VSOCK` taking a `u64`.
const SO_VM_SOCKETS_BUFFER_SIZE: libc::c_int = 0;
const SO_VM_SOCKETS_BUFFER_MAX_SIZE: libc::c_int = 2;

/// Raises the connection's receive buffer to [`VSOCK_RECEIVE_BUFFER`] before it connects (the
/// guest advertises it in its first packet). A kernel that refuses keeps its default, with a
/// warning: the connection works, only device-to-host copies are slower.
fn grow_vsock_buffer(fd: &OwnedFd) {
    for opt in [SO_VM_SOCKETS_BUFFER_MAX_SIZE, SO_VM_SOCKETS_BUFFER_SIZE] {
        let size = VSOCK_RECEIVE_BUFFER;
        // SAFETY: `fd` is an open AF_VSOCK socket; the option value is a u64 of the given length.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::AF_VSOCK,
                opt,
                std::ptr::from_ref(&size).cast(),
                std::mem::size_of::<u64>() as libc::socklen_t,
            )
        };
        if r < 0 {
            crate::warn!(
                "vsock receive buffer left at the kernel's default (device-to-host copies are slower): {}",
                io::Error::last_os_error()
            );
            return;
        }
    }
}

fn connect_vsock(cid: u32, port: u32) -> io::Result<File> {
    // SAFETY: plain socket(2) call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    grow_vsock_buffer(&owned);
    // SAFETY: sockaddr_vm is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_cid = cid;
    addr.svm_port = port;
    // SAFETY: `addr` is a valid sockaddr_vm and the length matches it.
    let r = unsafe {
        libc::connect(
            fd,
            std::ptr::from_ref(&addr).cast(),
            std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(File::from(owned))
}

/// A connection to vgpud: a byte stream, or a session on the virtio-vgpu device.
#[derive(Debug)]
pub enum Link {
    /// A unix or vsock stream carrying frames.
    Stream(StreamLink),
    /// `/dev/vgpuN`: one frame per ioctl, bulk bytes in place.
    Device(DevLink),
}

/// A connected stream and what comes with it.
pub struct StreamLink {
    /// The stream.
    pub stream: Box<dyn Stream>,
    /// For a unix socket, a second handle on it through which descriptors travel
    /// (`SCM_RIGHTS`: pinned host memory shared with vgpud).
    pub fds: Option<UnixStream>,
    /// How to tell the stream's reads how long the next reply should take, when they poll.
    pub expect: Option<Expectation>,
}

impl std::fmt::Debug for StreamLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamLink")
    }
}

/// Connects to a stream endpoint (unix or vsock); a device endpoint is opened with [`open`].
pub fn connect(ep: &Endpoint) -> io::Result<Box<dyn Stream>> {
    connect_link(ep).map(|l| l.stream)
}

/// Connects to a stream endpoint. Replies are polled for briefly before the thread blocks
/// (see `vgpu_proto::spin`).
fn connect_link(ep: &Endpoint) -> io::Result<StreamLink> {
    fn link(
        s: SpinRead<impl Read + Write + AsFd + Send + 'static>,
        fds: Option<UnixStream>,
    ) -> StreamLink {
        StreamLink {
            expect: Some(s.expectation()),
            stream: Box::new(s),
            fds,
        }
    }
    match ep {
        Endpoint::Unix(p) => {
            let sock = UnixStream::connect(p)?;
            let fds = sock.try_clone()?;
            Ok(link(SpinRead::new(sock), Some(fds)))
        }
        Endpoint::Vsock { cid, port } => Ok(link(SpinRead::new(connect_vsock(*cid, *port)?), None)),
        Endpoint::Device(p) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is a device, not a stream", p.display()),
        )),
    }
}

/// Connects to any endpoint.
pub fn open(ep: &Endpoint) -> io::Result<Link> {
    match ep {
        Endpoint::Device(p) => Ok(Link::Device(DevLink::open(p)?)),
        other => connect_link(other).map(Link::Stream),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            parse_endpoint("unix:/run/a.sock"),
            Ok(Endpoint::Unix("/run/a.sock".into()))
        );
        assert_eq!(
            parse_endpoint("vsock:2:22087"),
            Ok(Endpoint::Vsock {
                cid: 2,
                port: 22087
            })
        );
        assert_eq!(
            parse_endpoint("dev:/dev/vgpu1"),
            Ok(Endpoint::Device("/dev/vgpu1".into()))
        );
        assert_eq!(
            Endpoint::Device("/dev/vgpu0".into()).to_string(),
            "dev:/dev/vgpu0"
        );
        for bad in [
            "dev:",
            "unix:",
            "vsock:2",
            "vsock:x:1",
            "vsock:2:y",
            "tcp:1.2.3.4:5",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_device_is_preferred_when_present() {
        assert_eq!(
            default_endpoint(Path::new("/dev/null")),
            Endpoint::Device("/dev/null".into())
        );
        assert_eq!(
            default_endpoint(Path::new("/nonexistent/vgpu0")),
            Endpoint::Vsock {
                cid: HOST_CID,
                port: GPU_VSOCK_PORT
            }
        );
        assert!(open(&Endpoint::Device("/nonexistent/vgpu0".into())).is_err());
        assert!(connect(&Endpoint::Device("/dev/null".into())).is_err());
    }

    #[test]
    fn vsock_connect_failure_is_an_error_not_a_crash() {
        // No vsock host here (or nobody listening on this port).
        assert!(connect(&Endpoint::Vsock { cid: 2, port: 1 }).is_err());
    }
}
