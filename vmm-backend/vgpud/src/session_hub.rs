//! Session threads: every connection handed to the broker (unix socket or
//! the GPU port of a vsock device) runs here, so that vgpud can
//!
//! - end all sessions of a VM cleanly when the VM is removed (their sockets
//!   are shut down, the session loop reads end of file, the session releases
//!   its memory and handles), and wait until they have;
//! - record every session in the audit log: opened (with the guest's pid and
//!   process name), closed, refused at the handshake, or ended by an error.
//!
//! The session's identity is learned from the handshake reply the broker
//! writes (`HelloReply` carries the session id), so the broker needs no hook.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::{self, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use tracing::{debug, error, warn};
use vgpu_broker::Broker;
use vgpu_broker::session_loop::ServeError;
use vgpu_broker::tenant::Tenant;
use vgpu_proto::frame::{FrameError, HEADER_LEN, Header};
use vgpu_proto::msg;
use vgpu_seccomp::ThreadKind;
use vgpu_vhost_vsock::inproc::{SessionEnd, SessionShutdown};

use crate::audit::{AuditLog, guest_text};

/// How often [`SessionHub::wait_ended`] looks.
const POLL: Duration = Duration::from_millis(10);
/// How long a new connection may take to send its `Hello`; a connection that
/// sends nothing is closed then.
pub const GREETING_DEADLINE: Duration = Duration::from_secs(5);

/// Why a session was ended from the host side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// Its VM was removed (API, reload or shutdown).
    VmRemoved,
    /// vgpud is shutting down.
    Shutdown,
}

impl EndReason {
    fn as_str(self) -> &'static str {
        match self {
            EndReason::VmRemoved => "VM removed",
            EndReason::Shutdown => "vgpud stopped",
        }
    }
}

/// How a session thread reads its socket.
#[derive(Debug, Clone, Copy)]
struct Reading {
    /// Longest poll before a read blocks.
    spin: Duration,
    /// Whether descriptors are received (direct unix-socket clients only).
    fds: bool,
}

/// What a session reads its frames from.
enum Link {
    /// A unix socket (a guest process connected to the VM's socket directly).
    Unix(UnixStream, Reading),
    /// The session end of a vsock device's in-process connection (the GPU port), shared with
    /// the device thread's answerer.
    InProcess(Arc<SessionEnd>),
}

impl Link {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Link::Unix(s, _) => s.set_read_timeout(t),
            Link::InProcess(s) => {
                s.set_read_timeout(t);
                Ok(())
            }
        }
    }

    /// How the hub ends the session from outside.
    fn stopper(&self) -> io::Result<Stopper> {
        match self {
            Link::Unix(s, _) => s.try_clone().map(Stopper::Unix),
            Link::InProcess(s) => Ok(Stopper::InProcess(s.shutdown_handle())),
        }
    }
}

/// Shuts a session's link down from another thread.
enum Stopper {
    Unix(UnixStream),
    InProcess(SessionShutdown),
}

impl Stopper {
    fn shutdown(&self) {
        match self {
            Stopper::Unix(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
            Stopper::InProcess(s) => s.shutdown(),
        }
    }
}

struct Conn {
    vm: String,
    stream: Stopper,
    ended: Option<EndReason>,
}

/// The live connections of all VMs.
#[derive(Default)]
pub struct SessionHub {
    audit: Option<Arc<AuditLog>>,
    live: Mutex<HashMap<u64, Conn>>,
    next: AtomicU64,
    /// Connections closed because their VM held its `limits.connections`.
    refused: AtomicU64,
}

impl std::fmt::Debug for SessionHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHub")
            .field("connections", &self.lock().len())
            .finish()
    }
}

impl SessionHub {
    /// A hub recording sessions in `audit` (if any).
    pub fn new(audit: Option<Arc<AuditLog>>) -> Self {
        Self {
            audit,
            live: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            refused: AtomicU64::new(0),
        }
    }

