//! The device heap through the broker's protocol: `cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)`,
//! kernels that `malloc` memory another launch reads and frees, `new`/`delete`, the heap
//! charged to the slice at the first launch that uses it and given back when the session ends.
//! On a real GPU the driver runs `malloc` itself; this shows the broker sizes and charges its
//! heap the same way.

use vgpu_corpus::Arg;
use vgpu_proto::{cuda, msg};

use crate::conformance::{Rig, Session, Target};

/// The kernels (`devices/ptx/fixtures/heap.cu`, compiled by NVRTC for compute 5.2).
const HEAP_PTX: &str = include_str!("../../devices/ptx/fixtures/heap.compute_52.ptx");

const MIB: u64 = 1 << 20;
/// `CU_LIMIT_MALLOC_HEAP_SIZE`.
const LIMIT_MALLOC_HEAP_SIZE: u32 = 2;
/// Ints per thread's allocation.
const INTS: i32 = 10;

fn set_heap(s: &mut Session, bytes: u64) -> Result<(), u32> {
    let ctx = s.ctx;
    s.request(&msg::CtxSetLimit {
        ctx,
        limit: LIMIT_MALLOC_HEAP_SIZE,
        value: bytes,
    })
    .map(|_| ())
}

fn i64s(b: &[u8]) -> Vec<i64> {
    b.chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn sums_are_right(sums: &[i64]) -> bool {
    sums.iter()
        .enumerate()
        .all(|(t, &s)| s == (0..i64::from(INTS)).map(|i| t as i64 + i).sum::<i64>())
}

pub fn device_heap(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 64 * MIB, 1)]);
    let mut s = rig.session("a");
    let m = s.load(HEAP_PTX.as_bytes()).expect("the heap kernels load");
    set_heap(&mut s, 2 * MIB).expect("the heap's size is set before any launch");
    assert_eq!(
        set_heap(&mut s, 65 * MIB),
        Err(cuda::CUDA_ERROR_OUT_OF_MEMORY),
        "past the slice"
    );
    let (free0, _) = s.mem_info().unwrap();
    let (blocks, threads) = (4u32, 64u32);
    let n = u64::from(blocks * threads);
    let ptrs = s.alloc(n * 8).unwrap();
    let out = s.alloc(n * 8).unwrap();
    let args = [Arg::Ptr(ptrs), Arg::Ptr(out), Arg::I32(INTS)];
    let fill = s.kernel(m, "alloc_fill").unwrap();
    s.launch(&fill, [blocks, 1, 1], [threads, 1, 1], 0, &args)
        .and_then(|()| s.sync())
        .unwrap_or_else(|c| panic!("[{}] alloc_fill: {c}", t.name));
    assert!(
        sums_are_right(&i64s(&s.dtoh(out, n as usize * 8).unwrap())),
        "[{}] what each thread wrote to its allocation",
        t.name
    );
    let (free1, _) = s.mem_info().unwrap();
    assert!(
        free0 - free1 >= 2 * MIB + 2 * n * 8,
        "[{}] the heap is charged to the slice: free {free0} then {free1}",
        t.name
    );
    assert_eq!(
        set_heap(&mut s, 4 * MIB),
        Err(cuda::CUDA_ERROR_INVALID_VALUE),
        "[{}] the size is fixed once a kernel used the heap",
        t.name
    );
    // A later launch reads the allocations and frees them.
    s.memset(out, 0, 1, n * 8).unwrap();
    let read = s.kernel(m, "read_free").unwrap();
    s.launch(&read, [blocks, 1, 1], [threads, 1, 1], 0, &args)
        .and_then(|()| s.sync())
        .unwrap_or_else(|c| panic!("[{}] read_free: {c}", t.name));
    assert!(
        sums_are_right(&i64s(&s.dtoh(out, n as usize * 8).unwrap())),
        "[{}] heap memory outlives its launch",
        t.name
    );
    // new and delete.
    let list = s.kernel(m, "linked_list").unwrap();
    s.launch(
        &list,
        [1, 1, 1],
        [32, 1, 1],
        0,
        &[Arg::I32(20), Arg::Ptr(out)],
    )
    .and_then(|()| s.sync())
    .unwrap_or_else(|c| panic!("[{}] linked_list: {c}", t.name));
    let want: i64 = (0..20).map(|i| 7 + i).sum::<i64>() + 7;
    assert!(
        i64s(&s.dtoh(out, 32 * 8).unwrap())
            .iter()
            .all(|&v| v == want),
        "[{}] a linked list built with new and torn down with delete",
        t.name
    );
    s.close();
    // The session's end gives the heap back with everything else.
    let mut s = rig.session("a");
    assert_eq!(
        s.mem_info().unwrap().0,
        free0,
        "[{}] all given back",
        t.name
    );
}
