//! The connection to vgpud: frames requests, batches asynchronous ones, and
//! waits for the replies of synchronous ones.
//!
//! Over a byte stream (unix socket, vsock) frames are written and read in
//! order. Over the virtio-vgpu device ([`crate::devlink`]) each synchronous
//! frame is one ioctl, small asynchronous ones are batched (one ioctl and one
//! device request per batch) when the device takes batches, and large bulk
//! bytes are passed by address, never copied here.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use vgpu_proto::cuda::{self, CuResult};
use vgpu_proto::frame::{FLAG_ASYNC, HEADER_LEN, Header, MAX_BULK_CHUNK, MAX_PAYLOAD};
use vgpu_proto::msg::{self, Op};

use crate::devlink::{DevLink, MAX_BATCH_FRAMES, ReplyTooLarge};
use crate::transport::{Link, Stream, StreamLink};

/// Reply frame buffer of the device transport: room for every reply but very
/// large `TenantInfo` documents (the module pins it for each call). A query
/// whose reply is larger is asked again with a buffer of the size the device
/// reported ([`QUERIES`]); other replies that large (only error messages can
/// be) arrive shortened by the device.
pub const DEVICE_REPLY_BUFFER: usize = 64 << 10;
/// Ops without side effects: asking again is harmless, so a reply that did not
/// fit the device transport's reply buffer is fetched again with a larger one
/// ([`QUERY_RETRIES`]).
pub const QUERIES: [u16; 5] = [
    msg::TenantInfo::OPCODE,
    msg::ModuleFunctionNames::OPCODE,
    msg::DeviceGetProperties::OPCODE,
    msg::DeviceGetCount::OPCODE,
    msg::MemGetInfo::OPCODE,
];
/// How often a query whose reply did not fit is asked again, each time with the room the device
/// reported plus an eighth ([`QUERY_HEADROOM_DIVISOR`]): a live answer (TenantInfo's figures)
/// may have grown between two asks.
const QUERY_RETRIES: usize = 3;
/// The room added to a reply size the device reported: `needed / QUERY_HEADROOM_DIVISOR`.
const QUERY_HEADROOM_DIVISOR: usize = 8;
/// Synchronous requests that return with their work done and leave none queued: waits,
/// queries, synchronous copies, synchronous fills and device-to-device copies (vgpud answers
/// those once their stream's work, their own included, is done), allocations (which queue
/// nothing) and frees (which vgpud runs once all earlier work is done). [`Client::enqueued`]
/// does not count them; sent asynchronously, they count.
pub const LEAVES_NO_WORK: [u16; 21] = [
    msg::Ping::OPCODE,
    msg::TakeOutput::OPCODE,
    msg::TenantInfo::OPCODE,
    msg::MemGetInfo::OPCODE,
    msg::CtxSynchronize::OPCODE,
    msg::StreamSynchronize::OPCODE,
    msg::EventSynchronize::OPCODE,
    msg::StreamQuery::OPCODE,
    msg::EventQuery::OPCODE,
    msg::SyncBegin::OPCODE,
    msg::SyncWait::OPCODE,
    msg::SyncFinish::OPCODE,
    msg::MemcpyDtoH::OPCODE,
    msg::MemcpyHtoD::OPCODE,
    msg::MemcpyDtoHShared::OPCODE,
    msg::MemcpyHtoDShared::OPCODE,
    msg::Memset::OPCODE,
    msg::MemcpyDtoD::OPCODE,
    msg::MemAlloc::OPCODE,
    msg::MemAllocPitch::OPCODE,
    msg::MemFree::OPCODE,
];
/// Frames with at most this many bulk bytes travel in the batch, their bytes copied into it
/// (over a stream, and over the device when it takes batches); larger ones go out on their own,
/// their bytes written (stream) or read by the device (device) in place.
pub const BATCH_TAIL_MAX: usize = 4096;
/// Chunks of one device-to-host copy in flight at once over the device.
pub const DEVICE_WINDOW: usize = 8;
/// Requests of one device-to-host copy in flight at once over a stream: two, so that vgpud
/// reads the next chunk from the device while the shim reads the last one from the socket.
pub const STREAM_WINDOW: usize = 2;
/// Reply buffer of each chunk in flight: a copy's reply is a bare frame header,
/// or a short error message.
const CHUNK_REPLY_BUFFER: usize = 4096;

/// Most bytes of device output one `TakeOutput` asks for: its reply fits the device
/// transport's reply buffer.
pub const OUTPUT_CHUNK: u32 = (DEVICE_REPLY_BUFFER - 1024) as u32;

/// Asynchronous frames are sent once this many bytes are pending, once
/// [`DEFAULT_FLUSH_INTERVAL`] has passed since the last send, or at the next
/// synchronous call, whichever comes first. `VGPU_ASYNC_BATCH=0` sends each
/// at once.
pub const DEFAULT_ASYNC_BATCH: usize = 64 << 10;
/// After a synchronous call vgpud has nothing left of this client's to run: the next batch of
/// asynchronous frames is sent at this size, and each one after it twice the size of the one
/// before, up to the batch size, so that vgpud starts on them at once instead of waiting for a
/// whole batch.
pub const FIRST_ASYNC_BATCH: usize = 1 << 10;
/// Longest time an asynchronous frame waits in the batch (`VGPU_FLUSH_US`).
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_micros(50);
/// Asynchronous calls between two looks at the clock for the flush interval on the calling
/// thread: a look costs about 22 ns here, a fifth of what a posted call costs vgpud, and the
/// driver's flush thread keeps the interval for calls that stop coming.
pub const POSTS_PER_CLOCK_LOOK: u32 = 16;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    /// The `CUresult`.
    pub code: CuResult,
    /// Why, as the host or the shim put it.
    pub message: String,
}

impl CallError {
    /// An error with a code and a message.
    pub fn new(code: CuResult, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    fn lost(e: &io::Error) -> Self {
        Self::new(
            cuda::CUDA_ERROR_DEVICE_UNAVAILABLE,
            format!("the connection to vgpud is lost: {e}"),
        )
    }

    /// An ioctl of the device transport failed. Errors the module reports before queueing the
    /// frame (bad pointer, length, too large) leave the session usable; the others mean the
    /// session is gone.
    fn device(e: &io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::EFAULT | libc::EINVAL | libc::E2BIG) => Self::new(
                cuda::CUDA_ERROR_INVALID_VALUE,
                format!("the vgpu device refused the request: {e}"),
            ),
            None if ReplyTooLarge::of(e).is_some() => {
                Self::new(cuda::CUDA_ERROR_UNKNOWN, e.to_string())
            }
            Some(libc::ENOMEM) => Self::new(cuda::CUDA_ERROR_OUT_OF_MEMORY, e.to_string()),
            _ => Self::lost(e),
        }
    }
}

enum Conn {
    Stream(Box<dyn Stream>),
    Device(DevLink),
}

