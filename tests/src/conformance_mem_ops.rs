//! Stream memory operations through the broker's protocol, on any device: a wait holds its
//! stream until a write of another stream (or a kernel's store) meets its condition; CUDA's
//! four conditions on 32 and 64 bits; refusals of misaligned, unknown, foreign and flushing
//! operations; a stream stopped at a wait that never comes true holds up nothing else, and a
//! destroyed context or an ended session does not wait for it.

use std::time::{Duration, Instant};

use vgpu_corpus::Arg;
use vgpu_proto::cuda::{self, attr, mem_op};
use vgpu_proto::msg;

use crate::conformance::{Code, Rig, Session, Target};
use crate::conformance_streams::FLAG_PTX;

const MIB: u64 = 1 << 20;
const NON_BLOCKING: u32 = 1;
/// How long a wait that must hold is watched before the check says it holds.
const HOLD: Duration = Duration::from_millis(50);
/// Longest a released wait may take to let its stream go on, on a loaded machine.
const RELEASE: Duration = Duration::from_secs(20);

impl Session {
    /// `cuStreamBatchMemOp` of one operation, answered at once.
    pub fn mem_op(
        &mut self,
        stream: u64,
        op: u32,
        flags: u32,
        addr: u64,
        value: u64,
    ) -> Result<(), Code> {
        let ctx = self.ctx;
        self.request(&msg::StreamMemOp {
            ctx,
            stream,
            op,
            flags,
            addr,
            value,
        })
        .map(drop)
    }

    /// Whether `stream` still has work pending now.
    fn pending(&mut self, stream: u64) -> bool {
        let ctx = self.ctx;
        match self.request(&msg::StreamQuery { ctx, stream }) {
            Ok(_) => false,
            Err(e) => {
                assert_eq!(e, cuda::CUDA_ERROR_NOT_READY, "cuStreamQuery");
                true
            }
        }
    }

