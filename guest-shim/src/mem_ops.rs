//! Stream memory operations: `cuStreamWriteValue32/64`, `cuStreamWaitValue32/64` and
//! `cuStreamBatchMemOp` (each in its CUDA 8 and CUDA 11.7 `_v2` names, with per-thread forms),
//! and batch memory-operation graph nodes (`cuGraphAddBatchMemOpNode` and its parameter calls).
//!
//! Every operation is checked here as CUDA checks it, all of a batch before any is queued; then
//! each write or wait goes to vgpud as one posted `StreamMemOp` on its stream, where a write is
//! a job of the stream and a wait stops the stream until the word meets its condition
//! (`vgpu_broker::mem_wait`). Memory barriers need nothing (a stream's work runs in order) and
//! flushing remote writes is `CUDA_ERROR_NOT_SUPPORTED` (`CAN_FLUSH_REMOTE_WRITES` is 0). Mapped
//! and managed memory take part as in a launch: what the host wrote before the call is on the
//! device first, and what the device wrote is seen by the host after a synchronization.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_uint;

use vgpu_proto::cuda::{self, mem_op};
use vgpu_proto::msg;

use crate::driver::{self as drv, CuRes};
use crate::exports::{CUdeviceptr, CUhandle, h, p};
use crate::ffi::{CUresult, ffi};
use crate::graph::api::{add, set_kind};
use crate::graph::{NodeKind, Op, exec, registry};
use crate::out;

/// `CUstreamBatchMemOpParams`: a union of six 64-bit words.
pub type RawParams = [u64; 6];

/// One operation, as `CUstreamBatchMemOpParams` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemOp {
    /// `CUstreamBatchMemOpType`.
    pub op: u32,
    /// The operation's flags.
    pub flags: u32,
    /// The word's device address (writes and waits).
    pub addr: u64,
    /// The value (the low half for 32-bit operations).
    pub value: u64,
}

fn is_value_op(op: u32) -> bool {
    matches!(
        op,
        mem_op::WAIT_VALUE_32
            | mem_op::WRITE_VALUE_32
            | mem_op::WAIT_VALUE_64
            | mem_op::WRITE_VALUE_64
    )
}

fn is_32_bit(op: u32) -> bool {
    matches!(op, mem_op::WAIT_VALUE_32 | mem_op::WRITE_VALUE_32)
}

impl MemOp {
    /// The operation a `CUstreamBatchMemOpParams` holds: `waitValue`/`writeValue` (`operation`,
    /// `address` at 8, `value`/`value64` at 16, `flags` at 24) or `flushRemoteWrites`/
    /// `memoryBarrier` (`operation`, `flags` at 4).
    pub fn from_raw(w: &RawParams) -> Self {
        let op = w[0] as u32;
        if is_value_op(op) {
            let value = if is_32_bit(op) {
                w[2] & 0xffff_ffff
            } else {
                w[2]
            };
            Self {
                op,
                flags: w[3] as u32,
                addr: w[1],
                value,
            }
        } else {
            Self {
                op,
                flags: (w[0] >> 32) as u32,
                ..Self::default()
            }
        }
    }

    /// The `CUstreamBatchMemOpParams` of the operation.
    pub fn to_raw(self) -> RawParams {
        if is_value_op(self.op) {
            [
                u64::from(self.op),
                self.addr,
                self.value,
                u64::from(self.flags),
                0,
                0,
            ]
        } else {
            [
                u64::from(self.op) | (u64::from(self.flags) << 32),
                0,
                0,
                0,
                0,
                0,
            ]
        }
    }

    /// Checks the operation as CUDA does: a known operation with its flags, at an aligned
    /// address; returns what it does.
    pub fn kind(&self) -> CuRes<mem_op::Kind> {
        mem_op::kind_at(self.op, self.flags, self.addr).map_err(|(code, why)| {
            crate::debug!("stream memory operation {}: {why}", self.op);
            code
        })
    }

    /// Whether vgpud has anything to do for it (not a barrier).
    fn sent(&self) -> bool {
        !matches!(self.kind(), Ok(mem_op::Kind::Barrier))
    }

    /// The request that queues it on `stream` of `ctx`.
    pub fn request(&self, ctx: u64, stream: u64) -> msg::StreamMemOp {
        msg::StreamMemOp {
            ctx,
            stream,
            op: self.op,
            flags: self.flags,
            addr: self.addr,
            value: self.value,
        }
    }
}

/// The graph operations `ops` run as: one per write or wait (barriers need none).
pub fn graph_ops(ops: &[MemOp]) -> impl Iterator<Item = Op> + '_ {
    ops.iter()
        .filter(|o| o.sent())
        .map(|o| Op::MemOps(vec![*o]))
}