/// A session with vgpud.
pub struct Client {
    conn: Conn,
    wbuf: Vec<u8>,
    scratch: Vec<u8>,
    rbuf: Vec<u8>,
    /// Reply buffers of the chunks of a copy in flight (device transport).
    chunk_replies: Vec<Vec<u8>>,
    /// Frames in `wbuf` (device transport: the batch).
    batched: usize,
    call_id: u64,
    batch: usize,
    /// The size at which the next batch is sent: [`FIRST_ASYNC_BATCH`] after a synchronous
    /// call, doubling with each batch up to `batch`.
    ramp: usize,
    flush_interval: Duration,
    last_flush: Instant,
    /// Asynchronous calls since the clock was last looked at ([`POSTS_PER_CLOCK_LOOK`]).
    unclocked: u32,
    broken: Option<String>,
    /// A reply said device output is waiting (`FLAG_OUTPUT`).
    output_pending: bool,
    /// Where fetched device output goes: (bytes, stderr?).
    output_sink: fn(&[u8], bool),
    /// The optional features vgpud has ([`Client::features`]).
    features: u64,
    /// Requests sent that may have left work queued in vgpud ([`Client::enqueued`]).
    enqueued: u64,
    /// The unix socket again, for frames that carry a descriptor ([`Client::call_with_fd`]).
    fd_channel: Option<std::os::unix::net::UnixStream>,
    /// Tells the stream how long a reply should take, when its reads poll.
    expect: Option<vgpu_proto::spin::Expectation>,
    /// The doorbell page for shared-memory copies ([`crate::doorbell`]).
    bell: crate::doorbell::BellState,
    /// Bytes written to the stream so far (a rung request waits for vgpud to have read them).
    sent: u64,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("call_id", &self.call_id)
            .field("pending", &self.wbuf.len())
            .finish()
    }
}

impl Client {
    /// A client over a connection; call [`Client::hello`] next.
    pub fn with_link(link: Link) -> Self {
        match link {
            Link::Stream(StreamLink {
                stream,
                fds,
                expect,
            }) => {
                let mut c = Self::new(stream);
                c.fd_channel = fds;
                c.expect = expect;
                c
            }
            Link::Device(d) => {
                let mut c = Self::build(Conn::Device(d));
                c.rbuf = vec![0; DEVICE_REPLY_BUFFER];
                c
            }
        }
    }

    /// The device session, when the client runs over `/dev/vgpuN`.
    pub fn device(&self) -> Option<&DevLink> {
        match &self.conn {
            Conn::Device(d) => Some(d),
            Conn::Stream(_) => None,
        }
    }

    /// Most bulk bytes one copy request should carry on this connection.
    pub fn max_chunk(&self) -> usize {
        match &self.conn {
            Conn::Device(d) => d.max_transfer().clamp(1, MAX_BULK_CHUNK),
            Conn::Stream(_) => MAX_BULK_CHUNK,
        }
    }

    /// A client over a connected stream; call [`Client::hello`] next.
    pub fn new(stream: Box<dyn Stream>) -> Self {
        Self::build(Conn::Stream(stream))
    }

    fn build(conn: Conn) -> Self {
        let batch = std::env::var("VGPU_ASYNC_BATCH")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_ASYNC_BATCH);
        let flush_interval = std::env::var("VGPU_FLUSH_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(DEFAULT_FLUSH_INTERVAL, Duration::from_micros);
        Self {
            conn,
            wbuf: Vec::with_capacity(batch + BATCH_TAIL_MAX),
            scratch: Vec::new(),
            rbuf: Vec::new(),
            chunk_replies: Vec::new(),
            batched: 0,
            call_id: 0,
            batch,
            ramp: FIRST_ASYNC_BATCH,
            flush_interval,
            last_flush: Instant::now(),
            unclocked: 0,
            broken: None,
            output_pending: false,
            output_sink: crate::devout::write,
            features: 0,
            enqueued: 0,
            fd_channel: None,
            expect: None,
            bell: crate::doorbell::BellState::default(),
            sent: 0,
        }
    }

    /// Whether this connection can pass descriptors (a unix socket).
    pub fn passes_fds(&self) -> bool {
        self.fd_channel.is_some()
    }

