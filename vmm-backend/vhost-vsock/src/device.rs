//! The vsock device proper: queue processing, the connection table and host-side socket I/O.
//!
//! All of it runs on the single vring worker thread of the vhost-user backend. Host sockets (the
//! hybrid-vsock listener on `uds_path`, clients that have not yet sent their `CONNECT` line, and
//! every connection's stream) are registered edge-triggered in one inner epoll whose fd is itself
//! watched by the vring worker, so nothing here ever blocks.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};
use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::QueueOwnedT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;

use super::connection::{ConnKey, Connection, Endpoint, Origin};
use super::inproc::RingLease;
use super::packet::{
    ChainBuffer, ChainError, GuestMem, PKT_HEADER_SIZE, PacketHeader, TxPacket, VSOCK_HOST_CID,
    VSOCK_OP_REQUEST, VSOCK_OP_RST, VSOCK_TYPE_STREAM, parse_rx_chain,
};
use super::{
    GPU_PORT_BUFFER, GPU_PORT_REPLY_RING, MAX_LARGE_RING_BYTES, PortConnector, VsockStats,
};
use vgpu_vhost_user::{
    LogLimiter, Rearm, UsedBatch, add_used, next_head, rearm, signal, vring_ready,
};

/// Most simultaneous connections per device. Each holds at most its `buf_alloc` of buffered
/// guest data in `tx_buf` (`tx_buffer_size`, or `GPU_PORT_BUFFER` for the at most
/// `MAX_LARGE_RING_BYTES / (GPU_PORT_BUFFER + GPU_PORT_REPLY_RING)` in-process connections with
/// large rings) plus its in-process rings, so this also bounds the memory a guest can make us
/// hold.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most host clients that connected to `uds_path` but have not finished their `CONNECT` line.
pub const MAX_PENDING_HOST_CLIENTS: usize = 64;
/// Longest accepted `CONNECT <port>\n` line.
pub const MAX_CONNECT_LINE: usize = 64;
/// Most queued RSTs for packets that match no connection; more are dropped (the guest resends
/// or times out).
pub const MAX_PENDING_CONTROL: usize = 256;
/// First port handed out to host-initiated connections (as in Firecracker and cloud-hypervisor,
/// far above the ports guests listen on).
pub const HOST_PORT_BASE: u32 = 1 << 30;

/// Epoll token of the hybrid-vsock listener.
const LISTENER_TOKEN: u64 = 0;
/// Epoll token of the wake-up audit's timer (connection tokens count up from 1).
const AUDIT_TOKEN: u64 = u64::MAX;
/// How often the device audits itself for lost wake-ups, once the VMM shared the guest's memory
/// ([`VsockDevice::audit_wakeups`]): a reply whose announcement was lost waits at most this long.
pub const WAKEUP_AUDIT_INTERVAL: Duration = Duration::from_secs(1);
/// Lost wake-ups of one device logged as warnings one by one; after them, only the 2^k-th
/// (a guest that never kicks would otherwise log a line a second for good).
const LOST_WAKEUPS_LOGGED: u64 = 10;

/// Whether the `n`-th lost wake-up (from 1) is logged: the first [`LOST_WAKEUPS_LOGGED`], then
/// only the 2^k-th, so a guest that keeps losing them cannot fill the log.
fn logs_finding(n: u64) -> bool {
    n <= LOST_WAKEUPS_LOGGED || n.is_power_of_two()
}

/// An audit this late means the device's host events stopped coming (its timer is one of them):
/// the next tx event runs the audit and says so.
const AUDIT_OVERDUE: Duration = Duration::from_secs(3);
/// Events every host stream is registered for.
const STREAM_EVENTS: EventSet = EventSet::IN
    .union(EventSet::OUT)
    .union(EventSet::READ_HANG_UP)
    .union(EventSet::EDGE_TRIGGERED);
/// Events a host client is registered for while we read its `CONNECT` line.
const CLIENT_EVENTS: EventSet = EventSet::IN
    .union(EventSet::READ_HANG_UP)
    .union(EventSet::EDGE_TRIGGERED);
/// Epoll events handled per `epoll_wait`.
const EPOLL_BATCH: usize = 64;
/// Rx buffers filled between two signals to the guest within one burst (each signal suppressed
/// while the guest has not asked for one, with `VIRTIO_RING_F_EVENT_IDX`): the guest starts
/// reading a long burst, and returning buffers, while the device fills the rest of them, instead
/// of after the last. Of 16, 32 and 64, 32 measured best (a loop of 16 MiB device-to-host
/// copies: 2.7 → 3.1 GB/s, medians of six alternating runs).
const RX_SIGNAL_EVERY: usize = 32;

/// Which queue a dropped chain came from, for logs.
#[derive(Debug, Clone, Copy)]
enum QueueName {
    Rx,
    Tx,
}

impl QueueName {
    fn as_str(self) -> &'static str {
        match self {
            QueueName::Rx => "rx",
            QueueName::Tx => "tx",
        }
    }
}

/// A host client of the hybrid-vsock listener that has not sent its `CONNECT` line yet.
#[derive(Debug)]
struct HostClient {
    stream: UnixStream,
    line: Vec<u8>,
}

#[derive(Debug, Clone, Copy)]
enum TokenOwner {
    Conn(ConnKey),
    Client,
}

/// Parses `CONNECT <port>` (the trailing newline already removed).
pub fn parse_connect_line(line: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(line).ok()?;
    let mut words = text.split_ascii_whitespace();
    let verb = words.next()?;
    if !verb.eq_ignore_ascii_case("CONNECT") {
        return None;
    }
    let port = words.next()?.parse::<u32>().ok()?;
    if words.next().is_some() {
        return None;
    }
    Some(port)
}

/// A timer whose reads never block (`TimerFd` opens blocking ones).
fn nonblocking_timer() -> io::Result<TimerFd> {
    let timer = TimerFd::new()?;
    let fd = timer.as_raw_fd();
    // SAFETY: F_GETFL on a descriptor the timer owns; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: F_SETFL on the same descriptor, with its flags and O_NONBLOCK; no memory is passed.
    let ok = flags >= 0 && unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } == 0;
    if !ok {
        return Err(io::Error::last_os_error());
    }
    Ok(timer)
}

/// Connects to a unix socket without ever blocking: a listener with a full backlog yields
/// `WouldBlock` instead of stalling the device thread.
pub fn connect_nonblocking(path: &Path) -> io::Result<UnixStream> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid (empty) value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unix socket path {} is empty or too long", path.display()),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: plain socket(2) call with constant arguments.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: `addr` is a properly initialised sockaddr_un and `len` does not exceed its size.
    let ret = unsafe {
        libc::connect(
            owned.as_raw_fd(),
            std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
            len as libc::socklen_t,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(owned))
}

/// The virtio-vsock device state of one VM.
pub struct VsockDevice {
    guest_cid: u64,
    buf_alloc: u32,
    uds_path: PathBuf,
    connector: Arc<dyn PortConnector>,
    stats: Arc<VsockStats>,
    mem: Option<GuestMemoryAtomic<GuestMem>>,
    event_idx: bool,
    epoll: Epoll,
    listener: Option<UnixListener>,
    /// Looked up for every packet: a fast hasher, seeded per process (the keys are the guest's
    /// ports, and a guest that made them collide would slow only its own device).
    conns: HashMap<ConnKey, Connection, foldhash::fast::RandomState>,
    tokens: HashMap<u64, TokenOwner>,
    clients: HashMap<u64, HostClient>,
    pending: VecDeque<ConnKey>,
    control: VecDeque<PacketHeader>,
    next_token: u64,
    next_host_port: u32,
    limiter: LogLimiter,
    /// Fires every [`WAKEUP_AUDIT_INTERVAL`] once the guest's memory is set (nonblocking).
    audit_timer: TimerFd,
    audit_armed: bool,
    last_audit: Instant,
    /// An audit ran since the backend last asked ([`VsockDevice::take_audit_ran`]).
    audit_ran: bool,
    /// Lost wake-ups this device's audits found.
    lost_wakeups: u64,
    /// The tx queue's next chain when the last audit found chains waiting with no kick on its
    /// way ([`VsockDevice::tx_unannounced`]).
    tx_unannounced_at: Option<u16>,
}

impl std::fmt::Debug for VsockDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VsockDevice")
            .field("guest_cid", &self.guest_cid)
            .field("connections", &self.conns.len())
            .finish_non_exhaustive()
    }
}