    /// Waits until `stream` is done, at most [`RELEASE`].
    fn released(&mut self, stream: u64) -> bool {
        let t0 = Instant::now();
        while self.pending(stream) {
            if t0.elapsed() > RELEASE {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

/// Queues a wait on `s1` with a marker memset after it: the marker at `marker` turns `value`
/// only once the wait lets the stream go on.
fn wait_then_mark(s: &mut Session, s1: u64, wait: (u32, u32, u64, u64), marker: u64, value: u32) {
    let (op, flags, addr, operand) = wait;
    s.mem_op(s1, op, flags, addr, operand).unwrap();
    s.set_on(s1, marker, value).unwrap();
}

/// The check.
pub fn stream_memory_operations(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 64 * MIB, 1), ("b", 64 * MIB, 1)]);
    let mut a = rig.session("a");
    let props = a.properties().unwrap();
    for (what, at, want) in [
        (
            "CAN_USE_STREAM_MEM_OPS_V1",
            attr::CAN_USE_STREAM_MEM_OPS_V1,
            1,
        ),
        (
            "CAN_USE_64_BIT_STREAM_MEM_OPS",
            attr::CAN_USE_64_BIT_STREAM_MEM_OPS,
            1,
        ),
        (
            "CAN_USE_STREAM_WAIT_VALUE_NOR",
            attr::CAN_USE_STREAM_WAIT_VALUE_NOR,
            1,
        ),
        ("CAN_FLUSH_REMOTE_WRITES", attr::CAN_FLUSH_REMOTE_WRITES, 0),
    ] {
        assert_eq!(props.attributes[at], want, "{what}");
    }

    let words = a.alloc(4096).unwrap();
    a.memset(words, 0, 4, 1024).unwrap();
    let (flag, marker, wide) = (words, words + 64, words + 128);
    let s1 = a.stream(NON_BLOCKING).unwrap();
    let s2 = a.stream(NON_BLOCKING).unwrap();

    // A wait holds its stream until another stream's write meets it.
    wait_then_mark(
        &mut a,
        s1,
        (mem_op::WAIT_VALUE_32, mem_op::WAIT_EQ, flag, 1),
        marker,
        5,
    );
    std::thread::sleep(HOLD);
    assert!(a.pending(s1), "the wait held its stream");
    assert_eq!(a.read_u32(marker).unwrap(), 0, "nothing after the wait ran");
    a.mem_op(s2, mem_op::WRITE_VALUE_32, 0, flag, 1).unwrap();
    assert!(a.released(s1), "the write released the wait");
    assert_eq!(a.read_u32(marker).unwrap(), 5);
    assert_eq!(a.read_u32(flag).unwrap(), 1, "the write landed");

    // A kernel's store releases a wait too (the watcher looks after every job's end).
    let m = a.load(FLAG_PTX.as_bytes()).unwrap();
    let set_flag = a.kernel(m, "set_flag").unwrap();
    wait_then_mark(
        &mut a,
        s1,
        (mem_op::WAIT_VALUE_32, mem_op::WAIT_GEQ, flag, 7),
        marker,
        6,
    );
    std::thread::sleep(HOLD);
    assert!(a.pending(s1), "1 is not >= 7");
    a.launch_on(
        s2,
        &set_flag,
        [1, 1, 1],
        [1, 1, 1],
        0,
        &[Arg::Ptr(flag), Arg::U32(9)],
    )
    .unwrap();
    assert!(a.released(s1), "the kernel's store released the wait");
    assert_eq!(a.read_u32(marker).unwrap(), 6);

    // 64-bit words and the other conditions: each met at once.
    a.mem_op(s2, mem_op::WRITE_VALUE_64, 0, wide, 0x1_0000_0000)
        .unwrap();
    a.sync_stream(s2).unwrap();
    for (what, op, flags, operand, mark) in [
        (
            "64-bit EQ",
            mem_op::WAIT_VALUE_64,
            mem_op::WAIT_EQ,
            0x1_0000_0000,
            10,
        ),
        (
            "64-bit AND",
            mem_op::WAIT_VALUE_64,
            mem_op::WAIT_AND,
            0x3_0000_0000,
            11,
        ),
        (
            "64-bit NOR",
            mem_op::WAIT_VALUE_64,
            mem_op::WAIT_NOR,
            0xffff,
            12,
        ),
        (
            "32-bit GEQ on the low half, cyclic",
            mem_op::WAIT_VALUE_32,
            mem_op::WAIT_GEQ,
            0xffff_fff0,
            13,
        ),
    ] {
        wait_then_mark(&mut a, s1, (op, flags, wide, operand), marker, mark);
        assert!(a.released(s1), "{what}");
        assert_eq!(a.read_u32(marker).unwrap(), mark, "{what}");
    }

    // Refusals.
    let inval = Err(cuda::CUDA_ERROR_INVALID_VALUE);
    assert_eq!(
        a.mem_op(s1, mem_op::WRITE_VALUE_64, 0, wide + 4, 1),
        inval,
        "misaligned"
    );
    assert_eq!(a.mem_op(s1, 7, 0, flag, 1), inval, "an unknown operation");
    assert_eq!(
        a.mem_op(s1, mem_op::WAIT_VALUE_32, 4, flag, 1),
        inval,
        "an unknown condition"
    );
    assert_eq!(
        a.mem_op(s1, mem_op::WAIT_VALUE_32, mem_op::WAIT_FLUSH, flag, 1),
        Err(cuda::CUDA_ERROR_NOT_SUPPORTED),
        "flushing remote writes"
    );
    assert_eq!(
        a.mem_op(s1, mem_op::WRITE_VALUE_32, 0, words + 4096, 1),
        inval,
        "past the allocation"
    );
    assert!(
        a.mem_op(0xdead_0000, mem_op::WRITE_VALUE_32, 0, flag, 1)
            .is_err(),
        "a forged stream"
    );
    let mut b = rig.session("b");
    assert_eq!(
        b.mem_op(0, mem_op::WRITE_VALUE_32, 0, flag, 0xbad),
        inval,
        "another VM's memory"
    );
    assert_eq!(
        b.mem_op(0, mem_op::WAIT_VALUE_32, mem_op::WAIT_EQ, flag, 9),
        inval,
        "a wait on another VM's memory"
    );
    assert_eq!(a.read_u32(flag).unwrap(), 9, "the owner's word is intact");
    a.sync().unwrap();

    // A stream stopped at a wait that never comes true holds nothing else up.
    let stuck = a.stream(NON_BLOCKING).unwrap();
    a.mem_op(stuck, mem_op::WAIT_VALUE_32, mem_op::WAIT_EQ, marker, 1000)
        .unwrap();

    // A destroyed context does not wait for a word nobody writes.
    let mut c = rig.session("a");
    let cw = c.alloc(4096).unwrap();
    c.memset(cw, 0, 4, 1).unwrap();
    let cs = c.stream(NON_BLOCKING).unwrap();
    c.mem_op(cs, mem_op::WAIT_VALUE_32, mem_op::WAIT_EQ, cw, 1)
        .unwrap();
    std::thread::sleep(HOLD);
    assert!(c.pending(cs));
    let ctx = c.ctx;
    let t0 = Instant::now();
    c.request(&msg::CtxDestroy { ctx }).unwrap();
    assert!(t0.elapsed() < RELEASE, "cuCtxDestroy waited for the word");
    c.close();

    // An ended session with a wait that never comes true gives everything back.
    let slice = |rig: &Rig| rig.broker.tenant("a").unwrap().slice.used();
    let before = slice(&rig);
    let mut d = rig.session("a");
    let dw = d.alloc(8 * MIB).unwrap();
    d.memset(dw, 0, 4, 1).unwrap();
    d.mem_op(0, mem_op::WAIT_VALUE_32, mem_op::WAIT_EQ, dw, 1)
        .unwrap();
    assert!(slice(&rig) >= before + 8 * MIB);
    d.close();
    assert_eq!(slice(&rig), before, "the ended session's memory came back");

    // The first session's other streams are unaffected by its stuck one.
    std::thread::sleep(HOLD);
    assert!(a.pending(stuck));
    a.mem_op(s2, mem_op::WRITE_VALUE_32, 0, flag, 77).unwrap();
    a.sync_stream(s2).unwrap();
    assert_eq!(a.read_u32(flag).unwrap(), 77);
    a.close();
    assert_eq!(
        slice(&rig),
        0,
        "the stuck stream's session gave everything back"
    );
}