    /// Sends a synchronous request with `fd` attached (`SCM_RIGHTS`) and waits for its reply.
    /// Only on a unix socket ([`Client::passes_fds`]); elsewhere `CUDA_ERROR_NOT_SUPPORTED`.
    pub fn call_with_fd<O: Op>(
        &mut self,
        req: &O,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<O::Reply, CallError> {
        self.exchange(|c| {
            if c.fd_channel.is_none() {
                return Err(CallError::new(
                    cuda::CUDA_ERROR_NOT_SUPPORTED,
                    "this transport cannot pass descriptors",
                ));
            }
            // Earlier frames first: the descriptor must arrive with this frame's bytes.
            c.flush()?;
            let id = c.frame(req, 0, 0);
            c.sending(c.scratch.len());
            if let Some(ch) = &c.fd_channel {
                vgpu_proto::fdpass::send_with_fd(std::os::fd::AsFd::as_fd(ch), &c.scratch, fd)
                    .map_err(|e| CallError::lost(&e))?;
                c.sent += c.scratch.len() as u64;
            }
            let h = c.read_header(id, O::OPCODE)?;
            if h.status != 0 {
                return Err(c.read_error(&h));
            }
            c.rbuf.resize(h.payload_len as usize, 0);
            let Conn::Stream(stream) = &mut c.conn else {
                return Err(CallError::new(cuda::CUDA_ERROR_UNKNOWN, "not a stream"));
            };
            stream
                .read_exact(&mut c.rbuf)
                .map_err(|e| CallError::lost(&e))?;
            let (r, _) = msg::decode_reply::<O>(&c.rbuf)
                .map_err(|e| CallError::lost(&io::Error::other(format!("malformed reply: {e}"))))?;
            Ok(r)
        })
    }

    /// Sends fetched device output to `sink` instead of the process's stdout and stderr.
    pub fn set_output_sink(&mut self, sink: fn(&[u8], bool)) {
        self.output_sink = sink;
    }

    /// Performs the handshake, then enables the optional features vgpud has (a vgpud without
    /// `SetFeatures` answers `CUDA_ERROR_NOT_SUPPORTED`: none).
    pub fn hello(&mut self, process_name: &str) -> Result<msg::HelloReply, CallError> {
        let req = msg::Hello {
            protocol_version: vgpu_proto::PROTOCOL_VERSION,
            pid: std::process::id(),
            shim_version: vgpu_proto::VERSION.to_string(),
            process_name: process_name.to_string(),
        };
        let hello = self.call(&req, &[])?.0;
        let features = msg::SetFeatures {
            features: msg::FEATURE_DEVICE_OUTPUT | msg::FEATURE_SYNC_TICKETS,
        };
        match self.call(&features, &[]) {
            Ok((f, _)) => self.features = f.features,
            Err(e) if e.code == cuda::CUDA_ERROR_NOT_SUPPORTED => {}
            Err(e) => return Err(e),
        }
        Ok(hello)
    }

    /// The optional features (`msg::FEATURE_*`) vgpud said it has at [`Client::hello`].
    pub fn features(&self) -> u64 {
        self.features
    }

    /// Fetches the device output a reply announced and writes it out. Best effort: an error
    /// here loses the output, not the call's result.
    fn take_output(&mut self) {
        while std::mem::take(&mut self.output_pending) {
            let req = msg::TakeOutput {
                max_bytes: OUTPUT_CHUNK,
            };
            match self.call_inner(&req, &[]) {
                Ok((o, _)) => {
                    (self.output_sink)(&o.stderr, true);
                    (self.output_sink)(&o.stdout, false);
                    self.output_pending |= o.more != 0;
                }
                Err(e) => {
                    crate::debug!("device output lost: {}", e.message);
                    self.output_pending = false;
                    break;
                }
            }
        }
    }

    fn check(&self) -> Result<(), CallError> {
        match &self.broken {
            Some(m) => Err(CallError::new(
                cuda::CUDA_ERROR_DEVICE_UNAVAILABLE,
                m.clone(),
            )),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: CallError) -> CallError {
        if e.code == cuda::CUDA_ERROR_DEVICE_UNAVAILABLE && self.broken.is_none() {
            crate::warn!("{}", e.message);
            self.broken = Some(e.message.clone());
        }
        e
    }

    /// Runs one exchange with vgpud, `f`: refused at once when the connection is lost; after
    /// it, the device output it announced is fetched, and an error that lost the connection
    /// marks the client broken.
    fn exchange<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        self.check()?;
        let r = f(self);
        self.ramp = FIRST_ASYNC_BATCH;
        self.take_output();
        r.map_err(|e| self.fail(e))
    }

    /// Requests sent so far that may have left work queued in vgpud: every asynchronous one, and
    /// every synchronous one but those that return with their work done ([`LEAVES_NO_WORK`]).
    /// Equal counts at two moments mean no work was sent between them.
    pub fn enqueued(&self) -> u64 {
        self.enqueued
    }

    fn count_request(&mut self, opcode: u16, flags: u16) {
        if flags & FLAG_ASYNC != 0 || !LEAVES_NO_WORK.contains(&opcode) {
            self.enqueued += 1;
        }
    }

    /// Encodes a frame's header and fields into `scratch` (bulk bytes not included).
    fn frame<O: Op>(&mut self, req: &O, tail_len: usize, flags: u16) -> u64 {
        self.count_request(O::OPCODE, flags);
        self.call_id += 1;
        let mut fields = std::mem::take(&mut self.scratch);
        fields.clear();
        fields.resize(HEADER_LEN, 0);
        req.encode(&mut fields);
        let h = Header {
            opcode: O::OPCODE,
            flags,
            call_id: self.call_id,
            payload_len: (fields.len() - HEADER_LEN + tail_len) as u32,
            status: 0,
        };
        fields[..HEADER_LEN].copy_from_slice(&h.encode());
        self.scratch = fields;
        self.call_id
    }

    /// Queues a frame; its tail is written straight from the caller's memory
    /// when it is large.
    fn enqueue<O: Op>(&mut self, req: &O, tail: &[u8], flags: u16) -> Result<u64, CallError> {
        if let Conn::Device(d) = &self.conn {
            debug_assert!(flags & FLAG_ASYNC != 0);
            let limit = if d.batches() && tail.len() <= BATCH_TAIL_MAX {
                self.batch.min(d.info().max_inline as usize)
            } else {
                0
            };
            let id = self.frame(req, tail.len(), flags);
            let len = self.scratch.len() + tail.len();
            if len <= limit {
                // Into the batch, sent when full, by the next call, or by the flush thread.
                if self.wbuf.len() + len > limit || self.batched == MAX_BATCH_FRAMES {
                    self.flush()?;
                }
                self.wbuf.extend_from_slice(&self.scratch);
                self.wbuf.extend_from_slice(tail);
                self.batched += 1;
                return Ok(id);
            }
            // Alone; after the frames batched before it.
            self.flush()?;
            if let Conn::Device(d) = &self.conn {
                d.post(&self.scratch, tail)
                    .map_err(|e| CallError::device(&e))?;
            }
            return Ok(id);
        }
        self.count_request(O::OPCODE, flags);
        self.call_id += 1;
        self.scratch.clear();
        req.encode(&mut self.scratch);
        let h = Header {
            opcode: O::OPCODE,
            flags,
            call_id: self.call_id,
            payload_len: (self.scratch.len() + tail.len()) as u32,
            status: 0,
        };
        self.wbuf.extend_from_slice(&h.encode());
        self.wbuf.extend_from_slice(&self.scratch);
        if tail.len() <= BATCH_TAIL_MAX {
            self.wbuf.extend_from_slice(tail);
        } else {
            self.flush()?;
            self.sending(tail.len());
            self.stream_mut()?
                .write_all(tail)
                .map_err(|e| CallError::lost(&e))?;
            self.sent += tail.len() as u64;
        }
        Ok(self.call_id)
    }

    fn stream_mut(&mut self) -> Result<&mut Box<dyn Stream>, CallError> {
        match &mut self.conn {
            Conn::Stream(s) => Ok(s),
            Conn::Device(_) => Err(CallError::new(
                cuda::CUDA_ERROR_UNKNOWN,
                "a stream operation on the device transport",
            )),
        }
    }

    /// A synchronous frame over the device: the reply frame lands in `rbuf`, the reply's bulk
    /// bytes in `out`. Returns the reply header and the reply payload's length.
    fn device_call<O: Op>(
        &mut self,
        req: &O,
        tail: &[u8],
        out: &mut [u8],
    ) -> Result<(Header, usize, usize), CallError> {
        // Batched asynchronous frames go first (sequence order is submission order).
        self.flush()?;
        if self.rbuf.len() > DEVICE_REPLY_BUFFER {
            // Grown for one large query: every call pins the whole buffer.
            self.rbuf = vec![0; DEVICE_REPLY_BUFFER];
        }
        let mut id = self.frame(req, tail.len(), 0);
        let Conn::Device(d) = &self.conn else {
            return Err(CallError::new(cuda::CUDA_ERROR_UNKNOWN, "not a device"));
        };
        let mut r = d.call(&self.scratch, tail, &mut self.rbuf, out);
        for _ in 0..QUERY_RETRIES {
            let Err(e) = &r else { break };
            let Some(big) = ReplyTooLarge::of(e) else {
                break;
            };
            if !QUERIES.contains(&O::OPCODE) || big.needed > HEADER_LEN + MAX_PAYLOAD {
                break;
            }
            // With room to spare: the answer is live (TenantInfo's figures) and may have grown.
            let room = big
                .needed
                .saturating_add(big.needed / QUERY_HEADROOM_DIVISOR)
                .min(HEADER_LEN + MAX_PAYLOAD);
            self.rbuf = vec![0; room];
            id = self.frame(req, tail.len(), 0);
            let Conn::Device(d) = &self.conn else {
                return Err(CallError::new(cuda::CUDA_ERROR_UNKNOWN, "not a device"));
            };
            r = d.call(&self.scratch, tail, &mut self.rbuf, out);
        }
        let (reply_len, out_done) = r.map_err(|e| CallError::device(&e))?;
        if reply_len < HEADER_LEN || reply_len > self.rbuf.len() {
            return Err(CallError::lost(&io::Error::other(format!(
                "the device returned a {reply_len}-byte reply frame"
            ))));
        }
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&self.rbuf[..HEADER_LEN]);
        let h = Header::decode(&hb).map_err(|e| CallError::lost(&io::Error::other(e)))?;
        self.output_pending |= h.has_output();
        if !h.is_reply()
            || h.call_id != id
            || h.opcode != O::OPCODE
            || HEADER_LEN + h.payload_len as usize != reply_len
        {
            return Err(CallError::lost(&io::Error::other(format!(
                "unexpected reply {h:?} to call {id}"
            ))));
        }
        if h.status != 0 {
            let m = &self.rbuf[HEADER_LEN..reply_len];
            return Err(CallError::new(
                h.status,
                String::from_utf8_lossy(m).into_owned(),
            ));
        }
        Ok((h, reply_len - HEADER_LEN, out_done))
    }