impl VsockDevice {
    /// Creates the device. `listener` is the hybrid-vsock listener on `uds_path` (nonblocking
    /// mode is set here); `None` disables host-initiated connections.
    pub fn new(
        guest_cid: u64,
        buf_alloc: u32,
        uds_path: PathBuf,
        connector: Arc<dyn PortConnector>,
        stats: Arc<VsockStats>,
        listener: Option<UnixListener>,
    ) -> io::Result<Self> {
        let epoll = Epoll::new()?;
        let audit_timer = nonblocking_timer()?;
        epoll.ctl(
            ControlOperation::Add,
            audit_timer.as_raw_fd(),
            EpollEvent::new(EventSet::IN, AUDIT_TOKEN),
        )?;
        if let Some(l) = &listener {
            l.set_nonblocking(true)?;
            epoll.ctl(
                ControlOperation::Add,
                l.as_raw_fd(),
                EpollEvent::new(EventSet::IN, LISTENER_TOKEN),
            )?;
        }
        Ok(VsockDevice {
            guest_cid,
            buf_alloc,
            uds_path,
            connector,
            stats,
            mem: None,
            event_idx: false,
            epoll,
            listener,
            conns: HashMap::default(),
            tokens: HashMap::new(),
            clients: HashMap::new(),
            pending: VecDeque::new(),
            control: VecDeque::new(),
            next_token: LISTENER_TOKEN + 1,
            next_host_port: HOST_PORT_BASE,
            limiter: LogLimiter::new(),
            audit_timer,
            audit_armed: false,
            last_audit: Instant::now(),
            audit_ran: false,
            lost_wakeups: 0,
            tx_unannounced_at: None,
        })
    }

    /// The inner epoll fd; readable whenever a host socket has an event.
    pub fn epoll_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Installs the guest memory (called on every memory-table change).
    pub fn set_memory(&mut self, mem: GuestMemoryAtomic<GuestMem>) {
        self.mem = Some(mem);
        self.arm_audit();
    }

    /// Records whether `VIRTIO_RING_F_EVENT_IDX` was negotiated.
    pub fn set_event_idx(&mut self, enabled: bool) {
        self.event_idx = enabled;
    }

    /// Number of open connections.
    #[cfg(test)]
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Closes every connection and pending host client: the host streams are dropped, so their
    /// peers (including in-process sessions) see end of file.
    pub fn reset(&mut self, reason: &str) {
        let n = self.conns.len();
        // Counted before the streams close: a peer that sees its end of file finds them counted.
        self.stats.connections_closed(n as u64);
        self.stats.add_device_reset();
        for (_, conn) in self.conns.drain() {
            let _ = self.epoll.ctl(
                ControlOperation::Delete,
                conn.stream().as_raw_fd(),
                EpollEvent::default(),
            );
        }
        for (_, client) in self.clients.drain() {
            let _ = self.epoll.ctl(
                ControlOperation::Delete,
                client.stream.as_raw_fd(),
                EpollEvent::default(),
            );
        }
        self.tokens.clear();
        self.pending.clear();
        self.control.clear();
        info!(
            guest_cid = self.guest_cid,
            connections = n,
            reason,
            "vsock device reset"
        );
    }

    fn alloc_token(&mut self) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    fn log_guest_error(&mut self, msg: std::fmt::Arguments<'_>) {
        if let Some(suppressed) = self.limiter.allow() {
            if suppressed > 0 {
                error!(
                    guest_cid = self.guest_cid,
                    suppressed, "{msg} (earlier similar errors suppressed)"
                );
            } else {
                error!(guest_cid = self.guest_cid, "{msg}");
            }
        }
    }

    fn drop_chain(&mut self, queue: QueueName, head: u16, err: &ChainError) {
        self.stats.add_dropped_chain();
        self.log_guest_error(format_args!(
            "dropping malformed descriptor chain (queue {}, head {}): {}",
            queue.as_str(),
            head,
            err
        ));
    }

    fn broken_ring(&mut self, queue: QueueName, err: &dyn std::fmt::Display) {
        self.log_guest_error(format_args!(
            "{} ring is unusable ({err}); waiting for the next notification",
            queue.as_str()
        ));
    }

    fn schedule(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(&key) else {
            return;
        };
        if requeue(&mut self.pending, key, conn) {
            self.remove_conn(key);
        }
    }

    fn remove_conn(&mut self, key: ConnKey) {
        if let Some(conn) = self.conns.remove(&key) {
            let _ = self.epoll.ctl(
                ControlOperation::Delete,
                conn.stream().as_raw_fd(),
                EpollEvent::default(),
            );
            self.tokens.remove(&conn.token());
            self.stats.connections_closed(1);
            debug!(
                local_port = key.local_port,
                peer_port = key.peer_port,
                origin = ?conn.origin(),
                "vsock connection closed"
            );
        }
    }

    fn queue_rst(&mut self, h: &PacketHeader) {
        if self.control.len() >= MAX_PENDING_CONTROL {
            warn!(
                guest_cid = self.guest_cid,
                "RST queue full; dropping an RST"
            );
            return;
        }
        self.control.push_back(PacketHeader {
            src_cid: VSOCK_HOST_CID,
            dst_cid: self.guest_cid,
            src_port: h.dst_port,
            dst_port: h.src_port,
            len: 0,
            type_: VSOCK_TYPE_STREAM,
            op: VSOCK_OP_RST,
            flags: 0,
            buf_alloc: 0,
            fwd_cnt: 0,
        });
    }

    fn register_stream(&mut self, stream: &impl AsRawFd, events: EventSet) -> io::Result<u64> {
        let token = self.alloc_token();
        self.epoll.ctl(
            ControlOperation::Add,
            stream.as_raw_fd(),
            EpollEvent::new(events, token),
        )?;
        Ok(token)
    }

    fn refuse(&mut self, h: &PacketHeader, why: std::fmt::Arguments<'_>) {
        debug!(
            port = h.dst_port,
            guest_port = h.src_port,
            "refusing guest connection: {why}"
        );
        self.stats.add_refused();
        self.queue_rst(h);
    }

    fn open_guest_connection(&mut self, h: &PacketHeader) {
        if self.conns.len() >= MAX_CONNECTIONS {
            warn!(
                guest_cid = self.guest_cid,
                port = h.dst_port,
                "connection limit reached"
            );
            self.refuse(
                h,
                format_args!("connection limit {MAX_CONNECTIONS} reached"),
            );
            return;
        }
        let port = h.dst_port;
        let (stream, origin): (Endpoint, _) = match self.connector.connect(port) {
            Some(Ok(s)) => (s, Origin::InProcess),
            Some(Err(e)) => {
                self.refuse(h, format_args!("in-process service refused: {e}"));
                return;
            }
            None => {
                let path = forward_path(&self.uds_path, port);
                match connect_nonblocking(&path) {
                    Ok(s) => (s.into(), Origin::Forwarded),
                    Err(e) => {
                        self.refuse(h, format_args!("{}: {e}", path.display()));
                        return;
                    }
                }
            }
        };
        if let Err(e) = stream.set_nonblocking() {
            self.refuse(h, format_args!("cannot make the stream nonblocking: {e}"));
            return;
        }
        let token = match self.register_stream(&stream, STREAM_EVENTS) {
            Ok(t) => t,
            Err(e) => {
                self.refuse(h, format_args!("epoll registration failed: {e}"));
                return;
            }
        };
        let buf_alloc = self.buf_alloc_for(&stream);
        let conn = Connection::guest_initiated(h, token, stream, origin, self.guest_cid, buf_alloc);
        let key = conn.key();
        debug!(
            port,
            guest_port = h.src_port,
            ?origin,
            "guest connection accepted"
        );
        self.tokens.insert(token, TokenOwner::Conn(key));
        self.conns.insert(key, conn);
        self.stats.connection_opened();
        self.schedule(key);
    }

    /// The `buf_alloc` a new guest connection advertises: an in-process endpoint gets a ring of
    /// [`GPU_PORT_BUFFER`] towards its session (and one of [`GPU_PORT_REPLY_RING`] back) while
    /// the device's large-ring budget lasts, and advertises that much; everything else
    /// advertises `tx_buffer_size`.
    fn buf_alloc_for(&self, stream: &Endpoint) -> u32 {
        let Endpoint::InProcess(d) = stream else {
            return self.buf_alloc;
        };
        let large = GPU_PORT_BUFFER.max(self.buf_alloc);
        let bytes = u64::from(large) + GPU_PORT_REPLY_RING as u64;
        let Some(lease) = RingLease::try_new(&self.stats, bytes, MAX_LARGE_RING_BYTES) else {
            debug!(
                guest_cid = self.guest_cid,
                "large-ring budget spent; the connection gets a default ring"
            );
            return self.buf_alloc;
        };
        if d.enlarge(large as usize, GPU_PORT_REPLY_RING, lease) {
            large
        } else {
            self.buf_alloc
        }
    }

