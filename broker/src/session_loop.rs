//! The session loop: reads frames from a byte stream, executes them in a
//! [`Session`], writes replies. It knows nothing about the transport: unix
//! sockets, vsock connections and the virtio-vgpu device all hand it a reader
//! and a writer.

use std::cell::{Cell, RefCell};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::ops::ControlFlow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use thiserror::Error;
use tracing::{debug, error, info, warn};
use vgpu_proto::cuda;
use vgpu_proto::frame::{
    self, FLAG_OUTPUT, FLAG_REPLY, FrameError, HEADER_LEN, Header, MAX_PAYLOAD, ReadInPlace,
    WriteInPlace,
};
use vgpu_proto::msg::{self, ASYNC_OK, Message, Op, Request};

use crate::Broker;
use crate::error::CuError;
use crate::session::{BulkSource, DeviceSource, PostedCall, ReadSlices, Session};
use crate::tenant::{SessionInfo, Tenant};

/// Buffer size of the session's reader and writer.
const IO_BUFFER: usize = 256 << 10;
/// Buffer size of the reader of a transport that lends its bytes in place: enough for a run of
/// small requests; bulk bytes bypass it.
const IN_PLACE_IO_BUFFER: usize = 16 << 10;
/// The most posted calls served as one run ([`serve_posted_run`]): bounds the run's lists
/// (about 50 bytes a call) whatever a client sends.
const MAX_POSTED_RUN: usize = 1024;
/// The smallest `MemcpyHtoD` payload whose bytes a lending transport hands straight to device
/// memory ([`serve_in_place`]), and the smallest `MemcpyDtoH` whose bytes go from device memory
/// straight into a transport that takes them in place ([`serve_ring`]); smaller ones are read
/// and written whole, like any request.
pub const IN_PLACE_MIN_BYTES: usize = 64 << 10;

mod ring;
pub use ring::{MAX_ANSWERED_HERE, MAX_FRAME_HERE, serve_ring};

/// How the session loop reaches the lending side of its reader `R` (`None`: it does not lend).
type Lend<R> = fn(&mut R) -> &mut dyn ReadInPlace;

