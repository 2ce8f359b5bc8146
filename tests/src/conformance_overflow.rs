//! Conformance of host overflow (docs/memory.md, "Address stability"), on any executor: a
//! plain allocation moved to host memory and back keeps its address and its bytes; copies,
//! fills and kernels work on it wherever it is; the device's memory use counts device-resident
//! bytes only. An executor that cannot put GPU memory in host memory (the real-GPU executor on
//! a driver older than CUDA 12.2, or over vgpu's shim) must refuse with `NotSupported` and
//! leave the allocation as it was.

use vgpu_broker::device::{DeviceContext, DeviceError, LaunchDims, Residence, RunControl};

use crate::conformance::{Target, pattern};

const MIB: u64 = 1 << 20;
/// Bytes of the moved allocation: several 2 MiB granules.
const SIZE: u64 = 8 * MIB;
/// Threads per block of [`INC_PTX`].
const BLOCK: u32 = 256;

/// `inc(p, n)`: `p[i] += 1` for the `n` 32-bit words at `p`.
const INC_PTX: &str = ".version 7.0\n.target sm_52\n.address_size 64\n\
.visible .entry inc(.param .u64 p, .param .u32 n)\n{\n\
 .reg .pred %p; .reg .b32 %r<7>; .reg .b64 %rd<5>;\n\
 ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [n];\n\
 mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;\n\
 mad.lo.s32 %r5, %r2, %r3, %r4;\n setp.ge.u32 %p, %r5, %r1;\n @%p bra DONE;\n\
 cvta.to.global.u64 %rd2, %rd1;\n mul.wide.u32 %rd3, %r5, 4;\n add.s64 %rd4, %rd2, %rd3;\n\
 ld.global.u32 %r6, [%rd4];\n add.s32 %r6, %r6, 1;\n st.global.u32 [%rd4], %r6;\nDONE:\n ret;\n}\n\0";

fn read(ctx: &dyn DeviceContext, ptr: u64, len: u64) -> Vec<u8> {
    let mut out = vec![0u8; len as usize];
    ctx.read(ptr, &mut out).expect("reading back");
    out
}

/// Runs `inc` over the first `words` 32-bit words at `ptr` and applies it to `expect`.
fn inc(ctx: &dyn DeviceContext, ptr: u64, words: u32, expect: &mut [u8]) {
    let m = ctx
        .load_module(INC_PTX.as_bytes(), MIB, &RunControl::default())
        .expect("loading inc");
    let k = &m.kernels()[0];
    let o = k.param_offsets[1] as usize;
    let mut params = vec![0u8; o + 4];
    params[..8].copy_from_slice(&ptr.to_le_bytes());
    params[o..o + 4].copy_from_slice(&words.to_le_bytes());
    let dims = LaunchDims {
        grid: [words.div_ceil(BLOCK), 1, 1],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
        cooperative: false,
        units: None,
    };
    ctx.launch(&*m, 0, &dims, &params, 0, &RunControl::default())
        .expect("inc over the allocation");
    for w in expect[..words as usize * 4].chunks_exact_mut(4) {
        let v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]).wrapping_add(1);
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// A plain allocation demoted to host memory and promoted back, and one made in host memory.
pub fn allocations_move_between_device_and_host(t: &Target) {
    let dev = (t.make)(None);
    let ctx = dev.open("a").expect("opening a context");
    let before = dev.memory_used();
    let p = ctx.alloc(SIZE).expect("alloc");
    let mut expect = pattern(SIZE as usize, 11);
    ctx.write(p, &expect).unwrap();
    let used = dev.memory_used();
    assert!(
        used >= before + SIZE,
        "device memory counted: {before} → {used}"
    );
    match ctx.migrate(p, Residence::Host) {
        Err(DeviceError::NotSupported(why)) => {
            println!("conformance [{}]: no host overflow here: {why}", t.name);
            assert!(
                read(&*ctx, p, SIZE) == expect,
                "a refused move changes nothing"
            );
            assert_eq!(dev.memory_used(), used);
            assert!(
                matches!(ctx.alloc_host(SIZE), Err(DeviceError::NotSupported(_))),
                "host placement refused the same way"
            );
            ctx.free(p).unwrap();
            assert_eq!(dev.memory_used(), before);
            return;
        }
        r => r.expect("demotion"),
    }
    assert!(
        dev.memory_used() + SIZE <= used,
        "a demotion gives device memory back: {used} → {}",
        dev.memory_used()
    );
    assert!(read(&*ctx, p, SIZE) == expect, "same address, same bytes");
    // Copies, fills and kernels on host-resident memory.
    ctx.memset(p, 0xab, 1, MIB).unwrap();
    expect[..MIB as usize].fill(0xab);
    ctx.copy(p + MIB, p + 4 * MIB, MIB).unwrap();
    expect.copy_within(4 * MIB as usize..5 * MIB as usize, MIB as usize);
    inc(
        &*ctx,
        p + 2 * MIB,
        (MIB / 4) as u32,
        &mut expect[2 * MIB as usize..],
    );
    assert!(
        read(&*ctx, p, SIZE) == expect,
        "work on host-resident memory"
    );
    ctx.migrate(p, Residence::Host)
        .expect("moving to where it is already is a no-op");
    ctx.migrate(p, Residence::Device).expect("promotion");
    assert_eq!(dev.memory_used(), used, "a promotion counts it again");
    assert!(read(&*ctx, p, SIZE) == expect, "promoted with its bytes");
    inc(&*ctx, p, (SIZE / 4) as u32, &mut expect);
    assert!(
        read(&*ctx, p, SIZE) == expect,
        "kernels after the promotion"
    );

    if t.address_spaces {
        // Another VM's kernel given the pointer faults, whichever memory backs it (a real GPU's
        // mappings of `cuMemCreate` memory must stay in the owning VM's context too).
        let other = dev.open("b").expect("a second VM");
        let m = other
            .load_module(INC_PTX.as_bytes(), MIB, &RunControl::default())
            .expect("loading inc");
        let o = m.kernels()[0].param_offsets[1] as usize;
        let mut params = vec![0u8; o + 4];
        params[..8].copy_from_slice(&p.to_le_bytes());
        params[o..o + 4].copy_from_slice(&1u32.to_le_bytes());
        let dims = LaunchDims {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_bytes: 0,
            cooperative: false,
            units: None,
        };
        let r = other.launch(&*m, 0, &dims, &params, 0, &RunControl::default());
        assert!(
            r.is_err(),
            "another VM's kernel reached a movable allocation"
        );
        assert!(read(&*ctx, p, SIZE) == expect, "untouched by the other VM");
    }

    // An allocation made in host memory: zeroed, usable, movable.
    let h = ctx.alloc_host(SIZE).expect("alloc_host");
    assert_eq!(dev.memory_used(), used, "host memory is not device memory");
    assert!(read(&*ctx, h, SIZE).iter().all(|&b| b == 0), "zeroed");
    let data = pattern(SIZE as usize, 12);
    ctx.write(h, &data).unwrap();
    ctx.migrate(h, Residence::Device).expect("promotion");
    assert!(read(&*ctx, h, SIZE) == data);
    ctx.free(h).unwrap();
    ctx.free(p).unwrap();
    assert_eq!(dev.memory_used(), before, "frees give everything back");
}