    /// Like [`Client::post`], but over the device the module may read `tail` after this returns:
    /// the caller keeps `tail` unchanged until a later synchronous call of this client has
    /// returned (every earlier frame ran by then). Lets the chunks of one large copy overlap.
    pub fn post_deferred<O: Op>(&mut self, req: &O, tail: &[u8]) -> Result<(), CallError> {
        if !matches!(self.conn, Conn::Device(_)) {
            return self.post(req, tail);
        }
        self.check()?;
        if let Err(e) = self.flush() {
            return Err(self.fail(e));
        }
        let _ = self.frame(req, tail.len(), FLAG_ASYNC);
        let r = match &self.conn {
            Conn::Device(d) => d
                .post_deferred(&self.scratch, tail)
                .map_err(|e| CallError::device(&e)),
            Conn::Stream(_) => Ok(()),
        };
        r.map_err(|e| self.fail(e))
    }

    /// [`Client::call_into`] for a list of requests, each with its destination. Over the device,
    /// up to [`DEVICE_WINDOW`] of them are in flight at once, each written straight into its
    /// destination; over a stream, up to [`STREAM_WINDOW`]. The first error is returned once all
    /// have finished.
    pub fn call_into_chunks<O: Op<Reply = msg::Empty>>(
        &mut self,
        reqs: &[O],
        outs: Vec<&mut [u8]>,
    ) -> Result<(), CallError> {
        self.exchange(|c| {
            if matches!(c.conn, Conn::Device(_)) {
                c.device_chunks(reqs, outs)
            } else {
                c.stream_chunks(reqs, outs)
            }
        })
    }

    /// [`Client::call_into_chunks`] over a stream: the next request goes out before the reply
    /// to the one before it is read, so vgpud reads the next chunk from the device while this
    /// side reads the last one from the socket. At most [`STREAM_WINDOW`] requests wait (a few
    /// dozen bytes each): writing them never waits for vgpud, which may be writing a large
    /// reply that nobody reads yet.
    fn stream_chunks<O: Op<Reply = msg::Empty>>(
        &mut self,
        reqs: &[O],
        outs: Vec<&mut [u8]>,
    ) -> Result<(), CallError> {
        let mut sent = std::collections::VecDeque::with_capacity(STREAM_WINDOW);
        let mut next = reqs.iter();
        let mut first: Option<CallError> = None;
        for out in outs {
            while sent.len() < STREAM_WINDOW
                && let Some(req) = next.next()
            {
                sent.push_back(self.enqueue(req, &[], 0)?);
            }
            self.flush()?;
            let Some(id) = sent.pop_front() else {
                break;
            };
            self.read_bytes_reply(id, O::OPCODE, out, &mut first)?;
        }
        first.map_or(Ok(()), Err)
    }

    /// Reads the reply to call `id` (`opcode`), whose payload is bulk bytes only, into `out`. An
    /// error reply is kept in `first` unless it holds one already; `Err`: the connection is lost.
    fn read_bytes_reply(
        &mut self,
        id: u64,
        opcode: u16,
        out: &mut [u8],
        first: &mut Option<CallError>,
    ) -> Result<(), CallError> {
        let h = self.read_header(id, opcode)?;
        if h.status != 0 {
            let e = self.try_read_error(&h)?;
            first.get_or_insert(e);
            return Ok(());
        }
        if h.payload_len as usize != out.len() {
            return Err(CallError::lost(&io::Error::other(
                "reply length does not match the request",
            )));
        }
        self.stream_mut()?
            .read_exact(out)
            .map_err(|e| CallError::lost(&e))
    }

    /// [`Client::call_into_chunks`], then the synchronous call `last` (whose reply carries
    /// nothing), expected to take about `last_takes`. Over a stream, with at most
    /// [`STREAM_WINDOW`] requests in `reqs`, every request is sent before any reply is read: one
    /// wait for all. The first error is returned once all have finished.
    pub fn call_into_chunks_then<O, L>(
        &mut self,
        reqs: &[O],
        outs: Vec<&mut [u8]>,
        last: &L,
        last_takes: Duration,
    ) -> Result<(), CallError>
    where
        O: Op<Reply = msg::Empty>,
        L: Op<Reply = msg::Empty>,
    {
        if matches!(self.conn, Conn::Device(_)) || reqs.len() > STREAM_WINDOW {
            let chunks = self.call_into_chunks(reqs, outs);
            let rest = self.call_expecting(last, last_takes).map(drop);
            return chunks.and(rest);
        }
        self.exchange(|c| {
            let mut ids = Vec::with_capacity(reqs.len());
            for req in reqs {
                ids.push(c.enqueue(req, &[], 0)?);
            }
            let last_id = c.enqueue(last, &[], 0)?;
            c.flush()?;
            let mut first = None;
            for (id, out) in ids.into_iter().zip(outs) {
                c.read_bytes_reply(id, O::OPCODE, out, &mut first)?;
            }
            c.expect_reply_in(last_takes);
            c.read_bytes_reply(last_id, L::OPCODE, &mut [], &mut first)?;
            first.map_or(Ok(()), Err)
        })
    }

