//! The connection to vgpud: frames requests, batches asynchronous ones, and
//! waits for the replies of synchronous ones.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use vgpu_proto::cuda::{self, CuResult};
use vgpu_proto::frame::{FLAG_ASYNC, HEADER_LEN, Header};
use vgpu_proto::msg::{self, Op};

use crate::transport::Stream;

/// Asynchronous frames are sent once this many bytes are pending, once
/// [`DEFAULT_FLUSH_INTERVAL`] has passed since the last send, or at the next
/// synchronous call, whichever comes first. `VGPU_ASYNC_BATCH=0` sends each
/// at once.
pub const DEFAULT_ASYNC_BATCH: usize = 64 << 10;
/// Longest time an asynchronous frame waits in the batch (`VGPU_FLUSH_US`).
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_micros(50);

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
}

/// A session with vgpud.
pub struct Client {
    stream: Box<dyn Stream>,
    wbuf: Vec<u8>,
    scratch: Vec<u8>,
    rbuf: Vec<u8>,
    call_id: u64,
    batch: usize,
    flush_interval: Duration,
    last_flush: Instant,
    broken: Option<String>,
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
    /// A client over a connected stream; call [`Client::hello`] next.
    pub fn new(stream: Box<dyn Stream>) -> Self {
        let batch = std::env::var("VGPU_ASYNC_BATCH")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_ASYNC_BATCH);
        let flush_interval = std::env::var("VGPU_FLUSH_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(DEFAULT_FLUSH_INTERVAL, Duration::from_micros);
        Self {
            stream,
            wbuf: Vec::with_capacity(batch + 4096),
            scratch: Vec::new(),
            rbuf: Vec::new(),
            call_id: 0,
            batch,
            flush_interval,
            last_flush: Instant::now(),
            broken: None,
        }
    }

    /// Performs the handshake.
    pub fn hello(&mut self, process_name: &str) -> Result<msg::HelloReply, CallError> {
        let req = msg::Hello {
            protocol_version: vgpu_proto::PROTOCOL_VERSION,
            pid: std::process::id(),
            shim_version: vgpu_proto::VERSION.to_string(),
            process_name: process_name.to_string(),
        };
        Ok(self.call(&req, &[])?.0)
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

    /// Queues a frame; its tail is written straight from the caller's memory
    /// when it is large.
    fn enqueue<O: Op>(&mut self, req: &O, tail: &[u8], flags: u16) -> Result<u64, CallError> {
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
        if tail.len() <= 4096 {
            self.wbuf.extend_from_slice(tail);
        } else {
            self.flush()?;
            self.stream
                .write_all(tail)
                .map_err(|e| CallError::lost(&e))?;
        }
        Ok(self.call_id)
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
            let r = self.stream.write_all(&self.wbuf);
            self.wbuf.clear();
            r.map_err(|e| CallError::lost(&e))?;
        }
        Ok(())
    }

    /// Sends an asynchronous request: no reply; an error surfaces at a later
    /// synchronizing call.
    pub fn post<O: Op>(&mut self, req: &O, tail: &[u8]) -> Result<(), CallError> {
        debug_assert!(O::FLAGS & msg::ASYNC_OK != 0);
        self.check()?;
        let r = self.enqueue(req, tail, FLAG_ASYNC).and_then(|_| {
            if self.wbuf.len() >= self.batch || self.last_flush.elapsed() >= self.flush_interval {
                self.flush()
            } else {
                Ok(())
            }
        });
        r.map_err(|e| self.fail(e))
    }

    fn read_header(&mut self, call_id: u64, opcode: u16) -> Result<Header, CallError> {
        let mut hb = [0u8; HEADER_LEN];
        self.stream
            .read_exact(&mut hb)
            .map_err(|e| CallError::lost(&e))?;
        let h = Header::decode(&hb).map_err(|e| CallError::lost(&io::Error::other(e)))?;
        if !h.is_reply() || h.call_id != call_id || h.opcode != opcode {
            return Err(CallError::lost(&io::Error::other(format!(
                "unexpected frame {h:?} while waiting for call {call_id}"
            ))));
        }
        Ok(h)
    }

    fn read_error(&mut self, h: &Header) -> CallError {
        let mut m = vec![0; h.payload_len as usize];
        if let Err(e) = self.stream.read_exact(&mut m) {
            return CallError::lost(&e);
        }
        CallError::new(h.status, String::from_utf8_lossy(&m).into_owned())
    }

    /// Sends a synchronous request and waits for its reply; returns the reply
    /// and its bulk tail.
    pub fn call<O: Op>(&mut self, req: &O, tail: &[u8]) -> Result<(O::Reply, Vec<u8>), CallError> {
        self.check()?;
        let r = self.call_inner(req, tail);
        r.map_err(|e| self.fail(e))
    }

    fn call_inner<O: Op>(
        &mut self,
        req: &O,
        tail: &[u8],
    ) -> Result<(O::Reply, Vec<u8>), CallError> {
        let id = self.enqueue(req, tail, 0)?;
        self.flush()?;
        let h = self.read_header(id, O::OPCODE)?;
        if h.status != 0 {
            return Err(self.read_error(&h));
        }
        self.rbuf.resize(h.payload_len as usize, 0);
        self.stream
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
        self.check()?;
        let r = (|| {
            let id = self.enqueue(req, &[], 0)?;
            self.flush()?;
            let h = self.read_header(id, O::OPCODE)?;
            if h.status != 0 {
                return Err(self.read_error(&h));
            }
            if h.payload_len as usize != out.len() {
                return Err(CallError::lost(&io::Error::other(
                    "reply length does not match the request",
                )));
            }
            self.stream.read_exact(out).map_err(|e| CallError::lost(&e))
        })();
        r.map_err(|e| self.fail(e))
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

    #[test]
    fn async_requests_are_batched_until_a_sync_call() {
        let (mut c, mut server) = pair();
        c.post(
            &msg::Memset {
                ctx: 1,
                stream: 0,
                dst: 2,
                value: 3,
                elem_size: 1,
                count: 4,
            },
            &[],
        )
        .unwrap();
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
            frame::write_frame(
                &mut server,
                h2.opcode,
                frame::FLAG_REPLY,
                h2.call_id,
                0,
                &[],
            )
            .unwrap();
        });
        c.call(&msg::Ping {}, &[]).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn error_replies_carry_code_and_message() {
        let (mut c, mut server) = pair();
        let t = std::thread::spawn(move || {
            let mut p = Vec::new();
            let h = frame::read_frame(&mut server, &mut p).unwrap();
            frame::write_frame(
                &mut server,
                h.opcode,
                frame::FLAG_REPLY,
                h.call_id,
                2,
                &[b"slice full"],
            )
            .unwrap();
        });
        let e = c.call(&msg::MemAlloc { ctx: 1, size: 2 }, &[]).unwrap_err();
        assert_eq!(e, CallError::new(2, "slice full"));
        t.join().unwrap();
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
}
