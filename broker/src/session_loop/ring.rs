//! Sessions on an in-process ring ([`FrameRing`]) whose quick calls the thread that delivers
//! their bytes may answer itself ([`AnswerHere`]): vgpud's vsock device thread, which then needs
//! no hand-off to the session's thread and back for a call that takes microseconds.
//!
//! The session's state (the [`Session`], its reader and buffers) is shared under one lock. The
//! session thread holds it while it works and lets go only to wait for bytes, after it sent its
//! replies; the delivering thread only tries the lock. So a frame is run by one thread or the
//! other, in the order the frames came, and the replies go out in that order too.

use std::io::{BufReader, Read, Write};
use std::ops::ControlFlow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use vgpu_proto::frame::{
    AnswerHere, Answered, FrameError, FrameRing, HEADER_LEN, Header, ReadInPlace, WriteInPlace,
};
use vgpu_proto::msg::Request;

use super::{
    IN_PLACE_IO_BUFFER, IN_PLACE_MIN_BYTES, InPlace, Lend, Replier, ServeError, SessionSummary,
    read_next, reply_flags, serve_inner, step, write_dtoh_header, write_err, write_ok,
};
use crate::Broker;
use crate::session::Session;
use crate::tenant::Tenant;

/// The largest frame (header and payload) the delivering thread answers itself: small calls and
/// small copies; larger copies stay with the session thread, which reads their bytes in place.
pub const MAX_FRAME_HERE: usize = 64 << 10;
/// The most frames the delivering thread answers in one [`AnswerHere::answer_here`] call: a guest
/// that floods quick calls holds up its own device thread no longer than that.
pub const MAX_ANSWERED_HERE: usize = 64;

/// [`super::serve_in_place`] on a transport whose received bytes another thread may take whole
/// frames from ([`FrameRing`]: vgpud's in-process vsock rings). With `answer_here`, the thread
/// that delivers the bytes (the vsock device's) answers quick calls itself while this thread
/// waits ([`AnswerHere`]): synchronous requests that [`Session::answers_at_once`], complete in
/// the ring, of at most [`MAX_FRAME_HERE`] bytes, whose replies fit the room towards the client.
/// Everything else, and every frame while this thread works, is served here as by
/// [`super::serve_in_place`].
pub fn serve_ring<R, W: Write>(
    broker: &Broker,
    tenant: Arc<Tenant>,
    end: Arc<R>,
    writer: W,
    transport: &str,
    hangup: Option<crate::engine::HangupProbe>,
    answer_here: bool,
) -> Result<SessionSummary, ServeError>
where
    R: FrameRing + Send + Sync + 'static,
    for<'a> &'a R: Read + ReadInPlace + WriteInPlace,
{
    fn lend<R>(r: &mut SharedRead<R>) -> &mut dyn ReadInPlace
    where
        for<'a> &'a R: ReadInPlace,
    {
        r
    }
    let r = BufReader::with_capacity(IN_PLACE_IO_BUFFER, SharedRead(Arc::clone(&end)));
    let run = |session: Session,
               r: BufReader<SharedRead<R>>,
               w: &mut Replier<W>,
               payload: Vec<u8>,
               summary: &mut SessionSummary| {
        let ring = Arc::new(RingSession {
            end,
            core: Mutex::new(RingCore {
                session: Some(session),
                r,
                payload,
                summary: *summary,
                pending: Vec::new(),
                failed: None,
                frame: Vec::new(),
                out: Vec::new(),
                reply: Vec::new(),
                run: Vec::new(),
            }),
        });
        if answer_here {
            let answerer: Arc<dyn AnswerHere> = ring.clone();
            ring.end.answer_with(Arc::downgrade(&answerer));
        }
        let result = ring.serve(lend::<R>, w);
        *summary = ring.lock().summary;
        result
    };
    serve_inner(broker, tenant, r, run, writer, transport, hangup, None)
}

/// Reads through an `Arc` of a stream whose shared references read (`&SessionEnd`).
struct SharedRead<R>(Arc<R>);

impl<R> Read for SharedRead<R>
where
    for<'a> &'a R: Read,
{
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&*self.0).read(buf)
    }
}

impl<R> ReadInPlace for SharedRead<R>
where
    for<'a> &'a R: ReadInPlace,
{
    fn read_in_place(
        &mut self,
        len: usize,
        f: &mut vgpu_proto::frame::RunFn<'_>,
    ) -> std::io::Result<()> {
        (&*self.0).read_in_place(len, f)
    }
}

/// What the session thread and the delivering thread share.
struct RingSession<R> {
    end: Arc<R>,
    core: Mutex<RingCore<R>>,
}