    fn device_chunks<O: Op<Reply = msg::Empty>>(
        &mut self,
        reqs: &[O],
        outs: Vec<&mut [u8]>,
    ) -> Result<(), CallError> {
        self.flush()?;
        while self.chunk_replies.len() < DEVICE_WINDOW {
            self.chunk_replies.push(vec![0; CHUNK_REPLY_BUFFER]);
        }
        // (ticket, call id, bytes expected, reply buffer)
        let mut inflight: std::collections::VecDeque<(u64, u64, usize, usize)> =
            std::collections::VecDeque::new();
        let mut free: Vec<usize> = (0..DEVICE_WINDOW).collect();
        let mut first: Option<CallError> = None;
        let mut outs = outs.into_iter();
        for req in reqs {
            let Some(out) = outs.next() else { break };
            if inflight.len() == DEVICE_WINDOW
                && let Some(done) = inflight.pop_front()
            {
                if let Err(e) = self.finish_chunk::<O>(done) {
                    first.get_or_insert(e);
                }
                free.push(done.3);
            }
            if first.is_some() {
                break;
            }
            let id = self.frame(req, 0, 0);
            let slot = free.pop().unwrap_or(0);
            let Conn::Device(d) = &self.conn else { break };
            let len = out.len();
            // SAFETY: the reply buffer and `out` stay untouched until the ticket is waited for
            // below (every ticket is, even after an error), and `outs` keeps `out` borrowed until
            // this function returns.
            let r = unsafe { d.submit(&self.scratch, &[], &mut self.chunk_replies[slot], out) };
            match r {
                Ok(ticket) => inflight.push_back((ticket, id, len, slot)),
                Err(e) => {
                    first.get_or_insert(CallError::device(&e));
                    free.push(slot);
                }
            }
        }
        while let Some(done) = inflight.pop_front() {
            if let Err(e) = self.finish_chunk::<O>(done) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Waits for one chunk in flight and checks its reply.
    fn finish_chunk<O: Op>(
        &mut self,
        (ticket, id, len, slot): (u64, u64, usize, usize),
    ) -> Result<(), CallError> {
        let Conn::Device(d) = &self.conn else {
            return Err(CallError::new(cuda::CUDA_ERROR_UNKNOWN, "not a device"));
        };
        let (reply_len, done) = d.wait(ticket).map_err(|e| CallError::device(&e))?;
        let reply = &self.chunk_replies[slot];
        if reply_len < HEADER_LEN || reply_len > reply.len() {
            return Err(CallError::lost(&io::Error::other(format!(
                "the device returned a {reply_len}-byte reply frame"
            ))));
        }
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&reply[..HEADER_LEN]);
        let h = Header::decode(&hb).map_err(|e| CallError::lost(&io::Error::other(e)))?;
        self.output_pending |= h.has_output();
        if !h.is_reply() || h.call_id != id || h.opcode != O::OPCODE {
            return Err(CallError::lost(&io::Error::other(format!(
                "unexpected reply {h:?} to call {id}"
            ))));
        }
        if h.status != 0 {
            let m = &reply[HEADER_LEN..reply_len];
            return Err(CallError::new(
                h.status,
                String::from_utf8_lossy(m).into_owned(),
            ));
        }
        if done != len || reply_len != HEADER_LEN {
            return Err(CallError::lost(&io::Error::other(format!(
                "the device wrote {done} of {len} bytes"
            ))));
        }
        Ok(())
    }

    /// Bytes of asynchronous frames not sent yet.
    pub fn pending(&self) -> usize {
        self.wbuf.len()
    }

    /// Changes the longest time a frame may wait in the batch.
    pub fn set_flush_interval(&mut self, d: Duration) {
        self.flush_interval = d;
    }

    /// The longest time a frame may wait in the batch.
    pub fn flush_interval(&self) -> Duration {
        self.flush_interval
    }

    /// Sends pending asynchronous frames.
    pub fn flush(&mut self) -> Result<(), CallError> {
        self.last_flush = Instant::now();
        if !self.wbuf.is_empty() {
            if matches!(self.conn, Conn::Stream(_)) {
                self.sending(self.wbuf.len());
                self.sent += self.wbuf.len() as u64;
            }
            let r = match &mut self.conn {
                Conn::Stream(stream) => stream
                    .write_all(&self.wbuf)
                    .map_err(|e| CallError::lost(&e)),
                Conn::Device(d) => d.post_batch(&self.wbuf).map_err(|e| CallError::device(&e)),
            };
            self.wbuf.clear();
            self.batched = 0;
            r?;
        }
        Ok(())
    }

    /// Sends an asynchronous request: no reply; an error surfaces at a later
    /// synchronizing call.
    pub fn post<O: Op>(&mut self, req: &O, tail: &[u8]) -> Result<(), CallError> {
        debug_assert!(O::FLAGS & msg::ASYNC_OK != 0);
        self.check()?;
        let r = self.enqueue(req, tail, FLAG_ASYNC).and_then(|_| {
            if self.wbuf.len() >= self.ramp.min(self.batch) || self.flush_interval_passed() {
                self.ramp = self.ramp.saturating_mul(2);
                self.flush()
            } else {
                Ok(())
            }
        });
        r.map_err(|e| self.fail(e))
    }

    /// Whether the flush interval has passed since the last flush, looked at on every
    /// [`POSTS_PER_CLOCK_LOOK`]th asynchronous call (on every one with an interval of zero).
    fn flush_interval_passed(&mut self) -> bool {
        if self.flush_interval.is_zero() {
            return true;
        }
        self.unclocked += 1;
        if self.unclocked < POSTS_PER_CLOCK_LOOK {
            return false;
        }
        self.unclocked = 0;
        self.last_flush.elapsed() >= self.flush_interval
    }

    fn read_header(&mut self, call_id: u64, opcode: u16) -> Result<Header, CallError> {
        let mut hb = [0u8; HEADER_LEN];
        self.stream_mut()?
            .read_exact(&mut hb)
            .map_err(|e| CallError::lost(&e))?;
        let h = Header::decode(&hb).map_err(|e| CallError::lost(&io::Error::other(e)))?;
        self.output_pending |= h.has_output();
        if !h.is_reply() || h.call_id != call_id || h.opcode != opcode {
            return Err(CallError::lost(&io::Error::other(format!(
                "unexpected frame {h:?} while waiting for call {call_id}"
            ))));
        }
        Ok(h)
    }

    fn read_error(&mut self, h: &Header) -> CallError {
        self.try_read_error(h).unwrap_or_else(|lost| lost)
    }

    /// The error an error reply with header `h` carries (`Ok`), or why its message could not be
    /// read (`Err`: the connection is lost).
    fn try_read_error(&mut self, h: &Header) -> Result<CallError, CallError> {
        let mut m = vec![0; h.payload_len as usize];
        self.stream_mut()?
            .read_exact(&mut m)
            .map_err(|e| CallError::lost(&e))?;
        Ok(CallError::new(
            h.status,
            String::from_utf8_lossy(&m).into_owned(),
        ))
    }

    /// A synchronous shared-memory copy (`MemcpyHtoDShared`, `MemcpyDtoHShared`) expected to take
    /// about `d`: rung in the doorbell page where the session has one ([`crate::doorbell`]; it
    /// is opened at the first such copy), else sent as a frame ([`Client::call_expecting`]).
    pub fn call_shared_copy<O: Op<Reply = msg::Empty>>(
        &mut self,
        req: &O,
        d: Duration,
    ) -> Result<(), CallError> {
        if self.bell.untried() {
            self.bell = crate::doorbell::BellState::open(self);
        }
        match self.bell.page() {
            Some(page) => self.exchange(|c| c.ring(page, req, d)),
            None => self.call_expecting(req, d).map(drop),
        }
    }

    /// Rings `req` in the doorbell page and waits for its completion there: polling about as
    /// long as it should take, then sleeping on the page, looking now and then whether the
    /// connection is still there.
    fn ring<O: Op>(
        &mut self,
        page: vgpu_proto::doorbell::Page,
        req: &O,
        d: Duration,
    ) -> Result<(), CallError> {
        // Every frame before the request (vgpud serves a rung request once it has read every
        // byte sent before it).
        self.flush()?;
        self.scratch.clear();
        req.encode(&mut self.scratch);
        let seq = page.ring(O::OPCODE, &self.scratch, self.sent);
        if page.server_sleeping() {
            self.enqueue(&msg::Ring {}, &[], FLAG_ASYNC)?;
            self.flush()?;
        }
        let mut poll = vgpu_proto::spin::Poll::new(d.min(vgpu_proto::spin::MAX_EXPECTED_SPIN));
        while !page.is_done(seq) {
            if poll.again() {
                continue;
            }
            while !page.wait_done(seq, crate::doorbell::LIVENESS_CHECK) {
                self.peer_alive()?;
            }
            break;
        }
        let done = page.completion();
        self.output_pending |= done.flags & vgpu_proto::frame::FLAG_OUTPUT != 0;
        if done.status != 0 {
            return Err(CallError::new(done.status, done.message));
        }
        Ok(())
    }

    /// Tells the doorbell page, if any, that `n` more bytes are about to be written on the
    /// socket ([`vgpu_proto::doorbell::Page::sending`]).
    fn sending(&self, n: usize) {
        if let Some(page) = self.bell.page() {
            page.sending(self.sent + n as u64);
        }
    }

    /// Fails when vgpud closed the connection (looked at without reading from it).
    fn peer_alive(&self) -> Result<(), CallError> {
        let Some(ch) = &self.fd_channel else {
            return Ok(());
        };
        if crate::doorbell::peer_gone(ch) {
            return Err(CallError::lost(&io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "vgpud closed the connection during a copy",
            )));
        }
        Ok(())
    }