/// Why a session ended abnormally.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The stream broke or carried an invalid frame.
    #[error("bad frame")]
    Frame(#[from] FrameError),
    /// The client broke the protocol; the session was closed.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The session was refused at the handshake.
    #[error("session refused: {0}")]
    Refused(String),
    /// A reply could not be written.
    #[error("cannot write a reply")]
    Io(#[source] io::Error),
    /// A bug: the request handler panicked. The session was closed and released.
    #[error("internal error while handling {0}; the session was closed")]
    Panic(&'static str),
    /// The device failed while a copy's bytes were being sent after its reply's header: the
    /// stream was cut in the middle of the frame (the client sees it end), and the session
    /// closed.
    #[error("the device failed in the middle of a copy's reply; the session was closed")]
    ReplyCut(#[source] CuError),
}

impl From<ServeError> for io::Error {
    fn from(e: ServeError) -> io::Error {
        match e {
            ServeError::Io(e) => e,
            ServeError::Frame(f) => f.into(),
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }
}

/// How a session that ended normally went.
#[derive(Debug, Clone, Copy, Default)]
pub struct SessionSummary {
    /// Session id.
    pub id: u64,
    /// Requests handled.
    pub requests: u64,
}

struct Replier<W: Write> {
    w: BufWriter<W>,
}

impl<W: Write> Replier<W> {
    fn ok(&mut self, opcode: u16, call_id: u64, payload: &[u8]) -> Result<(), ServeError> {
        self.ok_with(opcode, FLAG_REPLY, call_id, payload)
    }

    fn ok_with(
        &mut self,
        opcode: u16,
        flags: u16,
        call_id: u64,
        payload: &[u8],
    ) -> Result<(), ServeError> {
        write_ok(&mut self.w, opcode, flags, call_id, payload)
    }

    fn err(&mut self, opcode: u16, call_id: u64, e: &CuError) -> Result<(), ServeError> {
        self.err_with(opcode, FLAG_REPLY, call_id, e)
    }

    fn err_with(
        &mut self,
        opcode: u16,
        flags: u16,
        call_id: u64,
        e: &CuError,
    ) -> Result<(), ServeError> {
        write_err(&mut self.w, opcode, flags, call_id, e)
    }

    fn flush(&mut self) -> Result<(), ServeError> {
        self.w.flush().map_err(ServeError::Io)
    }
}

/// Writes a successful reply.
fn write_ok(
    w: &mut impl Write,
    opcode: u16,
    flags: u16,
    call_id: u64,
    payload: &[u8],
) -> Result<(), ServeError> {
    frame::write_frame(w, opcode, flags, call_id, 0, &[payload]).map_err(ServeError::Io)
}

/// Writes a failed call's reply: its `CUresult` and message.
fn write_err(
    w: &mut impl Write,
    opcode: u16,
    flags: u16,
    call_id: u64,
    e: &CuError,
) -> Result<(), ServeError> {
    let mut msg = e.message.as_bytes();
    if msg.len() > MAX_PAYLOAD {
        msg = &msg[..MAX_PAYLOAD];
    }
    frame::write_frame(w, opcode, flags, call_id, e.code, &[msg]).map_err(ServeError::Io)
}

/// Serves one session of `tenant` until the client leaves or breaks the
/// protocol. Whatever happens, everything the session allocated is released
/// before this returns.
pub fn serve<R: Read, W: Write>(
    broker: &Broker,
    tenant: Arc<Tenant>,
    reader: R,
    writer: W,
    transport: &str,
) -> Result<SessionSummary, ServeError> {
    serve_watched(broker, tenant, reader, writer, transport, None)
}

/// [`serve`], with a probe of the client's connection that the session
/// checks while it waits for its work: a client that disconnects during a
/// synchronizing call has its work abandoned at once (see
/// [`crate::engine::Engine::watch_hangup`]).
pub fn serve_watched<R: Read, W: Write>(
    broker: &Broker,
    tenant: Arc<Tenant>,
    reader: R,
    writer: W,
    transport: &str,
    hangup: Option<crate::engine::HangupProbe>,
) -> Result<SessionSummary, ServeError> {
    serve_with_fds(broker, tenant, reader, writer, transport, hangup, None)
}

/// [`serve_watched`] on a transport that passes descriptors (a unix socket read as
/// [`crate::hostshare::HostSharing::reader`] makes it): the session may then map the host
/// memory the client shares (`HostShare`, [`crate::hostshare`]) and serve copies rung in a
/// doorbell page (`Doorbell`, [`crate::doorbell`]). A client that sends more descriptors than
/// the inbox queues breaks the protocol.
pub fn serve_with_fds<R: Read, W: Write>(
    broker: &Broker,
    tenant: Arc<Tenant>,
    reader: R,
    writer: W,
    transport: &str,
    hangup: Option<crate::engine::HangupProbe>,
    sharing: Option<crate::hostshare::HostSharing>,
) -> Result<SessionSummary, ServeError> {
    let r = BufReader::with_capacity(IO_BUFFER, reader);
    serve_inner(
        broker,
        tenant,
        r,
        run_plain(None),
        writer,
        transport,
        hangup,
        sharing,
    )
}

/// [`serve_watched`] on a transport that lends the bytes it received ([`ReadInPlace`]: vgpud's
/// in-process vsock rings): the bulk bytes of a `MemcpyHtoD` of at least
/// [`IN_PLACE_MIN_BYTES`] go from the transport's buffer straight to device memory, run by run
/// as they arrive, with no copy into a request buffer in between.
pub fn serve_in_place<R: Read + ReadInPlace, W: Write>(
    broker: &Broker,
    tenant: Arc<Tenant>,
    reader: R,
    writer: W,
    transport: &str,
    hangup: Option<crate::engine::HangupProbe>,
) -> Result<SessionSummary, ServeError> {
    fn lend<R: ReadInPlace>(r: &mut R) -> &mut dyn ReadInPlace {
        r
    }
    let r = BufReader::with_capacity(IN_PLACE_IO_BUFFER, reader);
    serve_inner(
        broker,
        tenant,
        r,
        run_plain(Some(lend::<R>)),
        writer,
        transport,
        hangup,
        None,
    )
}

/// The loop that serves a session once its handshake is done: it takes the session (and must
/// drop it before it returns), the reader, the replier, the payload buffer and the summary.
trait RunSession<R, W: Write>:
    FnOnce(
    Session,
    BufReader<R>,
    &mut Replier<W>,
    Vec<u8>,
    &mut SessionSummary,
) -> Result<(), ServeError>
{
}

impl<R, W: Write, F> RunSession<R, W> for F where
    F: FnOnce(
        Session,
        BufReader<R>,
        &mut Replier<W>,
        Vec<u8>,
        &mut SessionSummary,
    ) -> Result<(), ServeError>
{
}

/// The plain loop: every frame on the session's own thread.
fn run_plain<R: Read, W: Write>(lend: Option<Lend<R>>) -> impl RunSession<R, W> {
    move |mut session: Session,
          mut r: BufReader<R>,
          w: &mut Replier<W>,
          mut payload: Vec<u8>,
          summary: &mut SessionSummary| {
        // The session is dropped (its memory released) as this returns, before the caller logs
        // the end.
        let mut out = Vec::new();
        let mut stage = Vec::new();
        let mut run = Vec::new();
        while step(
            &mut session,
            &mut r,
            lend,
            InPlace::Staged(&mut stage),
            w,
            &mut payload,
            summary,
            &mut out,
            &mut run,
        )?
        .is_continue()
        {}
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
fn serve_inner<R: Read, W: Write>(
    broker: &Broker,
    tenant: Arc<Tenant>,
    mut r: BufReader<R>,
    run: impl RunSession<R, W>,
    writer: W,
    transport: &str,
    hangup: Option<crate::engine::HangupProbe>,
    sharing: Option<crate::hostshare::HostSharing>,
) -> Result<SessionSummary, ServeError> {
    let mut w = Replier {
        w: BufWriter::with_capacity(IO_BUFFER, writer),
    };
    let mut payload = Vec::new();

    // Handshake.
    let h = match frame::read_frame(&mut r, &mut payload) {
        Ok(h) => h,
        Err(FrameError::Closed) => return Ok(SessionSummary::default()),
        Err(e) => return Err(e.into()),
    };
    if h.opcode != msg::Hello::OPCODE || h.is_async() || h.is_reply() {
        return Err(ServeError::Protocol(format!(
            "the first frame must be a synchronous Hello, got opcode {:#06x}",
            h.opcode
        )));
    }
    let hello = match msg::decode_exact::<msg::Hello>(&payload, false) {
        Ok((m, _)) => m,
        Err(e) => {
            let ce = CuError::invalid_value(format!("malformed Hello: {e}"));
            w.err(h.opcode, h.call_id, &ce)?;
            w.flush()?;
            return Err(ServeError::Protocol(ce.message));
        }
    };
    let (mut session, hello_reply) =
        match accept_hello(broker, Arc::clone(&tenant), &hello, transport) {
            Ok(s) => s,
            Err(e) => {
                w.err(h.opcode, h.call_id, &e)?;
                w.flush()?;
                return Err(ServeError::Refused(e.message));
            }
        };
    if let Some(probe) = hangup {
        session.watch_hangup(probe);
    }
    if let Some(sharing) = sharing {
        session.accept_fds(sharing.fds);
        session.accept_bell(sharing.bell);
    }
    let info = Arc::clone(session.info());
    let mut out = Vec::new();
    hello_reply.encode(&mut out);
    w.ok(h.opcode, h.call_id, &out)?;
    w.flush()?;
    info!(
        tenant = %tenant.name,
        session = info.id,
        pid = hello.pid,
        process = %info.process_name,
        transport,
        "session opened"
    );

    let mut summary = SessionSummary {
        id: info.id,
        requests: 0,
    };
    let result = run(session, r, &mut w, payload, &mut summary);
    match &result {
        Ok(()) => {
            info!(tenant = %tenant.name, session = info.id, requests = summary.requests, "session closed")
        }
        Err(ServeError::Frame(FrameError::Truncated | FrameError::Io(_))) => {
            info!(tenant = %tenant.name, session = info.id, "session closed: the client went away")
        }
        Err(e) => warn!(tenant = %tenant.name, session = info.id, error = %e, "session closed"),
    }
    result.map(|()| summary)
}

/// Characters of a guest's shim version shown in a refusal.
const SHIM_VERSION_SHOWN: usize = 64;
/// Characters of a guest's process name kept.
const PROCESS_NAME_KEPT: usize = 256;

/// A guest-supplied string as the host keeps it: at most `max` characters,
/// control characters escaped (so that logs keep one line per entry).
fn guest_text(s: &str, max: usize) -> String {
    s.chars()
        .take(max)
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// The handshake every transport performs: checks a `Hello` against the server's protocol
/// version and the tenant's state, and opens a session of `tenant`. On refusal the error is what
/// the client gets (its status and message); the transport then closes the session.
pub fn accept_hello(
    broker: &Broker,
    tenant: Arc<Tenant>,
    hello: &msg::Hello,
    transport: &str,
) -> Result<(Session, msg::HelloReply), CuError> {
    if hello.protocol_version != vgpu_proto::PROTOCOL_VERSION {
        return Err(CuError::new(
            cuda::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
            format!(
                "guest shim speaks protocol {} (shim {}), vgpud {} speaks {}: install the matching guest shim",
                hello.protocol_version,
                guest_text(&hello.shim_version, SHIM_VERSION_SHOWN),
                vgpu_proto::VERSION,
                vgpu_proto::PROTOCOL_VERSION
            ),
        ));
    }
    if !tenant.is_open() {
        return Err(CuError::new(
            cuda::CUDA_ERROR_DEVICE_UNAVAILABLE,
            format!(
                "VM `{}` is not accepting new sessions (draining or removed)",
                tenant.name
            ),
        ));
    }
    let allowed = tenant.limits.limits().sessions;
    if tenant.sessions().len() >= allowed as usize {
        tenant
            .limits
            .note_refused(vgpu_config::limits::Budget::Sessions);
        return Err(CuError::new(
            cuda::CUDA_ERROR_DEVICE_UNAVAILABLE,
            format!(
                "VM `{}` already has {allowed} sessions, its limit (limits.sessions)",
                tenant.name
            ),
        ));
    }
    let info = Arc::new(SessionInfo::new(
        broker.next_session_id(),
        hello.pid,
        guest_text(&hello.process_name, PROCESS_NAME_KEPT),
        transport.to_string(),
    ));
    let session = Session::new(Arc::clone(&tenant), Arc::clone(&info)).inspect_err(|e| {
        error!(tenant = %tenant.name, error = %e, "cannot open a session");
    })?;
    let reply = msg::HelloReply {
        protocol_version: vgpu_proto::PROTOCOL_VERSION,
        session_id: info.id,
        tenant: tenant.name.clone(),
        server_version: vgpu_proto::VERSION.to_string(),
        max_payload: MAX_PAYLOAD as u32,
    };
    Ok((session, reply))
}

/// The bytes of a `MemcpyHtoD`'s fields, ahead of its bulk bytes.
fn htod_fields_len() -> usize {
    let mut b = Vec::new();
    msg::MemcpyHtoD {
        ctx: 0,
        stream: 0,
        dst: 0,
    }
    .encode(&mut b);
    b.len()
}

/// The bulk bytes of a request, still in the reader: those its buffer holds, then those the
/// transport lends ([`ReadInPlace`]).
struct Lent<'a, R> {
    r: RefCell<&'a mut BufReader<R>>,
    lend: Lend<R>,
    len: usize,
    taken: Cell<usize>,
    /// The transport failed while lending: the session cannot go on.
    broken: RefCell<Option<io::Error>>,
}

impl<'a, R: Read> Lent<'a, R> {
    fn new(r: &'a mut BufReader<R>, lend: Lend<R>, len: usize) -> Self {
        Lent {
            r: RefCell::new(r),
            lend,
            len,
            taken: Cell::new(0),
            broken: RefCell::new(None),
        }
    }

    /// Takes up to `left` bytes, the buffered ones first, calling `f` with each run until it
    /// fails (then the rest is skipped); returns `f`'s error, or the transport's.
    fn take(&self, f: &mut ReadSlices<'_>) -> Result<(), CuError> {
        let mut r = self.r.borrow_mut();
        let left = self.len - self.taken.get();
        let buffered = r.buffer().len().min(left);
        let mut failed = None;
        if buffered > 0 {
            failed = f(&[&r.buffer()[..buffered]]).err();
            r.consume(buffered);
            self.taken.set(self.taken.get() + buffered);
        }
        let left = self.len - self.taken.get();
        let io = (self.lend)(r.get_mut()).read_in_place(left, &mut |runs| {
            if failed.is_some() {
                return ControlFlow::Break(());
            }
            match f(runs) {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => {
                    failed = Some(e);
                    ControlFlow::Break(())
                }
            }
        });
        if let Err(e) = io {
            *self.broken.borrow_mut() = Some(e);
            return Err(CuError::invalid_value(
                "the client's stream ended in the middle of the copy's bytes",
            ));
        }
        self.taken.set(self.len);
        failed.map_or(Ok(()), Err)
    }

    /// Skips what the request did not read, so that the stream is at the next frame; fails if
    /// the transport broke.
    fn finish(self) -> Result<(), ServeError> {
        if self.taken.get() < self.len {
            let _ = self.take(&mut |_| Ok(()));
        }
        match self.broken.into_inner() {
            None => Ok(()),
            Some(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Err(FrameError::Truncated.into())
            }
            Some(e) => Err(FrameError::Io(e).into()),
        }
    }
}

impl<R: Read> BulkSource for Lent<'_, R> {
    fn len(&self) -> u64 {
        self.len as u64
    }

    fn read(&self, f: &mut ReadSlices<'_>) -> Result<(), CuError> {
        if self.taken.get() > 0 {
            return Err(CuError::invalid_value(
                "the request's bytes were already read",
            ));
        }
        self.take(f)
    }
}

/// Where a large device-to-host copy's bytes go, read from device memory with no reply buffer
/// ([`dtoh_in_place`]).
pub(crate) enum InPlace<'a> {
    /// Into the transport's own buffer (vgpud's vsock rings: the guest's rx buffers).
    Transport(&'a mut dyn WriteInPlace),
    /// Through a staging buffer of the session's, in pieces of [`STAGE_BYTES`], written to the
    /// stream as they are read (sockets). It is zeroed once, when it grows, not for every copy.
    Staged(&'a mut Vec<u8>),
}

/// The largest piece of a device-to-host copy staged at once ([`InPlace::Staged`]).
const STAGE_BYTES: usize = 1 << 20;

/// A stream written through a staging buffer ([`InPlace::Staged`]).
struct Staged<'a, W: Write> {
    w: &'a mut BufWriter<W>,
    stage: &'a mut Vec<u8>,
}

impl<W: Write> WriteInPlace for Staged<'_, W> {
    fn write_in_place(&mut self, len: usize, f: &mut frame::FillFn<'_>) -> io::Result<()> {
        let mut left = len;
        while left > 0 {
            let n = left.min(STAGE_BYTES);
            if self.stage.len() < n {
                self.stage.resize(n, 0);
            }
            if f(&mut self.stage[..n]).is_break() {
                // The session ends: its stream closes in the middle of the frame.
                return Err(io::Error::other(
                    "the writer could not produce the bytes of its frame",
                ));
            }
            self.w.write_all(&self.stage[..n])?;
            left -= n;
        }
        Ok(())
    }
}

/// Reads, runs and answers one frame (or a run of posted calls: [`serve_posted_run`]);
/// breaks when the client said goodbye or left. `in_place`:
/// where a large device-to-host copy's bytes go ([`dtoh_in_place`]).
#[allow(clippy::too_many_arguments)]
fn step<R: Read, W: Write>(
    session: &mut Session,
    r: &mut BufReader<R>,
    lend: Option<Lend<R>>,
    in_place: InPlace<'_>,
    w: &mut Replier<W>,
    payload: &mut Vec<u8>,
    summary: &mut SessionSummary,
    out: &mut Vec<u8>,
    run: &mut Vec<PostedCall>,
) -> Result<ControlFlow<()>, ServeError> {
    if r.buffer().is_empty() {
        // Nothing more is pending from the client: send the replies now.
        w.flush()?;
        if let Some(bell) = session.bell().cloned() {
            // Between frames: the reader may report a request rung in the doorbell page, once
            // it has read every byte the client sent before it (those frames were served).
            bell.arm(true);
            let filled = r.fill_buf().map(|b| b.is_empty());
            bell.arm(false);
            match filled {
                Ok(true) => return Ok(ControlFlow::Break(())),
                Ok(false) => {}
                Err(e) if vgpu_proto::spin::is_rung(&e) => {
                    serve_rung(session, &bell, summary, out)?;
                    return Ok(ControlFlow::Continue(()));
                }
                Err(e) => return Err(FrameError::Io(e).into()),
            }
        }
    }
    let h = match r.buffer().first_chunk::<HEADER_LEN>() {
        // Buffered, as a small frame's header mostly is: decoded where it is.
        Some(b) => {
            let h = Header::decode(b);
            r.consume(HEADER_LEN);
            h?
        }
        None => match frame::read_header(r) {
            Ok(h) => h,
            Err(FrameError::Closed) => return Ok(ControlFlow::Break(())),
            Err(e) => return Err(e.into()),
        },
    };
    // A large host-to-device copy on a lending transport: only its fields are read here.
    let lent = match lend {
        Some(lend)
            if h.opcode == msg::MemcpyHtoD::OPCODE
                && h.payload_len as usize >= IN_PLACE_MIN_BYTES =>
        {
            Some((lend, h.payload_len as usize - htod_fields_len()))
        }
        _ => None,
    };
    let bulk = lent.map_or(0, |(_, n)| n);
    let len = h.payload_len as usize - bulk;
    summary.requests += 1;
    if lent.is_none() && r.buffer().len() >= len {
        if !session.fds_overflowed()
            && let Some(first) = posted_call(&h, &r.buffer()[..len], 0)
        {
            return serve_posted_run(session, r, first, len, run, summary, out);
        }
        // The whole payload is in the reader's buffer (as with most small frames): served from
        // there, without copying it out.
        let flow = serve_frame(
            session,
            &h,
            &r.buffer()[..len],
            None::<Lent<R>>,
            w,
            in_place,
            out,
        );
        r.consume(len);
        return flow;
    }
    frame::read_payload(r, len, payload)?;
    let data = lent.map(|(lend, n)| Lent::new(r, lend, n));
    serve_frame(session, &h, payload, data, w, in_place, out)
}

/// Serves the request rung in the doorbell page as its synchronous frame would be served, and
/// writes its completion (status, reply flags, error message) into the page.
fn serve_rung(
    session: &mut Session,
    bell: &crate::doorbell::BellSlot,
    summary: &mut SessionSummary,
    out: &mut Vec<u8>,
) -> Result<(), ServeError> {
    let Some((page, rung)) = bell.take() else {
        return Ok(());
    };
    summary.requests += 1;
    out.clear();
    let result = match crate::doorbell::request_of(&rung) {
        Ok(req) => catch_unwind(AssertUnwindSafe(|| session.handle(&req, &[], out, true)))
            .map_err(|_| ServeError::Panic(req.name()))?,
        Err(e) => Err(e),
    };
    let flags = reply_flags(session);
    match result {
        Ok(()) => page.complete(rung.seq, 0, flags, ""),
        Err(e) => page.complete(rung.seq, e.code, flags, &e.message),
    }
    bell.served(rung.seq);
    Ok(())
}

/// The posted call a run may hold that the frame with header `h` and `payload` (at `at` in the
/// reader's buffer) asks for ([`PostedCall::decode`]); `None` also for a frame whose bulk bytes
/// a lending transport would take in place.
fn posted_call(h: &Header, payload: &[u8], at: usize) -> Option<PostedCall> {
    if payload.len() >= IN_PLACE_MIN_BYTES {
        return None;
    }
    PostedCall::decode(h, payload, at)
}

/// Serves `first`, a posted call whose `len` payload bytes lie at the front of the reader's
/// buffer (its header was read), together with the posted calls that follow it whole in the
/// buffer (at most [`MAX_POSTED_RUN`]): decoded where they lie and handed to the session as one
/// run ([`Session::handle_posted_run`]), which pays the engine's bookkeeping once for a
/// stream's run instead of once per call. A program filling or uploading many small buffers
/// asynchronously sends them so, many to a read. The run ends at the first frame that is
/// anything else, is not wholly buffered or does not decode: the next step reads and serves
/// that frame on its own, as any.
fn serve_posted_run<R: Read>(
    session: &mut Session,
    r: &mut BufReader<R>,
    first: PostedCall,
    len: usize,
    run: &mut Vec<PostedCall>,
    summary: &mut SessionSummary,
    out: &mut Vec<u8>,
) -> Result<ControlFlow<()>, ServeError> {
    run.clear();
    run.push(first);
    let mut end = len;
    while run.len() < MAX_POSTED_RUN {
        let buf = &r.buffer()[end..];
        let Some(Ok(h)) = buf.first_chunk::<HEADER_LEN>().map(Header::decode) else {
            break;
        };
        let next = HEADER_LEN + h.payload_len as usize;
        let Some(call) = buf
            .get(HEADER_LEN..next)
            .and_then(|payload| posted_call(&h, payload, end + HEADER_LEN))
        else {
            break;
        };
        run.push(call);
        end += next;
    }
    summary.requests += run.len() as u64 - 1;
    let bytes = &r.buffer()[..end];
    catch_unwind(AssertUnwindSafe(|| {
        session.handle_posted_run(run, bytes, out)
    }))
    .map_err(|_| ServeError::Panic("a run of posted calls"))?;
    r.consume(end);
    Ok(ControlFlow::Continue(()))
}

/// Serves one frame whose header `h` and `payload` (the fields, and the bulk bytes unless `lent`
/// lends them) were read.
fn serve_frame<R: Read, W: Write>(
    session: &mut Session,
    h: &Header,
    payload: &[u8],
    lent: Option<Lent<'_, R>>,
    w: &mut Replier<W>,
    in_place: InPlace<'_>,
    out: &mut Vec<u8>,
) -> Result<ControlFlow<()>, ServeError> {
    if session.fds_overflowed() {
        return Err(ServeError::Protocol(format!(
            "the client sent more than {} descriptors ahead of their requests",
            crate::hostshare::MAX_QUEUED_FDS
        )));
    }
    if h.is_reply() || h.has_output() {
        return Err(ServeError::Protocol(
            "the client sent a reply frame or reply flags".into(),
        ));
    }
    let is_async = h.is_async();
    let decoded = Request::decode(h.opcode, payload);
    let (req, tail_at) = match decoded {
        Ok(d) => d,
        Err(e) => {
            let ce = CuError::rejected(h.opcode, &e);
            debug!(session = session.id(), error = %ce, "bad request");
            if let Some(data) = lent {
                data.finish()?;
            }
            if is_async {
                session.defer_error(ce);
            } else {
                w.err(h.opcode, h.call_id, &ce)?;
            }
            return Ok(ControlFlow::Continue(()));
        }
    };
    if is_async && req.flags() & ASYNC_OK == 0 {
        return Err(ServeError::Protocol(format!(
            "{} cannot be sent asynchronously",
            req.name()
        )));
    }
    if matches!(req, Request::Goodbye(_)) {
        return Ok(ControlFlow::Break(()));
    }
    if let Request::MemcpyDtoH(m) = &req
        && !is_async
        && m.len as usize >= IN_PLACE_MIN_BYTES
    {
        dtoh_in_place(session, h, &req, w, in_place)?;
        return Ok(ControlFlow::Continue(()));
    }
    out.clear();
    let name = req.name();
    let result = match lent {
        Some(data) => {
            let result = catch_unwind(AssertUnwindSafe(|| {
                session.handle_lent(&req, &data, out, !is_async)
            }))
            .map_err(|_| ServeError::Panic(name))?;
            data.finish()?;
            result
        }
        None => catch_unwind(AssertUnwindSafe(|| {
            session.handle(&req, &payload[tail_at..], out, !is_async)
        }))
        .map_err(|_| ServeError::Panic(name))?,
    };
    // Errors of asynchronous requests were kept by the session for the
    // next synchronizing call of their context.
    // Device output released by a synchronizing call: the client fetches it.
    let flags = if is_async {
        FLAG_REPLY
    } else {
        reply_flags(session)
    };
    match (result, is_async) {
        (Ok(()), false) => w.ok_with(h.opcode, flags, h.call_id, out)?,
        (Err(e), false) => w.err_with(h.opcode, flags, h.call_id, &e)?,
        (_, true) => {}
    }
    Ok(ControlFlow::Continue(()))
}

/// A large `MemcpyDtoH`: its reply's header goes out first, then its bytes go from device memory
/// straight into the transport's buffer (vgpud's vsock device reads them into the guest's rx
/// buffers on its own thread), or through the session's staging buffer to the stream, with no
/// zeroed reply buffer in between. A device failure after the header cuts the stream (the client
/// sees it end in the middle of the frame, never a short or wrong copy) and ends the session.
fn dtoh_in_place<W: Write>(
    session: &mut Session,
    h: &Header,
    req: &Request,
    w: &mut Replier<W>,
    in_place: InPlace<'_>,
) -> Result<(), ServeError> {
    let name = req.name();
    let checked = catch_unwind(AssertUnwindSafe(|| session.dtoh_lent(req)))
        .map_err(|_| ServeError::Panic(name))?;
    let flags = reply_flags(session);
    let mut source = match checked {
        Ok(source) => source,
        Err(e) => return w.err_with(h.opcode, flags, h.call_id, &e),
    };
    let len = source.left() as usize;
    write_dtoh_header(&mut w.w, h, flags, len).map_err(ServeError::Io)?;
    let mut cut = None;
    let mut read = |room: &mut [u8]| read_next(&mut source, &mut cut, room);
    let written = catch_unwind(AssertUnwindSafe(|| match in_place {
        InPlace::Transport(fill) => {
            // The writer's buffer goes first: the bytes written in place follow it.
            w.w.flush()?;
            fill.write_in_place(len, &mut read)
        }
        InPlace::Staged(stage) => Staged { w: &mut w.w, stage }.write_in_place(len, &mut read),
    }))
    .map_err(|_| ServeError::Panic(name))?;
    if let Some(e) = cut {
        return Err(ServeError::ReplyCut(e));
    }
    written.map_err(ServeError::Io)
}

/// A reply's flags: `FLAG_OUTPUT` once a synchronizing call released device output (the client
/// fetches it).
fn reply_flags(session: &Session) -> u16 {
    if session.output_ready() {
        FLAG_REPLY | FLAG_OUTPUT
    } else {
        FLAG_REPLY
    }
}

/// Writes the header and fields of a successful `MemcpyDtoH` reply whose `len` bytes of data
/// follow separately.
fn write_dtoh_header(w: &mut impl Write, h: &Header, flags: u16, len: usize) -> io::Result<()> {
    let mut fields = Vec::new();
    msg::Empty {}.encode(&mut fields);
    frame::write_header(w, h.opcode, flags, h.call_id, 0, fields.len() + len)?;
    w.write_all(&fields)
}

/// Reads a copy's next bytes into `room`; on a device failure keeps it in `cut` and breaks.
fn read_next(
    source: &mut DeviceSource,
    cut: &mut Option<CuError>,
    room: &mut [u8],
) -> ControlFlow<()> {
    match source.read(&mut [room]) {
        Ok(()) => ControlFlow::Continue(()),
        Err(e) => {
            *cut = Some(e);
            ControlFlow::Break(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::AtomicU64;
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    use vgpu_proto::cuda::*;
    use vgpu_proto::frame::{HEADER_LEN, MAGIC, MAX_BULK_CHUNK};
    use vgpu_proto::msg::*;

    use super::*;
    use crate::testutils::{MemDevice, TestClient, vm};

    const MIB: u64 = 1 << 20;

    fn broker(delay: Duration) -> Arc<Broker> {
        let dev: Arc<dyn crate::device::Device> = Arc::new(MemDevice::new(1 << 30, delay));
        let b = Arc::new(Broker::new(vec![("gpu0".into(), dev)]));
        b.add_tenant(&vm("vm1", 4 * MIB)).unwrap();
        b.add_tenant(&vm("vm2", 4 * MIB)).unwrap();
        b
    }

    type Served = JoinHandle<Result<SessionSummary, ServeError>>;

    fn connect(b: &Arc<Broker>, tenant: &str) -> (TestClient<UnixStream>, Served) {
        let (c, s) = UnixStream::pair().unwrap();
        let b2 = Arc::clone(b);
        let t = b.tenant(tenant).unwrap();
        let h = std::thread::spawn(move || serve(&b2, t, &s, &s, "test"));
        (TestClient::new(c), h)
    }

    fn open(b: &Arc<Broker>, tenant: &str) -> (TestClient<UnixStream>, Served, u64) {
        let (mut c, h) = connect(b, tenant);
        let hello = c.hello().unwrap();
        assert_eq!(hello.tenant, tenant);
        let ctx = create_context(&mut c);
        (c, h, ctx)
    }

    fn create_context(c: &mut TestClient<UnixStream>) -> u64 {
        c.call(
            &CtxCreate {
                device: 0,
                flags: 0,
            },
            &[],
        )
        .unwrap()
        .0
        .handle
    }

    /// Whether the session's primary context is retained (`PrimaryCtxGetState`).
    fn primary_active(c: &mut TestClient<UnixStream>) -> u32 {
        c.call(&PrimaryCtxGetState { device: 0 }, &[])
            .unwrap()
            .0
            .active
    }

    fn alloc(c: &mut TestClient<UnixStream>, ctx: u64, size: u64) -> Result<u64, (u32, String)> {
        c.call(&MemAlloc { ctx, size }, &[]).map(|r| r.0.ptr)
    }

    /// A synchronous `MemcpyHtoD` of `data` to `dst` on the legacy stream.
    fn put(
        c: &mut TestClient<UnixStream>,
        ctx: u64,
        dst: u64,
        data: &[u8],
    ) -> Result<(), (u32, String)> {
        c.call(
            &MemcpyHtoD {
                ctx,
                stream: 0,
                dst,
            },
            data,
        )
        .map(|_| ())
    }

    #[test]
    fn a_session_answers_at_once_only_quick_requests_with_nothing_queued() {
        let b = broker(Duration::from_millis(300));
        let info = Arc::new(SessionInfo::new(
            b.next_session_id(),
            1,
            "test".into(),
            "test".into(),
        ));
        let mut s = Session::new(b.tenant("vm1").unwrap(), info).unwrap();
        let sync = <CtxSynchronize as Op>::OPCODE;
        assert!(s.answers_at_once(sync));
        assert!(s.answers_at_once(<MemcpyDtoH as Op>::OPCODE));
        for slow in [
            <ModuleLoad as Op>::OPCODE,
            <MemAlloc as Op>::OPCODE,
            <MemFree as Op>::OPCODE,
            <EventSynchronize as Op>::OPCODE,
            <CtxCreate as Op>::OPCODE,
        ] {
            assert!(!s.answers_at_once(slow), "opcode {slow:#06x}");
        }
        let mut out = Vec::new();
        let create = Request::CtxCreate(CtxCreate {
            device: 0,
            flags: 0,
        });
        s.handle(&create, &[], &mut out, true).unwrap();
        let ctx = decode_exact::<Handle>(&out, false).unwrap().0.handle;
        out.clear();
        s.handle(
            &Request::MemAlloc(MemAlloc { ctx, size: MIB }),
            &[],
            &mut out,
            true,
        )
        .unwrap();
        let dst = decode_exact::<Ptr>(&out, false).unwrap().0.ptr;
        // A posted memset too large to run at once, which the device takes 300 ms for: a
        // synchronize would wait for it.
        let memset = Request::Memset(Memset {
            ctx,
            stream: 0,
            dst,
            value: 1,
            elem_size: 1,
            count: MIB,
        });
        s.handle(&memset, &[], &mut out, false).unwrap();
        assert!(!s.answers_at_once(sync), "work is queued");
        out.clear();
        s.handle(
            &Request::CtxSynchronize(CtxSynchronize { ctx }),
            &[],
            &mut out,
            true,
        )
        .unwrap();
        assert!(s.answers_at_once(sync), "the work is done");
    }

    /// A synchronization whose work is not done within its wait in place leaves a ticket that
    /// another connection of the VM waits for, while the process's connection answers.
    #[test]
    fn a_synchronization_waits_for_its_ticket_on_another_connection() {
        let b = broker(Duration::from_millis(300));
        let (mut c, _h, ctx) = open(&b, "vm1");
        let (mut waiter, _hw) = connect(&b, "vm1");
        waiter.hello().unwrap();
        let (mut stranger, _hs) = connect(&b, "vm2");
        stranger.hello().unwrap();
        let tickets = &b.tenant("vm1").unwrap().sync_tickets;
        let dst = alloc(&mut c, ctx, MIB).unwrap();
        let stream = c
            .call(
                &StreamCreate {
                    ctx,
                    flags: 1,
                    priority: 0,
                },
                &[],
            )
            .unwrap()
            .0
            .handle;
        let begin = |c: &mut TestClient<UnixStream>, kind: u32, handle: u64, lo: u64| {
            c.call(
                &SyncBegin {
                    ctx,
                    kind,
                    handle,
                    wait_us: 1000,
                    token_hi: 7,
                    token_lo: lo,
                },
                &[],
            )
            .map(|r| r.0.value)
        };
        let wait = |c: &mut TestClient<UnixStream>, lo: u64, timeout_ms: u32| {
            c.call(
                &SyncWait {
                    token_hi: 7,
                    token_lo: lo,
                    timeout_ms,
                },
                &[],
            )
            .map(|r| r.0.value)
        };
        let memset = Memset {
            ctx,
            stream,
            dst,
            value: 1,
            elem_size: 1,
            count: MIB,
        };
        // Nothing pending: done at once, no ticket left, and the whole session is idle.
        assert_eq!(begin(&mut c, SYNC_STREAM, stream, 1), Ok(SYNC_IDLE));
        assert!(tickets.is_empty());
        // A 300 ms fill: not done within 1 ms.
        c.post(&memset, &[]).unwrap();
        // The legacy stream (independent of a non-blocking one) is done, the session is not idle.
        assert_eq!(begin(&mut c, SYNC_STREAM, 0, 1), Ok(SYNC_DONE));
        let t0 = Instant::now();
        assert_eq!(begin(&mut c, SYNC_STREAM, stream, 2), Ok(SYNC_PENDING));
        assert!(
            t0.elapsed() < Duration::from_millis(250),
            "it waited in place"
        );
        assert_eq!(tickets.len(), 1);
        assert_eq!(
            begin(&mut c, SYNC_CONTEXT, 0, 2).unwrap_err().0,
            CUDA_ERROR_INVALID_VALUE,
            "a token in use"
        );
        // The process's connection answers meanwhile.
        c.call(&Ping {}, &[]).unwrap();
        assert_eq!(
            c.call(&StreamQuery { ctx, stream }, &[]).unwrap_err().0,
            CUDA_ERROR_NOT_READY
        );
        // Another VM cannot name the ticket; a short wait says not yet.
        assert_eq!(
            wait(&mut stranger, 2, 1000).unwrap_err().0,
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(wait(&mut waiter, 2, 1), Ok(SYNC_PENDING));
        assert_eq!(wait(&mut waiter, 2, 10_000), Ok(SYNC_DONE));
        c.call(&StreamQuery { ctx, stream }, &[]).unwrap();
        c.call(
            &SyncFinish {
                ctx,
                kind: SYNC_STREAM,
                handle: stream,
            },
            &[],
        )
        .unwrap();
        assert!(tickets.is_empty(), "a ticket seen done goes");
        assert_eq!(
            wait(&mut waiter, 2, 1).unwrap_err().0,
            CUDA_ERROR_INVALID_HANDLE
        );
        // The context and an event recorded behind a fill wait the same way.
        let event = c
            .call(&EventCreate { ctx, flags: 0 }, &[])
            .unwrap()
            .0
            .handle;
        c.post(&memset, &[]).unwrap();
        c.post(&EventRecord { ctx, stream, event }, &[]).unwrap();
        assert_eq!(begin(&mut c, SYNC_EVENT, event, 3), Ok(SYNC_PENDING));
        assert_eq!(begin(&mut c, SYNC_CONTEXT, 0, 4), Ok(SYNC_PENDING));
        assert_eq!(wait(&mut waiter, 3, 10_000), Ok(SYNC_DONE));
        assert_eq!(wait(&mut waiter, 4, 10_000), Ok(SYNC_DONE));
        // All of the session's work (what a free waits for), reporting nothing.
        c.post(&memset, &[]).unwrap();
        assert_eq!(begin(&mut c, SYNC_ALL, 0, 7), Ok(SYNC_PENDING));
        assert_eq!(wait(&mut waiter, 7, 10_000), Ok(SYNC_DONE));
        // Bad kinds and handles are refused before anything waits.
        assert_eq!(
            begin(&mut c, 5, stream, 5).unwrap_err().0,
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            begin(&mut c, SYNC_EVENT, 0xdead, 5).unwrap_err().0,
            CUDA_ERROR_INVALID_HANDLE
        );
        assert!(tickets.is_empty());
        // A session that ends leaves no ticket, and its waiter hears that the work is gone.
        c.post(&memset, &[]).unwrap();
        assert_eq!(begin(&mut c, SYNC_STREAM, stream, 6), Ok(SYNC_PENDING));
        let waiting = std::thread::spawn(move || wait(&mut waiter, 6, 10_000));
        std::thread::sleep(Duration::from_millis(50));
        drop(c);
        let heard = waiting.join().unwrap();
        assert!(
            matches!(heard, Ok(SYNC_GONE)) || matches!(heard, Err((CUDA_ERROR_INVALID_HANDLE, _))),
            "{heard:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while !tickets.is_empty() {
            assert!(
                Instant::now() < deadline,
                "the ended session's ticket stays"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// What `cuCtxDestroy` waits for before it destroys (`SYNC_DESTROY`): every earlier job of
    /// the session, on a ticket; the context's stream-memory waits end first (as the destroy ends
    /// them: nothing else would release a word nobody writes), and the destroy that follows finds
    /// nothing to wait for. Primary and unknown contexts are refused as the destroy refuses them.
    /// A green context takes part of the device's multiprocessors (refused beyond them), holds
    /// the primary context while it lives, and leaves what it allocated to the primary context;
    /// `CtxDestroy` is what destroys it, and events of the primary context record its work.
    #[test]
    fn a_green_context_holds_the_primary_context_and_leaves_it_its_memory() {
        let b = broker(Duration::ZERO);
        let (mut c, _h) = connect(&b, "vm1");
        c.hello().unwrap();
        let green = |c: &mut TestClient<UnixStream>, sm_count| {
            c.call(
                &GreenCtxCreate {
                    device: 0,
                    sm_count,
                },
                &[],
            )
            .map(|r| r.0.handle)
        };
        let sms = crate::testutils::MEM_DEVICE_SMS as u32;
        for bad in [0, sms + 1, u32::MAX] {
            assert_eq!(
                green(&mut c, bad).map_err(|e| e.0),
                Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION),
                "{bad} multiprocessors"
            );
        }
        assert_eq!(
            primary_active(&mut c),
            0,
            "a refused green context holds nothing"
        );
        let primary = c
            .call(&PrimaryCtxRetain { device: 0 }, &[])
            .unwrap()
            .0
            .handle;
        let g = green(&mut c, sms / 2).unwrap();
        assert_ne!(g, primary);
        let ptr = alloc(&mut c, g, 4096).unwrap();
        put(&mut c, g, ptr, b"green").unwrap();
        let event = c
            .call(
                &EventCreate {
                    ctx: primary,
                    flags: 0,
                },
                &[],
            )
            .unwrap()
            .0
            .handle;
        c.call(&CtxRecordEvent { ctx: g, event }, &[])
            .expect("an event of the primary context records the green context's work");
        c.call(&CtxDestroy { ctx: g }, &[]).unwrap();
        assert_eq!(primary_active(&mut c), 1);
        assert_eq!(
            c.call(&CtxSynchronize { ctx: g }, &[]).map_err(|e| e.0),
            Err(CUDA_ERROR_INVALID_CONTEXT),
            "the green context is gone"
        );
        let get = |c: &mut TestClient<UnixStream>| {
            c.call(
                &MemcpyDtoH {
                    ctx: primary,
                    stream: 0,
                    src: ptr,
                    len: 5,
                },
                &[],
            )
            .map(|(_, back)| back)
        };
        let back = get(&mut c).expect("its memory is the primary context's now");
        assert_eq!(back, b"green");
        // A green context alone keeps the primary context alive; its destroy releases it.
        c.call(&PrimaryCtxRelease { device: 0 }, &[]).unwrap();
        let g = green(&mut c, 1).unwrap();
        assert_eq!(primary_active(&mut c), 1);
        c.call(&CtxDestroy { ctx: g }, &[]).unwrap();
        assert_eq!(primary_active(&mut c), 0);
        assert!(get(&mut c).is_err(), "the primary context's reset freed it");
    }

    /// A context with an execution affinity takes part of the device's multiprocessors (refused
    /// beyond them) but, unlike a green context, holds nothing of the primary context: its
    /// memory goes with it.
    #[test]
    fn a_context_with_an_sm_count_owns_its_memory() {
        let b = broker(Duration::ZERO);
        let (mut c, _h) = connect(&b, "vm1");
        c.hello().unwrap();
        let create = |c: &mut TestClient<UnixStream>, sm_count| {
            c.call(
                &CtxCreateAffinity {
                    device: 0,
                    flags: 0,
                    sm_count,
                },
                &[],
            )
            .map(|r| r.0.handle)
        };
        let sms = crate::testutils::MEM_DEVICE_SMS as u32;
        for bad in [0, sms + 1] {
            assert_eq!(
                create(&mut c, bad).map_err(|e| e.0),
                Err(CUDA_ERROR_INVALID_VALUE),
                "{bad} multiprocessors"
            );
        }
        let ctx = create(&mut c, 2).unwrap();
        let ptr = alloc(&mut c, ctx, 4096).unwrap();
        assert_eq!(primary_active(&mut c), 0, "it holds no primary context");
        c.call(&CtxDestroy { ctx }, &[]).unwrap();
        let other = create_context(&mut c);
        assert!(
            c.call(
                &MemcpyDtoH {
                    ctx: other,
                    stream: 0,
                    src: ptr,
                    len: 4,
                },
                &[],
            )
            .is_err(),
            "its memory went with it"
        );
    }

    #[test]
    fn a_destroys_wait_ends_its_contexts_memory_waits_and_waits_on_a_ticket() {
        let b = broker(Duration::from_millis(300));
        let (mut c, _h, ctx) = open(&b, "vm1");
        let (mut waiter, _hw) = connect(&b, "vm1");
        waiter.hello().unwrap();
        let doomed = create_context(&mut c);
        let word = alloc(&mut c, doomed, 4).unwrap();
        let fill = |ctx, dst, count| Memset {
            ctx,
            stream: 0,
            dst,
            value: 0,
            elem_size: 1,
            count,
        };
        c.call(&fill(doomed, word, 4), &[]).unwrap();
        let held = c
            .call(
                &StreamCreate {
                    ctx: doomed,
                    flags: 1,
                    priority: 0,
                },
                &[],
            )
            .unwrap()
            .0
            .handle;
        // The doomed context's stream waits for a word nobody writes.
        c.call(
            &StreamMemOp {
                ctx: doomed,
                stream: held,
                op: mem_op::WAIT_VALUE_32,
                flags: mem_op::WAIT_GEQ,
                addr: word,
                value: 1,
            },
            &[],
        )
        .unwrap();
        // And the other context's legacy stream runs a 300 ms fill.
        let dst = alloc(&mut c, ctx, MIB).unwrap();
        c.post(&fill(ctx, dst, MIB), &[]).unwrap();
        let begin = |c: &mut TestClient<UnixStream>, ctx: u64| {
            c.call(
                &SyncBegin {
                    ctx,
                    kind: SYNC_DESTROY,
                    handle: 0,
                    wait_us: 1000,
                    token_hi: 9,
                    token_lo: 1,
                },
                &[],
            )
            .map(|r| r.0.value)
        };
        assert_eq!(begin(&mut c, doomed), Ok(SYNC_PENDING));
        // Done once the fill is: the held stream's wait ended (each SyncWait answers within 1 s).
        let t0 = Instant::now();
        let state = loop {
            let state = waiter
                .call(
                    &SyncWait {
                        token_hi: 9,
                        token_lo: 1,
                        timeout_ms: 1000,
                    },
                    &[],
                )
                .unwrap()
                .0
                .value;
            if state != SYNC_PENDING || t0.elapsed() > Duration::from_secs(10) {
                break state;
            }
        };
        assert_eq!(state, SYNC_DONE, "the destroy's wait never ended");
        c.call(
            &SyncFinish {
                ctx: doomed,
                kind: SYNC_DESTROY,
                handle: 0,
            },
            &[],
        )
        .unwrap();
        c.call(&CtxDestroy { ctx: doomed }, &[]).unwrap();
        // Refused as cuCtxDestroy refuses them, before anything waits.
        let primary = c
            .call(&PrimaryCtxRetain { device: 0 }, &[])
            .unwrap()
            .0
            .handle;
        for refused in [primary, doomed, 0xdead] {
            assert_eq!(
                begin(&mut c, refused).unwrap_err().0,
                CUDA_ERROR_INVALID_CONTEXT,
                "{refused:#x}"
            );
        }
        assert!(b.tenant("vm1").unwrap().sync_tickets.is_empty());
    }

    fn wait_used(b: &Broker, tenant: &str, want: u64) {
        let t = b.tenant(tenant).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while t.slice.used() != want {
            assert!(
                Instant::now() < deadline,
                "slice use stuck at {}",
                t.slice.used()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Device-to-host copies of 64 KiB and more go through the session's staging buffer in
    /// pieces, with no zeroed reply buffer: whole, in order, at any offset, and not stale after a
    /// larger one; a refused one gets its error and the session goes on.
    #[test]
    fn large_copies_back_arrive_whole_through_the_staging_buffer() {
        const LEN: usize = 4 << 20;
        let b = broker(Duration::ZERO);
        let (mut c, _h, ctx) = open(&b, "vm1");
        let p = alloc(&mut c, ctx, LEN as u64).unwrap();
        let data: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
        put(&mut c, ctx, p, &data).unwrap();
        let read = |c: &mut TestClient<UnixStream>, at: usize, len: usize| {
            c.call(
                &MemcpyDtoH {
                    ctx,
                    stream: 0,
                    src: p + at as u64,
                    len: len as u64,
                },
                &[],
            )
            .map(|(_, back)| back)
        };
        for (at, len) in [
            (0, LEN),
            (13, (1 << 20) + 7),
            (4096, IN_PLACE_MIN_BYTES),
            (5, IN_PLACE_MIN_BYTES - 1),
            (LEN - STAGE_BYTES - 3, STAGE_BYTES + 3),
        ] {
            let back = read(&mut c, at, len).unwrap();
            assert!(back == data[at..at + len], "{len} bytes from {at}");
        }
        let (code, _) = read(&mut c, LEN - 4096, 1 << 20).unwrap_err();
        assert_eq!(code, CUDA_ERROR_INVALID_VALUE);
        assert!(read(&mut c, 0, IN_PLACE_MIN_BYTES).unwrap() == data[..IN_PLACE_MIN_BYTES]);
    }

    #[test]
    fn copies_round_trip_through_the_session() {
        let b = broker(Duration::ZERO);
        let (mut c, _h, ctx) = open(&b, "vm1");
        let p = alloc(&mut c, ctx, 1000).unwrap();
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        put(&mut c, ctx, p, &data).unwrap();
        let (_, back) = c
            .call(
                &MemcpyDtoH {
                    ctx,
                    stream: 0,
                    src: p,
                    len: 1000,
                },
                &[],
            )
            .unwrap();
        assert_eq!(back, data);
        c.post(
            &Memset {
                ctx,
                stream: 0,
                dst: p + 4,
                value: 0xabcd_1234,
                elem_size: 4,
                count: 2,
            },
            &[],
        )
        .unwrap();
        let (_, back) = c
            .call(
                &MemcpyDtoH {
                    ctx,
                    stream: 0,
                    src: p,
                    len: 16,
                },
                &[],
            )
            .unwrap();
        assert_eq!(
            &back[4..12],
            &[0x34, 0x12, 0xcd, 0xab, 0x34, 0x12, 0xcd, 0xab]
        );
        assert_eq!(&back[..4], &data[..4]);
    }

    #[test]
    fn the_slice_is_a_hard_limit() {
        let b = broker(Duration::ZERO);
        let (mut c, _h, ctx) = open(&b, "vm1");
        let (_, _) = c.call(&MemGetInfo { ctx }, &[]).unwrap();
        let a = alloc(&mut c, ctx, 3 * MIB).unwrap();
        let (e, msg) = alloc(&mut c, ctx, 2 * MIB).unwrap_err();
        assert_eq!(e, CUDA_ERROR_OUT_OF_MEMORY);
        assert!(msg.contains("does not fit the memory slice"), "{msg}");
        let (info, _) = c.call(&MemGetInfo { ctx }, &[]).unwrap();
        assert_eq!((info.free, info.total), (MIB, 4 * MIB));
        c.call(&MemFree { ctx, ptr: a }, &[]).unwrap();
        alloc(&mut c, ctx, 4 * MIB).unwrap();
        assert_eq!(b.tenant("vm1").unwrap().slice.used(), 4 * MIB);
        // The other tenant's slice is untouched.
        assert_eq!(b.tenant("vm2").unwrap().slice.used(), 0);
    }

    #[test]
    fn foreign_stale_and_interior_pointers_are_refused() {
        let b = broker(Duration::ZERO);
        let (mut c1, _h1, ctx1) = open(&b, "vm1");
        let (mut c2, _h2, ctx2) = open(&b, "vm2");
        let p1 = alloc(&mut c1, ctx1, 4096).unwrap();
        c1.call(
            &MemcpyHtoD {
                ctx: ctx1,
                stream: 0,
                dst: p1,
            },
            b"secret",
        )
        .unwrap();
        // Another tenant can neither read, write nor free it.
        let read = c2.call(
            &MemcpyDtoH {
                ctx: ctx2,
                stream: 0,
                src: p1,
                len: 6,
            },
            &[],
        );
        assert_eq!(read.unwrap_err().0, CUDA_ERROR_INVALID_VALUE);
        let write = c2.call(
            &MemcpyHtoD {
                ctx: ctx2,
                stream: 0,
                dst: p1,
            },
            b"XXXXXX",
        );
        assert_eq!(write.unwrap_err().0, CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            c2.call(&MemFree { ctx: ctx2, ptr: p1 }, &[]).unwrap_err().0,
            CUDA_ERROR_INVALID_VALUE
        );
        // The owner's data is intact.
        let (_, back) = c1
            .call(
                &MemcpyDtoH {
                    ctx: ctx1,
                    stream: 0,
                    src: p1,
                    len: 6,
                },
                &[],
            )
            .unwrap();
        assert_eq!(back, b"secret");
        // Interior free, past-the-end copy, double free.
        let (e, m) = c1
            .call(
                &MemFree {
                    ctx: ctx1,
                    ptr: p1 + 8,
                },
                &[],
            )
            .unwrap_err();
        assert_eq!(e, CUDA_ERROR_INVALID_VALUE);
        assert!(m.contains("not its start"), "{m}");
        let past = c1.call(
            &MemcpyDtoH {
                ctx: ctx1,
                stream: 0,
                src: p1 + 4090,
                len: 7,
            },
            &[],
        );
        assert_eq!(past.unwrap_err().0, CUDA_ERROR_INVALID_VALUE);
        c1.call(&MemFree { ctx: ctx1, ptr: p1 }, &[]).unwrap();
        assert_eq!(
            c1.call(&MemFree { ctx: ctx1, ptr: p1 }, &[]).unwrap_err().0,
            CUDA_ERROR_INVALID_VALUE
        );
        let stale = c1.call(
            &MemcpyHtoD {
                ctx: ctx1,
                stream: 0,
                dst: p1,
            },
            b"x",
        );
        assert_eq!(stale.unwrap_err().0, CUDA_ERROR_INVALID_VALUE);
    }

    #[test]
    fn forged_handles_are_refused() {
        let b = broker(Duration::ZERO);
        let (mut c, _h, ctx) = open(&b, "vm1");
        let (mut c2, _h2, ctx2) = open(&b, "vm1");
        assert_eq!(
            alloc(&mut c, ctx + 1, 16).unwrap_err().0,
            CUDA_ERROR_INVALID_CONTEXT
        );
        assert_eq!(
            alloc(&mut c, 0, 16).unwrap_err().0,
            CUDA_ERROR_INVALID_CONTEXT
        );
        let s = c
            .call(
                &StreamCreate {
                    ctx,
                    flags: 0,
                    priority: 0,
                },
                &[],
            )
            .unwrap()
            .0
            .handle;
        // A handle of another session of the same VM means nothing here.
        let other = c2.call(
            &StreamSynchronize {
                ctx: ctx2,
                stream: s,
            },
            &[],
        );
        assert_eq!(other.unwrap_err().0, CUDA_ERROR_INVALID_HANDLE);
        let ev = c.call(&EventQuery { ctx, event: s }, &[]);
        assert_eq!(ev.unwrap_err().0, CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(
            c.call(&DeviceGetProperties { device: 1 }, &[])
                .unwrap_err()
                .0,
            CUDA_ERROR_INVALID_DEVICE
        );
    }

    #[test]
    fn async_errors_surface_at_the_next_synchronizing_call() {
        let b = broker(Duration::ZERO);
        let (mut c, _h, ctx) = open(&b, "vm1");
        let p = alloc(&mut c, ctx, 64).unwrap();
        c.post(
            &Memset {
                ctx,
                stream: 0,
                dst: 0xdead_0000,
                value: 0,
                elem_size: 1,
                count: 4,
            },
            &[],
        )
        .unwrap();
        // A non-synchronizing call is unaffected.
        alloc(&mut c, ctx, 64).unwrap();
        let (e, m) = c.call(&CtxSynchronize { ctx }, &[]).unwrap_err();
        assert_eq!(e, CUDA_ERROR_INVALID_VALUE);
        assert!(m.contains("0xdead0000"), "{m}");
        // Reported once, like a non-sticky CUDA error.
        c.call(&CtxSynchronize { ctx }, &[]).unwrap();
        c.post(
            &Memset {
                ctx,
                stream: 0,
                dst: p,
                value: 1,
                elem_size: 1,
                count: 64,
            },
            &[],
        )
        .unwrap();
        c.call(&CtxSynchronize { ctx }, &[]).unwrap();
    }

    #[test]
    fn streams_and_events_track_pending_work() {
        let b = broker(Duration::from_millis(60));
        let (mut c, _h, ctx) = open(&b, "vm1");
        let p = alloc(&mut c, ctx, 3 * MIB).unwrap();
        let s = c
            .call(
                &StreamCreate {
                    ctx,
                    flags: STREAM_NON_BLOCKING_TEST,
                    priority: 0,
                },
                &[],
            )
            .unwrap()
            .0
            .handle;
        let e0 = c
            .call(&EventCreate { ctx, flags: 0 }, &[])
            .unwrap()
            .0
            .handle;
        let e1 = c
            .call(&EventCreate { ctx, flags: 0 }, &[])
            .unwrap()
            .0
            .handle;
        c.post(
            &EventRecord {
                ctx,
                stream: s,
                event: e0,
            },
            &[],
        )
        .unwrap();
        for _ in 0..3 {
            c.post(
                &MemcpyDtoD {
                    ctx,
                    stream: s,
                    dst: p,
                    src: p + 2 * MIB,
                    len: MIB,
                },
                &[],
            )
            .unwrap();
        }
        c.post(
            &EventRecord {
                ctx,
                stream: s,
                event: e1,
            },
            &[],
        )
        .unwrap();
        // Work is still running: queries say so without blocking.
        assert_eq!(
            c.call(&StreamQuery { ctx, stream: s }, &[]).unwrap_err().0,
            CUDA_ERROR_NOT_READY
        );
        assert_eq!(
            c.call(&EventQuery { ctx, event: e1 }, &[]).unwrap_err().0,
            CUDA_ERROR_NOT_READY
        );
        c.call(&EventSynchronize { ctx, event: e1 }, &[]).unwrap();
        c.call(&StreamQuery { ctx, stream: s }, &[]).unwrap();
        let (el, _) = c
            .call(
                &EventElapsedTime {
                    ctx,
                    start: e0,
                    end: e1,
                },
                &[],
            )
            .unwrap();
        assert!(el.ms >= 150.0, "three 60 ms copies took {} ms", el.ms);
        let nt = c
            .call(
                &EventCreate {
                    ctx,
                    flags: EVENT_DISABLE_TIMING_TEST,
                },
                &[],
            )
            .unwrap()
            .0
            .handle;
        c.post(
            &EventRecord {
                ctx,
                stream: s,
                event: nt,
            },
            &[],
        )
        .unwrap();
        c.call(&StreamSynchronize { ctx, stream: s }, &[]).unwrap();
        let r = c.call(
            &EventElapsedTime {
                ctx,
                start: e0,
                end: nt,
            },
            &[],
        );
        assert_eq!(r.unwrap_err().0, CUDA_ERROR_INVALID_HANDLE);
    }

    const STREAM_NON_BLOCKING_TEST: u32 = crate::session::STREAM_NON_BLOCKING;
    const EVENT_DISABLE_TIMING_TEST: u32 = crate::session::EVENT_DISABLE_TIMING;

    #[test]
    fn a_wrong_protocol_version_is_refused_with_a_clear_error() {
        let b = broker(Duration::ZERO);
        let (mut c, h) = connect(&b, "vm1");
        let r = c.call(
            &Hello {
                protocol_version: 99,
                pid: 1,
                shim_version: "9.9".into(),
                process_name: "x".into(),
            },
            &[],
        );
        let (e, m) = r.unwrap_err();
        assert_eq!(e, CUDA_ERROR_SYSTEM_DRIVER_MISMATCH);
        assert!(m.contains("protocol 99"), "{m}");
        assert!(matches!(h.join().unwrap(), Err(ServeError::Refused(_))));
    }

    #[test]
    fn guest_strings_are_cut_and_escaped_before_they_are_kept() {
        let b = broker(Duration::ZERO);
        let (mut c, h) = connect(&b, "vm1");
        let r = c.call(
            &Hello {
                protocol_version: 99,
                pid: 1,
                shim_version: format!("1.0\n{}", "v".repeat(1 << 20)),
                process_name: "x".into(),
            },
            &[],
        );
        let (_, m) = r.unwrap_err();
        assert!(m.len() < 512, "{} bytes", m.len());
        assert!(m.contains("1.0\\nvvv") && !m.contains('\n'), "{m}");
        drop(h.join());
        assert_eq!(guest_text("a\u{1b}[2Jb", 10), "a\\u{1b}[2Jb");
        assert_eq!(guest_text(&"é".repeat(1000), 256).chars().count(), 256);
    }

    #[test]
    fn unknown_opcodes_and_malformed_payloads_get_errors_and_the_session_goes_on() {
        let b = broker(Duration::ZERO);
        let (mut c, _h, ctx) = open(&b, "vm1");
        frame::write_frame(&mut c.stream, 0x7e7e, 0, 77, 0, &[b"??"]).unwrap();
        let mut p = Vec::new();
        let h = frame::read_frame(&mut c.stream, &mut p).unwrap();
        assert_eq!((h.call_id, h.status), (77, CUDA_ERROR_NOT_SUPPORTED));
        // MemAlloc with a truncated payload.
        frame::write_frame(&mut c.stream, MemAlloc::OPCODE, 0, 78, 0, &[&[1, 2, 3]]).unwrap();
        let h = frame::read_frame(&mut c.stream, &mut p).unwrap();
        assert_eq!((h.call_id, h.status), (78, CUDA_ERROR_INVALID_VALUE));
        assert!(String::from_utf8_lossy(&p).contains("truncated"));
        alloc(&mut c, ctx, 16).unwrap();
    }

    /// A reader that hands out its bytes a few at a time, in sizes cycling through 1 to 13, so
    /// that frames arrive split at every point of their headers and payloads.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            const MAX_STEP: usize = 13;
            self.step = self.step % MAX_STEP + 1;
            let n = self.step.min(buf.len()).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    /// Serves the frames of `r` to a new session of a fresh broker's `vm1` and returns the
    /// frames it wrote back.
    fn serve_script(r: impl Read) -> Vec<(frame::Header, Vec<u8>)> {
        let b = broker(Duration::ZERO);
        let mut written = Vec::new();
        serve(&b, b.tenant("vm1").unwrap(), r, &mut written, "test").unwrap();
        let mut replies = io::Cursor::new(written);
        let mut frames = Vec::new();
        loop {
            let mut p = Vec::new();
            match frame::read_frame(&mut replies, &mut p) {
                Ok(h) => frames.push((h, p)),
                Err(FrameError::Closed) => return frames,
                Err(e) => panic!("bad reply stream: {e}"),
            }
        }
    }

    /// A script's first frames, `Hello`, `CtxCreate` and a `MemAlloc` of `size` bytes (call ids
    /// 1 to 3), and the context and the buffer a fresh broker gives the first session for them.
    fn script_opening(size: u64) -> (Vec<u8>, u64, u64) {
        let (ctx, ptr) = {
            let b = broker(Duration::ZERO);
            let (mut c, _h, ctx) = open(&b, "vm1");
            (ctx, alloc(&mut c, ctx, size).unwrap())
        };
        let hello = Hello {
            protocol_version: vgpu_proto::PROTOCOL_VERSION,
            pid: 1,
            shim_version: "test".into(),
            process_name: "test".into(),
        };
        let create = CtxCreate {
            device: 0,
            flags: 0,
        };
        let mut script = Vec::new();
        let opening: [(u16, Vec<u8>); 3] = [
            (Hello::OPCODE, encode(&hello)),
            (CtxCreate::OPCODE, encode(&create)),
            (MemAlloc::OPCODE, encode(&MemAlloc { ctx, size })),
        ];
        for (id, (opcode, payload)) in (1..).zip(&opening) {
            frame::write_frame(&mut script, *opcode, 0, id, 0, &[payload]).unwrap();
        }
        (script, ctx, ptr)
    }

    /// Serves `script` whole, and a few bytes at a time (every frame alone): the same replies,
    /// which it returns.
    fn serve_whole_and_split(script: Vec<u8>) -> Vec<(frame::Header, Vec<u8>)> {
        let whole = serve_script(io::Cursor::new(script.clone()));
        let split = serve_script(Trickle {
            data: script,
            at: 0,
            step: 0,
        });
        assert_eq!(split, whole);
        whole
    }

    #[test]
    fn frames_split_anywhere_are_served_as_whole_ones_are() {
        let (mut script, ctx, ptr) = script_opening(4096);
        let data: Vec<u8> = (0..100u8).collect();
        let mut put = |opcode: u16, flags: u16, id: u64, parts: &[&[u8]]| {
            frame::write_frame(&mut script, opcode, flags, id, 0, parts).unwrap();
        };
        let memset = Memset {
            ctx,
            stream: 0,
            dst: ptr,
            value: 7,
            elem_size: 1,
            count: 64,
        };
        put(Memset::OPCODE, frame::FLAG_ASYNC, 4, &[&encode(&memset)]);
        let htod = MemcpyHtoD {
            ctx,
            stream: 0,
            dst: ptr + 64,
        };
        put(
            MemcpyHtoD::OPCODE,
            frame::FLAG_ASYNC,
            5,
            &[&encode(&htod), &data],
        );
        put(0x7e7e, 0, 6, &[b"??"]);
        let dtoh = MemcpyDtoH {
            ctx,
            stream: 0,
            src: ptr,
            len: 164,
        };
        put(MemcpyDtoH::OPCODE, 0, 7, &[&encode(&dtoh)]);

        let whole = serve_whole_and_split(script);
        let ids: Vec<_> = whole.iter().map(|(h, _)| (h.call_id, h.status)).collect();
        assert_eq!(
            ids,
            [
                (1, 0),
                (2, 0),
                (3, 0),
                (6, CUDA_ERROR_NOT_SUPPORTED),
                (7, 0)
            ]
        );
        assert_eq!(whole[1].1, encode(&Handle { handle: ctx }));
        let copied = &whole[4].1;
        assert_eq!(copied[..64], [7; 64]);
        assert_eq!(copied[64..], data);
    }

    #[test]
    fn posted_calls_served_in_runs_leave_what_one_by_one_leaves() {
        const SIZE: u64 = 1 << 20;
        const BIG: u64 = 512 << 10; // a fill too large to run inline: queued for a worker
        const MANY: u64 = 1500; // more than one run holds (MAX_POSTED_RUN)
        let (mut script, ctx, ptr) = script_opening(SIZE);
        let mut put = |opcode: u16, flags: u16, id: u64, parts: &[&[u8]]| {
            frame::write_frame(&mut script, opcode, flags, id, 0, parts).unwrap();
        };
        let fill = |stream: u64, at: u64, value: u32, elem_size: u32, count: u64| Memset {
            ctx,
            stream,
            dst: ptr + at,
            value,
            elem_size,
            count,
        };
        let htod = |at: u64| MemcpyHtoD {
            ctx,
            stream: 0,
            dst: ptr + at,
        };
        let posted = [
            fill(0, 0, 1, 1, 256),
            fill(0, 64, 2, 1, 64),
            // Refused: a forged stream (the context's first error), a bad element size.
            fill(0xdead, 0, 9, 1, 1),
            fill(0, 0, 9, 3, 1),
            fill(0, 128, 3, 1, 64),
        ];
        for (id, m) in (10..).zip(&posted) {
            put(Memset::OPCODE, frame::FLAG_ASYNC, id, &[&encode(m)]);
        }
        let data: Vec<u8> = (0..100).collect();
        put(
            MemcpyHtoD::OPCODE,
            frame::FLAG_ASYNC,
            15,
            &[&encode(&htod(256)), &data],
        );
        // A posted Memset too short to decode ends a run: its error has no context.
        put(Memset::OPCODE, frame::FLAG_ASYNC, 20, &[b"short"]);
        let posted = [
            fill(0, 192, 0x0404_0404, 4, 16),
            fill(0, SIZE, 9, 1, 64),
            fill(0, 4096, 5, 1, BIG),
        ];
        for (id, m) in (21..).zip(&posted) {
            put(Memset::OPCODE, frame::FLAG_ASYNC, id, &[&encode(m)]);
        }
        // Behind the large fill, on a busy stream: queued, in order.
        let more: Vec<u8> = (100..200).collect();
        put(
            MemcpyHtoD::OPCODE,
            frame::FLAG_ASYNC,
            24,
            &[&encode(&htod(4096)), &more],
        );
        for i in 0..MANY {
            let m = fill(0, 1024 + i, (i % 251) as u32, 1, 1);
            put(Memset::OPCODE, frame::FLAG_ASYNC, 100 + i, &[&encode(&m)]);
        }
        let sync = encode(&CtxSynchronize { ctx });
        for id in 30..33 {
            put(CtxSynchronize::OPCODE, 0, id, &[&sync]);
        }
        let dtoh = MemcpyDtoH {
            ctx,
            stream: 0,
            src: ptr,
            len: 8192,
        };
        put(MemcpyDtoH::OPCODE, 0, 40, &[&encode(&dtoh)]);

        // Served whole, in runs, and a few bytes at a time, every frame alone: the same replies.
        let whole = serve_whole_and_split(script);
        let ids: Vec<_> = whole.iter().map(|(h, _)| (h.call_id, h.status)).collect();
        assert_eq!(
            ids,
            [
                (1, 0),
                (2, 0),
                (3, 0),
                // Each error once, the context's first, then the one of no context.
                (30, CUDA_ERROR_INVALID_HANDLE),
                (31, CUDA_ERROR_INVALID_VALUE),
                (32, 0),
                (40, 0)
            ]
        );
        assert!(String::from_utf8_lossy(&whole[4].1).contains("rejected"));
        let mem = &whole[6].1;
        assert_eq!(mem[..64], [1; 64]);
        assert_eq!(mem[64..128], [2; 64]);
        assert_eq!(mem[128..192], [3; 64]);
        assert_eq!(mem[192..256], [4; 64]);
        assert_eq!(mem[256..356], data);
        assert_eq!(mem[356..1024], [0; 668]);
        let many: Vec<u8> = (0..MANY).map(|i| (i % 251) as u8).collect();
        assert_eq!(mem[1024..1024 + MANY as usize], many);
        assert_eq!(mem[4096..4196], more);
        assert_eq!(mem[4196..], [5; 8192 - 4196]);
    }

    #[test]
    fn device_output_is_a_feature_the_client_enables() {
        let b = broker(Duration::ZERO);
        let (mut c, _h, ctx) = open(&b, "vm1");
        let (f, _) = c.call(&SetFeatures { features: u64::MAX }, &[]).unwrap();
        assert_eq!(f.features, FEATURES, "only the features the server knows");
        c.call(&CtxSynchronize { ctx }, &[]).unwrap();
        assert_eq!(c.last_flags, FLAG_REPLY, "no output waits");
        let (o, _) = c.call(&TakeOutput { max_bytes: 1 << 30 }, &[]).unwrap();
        assert!(o.stdout.is_empty() && o.stderr.is_empty() && o.more == 0);
        c.call(
            &CtxSetLimit {
                ctx,
                limit: 1,
                value: 4096,
            },
            &[],
        )
        .unwrap();
        let e = c
            .call(
                &CtxSetLimit {
                    ctx,
                    limit: 1,
                    value: 1 << 40,
                },
                &[],
            )
            .unwrap_err();
        assert_eq!(e.0, CUDA_ERROR_OUT_OF_MEMORY);
        let e = c
            .call(
                &CtxSetLimit {
                    ctx,
                    limit: 0,
                    value: 1,
                },
                &[],
            )
            .unwrap_err();
        assert_eq!(e.0, CUDA_ERROR_UNSUPPORTED_LIMIT);
        // The OUTPUT flag is the server's to send: in a request it breaks the protocol.
        frame::write_frame(&mut c.stream, Ping::OPCODE, FLAG_OUTPUT, 90, 0, &[]).unwrap();
        let mut p = Vec::new();
        assert!(frame::read_frame(&mut c.stream, &mut p).is_err());
    }

    #[test]
    fn the_device_heap_size_is_set_within_the_slice() {
        let b = broker(Duration::ZERO);
        let (mut c, _h, ctx) = open(&b, "vm1");
        let set = |c: &mut TestClient<UnixStream>, value| {
            c.call(
                &CtxSetLimit {
                    ctx,
                    limit: 2,
                    value,
                },
                &[],
            )
        };
        set(&mut c, MIB).unwrap();
        set(&mut c, 0).unwrap();
        let e = set(&mut c, 4 * MIB + 1).unwrap_err();
        assert_eq!(e.0, CUDA_ERROR_OUT_OF_MEMORY, "past the 4 MiB slice");
        // Setting it charges nothing: the heap is made at the first launch that needs it.
        alloc(&mut c, ctx, 4 * MIB).unwrap();
        set(&mut c, 4 * MIB).unwrap();
    }

    #[test]
    fn the_device_runtimes_limits_are_bounded() {
        let b = broker(Duration::ZERO);
        let (mut c, _h, ctx) = open(&b, "vm1");
        let mut set = |limit, value| c.call(&CtxSetLimit { ctx, limit, value }, &[]);
        // CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH: 0 to 24 levels.
        for ok in [0, 2, 24] {
            set(3, ok).unwrap();
        }
        assert_eq!(set(3, 25).unwrap_err().0, CUDA_ERROR_INVALID_VALUE);
        assert_eq!(set(3, u64::MAX).unwrap_err().0, CUDA_ERROR_INVALID_VALUE);
        // CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: 1 to 131 072.
        set(4, 1).unwrap();
        set(4, 1 << 17).unwrap();
        assert_eq!(set(4, 0).unwrap_err().0, CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            set(4, (1 << 17) + 1).unwrap_err().0,
            CUDA_ERROR_INVALID_VALUE
        );
    }

    #[test]
    fn protocol_violations_close_the_session_and_free_its_memory() {
        let b = broker(Duration::ZERO);
        for bad in [
            // Bad magic.
            {
                let mut h = [0u8; HEADER_LEN];
                h[..4].copy_from_slice(b"NOPE");
                h.to_vec()
            },
            // Length past the maximum.
            frame::Header {
                opcode: 0x301,
                flags: 0,
                call_id: 1,
                payload_len: 0,
                status: 0,
            }
            .encode()
            .iter()
            .enumerate()
            .map(|(i, &x)| if (16..20).contains(&i) { 0xff } else { x })
            .collect(),
            // A header cut short, then the client disappears.
            MAGIC.to_le_bytes()[..3].to_vec(),
        ] {
            let (mut c, h, ctx) = open(&b, "vm1");
            alloc(&mut c, ctx, MIB).unwrap();
            wait_used(&b, "vm1", MIB);
            c.stream.write_all(&bad).unwrap();
            c.stream.shutdown(std::net::Shutdown::Write).unwrap();
            assert!(h.join().unwrap().is_err());
            wait_used(&b, "vm1", 0);
        }
        // Async flag on a call that needs a reply.
        let (mut c, h, ctx) = open(&b, "vm1");
        c.post(&MemGetInfo { ctx }, &[]).unwrap();
        let e = h.join().unwrap().unwrap_err();
        assert!(
            e.to_string().contains("cannot be sent asynchronously"),
            "{e}"
        );
        // Other sessions are unaffected throughout.
        let (mut c, _h, ctx) = open(&b, "vm1");
        alloc(&mut c, ctx, MIB).unwrap();
    }

    #[test]
    fn a_client_that_vanishes_releases_everything() {
        let b = broker(Duration::ZERO);
        let (mut c, h, ctx) = open(&b, "vm1");
        for _ in 0..3 {
            alloc(&mut c, ctx, MIB).unwrap();
        }
        c.call(
            &StreamCreate {
                ctx,
                flags: 0,
                priority: 0,
            },
            &[],
        )
        .unwrap();
        assert_eq!(b.tenant("vm1").unwrap().sessions().len(), 1);
        drop(c);
        h.join().unwrap().unwrap();
        wait_used(&b, "vm1", 0);
        assert!(b.tenant("vm1").unwrap().sessions().is_empty());
        assert_eq!(b.device("gpu0").unwrap().memory_used(), 0);
    }

    fn set_limits(b: &Broker, tenant: &str, f: impl FnOnce(&mut vgpu_config::limits::VmLimits)) {
        let t = b.tenant(tenant).unwrap();
        let mut l = t.limits.limits();
        f(&mut l);
        t.limits.set_limits(l);
    }

    fn stream(c: &mut TestClient<UnixStream>, ctx: u64) -> Result<u64, (u32, String)> {
        c.call(
            &StreamCreate {
                ctx,
                flags: 0,
                priority: 0,
            },
            &[],
        )
        .map(|r| r.0.handle)
    }

    fn event(c: &mut TestClient<UnixStream>, ctx: u64) -> Result<u64, (u32, String)> {
        c.call(&EventCreate { ctx, flags: 0 }, &[])
            .map(|r| r.0.handle)
    }

    fn wait_budget(b: &Broker, tenant: &str, budget: vgpu_config::limits::Budget, want: u64) {
        let t = b.tenant(tenant).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while t.limits.used(budget) != want {
            assert!(
                Instant::now() < deadline,
                "{} stuck at {}",
                budget.key(),
                t.limits.used(budget)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn stream_event_and_handle_budgets_are_the_vms_and_come_back() {
        use vgpu_config::limits::Budget;
        let b = broker(Duration::ZERO);
        set_limits(&b, "vm1", |l| {
            l.streams = 3;
            l.events = 2;
            l.handles = 3;
        });
        let (mut c1, _h1, ctx1) = open(&b, "vm1");
        let (mut c2, h2, ctx2) = open(&b, "vm1");
        // Streams: the VM's sessions share its budget; past it, OUT_OF_MEMORY.
        let s1 = stream(&mut c1, ctx1).unwrap();
        stream(&mut c2, ctx2).unwrap();
        stream(&mut c2, ctx2).unwrap();
        let (code, msg) = stream(&mut c1, ctx1).unwrap_err();
        assert_eq!(code, CUDA_ERROR_OUT_OF_MEMORY);
        assert!(msg.contains("limits.streams"), "{msg}");
        // The other VM does not notice.
        let (mut o, _ho, octx) = open(&b, "vm2");
        for _ in 0..8 {
            stream(&mut o, octx).unwrap();
        }
        // A destroy makes room; create/destroy far past the budget keeps working.
        c1.call(
            &StreamDestroy {
                ctx: ctx1,
                stream: s1,
            },
            &[],
        )
        .unwrap();
        for _ in 0..200 {
            let s = stream(&mut c1, ctx1).unwrap();
            c1.call(
                &StreamDestroy {
                    ctx: ctx1,
                    stream: s,
                },
                &[],
            )
            .unwrap();
        }
        // Events likewise.
        let e1 = event(&mut c1, ctx1).unwrap();
        event(&mut c2, ctx2).unwrap();
        assert_eq!(
            event(&mut c1, ctx1).unwrap_err().0,
            CUDA_ERROR_OUT_OF_MEMORY
        );
        c1.call(
            &EventDestroy {
                ctx: ctx1,
                event: e1,
            },
            &[],
        )
        .unwrap();
        event(&mut c1, ctx1).unwrap();
        // Other handles: the two contexts hold two of three; one more context fits.
        let (extra, _) = c1
            .call(
                &CtxCreate {
                    device: 0,
                    flags: 0,
                },
                &[],
            )
            .unwrap();
        let e = c1.call(
            &CtxCreate {
                device: 0,
                flags: 0,
            },
            &[],
        );
        assert_eq!(e.unwrap_err().0, CUDA_ERROR_OUT_OF_MEMORY);
        c1.call(&CtxDestroy { ctx: extra.handle }, &[]).unwrap();
        let t = b.tenant("vm1").unwrap();
        assert_eq!(t.limits.used(Budget::Handles), 2);
        assert_eq!(t.limits.refused(Budget::Streams), 1);
        assert_eq!(t.limits.refused(Budget::Events), 1);
        assert_eq!(t.limits.refused(Budget::Handles), 1);
        assert_eq!(b.tenant("vm2").unwrap().limits.refused(Budget::Streams), 0);
        // A session's end returns everything it held.
        drop(c2);
        h2.join().unwrap().unwrap();
        assert_eq!(t.limits.used(Budget::Streams), 0);
        assert_eq!(t.limits.used(Budget::Events), 1);
        assert_eq!(t.limits.used(Budget::Handles), 1);
        stream(&mut c1, ctx1).unwrap();
    }

    #[test]
    fn queued_copies_wait_for_room_in_the_vms_budget_and_complete() {
        use vgpu_config::limits::Budget;
        const SESSIONS: usize = 3;
        const COPIES: usize = 12;
        const BUDGET: u64 = 4 * MIB;
        let b = broker(Duration::ZERO);
        set_limits(&b, "vm1", |l| l.queued_bytes = BUDGET);
        let (mut opener, _ho, _) = open(&b, "vm1");
        let mut writers = Vec::new();
        let mut checks = Vec::new();
        for i in 0..SESSIONS as u64 {
            let (mut c, h, ctx) = open(&b, "vm1");
            let p = alloc(&mut c, ctx, MIB).unwrap();
            // The stream stops at a host function until the opener says it ran:
            // every copy after it is queued.
            c.call(
                &StreamHostFunc {
                    ctx,
                    stream: 0,
                    token_hi: 7,
                    token_lo: i,
                },
                &[],
            )
            .unwrap();
            let mut s = c.stream.try_clone().unwrap();
            writers.push(std::thread::spawn(move || {
                let mut w = TestClient::new(&mut s);
                for k in 0..COPIES as u64 {
                    let data = vec![(i * 16 + k) as u8; (MIB / 2) as usize];
                    w.post(
                        &MemcpyHtoD {
                            ctx,
                            stream: 0,
                            dst: p,
                        },
                        &data,
                    )
                    .unwrap();
                }
            }));
            checks.push((c, h, ctx, p, i));
        }
        let t = b.tenant("vm1").unwrap();
        // The VM's sessions queue up to the budget, no further.
        wait_budget(&b, "vm1", Budget::QueuedBytes, BUDGET);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(t.limits.used(Budget::QueuedBytes), BUDGET);
        assert!(t.limits.refused(Budget::QueuedBytes) >= 1);
        // The other VM is not held back.
        let (mut o, _h, octx) = open(&b, "vm2");
        let q = alloc(&mut o, octx, MIB).unwrap();
        o.call(
            &MemcpyHtoD {
                ctx: octx,
                stream: 0,
                dst: q,
            },
            &[1; 1000],
        )
        .unwrap();
        for i in 0..SESSIONS as u64 {
            opener
                .call(
                    &HostFuncDone {
                        token_hi: 7,
                        token_lo: i,
                    },
                    &[],
                )
                .unwrap();
        }
        for w in writers {
            w.join().unwrap();
        }
        for (mut c, _h, ctx, p, i) in checks {
            // Call ids restart in the cloned client; a fresh sync call still works.
            c.call(&CtxSynchronize { ctx }, &[]).unwrap();
            let (_, v) = c
                .call(
                    &MemcpyDtoH {
                        ctx,
                        stream: 0,
                        src: p,
                        len: 4,
                    },
                    &[],
                )
                .unwrap();
            assert_eq!(v, vec![(i * 16 + COPIES as u64 - 1) as u8; 4]);
        }
        wait_budget(&b, "vm1", Budget::QueuedBytes, 0);
    }

    #[test]
    fn an_async_flood_is_bounded_and_the_session_stays_usable() {
        let b = broker(Duration::from_micros(200));
        let (mut c, _h, ctx) = open(&b, "vm1");
        let p = alloc(&mut c, ctx, 64).unwrap();
        // Far more than the queue holds; the sender is slowed by back-pressure.
        let n = crate::engine::MAX_QUEUED_JOBS * 2;
        let writer = {
            let mut s = c.stream.try_clone().unwrap();
            std::thread::spawn(move || {
                let mut w = TestClient::new(&mut s);
                for i in 0..n {
                    w.post(
                        &Memset {
                            ctx,
                            stream: 0,
                            dst: p,
                            value: i as u32,
                            elem_size: 4,
                            count: 16,
                        },
                        &[],
                    )
                    .unwrap();
                }
            })
        };
        writer.join().unwrap();
        // Call ids restart in the cloned client; a fresh sync call still works.
        c.call(&CtxSynchronize { ctx }, &[]).unwrap();
        let (_, v) = c
            .call(
                &MemcpyDtoH {
                    ctx,
                    stream: 0,
                    src: p,
                    len: 4,
                },
                &[],
            )
            .unwrap();
        assert_eq!(u32::from_le_bytes(v.try_into().unwrap()), (n - 1) as u32);
    }

    #[test]
    fn primary_context_is_refcounted_and_reset_frees_its_memory() {
        let b = broker(Duration::ZERO);
        let (mut c, _h) = connect(&b, "vm1");
        c.hello().unwrap();
        let p1 = c
            .call(&PrimaryCtxRetain { device: 0 }, &[])
            .unwrap()
            .0
            .handle;
        let p2 = c
            .call(&PrimaryCtxRetain { device: 0 }, &[])
            .unwrap()
            .0
            .handle;
        assert_eq!(p1, p2);
        alloc(&mut c, p1, MIB).unwrap();
        let st = c.call(&PrimaryCtxGetState { device: 0 }, &[]).unwrap().0;
        assert_eq!(st.active, 1);
        c.call(&PrimaryCtxRelease { device: 0 }, &[]).unwrap();
        assert_eq!(b.tenant("vm1").unwrap().slice.used(), MIB);
        c.call(&PrimaryCtxRelease { device: 0 }, &[]).unwrap();
        assert_eq!(b.tenant("vm1").unwrap().slice.used(), 0);
        assert_eq!(
            c.call(&PrimaryCtxGetState { device: 0 }, &[])
                .unwrap()
                .0
                .active,
            0
        );
        assert_eq!(
            c.call(&PrimaryCtxRelease { device: 0 }, &[]).unwrap_err().0,
            CUDA_ERROR_INVALID_CONTEXT
        );
        assert_eq!(
            c.call(&CtxDestroy { ctx: p1 }, &[]).unwrap_err().0,
            CUDA_ERROR_INVALID_CONTEXT
        );
    }

    #[test]
    fn destroying_a_context_frees_what_it_allocated() {
        let b = broker(Duration::ZERO);
        let (mut c, _h, ctx) = open(&b, "vm1");
        let other = c
            .call(
                &CtxCreate {
                    device: 0,
                    flags: 0,
                },
                &[],
            )
            .unwrap()
            .0
            .handle;
        alloc(&mut c, ctx, MIB).unwrap();
        let keep = alloc(&mut c, other, MIB).unwrap();
        c.call(&CtxDestroy { ctx }, &[]).unwrap();
        assert_eq!(b.tenant("vm1").unwrap().slice.used(), MIB);
        assert_eq!(
            alloc(&mut c, ctx, 1).unwrap_err().0,
            CUDA_ERROR_INVALID_CONTEXT
        );
        c.call(
            &MemFree {
                ctx: other,
                ptr: keep,
            },
            &[],
        )
        .unwrap();
    }

    #[test]
    fn tenant_info_lists_this_vms_sessions_only() {
        let b = broker(Duration::ZERO);
        let (mut c, _h, ctx) = open(&b, "vm1");
        let (_c2, _h2, _) = open(&b, "vm2");
        alloc(&mut c, ctx, MIB).unwrap();
        let j = c.call(&TenantInfo {}, &[]).unwrap().0.json;
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["vm"], "vm1");
        assert_eq!(v["memory_used"], MIB);
        assert_eq!(v["memory_total"], 4 * MIB);
        assert_eq!(v["sessions"].as_array().unwrap().len(), 1);
        assert_eq!(v["sessions"][0]["memory_used"], MIB);
        assert_eq!(v["sessions"][0]["contexts"], 1);
        assert_eq!(v["share_1s"], 0.0, "no kernel ran: {v}");
        let ctx2 = create_context(&mut c);
        let contexts = |c: &mut TestClient<UnixStream>| {
            let j = c.call(&TenantInfo {}, &[]).unwrap().0.json;
            let v: serde_json::Value = serde_json::from_str(&j).unwrap();
            v["sessions"][0]["contexts"].as_u64()
        };
        assert_eq!(contexts(&mut c), Some(2));
        c.call(&CtxDestroy { ctx: ctx2 }, &[]).unwrap();
        c.call(&CtxDestroy { ctx }, &[]).unwrap();
        assert_eq!(contexts(&mut c), Some(0));
        c.call(&PrimaryCtxRetain { device: 0 }, &[]).unwrap();
        assert_eq!(contexts(&mut c), Some(1));
        c.call(&PrimaryCtxRelease { device: 0 }, &[]).unwrap();
        assert_eq!(
            contexts(&mut c),
            Some(0),
            "a released primary context is not in use"
        );
    }

    /// A unix socket that lends what it reads in runs of at most `run` bytes, counting them: a
    /// stand-in for a transport whose buffer the session may read in place.
    struct Lending {
        s: UnixStream,
        run: usize,
        lent: Arc<AtomicU64>,
    }

    impl Read for Lending {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.s.read(buf)
        }
    }

    impl ReadInPlace for Lending {
        fn read_in_place(
            &mut self,
            len: usize,
            f: &mut vgpu_proto::frame::RunFn<'_>,
        ) -> io::Result<()> {
            let mut buf = vec![0u8; self.run];
            let mut left = len;
            let lent = &self.lent;
            // Counts what `f` is handed.
            let mut counted = |runs: &[&[u8]]| {
                let n: usize = runs.iter().map(|r| r.len()).sum();
                lent.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                f(runs)
            };
            let mut to = vgpu_proto::frame::Borrower::new(&mut counted);
            while left > 0 {
                let n = self.s.read(&mut buf[..left.min(self.run)])?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                left -= n;
                // Two slices, as a ring's wrap gives them.
                let (a, b) = buf[..n].split_at(n / 3);
                to.offer(&[a, b]);
            }
            Ok(())
        }
    }

    fn connect_lending(
        b: &Arc<Broker>,
        tenant: &str,
        lent: &Arc<AtomicU64>,
    ) -> (TestClient<UnixStream>, Served, u64) {
        let (c, s) = UnixStream::pair().unwrap();
        let b2 = Arc::clone(b);
        let t = b.tenant(tenant).unwrap();
        let reader = Lending {
            s: s.try_clone().unwrap(),
            run: 3000,
            lent: Arc::clone(lent),
        };
        let h = std::thread::spawn(move || serve_in_place(&b2, t, reader, &s, "test", None));
        let mut c = TestClient::new(c);
        c.hello().unwrap();
        let ctx = create_context(&mut c);
        (c, h, ctx)
    }

    fn read_back(c: &mut TestClient<UnixStream>, ctx: u64, src: u64, len: usize) -> Vec<u8> {
        let mut got = Vec::new();
        for at in (0..len).step_by(MAX_BULK_CHUNK) {
            let n = (len - at).min(MAX_BULK_CHUNK);
            let req = MemcpyDtoH {
                ctx,
                stream: 0,
                src: src + at as u64,
                len: n as u64,
            };
            got.extend(c.call(&req, &[]).unwrap().1);
        }
        got
    }

    #[test]
    fn large_copies_from_a_lending_transport_go_to_device_memory_in_place() {
        let b = broker(Duration::ZERO);
        let lent = Arc::new(AtomicU64::new(0));
        let (mut c, h, ctx) = connect_lending(&b, "vm1", &lent);
        let len = MAX_BULK_CHUNK / 2 + 13;
        let p = alloc(&mut c, ctx, len as u64).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 31 + i / 3000) as u8).collect();
        // Synchronous, then asynchronous and checked at a synchronizing call.
        let htod = |dst| MemcpyHtoD {
            ctx,
            stream: 0,
            dst,
        };
        c.call(&htod(p), &data).unwrap();
        assert!(read_back(&mut c, ctx, p, len) == data, "the copy arrived");
        assert!(
            lent.load(std::sync::atomic::Ordering::Relaxed) >= (len - IN_PLACE_IO_BUFFER) as u64,
            "the bytes were lent, not read into a request buffer"
        );
        let rev: Vec<u8> = data.iter().rev().copied().collect();
        c.post(&htod(p), &rev).unwrap();
        c.call(&CtxSynchronize { ctx }, &[]).unwrap();
        assert!(
            read_back(&mut c, ctx, p, len) == rev,
            "the async copy arrived"
        );
        // Small copies are read whole, as on any transport.
        c.call(&htod(p + 1), b"tiny").unwrap();
        let mut want = rev.clone();
        want[1..5].copy_from_slice(b"tiny");
        assert!(
            read_back(&mut c, ctx, p, len) == want,
            "the small copy arrived"
        );

        // A refused copy (a pointer not of this process, a range past the allocation, a forged
        // stream) skips its bytes: the session answers it and goes on.
        let (e, _) = c.call(&htod(0xdead_0000), &data).unwrap_err();
        assert_eq!(e, CUDA_ERROR_INVALID_VALUE);
        let (e, _) = c.call(&htod(p + 1), &data).unwrap_err();
        assert_eq!(e, CUDA_ERROR_INVALID_VALUE);
        let forged = MemcpyHtoD {
            ctx,
            stream: 0x0707_0707,
            dst: p,
        };
        let (e, _) = c.call(&forged, &data).unwrap_err();
        assert_eq!(e, CUDA_ERROR_INVALID_HANDLE);
        c.post(&htod(0xdead_0000), &data).unwrap();
        let (e, _) = c.call(&CtxSynchronize { ctx }, &[]).unwrap_err();
        assert_eq!(
            e, CUDA_ERROR_INVALID_VALUE,
            "reported at the next synchronizing call"
        );
        assert!(
            read_back(&mut c, ctx, p, len) == want,
            "nothing was written"
        );

        // A client that leaves in the middle of a copy's bytes ends its session, which frees
        // its memory.
        let mut head = Vec::new();
        htod(p).encode(&mut head);
        let header = frame::Header {
            opcode: MemcpyHtoD::OPCODE,
            flags: 0,
            call_id: 100,
            payload_len: (head.len() + len) as u32,
            status: 0,
        };
        c.stream.write_all(&header.encode()).unwrap();
        c.stream.write_all(&head).unwrap();
        c.stream.write_all(&data[..len / 2]).unwrap();
        drop(c);
        let r = h.join().unwrap();
        assert!(
            matches!(r, Err(ServeError::Frame(FrameError::Truncated))),
            "{r:?}"
        );
        wait_used(&b, "vm1", 0);
    }

    #[test]
    fn a_large_asynchronous_copy_to_a_busy_stream_is_queued_not_waited_for() {
        // Every device operation takes this long: the stream is busy for a while.
        let b = broker(Duration::from_millis(300));
        let lent = Arc::new(AtomicU64::new(0));
        let (mut c, _h, ctx) = connect_lending(&b, "vm1", &lent);
        let len = MAX_BULK_CHUNK / 4;
        let p = alloc(&mut c, ctx, len as u64).unwrap();
        let s = stream(&mut c, ctx).unwrap();
        let memset = Memset {
            ctx,
            stream: s,
            dst: p,
            value: 1,
            elem_size: 1,
            count: len as u64,
        };
        c.post(&memset, &[]).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        c.post(
            &MemcpyHtoD {
                ctx,
                stream: s,
                dst: p,
            },
            &data,
        )
        .unwrap();
        // The session answers at once: the copy waits on its stream, not in the session.
        assert_eq!(
            c.call(&StreamQuery { ctx, stream: s }, &[]).unwrap_err().0,
            CUDA_ERROR_NOT_READY
        );
        c.call(&StreamSynchronize { ctx, stream: s }, &[]).unwrap();
        assert!(
            read_back(&mut c, ctx, p, len) == data,
            "after the memset, in order"
        );
    }

    /// Bulk bytes in borrowed pieces, as the virtio-vgpu device lends guest pages.
    struct Pieces(Vec<Vec<u8>>);

    impl crate::session::BulkSource for Pieces {
        fn len(&self) -> u64 {
            self.0.iter().map(|p| p.len() as u64).sum()
        }
        fn read(&self, f: &mut crate::session::ReadSlices<'_>) -> Result<(), CuError> {
            let v: Vec<&[u8]> = self.0.iter().map(Vec::as_slice).collect();
            f(&v)
        }
    }

    impl crate::session::BulkSink for Pieces {
        fn capacity(&self) -> u64 {
            crate::session::BulkSource::len(self)
        }
        fn write(
            &mut self,
            len: u64,
            f: &mut crate::session::WriteSlices<'_>,
        ) -> Result<(), CuError> {
            let mut left = len as usize;
            let mut v: Vec<&mut [u8]> = Vec::new();
            for p in &mut self.0 {
                let n = p.len().min(left);
                left -= n;
                v.push(&mut p[..n]);
            }
            f(&mut v)
        }
    }

    fn bulk_session(b: &Arc<Broker>) -> (crate::session::Session, u64) {
        let hello = Hello {
            protocol_version: vgpu_proto::PROTOCOL_VERSION,
            pid: 7,
            shim_version: "t".into(),
            process_name: "bulk".into(),
        };
        let (mut s, reply) = accept_hello(b, b.tenant("vm1").unwrap(), &hello, "test").unwrap();
        assert_eq!(reply.tenant, "vm1");
        assert_eq!(s.info().process_name, "bulk");
        let mut out = Vec::new();
        let req = Request::CtxCreate(CtxCreate {
            device: 0,
            flags: 0,
        });
        s.handle(&req, &[], &mut out, true).unwrap();
        let (h, _) = decode_exact::<Handle>(&out, false).unwrap();
        (s, h.handle)
    }

    #[test]
    fn bulk_copies_go_straight_between_borrowed_pieces_and_device_memory() {
        use crate::session::{BulkSink, NoBulk};
        // A slow device keeps earlier work queued when the zero-copy copy arrives.
        let b = broker(Duration::from_millis(30));
        let (mut s, ctx) = bulk_session(&b);
        let mut out = Vec::new();
        s.handle(
            &Request::MemAlloc(MemAlloc { ctx, size: 10_000 }),
            &[],
            &mut out,
            true,
        )
        .unwrap();
        let p = decode_exact::<Ptr>(&out, false).unwrap().0.ptr;
        // Queue a slow memset, then an asynchronous zero-copy write over part of it.
        let memset = Request::Memset(Memset {
            ctx,
            stream: 0,
            dst: p,
            value: 0x11,
            elem_size: 1,
            count: 10_000,
        });
        s.handle(&memset, &[], &mut out, false).unwrap();
        let data: Vec<u8> = (0..9000u32).map(|i| (i % 253) as u8).collect();
        let src = Pieces(vec![data[100..4000].to_vec(), data[4000..9000].to_vec()]);
        let htod = Request::MemcpyHtoD(MemcpyHtoD {
            ctx,
            stream: 0,
            dst: p,
        });
        s.handle_bulk(&htod, &data[..100], &src, &mut NoBulk, &mut out, false)
            .unwrap();
        assert_eq!(
            b.tenant("vm1")
                .unwrap()
                .stats
                .bytes_htod
                .load(std::sync::atomic::Ordering::Relaxed),
            9000
        );
        // Read it back into three pieces; the memset ran first, then the copy.
        let mut sink = Pieces(vec![vec![0; 5000], vec![0; 3000], vec![0; 4000]]);
        let dtoh = Request::MemcpyDtoH(MemcpyDtoH {
            ctx,
            stream: 0,
            src: p,
            len: 10_000,
        });
        out.clear();
        s.handle_bulk(&dtoh, &[], &NoBulk, &mut sink, &mut out, true)
            .unwrap();
        assert!(
            out.is_empty(),
            "the reply struct is empty; the data went to the sink"
        );
        let got: Vec<u8> = sink.0.concat();
        assert_eq!(&got[..9000], &data[..]);
        assert_eq!(&got[9000..10_000], &[0x11; 1000][..]);
        // A destination too small, and a foreign pointer, are refused without touching it.
        let mut small = Pieces(vec![vec![7; 100]]);
        let e = s
            .handle_bulk(&dtoh, &[], &NoBulk, &mut small, &mut out, true)
            .unwrap_err();
        assert!(e.message.contains("destination holds 100"), "{e:?}");
        assert_eq!(small.capacity(), 100);
        assert_eq!(small.0[0], vec![7; 100]);
        let bad = Request::MemcpyHtoD(MemcpyHtoD {
            ctx,
            stream: 0,
            dst: p + 9_999,
        });
        let e = s
            .handle_bulk(
                &bad,
                &[],
                &Pieces(vec![vec![1, 2]]),
                &mut NoBulk,
                &mut out,
                true,
            )
            .unwrap_err();
        assert_eq!(e.code, CUDA_ERROR_INVALID_VALUE);
        // Other ops run as with `handle`.
        let ping = Request::Ping(Ping {});
        s.handle_bulk(&ping, &[], &NoBulk, &mut NoBulk, &mut out, true)
            .unwrap();
    }
}
