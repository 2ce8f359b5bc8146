//! Conformance checks of streams (any executor): order within a stream,
//! event waits across streams, and kernels and copies of different streams
//! running at the same time.
//!
//! The checks use [`FLAG_PTX`]: `wait_flag` spins until a flag in device
//! memory is set, so "still running" is a fact until the check sets the
//! flag, from another stream; an executor that runs streams one after the
//! other fails with the watchdog's timeout instead of hanging.

use std::time::Duration;

use vgpu_corpus::Arg;
use vgpu_proto::cuda;
use vgpu_proto::msg;

use crate::conformance::{Code, Kernel, Rig, Session, Target};

/// `wait_flag(flag, out)`: spins until `*flag != 0`, then writes `*flag + 1`
/// to `*out`; `set_flag(flag, value)`: writes `value` to `*flag`.
pub const FLAG_PTX: &str = "\
.version 7.0
.target sm_52
.address_size 64

.visible .entry wait_flag(.param .u64 flag, .param .u64 out)
{
    .reg .pred %p<2>;
    .reg .b32 %r<3>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [out];
$Lspin:
    ld.volatile.global.u32 %r1, [%rd1];
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra $Lspin;
    add.u32 %r2, %r1, 1;
    st.global.u32 [%rd2], %r2;
    ret;
}

.visible .entry set_flag(.param .u64 flag, .param .u32 value)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [flag];
    ld.param.u32 %r1, [value];
    st.volatile.global.u32 [%rd1], %r1;
    ret;
}
";

/// The watchdog of the checks: long enough for any loaded machine, short
/// enough that an executor without concurrency fails in reasonable time.
const WATCHDOG: Duration = Duration::from_secs(20);
const MIB: u64 = 1 << 20;
const NON_BLOCKING: u32 = 1;

impl Session {
    /// `cuStreamCreate`.
    pub fn stream(&mut self, flags: u32) -> Result<u64, Code> {
        let ctx = self.ctx;
        self.request(&msg::StreamCreate {
            ctx,
            flags,
            priority: 0,
        })
        .map(|r| r.handle)
    }

    /// `cuMemsetD32Async` of one element on `stream`.
    pub fn set_on(&mut self, stream: u64, dst: u64, value: u32) -> Result<(), Code> {
        let ctx = self.ctx;
        self.post(&msg::Memset {
            ctx,
            stream,
            dst,
            value,
            elem_size: 4,
            count: 1,
        })
    }

    /// `cuStreamQuery`: `Ok` when done, `Err(CUDA_ERROR_NOT_READY)` otherwise.
    pub fn query(&mut self, stream: u64) -> Result<(), Code> {
        let ctx = self.ctx;
        self.request(&msg::StreamQuery { ctx, stream }).map(drop)
    }

    /// `cuStreamSynchronize`.
    pub fn sync_stream(&mut self, stream: u64) -> Result<(), Code> {
        let ctx = self.ctx;
        self.request(&msg::StreamSynchronize { ctx, stream })
            .map(drop)
    }

    /// `cuEventRecord` on `stream`.
    pub fn record_on(&mut self, stream: u64, event: u64) -> Result<(), Code> {
        let ctx = self.ctx;
        self.post(&msg::EventRecord { ctx, stream, event })
    }

    /// `cuStreamWaitEvent`.
    pub fn stream_wait(&mut self, stream: u64, event: u64) -> Result<(), Code> {
        let ctx = self.ctx;
        self.post(&msg::StreamWaitEvent {
            ctx,
            stream,
            event,
            flags: 0,
        })
    }