    /// [`Client::call`] for a request whose reply is expected in about `d` (a copy vgpud
    /// makes in place): a stream that polls for replies polls that long for this one.
    pub fn call_expecting<O: Op>(
        &mut self,
        req: &O,
        d: Duration,
    ) -> Result<(O::Reply, Vec<u8>), CallError> {
        self.expect_reply_in(d);
        self.call(req, &[])
    }

    /// The next reply is expected in about `d` (work vgpud does in place before answering): a
    /// stream that polls for replies polls that long for it.
    pub fn expect_reply_in(&self, d: Duration) {
        if let Some(e) = &self.expect {
            e.next_wait(d);
        }
    }

    /// Sends a synchronous request and waits for its reply; returns the reply
    /// and its bulk tail.
    pub fn call<O: Op>(&mut self, req: &O, tail: &[u8]) -> Result<(O::Reply, Vec<u8>), CallError> {
        self.exchange(|c| c.call_inner(req, tail))
    }

    fn call_inner<O: Op>(
        &mut self,
        req: &O,
        tail: &[u8],
    ) -> Result<(O::Reply, Vec<u8>), CallError> {
        if matches!(self.conn, Conn::Device(_)) {
            let (_, len, _) = self.device_call(req, tail, &mut [])?;
            let (r, t) = msg::decode_reply::<O>(&self.rbuf[HEADER_LEN..HEADER_LEN + len])
                .map_err(|e| CallError::lost(&io::Error::other(format!("malformed reply: {e}"))))?;
            return Ok((r, t.to_vec()));
        }
        let id = self.enqueue(req, tail, 0)?;
        self.flush()?;
        let h = self.read_header(id, O::OPCODE)?;
        if h.status != 0 {
            return Err(self.read_error(&h));
        }
        self.rbuf.resize(h.payload_len as usize, 0);
        let Conn::Stream(stream) = &mut self.conn else {
            return Err(CallError::new(cuda::CUDA_ERROR_UNKNOWN, "not a stream"));
        };
        stream
            .read_exact(&mut self.rbuf)
            .map_err(|e| CallError::lost(&e))?;
        let (r, t) = msg::decode_reply::<O>(&self.rbuf)
            .map_err(|e| CallError::lost(&io::Error::other(format!("malformed reply: {e}"))))?;
        Ok((r, t.to_vec()))
    }

