//! One vsock stream connection between a guest socket and a host-side unix stream.
//!
//! The connection owns the host stream (a forwarded `<uds_path>_<port>` socket, an accepted
//! hybrid-vsock client, or an in-process stream from the [`PortConnector`](super::PortConnector))
//! and implements the virtio-vsock flow control for both directions:
//!
//! * guest → host: we advertise `buf_alloc` and report `fwd_cnt` (bytes written to the host
//!   stream). Bytes the stream does not accept immediately wait in `tx_buf`, which therefore never
//!   holds more than `buf_alloc` bytes for an honest guest; a guest that overruns the credit it
//!   was given is reset.
//! * host → guest: we never send more than the guest's credit
//!   (`peer_buf_alloc - (rx_cnt - peer_fwd_cnt)`); when it is exhausted the stream is simply not
//!   read, so the host writer is throttled by its socket buffer.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::Shutdown;
use std::num::Wrapping;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use tracing::{debug, warn};
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{ReadVolatile, VolatileMemoryError, VolatileSlice, WriteVolatile};
use vmm_sys_util::epoll::EventSet;

use super::VsockStats;
use super::inproc::{DeviceEnd, RingAudit};
use super::packet::{
    ChainBuffer, GuestMem, MAX_PKT_PAYLOAD, PKT_HEADER_SIZE, PacketHeader, TxPacket,
    VSOCK_HOST_CID, VSOCK_OP_CREDIT_REQUEST, VSOCK_OP_CREDIT_UPDATE, VSOCK_OP_REQUEST,
    VSOCK_OP_RESPONSE, VSOCK_OP_RST, VSOCK_OP_RW, VSOCK_OP_SHUTDOWN, VSOCK_SHUTDOWN_BOTH,
    VSOCK_SHUTDOWN_RCV, VSOCK_SHUTDOWN_SEND, VSOCK_TYPE_STREAM,
};

/// A credit update is sent once the guest believes less than `buf_alloc / CREDIT_UPDATE_DIVISOR`
/// of our buffer is free while we have in fact freed more.
const CREDIT_UPDATE_DIVISOR: u32 = 2;

/// An emptied `tx_buf` keeps at most this much capacity, so idle connections hold little memory.
const TX_BUF_KEEP_CAPACITY: usize = 16 * 1024;

/// A wake-up the device's audit found missing on a connection ([`Connection::recover_wakeup`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostWakeup {
    /// The session's output waited while the connection was not marked readable.
    Output,
    /// Guest bytes waited for room that the ring towards the session had.
    Room,
    /// The connection owed the guest packets but was not queued for the rx queue.
    Schedule,
    /// The session slept with unread bytes that had not changed since the last audit.
    Session,
}

impl LostWakeup {
    /// What was lost, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            LostWakeup::Output => "the session's reply was never announced to the device",
            LostWakeup::Room => "room for the guest's bytes was never announced to the device",
            LostWakeup::Schedule => "the connection was never queued for the rx queue",
            LostWakeup::Session => "the session slept with unread bytes",
        }
    }
}

/// What the device's audit found on a connection ([`Connection::recover_wakeup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WakeupFinding {
    /// The wake-up that was lost.
    pub lost: LostWakeup,
    /// Where an in-process endpoint's rings stood.
    pub rings: Option<RingAudit>,
    /// Where the session's thread was before the audit made up for the wake-up
    /// ([`RingAudit::waiter_where`]): asleep, or runnable but not yet run.
    pub waiter: Option<String>,
}

/// The host side of a connection: a unix stream (forwarded ports, host clients, or a stream a
/// [`PortConnector`](super::PortConnector) hands over) or an in-process endpoint whose bytes move
/// through shared rings ([`crate::inproc`]).
#[derive(Debug)]
pub enum Endpoint {
    /// A nonblocking unix stream.
    Stream(UnixStream),
    /// The device's end of an in-process connection.
    InProcess(DeviceEnd),
}

impl From<UnixStream> for Endpoint {
    fn from(s: UnixStream) -> Self {
        Endpoint::Stream(s)
    }
}

impl From<DeviceEnd> for Endpoint {
    fn from(d: DeviceEnd) -> Self {
        Endpoint::InProcess(d)
    }
}

impl Endpoint {
    /// Makes a unix stream nonblocking (an in-process endpoint always is).
    pub fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Endpoint::Stream(s) => s.set_nonblocking(true),
            Endpoint::InProcess(_) => Ok(()),
        }
    }

    fn shutdown_write(&self) {
        match self {
            Endpoint::Stream(s) => {
                let _ = s.shutdown(Shutdown::Write);
            }
            Endpoint::InProcess(d) => d.shutdown_write(),
        }
    }

    /// Whether the peer is gone entirely (not just done writing).
    fn hung_up(&self) -> bool {
        match self {
            Endpoint::Stream(s) => {
                let mut pfd = libc::pollfd {
                    fd: s.as_raw_fd(),
                    events: 0,
                    revents: 0,
                };
                // SAFETY: `pfd` is a valid pollfd for an fd we own; nfds is 1 and the timeout is
                // zero.
                let ret = unsafe { libc::poll(&mut pfd, 1, 0) };
                ret > 0 && pfd.revents & libc::POLLHUP != 0
            }
            Endpoint::InProcess(d) => d.peer_gone(),
        }
    }
}

