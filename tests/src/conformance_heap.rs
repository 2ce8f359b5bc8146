//! The device heap through the broker's protocol: `cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)`,
//! kernels that `malloc` memory another launch reads and frees, `new`/`delete`, the heap
//! charged to the slice at the first launch that uses it and given back when the session ends.
//! On a real GPU the driver runs `malloc` itself; this shows the broker sizes and charges its
//! heap the same way. And the device runtime's pending launch limit, which a process raises
//! for its kernels' launches of kernels (dynamic parallelism).

use vgpu_corpus::Arg;
use vgpu_proto::{cuda, msg};

use crate::conformance::{Rig, Session, Target};

/// The kernels (`devices/ptx/fixtures/heap.cu`, compiled by NVRTC for compute 5.2).
const HEAP_PTX: &str = include_str!("../../devices/ptx/fixtures/heap.compute_52.ptx");

const MIB: u64 = 1 << 20;
/// Ints per thread's allocation.
const INTS: i32 = 10;

fn set_heap(s: &mut Session, bytes: u64) -> Result<(), u32> {
    let ctx = s.ctx;
    s.request(&msg::CtxSetLimit {
        ctx,
        limit: cuda::limit::MALLOC_HEAP_SIZE,
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

/// `fan_out`: each thread launches a one-thread `child` that writes `out[t] = 2 * t`, through
/// the driver's device runtime calls (what CUDA 11's `libcudadevrt` calls; a real GPU's driver
/// supplies them to a module loaded without `libcudadevrt`, as the simulated GPU does).
const DYNAMIC_PTX: &str = r#"
.version 7.0
.target sm_52
.address_size 64
.extern .func (.param .b64 r) cnpGetParameterBufferV2(.param .b64 f, .param .align 4 .b8 g[12], .param .align 4 .b8 b[12], .param .b32 s);
.extern .func (.param .b32 r) cnpLaunchDeviceV2(.param .b64 buf, .param .b64 stream);

.visible .entry child(.param .u64 out, .param .u32 t)
{
    .reg .b64 %rd<3>;
    .reg .b32 %r<3>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [t];
    mul.wide.u32 %rd2, %r1, 4;
    add.u64 %rd1, %rd1, %rd2;
    shl.b32 %r2, %r1, 1;
    st.global.u32 [%rd1], %r2;
    ret;
}

.visible .entry fan_out(.param .u64 out)
{
    .reg .b64 %rd<4>;
    .reg .b32 %r<8>;
    .reg .pred %p1;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mad.lo.u32 %r4, %r1, %r2, %r3;
    mov.u64 %rd2, child;
    mov.u32 %r5, 1;
    {
    .param .b64 f;
    .param .align 4 .b8 g[12];
    .param .align 4 .b8 b[12];
    .param .b32 s;
    .param .b64 rv;
    st.param.b64 [f], %rd2;
    st.param.b32 [g], %r5;
    st.param.b32 [g+4], %r5;
    st.param.b32 [g+8], %r5;
    st.param.b32 [b], %r5;
    st.param.b32 [b+4], %r5;
    st.param.b32 [b+8], %r5;
    st.param.b32 [s], 0;
    call.uni (rv), cnpGetParameterBufferV2, (f, g, b, s);
    ld.param.b64 %rd3, [rv];
    }
    setp.eq.u64 %p1, %rd3, 0;
    @%p1 bra DONE;
    st.u64 [%rd3], %rd1;
    st.u32 [%rd3+8], %r4;
    {
    .param .b64 a;
    .param .b64 q;
    .param .b32 rv2;
    st.param.b64 [a], %rd3;
    mov.u64 %rd2, 0;
    st.param.b64 [q], %rd2;
    call.uni (rv2), cnpLaunchDeviceV2, (a, q);
    }
DONE:
    ret;
}
"#;

/// A grid of 4096 threads each launching a child grid, after the process raised the pending
/// launch limit past CUDA's 2048: every child runs (on a real GPU the executor raises the VM
/// context's limit to the process's).
pub fn device_launch_limits(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 64 * MIB, 1)]);
    let mut s = rig.session("a");
    let m = s
        .load(DYNAMIC_PTX.as_bytes())
        .expect("kernels launching kernels load");
    let ctx = s.ctx;
    s.request(&msg::CtxSetLimit {
        ctx,
        limit: cuda::limit::DEV_RUNTIME_PENDING_LAUNCH_COUNT,
        value: 8192,
    })
    .expect("the pending launch count is raised");
    let (blocks, threads) = (64u32, 64u32);
    let n = (blocks * threads) as usize;
    let out = s.alloc(n as u64 * 4).unwrap();
    s.memset(out, 0xffff_ffff, 4, n as u64).unwrap();
    let fan_out = s.kernel(m, "fan_out").unwrap();
    s.launch(
        &fan_out,
        [blocks, 1, 1],
        [threads, 1, 1],
        0,
        &[Arg::Ptr(out)],
    )
    .and_then(|()| s.sync())
    .unwrap_or_else(|c| panic!("[{}] fan_out: {c}", t.name));
    let got = s.dtoh(out, n * 4).unwrap();
    let ran = got
        .chunks(4)
        .enumerate()
        .filter(|&(i, c)| i32::from_le_bytes(c.try_into().unwrap()) == 2 * i as i32)
        .count();
    assert_eq!(
        ran, n,
        "[{}] every child ran under the raised limit",
        t.name
    );
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