    fn handle_tx_packet(&mut self, mem: &GuestMem, pkt: &TxPacket) {
        let h = pkt.header;
        if h.src_cid != self.guest_cid {
            self.stats.add_dropped_chain();
            let guest_cid = self.guest_cid;
            self.log_guest_error(format_args!(
                "dropping packet with forged source CID {} (guest CID is {guest_cid})",
                h.src_cid
            ));
            return;
        }
        if h.dst_cid != VSOCK_HOST_CID || h.type_ != VSOCK_TYPE_STREAM {
            if h.op != VSOCK_OP_RST {
                debug!(
                    dst_cid = h.dst_cid,
                    type_ = h.type_,
                    "unsupported destination or type"
                );
                self.queue_rst(&h);
            }
            return;
        }
        let key = ConnKey {
            local_port: h.dst_port,
            peer_port: h.src_port,
        };
        match self.conns.get_mut(&key) {
            Some(conn) => {
                conn.on_packet(mem, pkt, &self.stats);
                self.schedule(key);
            }
            None => match h.op {
                VSOCK_OP_REQUEST => self.open_guest_connection(&h),
                VSOCK_OP_RST => {}
                _ => {
                    debug!(
                        op = h.op_name(),
                        port = h.dst_port,
                        "packet for unknown connection"
                    );
                    self.queue_rst(&h);
                }
            },
        }
    }

    /// Processes every packet the guest placed on the tx queue; returns how many it took.
    pub fn process_tx(&mut self, vring: &VringRwLock) -> usize {
        let Some(atomic) = self.mem.clone() else {
            return 0;
        };
        if !vring_ready(vring) {
            return 0;
        }
        if self.audit_armed && self.last_audit.elapsed() > AUDIT_OVERDUE {
            warn!(
                guest_cid = self.guest_cid,
                since_ms = self.last_audit.elapsed().as_millis() as u64,
                "the device's host events stopped coming (the wake-up audit is overdue); auditing now"
            );
            self.audit_wakeups();
        }
        let mem = atomic.memory();
        let mut taken = 0;
        // Whether the last round found nothing although the ring claimed more ([`rearm`]).
        let mut rechecked = false;
        loop {
            if self.event_idx
                && let Err(e) = vring.disable_notification()
            {
                warn!(error = %e, "cannot disable tx notifications");
            }
            let mut popped = false;
            loop {
                let chain = match next_head(vring, &mem) {
                    Ok(Some(c)) => c,
                    Ok(None) => break,
                    Err(e) => {
                        self.broken_ring(QueueName::Tx, &e);
                        break;
                    }
                };
                popped = true;
                let head = chain.index;
                match TxPacket::parse(chain, &mem) {
                    Ok(pkt) => self.handle_tx_packet(&mem, &pkt),
                    Err(e) => self.drop_chain(QueueName::Tx, head, &e),
                }
                if let Err(e) = add_used(vring, &mem, head, 0) {
                    self.log_guest_error(format_args!("cannot return tx chain {head}: {e}"));
                }
                taken += 1;
            }
            if !self.event_idx {
                break;
            }
            match rearm(vring, popped, &mut rechecked) {
                Rearm::Again => {}
                Rearm::Done => break,
                Rearm::Broken => {
                    self.broken_ring(QueueName::Tx, &"available entries cannot be read");
                    break;
                }
                Rearm::Failed(e) => {
                    warn!(error = %e, "cannot enable tx notifications");
                    break;
                }
            }
        }
        if taken > 0 {
            signal(vring, "tx");
        }
        taken
    }

    /// Guest memory, once the VMM has set it.
    pub fn memory(&self) -> Option<GuestMemoryAtomic<GuestMem>> {
        self.mem.clone()
    }

    /// Calls answered on this device's thread so far (by in-process endpoints' answerers).
    pub fn calls_on_device_thread(&self) -> u64 {
        self.stats.calls_on_device_thread()
    }

    fn has_rx_work(&self) -> bool {
        !self.control.is_empty() || !self.pending.is_empty()
    }

    /// Fills guest rx buffers with every packet owed to the guest, as long as buffers last.
    pub fn process_rx(&mut self, vring: &VringRwLock) {
        if !self.has_rx_work() {
            return;
        }
        let Some(atomic) = self.mem.clone() else {
            return;
        };
        if !vring_ready(vring) {
            return;
        }
        let mem = atomic.memory();
        // The chains returned, published to the guest in batches.
        let mut used = UsedBatch::new(vring);
        let mut rechecked = false;
        while self.has_rx_work() {
            let chain = match next_head(vring, &mem) {
                Ok(Some(c)) => c,
                Ok(None) if rechecked => {
                    self.broken_ring(QueueName::Rx, &"available entries cannot be read");
                    break;
                }
                Ok(None) => {
                    // Out of buffers: ask for a kick when the guest adds some, and look once more
                    // in case it did so meanwhile.
                    match vring.enable_notification() {
                        Ok(true) => {
                            rechecked = true;
                            continue;
                        }
                        Ok(false) => break,
                        Err(e) => {
                            warn!(error = %e, "cannot enable rx notifications");
                            break;
                        }
                    }
                }
                Err(e) => {
                    self.broken_ring(QueueName::Rx, &e);
                    break;
                }
            };
            rechecked = false;
            let head = chain.index;
            let len = match parse_rx_chain(chain, &mem) {
                Ok(buf) => match self.fill_rx(&mem, &buf) {
                    Some(len) => len,
                    None => {
                        // Nothing to send after all: give the buffer back to the avail ring.
                        vring.get_mut().get_queue_mut().go_to_previous_position();
                        break;
                    }
                },
                Err(e) => {
                    self.drop_chain(QueueName::Rx, head, &e);
                    0
                }
            };
            if let Err(e) = used.push(&mem, head, len) {
                self.log_guest_error(format_args!("cannot return rx chain {head}: {e}"));
            }
            if used.pending() >= RX_SIGNAL_EVERY || used.full() {
                used.signal(vring, &mem, "rx");
            }
        }
        if used.pending() > 0 {
            used.signal(vring, &mem, "rx");
        }
    }

    /// Writes the next owed packet into `buf`; returns the used length.
    fn fill_rx(&mut self, mem: &GuestMem, buf: &ChainBuffer) -> Option<u32> {
        if let Some(h) = self.control.pop_front() {
            self.stats.add_rst_sent();
            return self.write_header(mem, buf, &h);
        }
        // Each pending connection gets at most one try per buffer: one that has work but cannot
        // use this buffer (say, data for a 44-byte buffer) must not make us spin.
        for _ in 0..self.pending.len() {
            let Some(key) = self.pending.pop_front() else {
                break;
            };
            let Some(conn) = self.conns.get_mut(&key) else {
                continue;
            };
            conn.in_pending = false;
            let produced = conn.produce(mem, buf, &self.stats);
            // As `schedule`, with the connection at hand: one lookup per packet.
            if requeue(&mut self.pending, key, conn) {
                self.remove_conn(key);
            }
            if let Some(h) = produced {
                return self.write_header(mem, buf, &h);
            }
        }
        None
    }

    fn write_header(&mut self, mem: &GuestMem, buf: &ChainBuffer, h: &PacketHeader) -> Option<u32> {
        match buf.write_start(mem, &h.to_bytes()) {
            Ok(n) if n == PKT_HEADER_SIZE => Some(PKT_HEADER_SIZE as u32 + h.len),
            Ok(_) | Err(_) => {
                self.log_guest_error(format_args!(
                    "cannot write a packet header into an rx buffer"
                ));
                Some(0)
            }
        }
    }

