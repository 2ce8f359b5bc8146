//! Messages: one request struct per opcode, shared reply structs, and the
//! catalogue (`OPS`) from which docs/protocol.md's message table is checked.
//!
//! A request's payload is its fields in declaration order, encoded by
//! [`crate::wire`]; ops flagged [`REQ_TAIL`] append bulk bytes after the last
//! field (the rest of the payload). A successful reply's payload is the reply
//! struct's fields, followed by bulk bytes for ops flagged [`REPLY_TAIL`]. A
//! failed reply carries a non-zero `status` and, as payload, a UTF-8 message.

use crate::wire::{DecodeError, Reader, Wire, Writer};

/// [`GraphMemAttributes`] reset bit: the high watermark of used graph memory.
pub const GRAPH_MEM_RESET_USED_HIGH: u32 = 1 << 0;
/// [`GraphMemAttributes`] reset bit: the high watermark of reserved graph memory.
pub const GRAPH_MEM_RESET_RESERVED_HIGH: u32 = 1 << 1;

/// [`GlobalInfo`] flag: a `__managed__` variable (`.attribute(.managed)`).
pub const GLOBAL_MANAGED: u32 = 1 << 0;
/// [`GlobalInfo`] flag: a texture reference's slot (`.global .texref`, CUDA 11's `texture<>`):
/// 8 bytes holding the handle of the texture object it is bound to (0: unbound). Not a variable
/// of the program (`cuModuleGetGlobal` does not find it).
pub const GLOBAL_TEXREF: u32 = 1 << 1;
/// [`GlobalInfo`] flag: a surface reference's slot (`.global .surfref`), as [`GLOBAL_TEXREF`].
pub const GLOBAL_SURFREF: u32 = 1 << 2;

/// The op may be sent with `FLAG_ASYNC` (no reply; errors surface later).
pub const ASYNC_OK: u8 = 1 << 0;
/// The request payload ends with bulk bytes after the last field.
pub const REQ_TAIL: u8 = 1 << 1;
/// The reply payload ends with bulk bytes after the last field.
pub const REPLY_TAIL: u8 = 1 << 2;

/// [`SyncBegin`] kind: every stream of the context `ctx` (`cuCtxSynchronize`).
pub const SYNC_CONTEXT: u32 = 0;
/// [`SyncBegin`] kind: the stream `handle` (`cuStreamSynchronize`).
pub const SYNC_STREAM: u32 = 1;
/// [`SyncBegin`] kind: the event `handle`'s last record (`cuEventSynchronize`).
pub const SYNC_EVENT: u32 = 2;
/// [`SyncBegin`] kind: every job of the session submitted so far, on every context, waited for
/// without reporting errors (what `cuMemFree` waits for before it frees; `ctx` is the freeing
/// context).
pub const SYNC_ALL: u32 = 3;
/// [`SyncBegin`] kind: what `cuCtxDestroy` of `ctx` waits for before it destroys: the context's
/// stream-memory waits end (as the destroy ends them), then every job of the session submitted so
/// far is waited for, without reporting errors. A context that does not exist or is a primary
/// context is refused as `CtxDestroy` refuses it.
pub const SYNC_DESTROY: u32 = 4;
/// [`SyncBegin`] and [`SyncWait`] value: the work is done.
pub const SYNC_DONE: i32 = 0;
/// [`SyncBegin`] and [`SyncWait`] value: not yet.
pub const SYNC_PENDING: i32 = 1;
/// [`SyncWait`] value: the work will not finish (its session ended or was abandoned).
pub const SYNC_GONE: i32 = 2;
/// [`SyncBegin`] value: the work is done, and nothing else of the session is queued or running
/// either (a client may skip waiting before its next synchronous copy until it sends more work).
pub const SYNC_IDLE: i32 = 3;

/// [`SetFeatures`] bit: the client fetches device-side `printf`/`assert` output with
/// [`TakeOutput`] when a reply carries [`crate::frame::FLAG_OUTPUT`].
pub const FEATURE_DEVICE_OUTPUT: u64 = 1 << 0;
/// [`SetFeatures`] bit: the server has [`SyncBegin`], [`SyncWait`] and [`SyncFinish`] (it
/// enables nothing; asking tells the client).
pub const FEATURE_SYNC_TICKETS: u64 = 1 << 1;
/// Every feature this build knows.
pub const FEATURES: u64 = FEATURE_DEVICE_OUTPUT | FEATURE_SYNC_TICKETS;

/// A field of a message, for the catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// Field name.
    pub name: &'static str,
    /// Wire type name (`u32`, `str`, `i32[]`, …).
    pub ty: &'static str,
}

