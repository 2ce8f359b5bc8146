//! The launch-related driver API through the shim: `extra` parameter
//! buffers, cuLaunchKernelEx, function attributes and opt-in dynamic shared
//! memory, occupancy, the cuLibrary* entry points, and the kernel watchdog.
// The test drives a C ABI with one uniform safety argument: every call passes
// valid pointers and sizes. Splitting it per call would only add noise.
#![allow(clippy::multiple_unsafe_ops_per_block)]

use std::ffi::{CString, c_char, c_int, c_uint, c_void};

use libloading::Library;
use vgpu_tests::harness::{TestVm, Vgpud, artifacts, workspace_root};

type R = c_int;
type H = *mut c_void;

const CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_int = 0;
const CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: c_int = 1;
const CU_FUNC_ATTRIBUTE_NUM_REGS: c_int = 4;
const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;

macro_rules! load {
    ($lib:expr, $name:literal: $($t:tt)*) => {{
        // SAFETY: the symbol is a driver function with this C signature.
        let s: libloading::Symbol<'_, unsafe extern "C" fn $($t)*> = unsafe { $lib.get($name.as_bytes()) }.unwrap();
        *s
    }};
}

#[repr(C)]
struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: H,
    attrs: *const LaunchAttribute,
    num_attrs: c_uint,
}

#[repr(C)]
struct LaunchAttribute {
    id: u32,
    pad: [u8; 4],
    value: [u32; 16],
}

