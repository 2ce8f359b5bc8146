//! The shim's side of the doorbell page ([`vgpu_proto::doorbell`]): on a unix socket, a
//! synchronous copy between a pinned buffer and device memory is written into a page shared with
//! vgpud and completed there, without a frame either way (about 4 µs of system calls and socket
//! wake-ups less per copy, a fifth of a 1 MiB copy).
//!
//! The page is a pinned buffer of its own ([`SharedBuffer`]), opened at the session's first
//! shared-memory copy. `VGPU_DOORBELL=off` keeps every copy in frames.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::time::Duration;

use vgpu_proto::doorbell::{PAGE_BYTES, Page};
use vgpu_proto::msg;

use crate::client::Client;
use crate::pinned::SharedBuffer;

/// How long a client sleeping on the page sleeps before it looks whether vgpud is still there.
pub const LIVENESS_CHECK: Duration = Duration::from_millis(10);

/// A session's doorbell.
#[derive(Debug, Default)]
pub enum BellState {
    /// Not opened yet.
    #[default]
    Untried,
    /// Open: the page, and the buffer that maps it.
    Open(Box<(SharedBuffer, Page)>),
    /// Not available: the transport passes no descriptors, vgpud refused, or `VGPU_DOORBELL=off`.
    Unavailable,
}

impl BellState {
    /// Opens the session's doorbell: shares a page with vgpud and names it (`Doorbell`).
    pub fn open(client: &mut Client) -> BellState {
        if !client.passes_fds() || !enabled() {
            return BellState::Unavailable;
        }
        let buf = match SharedBuffer::create(client, PAGE_BYTES) {
            Ok(b) => b,
            Err(e) => {
                crate::debug!("no doorbell page (pinned copies go in frames): {e}");
                return BellState::Unavailable;
            }
        };
        if let Err(e) = client.call(
            &msg::Doorbell {
                region: buf.region(),
            },
            &[],
        ) {
            crate::debug!("vgpud refused the doorbell page (pinned copies go in frames): {e:?}");
            let _ = client.call(
                &msg::HostUnshare {
                    region: buf.region(),
                },
                &[],
            );
            return BellState::Unavailable;
        }
        let Some(base) = NonNull::new(buf.addr() as *mut u8) else {
            return BellState::Unavailable;
        };
        // SAFETY: the buffer maps at least PAGE_BYTES bytes (its memfd was made that large),
        // page-aligned and writable, for as long as the buffer lives, which this state keeps
        // together with the page.
        let page = unsafe { Page::new(base) };
        crate::debug!("doorbell page open (region {:#x})", buf.region());
        BellState::Open(Box::new((buf, page)))
    }

    /// Whether no attempt was made yet.
    pub fn untried(&self) -> bool {
        matches!(self, BellState::Untried)
    }

    /// The page, when open.
    pub fn page(&self) -> Option<Page> {
        match self {
            BellState::Open(b) => Some(b.1),
            _ => None,
        }
    }
}

/// `VGPU_DOORBELL=off` (or `0`) turns the doorbell off.
fn enabled() -> bool {
    !matches!(
        std::env::var("VGPU_DOORBELL").as_deref(),
        Ok("off") | Ok("0") | Ok("no")
    )
}

/// Whether the peer of `sock` closed its side (looked at without consuming a byte).
pub fn peer_gone(sock: &UnixStream) -> bool {
    let mut fds = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut fds, 1, 0) };
    if n <= 0 {
        return false;
    }
    if fds.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        return true;
    }
    // Readable: vgpud sends nothing during a rung copy, so this is the end of the stream.
    let mut b = 0u8;
    // SAFETY: one byte of our own, peeked without waiting.
    let r = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            (&raw mut b).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    r == 0
}