/// Checks a batch as `cuStreamBatchMemOp` does (at most [`mem_op::MAX_BATCH`] operations, each
/// valid, flags 0).
fn check_batch(ops: &[MemOp], flags: u32) -> CuRes<()> {
    if flags != 0 || ops.len() > mem_op::MAX_BATCH as usize {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    for o in ops {
        o.kind()?;
    }
    Ok(())
}

/// Queues `ops` (a batch with `flags`) on `stream`, in order, once every one is checked.
pub fn enqueue(stream: u64, ops: Vec<MemOp>, flags: u32) -> CuRes<()> {
    check_batch(&ops, flags)?;
    let d = drv::driver()?;
    let ctx = drv::current_ctx().ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)?;
    let stream = drv::wire_stream(stream)?;
    if ops.is_empty() {
        return Ok(());
    }
    if let Some(r) = crate::stream_capture::intercept(stream, false, || Op::MemOps(ops.clone())) {
        return r;
    }
    for o in ops.iter().filter(|o| o.sent()) {
        let device = d.is_device_ptr(o.addr) || crate::alloc_api::is_mirrored_device_ptr(o.addr);
        if !device {
            crate::debug!(
                "stream memory operation at {:#x}: not device memory of this process",
                o.addr
            );
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
    }
    // Mapped and managed memory the host wrote goes to the device first, as before a launch.
    crate::alloc_api::before_launch(stream)?;
    for o in ops.iter().filter(|o| o.sent()) {
        d.post(&o.request(ctx, stream), &[])?;
    }
    Ok(())
}

/// A caller's array of `count` operations, as given.
///
/// Pointer contract (CUDA's): `params` holds `count` `CUstreamBatchMemOpParams`.
fn read_raw<'a>(params: *const RawParams, count: c_uint) -> CuRes<&'a [RawParams]> {
    if count == 0 {
        return Ok(&[]);
    }
    if params.is_null() || count > mem_op::MAX_BATCH {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `params` is non-NULL and holds `count` (at most MAX_BATCH) operations (this
    // function's contract); every bit pattern is a valid array of integers.
    Ok(unsafe { std::slice::from_raw_parts(params, count as usize) })
}

/// The operations of a caller's array ([`read_raw`]'s contract).
fn read_ops(params: *const RawParams, count: c_uint) -> CuRes<Vec<MemOp>> {
    Ok(read_raw(params, count)?
        .iter()
        .map(MemOp::from_raw)
        .collect())
}

fn value_op(stream: CUhandle, op: u32, addr: CUdeviceptr, value: u64, flags: c_uint) -> CuRes<()> {
    enqueue(
        h(stream),
        vec![MemOp {
            op,
            flags,
            addr,
            value,
        }],
        0,
    )
}

macro_rules! value_entry_points {
    ($($name:ident / $name_v2:ident => $op:expr, $t:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub extern "C" fn $name(
            stream: CUhandle,
            addr: CUdeviceptr,
            value: $t,
            flags: c_uint,
        ) -> CUresult {
            ffi(stringify!($name), || value_op(stream, $op, addr, u64::from(value), flags))
        }

        /// The CUDA 11.7 name (the same operation).
        #[unsafe(no_mangle)]
        pub extern "C" fn $name_v2(
            stream: CUhandle,
            addr: CUdeviceptr,
            value: $t,
            flags: c_uint,
        ) -> CUresult {
            ffi(stringify!($name_v2), || value_op(stream, $op, addr, u64::from(value), flags))
        }
    )*};
}

value_entry_points! {
    cuStreamWriteValue32 / cuStreamWriteValue32_v2 => mem_op::WRITE_VALUE_32, u32;
    cuStreamWriteValue64 / cuStreamWriteValue64_v2 => mem_op::WRITE_VALUE_64, u64;
    cuStreamWaitValue32 / cuStreamWaitValue32_v2 => mem_op::WAIT_VALUE_32, u32;
    cuStreamWaitValue64 / cuStreamWaitValue64_v2 => mem_op::WAIT_VALUE_64, u64;
}

fn batch(stream: CUhandle, count: c_uint, params: *const RawParams, flags: c_uint) -> CuRes<()> {
    let ops = read_ops(params, count)?;
    enqueue(h(stream), ops, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBatchMemOp(
    stream: CUhandle,
    count: c_uint,
    params: *const RawParams,
    flags: c_uint,
) -> CUresult {
    ffi("cuStreamBatchMemOp", || batch(stream, count, params, flags))
}

/// The CUDA 11.7 name (the same call).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBatchMemOp_v2(
    stream: CUhandle,
    count: c_uint,
    params: *const RawParams,
    flags: c_uint,
) -> CUresult {
    ffi("cuStreamBatchMemOp_v2", || {
        batch(stream, count, params, flags)
    })
}

// ---- graph nodes ------------------------------------------------------------------------------

/// `CUDA_BATCH_MEM_OP_NODE_PARAMS` (both versions).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BatchMemOpNodeParams {
    /// The context the operations run in (vgpu runs them in the launch's).
    pub ctx: CUhandle,
    /// Operations in `params`.
    pub count: c_uint,
    /// The operations.
    pub params: *const RawParams,
    /// Must be 0.
    pub flags: c_uint,
}

const _: () = {
    assert!(std::mem::size_of::<BatchMemOpNodeParams>() == 32);
    assert!(std::mem::offset_of!(BatchMemOpNodeParams, params) == 16);
    assert!(std::mem::size_of::<RawParams>() == 48);
};

/// A batch memory-operation node's parameters.
#[derive(Debug, Clone)]
pub struct BatchNode {
    /// The context given.
    pub ctx: u64,
    /// The flags given (0).
    pub flags: u32,
    /// The operations.
    pub ops: Vec<MemOp>,
    /// The operations as the application gave them, handed back by
    /// `cuGraphBatchMemOpNodeGetParams` (valid while the node keeps these parameters).
    pub raw: Box<[RawParams]>,
}

impl BatchNode {
    /// A node of `ops` made by capturing `cuStreamBatchMemOp` (and the single-value calls).
    pub fn captured(ops: Vec<MemOp>) -> Self {
        Self {
            ctx: drv::current_ctx().unwrap_or(0),
            flags: 0,
            raw: ops.iter().map(|o| o.to_raw()).collect(),
            ops,
        }
    }
}

/// The node a caller's parameters describe, checked as `cuStreamBatchMemOp` checks its batch
/// (and at least one operation).
///
/// Pointer contract (CUDA's): `prm` is NULL or a valid `CUDA_BATCH_MEM_OP_NODE_PARAMS` whose
/// array holds `count` operations.
pub(crate) fn batch_kind(prm: *const BatchMemOpNodeParams) -> CuRes<NodeKind> {
    // SAFETY: NULL or valid (this function's contract); integers and pointers.
    let p = unsafe { prm.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    if p.count == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let raw = read_raw(p.params, p.count)?;
    let ops: Vec<MemOp> = raw.iter().map(MemOp::from_raw).collect();
    check_batch(&ops, p.flags)?;
    Ok(NodeKind::BatchMemOp(BatchNode {
        ctx: h(p.ctx),
        flags: p.flags,
        ops,
        raw: raw.into(),
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddBatchMemOpNode(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    prm: *const BatchMemOpNodeParams,
) -> CUresult {
    ffi("cuGraphAddBatchMemOpNode", || {
        add(out, graph, deps, n, || batch_kind(prm))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphBatchMemOpNodeGetParams(
    node: CUhandle,
    prm: *mut BatchMemOpNodeParams,
) -> CUresult {
    ffi("cuGraphBatchMemOpNodeGetParams", || {
        let reg = registry();
        let NodeKind::BatchMemOp(b) = &reg.node(h(node))?.kind else {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        };
        out!(
            prm,
            BatchMemOpNodeParams {
                ctx: p(b.ctx),
                count: b.raw.len() as c_uint,
                params: b.raw.as_ptr(),
                flags: b.flags,
            }
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphBatchMemOpNodeSetParams(
    node: CUhandle,
    prm: *const BatchMemOpNodeParams,
) -> CUresult {
    ffi("cuGraphBatchMemOpNodeSetParams", || {
        set_kind(node, batch_kind(prm)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecBatchMemOpNodeSetParams(
    e: CUhandle,
    node: CUhandle,
    prm: *const BatchMemOpNodeParams,
) -> CUresult {
    ffi("cuGraphExecBatchMemOpNodeSetParams", || {
        exec::set_node(h(e), h(node), batch_kind(prm)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_round_trip_as_cuda_lays_them_out() {
        let w = MemOp {
            op: mem_op::WAIT_VALUE_64,
            flags: mem_op::WAIT_NOR,
            addr: 0x7000_0000_0040,
            value: 0x1_0000_0002,
        };
        assert_eq!(MemOp::from_raw(&w.to_raw()), w);
        // A 32-bit operation reads `value`, the low half of the union.
        let mut raw = MemOp {
            op: mem_op::WRITE_VALUE_32,
            flags: 0,
            addr: 0x100,
            value: 7,
        }
        .to_raw();
        raw[2] |= 0xdead_beef << 32;
        assert_eq!(MemOp::from_raw(&raw).value, 7);
        // A barrier's flags follow its operation in the first word.
        let b = MemOp::from_raw(&[u64::from(mem_op::BARRIER) | (1 << 32), 9, 9, 9, 9, 9]);
        assert_eq!((b.op, b.flags, b.addr), (mem_op::BARRIER, 1, 0));
        assert_eq!(b.kind(), Ok(mem_op::Kind::Barrier));
    }

    #[test]
    fn batches_are_checked_whole() {
        let write = MemOp {
            op: mem_op::WRITE_VALUE_32,
            flags: 0,
            addr: 0x1000,
            value: 1,
        };
        assert_eq!(check_batch(&[write; 3], 0), Ok(()));
        assert_eq!(
            check_batch(&[write], 1),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            check_batch(&vec![write; 256], 0),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        let unaligned = MemOp {
            addr: 0x1004,
            op: mem_op::WRITE_VALUE_64,
            ..write
        };
        assert_eq!(
            check_batch(&[write, unaligned], 0),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
    }
}