fn ptx(name: &str) -> CString {
    CString::new(
        std::fs::read(workspace_root().join(format!("tests/kernels/ptx/{name}.sm_80.ptx")))
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn launch_entry_points_behave_like_cuda() {
    let d = Vgpud::start_with(&[TestVm::new("vm", 64 << 20)], "watchdog_ms = 300");
    // SAFETY: set before the shim reads it; this binary has a single test.
    unsafe { std::env::set_var("VGPU_TRANSPORT", d.transport("vm")) };
    // SAFETY: loading our own shim.
    let lib = unsafe { Library::new(artifacts().lib_dir.join("libcuda.so.1")) }.unwrap();
    let init = load!(lib, "cuInit": (c_uint) -> R);
    let ctx_create = load!(lib, "cuCtxCreate_v2": (*mut H, c_uint, c_int) -> R);
    let ctx_destroy = load!(lib, "cuCtxDestroy_v2": (H) -> R);
    let sync = load!(lib, "cuCtxSynchronize": () -> R);
    let load_data = load!(lib, "cuModuleLoadData": (*mut H, *const c_void) -> R);
    let get_fn = load!(lib, "cuModuleGetFunction": (*mut H, H, *const c_char) -> R);
    let alloc = load!(lib, "cuMemAlloc_v2": (*mut u64, usize) -> R);
    let htod = load!(lib, "cuMemcpyHtoD_v2": (u64, *const c_void, usize) -> R);
    let dtoh = load!(lib, "cuMemcpyDtoH_v2": (*mut c_void, u64, usize) -> R);
    let launch = load!(lib, "cuLaunchKernel": (H, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, H, *mut *mut c_void, *mut *mut c_void) -> R);
    let launch_ex = load!(lib, "cuLaunchKernelEx": (*const LaunchConfig, H, *mut *mut c_void, *mut *mut c_void) -> R);
    let get_attr = load!(lib, "cuFuncGetAttribute": (*mut c_int, c_int, H) -> R);
    let set_attr = load!(lib, "cuFuncSetAttribute": (H, c_int, c_int) -> R);
    let occ = load!(lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor": (*mut c_int, H, c_int, usize) -> R);
    let occ_size = load!(lib, "cuOccupancyMaxPotentialBlockSize": (*mut c_int, *mut c_int, H, *const c_void, usize, c_int) -> R);
    let lib_load = load!(lib, "cuLibraryLoadData": (*mut H, *const c_void, *mut c_int, *mut *mut c_void, c_uint, *mut c_int, *mut *mut c_void, c_uint) -> R);
    let lib_kernel = load!(lib, "cuLibraryGetKernel": (*mut H, H, *const c_char) -> R);
    let kernel_fn = load!(lib, "cuKernelGetFunction": (*mut H, H) -> R);

    // SAFETY: every call below passes valid pointers and sizes.
    unsafe {
        assert_eq!(init(0), 0);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(ctx_create(&mut ctx, 0, 0), 0);
        let mut m = std::ptr::null_mut();
        assert_eq!(load_data(&mut m, ptx("vector_add").as_ptr().cast()), 0);
        let mut f = std::ptr::null_mut();
        assert_eq!(get_fn(&mut f, m, c"vector_add".as_ptr()), 0);

        // Parameters passed as one packed buffer through `extra`.
        let n: i32 = 1000;
        let bytes = n as usize * 4;
        let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
        for p in [&mut a, &mut b, &mut c] {
            assert_eq!(alloc(p, bytes), 0);
        }
        let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
        assert_eq!(htod(a, xs.as_ptr().cast(), bytes), 0);
        assert_eq!(htod(b, xs.as_ptr().cast(), bytes), 0);
        let mut packed = Vec::new();
        for v in [a, b, c] {
            packed.extend_from_slice(&v.to_le_bytes());
        }
        packed.extend_from_slice(&n.to_le_bytes());
        packed.extend_from_slice(&[0; 4]);
        let mut size = packed.len();
        let mut extra = [
            1usize as H,
            packed.as_mut_ptr().cast(),
            2usize as H,
            (&mut size as *mut usize).cast(),
            std::ptr::null_mut(),
        ];
        assert_eq!(
            launch(
                f,
                8,
                1,
                1,
                128,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                extra.as_mut_ptr()
            ),
            0
        );
        let mut out = vec![0f32; n as usize];
        assert_eq!(dtoh(out.as_mut_ptr().cast(), c, bytes), 0);
        assert!(out.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32));
        // Neither kernelParams nor extra for a kernel with parameters: refused.
        assert_eq!(
            launch(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            1
        );

        // cuLaunchKernelEx with a basic attribute, and a cooperative one (every block at once).
        assert_eq!(htod(c, [0u8; 4000].as_ptr().cast(), bytes), 0);
        let mut args: Vec<*mut c_void> = vec![
            (&mut a as *mut u64).cast(),
            (&mut b as *mut u64).cast(),
            (&mut c as *mut u64).cast(),
            (&n as *const i32).cast_mut().cast(),
        ];
        let prio = LaunchAttribute {
            id: 8,
            pad: [0; 4],
            value: [0; 16],
        };
        let cfg = LaunchConfig {
            grid: [8, 1, 1],
            block: [128, 1, 1],
            shared: 0,
            stream: std::ptr::null_mut(),
            attrs: &prio,
            num_attrs: 1,
        };
        assert_eq!(
            launch_ex(&cfg, f, args.as_mut_ptr(), std::ptr::null_mut()),
            0
        );
        assert_eq!(dtoh(out.as_mut_ptr().cast(), c, bytes), 0);
        assert!(out.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32));
        // A kernel priority of its own (carried as LaunchKernelPriority), in range and past it
        // (clamped, as CUDA clamps it), alone and with the cooperative attribute.
        for p in [-3i32, -40, 9] {
            let mut prio = LaunchAttribute {
                id: 8,
                pad: [0; 4],
                value: [0; 16],
            };
            prio.value[0] = p as u32;
            let mut coop = LaunchAttribute {
                id: 2,
                pad: [0; 4],
                value: [0; 16],
            };
            coop.value[0] = 1;
            let both = [prio, coop];
            for n in [1, 2] {
                let cfg = LaunchConfig {
                    attrs: both.as_ptr(),
                    num_attrs: n,
                    ..cfg
                };
                assert_eq!(htod(c, [0u8; 4000].as_ptr().cast(), bytes), 0);
                assert_eq!(
                    launch_ex(&cfg, f, args.as_mut_ptr(), std::ptr::null_mut()),
                    0,
                    "priority {p}, {n} attributes"
                );
                assert_eq!(dtoh(out.as_mut_ptr().cast(), c, bytes), 0, "priority {p}");
                assert!(out.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32));
            }
        }
        let mut coop = LaunchAttribute {
            id: 2,
            pad: [0; 4],
            value: [0; 16],
        };
        coop.value[0] = 1;
        let cfg = LaunchConfig {
            attrs: &coop,
            ..cfg
        };
        assert_eq!(htod(c, [0u8; 4000].as_ptr().cast(), bytes), 0);
        assert_eq!(
            launch_ex(&cfg, f, args.as_mut_ptr(), std::ptr::null_mut()),
            0
        );
        assert_eq!(dtoh(out.as_mut_ptr().cast(), c, bytes), 0);
        assert!(out.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32));
        // Past what the device holds at once: CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE.
        let huge = LaunchConfig {
            grid: [1 << 20, 1, 1],
            ..cfg
        };
        assert_eq!(
            launch_ex(&huge, f, args.as_mut_ptr(), std::ptr::null_mut()),
            0,
            "asynchronous: the error comes at the next synchronization"
        );
        assert_eq!(dtoh(out.as_mut_ptr().cast(), c, bytes), 720);

        // Function attributes of the tiled matmul (two 16x16 float tiles of shared memory).
        let mut mm = std::ptr::null_mut();
        assert_eq!(load_data(&mut mm, ptx("matmul").as_ptr().cast()), 0);
        let mut tiled = std::ptr::null_mut();
        assert_eq!(get_fn(&mut tiled, mm, c"matmul_tiled".as_ptr()), 0);
        let mut v = 0;
        assert_eq!(
            get_attr(&mut v, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, tiled),
            0
        );
        assert_eq!(v, 2 * 16 * 16 * 4);
        assert_eq!(get_attr(&mut v, CU_FUNC_ATTRIBUTE_NUM_REGS, tiled), 0);
        assert!(v > 0);
        assert_eq!(
            get_attr(&mut v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, tiled),
            0
        );
        assert_eq!(v, 1024);
        // Occupancy: 256-thread blocks fit several per SM; a sane block size is suggested.
        let (mut blocks, mut grid, mut bs) = (0, 0, 0);
        assert_eq!(occ(&mut blocks, tiled, 256, 0), 0);
        assert!((1..=8).contains(&blocks), "{blocks}");
        assert_eq!(
            occ_size(&mut grid, &mut bs, tiled, std::ptr::null(), 0, 0),
            0
        );
        assert!(
            (32..=1024).contains(&bs) && bs % 32 == 0 && grid >= 1,
            "{grid} {bs}"
        );

        // Dynamic shared memory beyond 48 KiB needs the opt-in attribute.
        let mut ds = std::ptr::null_mut();
        assert_eq!(load_data(&mut ds, ptx("dynamic_shared").as_ptr().cast()), 0);
        let mut rev = std::ptr::null_mut();
        assert_eq!(get_fn(&mut rev, ds, c"dyn_shared_reverse".as_ptr()), 0);
        let mut rargs: Vec<*mut c_void> = vec![
            (&mut a as *mut u64).cast(),
            (&mut c as *mut u64).cast(),
            (&n as *const i32).cast_mut().cast(),
        ];
        let big = 64 << 10;
        assert_eq!(
            launch(
                rev,
                8,
                1,
                1,
                128,
                1,
                1,
                big,
                std::ptr::null_mut(),
                rargs.as_mut_ptr(),
                std::ptr::null_mut()
            ),
            1,
            "64 KiB of dynamic shared memory without opt-in fails at the launch"
        );
        assert_eq!(sync(), 0, "a refused launch leaves nothing to report");
        assert_eq!(
            set_attr(
                rev,
                CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                big as c_int
            ),
            0
        );
        assert_eq!(
            get_attr(&mut v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, rev),
            0
        );
        assert_eq!(v, big as c_int);
        assert_eq!(
            launch(
                rev,
                8,
                1,
                1,
                128,
                1,
                1,
                big,
                std::ptr::null_mut(),
                rargs.as_mut_ptr(),
                std::ptr::null_mut()
            ),
            0
        );
        assert_eq!(sync(), 0);
        assert_eq!(
            set_attr(
                rev,
                CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                1 << 20
            ),
            1
        );

        // The cuLibrary entry points.
        let mut l = std::ptr::null_mut();
        assert_eq!(
            lib_load(
                &mut l,
                ptx("saxpy").as_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0
            ),
            0
        );
        let (mut k, mut kf) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(lib_kernel(&mut k, l, c"saxpy".as_ptr()), 0);
        assert_eq!(kernel_fn(&mut kf, k), 0);
        let alpha = 3.0f32;
        let mut sargs: Vec<*mut c_void> = vec![
            (&n as *const i32).cast_mut().cast(),
            (&alpha as *const f32).cast_mut().cast(),
            (&mut a as *mut u64).cast(),
            (&mut c as *mut u64).cast(),
        ];
        assert_eq!(htod(c, xs.as_ptr().cast(), bytes), 0);
        assert_eq!(
            launch(
                kf,
                8,
                1,
                1,
                128,
                1,
                1,
                0,
                std::ptr::null_mut(),
                sargs.as_mut_ptr(),
                std::ptr::null_mut()
            ),
            0
        );
        assert_eq!(dtoh(out.as_mut_ptr().cast(), c, bytes), 0);
        assert!(out.iter().enumerate().all(|(i, &v)| v == 4.0 * i as f32));

        // The watchdog (300 ms here) stops a kernel that never ends.
        let spin = CString::new(".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry spin()\n{\n$L: bra.uni $L;\n}\n").unwrap();
        let mut sm = std::ptr::null_mut();
        assert_eq!(load_data(&mut sm, spin.as_ptr().cast()), 0);
        let mut sf = std::ptr::null_mut();
        assert_eq!(get_fn(&mut sf, sm, c"spin".as_ptr()), 0);
        let t = std::time::Instant::now();
        assert_eq!(
            launch(
                sf,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            0
        );
        assert_eq!(sync(), 702, "CUDA_ERROR_LAUNCH_TIMEOUT");
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
        assert_eq!(ctx_destroy(ctx), 0);
    }
    d.wait_memory_used("vm", 0, std::time::Duration::from_secs(5));
}