impl AsRawFd for Endpoint {
    /// The fd to watch: the socket, or the eventfd of an in-process endpoint.
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Endpoint::Stream(s) => s.as_raw_fd(),
            Endpoint::InProcess(d) => d.as_raw_fd(),
        }
    }
}

impl Write for &Endpoint {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Endpoint::Stream(s) => (&*s).write(buf),
            Endpoint::InProcess(d) => (&*d).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl WriteVolatile for &Endpoint {
    fn write_volatile<B: BitmapSlice>(
        &mut self,
        buf: &VolatileSlice<B>,
    ) -> Result<usize, VolatileMemoryError> {
        match self {
            Endpoint::Stream(s) => (&*s).write_volatile(buf),
            Endpoint::InProcess(d) => (&*d).write_volatile(buf),
        }
    }
}

impl ReadVolatile for &Endpoint {
    fn read_volatile<B: BitmapSlice>(
        &mut self,
        buf: &mut VolatileSlice<B>,
    ) -> Result<usize, VolatileMemoryError> {
        match self {
            Endpoint::Stream(s) => (&*s).read_volatile(buf),
            Endpoint::InProcess(d) => (&*d).read_volatile(buf),
        }
    }
}

/// Identifies a connection: our (host-side) port and the guest's port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnKey {
    /// Host-side port (the port the guest connected to, or the port we allocated).
    pub local_port: u32,
    /// Guest-side port.
    pub peer_port: u32,
}

/// Where the host side of a connection lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Guest connected; the port was forwarded to `<uds_path>_<port>`.
    Forwarded,
    /// Guest connected; the port is served in-process by the [`PortConnector`](super::PortConnector).
    InProcess,
    /// A host client connected to `uds_path` and asked for a guest port.
    HostInitiated,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Host-initiated: REQUEST queued or sent, waiting for the guest's RESPONSE.
    Connecting,
    /// Data may flow.
    Established,
}

/// A vsock connection and its flow-control state.
#[derive(Debug)]
pub struct Connection {
    key: ConnKey,
    token: u64,
    stream: Endpoint,
    origin: Origin,
    state: State,
    guest_cid: u64,
    /// Our receive buffer size, advertised to the guest.
    buf_alloc: u32,

    // Packets we owe the guest.
    want_request: bool,
    want_response: bool,
    want_rst: bool,
    want_credit_update: bool,
    want_credit_request: bool,
    want_shutdown: u32,

    // Host stream state.
    readable: bool,
    stream_eof: bool,
    shutdown_sent: u32,
    stream_write_closed: bool,
    /// `OK <port>\n` owed to a host-initiated client once the guest accepts.
    connect_ack: Vec<u8>,

    // Guest → host.
    tx_buf: VecDeque<u8>,
    recv_cnt: Wrapping<u32>,
    fwd_cnt: Wrapping<u32>,
    last_reported_fwd: Wrapping<u32>,
    peer_shutdown: u32,

    // Host → guest.
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    rx_cnt: Wrapping<u32>,
    credit_request_sent: bool,

    /// The connection is finished and must be removed without sending anything more.
    closed: bool,
    /// The connection sits in the device's pending-rx queue.
    pub in_pending: bool,
    /// Bytes the session had unread while it slept at the last audit (`recover_wakeup`), and
    /// how many writes towards it had been settled by then: the same bytes only if both match.
    sleeping_on: Option<(usize, u64)>,
    /// The output wake-up the last audit found on its way (its count), if any: still on its way
    /// at the next audit, it was lost.
    wake_in_flight: Option<u64>,
}

impl Connection {
    fn new(
        key: ConnKey,
        token: u64,
        stream: Endpoint,
        origin: Origin,
        guest_cid: u64,
        buf_alloc: u32,
    ) -> Self {
        Connection {
            key,
            token,
            stream,
            origin,
            state: State::Established,
            guest_cid,
            buf_alloc,
            want_request: false,
            want_response: false,
            want_rst: false,
            want_credit_update: false,
            want_credit_request: false,
            want_shutdown: 0,
            readable: false,
            stream_eof: false,
            shutdown_sent: 0,
            stream_write_closed: false,
            connect_ack: Vec::new(),
            tx_buf: VecDeque::new(),
            recv_cnt: Wrapping(0),
            fwd_cnt: Wrapping(0),
            last_reported_fwd: Wrapping(0),
            peer_shutdown: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            rx_cnt: Wrapping(0),
            credit_request_sent: false,
            closed: false,
            in_pending: false,
            sleeping_on: None,
            wake_in_flight: None,
        }
    }

