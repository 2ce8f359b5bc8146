//! Descriptors passed over a unix socket (`SCM_RIGHTS`): how the shim hands vgpud the memfd of a
//! page-locked buffer ([`crate::msg::HostShare`]), and how vgpud's session reader receives them.
//!
//! A descriptor travels attached to the first byte of the frame that uses it: the sender writes
//! the whole frame with one `sendmsg` carrying the descriptor; the receiver reads with `recvmsg`
//! and hands every descriptor that arrives to an [`FdSink`], in order, before the bytes it came
//! with are parsed. So when the server decodes a `HostShare` its descriptor is already queued.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Most descriptors one `recvmsg` takes; more in one message are closed by the kernel and
/// reported to the sink as an overflow.
pub const MAX_FDS_PER_RECV: usize = 4;

/// Where received descriptors go.
pub trait FdSink: Send + Sync {
    /// A descriptor arrived (its ownership passes to the sink, which closes what it rejects).
    fn accept(&self, fd: OwnedFd);
    /// Descriptors arrived that did not fit the control buffer (the kernel closed them).
    fn overflow(&self);
}

/// `CMSG_SPACE` for `n` descriptors.
fn cmsg_space(n: usize) -> usize {
    // SAFETY: CMSG_SPACE is pure arithmetic on its argument.
    unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<RawFd>()) as u32) as usize }
}

/// One `recvmsg` on `sock` into `buf` (`flags` such as `MSG_DONTWAIT`); descriptors that come
/// with the bytes go to `sink` (close-on-exec). Returns the bytes read, like `recv`.
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: libc::c_int,
    sink: &dyn FdSink,
) -> io::Result<usize> {
    // u64 elements keep the control buffer aligned for `cmsghdr`.
    let mut control = [0u64; 16];
    debug_assert!(cmsg_space(MAX_FDS_PER_RECV) <= std::mem::size_of_val(&control));
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control.as_mut_ptr().cast();
    mh.msg_controllen = cmsg_space(MAX_FDS_PER_RECV) as _;
    let n = loop {
        // SAFETY: `mh` points at `iov` (valid for `buf.len()` bytes) and at `control` (valid for
        // `msg_controllen` bytes), both alive for the call; `sock` is an open descriptor.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut mh, flags | libc::MSG_CMSG_CLOEXEC) };
        if let Ok(n) = usize::try_from(n) {
            break n;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    if mh.msg_flags & libc::MSG_CTRUNC != 0 {
        sink.overflow();
    }
    // SAFETY: `mh` describes the control buffer the kernel filled (`msg_controllen` bytes).
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&mh) };
    while !c.is_null() {
        // SAFETY: `c` points at a whole `cmsghdr` inside the control buffer (CMSG_FIRSTHDR and
        // CMSG_NXTHDR return null otherwise).
        let hdr = unsafe { c.read_unaligned() };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: the data of the header `c` points at, inside the control buffer.
            let data = unsafe { libc::CMSG_DATA(c) }.cast::<RawFd>();
            let bytes = (hdr.cmsg_len as usize).saturating_sub(data as usize - c as usize);
            for i in 0..bytes / std::mem::size_of::<RawFd>() {
                // SAFETY: the `i`-th descriptor of this SCM_RIGHTS payload, within `cmsg_len`.
                let fd = unsafe { data.wrapping_add(i).read_unaligned() };
                // SAFETY: the kernel installed `fd` in this process for us; nobody else owns it.
                sink.accept(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
        // SAFETY: `c` is a header of `mh`'s control buffer; the next one or null.
        c = unsafe { libc::CMSG_NXTHDR(&mh, c) };
    }
    Ok(n)
}

/// Writes all of `bytes` to `sock`, the first piece with `fd` attached (`SCM_RIGHTS`).
pub fn send_with_fd(sock: BorrowedFd<'_>, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut control = [0u64; 4];
    let mut sent = 0;
    let mut attach = true;
    while sent < bytes.len() || attach {
        let rest = &bytes[sent..];
        let mut iov = libc::iovec {
            iov_base: rest.as_ptr().cast_mut().cast(),
            iov_len: rest.len(),
        };
        // SAFETY: msghdr is plain data; all-zero is a valid value.
        let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
        mh.msg_iov = &mut iov;
        mh.msg_iovlen = 1;
        if attach {
            mh.msg_control = control.as_mut_ptr().cast();
            mh.msg_controllen = cmsg_space(1) as _;
            // SAFETY: the control buffer set just above holds CMSG_SPACE(one descriptor) bytes.
            let c = unsafe { libc::CMSG_FIRSTHDR(&mh) };
            // SAFETY: cmsghdr is plain data; all-zero is a valid value.
            let mut hdr: libc::cmsghdr = unsafe { std::mem::zeroed() };
            hdr.cmsg_level = libc::SOL_SOCKET;
            hdr.cmsg_type = libc::SCM_RIGHTS;
            // SAFETY: pure arithmetic on its argument.
            hdr.cmsg_len = unsafe { libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) } as _;
            // SAFETY: `c` points at the start of the control buffer, which has room for a header.
            unsafe { c.write_unaligned(hdr) };
            // SAFETY: the data of that header, inside the control buffer.
            let data = unsafe { libc::CMSG_DATA(c) }.cast::<RawFd>();
            // SAFETY: CMSG_SPACE(one descriptor) leaves room for one descriptor at `data`.
            unsafe { data.write_unaligned(fd.as_raw_fd()) };
        }
        // SAFETY: `mh` points at `iov` (valid for reads of `rest.len()` bytes) and, when
        // attaching, at `control`; both outlive the call.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &mh, libc::MSG_NOSIGNAL) };
        match usize::try_from(n) {
            Ok(n) => {
                sent += n;
                attach = false;
            }
            Err(_) => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    struct Got(Mutex<Vec<OwnedFd>>, Mutex<u32>);
    impl FdSink for Got {
        fn accept(&self, fd: OwnedFd) {
            self.0.lock().unwrap().push(fd);
        }
        fn overflow(&self) {
            *self.1.lock().unwrap() += 1;
        }
    }

    #[test]
    fn a_descriptor_arrives_with_the_bytes_it_was_sent_with() {
        let (a, b) = UnixStream::pair().unwrap();
        let (p, _q) = UnixStream::pair().unwrap();
        (&a).write_all(b"before").unwrap();
        send_with_fd(a.as_fd(), b"frame", p.as_fd()).unwrap();
        let got = Got::default();
        let mut buf = [0u8; 64];
        let mut have = 0;
        while have < 11 {
            let n = recv_with_fds(b.as_fd(), &mut buf[have..], 0, &got).unwrap();
            if have + n <= 6 {
                // Bytes sent before the descriptor never bring it.
                assert!(got.0.lock().unwrap().is_empty());
            }
            have += n;
        }
        assert_eq!(&buf[..have], b"beforeframe");
        assert_eq!(got.0.lock().unwrap().len(), 1);
        assert_eq!(*got.1.lock().unwrap(), 0);
    }
}