    /// Connections refused so far because their VM held its `limits.connections`.
    pub fn refused_connections(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Conn>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs a session of `tenant` over `stream` on its own thread, which polls for up to
    /// `read_spin` for each request before it blocks (`vgpu_proto::spin`). With `accept_fds`
    /// (a guest process connected to the socket directly; vsock sessions use
    /// [`SessionHub::spawn_in_process`]) the session receives descriptors and may map the host memory the
    /// client shares (`HostShare`).
    pub fn spawn(
        self: &Arc<Self>,
        broker: Arc<Broker>,
        tenant: Arc<Tenant>,
        stream: UnixStream,
        transport: String,
        read_spin: Duration,
        accept_fds: bool,
    ) {
        let reading = Reading {
            spin: read_spin,
            fds: accept_fds,
        };
        self.spawn_link(broker, tenant, Link::Unix(stream, reading), transport);
    }

    /// Runs a session of `tenant` over the session end of a vsock device's in-process
    /// connection, on its own thread (no descriptors come this way).
    pub fn spawn_in_process(
        self: &Arc<Self>,
        broker: Arc<Broker>,
        tenant: Arc<Tenant>,
        end: SessionEnd,
        transport: String,
    ) {
        self.spawn_link(broker, tenant, Link::InProcess(Arc::new(end)), transport);
    }

    fn spawn_link(
        self: &Arc<Self>,
        broker: Arc<Broker>,
        tenant: Arc<Tenant>,
        link: Link,
        transport: String,
    ) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        match link.stopper() {
            Ok(s) => {
                let mut live = self.lock();
                // Past it a new connection is closed at once, so a guest flooding
                // its socket costs vgpud no thread and no other VM anything.
                let allowed = tenant.limits.limits().connections as usize;
                let held = live.values().filter(|c| c.vm == tenant.name).count();
                if held >= allowed {
                    drop(live);
                    tenant
                        .limits
                        .note_refused(vgpu_config::limits::Budget::Connections);
                    let refused = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
                    // Logged at 1, 2, 4, 8, … refusals: a flood cannot flood the log.
                    if refused.is_power_of_two() {
                        warn!(
                            vm = %tenant.name,
                            refused,
                            allowed,
                            "connection limit (limits.connections) reached; new connections are closed"
                        );
                    }
                    return;
                }
                live.insert(
                    id,
                    Conn {
                        vm: tenant.name.clone(),
                        stream: s,
                        ended: None,
                    },
                );
            }
            Err(e) => {
                error!(vm = %tenant.name, error = %e, "cannot track a session; connection dropped");
                return;
            }
        }
        let hub = Arc::clone(self);
        let name = format!("vgpu-session-{}", tenant.name);
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            // The guest's frames are parsed only under the session allowlist.
            if let Err(e) = vgpu_seccomp::enter(ThreadKind::Session) {
                error!(vm = %tenant.name, error = %e, "session not started");
                hub.lock().remove(&id);
                return;
            }
            hub.run(&broker, tenant, &link, &transport, id);
        });
        if let Err(e) = spawned {
            self.lock().remove(&id);
            error!(error = %e, "cannot start a session thread; connection dropped");
        }
    }

    fn run(&self, broker: &Broker, tenant: Arc<Tenant>, link: &Link, transport: &str, conn: u64) {
        let vm = tenant.name.clone();
        let session = Cell::new(0u64);
        let opened = RefCell::new(None::<(u32, String, Instant)>);
        // The greeting deadline holds until the first reply (to the Hello).
        if let Err(e) = link.set_read_timeout(Some(GREETING_DEADLINE)) {
            error!(vm = %vm, error = %e, "cannot set the greeting deadline; connection dropped");
            self.lock().remove(&conn);
            return;
        }
        let on_first_frame = |h: Header, payload: &[u8]| {
            if let Err(e) = link.set_read_timeout(None) {
                // The session then ends at its first quiet moment; the client reconnects.
                error!(vm = %vm, error = %e, "cannot lift the greeting deadline");
            }
            if h.status != 0 {
                return; // a refusal: reported below from serve's result
            }
            let Ok((reply, _)) = msg::decode_exact::<msg::HelloReply>(payload, false) else {
                return;
            };
            session.set(reply.session_id);
            let info = tenant
                .sessions()
                .into_iter()
                .find(|s| s.id == reply.session_id);
            let (pid, process) =
                info.map_or((0, String::new()), |s| (s.pid, s.process_name.clone()));
            self.audit(
                &vm,
                "session.open",
                json!({
                    "vm": vm, "session": reply.session_id, "pid": pid,
                    "process": guest_text(&process), "transport": transport,
                }),
            );
            *opened.borrow_mut() = Some((pid, process, Instant::now()));
        };
        let result = match link {
            Link::Unix(stream, reading) => {
                let writer = FirstFrameTap::new(stream, on_first_frame);
                let fd = stream.as_raw_fd();
                // `fd` is `stream`'s, which outlives the session: serve_watched
                // returns before `stream` is dropped, and the probe with it.
                let hangup: vgpu_broker::engine::HangupProbe = Arc::new(move || peer_gone(fd));
                let mut reader = vgpu_proto::spin::SpinRead::with_spin(stream, reading.spin);
                let sharing = reading.fds.then(vgpu_broker::hostshare::HostSharing::new);
                if let Some(sharing) = &sharing {
                    reader = sharing.reader(reader);
                }
                vgpu_broker::session_loop::serve_with_fds(
                    broker,
                    Arc::clone(&tenant),
                    reader,
                    writer,
                    transport,
                    Some(hangup),
                    sharing,
                )
            }
            Link::InProcess(end) => {
                let writer = FirstFrameTap::new(&**end, on_first_frame);
                let probe = end.shutdown_handle();
                // The device thread closed its end (guest RST, device reset, VMM gone) or
                // the guest shut its sending side.
                let hangup: vgpu_broker::engine::HangupProbe = Arc::new(move || probe.peer_gone());
                // The device thread answers quick calls itself where its seccomp filter allows
                // all a session's calls.
                vgpu_broker::session_loop::serve_ring(
                    broker,
                    Arc::clone(&tenant),
                    Arc::clone(end),
                    writer,
                    transport,
                    Some(hangup),
                    vgpu_seccomp::vhost_may_run_session_calls(),
                )
            }
        };
        let ended = self.lock().remove(&conn).and_then(|c| c.ended);
        vgpu_broker::release_freed_memory();
        let id = session.get();
        let closed = |reason: &str| {
            let (pid, process, since) = opened.borrow().clone().unzip3();
            json!({
                "vm": vm, "session": id, "pid": pid,
                "process": process.as_deref().map(guest_text),
                "transport": transport, "reason": reason,
                "duration_s": since.map(|s| s.elapsed().as_secs_f64()),
            })
        };
        match (&result, ended) {
            (Ok(s), _) if s.id == 0 && id == 0 => {
                debug!(vm = %vm, "connection closed before its handshake");
            }
            (Ok(s), ended) => {
                let mut v = closed(ended.map_or("client disconnected", EndReason::as_str));
                v["requests"] = s.requests.into();
                self.audit(&vm, "session.close", v);
            }
            (Err(ServeError::Refused(m)), _) => {
                self.audit(
                    &vm,
                    "session.refused",
                    json!({ "vm": vm, "transport": transport, "error": guest_text(m) }),
                );
            }
            (Err(ServeError::Frame(FrameError::Io(e))), _)
                if id == 0
                    && matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
            {
                debug!(vm = %vm, "no Hello within the greeting deadline; connection closed");
            }
            (Err(ServeError::Frame(FrameError::Truncated | FrameError::Io(_))), ended)
                if id != 0 =>
            {
                self.audit(
                    &vm,
                    "session.close",
                    closed(ended.map_or("connection lost mid-request", EndReason::as_str)),
                );
            }
            (Err(e), _) => {
                let mut v = closed("error");
                v["error"] = guest_text(&error_chain(e)).into();
                self.audit(&vm, "session.error", v);
            }
        }
    }

    /// Records a session event of `vm`, within the VM's audit rate budget.
    fn audit(&self, vm: &str, event: &str, fields: Value) {
        if let Some(a) = &self.audit {
            a.record_vm(vm, event, fields);
        }
    }

    /// Ends every session of `vm`: their sockets are shut down, so the
    /// session loops read end of file and release everything. Returns how
    /// many connections were ended.
    pub fn end_sessions_of(&self, vm: &str, reason: EndReason) -> usize {
        let mut live = self.lock();
        let mut n = 0;
        for c in live.values_mut().filter(|c| c.vm == vm) {
            c.ended = Some(reason);
            c.stream.shutdown();
            n += 1;
        }
        n
    }

    /// Ends every session of every VM.
    pub fn end_all(&self, reason: EndReason) {
        let mut live = self.lock();
        for c in live.values_mut() {
            c.ended = Some(reason);
            c.stream.shutdown();
        }
    }

    /// Live connections of `vm` (sessions and handshakes in progress).
    pub fn connections_of(&self, vm: &str) -> usize {
        self.lock().values().filter(|c| c.vm == vm).count()
    }

    /// Waits until `vm` (or every VM, with `None`) has no live connection
    /// left: every session thread has returned, so every session has
    /// released its resources. Returns whether that happened in time.
    pub fn wait_ended(&self, vm: Option<&str>, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = {
                let live = self.lock();
                live.values()
                    .filter(|c| vm.is_none_or(|v| c.vm == v))
                    .count()
            };
            if left == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Whether the peer of a connected unix socket has gone: it closed or shut
/// down its end (`POLLRDHUP`, `POLLHUP`) or the socket failed (`POLLERR`).
fn peer_gone(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout (never blocks).
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

trait Unzip3<A, B, C> {
    fn unzip3(self) -> (Option<A>, Option<B>, Option<C>);
}

impl<A, B, C> Unzip3<A, B, C> for Option<(A, B, C)> {
    fn unzip3(self) -> (Option<A>, Option<B>, Option<C>) {
        match self {
            Some((a, b, c)) => (Some(a), Some(b), Some(c)),
            None => (None, None, None),
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// A writer that passes everything through and hands the first complete
/// frame written (the handshake reply) to a callback.
pub struct FirstFrameTap<W, F> {
    inner: W,
    first: Option<(Vec<u8>, F)>,
}

impl<W: Write, F: FnMut(Header, &[u8])> FirstFrameTap<W, F> {
    /// Wraps `inner`.
    pub fn new(inner: W, on_first: F) -> Self {
        Self {
            inner,
            first: Some((Vec::new(), on_first)),
        }
    }

    fn observe(&mut self, bytes: &[u8]) {
        let Some((acc, _)) = self.first.as_mut() else {
            return;
        };
        acc.extend_from_slice(bytes);
        if acc.len() < HEADER_LEN {
            return;
        }
        let hb: &[u8; HEADER_LEN] = acc[..HEADER_LEN].try_into().expect("HEADER_LEN bytes");
        let Ok(h) = Header::decode(hb) else {
            self.first = None; // not a frame: stop looking
            return;
        };
        let end = HEADER_LEN + h.payload_len as usize;
        if acc.len() < end {
            return;
        }
        if let Some((acc, mut f)) = self.first.take() {
            f(h, &acc[HEADER_LEN..end]);
        }
    }
}

impl<W: Write, F: FnMut(Header, &[u8])> Write for FirstFrameTap<W, F> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.observe(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Seconds since the Unix epoch.
pub fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use vgpu_proto::frame::write_frame;

    use super::*;

    #[test]
    fn the_tap_sees_the_first_frame_even_in_pieces_and_passes_everything() {
        let mut frames = Vec::new();
        write_frame(&mut frames, 7, 2, 1, 0, &[b"hello"]).unwrap();
        write_frame(&mut frames, 8, 2, 2, 0, &[b"more"]).unwrap();
        let mut seen = Vec::new();
        let mut out = Vec::new();
        {
            let mut tap = FirstFrameTap::new(&mut out, |h: Header, p: &[u8]| {
                seen.push((h.opcode, p.to_vec()));
            });
            for chunk in frames.chunks(5) {
                tap.write_all(chunk).unwrap();
            }
        }
        assert_eq!(out, frames);
        assert_eq!(seen, vec![(7, b"hello".to_vec())]);
    }

    #[test]
    fn garbage_is_passed_through_and_ignored() {
        let mut called = false;
        let mut out = Vec::new();
        {
            let mut tap = FirstFrameTap::new(&mut out, |_: Header, _: &[u8]| called = true);
            tap.write_all(&[0xAB; 64]).unwrap();
        }
        assert!(!called);
        assert_eq!(out.len(), 64);
    }
}