    /// Reads one u32.
    pub fn read_u32(&mut self, src: u64) -> Result<u32, Code> {
        let b = self.dtoh(src, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

fn flag_kernels(s: &mut Session) -> (Kernel, Kernel) {
    let m = s
        .load(FLAG_PTX.as_bytes())
        .expect("loading the flag kernels");
    (
        s.kernel(m, "wait_flag").expect("wait_flag"),
        s.kernel(m, "set_flag").expect("set_flag"),
    )
}

/// Two streams: a kernel that waits for a flag, ended by a kernel of another
/// stream (they must run at the same time); a fill and a copy of another
/// stream complete while the first kernel still runs.
pub fn streams_run_concurrently(t: &Target) {
    let rig = Rig::new((t.make)(Some(WATCHDOG)), &[("a", 16 * MIB, 1)]);
    let mut s = rig.session("a");
    let (wait, set) = flag_kernels(&mut s);
    let (flag, out, other) = (
        s.alloc(4).unwrap(),
        s.alloc(4).unwrap(),
        s.alloc(4).unwrap(),
    );
    let s1 = s.stream(NON_BLOCKING).unwrap();
    let s2 = s.stream(NON_BLOCKING).unwrap();
    s.set_on(s1, flag, 0).unwrap();
    s.launch_on(
        s1,
        &wait,
        [1; 3],
        [1; 3],
        0,
        &[Arg::Ptr(flag), Arg::Ptr(out)],
    )
    .unwrap();
    s.set_on(s2, other, 9).unwrap();
    s.sync_stream(s2).unwrap();
    assert_eq!(s.read_u32(other), Ok(9));
    assert_eq!(
        s.query(s1),
        Err(cuda::CUDA_ERROR_NOT_READY),
        "the kernel waits for its flag"
    );
    s.launch_on(s2, &set, [1; 3], [1; 3], 0, &[Arg::Ptr(flag), Arg::U32(5)])
        .unwrap();
    assert_eq!(s.sync_stream(s1), Ok(()), "kernels of two streams overlap");
    assert_eq!(s.read_u32(out), Ok(6));
    s.close();
}

/// Work waiting for an event recorded on another stream runs after it, and
/// only then.
pub fn event_waits_order_streams(t: &Target) {
    let rig = Rig::new((t.make)(Some(WATCHDOG)), &[("a", 16 * MIB, 1)]);
    let mut s = rig.session("a");
    let (wait, _) = flag_kernels(&mut s);
    let (flag, out, x) = (
        s.alloc(4).unwrap(),
        s.alloc(4).unwrap(),
        s.alloc(4).unwrap(),
    );
    let s1 = s.stream(NON_BLOCKING).unwrap();
    let s2 = s.stream(NON_BLOCKING).unwrap();
    let s3 = s.stream(NON_BLOCKING).unwrap();
    let ev = s.event().unwrap();
    s.set_on(s1, flag, 0).unwrap();
    s.launch_on(
        s1,
        &wait,
        [1; 3],
        [1; 3],
        0,
        &[Arg::Ptr(flag), Arg::Ptr(out)],
    )
    .unwrap();
    s.record_on(s1, ev).unwrap();
    s.stream_wait(s2, ev).unwrap();
    s.set_on(s2, x, 5).unwrap();
    assert_eq!(s.query(s2), Err(cuda::CUDA_ERROR_NOT_READY));
    s.set_on(s3, flag, 2).unwrap();
    assert_eq!(s.sync_stream(s2), Ok(()));
    assert_eq!((s.read_u32(out), s.read_u32(x)), (Ok(3), Ok(5)));
    s.close();
}

/// Executable graphs follow their dependencies: two branches of one graph run at the same time
/// (a kernel of one spins until a kernel of the other sets its flag, so a replay in one order
/// fails with the watchdog), a join waits for both, and the whole graph runs after the work before
/// the launch on its stream and before the work after it.
pub fn graph_branches_run_concurrently(t: &Target) {
    use vgpu_proto::graph::{push_deps, push_op};

    use crate::conformance::{code, one_thread, packed};

    let rig = Rig::new((t.make)(Some(WATCHDOG)), &[("a", 16 * MIB, 1)]);
    let mut s = rig.session("a");
    let ctx = s.ctx;
    let (wait, set) = flag_kernels(&mut s);
    let mut mem = || s.alloc(4).unwrap();
    let [
        pre,
        pre_out,
        flag,
        out,
        joined,
        gate,
        gate_out,
        after,
        other,
    ] = [(); 9].map(|()| mem());
    for p in [pre, flag, joined, gate, after] {
        s.set_on(0, p, 0).unwrap();
    }
    s.sync().unwrap();
    let s1 = s.stream(NON_BLOCKING).unwrap();
    let s2 = s.stream(NON_BLOCKING).unwrap();
    let kernel = |k: &Kernel, args: &[Arg]| (one_thread(ctx, k), packed(k, args));
    // 0: wait_flag(flag) and 1: set_flag(flag, 5), both roots; 2: joined = 1 after both;
    // 3: wait_flag(gate) after 1, on a branch of its own. (At most two kernels spin at once:
    // the simulated GPU of the suite has two execution slots.)
    let mut nodes = Vec::new();
    let (w, wp) = kernel(&wait, &[Arg::Ptr(flag), Arg::Ptr(out)]);
    push_op(&mut nodes, &w, &wp);
    let (st, sp) = kernel(&set, &[Arg::Ptr(flag), Arg::U32(5)]);
    push_deps(&mut nodes, &[]);
    push_op(&mut nodes, &st, &sp);
    push_deps(&mut nodes, &[0, 1]);
    push_op(
        &mut nodes,
        &msg::Memset {
            ctx,
            stream: 0,
            dst: joined,
            value: 1,
            elem_size: 4,
            count: 1,
        },
        &[],
    );
    let (g, gp) = kernel(&wait, &[Arg::Ptr(gate), Arg::Ptr(gate_out)]);
    push_deps(&mut nodes, &[1]);
    push_op(&mut nodes, &g, &gp);
    let exec = code(
        s.client
            .call(&msg::GraphInstantiate { ctx, replace: 0 }, &nodes),
    )
    .expect("uploading the graph")
    .0
    .handle;

    // s1: a kernel that waits for `pre`, the graph, then a fill of `after`.
    s.launch_on(
        s1,
        &wait,
        [1; 3],
        [1; 3],
        0,
        &[Arg::Ptr(pre), Arg::Ptr(pre_out)],
    )
    .unwrap();
    s.post(&msg::GraphLaunch {
        ctx,
        stream: s1,
        exec,
    })
    .unwrap();
    s.set_on(s1, after, 7).unwrap();
    s.set_on(s2, other, 9).unwrap();
    s.sync_stream(s2).unwrap();
    assert_eq!(s.query(s1), Err(cuda::CUDA_ERROR_NOT_READY));
    assert_eq!(
        (s.read_u32(flag), s.read_u32(joined)),
        (Ok(0), Ok(0)),
        "no branch of the graph runs before the work before it on its stream"
    );
    s.launch_on(s2, &set, [1; 3], [1; 3], 0, &[Arg::Ptr(pre), Arg::U32(1)])
        .unwrap();
    // The two branches meet: `joined` is set once both ran, which needs them at the same time.
    let deadline = std::time::Instant::now() + 2 * WATCHDOG;
    while s.read_u32(joined) != Ok(1) {
        assert!(
            std::time::Instant::now() < deadline,
            "the graph's branches did not run at the same time: {:?}",
            s.sync_stream(s1)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(s.read_u32(out), Ok(6), "the join ran after both branches");
    // The third branch still waits for its gate: the work after the graph waits for it.
    assert_eq!(s.query(s1), Err(cuda::CUDA_ERROR_NOT_READY));
    assert_eq!(
        s.read_u32(after),
        Ok(0),
        "work after the launch waits for every branch"
    );
    s.launch_on(s2, &set, [1; 3], [1; 3], 0, &[Arg::Ptr(gate), Arg::U32(2)])
        .unwrap();
    assert_eq!(s.sync_stream(s1), Ok(()));
    assert_eq!(
        (s.read_u32(gate_out), s.read_u32(after), s.read_u32(pre_out)),
        (Ok(3), Ok(7), Ok(2))
    );
    // Launched again on the legacy stream, it runs the same way.
    for p in [flag, joined] {
        s.set_on(0, p, 0).unwrap();
    }
    s.post(&msg::GraphLaunch {
        ctx,
        stream: 0,
        exec,
    })
    .unwrap();
    assert_eq!(s.sync(), Ok(()), "a second launch");
    assert_eq!((s.read_u32(joined), s.read_u32(out)), (Ok(1), Ok(6)));
    s.close();
}