/// The session's state, under [`RingSession::core`].
struct RingCore<R> {
    /// `None` once the session thread is done: nothing more is answered.
    session: Option<Session>,
    r: BufReader<SharedRead<R>>,
    payload: Vec<u8>,
    summary: SessionSummary,
    /// Reply bytes the delivering thread could not write: the session thread writes them first.
    pending: Vec<u8>,
    /// The session broke while the delivering thread answered: the session thread ends with it.
    failed: Option<ServeError>,
    /// The frame the delivering thread answers, copied out of the ring.
    frame: Vec<u8>,
    /// A reply's payload (of whichever thread serves the frame).
    out: Vec<u8>,
    /// The whole reply the delivering thread writes.
    reply: Vec<u8>,
    /// A run of posted calls the session thread serves together.
    run: Vec<crate::session::PostedCall>,
}

impl<R> RingSession<R>
where
    R: FrameRing + Send + Sync + 'static,
    for<'a> &'a R: Read + ReadInPlace + WriteInPlace,
{
    fn lock(&self) -> MutexGuard<'_, RingCore<R>> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session thread's loop: serves what the ring holds, sends the replies, lets go of the
    /// state and waits for more. Drops the session before it returns.
    fn serve<W: Write>(
        &self,
        lend: Lend<SharedRead<R>>,
        w: &mut Replier<W>,
    ) -> Result<(), ServeError> {
        let mut ended = false;
        loop {
            let mut core = self.lock();
            let result = core.round(&*self.end, lend, w, ended);
            if !matches!(result, Ok(ControlFlow::Continue(()))) {
                let session = core.session.take();
                drop(core);
                drop(session);
                return result.map(|_| ());
            }
            drop(core);
            match self.end.wait_readable() {
                Ok(more) => ended = !more,
                Err(e) => {
                    let session = self.lock().session.take();
                    drop(session);
                    return Err(FrameError::Io(e).into());
                }
            }
        }
    }
}

impl<R> RingCore<R>
where
    R: FrameRing,
    for<'a> &'a R: Read + ReadInPlace + WriteInPlace,
{
    /// One round of the session thread, under the lock: what the delivering thread left, then
    /// every frame the reader's buffer and the ring hold (all the rest of the stream once it
    /// `ended`), then the replies. Breaks when the session is over.
    fn round<W: Write>(
        &mut self,
        end: &R,
        lend: Lend<SharedRead<R>>,
        w: &mut Replier<W>,
        ended: bool,
    ) -> Result<ControlFlow<()>, ServeError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if !self.pending.is_empty() {
            w.w.write_all(&self.pending).map_err(ServeError::Io)?;
            self.pending.clear();
        }
        let Some(session) = self.session.as_mut() else {
            return Ok(ControlFlow::Break(()));
        };
        while ended || !self.r.buffer().is_empty() || end.readable() > 0 {
            let mut fill = end;
            let flow = step(
                session,
                &mut self.r,
                Some(lend),
                InPlace::Transport(&mut fill),
                w,
                &mut self.payload,
                &mut self.summary,
                &mut self.out,
                &mut self.run,
            )?;
            if flow.is_break() {
                return Ok(flow);
            }
        }
        w.flush()?;
        Ok(ControlFlow::Continue(()))
    }

    /// Answers the frame at the front of the ring if it is quick and whole.
    fn answer_one(&mut self, end: &R) -> Front {
        let RingCore {
            session,
            summary,
            pending,
            failed,
            frame,
            out,
            reply,
            ..
        } = self;
        let Some(session) = session.as_mut() else {
            return Front::Theirs;
        };
        let mut hb = [0u8; HEADER_LEN];
        if end.peek(&mut hb) < HEADER_LEN {
            return Front::Incomplete;
        }
        // A bad header or flags are the session thread's to report.
        let Ok(h) = Header::decode(&hb) else {
            return Front::Theirs;
        };
        let len = HEADER_LEN + h.payload_len as usize;
        if h.is_async()
            || h.is_reply()
            || h.has_output()
            || len > MAX_FRAME_HERE
            || !session.answers_at_once(h.opcode)
        {
            return Front::Theirs;
        }
        if end.readable() < len {
            return Front::Incomplete;
        }
        frame.resize(len, 0);
        if end.peek(frame) < len {
            return Front::Theirs;
        }
        let Ok((req, tail_at)) = Request::decode(h.opcode, &frame[HEADER_LEN..]) else {
            return Front::Theirs;
        };
        // The reply must fit the room towards the client: this thread cannot wait for it.
        let room = end.writable().saturating_sub(HEADER_LEN);
        if let Request::MemcpyDtoH(m) = &req
            && m.len > room as u64
        {
            return Front::Theirs;
        }
        end.consume(len);
        summary.requests += 1;
        if let Request::MemcpyDtoH(m) = &req
            && m.len as usize >= IN_PLACE_MIN_BYTES
        {
            *failed = answer_dtoh_here(session, &h, &req, end, reply).err();
            return Front::Answered;
        }
        out.clear();
        let tail = &frame[HEADER_LEN + tail_at..];
        let Ok(result) = catch_unwind(AssertUnwindSafe(|| session.handle(&req, tail, out, true)))
        else {
            *failed = Some(ServeError::Panic(req.name()));
            return Front::Answered;
        };
        let flags = reply_flags(session);
        reply.clear();
        let written = match &result {
            Ok(()) => write_ok(reply, h.opcode, flags, h.call_id, out),
            Err(e) => write_err(reply, h.opcode, flags, h.call_id, e),
        };
        if let Err(e) = written {
            *failed = Some(e);
            return Front::Answered;
        }
        match end.write_here(reply) {
            Ok(n) => pending.extend_from_slice(&reply[n..]),
            Err(e) => *failed = Some(ServeError::Io(e)),
        }
        Front::Answered
    }
}