    /// A connection the guest asked for with `request`; a RESPONSE is owed.
    pub fn guest_initiated(
        request: &PacketHeader,
        token: u64,
        stream: Endpoint,
        origin: Origin,
        guest_cid: u64,
        buf_alloc: u32,
    ) -> Self {
        let key = ConnKey {
            local_port: request.dst_port,
            peer_port: request.src_port,
        };
        let mut conn = Self::new(key, token, stream, origin, guest_cid, buf_alloc);
        conn.want_response = true;
        conn.update_peer_credit(request);
        conn
    }

    /// A connection a host client asked for; a REQUEST is owed and `OK <local_port>` is written
    /// to the client once the guest accepts.
    pub fn host_initiated(
        key: ConnKey,
        token: u64,
        stream: UnixStream,
        guest_cid: u64,
        buf_alloc: u32,
    ) -> Self {
        let mut conn = Self::new(
            key,
            token,
            stream.into(),
            Origin::HostInitiated,
            guest_cid,
            buf_alloc,
        );
        conn.state = State::Connecting;
        conn.want_request = true;
        conn
    }

    /// The connection's key.
    pub fn key(&self) -> ConnKey {
        self.key
    }

    /// The epoll token of the host stream.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Where the host side lives.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// The host stream.
    pub fn stream(&self) -> &Endpoint {
        &self.stream
    }

    /// Whether the connection is finished and must be dropped.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Bytes of guest data waiting for the host stream.
    #[cfg(test)]
    pub fn buffered(&self) -> usize {
        self.tx_buf.len()
    }

    /// Bytes the guest may still send us without overrunning our buffer, as the guest sees it.
    fn guest_view_free(&self) -> u32 {
        let used = (self.recv_cnt - self.last_reported_fwd).0;
        self.buf_alloc.saturating_sub(used)
    }

