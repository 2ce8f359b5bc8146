//! What the device asks of the GPU side: open a session per guest file descriptor and execute
//! its protocol frames, with the bulk bytes left in guest memory.
//!
//! vgpud's `BrokerService` (`vmm-backend/vgpud/src/vgpu_service.rs`) implements this over the
//! broker; tests use small fakes.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use vgpu_proto::frame::Header;

pub use vgpu_broker::session::{BulkSink, BulkSource, NoBulk};

/// One frame of a session, as the device received it.
pub struct Call<'a> {
    /// The frame header (validated: magic, flags, `payload_len`).
    pub header: Header,
    /// The payload bytes that came inline (the message's fields, maybe some bulk bytes).
    pub inline: &'a [u8],
    /// The rest of the payload, in guest memory.
    pub data: &'a dyn BulkSource,
    /// Where the reply's bulk bytes go.
    pub reply_data: &'a mut dyn BulkSink,
}

impl std::fmt::Debug for Call<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("header", &self.header)
            .field("inline", &self.inline.len())
            .field("data", &self.data.len())
            .finish_non_exhaustive()
    }
}

/// The outcome of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A reply frame: `status` (a `CUresult`) and its payload (the reply's fields, or the error
    /// message). Bulk bytes, if any, were written through [`Call::reply_data`].
    Frame {
        /// The `CUresult`.
        status: u32,
        /// The payload after the frame header.
        payload: Vec<u8>,
    },
    /// An asynchronous frame: no reply.
    None,
    /// The session broke the protocol; it is closed and releases everything.
    Violation(String),
}

/// What became of a batch ([`SessionExecutor::call_batch`]): `Err` holds the index of the frame
/// that broke the protocol and why.
pub type BatchResult = Result<(), (usize, String)>;

/// Executes one frame of a batch through [`SessionExecutor::call`] (its payload inline, no bulk
/// bytes in guest memory); `Err` with why when it broke the protocol.
pub fn call_batched<E: SessionExecutor + ?Sized>(
    exec: &mut E,
    header: Header,
    payload: &[u8],
) -> Result<(), String> {
    let reply = exec.call(Call {
        header,
        inline: payload,
        data: &NoBulk,
        reply_data: &mut NoBulk,
    });
    match reply {
        Reply::Violation(why) => Err(why),
        Reply::Frame { .. } | Reply::None => Ok(()),
    }
}

/// The GPU side of one guest session (one open `/dev/vgpuN`).
pub trait SessionExecutor: Send {
    /// Executes one frame; frames arrive in the order the guest submitted them.
    fn call(&mut self, call: Call<'_>) -> Reply;
    /// Executes a batch of asynchronous frames in order: their headers and where their
    /// payloads lie in `bytes` (a batch has no bulk bytes left in guest memory). `Err` with the
    /// index of the frame that broke the protocol and why: the session is closed and the frames
    /// after it do not run. By default each goes through [`SessionExecutor::call`]; vgpud serves
    /// runs of them together.
    fn call_batch(&mut self, frames: &[(Header, Range<usize>)], bytes: &[u8]) -> BatchResult {
        for (i, (header, range)) in frames.iter().enumerate() {
            call_batched(self, *header, &bytes[range.clone()]).map_err(|why| (i, why))?;
        }
        Ok(())
    }
    /// Whether device-side `printf`/`assert` output waits for the guest: the reply frame then
    /// carries `FLAG_OUTPUT` (the guest fetches it with `TakeOutput`).
    fn output_ready(&self) -> bool {
        false
    }
    /// Whether the synchronous frame with `header` would be answered at once, waiting for
    /// nothing (no earlier work of the session is queued or running, and the call itself only
    /// does bounded work). The device's queue thread then runs it itself instead of waking the
    /// session's thread: one thread hand-off less per round trip. The device asks this only
    /// for frames with at most `MAX_BULK_HERE` bulk bytes.
    fn answers_at_once(&self, _header: &Header) -> bool {
        false
    }
}

/// The GPU side of a device: sessions, and what the config space reports.
pub trait VgpuService: Send + Sync {
    /// Opens a session (when the guest opens the device). `gone` becomes true once the guest
    /// closed the session or the device was reset, while the session thread may still be inside
    /// a call: a call waiting for the session's work then gives up, so the session ends and frees
    /// its memory without waiting for its kernels.
    fn open(&self, gone: Arc<AtomicBool>) -> Result<Box<dyn SessionExecutor>, String>;
    /// The VM's memory slice in bytes.
    fn slice_size(&self) -> u64;
    /// The GPU's name.
    fn gpu_name(&self) -> String;
}