/// A large `MemcpyDtoH` answered on the delivering thread, whose reply fits the room towards
/// the client: its bytes go from device memory straight into that room, with no reply buffer (as
/// the session thread's [`super::dtoh_in_place`] does with the guest's rx buffers). A failure
/// after the header cuts the stream there; the session thread ends the session.
fn answer_dtoh_here<R: FrameRing>(
    session: &mut Session,
    h: &Header,
    req: &Request,
    end: &R,
    reply: &mut Vec<u8>,
) -> Result<(), ServeError> {
    let checked = catch_unwind(AssertUnwindSafe(|| session.dtoh_lent(req)))
        .map_err(|_| ServeError::Panic(req.name()))?;
    let flags = reply_flags(session);
    reply.clear();
    let mut source = match checked {
        Ok(source) => source,
        Err(e) => {
            write_err(reply, h.opcode, flags, h.call_id, &e)?;
            return write_all_here(end, reply);
        }
    };
    let len = source.left() as usize;
    write_dtoh_header(reply, h, flags, len).map_err(ServeError::Io)?;
    write_all_here(end, reply)?;
    let mut cut = None;
    let produced = catch_unwind(AssertUnwindSafe(|| {
        end.fill_here(len, &mut |room| read_next(&mut source, &mut cut, room))
    }))
    .map_err(|_| ServeError::Panic(req.name()))?
    .map_err(ServeError::Io)?;
    match cut {
        Some(e) => Err(ServeError::ReplyCut(e)),
        None if produced < len => Err(ServeError::Io(std::io::Error::other(
            "the reply's bytes did not fit the room checked for them",
        ))),
        None => Ok(()),
    }
}

/// Writes all of `bytes` towards the client without waiting: the room was checked for them.
fn write_all_here<R: FrameRing>(end: &R, bytes: &[u8]) -> Result<(), ServeError> {
    match end.write_here(bytes) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(_) => Err(ServeError::Io(std::io::Error::other(
            "a reply did not fit the room checked for it",
        ))),
        Err(e) => Err(ServeError::Io(e)),
    }
}

impl<R> AnswerHere for RingSession<R>
where
    R: FrameRing + Send + Sync + 'static,
    for<'a> &'a R: Read + ReadInPlace + WriteInPlace,
{
    fn answer_here(&self) -> Answered {
        let mut core = match self.core.try_lock() {
            Ok(core) => core,
            Err(TryLockError::WouldBlock | TryLockError::Poisoned(_)) => {
                return Answered {
                    calls: 0,
                    wake_reader: true,
                };
            }
        };
        let mut calls = 0;
        let mut front = Front::Theirs;
        // The session thread lets go of the state only with its reader's buffer empty and its
        // replies sent; frames it buffered are its own to serve.
        while calls < MAX_ANSWERED_HERE
            && core.failed.is_none()
            && core.pending.is_empty()
            && core.r.buffer().is_empty()
        {
            front = core.answer_one(&*self.end);
            if front != Front::Answered {
                break;
            }
            calls += 1;
        }
        if core.failed.is_some() || !core.pending.is_empty() {
            self.end.kick();
        }
        Answered {
            calls,
            wake_reader: front != Front::Incomplete,
        }
    }
}

/// The frame at the front of the ring, as the delivering thread found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Front {
    /// Answered (or the session broke on it: the session thread reports that).
    Answered,
    /// Not whole yet, and quick as far as it is known: taken once it is.
    Incomplete,
    /// The session thread's to serve.
    Theirs,
}
