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
