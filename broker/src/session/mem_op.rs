//! Stream memory operations (`StreamMemOp`): a write is a job of its stream's lane, a wait a
//! gate that the session's [`MemWaits`] opens once the word meets the wait's condition.

use std::sync::Arc;

use vgpu_proto::cuda::mem_op::{self, Kind};
use vgpu_proto::msg;

use super::Session;
use crate::engine::Job;
use crate::error::CuError;
use crate::mem_wait::{MemWaits, ValueWait};

impl Session {
    /// The session's memory waits, made (and told of every job's end) at the first wait.
    fn mem_waits(&mut self) -> &MemWaits {
        if self.mem_waits.is_none() {
            let waits = MemWaits::new(Arc::clone(&self.dev));
            self.engine.on_progress(waits.progress_listener());
            self.mem_waits = Some(waits);
        }
        self.mem_waits.as_ref().expect("made above")
    }

    /// `StreamMemOp`: checks the operation and queues it on its stream.
    pub(super) fn stream_mem_op(&mut self, m: &msg::StreamMemOp) -> Result<(), CuError> {
        let lane = self.lane(m.ctx, m.stream)?;
        let kind = checked_kind(m)?;
        if let Some(width) = kind.width() {
            self.allocs
                .check(m.addr, u64::from(width), "stream memory operation")?;
        }
        let job = match kind {
            // The lane runs its work in order already.
            Kind::Barrier => return Ok(()),
            Kind::Write { width } => Job::Write {
                dst: m.addr,
                data: m.value.to_le_bytes()[..width as usize].to_vec(),
            },
            Kind::Wait { width, condition } => {
                let wait = ValueWait {
                    addr: m.addr,
                    width,
                    condition,
                    value: m.value,
                };
                // Reached at once and met already (the word was written before): nothing to
                // queue, and no hand-off to the watcher and back.
                if self.engine.ready_now(&lane)
                    && crate::device::with_lane(lane.key.id(), || wait.met(self.dev.as_ref()))
                        .unwrap_or(false)
                {
                    return Ok(());
                }
                Job::Gate(self.mem_waits().gate(lane.ctx, wait))
            }
        };
        self.engine.submit(&lane, job);
        Ok(())
    }
}

/// The operation's kind, checked as CUDA checks it: a known operation with its known flags, at
/// an address aligned to its width (whose memory the caller checks).
pub(super) fn checked_kind(m: &msg::StreamMemOp) -> Result<Kind, CuError> {
    mem_op::kind_at(m.op, m.flags, m.addr).map_err(|(code, why)| CuError::new(code, why))
}