/// A struct with a wire encoding.
pub trait Message: Sized {
    /// Struct name.
    const NAME: &'static str;
    /// Fields in wire order.
    const FIELDS: &'static [Field];
    /// Appends the encoded fields to `buf`.
    fn encode(&self, buf: &mut Vec<u8>);
    /// Decodes the fields from `r`.
    fn decode_from(r: &mut Reader<'_>) -> Result<Self, DecodeError>;
}

/// A request type: its opcode, flags and reply type.
pub trait Op: Message {
    /// Opcode.
    const OPCODE: u16;
    /// `ASYNC_OK | REQ_TAIL | REPLY_TAIL` bits.
    const FLAGS: u8;
    /// The reply struct.
    type Reply: Message;
}

/// Decodes a message that must fill the payload exactly, or be followed by a
/// tail when `tail` is set. Returns the message and the tail's offset.
pub fn decode_exact<M: Message>(payload: &[u8], tail: bool) -> Result<(M, usize), DecodeError> {
    let mut r = Reader::new(payload);
    let m = M::decode_from(&mut r)?;
    let pos = r.position();
    if !tail && pos != payload.len() {
        return Err(DecodeError::TrailingBytes(payload.len() - pos));
    }
    Ok((m, pos))
}

/// Decodes the reply of op `O` from a successful reply payload; returns the
/// reply and its bulk tail (empty unless `O` has `REPLY_TAIL`).
pub fn decode_reply<O: Op>(payload: &[u8]) -> Result<(O::Reply, &[u8]), DecodeError> {
    let (m, pos) = decode_exact::<O::Reply>(payload, O::FLAGS & REPLY_TAIL != 0)?;
    Ok((m, &payload[pos..]))
}

macro_rules! wire_structs {
    ($(
        $(#[doc = $doc:literal])*
        pub struct $name:ident { $( $(#[doc = $fdoc:literal])* pub $f:ident : $t:ty ),* $(,)? }
    )*) => {$(
        $(#[doc = $doc])*
        #[derive(Debug, Clone, PartialEq, Default)]
        pub struct $name { $( $(#[doc = $fdoc])* pub $f: $t, )* }

        impl Message for $name {
            const NAME: &'static str = stringify!($name);
            const FIELDS: &'static [Field] = &[ $( Field { name: stringify!($f), ty: <$t as Wire>::TYPE } ),* ];
            #[allow(unused_variables, unused_mut)]
            fn encode(&self, buf: &mut Vec<u8>) {
                let mut w = Writer::new(buf);
                $( self.$f.put(&mut w); )*
            }
            #[allow(unused_variables)]
            fn decode_from(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(Self { $( $f: <$t as Wire>::get(r, stringify!($f))?, )* })
            }
        }
    )*};
}

/// One entry of the op catalogue.
#[derive(Debug, Clone, Copy)]
pub struct OpSpec {
    /// Op (and request struct) name.
    pub name: &'static str,
    /// Opcode.
    pub opcode: u16,
    /// Request fields.
    pub request: &'static [Field],
    /// Reply struct name.
    pub reply_name: &'static str,
    /// Reply fields.
    pub reply: &'static [Field],
    /// `ASYNC_OK | REQ_TAIL | REPLY_TAIL` bits.
    pub flags: u8,
    /// The CUDA entry points that use the op.
    pub used_by: &'static str,
}

macro_rules! ops {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident = $op:literal => $reply:ident, $flags:expr, $used:literal
            { $( $(#[doc = $fdoc:literal])* $f:ident : $t:ty ),* $(,)? }
    )*) => {
        wire_structs! { $(
            $(#[doc = $doc])*
            pub struct $name { $( $(#[doc = $fdoc])* pub $f : $t ),* }
        )* }

        $(
            impl Op for $name {
                const OPCODE: u16 = $op;
                const FLAGS: u8 = $flags;
                type Reply = $reply;
            }
        )*

        /// Opcode numbers.
        #[allow(non_upper_case_globals)]
        pub mod opcode {
            $( #[doc = concat!("Opcode of [`super::", stringify!($name), "`].")] pub const $name: u16 = $op; )*
        }

        /// Any request, decoded.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Request {
            $( $(#[doc = $doc])* $name($name), )*
        }

        impl Request {
            /// Decodes a request payload. Returns the request and the offset of its bulk tail.
            pub fn decode(opcode: u16, payload: &[u8]) -> Result<(Request, usize), DecodeError> {
                match opcode {
                    $( $op => {
                        let (m, pos) = decode_exact::<$name>(payload, $flags & REQ_TAIL != 0)?;
                        Ok((Request::$name(m), pos))
                    } )*
                    other => Err(DecodeError::UnknownOpcode(other)),
                }
            }

            /// The op's name.
            pub fn name(&self) -> &'static str {
                match self { $( Request::$name(_) => stringify!($name), )* }
            }

            /// The op's flags.
            pub fn flags(&self) -> u8 {
                match self { $( Request::$name(_) => $flags, )* }
            }
        }

        /// Every op, in opcode order.
        pub const OPS: &[OpSpec] = &[ $(
            OpSpec {
                name: stringify!($name),
                opcode: $op,
                request: <$name as Message>::FIELDS,
                reply_name: <$reply as Message>::NAME,
                reply: <$reply as Message>::FIELDS,
                flags: $flags,
                used_by: $used,
            },
        )* ];
    };
}

wire_structs! {
    /// Reply without fields.
    pub struct Empty {}
    /// Handshake reply.
    pub struct HelloReply {
        /// Protocol version the server speaks (equal to the client's on success).
        pub protocol_version: u32,
        /// Session number, unique for the daemon's lifetime.
        pub session_id: u64,
        /// Name of the tenant (VM) the transport identified.
        pub tenant: String,
        /// vgpud version.
        pub server_version: String,
        /// Largest payload the server accepts.
        pub max_payload: u32,
    }
    /// A count.
    pub struct Count { pub count: u32 }
    /// A size in bytes.
    pub struct Bytes { pub bytes: u64 }
    /// A 32-bit value.
    pub struct Value { pub value: i32 }
    /// A handle (context, stream, event, module or function).
    pub struct Handle { pub handle: u64 }
    /// A device pointer.
    pub struct Ptr { pub ptr: u64 }
    /// A pitched allocation.
    pub struct Pitched { pub ptr: u64, pub pitch: u64 }
    /// A device address range.
    pub struct Range { pub base: u64, pub size: u64 }
    /// A module variable: its address, size and [`GLOBAL_MANAGED`]-style flags.
    pub struct GlobalInfo { pub base: u64, pub size: u64, pub flags: u32 }
    /// Memory of the tenant's slice.
    pub struct MemInfo { pub free: u64, pub total: u64 }
    /// Primary context state.
    pub struct PrimaryState { pub flags: u32, pub active: u32 }
    /// Milliseconds between two events.
    pub struct Elapsed { pub ms: f32 }
    /// Device properties as the tenant sees them.
    pub struct DeviceProperties {
        pub name: String,
        pub uuid: [u8; 16],
        /// The tenant's memory slice, in bytes.
        pub total_mem: u64,
        /// `CUdevice_attribute` values indexed by attribute number (0 where unknown).
        pub attributes: Vec<i32>,
    }
    /// A kernel function handle and its parameter layout.
    pub struct Function {
        pub function: u64,
        /// Byte offset of each parameter in the packed parameter buffer.
        pub param_offsets: Vec<u32>,
        /// Size in bytes of each parameter.
        pub param_sizes: Vec<u32>,
        /// `CUfunction_attribute` values indexed by attribute number.
        pub attributes: Vec<i32>,
    }
    /// A JSON document.
    pub struct Json { pub json: String }
    /// The names of a module's kernels, in the module's order.
    pub struct Names {
        /// The names, each followed by a NUL byte.
        pub names: String,
    }
    /// The optional features the server enabled (a subset of those asked for).
    pub struct FeatureSet { pub features: u64 }
    /// Device-side output released by synchronizing calls, oldest first.
    pub struct DeviceOutput {
        /// `printf` text, for the process's stdout.
        pub stdout: Vec<u8>,
        /// Failed `assert` messages, for the process's stderr.
        pub stderr: Vec<u8>,
        /// Non-zero when more is waiting (ask again).
        pub more: u32,
    }
    /// A 128-bit token naming exported memory within a VM.
    pub struct Token { pub hi: u64, pub lo: u64 }
    /// A graph memory allocation node ([`crate::graph::MEM_ALLOC_NODE`]): at each launch,
    /// `size` bytes charged to the slice are mapped at `ptr`, an address the shim reserved with
    /// `MemAddressReserve` when it created the node.
    pub struct GraphMemAllocNode { pub ptr: u64, pub size: u64 }
    /// A graph memory free node ([`crate::graph::MEM_FREE_NODE`]): unmaps and uncharges the
    /// graph allocation at `ptr` once the work before it is done.
    pub struct GraphMemFreeNode { pub ptr: u64 }
    /// A conditional node ([`crate::graph::CONDITIONAL_NODE`]; CUDA 12.3's
    /// `CU_GRAPH_NODE_TYPE_CONDITIONAL`): when the launch reaches it, `handle`'s value chooses
    /// which of its `bodies` body graphs run (`kind`, [`crate::graph::conditional`]). The
    /// handle's value at the start of each launch is `default` with
    /// [`crate::graph::conditional::ASSIGN_DEFAULT`] in `flags`, 0 without. The bodies follow
    /// as the tail, each a `u32` length and a node list of its own.
    pub struct GraphConditionalNode {
        pub handle: u64,
        pub kind: u32,
        pub bodies: u32,
        pub default: u32,
        pub flags: u32,
    }
    /// A process's graph memory: bytes mapped now for graph allocations (vgpud keeps no cache,
    /// so they are also the bytes reserved), and the high watermarks of used and reserved
    /// bytes since each was last reset.
    pub struct GraphMemUse { pub used: u64, pub used_high: u64, pub reserved_high: u64 }
}

ops! {
    /// First request of every session: the client's protocol and identity.
    Hello = 0x0001 => HelloReply, 0, "cuInit" {
        protocol_version: u32,
        /// Process id in the guest (informational).
        pid: u32,
        shim_version: String,
        /// Process name in the guest (informational).
        process_name: String,
    }
    /// Orderly end of the session; the server closes the connection.
    Goodbye = 0x0002 => Empty, ASYNC_OK, "process exit" {}
    /// Round trip without side effects.
    Ping = 0x0003 => Empty, 0, "vgpu-bench" {}
    /// Enables optional features (`FEATURE_*` bits); the reply says which the server has.
    /// Servers without it answer `CUDA_ERROR_NOT_SUPPORTED`: no optional feature.
    SetFeatures = 0x0004 => FeatureSet, 0, "cuInit" { features: u64 }
    /// Takes up to `max_bytes` of the device output synchronizing calls released (see
    /// `FLAG_OUTPUT`).
    TakeOutput = 0x0005 => DeviceOutput, 0, "device printf and assert" { max_bytes: u32 }

    /// Number of devices the tenant sees.
    DeviceGetCount = 0x0101 => Count, 0, "cuDeviceGetCount" {}
    /// Static properties of a device (cached by the shim).
    DeviceGetProperties = 0x0102 => DeviceProperties, 0, "cuInit, cuDeviceGetName, cuDeviceGetUuid, cuDeviceGetAttribute" {
        device: u32,
    }
    /// The tenant's memory slice (live; changes when an operator resizes it).
    DeviceTotalMem = 0x0103 => Bytes, 0, "cuDeviceTotalMem_v2" { device: u32 }

    /// Creates a context.
    CtxCreate = 0x0201 => Handle, 0, "cuCtxCreate_v2" { device: u32, flags: u32 }
    /// Destroys a context and everything allocated in it.
    CtxDestroy = 0x0202 => Empty, 0, "cuCtxDestroy_v2" { ctx: u64 }
    /// Waits for all work of a context.
    CtxSynchronize = 0x0203 => Empty, 0, "cuCtxSynchronize" { ctx: u64 }
    /// Retains the device's primary context.
    PrimaryCtxRetain = 0x0204 => Handle, 0, "cuDevicePrimaryCtxRetain" { device: u32 }
    /// Releases the primary context.
    PrimaryCtxRelease = 0x0205 => Empty, 0, "cuDevicePrimaryCtxRelease_v2" { device: u32 }
    /// Destroys the primary context's resources.
    PrimaryCtxReset = 0x0206 => Empty, 0, "cuDevicePrimaryCtxReset_v2" { device: u32 }
    /// Primary context flags and whether it is active.
    PrimaryCtxGetState = 0x0207 => PrimaryState, 0, "cuDevicePrimaryCtxGetState" { device: u32 }
    /// Sets primary context flags.
    PrimaryCtxSetFlags = 0x0208 => Empty, 0, "cuDevicePrimaryCtxSetFlags_v2" { device: u32, flags: u32 }
    /// Sets a `CUlimit` the host enforces (`CU_LIMIT_PRINTF_FIFO_SIZE`).
    CtxSetLimit = 0x0209 => Empty, 0, "cuCtxSetLimit" { ctx: u64, limit: u32, value: u64 }
    /// Creates a green context: a context whose kernels run on `sm_count` of the device's
    /// multiprocessors (at most the device's; the shim splits them as CUDA does). It holds a
    /// reference to the primary context until it is destroyed (`CtxDestroy`), and what it
    /// allocated then belongs to the primary context.
    GreenCtxCreate = 0x020a => Handle, 0, "cuGreenCtxCreate" { device: u32, sm_count: u32 }
    /// Creates a context (as `CtxCreate`) whose kernels run on `sm_count` of the device's
    /// multiprocessors (execution affinity, `CU_EXEC_AFFINITY_TYPE_SM_COUNT`).
    CtxCreateAffinity = 0x020b => Handle, 0, "cuCtxCreate_v3, cuCtxCreate_v4" {
        device: u32, flags: u32, sm_count: u32,
    }

    /// Allocates device memory, charged to the tenant's slice.
    MemAlloc = 0x0301 => Ptr, 0, "cuMemAlloc_v2" { ctx: u64, size: u64 }
    /// Allocates pitched device memory, charged to the slice.
    MemAllocPitch = 0x0302 => Pitched, 0, "cuMemAllocPitch_v2" {
        ctx: u64, width: u64, height: u64, elem_size: u32,
    }
    /// Frees device memory (waits for the context's pending work first).
    MemFree = 0x0303 => Empty, 0, "cuMemFree_v2" { ctx: u64, ptr: u64 }
    /// Free and total memory of the tenant's slice.
    MemGetInfo = 0x0304 => MemInfo, 0, "cuMemGetInfo_v2" { ctx: u64 }
    /// Base and size of the allocation containing a pointer.
    MemGetAddressRange = 0x0305 => Range, 0, "cuMemGetAddressRange_v2" { ctx: u64, ptr: u64 }
    /// Host to device copy; the data is the bulk tail (at most MAX_BULK_CHUNK bytes).
    MemcpyHtoD = 0x0306 => Empty, ASYNC_OK | REQ_TAIL, "cuMemcpyHtoD_v2, cuMemcpyHtoDAsync_v2, cuMemcpy" {
        ctx: u64, stream: u64, dst: u64,
    }
    /// Device to host copy; the reply's bulk tail holds `len` bytes (at most MAX_BULK_CHUNK).
    MemcpyDtoH = 0x0307 => Empty, REPLY_TAIL, "cuMemcpyDtoH_v2, cuMemcpyDtoHAsync_v2, cuMemcpy" {
        ctx: u64, stream: u64, src: u64, len: u64,
    }
    /// Device to device copy.
    MemcpyDtoD = 0x0308 => Empty, ASYNC_OK, "cuMemcpyDtoD_v2, cuMemcpyDtoDAsync_v2, cuMemcpy" {
        ctx: u64, stream: u64, dst: u64, src: u64, len: u64,
    }
    /// Fills `count` elements of `elem_size` (1, 2 or 4) bytes with `value`.
    Memset = 0x0309 => Empty, ASYNC_OK, "cuMemsetD8_v2, cuMemsetD16_v2, cuMemsetD32_v2 and their Async forms" {
        ctx: u64, stream: u64, dst: u64, value: u32, elem_size: u32, count: u64,
    }
    /// Device to host copy of what changed: the request's bulk tail holds the guest's hash of
    /// each page of its copy of `[src, src+len)` (`vgpu_proto::pagehash`, 8 bytes per page);
    /// the reply's tail holds a bitmap of the pages that differ (bit `i % 8` of byte `i / 8`)
    /// followed by those pages' bytes, in order. `len` is at most MAX_BULK_CHUNK.
    MemcpyDtoHDelta = 0x0310 => Empty, REQ_TAIL | REPLY_TAIL, "cuCtxSynchronize and other synchronizing calls (managed memory)" {
        ctx: u64, stream: u64, src: u64, len: u64,
    }

    /// Creates a stream.
    StreamCreate = 0x0401 => Handle, 0, "cuStreamCreate, cuStreamCreateWithPriority" {
        ctx: u64, flags: u32, priority: i32,
    }
    /// Destroys a stream (its pending work still completes).
    StreamDestroy = 0x0402 => Empty, 0, "cuStreamDestroy_v2" { ctx: u64, stream: u64 }
    /// Waits for the stream's work.
    StreamSynchronize = 0x0403 => Empty, 0, "cuStreamSynchronize" { ctx: u64, stream: u64 }
    /// CUDA_SUCCESS when the stream's work is done, CUDA_ERROR_NOT_READY otherwise.
    StreamQuery = 0x0404 => Empty, 0, "cuStreamQuery" { ctx: u64, stream: u64 }
    /// Makes later work on the stream wait for an event.
    StreamWaitEvent = 0x0405 => Empty, ASYNC_OK, "cuStreamWaitEvent" {
        ctx: u64, stream: u64, event: u64, flags: u32,
    }
    /// Stops the stream at a host function until `HostFuncDone` names the same token (chosen by
    /// the client; unique among the VM's pending host functions). Synchronous, so that the token
    /// is known before the client waits for it, but it waits for nothing.
    StreamHostFunc = 0x0410 => Empty, 0, "cuLaunchHostFunc, cuStreamAddCallback" {
        ctx: u64, stream: u64, token_hi: u64, token_lo: u64,
    }
    /// Waits at most `timeout_ms` (capped by the host) until the stream reaches a host function;
    /// `value`: 0 not yet, 1 reached (run it, then send `HostFuncDone`), 2 never (do not run it).
    /// Sent on a connection of its own, so the process's synchronizing calls never wait for it.
    HostFuncWait = 0x0411 => Value, 0, "cuLaunchHostFunc, cuStreamAddCallback" {
        token_hi: u64, token_lo: u64, timeout_ms: u32,
    }
    /// The host function ran: its stream goes on.
    HostFuncDone = 0x0412 => Empty, ASYNC_OK, "cuLaunchHostFunc, cuStreamAddCallback" {
        token_hi: u64, token_lo: u64,
    }
    /// Stops the stream at a graph's host copy, as `StreamHostFunc` does at a host function:
    /// `len` bytes (at most MAX_BULK_CHUNK) at `dev`, inside an allocation of this process;
    /// `to_device` 1: the guest's bytes go to `dev` (`HostFuncDoneWrite` opens the gate), 0: `dev`'s
    /// bytes go to the guest (`HostFuncWaitRead` returns them when the stream reaches the gate).
    StreamHostCopy = 0x0413 => Empty, 0, "cuGraphLaunch" {
        ctx: u64, stream: u64, token_hi: u64, token_lo: u64, dev: u64, len: u64, to_device: u32,
    }
    /// `HostFuncWait` for a host copy; when `value` is 1 (reached) and the copy goes to the guest,
    /// the reply's bulk tail holds the device bytes, read when the stream reached the gate. Then
    /// `HostFuncDone` opens the gate.
    HostFuncWaitRead = 0x0414 => Value, REPLY_TAIL, "cuGraphLaunch" {
        token_hi: u64, token_lo: u64, timeout_ms: u32,
    }
    /// Opens a reached host copy to the device: the bulk tail (exactly the copy's length) is
    /// written to its destination first.
    HostFuncDoneWrite = 0x0415 => Empty, REQ_TAIL, "cuGraphLaunch" {
        token_hi: u64, token_lo: u64,
    }

    /// A stream memory operation (`op`: CUDA's `CUstreamBatchMemOpType`, 1 wait on 32 bits, 2
    /// write 32 bits, 4 wait on 64 bits, 5 write 64 bits; `flags`: CUDA's flags of that operation)
    /// at `addr`, inside an allocation of this process and aligned to the operation's width. A
    /// write stores the low bytes of `value`; a wait stops the stream until the word at `addr`
    /// meets the condition its flags name. `cuStreamBatchMemOp` sends one per operation.
    StreamMemOp = 0x0416 => Empty, ASYNC_OK, "cuStreamWaitValue32/64, cuStreamWriteValue32/64, cuStreamBatchMemOp" {
        ctx: u64, stream: u64, op: u32, flags: u32, addr: u64, value: u64,
    }
    /// Starts a synchronizing call (`kind`: [`SYNC_CONTEXT`] `ctx`, [`SYNC_STREAM`] stream
    /// `handle` of `ctx`, [`SYNC_EVENT`] event `handle`, [`SYNC_ALL`], [`SYNC_DESTROY`]) that does not hold the connection while
    /// it waits: vgpud waits here at most `wait_us` (capped by the host); `value` [`SYNC_DONE`]
    /// (or [`SYNC_IDLE`]) when the work is done (and the call's errors are reported as the plain synchronizing call
    /// reports them), [`SYNC_PENDING`] when it is not yet: the client then waits with
    /// `SyncWait` for the token it chose (unique among the VM's pending waits) on a connection
    /// of its own, and ends with `SyncFinish`.
    SyncBegin = 0x0417 => Value, 0, "cuCtxSynchronize, cuStreamSynchronize, cuEventSynchronize" {
        ctx: u64, kind: u32, handle: u64, wait_us: u32, token_hi: u64, token_lo: u64,
    }
    /// Waits at most `timeout_ms` (capped by the host) for the work a pending `SyncBegin` named;
    /// `value`: [`SYNC_DONE`], [`SYNC_PENDING`] (not yet: ask again) or [`SYNC_GONE`] (its
    /// session's work was abandoned). Sent on any connection of the VM; the token is forgotten
    /// once done or gone.
    SyncWait = 0x0418 => Value, 0, "cuCtxSynchronize, cuStreamSynchronize, cuEventSynchronize" {
        token_hi: u64, token_lo: u64, timeout_ms: u32,
    }
    /// Ends a synchronizing call whose wait `SyncWait` saw done: reports its errors as the
    /// plain synchronizing call does, without waiting again.
    SyncFinish = 0x0419 => Empty, 0, "cuCtxSynchronize, cuStreamSynchronize, cuEventSynchronize" {
        ctx: u64, kind: u32, handle: u64,
    }

    /// Creates an event.
    EventCreate = 0x0501 => Handle, 0, "cuEventCreate" { ctx: u64, flags: u32 }
    /// Destroys an event.
    EventDestroy = 0x0502 => Empty, 0, "cuEventDestroy_v2" { ctx: u64, event: u64 }
    /// Records an event on a stream.
    EventRecord = 0x0503 => Empty, ASYNC_OK, "cuEventRecord" { ctx: u64, stream: u64, event: u64 }
    /// CUDA_SUCCESS when the event's work is done, CUDA_ERROR_NOT_READY otherwise.
    EventQuery = 0x0504 => Empty, 0, "cuEventQuery" { ctx: u64, event: u64 }
    /// Waits for an event.
    EventSynchronize = 0x0505 => Empty, 0, "cuEventSynchronize" { ctx: u64, event: u64 }
    /// Milliseconds between two completed events.
    EventElapsedTime = 0x0506 => Elapsed, 0, "cuEventElapsedTime" { ctx: u64, start: u64, end: u64 }
    /// Records an event that completes once all work the context `ctx` holds now (on every
    /// stream) has run.
    CtxRecordEvent = 0x0507 => Empty, 0, "cuCtxRecordEvent" { ctx: u64, event: u64 }
    /// Makes all work submitted to the context `ctx` from now on (on every stream, created or
    /// not yet) wait for the event's current record.
    CtxWaitEvent = 0x0508 => Empty, 0, "cuCtxWaitEvent" { ctx: u64, event: u64 }

    /// Loads a module; the image (PTX text, NUL excluded) is the bulk tail.
    ModuleLoad = 0x0601 => Handle, REQ_TAIL, "cuModuleLoadData, cuModuleLoadDataEx, cuLibraryLoadData" { ctx: u64 }
    /// Unloads a module and frees its globals.
    ModuleUnload = 0x0602 => Empty, 0, "cuModuleUnload, cuLibraryUnload" { ctx: u64, module: u64 }
    /// Looks up a kernel.
    ModuleGetFunction = 0x0603 => Function, 0, "cuModuleGetFunction, cuLibraryGetKernel" {
        ctx: u64, module: u64, name: String,
    }
    /// Looks up a module global (`__device__` or `__constant__`).
    ModuleGetGlobal = 0x0604 => Range, 0, "cuModuleGetGlobal_v2" { ctx: u64, module: u64, name: String }
    /// Launches a kernel; the packed parameter buffer is the bulk tail.
    LaunchKernel = 0x0605 => Empty, ASYNC_OK | REQ_TAIL, "cuLaunchKernel, cuLaunchKernelEx" {
        ctx: u64, stream: u64, function: u64,
        grid_x: u32, grid_y: u32, grid_z: u32,
        block_x: u32, block_y: u32, block_z: u32,
        shared_bytes: u32,
    }
    /// A `CUfunction_attribute` of a kernel.
    FuncGetAttribute = 0x0606 => Value, 0, "cuFuncGetAttribute" { ctx: u64, function: u64, attribute: i32 }
    /// Sets a `CUfunction_attribute` of a kernel.
    FuncSetAttribute = 0x0607 => Empty, 0, "cuFuncSetAttribute" {
        ctx: u64, function: u64, attribute: i32, value: i32,
    }

    /// The names of a module's kernels.
    ModuleFunctionNames = 0x0608 => Names, 0, "cuModuleGetFunctionCount, cuModuleEnumerateFunctions, cuLibraryGetKernelCount, cuLibraryEnumerateKernels" {
        ctx: u64, module: u64,
    }

    /// A module variable's address, size and flags ([`GLOBAL_MANAGED`]); replaces
    /// `ModuleGetGlobal` for shims that mirror `__managed__` variables.
    ModuleGetGlobalInfo = 0x0609 => GlobalInfo, 0, "cuModuleGetGlobal_v2, cuLibraryGetGlobal, cuLibraryGetManaged" {
        ctx: u64, module: u64, name: String,
    }
    /// Launches a kernel cooperatively: every block at once, so blocks may wait for each other
    /// (cooperative groups' `grid.sync()`); at most as many blocks as fit on the device at
    /// once. As `LaunchKernel` otherwise.
    LaunchCooperative = 0x060a => Empty, ASYNC_OK | REQ_TAIL, "cuLaunchCooperativeKernel, cuLaunchKernelEx" {
        ctx: u64, stream: u64, function: u64,
        grid_x: u32, grid_y: u32, grid_z: u32,
        block_x: u32, block_y: u32, block_z: u32,
        shared_bytes: u32,
    }
    /// Launches a kernel with a priority of its own (`CU_LAUNCH_ATTRIBUTE_PRIORITY`): among the
    /// session's ready streams it starts as if its stream had `priority` (lower numbers first;
    /// clamped to the device's range), without reordering its stream. `cooperative` is 0 or 1
    /// (`LaunchCooperative`'s rules). As `LaunchKernel` otherwise; also a graph kernel node
    /// whose priority is used (`CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`).
    LaunchKernelPriority = 0x060b => Empty, ASYNC_OK | REQ_TAIL, "cuLaunchKernelEx, cuGraphLaunch" {
        ctx: u64, stream: u64, function: u64,
        grid_x: u32, grid_y: u32, grid_z: u32,
        block_x: u32, block_y: u32, block_z: u32,
        shared_bytes: u32, cooperative: u32, priority: i32,
    }
    /// A part of a module image too large for one request (the part is the bulk tail), at
    /// `offset` of an image of `total` bytes. Parts come in order; offset 0 starts an image
    /// (dropping one not finished). The last part loads the image as `ModuleLoad` does and its
    /// reply carries the module's handle; the others reply 0.
    ModuleLoadPart = 0x060c => Handle, REQ_TAIL, "cuModuleLoadData, cuModuleLoadDataEx, cuLibraryLoadData (images larger than one request)" {
        ctx: u64, total: u64, offset: u64,
    }

    /// The tenant's slice, usage and sessions as JSON (for vgpu-smi).
    TenantInfo = 0x0701 => Json, 0, "vgpu-smi and NVML: the VM's slice, usage and share of the last second's device time; each session's pid, process, memory and contexts" {}

    /// Allocates page-aligned device memory that the guest process also maps at the same
    /// address (its host mirror): managed memory (`kind` 1) or mapped host memory (`kind` 2:
    /// `cuMemHostAlloc` with `DEVICEMAP`; 3: `cuMemHostRegister` with `DEVICEMAP`). Charged to
    /// the slice; freed by `MemFree`.
    MemAllocMapped = 0x0801 => Ptr, 0, "cuMemAllocManaged, cuMemHostAlloc, cuMemHostRegister_v2" {
        ctx: u64, size: u64, kind: u32,
    }
    /// Creates a memory pool (`max_size` 0: unbounded except by the slice; `handle_types`: the
    /// `CUmemAllocationHandleType` bits it may be exported as, 0 for a pool never shared).
    MemPoolCreate = 0x0810 => Handle, 0, "cuMemPoolCreate" { ctx: u64, max_size: u64, handle_types: u32 }
    /// Destroys a pool; its free blocks go back to the slice, blocks in use when the last one is freed.
    MemPoolDestroy = 0x0811 => Empty, 0, "cuMemPoolDestroy" { ctx: u64, pool: u64 }
    /// The device's current pool (`default` 0) or its default pool (`default` 1).
    DeviceGetMemPool = 0x0812 => Handle, 0, "cuDeviceGetMemPool, cuDeviceGetDefaultMemPool" {
        device: u32, default: u32,
    }
    /// Makes `pool` the device's current pool (the one `cuMemAllocAsync` uses).
    DeviceSetMemPool = 0x0813 => Empty, 0, "cuDeviceSetMemPool" { device: u32, pool: u64 }
    /// Sets a `CUmemPool_attribute` (thresholds, reuse flags, high-water marks reset).
    MemPoolSetAttribute = 0x0814 => Empty, 0, "cuMemPoolSetAttribute" {
        pool: u64, attribute: i32, value: u64,
    }
    /// A `CUmemPool_attribute`.
    MemPoolGetAttribute = 0x0815 => Bytes, 0, "cuMemPoolGetAttribute" { pool: u64, attribute: i32 }
    /// Releases the pool's free blocks until at most `keep` bytes stay reserved.
    MemPoolTrimTo = 0x0816 => Empty, 0, "cuMemPoolTrimTo" { pool: u64, keep: u64 }
    /// Allocates from a pool (`pool` 0: the device's current pool), ordered on `stream`.
    MemAllocAsync = 0x0817 => Ptr, 0, "cuMemAllocAsync, cuMemAllocFromPoolAsync" {
        ctx: u64, stream: u64, pool: u64, size: u64,
    }
    /// Returns a pool block to its pool, ordered on `stream` (or frees a plain allocation there).
    MemFreeAsync = 0x0818 => Empty, ASYNC_OK, "cuMemFreeAsync" { ctx: u64, stream: u64, ptr: u64 }
    /// Exports a pool created with `handle_type` among its handle types for other processes of
    /// the same VM: a random token naming it (the same token each time for one pool).
    MemPoolExport = 0x0819 => Token, 0, "cuMemPoolExportToShareableHandle" {
        ctx: u64, pool: u64, handle_type: u32,
    }
    /// Imports a pool another process of the same VM exported: the reply is a pool handle of
    /// this process that allocates nothing (CUDA's imported pools cannot allocate). A token of
    /// another VM, an unknown one, or one of this process is refused.
    MemPoolImport = 0x081a => Handle, 0, "cuMemPoolImportFromShareableHandle" { ctx: u64, hi: u64, lo: u64 }
    /// Exports the pool block `ptr` starts (its pool must be exportable): a random token naming
    /// it (the same token each time for one block, until its exporter frees it).
    MemPoolExportPointer = 0x081b => Token, 0, "cuMemPoolExportPointer" { ctx: u64, ptr: u64 }
    /// Opens a block exported from the pool that `pool` (an imported pool) names: the reply is
    /// its range (the exporter's address). Freed by `MemFree`/`MemFreeAsync`, one per opening.
    MemPoolImportPointer = 0x081c => Range, 0, "cuMemPoolImportPointer" {
        ctx: u64, pool: u64, hi: u64, lo: u64,
    }

    /// Creates physical memory (a multiple of the granularity), charged to the slice at once.
    MemCreate = 0x0830 => Handle, 0, "cuMemCreate" { ctx: u64, size: u64 }
    /// Releases a physical memory handle; mapped memory lives until unmapped.
    MemRelease = 0x0831 => Empty, 0, "cuMemRelease" { handle: u64 }
    /// Reserves device address space (bounded per VM).
    MemAddressReserve = 0x0832 => Ptr, 0, "cuMemAddressReserve" { ctx: u64, size: u64, align: u64 }
    /// Frees a reservation.
    MemAddressFree = 0x0833 => Empty, 0, "cuMemAddressFree" { ptr: u64, size: u64 }
    /// Maps a whole physical allocation at `ptr` inside a reservation (`offset` must be 0).
    MemMap = 0x0834 => Empty, 0, "cuMemMap" { ptr: u64, size: u64, offset: u64, handle: u64 }
    /// Unmaps the mappings that make up `[ptr, ptr + size)`.
    MemUnmap = 0x0835 => Empty, 0, "cuMemUnmap" { ptr: u64, size: u64 }
    /// Sets the device's access (`CUmemAccess_flags`) to the mappings in `[ptr, ptr + size)`.
    MemSetAccess = 0x0836 => Empty, 0, "cuMemSetAccess" { ptr: u64, size: u64, flags: u32 }
    /// The device's access to the mapping containing `ptr`.
    MemGetAccess = 0x0837 => Value, 0, "cuMemGetAccess" { ptr: u64 }
    /// A new reference to the physical memory mapped at `ptr`.
    MemRetainAllocationHandle = 0x0838 => Handle, 0, "cuMemRetainAllocationHandle" { ptr: u64 }
    /// The size of the physical memory a handle names.
    MemGetAllocationSize = 0x0839 => Bytes, 0, "cuMemGetAllocationPropertiesFromHandle" { handle: u64 }
    /// Exports physical memory for other processes of the same VM.
    MemExport = 0x083a => Token, 0, "cuMemExportToShareableHandle" { handle: u64 }
    /// Imports physical memory exported in the same VM (another VM's token is refused).
    MemImport = 0x083b => Handle, 0, "cuMemImportFromShareableHandle" { hi: u64, lo: u64 }
    /// Exports the `cuMemAlloc` allocation containing `ptr` for other processes of the same
    /// VM: a random token naming it (the same token each time for one allocation).
    IpcGetMemHandle = 0x083c => Token, 0, "cuIpcGetMemHandle" { ctx: u64, ptr: u64 }
    /// Opens memory another process of the same VM exported: the reply is its range in this
    /// process. A token of another VM, an unknown or freed one, is refused; so is opening
    /// in the process that exported it (`CUDA_ERROR_INVALID_CONTEXT`).
    IpcOpenMemHandle = 0x083d => Range, 0, "cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2" {
        ctx: u64, hi: u64, lo: u64,
    }
    /// Closes one opening of memory `IpcOpenMemHandle` returned (after the work before it).
    IpcCloseMemHandle = 0x083e => Empty, 0, "cuIpcCloseMemHandle" { ctx: u64, ptr: u64 }
    /// Exports an event created with `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING` for
    /// other processes of the same VM: a random token naming it (the same each time).
    IpcGetEventHandle = 0x083f => Token, 0, "cuIpcGetEventHandle" { ctx: u64, event: u64 }

    /// Shares `size` bytes of page-locked host memory with vgpud (unix socket only): the request
    /// carries a sealed memfd by `SCM_RIGHTS`; the reply names the region for the `*Shared`
    /// copies. Refused with `CUDA_ERROR_NOT_SUPPORTED` where descriptors cannot travel.
    HostShare = 0x0840 => Handle, 0, "cuMemHostAlloc, cuMemAllocHost, cuMemHostRegister" { size: u64 }
    /// Ends a region's sharing; copies already queued from or to it still complete.
    HostUnshare = 0x0841 => Empty, 0, "cuMemFreeHost" { region: u64 }
    /// Host to device copy of `len` bytes at `offset` of a shared region: no bulk bytes.
    MemcpyHtoDShared = 0x0842 => Empty, ASYNC_OK, "cuMemcpyHtoD_v2, cuMemcpyHtoDAsync_v2, cuMemcpy" {
        ctx: u64, stream: u64, dst: u64, region: u64, offset: u64, len: u64,
    }
    /// Device to host copy of `len` bytes into `offset` of a shared region: no bulk bytes; as
    /// asynchronous as a copy to pinned memory is in CUDA.
    MemcpyDtoHShared = 0x0843 => Empty, ASYNC_OK, "cuMemcpyDtoH_v2, cuMemcpyDtoHAsync_v2, cuMemcpy" {
        ctx: u64, stream: u64, src: u64, region: u64, offset: u64, len: u64,
    }
    /// Opens an event another process of the same VM exported: the reply is an event of this
    /// process that `StreamWaitEvent`, `EventQuery` and `EventSynchronize` accept (recording
    /// it is refused). A token of another VM, an unknown one, or one of this process is refused.
    IpcOpenEventHandle = 0x0844 => Handle, 0, "cuIpcOpenEventHandle" { ctx: u64, hi: u64, lo: u64 }
    /// Makes a shared region of [`crate::doorbell::PAGE_BYTES`] bytes to 1 MiB this session's
    /// doorbell page (unix socket only; once per session): a `MemcpyHtoDShared` or `MemcpyDtoHShared` the client
    /// writes there is served as that synchronous frame would be, and its completion is written
    /// back there ([`crate::doorbell`]). Refused with `CUDA_ERROR_NOT_SUPPORTED` where the
    /// transport has no doorbell.
    Doorbell = 0x0845 => Empty, 0, "cuMemcpyHtoD_v2, cuMemcpyDtoH_v2 (pinned memory)" { region: u64 }
    /// Wakes a session thread that sleeps on its socket: a request waits in the doorbell page.
    Ring = 0x0846 => Empty, ASYNC_OK, "cuMemcpyHtoD_v2, cuMemcpyDtoH_v2 (pinned memory)" {}

    /// Uploads an executable graph: the bulk tail holds its nodes in a topological order
    /// ([`crate::graph`]), each an ordinary stream request (kernel launch, device copy, memset,
    /// event record or wait) or a graph memory node. `replace` (0 for a new graph) names an
    /// executable graph of this session whose nodes are replaced (`cuGraphExecUpdate`,
    /// `cuGraphExec*NodeSetParams`); the reply is the executable graph's handle.
    GraphInstantiate = 0x0901 => Handle, REQ_TAIL, "cuGraphInstantiate*, cuGraphUpload, cuGraphExecUpdate, cuGraphExec*NodeSetParams" {
        ctx: u64, replace: u64,
    }
    /// Runs an executable graph on `stream`: one request for all its nodes.
    GraphLaunch = 0x0902 => Empty, ASYNC_OK, "cuGraphLaunch" { ctx: u64, stream: u64, exec: u64 }
    /// Destroys an executable graph (launches already sent still run).
    GraphExecDestroy = 0x0903 => Empty, 0, "cuGraphExecDestroy" { ctx: u64, exec: u64 }
    /// This process's graph memory; `reset` bits [`GRAPH_MEM_RESET_USED_HIGH`] and
    /// [`GRAPH_MEM_RESET_RESERVED_HIGH`] set those watermarks to 0 first.
    GraphMemAttributes = 0x0904 => GraphMemUse, 0, "cuDeviceGetGraphMemAttribute, cuDeviceSetGraphMemAttribute" {
        device: u32, reset: u32,
    }

    /// Creates a texture object over `[base, ...)` in the context's memory: texels of
    /// `channels` channels of `format` (`CUarray_format`), `dims` (1, 2 or 3) dimensions of
    /// `width` × `height` × `depth`, `layers` layers (0: not layered), rows `pitch` bytes and
    /// slices (or layers) `slice_pitch` bytes apart; sampled with `address_0..2`
    /// (`CUaddress_mode`), `filter` (`CUfilter_mode`), `flags` (`CU_TRSF_*`) and the border
    /// colour. The texels must lie in one allocation of this process. The reply's handle is
    /// what kernels receive (`CUtexObject`).
    TexObjectCreate = 0x0a01 => Handle, 0, "cuTexObjectCreate (arrays, pitched and linear memory)" {
        ctx: u64, base: u64, format: u32, channels: u32, dims: u32,
        width: u64, height: u64, depth: u64, layers: u64, pitch: u64, slice_pitch: u64,
        address_0: u32, address_1: u32, address_2: u32, filter: u32, flags: u32,
        border_r: f32, border_g: f32, border_b: f32, border_a: f32,
    }
    /// Destroys a texture object.
    TexObjectDestroy = 0x0a02 => Empty, 0, "cuTexObjectDestroy" { ctx: u64, handle: u64 }
    /// Creates a surface object over a CUDA array's texels (layout as in [`TexObjectCreate`]).
    SurfObjectCreate = 0x0a03 => Handle, 0, "cuSurfObjectCreate" {
        ctx: u64, base: u64, format: u32, channels: u32, dims: u32,
        width: u64, height: u64, depth: u64, layers: u64, pitch: u64, slice_pitch: u64,
    }
    /// Destroys a surface object.
    SurfObjectDestroy = 0x0a04 => Empty, 0, "cuSurfObjectDestroy" { ctx: u64, handle: u64 }
    /// Creates a texture object over the `levels` levels of a mipmapped array at `base`, laid
    /// out as [`crate::cuda::mip::levels`] places them with rows `pitch_align` and levels
    /// `level_align` bytes aligned; the first level's texels and the sampling as in
    /// [`TexObjectCreate`], and between levels `mip_filter` (`CUfilter_mode`), the level of
    /// detail's `level_bias` and its `min_level_clamp` and `max_level_clamp`. Every level must
    /// lie in one allocation of this process.
    TexObjectCreateMipmapped = 0x0a05 => Handle, 0, "cuTexObjectCreate (mipmapped arrays)" {
        ctx: u64, base: u64, format: u32, channels: u32, dims: u32,
        width: u64, height: u64, depth: u64, layers: u64,
        levels: u32, pitch_align: u64, level_align: u64,
        address_0: u32, address_1: u32, address_2: u32, filter: u32, flags: u32,
        border_r: f32, border_g: f32, border_b: f32, border_a: f32,
        mip_filter: u32, level_bias: f32, min_level_clamp: f32, max_level_clamp: f32,
    }
}

impl TexObjectCreate {
    /// The same texture over a mipmapped array of `levels` levels, rows aligned to
    /// `pitch_align` bytes and levels to `level_align` (the pitches are the chain's); the
    /// mipmap sampling fields are 0 for the caller to set.
    pub fn mipmapped(
        &self,
        levels: u32,
        pitch_align: u64,
        level_align: u64,
    ) -> TexObjectCreateMipmapped {
        TexObjectCreateMipmapped {
            ctx: self.ctx,
            base: self.base,
            format: self.format,
            channels: self.channels,
            dims: self.dims,
            width: self.width,
            height: self.height,
            depth: self.depth,
            layers: self.layers,
            levels,
            pitch_align,
            level_align,
            address_0: self.address_0,
            address_1: self.address_1,
            address_2: self.address_2,
            filter: self.filter,
            flags: self.flags,
            border_r: self.border_r,
            border_g: self.border_g,
            border_b: self.border_b,
            border_a: self.border_a,
            ..Default::default()
        }
    }
}

impl TexObjectCreateMipmapped {
    /// Its first level as a texture of one level; the pitches are 0 (the chain decides them).
    pub fn first_level(&self) -> TexObjectCreate {
        TexObjectCreate {
            ctx: self.ctx,
            base: self.base,
            format: self.format,
            channels: self.channels,
            dims: self.dims,
            width: self.width,
            height: self.height,
            depth: self.depth,
            layers: self.layers,
            pitch: 0,
            slice_pitch: 0,
            address_0: self.address_0,
            address_1: self.address_1,
            address_2: self.address_2,
            filter: self.filter,
            flags: self.flags,
            border_r: self.border_r,
            border_g: self.border_g,
            border_b: self.border_b,
            border_a: self.border_a,
        }
    }
}

impl LaunchKernel {
    /// The same launch, cooperative.
    pub fn cooperative(&self) -> LaunchCooperative {
        LaunchCooperative {
            ctx: self.ctx,
            stream: self.stream,
            function: self.function,
            grid_x: self.grid_x,
            grid_y: self.grid_y,
            grid_z: self.grid_z,
            block_x: self.block_x,
            block_y: self.block_y,
            block_z: self.block_z,
            shared_bytes: self.shared_bytes,
        }
    }
}

impl LaunchCooperative {
    /// The same launch's fields as an ordinary launch carries them.
    pub fn launch(&self) -> LaunchKernel {
        LaunchKernel {
            ctx: self.ctx,
            stream: self.stream,
            function: self.function,
            grid_x: self.grid_x,
            grid_y: self.grid_y,
            grid_z: self.grid_z,
            block_x: self.block_x,
            block_y: self.block_y,
            block_z: self.block_z,
            shared_bytes: self.shared_bytes,
        }
    }
}

impl LaunchKernel {
    /// The same launch with a priority of its own.
    pub fn with_priority(&self, cooperative: bool, priority: i32) -> LaunchKernelPriority {
        LaunchKernelPriority {
            ctx: self.ctx,
            stream: self.stream,
            function: self.function,
            grid_x: self.grid_x,
            grid_y: self.grid_y,
            grid_z: self.grid_z,
            block_x: self.block_x,
            block_y: self.block_y,
            block_z: self.block_z,
            shared_bytes: self.shared_bytes,
            cooperative: u32::from(cooperative),
            priority,
        }
    }
}

impl LaunchKernelPriority {
    /// The same launch's fields as an ordinary launch carries them.
    pub fn launch(&self) -> LaunchKernel {
        LaunchKernel {
            ctx: self.ctx,
            stream: self.stream,
            function: self.function,
            grid_x: self.grid_x,
            grid_y: self.grid_y,
            grid_z: self.grid_z,
            block_x: self.block_x,
            block_y: self.block_y,
            block_z: self.block_z,
            shared_bytes: self.shared_bytes,
        }
    }
}

/// Encodes a request payload (without bulk tail).
pub fn encode<M: Message>(m: &M) -> Vec<u8> {
    let mut v = Vec::new();
    m.encode(&mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_are_unique_and_sorted() {
        for w in OPS.windows(2) {
            assert!(w[0].opcode < w[1].opcode, "{} / {}", w[0].name, w[1].name);
        }
    }

    #[test]
    fn requests_round_trip() {
        let m = MemAlloc {
            ctx: 0xc1,
            size: 4096,
        };
        let (r, tail) = Request::decode(MemAlloc::OPCODE, &encode(&m)).unwrap();
        assert_eq!(r, Request::MemAlloc(m));
        assert_eq!(tail, 16);
        assert_eq!(r.name(), "MemAlloc");
    }

    #[test]
    fn tail_is_allowed_only_where_flagged() {
        let mut p = encode(&MemcpyHtoD {
            ctx: 1,
            stream: 0,
            dst: 2,
        });
        p.extend_from_slice(b"data");
        let (_, off) = Request::decode(MemcpyHtoD::OPCODE, &p).unwrap();
        assert_eq!(&p[off..], b"data");

        let mut p = encode(&MemAlloc { ctx: 1, size: 2 });
        p.push(0);
        assert_eq!(
            Request::decode(MemAlloc::OPCODE, &p).unwrap_err(),
            DecodeError::TrailingBytes(1)
        );
    }

    #[test]
    fn truncated_and_unknown_requests_are_errors() {
        let p = encode(&MemAlloc { ctx: 1, size: 2 });
        assert!(matches!(
            Request::decode(MemAlloc::OPCODE, &p[..10]),
            Err(DecodeError::Truncated { field: "size", .. })
        ));
        assert_eq!(
            Request::decode(0x7777, &p).unwrap_err(),
            DecodeError::UnknownOpcode(0x7777)
        );
    }

    #[test]
    fn replies_decode_with_their_tail() {
        let mut p = Vec::new();
        Empty {}.encode(&mut p);
        p.extend_from_slice(b"xyz");
        let (_, tail) = decode_reply::<MemcpyDtoH>(&p).unwrap();
        assert_eq!(tail, b"xyz");
        assert!(decode_reply::<MemFree>(&p).is_err());
    }

    #[test]
    fn catalogue_describes_fields_in_wire_order() {
        let spec = OPS.iter().find(|o| o.name == "Memset").unwrap();
        let names: Vec<_> = spec.request.iter().map(|f| f.name).collect();
        assert_eq!(
            names,
            ["ctx", "stream", "dst", "value", "elem_size", "count"]
        );
        assert_eq!(spec.flags, ASYNC_OK);
    }
}