    /// Handles every pending host socket event. `guest_ready` tells whether the guest driver is
    /// up (host clients are turned away otherwise).
    pub fn process_host_events(&mut self, guest_ready: bool) {
        let mut events = [EpollEvent::default(); EPOLL_BATCH];
        loop {
            let n = match self.epoll.wait(0, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    error!(error = %e, "vsock epoll_wait failed");
                    return;
                }
            };
            for ev in &events[..n] {
                let evset = EventSet::from_bits_truncate(ev.events());
                self.handle_host_event(ev.data(), evset, guest_ready);
            }
            if n < EPOLL_BATCH {
                break;
            }
        }
    }

    fn handle_host_event(&mut self, token: u64, evset: EventSet, guest_ready: bool) {
        if token == AUDIT_TOKEN {
            // Nonblocking: nothing to read only means another event consumed the expiry.
            let _ = self.audit_timer.wait();
            self.audit_wakeups();
            return;
        }
        if token == LISTENER_TOKEN {
            self.accept_host_clients(guest_ready);
            return;
        }
        match self.tokens.get(&token).copied() {
            Some(TokenOwner::Conn(key)) => {
                if let Some(conn) = self.conns.get_mut(&key) {
                    conn.on_stream_event(evset, &self.stats);
                }
                self.schedule(key);
            }
            Some(TokenOwner::Client) => self.read_client(token),
            None => {}
        }
    }

    /// Starts the periodic wake-up audit (once the VMM shared the guest's memory).
    fn arm_audit(&mut self) {
        if self.audit_armed {
            return;
        }
        match self
            .audit_timer
            .reset(WAKEUP_AUDIT_INTERVAL, Some(WAKEUP_AUDIT_INTERVAL))
        {
            Ok(()) => {
                self.audit_armed = true;
                self.last_audit = Instant::now();
            }
            Err(e) => warn!(error = %e, "cannot arm the vsock wake-up audit"),
        }
    }

    /// Looks at every connection for a wake-up that was lost between the device and an
    /// in-process session (or a connection owed packets but not queued), makes up for each,
    /// and logs it with the rings' state: a safety net under the transition-only wake-ups, so a
    /// lost one costs a call at most [`WAKEUP_AUDIT_INTERVAL`] instead of the connection. The
    /// backend then looks at the tx queue for chains whose kick was lost
    /// ([`VsockDevice::take_audit_ran`]).
    pub(crate) fn audit_wakeups(&mut self) {
        self.last_audit = Instant::now();
        self.audit_ran = true;
        let mut found = Vec::new();
        for (key, conn) in &mut self.conns {
            let describe = logs_finding(self.lost_wakeups + found.len() as u64 + 1);
            if let Some(finding) = conn.recover_wakeup(&self.stats, describe) {
                found.push((*key, conn.in_pending, finding));
            }
        }
        for (key, in_pending, finding) in found {
            if self.count_lost_wakeup() {
                warn!(
                    guest_cid = self.guest_cid,
                    local_port = key.local_port,
                    peer_port = key.peer_port,
                    in_pending,
                    rings = ?finding.rings,
                    waiter = finding.waiter,
                    found = self.lost_wakeups,
                    "vsock audit made up for a lost wake-up: {}",
                    finding.lost.as_str()
                );
            }
            self.schedule(key);
        }
    }

    /// Counts a lost wake-up; returns whether to log it as a warning ([`logs_finding`]).
    fn count_lost_wakeup(&mut self) -> bool {
        self.stats.add_lost_wakeup();
        self.lost_wakeups += 1;
        logs_finding(self.lost_wakeups)
    }

    /// Whether an audit ran since the last call: the backend then looks at the tx queue too,
    /// for chains whose kick never came ([`VsockDevice::found_unannounced_tx`]).
    pub fn take_audit_ran(&mut self) -> bool {
        std::mem::take(&mut self.audit_ran)
    }

    /// Records that tx chains from `next` on wait with no kick on its way at this audit (`None`:
    /// none wait); returns whether the same ones waited at the audit before, a second or more
    /// ago: then no kick is coming for them, and the backend takes them.
    pub fn tx_unannounced(&mut self, next: Option<u16>) -> bool {
        let stale = next.is_some() && self.tx_unannounced_at == next;
        self.tx_unannounced_at = if stale { None } else { next };
        stale
    }

    /// The audit found `chains` tx chains that the guest published without a kick reaching the
    /// device (none pending either) and processed them: counted and logged as a lost wake-up.
    /// `before` says where the queue stood (`describe_ring`).
    pub fn found_unannounced_tx(&mut self, chains: usize, before: &str) {
        if self.count_lost_wakeup() {
            warn!(
                guest_cid = self.guest_cid,
                chains,
                found = self.lost_wakeups,
                tx = before,
                "vsock audit found tx chains no kick announced and processed them"
            );
        }
    }

    fn accept_host_clients(&mut self, guest_ready: bool) {
        let Some(listener) = self.listener.as_ref() else {
            return;
        };
        let mut accepted = Vec::new();
        loop {
            match listener.accept() {
                Ok((s, _)) => accepted.push(s),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    warn!(error = %e, "accept on the hybrid vsock socket failed");
                    break;
                }
            }
        }
        for stream in accepted {
            if !guest_ready {
                debug!("guest vsock driver not ready; closing host client");
                self.stats.add_refused();
                continue;
            }
            if self.clients.len() >= MAX_PENDING_HOST_CLIENTS || self.conns.len() >= MAX_CONNECTIONS
            {
                warn!(
                    guest_cid = self.guest_cid,
                    "too many host connections; closing host client"
                );
                self.stats.add_refused();
                continue;
            }
            if let Err(e) = stream.set_nonblocking(true) {
                warn!(error = %e, "cannot make host client nonblocking");
                continue;
            }
            let token = match self.register_stream(&stream, CLIENT_EVENTS) {
                Ok(t) => t,
                Err(e) => {
                    warn!(error = %e, "cannot watch host client");
                    continue;
                }
            };
            self.tokens.insert(token, TokenOwner::Client);
            self.clients.insert(
                token,
                HostClient {
                    stream,
                    line: Vec::new(),
                },
            );
            self.read_client(token);
        }
    }

    fn drop_client(&mut self, token: u64) -> Option<HostClient> {
        let client = self.clients.remove(&token)?;
        self.tokens.remove(&token);
        let _ = self.epoll.ctl(
            ControlOperation::Delete,
            client.stream.as_raw_fd(),
            EpollEvent::default(),
        );
        Some(client)
    }

    /// Reads the `CONNECT <port>\n` line byte by byte, so that data the client sends right after
    /// it stays in the socket for the guest.
    fn read_client(&mut self, token: u64) {
        let port = loop {
            let Some(client) = self.clients.get_mut(&token) else {
                return;
            };
            let mut byte = [0u8; 1];
            match client.stream.read(&mut byte) {
                Ok(0) => {
                    debug!("host client closed before CONNECT");
                    self.drop_client(token);
                    return;
                }
                Ok(_) if byte[0] == b'\n' => match parse_connect_line(&client.line) {
                    Some(port) => break port,
                    None => {
                        warn!(
                            line = %String::from_utf8_lossy(&client.line),
                            "malformed hybrid vsock request (want \"CONNECT <port>\\n\")"
                        );
                        self.stats.add_refused();
                        self.drop_client(token);
                        return;
                    }
                },
                Ok(_) => {
                    client.line.push(byte[0]);
                    if client.line.len() > MAX_CONNECT_LINE {
                        warn!("hybrid vsock request line too long");
                        self.stats.add_refused();
                        self.drop_client(token);
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!(error = %e, "host client read failed");
                    self.drop_client(token);
                    return;
                }
            }
        };
        let Some(client) = self.clients.remove(&token) else {
            return;
        };
        let Some(local_port) = self.alloc_host_port() else {
            warn!("no free host port for a host-initiated connection");
            self.stats.add_refused();
            self.tokens.remove(&token);
            return;
        };
        if let Err(e) = self.epoll.ctl(
            ControlOperation::Modify,
            client.stream.as_raw_fd(),
            EpollEvent::new(STREAM_EVENTS, token),
        ) {
            warn!(error = %e, "cannot watch host connection");
            self.tokens.remove(&token);
            return;
        }
        let key = ConnKey {
            local_port,
            peer_port: port,
        };
        debug!(
            local_port,
            guest_port = port,
            "host client connecting to the guest"
        );
        let conn =
            Connection::host_initiated(key, token, client.stream, self.guest_cid, self.buf_alloc);
        self.tokens.insert(token, TokenOwner::Conn(key));
        self.conns.insert(key, conn);
        self.stats.connection_opened();
        self.schedule(key);
    }

    fn alloc_host_port(&mut self) -> Option<u32> {
        for _ in 0..=MAX_CONNECTIONS {
            let port = self.next_host_port;
            self.next_host_port = if port == u32::MAX {
                HOST_PORT_BASE
            } else {
                port + 1
            };
            if !self.conns.keys().any(|k| k.local_port == port) {
                return Some(port);
            }
        }
        None
    }
}

/// The path a guest connection to `port` is forwarded to: `<uds_path>_<port>`.
pub fn forward_path(uds_path: &Path, port: u32) -> PathBuf {
    let mut s = uds_path.as_os_str().to_owned();
    s.push(format!("_{port}"));
    PathBuf::from(s)
}