    /// Bytes we may still send the guest.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = (self.rx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    fn update_peer_credit(&mut self, h: &PacketHeader) {
        let before = self.peer_credit();
        self.peer_buf_alloc = h.buf_alloc;
        self.peer_fwd_cnt = Wrapping(h.fwd_cnt);
        if self.peer_credit() > before {
            self.credit_request_sent = false;
        }
    }

    fn can_send_data(&self) -> bool {
        self.state == State::Established
            && self.readable
            && !self.stream_eof
            && self.peer_shutdown & VSOCK_SHUTDOWN_RCV == 0
            && !self.want_rst
    }

    /// Whether the connection has a packet for the rx queue.
    pub fn has_rx_work(&self) -> bool {
        if self.closed {
            return false;
        }
        self.want_rst
            || self.want_request
            || self.want_response
            || self.want_shutdown != 0
            || self.want_credit_request
            || self.want_credit_update
            || (self.can_send_data() && (self.peer_credit() > 0 || !self.credit_request_sent))
    }

    /// Looks for a wake-up an in-process endpoint owed the device, or the device owed it, that
    /// never came, and makes up for it (the device's periodic audit): output the device was not
    /// told of, room for buffered guest bytes, packets owed without a place in the rx queue, or
    /// a session asleep with the same unread bytes as at the last audit. Returns what was lost
    /// and where the rings stood (and, if `describe`, where the session's thread was); `None`
    /// when nothing was (or a wake-up is still on its way).
    pub fn recover_wakeup(&mut self, stats: &VsockStats, describe: bool) -> Option<WakeupFinding> {
        if self.closed {
            return None;
        }
        let Endpoint::InProcess(d) = &self.stream else {
            return (self.has_rx_work() && !self.in_pending).then_some(WakeupFinding {
                lost: LostWakeup::Schedule,
                rings: None,
                waiter: None,
            });
        };
        let a = d.audit();
        // A wake-up on its way at two audits in a row (the same one) was lost after all.
        let in_flight = a.wake_in_flight.then_some(a.output_wakes_owed);
        let before = std::mem::replace(&mut self.wake_in_flight, in_flight);
        if a.event_pending || (in_flight.is_some() && before != in_flight) {
            // The device reads the change on its next event.
            self.sleeping_on = None;
            return None;
        }
        // New bytes since the last audit (each write towards the session is settled) mean a new
        // wake-up, perhaps still on its way to a thread that has not run yet.
        let sleeping_on = (a.session_waiting && !a.reader_lent && a.to_session > 0)
            .then_some((a.to_session, a.last_settle.count));
        let stale = sleeping_on.is_some()
            && std::mem::replace(&mut self.sleeping_on, sleeping_on) == sleeping_on;
        let lost = if a.has_output() && !self.readable && self.state == State::Established {
            LostWakeup::Output
        } else if !self.tx_buf.is_empty() && a.to_session_free > 0 && !a.ending {
            LostWakeup::Room
        } else if self.has_rx_work() && !self.in_pending {
            LostWakeup::Schedule
        } else if stale {
            LostWakeup::Session
        } else {
            return None;
        };
        // Read (from /proc) only for a finding that is logged, before the make-up below wakes
        // anyone.
        let waiter = describe.then(|| a.waiter_where());
        match lost {
            LostWakeup::Output => self.readable = true,
            LostWakeup::Room => self.flush(stats),
            LostWakeup::Schedule => {}
            LostWakeup::Session => {
                d.wake_session();
                self.sleeping_on = None;
            }
        }
        Some(WakeupFinding {
            lost,
            rings: Some(a),
            waiter,
        })
    }

    /// Aborts the connection: an RST is owed to the guest (unless it still knows nothing of it).
    pub fn reset(&mut self) {
        if self.state == State::Connecting && self.want_request {
            // The guest never heard of this connection.
            self.closed = true;
        } else {
            self.want_rst = true;
        }
    }

    /// Applies a packet the guest sent on this connection.
    pub fn on_packet(&mut self, mem: &GuestMem, pkt: &TxPacket, stats: &VsockStats) {
        let h = &pkt.header;
        if self.want_rst || self.closed {
            return;
        }
        self.update_peer_credit(h);
        match h.op {
            VSOCK_OP_RST => {
                debug!(
                    local_port = self.key.local_port,
                    peer_port = self.key.peer_port,
                    "guest reset the connection"
                );
                self.closed = true;
            }
            VSOCK_OP_RESPONSE => {
                if self.state == State::Connecting && !self.want_request {
                    self.state = State::Established;
                    self.connect_ack = format!("OK {}\n", self.key.local_port).into_bytes();
                    // Data the client wrote after its CONNECT line arrived while we were not
                    // reading; look for it now.
                    self.readable = true;
                    self.flush(stats);
                } else {
                    warn!(
                        local_port = self.key.local_port,
                        peer_port = self.key.peer_port,
                        "unexpected RESPONSE from the guest; resetting"
                    );
                    self.reset();
                }
            }
            VSOCK_OP_REQUEST => {
                warn!(
                    local_port = self.key.local_port,
                    peer_port = self.key.peer_port,
                    "REQUEST for an existing connection; resetting"
                );
                self.reset();
            }
            VSOCK_OP_SHUTDOWN => {
                self.peer_shutdown |= h.flags & VSOCK_SHUTDOWN_BOTH;
                self.apply_peer_shutdown();
            }
            VSOCK_OP_RW => self.on_guest_data(mem, pkt, stats),
            VSOCK_OP_CREDIT_UPDATE => {}
            VSOCK_OP_CREDIT_REQUEST => self.want_credit_update = true,
            other => {
                warn!(
                    op = other,
                    "unknown vsock operation from the guest; resetting"
                );
                self.reset();
            }
        }
    }

    fn on_guest_data(&mut self, mem: &GuestMem, pkt: &TxPacket, stats: &VsockStats) {
        let len = pkt.header.len;
        if self.state != State::Established || self.peer_shutdown & VSOCK_SHUTDOWN_SEND != 0 {
            warn!(
                local_port = self.key.local_port,
                peer_port = self.key.peer_port,
                "data on a connection that cannot carry it; resetting"
            );
            self.reset();
            return;
        }
        if len == 0 {
            return;
        }
        let new_recv = self.recv_cnt + Wrapping(len);
        if (new_recv - self.last_reported_fwd).0 > self.buf_alloc {
            tracing::error!(
                local_port = self.key.local_port,
                peer_port = self.key.peer_port,
                len,
                credit = self.guest_view_free(),
                "guest sent more data than its credit allows; resetting the connection"
            );
            self.reset();
            return;
        }
        self.recv_cnt = new_recv;
        let mut offset = PKT_HEADER_SIZE;
        let mut left = len as usize;
        if self.tx_buf.is_empty() && self.connect_ack.is_empty() {
            match pkt
                .buffer
                .write_to_stream(mem, offset, left, &mut &self.stream)
            {
                Ok(io) => {
                    self.forwarded(io.bytes, stats);
                    offset += io.bytes;
                    left -= io.bytes;
                }
                Err(e) => {
                    debug!(local_port = self.key.local_port, error = %e, "host stream write failed; resetting");
                    self.reset();
                    return;
                }
            }
        }
        if left > 0
            && let Err(e) = pkt.buffer.append_to(mem, offset, left, &mut self.tx_buf)
        {
            tracing::error!(error = %e, "cannot read guest data; resetting the connection");
            self.reset();
        }
        self.collect_answers(stats);
        self.maybe_credit_update();
    }

    /// Replies an in-process endpoint's answerer wrote while this thread wrote to it: read them
    /// now, no eventfd announced them. Counts the bytes a lending reader took meanwhile.
    fn collect_answers(&mut self, stats: &VsockStats) {
        if let Endpoint::InProcess(d) = &self.stream {
            stats.add_bytes_lent_in_place(d.take_lent_bytes());
            let answered = d.take_answered();
            if answered > 0 {
                stats.add_calls_on_device_thread(answered as u64);
                self.readable = true;
            }
        }
    }

    fn forwarded(&mut self, n: usize, stats: &VsockStats) {
        if n > 0 {
            self.fwd_cnt += Wrapping(n as u32);
            stats.add_guest_to_host(n as u64);
        }
    }

    fn maybe_credit_update(&mut self) {
        if self.fwd_cnt != self.last_reported_fwd
            && self.guest_view_free() < self.buf_alloc / CREDIT_UPDATE_DIVISOR
        {
            self.want_credit_update = true;
        }
    }

    fn apply_peer_shutdown(&mut self) {
        if !self.tx_buf.is_empty() || !self.connect_ack.is_empty() {
            // Finish delivering what the guest already sent; `flush` comes back here.
            return;
        }
        if self.peer_shutdown & VSOCK_SHUTDOWN_SEND != 0 && !self.stream_write_closed {
            self.stream.shutdown_write();
            self.stream_write_closed = true;
        }
        if self.peer_shutdown == VSOCK_SHUTDOWN_BOTH {
            // The guest is done in both directions and all its data is delivered: confirm with
            // an RST, which ends the connection on both sides.
            self.want_rst = true;
        }
    }

    /// Writes buffered guest data to the host stream as far as it accepts it.
    pub fn flush(&mut self, stats: &VsockStats) {
        while !self.connect_ack.is_empty() {
            match (&self.stream).write(&self.connect_ack) {
                Ok(0) => {
                    self.reset();
                    return;
                }
                Ok(n) => {
                    self.connect_ack.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!(local_port = self.key.local_port, error = %e, "host client went away before OK; resetting");
                    self.reset();
                    return;
                }
            }
        }
        while !self.tx_buf.is_empty() {
            let (front, _) = self.tx_buf.as_slices();
            match (&self.stream).write(front) {
                Ok(0) => {
                    self.reset();
                    return;
                }
                Ok(n) => {
                    self.tx_buf.drain(..n);
                    self.forwarded(n, stats);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!(local_port = self.key.local_port, error = %e, "host stream write failed; resetting");
                    self.reset();
                    return;
                }
            }
        }
        if self.tx_buf.is_empty() && self.tx_buf.capacity() > TX_BUF_KEEP_CAPACITY {
            self.tx_buf = VecDeque::new();
        }
        self.collect_answers(stats);
        self.maybe_credit_update();
        if self.peer_shutdown != 0 {
            self.apply_peer_shutdown();
        }
    }

    /// Reacts to readiness of the host stream (edge-triggered).
    pub fn on_stream_event(&mut self, events: EventSet, stats: &VsockStats) {
        let events = match &self.stream {
            Endpoint::Stream(_) => events,
            Endpoint::InProcess(d) => {
                // One eventfd stands for every change: the session wrote, freed room, or left.
                d.clear_event();
                EventSet::IN | EventSet::OUT
            }
        };
        if events.intersects(EventSet::OUT | EventSet::ERROR | EventSet::HANG_UP) {
            self.flush(stats);
        }
        if events
            .intersects(EventSet::IN | EventSet::READ_HANG_UP | EventSet::HANG_UP | EventSet::ERROR)
        {
            if self.state == State::Connecting
                && events.intersects(EventSet::READ_HANG_UP | EventSet::HANG_UP | EventSet::ERROR)
            {
                debug!(
                    local_port = self.key.local_port,
                    "host client left before the guest answered"
                );
                self.reset();
            }
            self.readable = true;
        }
    }

    fn header(&self, op: u16) -> PacketHeader {
        PacketHeader {
            src_cid: VSOCK_HOST_CID,
            dst_cid: self.guest_cid,
            src_port: self.key.local_port,
            dst_port: self.key.peer_port,
            len: 0,
            type_: VSOCK_TYPE_STREAM,
            op,
            flags: 0,
            buf_alloc: self.buf_alloc,
            fwd_cnt: self.fwd_cnt.0,
        }
    }

    /// Whether the peer of the host stream is gone entirely (not just done writing).
    fn stream_hung_up(&self) -> bool {
        self.stream.hung_up()
    }

    /// Produces the next packet for the guest into `rx` (payload at offset 44) and returns its
    /// header, or `None` when there is nothing to send right now.
    pub fn produce(
        &mut self,
        mem: &GuestMem,
        rx: &ChainBuffer,
        stats: &VsockStats,
    ) -> Option<PacketHeader> {
        if self.closed {
            return None;
        }
        let mut hdr = if self.want_rst {
            self.rst_packet(stats)
        } else if self.want_request {
            self.want_request = false;
            self.header(VSOCK_OP_REQUEST)
        } else if self.want_response {
            self.want_response = false;
            self.header(VSOCK_OP_RESPONSE)
        } else {
            // Data first; reading may also turn up end of file (SHUTDOWN) or an error (RST).
            match self.produce_data(mem, rx, stats) {
                Some(h) => h,
                None if self.want_rst => self.rst_packet(stats),
                None if self.want_shutdown != 0 => {
                    let mut h = self.header(VSOCK_OP_SHUTDOWN);
                    h.flags = self.want_shutdown;
                    self.shutdown_sent |= self.want_shutdown;
                    self.want_shutdown = 0;
                    h
                }
                None if self.want_credit_request => {
                    self.want_credit_request = false;
                    self.header(VSOCK_OP_CREDIT_REQUEST)
                }
                None if self.want_credit_update => self.header(VSOCK_OP_CREDIT_UPDATE),
                None => return None,
            }
        };
        // Every packet carries our buf_alloc and fwd_cnt, so it also serves as a credit update.
        hdr.fwd_cnt = self.fwd_cnt.0;
        self.last_reported_fwd = self.fwd_cnt;
        self.want_credit_update = false;
        Some(hdr)
    }

    fn rst_packet(&mut self, stats: &VsockStats) -> PacketHeader {
        self.want_rst = false;
        self.closed = true;
        stats.add_rst_sent();
        self.header(VSOCK_OP_RST)
    }

    fn produce_data(
        &mut self,
        mem: &GuestMem,
        rx: &ChainBuffer,
        stats: &VsockStats,
    ) -> Option<PacketHeader> {
        if !self.can_send_data() {
            return None;
        }
        let credit = self.peer_credit();
        if credit == 0 {
            if !self.credit_request_sent {
                self.credit_request_sent = true;
                self.want_credit_request = true;
            }
            return None;
        }
        let room = rx.len().saturating_sub(PKT_HEADER_SIZE);
        if room == 0 {
            // A header-only buffer cannot carry data; use it for a credit update (always
            // harmless) so the queue moves on to buffers that can.
            return Some(self.header(VSOCK_OP_CREDIT_UPDATE));
        }
        let max = room.min(credit as usize).min(MAX_PKT_PAYLOAD as usize);
        match rx.read_from_stream(mem, PKT_HEADER_SIZE, max, &mut &self.stream) {
            Ok(io) => {
                if io.would_block && io.bytes == 0 {
                    self.readable = false;
                }
                if io.eof {
                    self.stream_eof = true;
                    let mut flags = VSOCK_SHUTDOWN_SEND;
                    if self.stream_write_closed || self.stream_hung_up() {
                        flags |= VSOCK_SHUTDOWN_RCV;
                    }
                    self.want_shutdown |= flags & !self.shutdown_sent;
                }
                if io.bytes == 0 {
                    return None;
                }
                self.rx_cnt += Wrapping(io.bytes as u32);
                stats.add_host_to_guest(io.bytes as u64);
                if let Endpoint::InProcess(d) = &self.stream {
                    stats.add_bytes_filled_in_place(d.take_filled_bytes());
                }
                let mut h = self.header(VSOCK_OP_RW);
                h.len = io.bytes as u32;
                Some(h)
            }
            Err(e) => {
                debug!(local_port = self.key.local_port, error = %e, "host stream read failed; resetting");
                self.want_rst = true;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{VSOCK_OP_RW, VSOCK_SHUTDOWN_SEND};
    use std::io::Read;
    use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{RawDescriptor, split::Descriptor as SplitDescriptor};
    use vm_memory::{Bytes, GuestAddress};

    const GUEST_CID: u64 = 3;
    const TX_ADDR: u64 = 0x10_0000;
    const RX_ADDR: u64 = 0x20_0000;

    fn mem() -> GuestMem {
        GuestMem::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap()
    }

    fn guest_hdr(op: u16, len: u32, buf_alloc: u32, fwd_cnt: u32) -> PacketHeader {
        PacketHeader {
            src_cid: GUEST_CID,
            dst_cid: VSOCK_HOST_CID,
            src_port: 1234,
            dst_port: 5000,
            len,
            type_: VSOCK_TYPE_STREAM,
            op,
            flags: 0,
            buf_alloc,
            fwd_cnt,
        }
    }

    fn tx_packet(m: &GuestMem, h: PacketHeader, data: &[u8]) -> TxPacket {
        m.write_slice(&h.to_bytes(), GuestAddress(TX_ADDR)).unwrap();
        m.write_slice(data, GuestAddress(TX_ADDR + PKT_HEADER_SIZE as u64))
            .unwrap();
        let q = crate::packet::mock::queue(m);
        let chain = crate::packet::mock::chain(
            &q,
            &[RawDescriptor::from(SplitDescriptor::new(
                TX_ADDR,
                (PKT_HEADER_SIZE + data.len()) as u32,
                0,
                0,
            ))],
        );
        TxPacket::parse(chain, m).unwrap()
    }

    fn rx_buffer(m: &GuestMem, size: u32) -> ChainBuffer {
        let q = crate::packet::mock::queue(m);
        let chain = crate::packet::mock::chain(
            &q,
            &[RawDescriptor::from(SplitDescriptor::new(
                RX_ADDR,
                size,
                VRING_DESC_F_WRITE as u16,
                0,
            ))],
        );
        crate::packet::parse_rx_chain(chain, m).unwrap()
    }

    fn established(buf_alloc: u32, peer_buf_alloc: u32) -> (Connection, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let req = guest_hdr(VSOCK_OP_REQUEST, 0, peer_buf_alloc, 0);
        let mut c = Connection::guest_initiated(
            &req,
            1,
            ours.into(),
            Origin::Forwarded,
            GUEST_CID,
            buf_alloc,
        );
        let m = mem();
        let rx = rx_buffer(&m, 4096);
        let stats = VsockStats::default();
        assert_eq!(c.produce(&m, &rx, &stats).unwrap().op, VSOCK_OP_RESPONSE);
        assert!(!c.has_rx_work());
        (c, theirs)
    }

    #[test]
    fn guest_data_is_forwarded_and_counted() {
        let m = mem();
        let stats = VsockStats::default();
        let (mut c, mut peer) = established(4096, 4096);
        c.on_packet(
            &m,
            &tx_packet(&m, guest_hdr(VSOCK_OP_RW, 5, 4096, 0), b"hello"),
            &stats,
        );
        let mut buf = [0u8; 5];
        peer.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        assert_eq!(c.fwd_cnt.0, 5);
        assert_eq!(stats.snapshot().bytes_guest_to_host, 5);
        // Only 5 of 4096 bytes used: no credit update needed yet.
        assert!(!c.has_rx_work());
    }

    #[test]
    fn credit_overrun_resets_the_connection() {
        let m = mem();
        let stats = VsockStats::default();
        let (mut c, _peer) = established(8, 4096);
        c.on_packet(
            &m,
            &tx_packet(&m, guest_hdr(VSOCK_OP_RW, 9, 4096, 0), b"123456789"),
            &stats,
        );
        assert!(c.want_rst);
        let rx = rx_buffer(&m, 4096);
        assert_eq!(c.produce(&m, &rx, &stats).unwrap().op, VSOCK_OP_RST);
        assert!(c.is_closed());
    }

    #[test]
    fn unflushed_data_is_buffered_within_buf_alloc_and_credit_update_follows_the_flush() {
        let m = mem();
        let stats = VsockStats::default();
        let buf_alloc = 256 * 1024;
        let (mut c, mut peer) = established(buf_alloc, 4096);
        let chunk = vec![0xabu8; 60 * 1024];
        let mut sent = 0u32;
        // Fill the host socket until it stops accepting; the rest must wait in tx_buf.
        while sent + chunk.len() as u32 <= buf_alloc {
            c.on_packet(
                &m,
                &tx_packet(
                    &m,
                    guest_hdr(VSOCK_OP_RW, chunk.len() as u32, 4096, 0),
                    &chunk,
                ),
                &stats,
            );
            assert!(!c.want_rst);
            sent += chunk.len() as u32;
        }
        assert!(c.buffered() <= buf_alloc as usize);
        let forwarded_before = c.fwd_cnt.0;
        // Drain the peer, then flush: everything arrives and a credit update is owed if the
        // guest's view is low.
        let mut got = Vec::new();
        peer.set_nonblocking(true).unwrap();
        loop {
            let mut tmp = vec![0u8; 1 << 20];
            match peer.read(&mut tmp) {
                Ok(n) => got.extend_from_slice(&tmp[..n]),
                Err(_) => {
                    c.flush(&stats);
                    if c.buffered() == 0 {
                        match peer.read(&mut tmp) {
                            Ok(n) => got.extend_from_slice(&tmp[..n]),
                            Err(_) => break,
                        }
                    }
                }
            }
        }
        assert_eq!(got.len() as u32, sent);
        assert!(got.iter().all(|&b| b == 0xab));
        assert_eq!(c.fwd_cnt.0, sent);
        assert!(c.fwd_cnt.0 >= forwarded_before);
        assert!(
            c.has_rx_work(),
            "guest view of free space is low: credit update owed"
        );
        let rx = rx_buffer(&m, 4096);
        let h = c.produce(&m, &rx, &stats).unwrap();
        assert_eq!(h.op, VSOCK_OP_CREDIT_UPDATE);
        assert_eq!(h.fwd_cnt, sent);
        assert_eq!(h.buf_alloc, buf_alloc);
    }

    #[test]
    fn host_data_respects_guest_credit() {
        let m = mem();
        let stats = VsockStats::default();
        let (mut c, mut peer) = established(4096, 100);
        peer.write_all(&[7u8; 300]).unwrap();
        c.on_stream_event(EventSet::IN, &stats);
        let rx = rx_buffer(&m, 4096);
        let h = c.produce(&m, &rx, &stats).unwrap();
        assert_eq!((h.op, h.len), (VSOCK_OP_RW, 100));
        // Credit exhausted: one CREDIT_REQUEST, then silence.
        assert!(c.has_rx_work());
        assert_eq!(
            c.produce(&m, &rx, &stats).unwrap().op,
            VSOCK_OP_CREDIT_REQUEST
        );
        assert!(!c.has_rx_work());
        assert!(c.produce(&m, &rx, &stats).is_none());
        // The guest consumed 60 bytes.
        c.on_packet(
            &m,
            &tx_packet(&m, guest_hdr(VSOCK_OP_CREDIT_UPDATE, 0, 100, 60), b""),
            &stats,
        );
        assert!(c.has_rx_work());
        let h = c.produce(&m, &rx, &stats).unwrap();
        assert_eq!((h.op, h.len), (VSOCK_OP_RW, 60));
        assert_eq!(c.peer_credit(), 0);
    }

    #[test]
    fn host_eof_becomes_shutdown_and_guest_shutdown_gets_rst() {
        let m = mem();
        let stats = VsockStats::default();
        let (mut c, peer) = established(4096, 4096);
        drop(peer);
        c.on_stream_event(EventSet::IN | EventSet::HANG_UP, &stats);
        let rx = rx_buffer(&m, 4096);
        let h = c.produce(&m, &rx, &stats).unwrap();
        assert_eq!(h.op, VSOCK_OP_SHUTDOWN);
        assert_eq!(h.flags, VSOCK_SHUTDOWN_BOTH);
        let mut sd = guest_hdr(VSOCK_OP_SHUTDOWN, 0, 4096, 0);
        sd.flags = VSOCK_SHUTDOWN_BOTH;
        c.on_packet(&m, &tx_packet(&m, sd, b""), &stats);
        assert_eq!(c.produce(&m, &rx, &stats).unwrap().op, VSOCK_OP_RST);
        assert!(c.is_closed());
    }

    #[test]
    fn guest_half_close_shuts_the_host_stream_for_writing() {
        let m = mem();
        let stats = VsockStats::default();
        let (mut c, mut peer) = established(4096, 4096);
        c.on_packet(
            &m,
            &tx_packet(&m, guest_hdr(VSOCK_OP_RW, 3, 4096, 0), b"abc"),
            &stats,
        );
        let mut sd = guest_hdr(VSOCK_OP_SHUTDOWN, 0, 4096, 0);
        sd.flags = VSOCK_SHUTDOWN_SEND;
        c.on_packet(&m, &tx_packet(&m, sd, b""), &stats);
        let mut all = Vec::new();
        peer.read_to_end(&mut all).unwrap();
        assert_eq!(all, b"abc");
        // The host can still answer.
        peer.write_all(b"xyz").unwrap();
        c.on_stream_event(EventSet::IN, &stats);
        let rx = rx_buffer(&m, 4096);
        let h = c.produce(&m, &rx, &stats).unwrap();
        assert_eq!((h.op, h.len), (VSOCK_OP_RW, 3));
        // Data after the guest promised not to send is a protocol violation.
        c.on_packet(
            &m,
            &tx_packet(&m, guest_hdr(VSOCK_OP_RW, 1, 4096, 0), b"!"),
            &stats,
        );
        assert_eq!(c.produce(&m, &rx, &stats).unwrap().op, VSOCK_OP_RST);
    }

    #[test]
    fn host_initiated_connection_writes_ok_after_response() {
        let m = mem();
        let stats = VsockStats::default();
        let (ours, mut client) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let key = ConnKey {
            local_port: 1 << 30,
            peer_port: 5000,
        };
        let mut c = Connection::host_initiated(key, 9, ours, GUEST_CID, 4096);
        let rx = rx_buffer(&m, 4096);
        let h = c.produce(&m, &rx, &stats).unwrap();
        assert_eq!(
            (h.op, h.src_port, h.dst_port),
            (VSOCK_OP_REQUEST, 1 << 30, 5000)
        );
        // RW before RESPONSE is refused.
        let mut resp = guest_hdr(VSOCK_OP_RESPONSE, 0, 4096, 0);
        resp.src_port = 5000;
        resp.dst_port = 1 << 30;
        c.on_packet(&m, &tx_packet(&m, resp, b""), &stats);
        let mut line = [0u8; 14];
        client.read_exact(&mut line).unwrap();
        assert_eq!(&line, b"OK 1073741824\n");
        let mut rw = resp;
        rw.op = VSOCK_OP_RW;
        rw.len = 2;
        c.on_packet(&m, &tx_packet(&m, rw, b"hi"), &stats);
        let mut two = [0u8; 2];
        client.read_exact(&mut two).unwrap();
        assert_eq!(&two, b"hi");
    }
}