    /// Sends a synchronous request whose reply is an empty struct plus bulk
    /// data, reading the data straight into `out` (which must be exactly as
    /// long as the data).
    pub fn call_into<O: Op<Reply = msg::Empty>>(
        &mut self,
        req: &O,
        out: &mut [u8],
    ) -> Result<(), CallError> {
        self.exchange(|c| {
            if matches!(c.conn, Conn::Device(_)) {
                let (_, len, done) = c.device_call(req, &[], out)?;
                if len != 0 || done != out.len() {
                    return Err(CallError::lost(&io::Error::other(format!(
                        "the device wrote {done} of {} bytes",
                        out.len()
                    ))));
                }
                return Ok(());
            }
            let id = c.enqueue(req, &[], 0)?;
            c.flush()?;
            let mut error = None;
            c.read_bytes_reply(id, O::OPCODE, out, &mut error)?;
            error.map_or(Ok(()), Err)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use vgpu_proto::frame;

    fn pair() -> (Client, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (Client::new(Box::new(a)), b)
    }

    /// The fake server's reply to request `h`: `status` and `body`.
    fn reply(server: &mut UnixStream, h: &frame::Header, status: u32, body: &[u8]) {
        frame::write_frame(
            server,
            h.opcode,
            frame::FLAG_REPLY,
            h.call_id,
            status,
            &[body],
        )
        .unwrap();
    }

    /// The asynchronous request these tests post.
    fn memset() -> msg::Memset {
        msg::Memset {
            ctx: 1,
            stream: 0,
            dst: 2,
            value: 3,
            elem_size: 1,
            count: 4,
        }
    }

    /// Posted requests and synchronous ones that may leave work queued count; waits, queries and
    /// synchronous copies do not.
    #[test]
    fn requests_that_may_leave_work_queued_are_counted() {
        let (mut c, mut server) = pair();
        let t = std::thread::spawn(move || {
            let mut p = Vec::new();
            loop {
                let Ok(h) = frame::read_frame(&mut server, &mut p) else {
                    return;
                };
                if !h.is_async() {
                    let body: &[u8] = if h.opcode == msg::StreamCreate::OPCODE
                        || h.opcode == msg::MemAlloc::OPCODE
                    {
                        &[7, 0, 0, 0, 0, 0, 0, 0]
                    } else {
                        &[]
                    };
                    reply(&mut server, &h, 0, body);
                }
            }
        });
        assert_eq!(c.enqueued(), 0);
        c.post(&memset(), &[]).unwrap();
        c.post(&memset(), &[]).unwrap();
        assert_eq!(c.enqueued(), 2);
        c.call(&msg::Ping {}, &[]).unwrap();
        c.call(&msg::CtxSynchronize { ctx: 1 }, &[]).unwrap();
        c.call(&msg::StreamQuery { ctx: 1, stream: 0 }, &[])
            .unwrap();
        let htod = msg::MemcpyHtoD {
            ctx: 1,
            stream: 0,
            dst: 2,
        };
        c.call(&htod, &[1, 2, 3]).unwrap();
        c.call(&memset(), &[]).unwrap();
        let dtod = msg::MemcpyDtoD {
            ctx: 1,
            stream: 0,
            dst: 2,
            src: 3,
            len: 4,
        };
        c.call(&dtod, &[]).unwrap();
        c.call(&msg::MemAlloc { ctx: 1, size: 4 }, &[]).unwrap();
        c.call(&msg::MemFree { ctx: 1, ptr: 2 }, &[]).unwrap();
        assert_eq!(
            c.enqueued(),
            2,
            "waits, queries, synchronous copies and fills, allocations and frees leave nothing"
        );
        c.post(&dtod, &[]).unwrap();
        c.post(&memset(), &[]).unwrap();
        assert_eq!(c.enqueued(), 4, "asynchronous ones may still be queued");
        c.post(&htod, &[1, 2, 3]).unwrap();
        assert_eq!(c.enqueued(), 5, "an asynchronous copy may still be queued");
        c.call(
            &msg::StreamCreate {
                ctx: 1,
                flags: 0,
                priority: 0,
            },
            &[],
        )
        .unwrap();
        assert_eq!(c.enqueued(), 6, "other synchronous requests count");
        drop(c);
        t.join().unwrap();
    }

    #[test]
    fn async_requests_are_batched_until_a_sync_call() {
        let (mut c, mut server) = pair();
        // Only the sync call may flush here, however slowly a loaded machine runs this test.
        c.set_flush_interval(Duration::from_secs(3600));
        c.post(&memset(), &[]).unwrap();
        server.set_nonblocking(true).unwrap();
        let mut b = [0u8; 64];
        assert!(
            server.read(&mut b).is_err(),
            "nothing is sent before a sync call"
        );
        server.set_nonblocking(false).unwrap();
        let t = std::thread::spawn(move || {
            let mut p = Vec::new();
            let h1 = frame::read_frame(&mut server, &mut p).unwrap();
            assert!(h1.is_async());
            let h2 = frame::read_frame(&mut server, &mut p).unwrap();
            assert!(!h2.is_async());
            reply(&mut server, &h2, 0, &[]);
        });
        c.call(&msg::Ping {}, &[]).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn the_flush_interval_is_looked_at_every_few_posts() {
        let (mut c, mut server) = pair();
        let htod = msg::MemcpyHtoD {
            ctx: 1,
            stream: 0,
            dst: 2,
        };
        let frame_len = HEADER_LEN + msg::encode(&htod).len() + 1;
        let look = POSTS_PER_CLOCK_LOOK as usize;
        assert!(
            frame_len * look < FIRST_ASYNC_BATCH,
            "only the interval sends them"
        );
        c.set_flush_interval(Duration::from_millis(1));
        server.set_nonblocking(true).unwrap();
        let mut b = vec![0u8; 4096];
        c.post(&htod, &[7]).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        // The interval has passed, but the clock is looked at only on the 16th call.
        for _ in 2..look {
            c.post(&htod, &[7]).unwrap();
        }
        assert!(server.read(&mut b).is_err(), "nothing sent before the look");
        c.post(&htod, &[7]).unwrap();
        assert_eq!(server.read(&mut b).unwrap(), look * frame_len);
        // With an interval of zero every call goes at once.
        c.set_flush_interval(Duration::ZERO);
        c.post(&htod, &[7]).unwrap();
        assert_eq!(server.read(&mut b).unwrap(), frame_len);
    }

    /// Posts Memsets with only the batch size to flush them, reading what reaches `server` after
    /// each; returns the sizes of the first `writes` writes.
    fn batch_sizes(c: &mut Client, server: &mut UnixStream, writes: usize) -> Vec<usize> {
        let m = memset();
        server.set_nonblocking(true).unwrap();
        let mut sizes = Vec::new();
        let mut b = vec![0u8; DEFAULT_ASYNC_BATCH + BATCH_TAIL_MAX];
        while sizes.len() < writes {
            c.post(&m, &[]).unwrap();
            match server.read(&mut b) {
                Ok(n) => sizes.push(n),
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
            }
        }
        server.set_nonblocking(false).unwrap();
        sizes
    }

    #[test]
    fn after_a_sync_call_async_batches_start_small_and_double() {
        let (mut c, mut server) = pair();
        c.set_flush_interval(Duration::from_secs(3600));
        let frame_len = HEADER_LEN + msg::encode(&memset()).len();
        let expected: Vec<usize> = (0..4)
            .map(|i| (FIRST_ASYNC_BATCH << i).div_ceil(frame_len) * frame_len)
            .collect();
        assert_eq!(batch_sizes(&mut c, &mut server, 4), expected);
        // A synchronous call: vgpud has run everything sent before it, so the next batch is
        // small again.
        let t = std::thread::spawn(move || {
            let mut p = Vec::new();
            loop {
                let h = frame::read_frame(&mut server, &mut p).unwrap();
                if !h.is_async() {
                    reply(&mut server, &h, 0, &[]);
                    return server;
                }
            }
        });
        c.call(&msg::Ping {}, &[]).unwrap();
        let mut server = t.join().unwrap();
        assert_eq!(batch_sizes(&mut c, &mut server, 2), expected[..2]);
    }

    #[test]
    fn error_replies_carry_code_and_message() {
        let (mut c, mut server) = pair();
        let t = std::thread::spawn(move || {
            let mut p = Vec::new();
            let h = frame::read_frame(&mut server, &mut p).unwrap();
            reply(&mut server, &h, 2, b"slice full");
        });
        let e = c.call(&msg::MemAlloc { ctx: 1, size: 2 }, &[]).unwrap_err();
        assert_eq!(e, CallError::new(2, "slice full"));
        t.join().unwrap();
    }

    /// A fake vgpud for chunked reads: takes `n` requests, answering each as `answer` says
    /// (from its index and header: `Err(status)` or the payload) only once `window` requests
    /// wait (or the last has come), which proves the client sent them before reading any of
    /// their replies; then answers `then` more requests with nothing. Returns the opcodes it
    /// saw.
    fn chunk_server(
        mut server: UnixStream,
        n: usize,
        then: usize,
        window: usize,
        answer: impl Fn(usize, &frame::Header) -> Result<Vec<u8>, u32> + Send + 'static,
    ) -> std::thread::JoinHandle<Vec<u16>> {
        // A client that waits for a reply before sending the next request fails the test
        // instead of hanging it.
        server
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        std::thread::spawn(move || {
            let mut p = Vec::new();
            let mut pending = std::collections::VecDeque::new();
            let mut seen = Vec::new();
            for i in 0..n + then {
                let h = frame::read_frame(&mut server, &mut p).unwrap();
                assert!(!h.is_async());
                seen.push(h.opcode);
                if i >= n {
                    reply(&mut server, &h, 0, &[]);
                    continue;
                }
                pending.push_back((i, h));
                while pending.len() >= window || (i + 1 == n && !pending.is_empty()) {
                    let (j, h) = pending.pop_front().unwrap();
                    let (status, body) = match answer(j, &h) {
                        Ok(b) => (0, b),
                        Err(st) => (st, format!("chunk {j} failed").into_bytes()),
                    };
                    reply(&mut server, &h, status, &body);
                }
            }
            seen
        })
    }

    fn dtoh(i: u64, len: u64) -> msg::MemcpyDtoH {
        msg::MemcpyDtoH {
            ctx: 1,
            stream: 0,
            src: i << 20,
            len,
        }
    }

    #[test]
    fn chunked_reads_over_a_stream_are_pipelined_and_an_error_keeps_the_stream_in_step() {
        let (mut c, server) = pair();
        let reqs: Vec<_> = (0..5).map(|i| dtoh(i, 100)).collect();
        let t = chunk_server(server, 5, 1, STREAM_WINDOW, |i, h| {
            if i == 1 {
                return Err(1);
            }
            Ok(vec![(i as u8) ^ (h.call_id as u8) ^ 0x5a; 100])
        });
        let mut bufs = vec![vec![0u8; 100]; 5];
        let e = c
            .call_into_chunks(&reqs, bufs.iter_mut().map(|b| &mut b[..]).collect())
            .unwrap_err();
        assert_eq!(e.code, 1, "the first error: {e:?}");
        assert!(e.message.contains("chunk 1"), "{e:?}");
        for (i, b) in bufs.iter().enumerate() {
            if i != 1 {
                assert!(
                    b.iter().all(|&x| x == b[0]) && b[0] != 0,
                    "chunk {i} landed"
                );
            }
        }
        // The next call reads its own reply: every reply of the chunks was read.
        c.call(&msg::Ping {}, &[]).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn chunks_then_a_last_call_go_out_before_any_reply_is_read() {
        use vgpu_proto::msg::Op;
        let (mut c, server) = pair();
        let reqs = [dtoh(0, 10), dtoh(1, 20)];
        // The server answers only after it has all three requests.
        let t = chunk_server(server, 3, 0, 3, |i, _| Ok(vec![7; [10, 20, 0][i]]));
        let mut a = [0u8; 10];
        let mut b = [0u8; 20];
        let last = msg::CtxSynchronize { ctx: 1 };
        c.call_into_chunks_then(&reqs, vec![&mut a, &mut b], &last, Duration::from_millis(1))
            .unwrap();
        assert_eq!((a, b), ([7; 10], [7; 20]));
        let seen = t.join().unwrap();
        assert_eq!(
            seen,
            [
                msg::MemcpyDtoH::OPCODE,
                msg::MemcpyDtoH::OPCODE,
                msg::CtxSynchronize::OPCODE
            ]
        );
    }

    static SEEN: std::sync::Mutex<Vec<(bool, Vec<u8>)>> = std::sync::Mutex::new(Vec::new());

    fn collect(text: &[u8], err: bool) {
        if !text.is_empty() {
            SEEN.lock().unwrap().push((err, text.to_vec()));
        }
    }

    #[test]
    fn a_reply_flagged_output_makes_the_client_fetch_and_write_it() {
        use vgpu_proto::msg::{Message, Op};
        let (mut c, mut server) = pair();
        c.set_output_sink(collect);
        let t = std::thread::spawn(move || {
            let mut p = Vec::new();
            let h = frame::read_frame(&mut server, &mut p).unwrap();
            assert_eq!(h.opcode, msg::CtxSynchronize::OPCODE);
            let flags = frame::FLAG_REPLY | frame::FLAG_OUTPUT;
            frame::write_frame(&mut server, h.opcode, flags, h.call_id, 710, &[b"assert"]).unwrap();
            for (stdout, stderr, more) in [
                (
                    &b"hello\n"[..],
                    &b"a.cu:1: k: Assertion `x` failed.\n"[..],
                    1,
                ),
                (b"more\n", b"", 0),
            ] {
                let h = frame::read_frame(&mut server, &mut p).unwrap();
                assert_eq!(h.opcode, msg::TakeOutput::OPCODE);
                let mut out = Vec::new();
                msg::DeviceOutput {
                    stdout: stdout.to_vec(),
                    stderr: stderr.to_vec(),
                    more,
                }
                .encode(&mut out);
                reply(&mut server, &h, 0, &out);
            }
        });
        let e = c.call(&msg::CtxSynchronize { ctx: 1 }, &[]).unwrap_err();
        assert_eq!(e, CallError::new(710, "assert"));
        t.join().unwrap();
        assert_eq!(
            *SEEN.lock().unwrap(),
            vec![
                (true, b"a.cu:1: k: Assertion `x` failed.\n".to_vec()),
                (false, b"hello\n".to_vec()),
                (false, b"more\n".to_vec()),
            ]
        );
    }

    #[test]
    fn a_lost_connection_breaks_the_client_for_good() {
        let (mut c, server) = pair();
        drop(server);
        let e = c.call(&msg::Ping {}, &[]).unwrap_err();
        assert_eq!(e.code, cuda::CUDA_ERROR_DEVICE_UNAVAILABLE);
        let e2 = c.post(&msg::Goodbye {}, &[]).unwrap_err();
        assert_eq!(e2.code, cuda::CUDA_ERROR_DEVICE_UNAVAILABLE);
    }

    /// A shared-memory copy rung in the doorbell page, and vgpud gone before completing it: the
    /// call fails as a lost connection instead of waiting forever.
    #[test]
    fn a_rung_copy_fails_when_vgpud_goes_away() {
        let (a, mut server) = UnixStream::pair().unwrap();
        let fds = a.try_clone().unwrap();
        let mut c = Client::with_link(Link::Stream(StreamLink {
            stream: Box::new(a),
            fds: Some(fds),
            expect: None,
        }));
        let served = std::thread::spawn(move || {
            let mut p = Vec::new();
            // HostShare (its descriptor is dropped with the bytes), then Doorbell: both accepted.
            for body in [msg::encode(&msg::Handle { handle: 5 }), Vec::new()] {
                let h = frame::read_frame(&mut server, &mut p).unwrap();
                reply(&mut server, &h, 0, &body);
            }
            // The rung copy is never completed: vgpud ends.
            std::thread::sleep(Duration::from_millis(50));
            drop(server);
        });
        let req = msg::MemcpyHtoDShared {
            ctx: 1,
            stream: 0,
            dst: 2,
            region: 5,
            offset: 0,
            len: 8,
        };
        let start = Instant::now();
        let e = c
            .call_shared_copy(&req, Duration::from_micros(10))
            .unwrap_err();
        assert_eq!(e.code, cuda::CUDA_ERROR_DEVICE_UNAVAILABLE, "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(
            c.bell.page().is_some(),
            "the copy went through the doorbell"
        );
        served.join().unwrap();
    }
}