/// Queues `conn` (`key`) for the rx queue if it has packets owed and is not queued yet; returns
/// whether it is closed instead (the caller removes it).
fn requeue(pending: &mut VecDeque<ConnKey>, key: ConnKey, conn: &mut Connection) -> bool {
    if conn.is_closed() {
        return true;
    }
    if conn.has_rx_work() && !conn.in_pending {
        conn.in_pending = true;
        pending.push_back(key);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{VSOCK_OP_RESPONSE, VSOCK_OP_RW, VSOCK_OP_SHUTDOWN, VSOCK_SHUTDOWN_BOTH};
    use std::io::Write;
    use std::sync::Mutex;
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{RawDescriptor, split::Descriptor as SplitDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Address, Bytes, GuestAddress};

    const CID: u64 = 3;
    const QSIZE: u16 = 16;
    const TXQ_BASE: u64 = 0x1000;
    const RXQ_BASE: u64 = 0x8000;
    const BUFS: u64 = 0x10_0000;

    /// A connector serving port 7 with a socket pair, port 11 with in-process rings, and
    /// refusing port 8.
    #[derive(Default)]
    struct Pairs(
        Mutex<Vec<UnixStream>>,
        Mutex<Vec<crate::inproc::SessionEnd>>,
    );
    impl PortConnector for Pairs {
        fn connect(&self, port: u32) -> Option<io::Result<crate::Endpoint>> {
            match port {
                7 => {
                    let (a, b) = UnixStream::pair().unwrap();
                    self.0.lock().unwrap().push(b);
                    Some(Ok(a.into()))
                }
                8 => Some(Err(io::Error::other("no"))),
                11 => {
                    let (d, s) = crate::inproc::pair(crate::inproc::DEFAULT_RING_CAPACITY).unwrap();
                    self.1.lock().unwrap().push(s);
                    Some(Ok(d.into()))
                }
                _ => None,
            }
        }
    }

    struct Rig {
        mem: GuestMemoryAtomic<GuestMem>,
        dev: VsockDevice,
        peers: Arc<Pairs>,
        stats: Arc<VsockStats>,
        _dir: tempfile::TempDir,
    }

    fn rig() -> Rig {
        let mem = GuestMemoryAtomic::new(
            GuestMem::from_ranges(&[(GuestAddress(0), 0x100_0000)]).unwrap(),
        );
        let peers = Arc::new(Pairs::default());
        let stats = Arc::new(VsockStats::default());
        let dir = tempfile::tempdir().unwrap();
        let mut dev = VsockDevice::new(
            CID,
            4096,
            dir.path().join("v.sock"),
            peers.clone(),
            stats.clone(),
            None,
        )
        .unwrap();
        dev.set_memory(mem.clone());
        Rig {
            mem,
            dev,
            peers,
            stats,
            _dir: dir,
        }
    }

    fn vring(rig: &Rig, base: u64) -> (VringRwLock, MockSplitQueue<'static, GuestMem>) {
        vring_of(rig, base, QSIZE)
    }

    fn vring_of(
        rig: &Rig,
        base: u64,
        size: u16,
    ) -> (VringRwLock, MockSplitQueue<'static, GuestMem>) {
        // The mock needs a memory reference that outlives it; leak one snapshot for the test.
        let m: &'static GuestMem = Box::leak(Box::new(rig.mem.memory().clone()));
        let q = MockSplitQueue::create(m, GuestAddress(base), size);
        let v = VringRwLock::new(rig.mem.clone(), size).unwrap();
        v.set_queue_size(size);
        v.set_queue_info(
            q.desc_table_addr().raw_value(),
            q.avail_addr().raw_value(),
            used_ring(&q).raw_value(),
        )
        .unwrap();
        v.set_queue_ready(true);
        v.set_enabled(true);
        (v, q)
    }

    fn hdr(op: u16, src_port: u32, dst_port: u32, len: u32) -> PacketHeader {
        PacketHeader {
            src_cid: CID,
            dst_cid: VSOCK_HOST_CID,
            src_port,
            dst_port,
            len,
            type_: VSOCK_TYPE_STREAM,
            op,
            flags: 0,
            buf_alloc: 65536,
            fwd_cnt: 0,
        }
    }

    /// Puts chains on a mock queue, each starting at descriptor `first`.
    fn push_chain(q: &MockSplitQueue<'_, GuestMem>, first: u16, descs: &[RawDescriptor]) {
        q.add_desc_chains(descs, first).unwrap();
    }

    fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
    }

    fn write_pkt(rig: &Rig, addr: u64, h: PacketHeader, data: &[u8]) {
        let m = rig.mem.memory();
        m.write_slice(&h.to_bytes(), GuestAddress(addr)).unwrap();
        m.write_slice(data, GuestAddress(addr + PKT_HEADER_SIZE as u64))
            .unwrap();
    }

    /// Where a test queue's used ring lies: virtio-queue's mock places it over the end of the
    /// avail ring's entries (from entry `size / 2` on), so the device's first used entry would
    /// overwrite chains not taken yet.
    fn used_ring(q: &MockSplitQueue<'_, GuestMem>) -> GuestAddress {
        q.desc_table_addr().unchecked_add(USED_OFFSET)
    }

    /// See [`used_ring`]: past the descriptor table and avail ring of up to 64 entries.
    const USED_OFFSET: u64 = 0x800;

    fn used_len(rig: &Rig, q: &MockSplitQueue<'_, GuestMem>, i: u16) -> (u32, u32) {
        let m = rig.mem.memory();
        let e = used_ring(q).unchecked_add(4 + 8 * u64::from(i));
        let id: u32 = m.read_obj(e).unwrap();
        let len: u32 = m.read_obj(e.unchecked_add(4)).unwrap();
        (id, len)
    }

    fn used_idx(rig: &Rig, q: &MockSplitQueue<'_, GuestMem>) -> u16 {
        rig.mem
            .memory()
            .read_obj(used_ring(q).unchecked_add(2))
            .unwrap()
    }

    fn rx_header(rig: &Rig, addr: u64) -> PacketHeader {
        let mut raw = [0u8; PKT_HEADER_SIZE];
        rig.mem
            .memory()
            .read_slice(&mut raw, GuestAddress(addr))
            .unwrap();
        PacketHeader::from_bytes(&raw)
    }

    #[test]
    fn connect_line_parser() {
        assert_eq!(parse_connect_line(b"CONNECT 52"), Some(52));
        assert_eq!(parse_connect_line(b"connect 52 "), Some(52));
        assert_eq!(parse_connect_line(b"CONNECT"), None);
        assert_eq!(parse_connect_line(b"CONNECT -1"), None);
        assert_eq!(parse_connect_line(b"CONNECT 4294967296"), None);
        assert_eq!(parse_connect_line(b"CONNECT 1 2"), None);
        assert_eq!(parse_connect_line(b"OPEN 1"), None);
        assert_eq!(parse_connect_line(&[0xff, 0xfe]), None);
    }

    #[test]
    fn forward_path_appends_the_port() {
        assert_eq!(
            forward_path(Path::new("/run/vm1.vsock"), 1234),
            PathBuf::from("/run/vm1.vsock_1234")
        );
    }

    #[test]
    fn nonblocking_connect_reports_missing_and_overlong_paths() {
        let dir = tempfile::tempdir().unwrap();
        let err = connect_nonblocking(&dir.path().join("nope")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let long = dir.path().join("x".repeat(200));
        let err = connect_nonblocking(&long).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let path = dir.path().join("ok");
        let l = UnixListener::bind(&path).unwrap();
        let mut s = connect_nonblocking(&path).unwrap();
        s.set_nonblocking(false).unwrap();
        s.write_all(b"x").unwrap();
        let (mut a, _) = l.accept().unwrap();
        let mut b = [0u8; 1];
        a.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"x");
    }

    /// Hostile chains on the tx queue are dropped and counted, and a well-formed connection
    /// request placed after them on the same queue is still served.
    #[test]
    fn hostile_tx_chains_are_dropped_without_affecting_others() {
        let mut rig = rig();
        let (txv, txq) = vring(&rig, TXQ_BASE);
        let (rxv, rxq) = vring(&rig, RXQ_BASE);
        let next = VRING_DESC_F_NEXT as u16;
        let write = VRING_DESC_F_WRITE as u16;
        // 0: outside guest memory.
        push_chain(&txq, 0, &[d(0x2000_0000, 44, 0, 0)]);
        // 1: writable header on tx.
        write_pkt(&rig, BUFS, hdr(VSOCK_OP_REQUEST, 100, 7, 0), b"");
        push_chain(&txq, 1, &[d(BUFS, 44, write, 0)]);
        // 2-3: a loop.
        push_chain(&txq, 2, &[d(BUFS, 44, next, 3), d(BUFS, 44, next, 2)]);
        // 4: header shorter than 44 bytes.
        push_chain(&txq, 4, &[d(BUFS, 43, 0, 0)]);
        // 5-6: len larger than the data descriptor.
        write_pkt(&rig, BUFS + 0x1000, hdr(VSOCK_OP_RW, 100, 7, 5000), b"");
        push_chain(
            &txq,
            5,
            &[d(BUFS + 0x1000, 44, next, 6), d(BUFS + 0x2000, 100, 0, 0)],
        );
        // 7: absurd len.
        write_pkt(&rig, BUFS + 0x3000, hdr(VSOCK_OP_RW, 100, 7, u32::MAX), b"");
        push_chain(&txq, 7, &[d(BUFS + 0x3000, 44, 0, 0)]);
        // 8: a forged source CID.
        let mut forged = hdr(VSOCK_OP_REQUEST, 100, 7, 0);
        forged.src_cid = 99;
        write_pkt(&rig, BUFS + 0x4000, forged, b"");
        push_chain(&txq, 8, &[d(BUFS + 0x4000, 44, 0, 0)]);
        // 9: a legitimate request to the in-process port.
        write_pkt(&rig, BUFS + 0x5000, hdr(VSOCK_OP_REQUEST, 100, 7, 0), b"");
        push_chain(&txq, 9, &[d(BUFS + 0x5000, 44, 0, 0)]);
        // One rx buffer for the response.
        push_chain(&rxq, 0, &[d(BUFS + 0x10000, 4096, write, 0)]);

        rig.dev.process_tx(&txv);
        rig.dev.process_rx(&rxv);

        assert_eq!(rig.stats.snapshot().dropped_chains, 7);
        assert_eq!(
            used_idx(&rig, &txq),
            8,
            "every chain, bad or good, is returned"
        );
        assert_eq!(rig.dev.connection_count(), 1);
        assert_eq!(used_idx(&rig, &rxq), 1);
        assert_eq!(used_len(&rig, &rxq, 0), (0, PKT_HEADER_SIZE as u32));
        let resp = rx_header(&rig, BUFS + 0x10000);
        assert_eq!(
            (resp.op, resp.src_port, resp.dst_port),
            (VSOCK_OP_RESPONSE, 7, 100)
        );
        assert_eq!(resp.dst_cid, CID);
        assert_eq!(rig.peers.0.lock().unwrap().len(), 1);
    }

    #[test]
    fn hostile_rx_chain_is_dropped_and_the_next_buffer_used() {
        let mut rig = rig();
        let (txv, txq) = vring(&rig, TXQ_BASE);
        let (rxv, rxq) = vring(&rig, RXQ_BASE);
        write_pkt(&rig, BUFS, hdr(VSOCK_OP_REQUEST, 100, 7, 0), b"");
        push_chain(&txq, 0, &[d(BUFS, 44, 0, 0)]);
        // rx 0: read-only buffer (wrong direction); rx 1: fine.
        push_chain(&rxq, 0, &[d(BUFS + 0x10000, 4096, 0, 0)]);
        push_chain(
            &rxq,
            1,
            &[d(BUFS + 0x20000, 4096, VRING_DESC_F_WRITE as u16, 0)],
        );
        rig.dev.process_tx(&txv);
        rig.dev.process_rx(&rxv);
        assert_eq!(rig.stats.snapshot().dropped_chains, 1);
        assert_eq!(used_idx(&rig, &rxq), 2);
        assert_eq!(used_len(&rig, &rxq, 0), (0, 0));
        assert_eq!(used_len(&rig, &rxq, 1), (1, PKT_HEADER_SIZE as u32));
        assert_eq!(rx_header(&rig, BUFS + 0x20000).op, VSOCK_OP_RESPONSE);
    }

    #[test]
    fn unknown_connection_and_refused_ports_get_rst() {
        let mut rig = rig();
        let (txv, txq) = vring(&rig, TXQ_BASE);
        let (rxv, rxq) = vring(&rig, RXQ_BASE);
        // RW for a connection that does not exist, a refused in-process port, a port with no
        // forward listener, and an RST (which must not be answered).
        write_pkt(&rig, BUFS, hdr(VSOCK_OP_RW, 100, 7, 0), b"");
        write_pkt(&rig, BUFS + 0x1000, hdr(VSOCK_OP_REQUEST, 101, 8, 0), b"");
        write_pkt(&rig, BUFS + 0x2000, hdr(VSOCK_OP_REQUEST, 102, 9, 0), b"");
        write_pkt(&rig, BUFS + 0x3000, hdr(VSOCK_OP_RST, 103, 9, 0), b"");
        for i in 0..4u16 {
            push_chain(&txq, i, &[d(BUFS + 0x1000 * u64::from(i), 44, 0, 0)]);
        }
        for i in 0..4u16 {
            push_chain(
                &rxq,
                i,
                &[d(
                    BUFS + 0x10000 * (u64::from(i) + 1),
                    4096,
                    VRING_DESC_F_WRITE as u16,
                    0,
                )],
            );
        }
        rig.dev.process_tx(&txv);
        rig.dev.process_rx(&rxv);
        assert_eq!(
            used_idx(&rig, &rxq),
            3,
            "three RSTs, none for the guest's RST"
        );
        let ports: Vec<(u16, u32, u32)> = (1..=3)
            .map(|i| {
                let h = rx_header(&rig, BUFS + 0x10000 * i);
                (h.op, h.src_port, h.dst_port)
            })
            .collect();
        assert_eq!(
            ports,
            vec![
                (VSOCK_OP_RST, 7, 100),
                (VSOCK_OP_RST, 8, 101),
                (VSOCK_OP_RST, 9, 102)
            ]
        );
        let s = rig.stats.snapshot();
        assert_eq!(
            (s.rst_sent, s.connections_refused, s.connections_open),
            (3, 2, 0)
        );
    }

    /// A guest connection from port 100 to `port` that sent `ping`, with `rx_buffers` 4 KiB rx
    /// buffers posted (chain `i` at `BUFS + 0x10000 * (i + 1)`), processed by the device.
    fn connect_with_ping(
        rig: &mut Rig,
        port: u32,
        rx_buffers: u16,
    ) -> (VringRwLock, VringRwLock, MockSplitQueue<'static, GuestMem>) {
        let (txv, _txq, rxv, rxq) = connect_with_ping_queues(rig, port, rx_buffers);
        (txv, rxv, rxq)
    }

    /// The tx queue (as the device and as the guest sees it), then the rx queue.
    type Queues = (
        VringRwLock,
        MockSplitQueue<'static, GuestMem>,
        VringRwLock,
        MockSplitQueue<'static, GuestMem>,
    );

    /// [`connect_with_ping`], returning the tx queue too (chains 0 and 1 are taken).
    fn connect_with_ping_queues(rig: &mut Rig, port: u32, rx_buffers: u16) -> Queues {
        let (txv, txq) = vring(rig, TXQ_BASE);
        let (rxv, rxq) = vring(rig, RXQ_BASE);
        write_pkt(rig, BUFS, hdr(VSOCK_OP_REQUEST, 100, port, 0), b"");
        write_pkt(rig, BUFS + 0x1000, hdr(VSOCK_OP_RW, 100, port, 4), b"ping");
        push_chain(&txq, 0, &[d(BUFS, 44, 0, 0)]);
        push_chain(&txq, 1, &[d(BUFS + 0x1000, 48, 0, 0)]);
        for i in 0..rx_buffers {
            let at = BUFS + 0x10000 * (u64::from(i) + 1);
            push_chain(&rxq, i, &[d(at, 4096, VRING_DESC_F_WRITE as u16, 0)]);
        }
        rig.dev.process_tx(&txv);
        rig.dev.process_rx(&rxv);
        (txv, txq, rxv, rxq)
    }

    /// The queues of [`connect_with_ping_queues`] to the in-process port 11 (8 rx buffers), and
    /// the session, which has read the ping.
    fn session_after_ping(rig: &mut Rig) -> (Queues, crate::inproc::SessionEnd) {
        let queues = connect_with_ping_queues(rig, 11, 8);
        let session = rig.peers.1.lock().unwrap().pop().unwrap();
        let mut buf = [0u8; 4];
        (&session).read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        (queues, session)
    }

    #[test]
    fn data_flows_and_reset_closes_in_process_streams() {
        let mut rig = rig();
        let (_txv, rxv, rxq) = connect_with_ping(&mut rig, 7, 4);
        let mut peer = rig.peers.0.lock().unwrap().pop().unwrap();
        let mut buf = [0u8; 4];
        peer.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        peer.write_all(b"pong").unwrap();
        // The stream became readable: the inner epoll reports it.
        rig.dev.process_host_events(true);
        rig.dev.process_rx(&rxv);
        assert_eq!(used_idx(&rig, &rxq), 2);
        let h = rx_header(&rig, BUFS + 0x20000);
        assert_eq!((h.op, h.len), (VSOCK_OP_RW, 4));
        let mut data = [0u8; 4];
        rig.mem
            .memory()
            .read_slice(&mut data, GuestAddress(BUFS + 0x20000 + 44))
            .unwrap();
        assert_eq!(&data, b"pong");
        assert_eq!(rig.stats.snapshot().connections_open, 1);

        rig.dev.reset("test");
        let mut rest = Vec::new();
        peer.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "peer sees EOF after the reset");
        let s = rig.stats.snapshot();
        assert_eq!((s.connections_open, s.device_resets), (0, 1));
        assert_eq!(rig.dev.connection_count(), 0);
    }

    /// The payloads of the data packets the device returned in used entries `from..to` of
    /// `rxq`, whose chain `i` is the buffer at `BUFS + 0x10000 * (i + 1)`.
    fn rx_payloads(
        rig: &Rig,
        rxq: &MockSplitQueue<'_, GuestMem>,
        from: u16,
        to: u16,
    ) -> Vec<Vec<u8>> {
        (from..to)
            .filter_map(|i| {
                let (id, _) = used_len(rig, rxq, i % QSIZE);
                let at = BUFS + 0x10000 * (u64::from(id) + 1);
                let h = rx_header(rig, at);
                (h.op == VSOCK_OP_RW).then(|| {
                    let mut data = vec![0u8; h.len as usize];
                    rig.mem
                        .memory()
                        .read_slice(&mut data, GuestAddress(at + PKT_HEADER_SIZE as u64))
                        .unwrap();
                    data
                })
            })
            .collect()
    }

    /// A reply an in-process session left without telling the device (as an answerer's reply
    /// whose count the device never collected) is found by the periodic audit, delivered,
    /// counted and logged; a reply announced as usual is not taken for a lost one.
    #[test]
    fn the_audit_delivers_a_reply_whose_wake_up_was_lost() {
        use vgpu_proto::frame::FrameRing;
        let mut rig = rig();
        let ((_, _, rxv, rxq), session) = session_after_ping(&mut rig);

        // Announced: the eventfd is pending, so the audit leaves it to the event.
        let before = used_idx(&rig, &rxq);
        (&session).write_all(b"one").unwrap();
        rig.dev.audit_wakeups();
        assert_eq!(rig.stats.snapshot().lost_wakeups, 0);
        rig.dev.process_host_events(true);
        rig.dev.process_rx(&rxv);
        let after = used_idx(&rig, &rxq);
        assert_eq!(rx_payloads(&rig, &rxq, before, after), [b"one".to_vec()]);
        // Reading the eventfd made it writable, which reports once more (`OUT`): take that too.
        rig.dev.process_host_events(true);
        rig.dev.process_rx(&rxv);
        let after = used_idx(&rig, &rxq);

        // Not announced: nothing moves until the audit's timer fires.
        assert_eq!(session.write_here(b"pong").unwrap(), 4);
        rig.dev.process_host_events(true);
        rig.dev.process_rx(&rxv);
        let before = after;
        let after = used_idx(&rig, &rxq);
        assert!(
            rx_payloads(&rig, &rxq, before, after).is_empty(),
            "no event announced the reply"
        );
        std::thread::sleep(WAKEUP_AUDIT_INTERVAL + std::time::Duration::from_millis(200));
        rig.dev.process_host_events(true);
        rig.dev.process_rx(&rxv);
        let delivered = rx_payloads(&rig, &rxq, before, used_idx(&rig, &rxq));
        assert_eq!(
            delivered,
            [b"pong".to_vec()],
            "the audit delivered the reply"
        );
        assert_eq!(rig.stats.snapshot().lost_wakeups, 1);
    }

    /// A reply whose writer committed it but has not written the eventfd yet (preempted between
    /// the two, say by the device thread it unblocked) is not a lost wake-up: the audit leaves it
    /// to the write on its way, and takes it only if that is still on its way at the next audit.
    #[test]
    fn the_audit_leaves_a_reply_to_its_wake_up_on_the_way() {
        let mut rig = rig();
        let ((_, _, rxv, rxq), session) = session_after_ping(&mut rig);
        let deliver = |rig: &mut Rig, before: u16| {
            rig.dev.process_host_events(true);
            rig.dev.process_rx(&rxv);
            rx_payloads(rig, &rxq, before, used_idx(rig, &rxq))
        };

        let before = used_idx(&rig, &rxq);
        let announce = session.write_announcing_later(b"one");
        rig.dev.audit_wakeups();
        assert_eq!(
            rig.stats.snapshot().lost_wakeups,
            0,
            "its wake-up is on its way"
        );
        announce();
        assert_eq!(deliver(&mut rig, before), [b"one".to_vec()]);
        // Reading the eventfd made it writable, which reports once more (`OUT`).
        let before = used_idx(&rig, &rxq);
        assert!(deliver(&mut rig, before).is_empty());

        let _never = session.write_announcing_later(b"two");
        rig.dev.audit_wakeups();
        assert_eq!(rig.stats.snapshot().lost_wakeups, 0);
        rig.dev.audit_wakeups();
        assert_eq!(
            rig.stats.snapshot().lost_wakeups,
            1,
            "still on its way a second later: lost"
        );
        assert_eq!(deliver(&mut rig, before), [b"two".to_vec()]);
    }

    /// An answerer waiting for the rest of a frame: writes towards the session do not wake it.
    struct WantsMore;

    impl vgpu_proto::frame::AnswerHere for WantsMore {
        fn answer_here(&self) -> vgpu_proto::frame::Answered {
            vgpu_proto::frame::Answered {
                calls: 0,
                wake_reader: false,
            }
        }
    }

    /// A session asleep with unread bytes is woken by the audit only when it finds the same
    /// bytes at two audits in a row, nothing written towards the session or read in between:
    /// bytes that came since the last audit brought their own wake-up, which may still be on its
    /// way to a thread that has not run yet.
    #[test]
    fn the_audit_wakes_a_session_asleep_on_the_same_bytes_only() {
        use vgpu_proto::frame::FrameRing;
        let mut rig = rig();
        let ((txv, txq, _, _), session) = session_after_ping(&mut rig);
        let session = Arc::new(session);
        let answerer: Arc<dyn vgpu_proto::frame::AnswerHere> = Arc::new(WantsMore);
        session.answer_with(Arc::downgrade(&answerer));
        // Asleep before the bytes come.
        let woken = session.waiter();
        let mut next = 2;
        let mut send = |rig: &mut Rig, data: &[u8]| {
            let at = BUFS + 0x1000 * (u64::from(next) + 1);
            let len = u32::try_from(data.len()).unwrap();
            write_pkt(rig, at, hdr(VSOCK_OP_RW, 100, 11, len), data);
            push_chain(&txq, next, &[d(at, 44 + len, 0, 0)]);
            next += 1;
            rig.dev.process_tx(&txv);
        };
        send(&mut rig, b"ab");
        rig.dev.audit_wakeups();
        // As many unread bytes at the next audit, but others: read (here by this thread), and
        // new ones written.
        session.consume(2);
        send(&mut rig, b"cd");
        rig.dev.audit_wakeups();
        assert_eq!(rig.stats.snapshot().lost_wakeups, 0, "new bytes since");
        assert!(woken.try_recv().is_err(), "the session still sleeps");
        rig.dev.audit_wakeups();
        assert_eq!(rig.stats.snapshot().lost_wakeups, 1, "the same bytes");
        assert_eq!(
            woken.recv_timeout(std::time::Duration::from_secs(10)),
            Ok(true),
            "the audit woke the session"
        );
    }

    /// A tx chain the guest published without a kick reaching the device (and none on its way)
    /// is found by the second audit that sees it: the backend then looks at the tx queue itself.
    #[test]
    fn the_audit_processes_tx_chains_whose_kick_was_lost() {
        use vhost_user_backend::VhostUserBackend;
        let rig = rig();
        let (txv, txq) = vring(&rig, TXQ_BASE);
        let (rxv, rxq) = vring(&rig, RXQ_BASE);
        write_pkt(&rig, BUFS, hdr(VSOCK_OP_REQUEST, 100, 7, 0), b"");
        push_chain(&txq, 0, &[d(BUFS, 44, 0, 0)]);
        let rx_buf = BUFS + 0x10000;
        push_chain(&rxq, 0, &[d(rx_buf, 4096, VRING_DESC_F_WRITE as u16, 0)]);
        let used = |q: &MockSplitQueue<'_, GuestMem>| -> u16 {
            rig.mem
                .memory()
                .read_obj(used_ring(q).unchecked_add(2))
                .unwrap()
        };
        let backend = crate::backend::VsockBackend::new(
            VsockDevice::new(
                CID,
                4096,
                rig._dir.path().join("w.sock"),
                rig.peers.clone(),
                rig.stats.clone(),
                None,
            )
            .unwrap(),
            CID,
            QSIZE,
        )
        .unwrap();
        backend.update_memory(rig.mem.clone()).unwrap();
        let vrings = [rxv, txv];
        backend
            .handle_event(crate::BACKEND_EVENT, EventSet::IN, &vrings, 0)
            .unwrap();
        assert_eq!(used(&txq), 0, "nothing announced the chain yet");
        // The first audit that sees it leaves it (the guest may be about to kick), the next one
        // takes it.
        let audit = || {
            std::thread::sleep(WAKEUP_AUDIT_INTERVAL + std::time::Duration::from_millis(200));
            backend
                .handle_event(crate::BACKEND_EVENT, EventSet::IN, &vrings, 0)
                .unwrap();
        };
        audit();
        assert_eq!(used(&txq), 0, "the first audit leaves it");
        audit();
        assert_eq!(used(&txq), 1, "the audit took the chain");
        assert_eq!(used(&rxq), 1, "and the device answered it");
        assert_eq!(rx_header(&rig, rx_buf).op, VSOCK_OP_RESPONSE);
        assert_eq!(rig.stats.snapshot().lost_wakeups, 1);
    }

    #[test]
    fn a_long_rx_burst_signals_the_guest_before_its_end() {
        const BUFFERS: u16 = 40;
        const PAYLOAD: usize = 4096 - PKT_HEADER_SIZE;
        let mut rig = rig();
        let (txv, txq) = vring(&rig, TXQ_BASE);
        let (rxv, rxq) = vring_of(&rig, RXQ_BASE, 64);
        // Each signal writes to the call file: a pipe counts them.
        let (mut calls, call) = std::io::pipe().unwrap();
        rxv.set_call(Some(std::fs::File::from(OwnedFd::from(call))));
        let mut req = hdr(VSOCK_OP_REQUEST, 100, 7, 0);
        req.buf_alloc = 1 << 20;
        write_pkt(&rig, BUFS, req, b"");
        push_chain(&txq, 0, &[d(BUFS, 44, 0, 0)]);
        for i in 0..BUFFERS {
            let at = BUFS + 0x10000 * (u64::from(i) + 1);
            push_chain(&rxq, i, &[d(at, 4096, VRING_DESC_F_WRITE as u16, 0)]);
        }
        rig.dev.process_tx(&txv);
        rig.dev.process_rx(&rxv);
        assert_eq!(used_idx(&rig, &rxq), 1, "the RESPONSE");
        let mut peer = rig.peers.0.lock().unwrap().pop().unwrap();
        peer.write_all(&vec![7u8; PAYLOAD * usize::from(BUFFERS - 1)])
            .unwrap();
        rig.dev.process_host_events(true);
        rig.dev.process_rx(&rxv);
        assert_eq!(used_idx(&rig, &rxq), BUFFERS, "every buffer filled");
        drop(rxv);
        let mut bytes = Vec::new();
        calls.read_to_end(&mut bytes).unwrap();
        let signals = bytes.len() / std::mem::size_of::<u64>();
        // One for the RESPONSE, one every RX_SIGNAL_EVERY buffers of the burst, one at its end.
        let burst = usize::from(BUFFERS - 1);
        assert_eq!(signals, 1 + burst / RX_SIGNAL_EVERY + 1, "{bytes:?}");
    }

    /// A queue smaller than `RX_SIGNAL_EVERY`: the device publishes its used entries once a
    /// ring's worth is written, and every entry returns the chain it filled.
    #[test]
    fn a_small_rx_queue_gets_its_entries_before_a_ring_is_written() {
        const SIZE: u16 = 8;
        const PAYLOAD: usize = 4096 - PKT_HEADER_SIZE;
        let mut rig = rig();
        let (txv, txq) = vring(&rig, TXQ_BASE);
        let (rxv, rxq) = vring_of(&rig, RXQ_BASE, SIZE);
        let mut req = hdr(VSOCK_OP_REQUEST, 100, 7, 0);
        req.buf_alloc = 1 << 20;
        write_pkt(&rig, BUFS, req, b"");
        push_chain(&txq, 0, &[d(BUFS, 44, 0, 0)]);
        let rx_at = |i: u16| BUFS + 0x10000 * (u64::from(i) + 1);
        for i in 0..SIZE {
            push_chain(&rxq, i, &[d(rx_at(i), 4096, VRING_DESC_F_WRITE as u16, 0)]);
        }
        rig.dev.process_tx(&txv);
        let mut peer = rig.peers.0.lock().unwrap().pop().unwrap();
        peer.write_all(&vec![7u8; PAYLOAD * usize::from(SIZE)])
            .unwrap();
        rig.dev.process_host_events(true);
        rig.dev.process_rx(&rxv);
        assert_eq!(used_idx(&rig, &rxq), SIZE, "the RESPONSE and seven packets");
        for i in 0..SIZE {
            let (id, len) = used_len(&rig, &rxq, i);
            let h = rx_header(&rig, rx_at(i));
            let want = if i == 0 {
                (VSOCK_OP_RESPONSE, 0)
            } else {
                (VSOCK_OP_RW, PAYLOAD)
            };
            assert_eq!((h.op, h.len as usize), want, "buffer {i}");
            assert_eq!((id, len as usize), (u32::from(i), PKT_HEADER_SIZE + want.1));
        }
        assert!(rig.dev.has_rx_work(), "one packet still owed");
    }

    /// Runs `f` on another thread and fails the test if it does not finish promptly.
    fn must_finish(f: impl FnOnce() -> Rig + Send + 'static) -> Rig {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()).unwrap());
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("queue processing spun on a corrupt ring")
    }

    /// An avail index more than a queue size ahead makes virtio-queue refuse the ring; the device
    /// must neither spin (EVENT_IDX keeps reporting "more") nor touch other state.
    #[test]
    fn corrupt_avail_index_does_not_spin() {
        let mut rig = rig();
        rig.dev.set_event_idx(true);
        let (txv, txq) = vring(&rig, TXQ_BASE);
        let (rxv, rxq) = vring(&rig, RXQ_BASE);
        txv.set_queue_event_idx(true);
        rxv.set_queue_event_idx(true);
        let bogus = QSIZE * 3;
        let m = rig.mem.memory();
        m.write_obj(bogus, txq.avail_addr().unchecked_add(2))
            .unwrap();
        m.write_obj(bogus, rxq.avail_addr().unchecked_add(2))
            .unwrap();
        // Give rx something to send: an RST for a packet to an unknown connection.
        rig.dev.queue_rst(&hdr(VSOCK_OP_RW, 1, 2, 0));
        let rig = must_finish(move || {
            rig.dev.process_tx(&txv);
            rig.dev.process_rx(&rxv);
            rig
        });
        assert_eq!(used_idx(&rig, &txq), 0);
        assert_eq!(used_idx(&rig, &rxq), 0);
        assert!(
            rig.dev.has_rx_work(),
            "the RST stays owed until the ring is usable"
        );
    }

    /// A header-only rx buffer cannot carry data: the device must neither spin nor stall; it
    /// fills the small buffer with a credit update and sends the data in the next one.
    #[test]
    fn header_only_rx_buffer_does_not_stall_the_device() {
        let mut rig = rig();
        let (txv, txq) = vring(&rig, TXQ_BASE);
        let (rxv, rxq) = vring(&rig, RXQ_BASE);
        write_pkt(&rig, BUFS, hdr(VSOCK_OP_REQUEST, 100, 7, 0), b"");
        push_chain(&txq, 0, &[d(BUFS, 44, 0, 0)]);
        push_chain(
            &rxq,
            0,
            &[d(BUFS + 0x10000, 4096, VRING_DESC_F_WRITE as u16, 0)],
        );
        rig.dev.process_tx(&txv);
        rig.dev.process_rx(&rxv);
        assert_eq!(rx_header(&rig, BUFS + 0x10000).op, VSOCK_OP_RESPONSE);
        let mut peer = rig.peers.0.lock().unwrap().pop().unwrap();
        peer.write_all(b"data").unwrap();
        push_chain(
            &rxq,
            1,
            &[d(BUFS + 0x20000, 44, VRING_DESC_F_WRITE as u16, 0)],
        );
        push_chain(
            &rxq,
            2,
            &[d(BUFS + 0x30000, 4096, VRING_DESC_F_WRITE as u16, 0)],
        );
        rig.dev.process_host_events(true);
        rig.dev.process_rx(&rxv);
        assert_eq!(used_idx(&rig, &rxq), 3);
        assert_eq!(used_len(&rig, &rxq, 1), (1, PKT_HEADER_SIZE as u32));
        assert_eq!(
            rx_header(&rig, BUFS + 0x20000).op,
            crate::packet::VSOCK_OP_CREDIT_UPDATE
        );
        let h = rx_header(&rig, BUFS + 0x30000);
        assert_eq!((h.op, h.len), (VSOCK_OP_RW, 4));
    }

    #[test]
    fn rx_without_buffers_keeps_work_pending_until_buffers_arrive() {
        let mut rig = rig();
        let (txv, txq) = vring(&rig, TXQ_BASE);
        let (rxv, rxq) = vring(&rig, RXQ_BASE);
        write_pkt(&rig, BUFS, hdr(VSOCK_OP_REQUEST, 100, 7, 0), b"");
        push_chain(&txq, 0, &[d(BUFS, 44, 0, 0)]);
        rig.dev.process_tx(&txv);
        rig.dev.process_rx(&rxv);
        assert_eq!(used_idx(&rig, &rxq), 0);
        push_chain(
            &rxq,
            0,
            &[d(BUFS + 0x10000, 4096, VRING_DESC_F_WRITE as u16, 0)],
        );
        rig.dev.process_rx(&rxv);
        assert_eq!(used_idx(&rig, &rxq), 1);
        assert_eq!(rx_header(&rig, BUFS + 0x10000).op, VSOCK_OP_RESPONSE);
        assert_eq!(rig.dev.connection_count(), 1);

        // Graceful close from the guest: the device confirms with an RST once a buffer exists.
        let mut sd = hdr(VSOCK_OP_SHUTDOWN, 100, 7, 0);
        sd.flags = VSOCK_SHUTDOWN_BOTH;
        write_pkt(&rig, BUFS + 0x1000, sd, b"");
        push_chain(&txq, 1, &[d(BUFS + 0x1000, 44, 0, 0)]);
        rig.dev.process_tx(&txv);
        rig.dev.process_rx(&rxv);
        assert_eq!(used_idx(&rig, &rxq), 1);
        push_chain(
            &rxq,
            1,
            &[d(BUFS + 0x20000, 4096, VRING_DESC_F_WRITE as u16, 0)],
        );
        rig.dev.process_rx(&rxv);
        assert_eq!(used_idx(&rig, &rxq), 2);
        assert_eq!(rx_header(&rig, BUFS + 0x20000).op, VSOCK_OP_RST);
        assert_eq!(rig.dev.connection_count(), 0);
    }
}
