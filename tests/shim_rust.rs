//! A Rust program loading vgpu's libcuda.so.1 with libloading, as cudarc and
//! cuda-python do: functions found by name and through cuGetProcAddress_v2,
//! real CUresult codes, and the slice as the device's memory.
// The test drives a C ABI with one uniform safety argument: every call passes
// valid pointers and sizes. Splitting it per call would only add noise.
#![allow(clippy::multiple_unsafe_ops_per_block)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use libloading::{Library, Symbol};
use vgpu_tests::harness::{TestVm, Vgpud, artifacts};

const MIB: u64 = 1 << 20;

type CuResult = c_int;

struct Cuda {
    lib: Library,
}

impl Cuda {
    fn sym<T>(&self, name: &str) -> Symbol<'_, T> {
        // SAFETY: the caller names the symbol with its C signature as `T`.
        unsafe { self.lib.get(name.as_bytes()) }.unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn proc<T: Copy>(&self, name: &str, version: c_int) -> Option<T> {
        let get: Symbol<
            unsafe extern "C" fn(
                *const c_char,
                *mut *mut c_void,
                c_int,
                u64,
                *mut c_int,
            ) -> CuResult,
        > = self.sym("cuGetProcAddress_v2");
        let cname = std::ffi::CString::new(name).unwrap();
        let mut p = std::ptr::null_mut();
        let mut status = -1;
        // SAFETY: valid C string and out-pointers.
        let r = unsafe { get(cname.as_ptr(), &mut p, version, 0, &mut status) };
        if r != 0 {
            assert!(p.is_null());
            assert_ne!(status, 0);
            return None;
        }
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: `p` is a function pointer of type `T` (same size, checked).
        Some(unsafe { std::mem::transmute_copy(&p) })
    }
}

#[test]
fn a_rust_program_drives_the_shim_through_libloading() {
    let d = Vgpud::start(&[TestVm::new("vm1", 32 * MIB)]);
    // SAFETY: set before the library reads it, while this is the only test thread using it.
    unsafe { std::env::set_var("VGPU_TRANSPORT", d.transport("vm1")) };
    // SAFETY: loading our own shim library.
    let lib = unsafe { Library::new(artifacts().lib_dir.join("libcuda.so.1")) }.unwrap();
    let cu = Cuda { lib };

    let err_string: Symbol<unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult> =
        cu.sym("cuGetErrorString");
    let mut s = std::ptr::null();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { err_string(2, &mut s) }, 0);
    // SAFETY: the shim returns static NUL-terminated strings.
    let msg = unsafe { CStr::from_ptr(s) };
    assert_eq!(msg.to_str().unwrap(), "out of memory");
    // SAFETY: valid out-pointer; unknown codes are refused.
    assert_eq!(unsafe { err_string(123_456, &mut s) }, 1);

    let init: unsafe extern "C" fn(c_uint) -> CuResult = cu.proc("cuInit", 12000).unwrap();
    // SAFETY: plain call.
    assert_eq!(unsafe { init(0) }, 0);

    let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult =
        cu.proc("cuDevicePrimaryCtxRetain", 12000).unwrap();
    let set_current: unsafe extern "C" fn(*mut c_void) -> CuResult =
        cu.proc("cuCtxSetCurrent", 12000).unwrap();
    let alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult =
        cu.proc("cuMemAlloc", 12000).unwrap();
    let free: unsafe extern "C" fn(u64) -> CuResult = cu.proc("cuMemFree", 12000).unwrap();
    let info: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult =
        cu.proc("cuMemGetInfo", 12000).unwrap();
    let htod: unsafe extern "C" fn(u64, *const c_void, usize) -> CuResult =
        cu.proc("cuMemcpyHtoD", 12000).unwrap();
    let dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> CuResult =
        cu.proc("cuMemcpyDtoH", 12000).unwrap();
    assert!(
        cu.proc::<usize>("cuMemAlloc", 3000).is_none(),
        "pre-3.2 ABI must not be answered"
    );
    // A name that is no driver function.
    assert!(cu.proc::<usize>("cuNoSuchFunction", 12030).is_none());
    // Every function of cuda.h is answered, refusals too (external semaphore graph nodes).
    assert!(
        cu.proc::<usize>("cuGraphAddExternalSemaphoresSignalNode", 12030)
            .is_some()
    );

    let mut ctx = std::ptr::null_mut();
    // SAFETY: valid out-pointers and arguments throughout.
    unsafe {
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);
        let (mut f, mut t) = (0usize, 0usize);
        assert_eq!(info(&mut f, &mut t), 0);
        assert_eq!((f as u64, t as u64), (32 * MIB, 32 * MIB));

        // A 12 MiB copy spans several protocol chunks.
        let n = 12 * MIB as usize;
        let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let mut p = 0u64;
        assert_eq!(alloc(&mut p, n), 0);
        assert_eq!(htod(p, data.as_ptr().cast(), n), 0);
        let mut back = vec![0u8; n];
        assert_eq!(dtoh(back.as_mut_ptr().cast(), p, n), 0);
        assert!(back == data, "12 MiB round trip differs");

        // Past the slice: OUT_OF_MEMORY, nothing changes.
        let mut q = 0u64;
        assert_eq!(alloc(&mut q, 21 * MIB as usize), 2);
        assert_eq!(q, 0);
        assert_eq!(info(&mut f, &mut t), 0);
        assert_eq!(f as u64, 20 * MIB);
        assert_eq!(alloc(&mut q, 20 * MIB as usize), 0);
        assert_eq!(free(q), 0);
        assert_eq!(free(p), 0);
    }

    // cuMemHostAlloc: large buffers are 2 MiB aligned mappings of their own, advised to use
    // transparent huge pages (so that a guest pins them as 2 MiB runs); small ones come from
    // the heap. Both are zeroed, usable, and freed by cuMemFreeHost.
    let host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult =
        cu.proc("cuMemHostAlloc", 12000).unwrap();
    let free_host: unsafe extern "C" fn(*mut c_void) -> CuResult =
        cu.proc("cuMemFreeHost", 12000).unwrap();
    {
        use vgpu_hugemem::HUGE_PAGE;
        use vgpu_hugemem::testutils::{advised_huge, range_of, smaps_entry};
        let (mut big, mut small) = (std::ptr::null_mut(), std::ptr::null_mut());
        let n = 2 * HUGE_PAGE + 1;
        // SAFETY: valid out-pointers; the buffers are used within their sizes and freed once.
        unsafe {
            assert_eq!(host_alloc(&mut big, n, 1), 0, "PORTABLE");
            assert_eq!(host_alloc(&mut small, 4096, 0), 0);
            let addr = big as usize;
            assert_eq!(addr % HUGE_PAGE, 0);
            let entry = smaps_entry(addr).unwrap();
            assert_eq!(
                range_of(&entry),
                Some((addr, addr + 3 * HUGE_PAGE)),
                "{entry}"
            );
            assert!(advised_huge(&entry), "{entry}");
            assert!(!advised_huge(&smaps_entry(small as usize).unwrap()));
            let bytes = std::slice::from_raw_parts_mut(big.cast::<u8>(), n);
            assert!(bytes.iter().all(|&b| b == 0));
            bytes.fill(0x42);
            assert_eq!(free_host(big), 0);
            assert_eq!(free_host(big), 1, "freed once");
            assert!(
                smaps_entry(addr)
                    .is_none_or(|e| range_of(&e) != Some((addr, addr + 3 * HUGE_PAGE))),
                "the mapping goes with cuMemFreeHost"
            );
            assert_eq!(free_host(small), 0);
        }
    }

    // cuMemHostRegister (cudaHostRegister, pinning frameworks' buffers): CUDA's rules, and copies
    // from and to registered memory work.
    let register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CuResult =
        cu.proc("cuMemHostRegister", 12000).unwrap();
    let unregister: unsafe extern "C" fn(*mut c_void) -> CuResult =
        cu.proc("cuMemHostUnregister", 12000).unwrap();
    let mut host = vec![7u8; 3 * MIB as usize];
    // Only `base` touches `host` from here on.
    let base = host.as_mut_ptr();
    // SAFETY: valid pointers into `host` and sizes within it throughout.
    unsafe {
        assert_eq!(register(base.cast(), MIB as usize, 1), 0, "PORTABLE");
        // Overlapping the registered first MiB: 712.
        assert_eq!(register(base.add(4096).cast(), MIB as usize, 0), 712);
        assert_eq!(register(base.cast(), 4096, 0), 712);
        // Next to it: fine.
        assert_eq!(register(base.add(MIB as usize).cast(), MIB as usize, 0), 0);
        // Bad arguments and unsupported kinds.
        assert_eq!(register(std::ptr::null_mut(), 4096, 0), 1);
        assert_eq!(register(base.add(2 * MIB as usize).cast(), 0, 0), 1);
        assert_eq!(register(base.add(2 * MIB as usize).cast(), 4096, 0x100), 1);
        // Mapped (DEVICEMAP) registration works (issue 23: tests/alloc_api.rs); I/O memory does not.
        assert_eq!(
            register(base.add(2 * MIB as usize).cast(), 4096, 0x2),
            0,
            "DEVICEMAP"
        );
        assert_eq!(unregister(base.add(2 * MIB as usize).cast()), 0);
        assert_eq!(
            register(base.add(2 * MIB as usize).cast(), 4096, 0x4),
            801,
            "IOMEMORY"
        );
        let mut p = 0u64;
        assert_eq!(alloc(&mut p, 2 * MIB as usize), 0);
        assert_eq!(htod(p, base.cast_const().cast(), 2 * MIB as usize), 0);
        std::ptr::write_bytes(base, 0, 2 * MIB as usize);
        assert_eq!(dtoh(base.cast(), p, 2 * MIB as usize), 0);
        let back = std::slice::from_raw_parts(base, 2 * MIB as usize);
        assert!(back.iter().all(|&b| b == 7));
        assert_eq!(free(p), 0);
        // Unregistering: only where a registered range starts, once.
        assert_eq!(unregister(base.add(4096).cast()), 713);
        assert_eq!(unregister(base.cast()), 0);
        assert_eq!(unregister(base.cast()), 713);
        assert_eq!(unregister(base.add(MIB as usize).cast()), 0);
        // The first MiB can be registered again.
        assert_eq!(register(base.cast(), MIB as usize, 0), 0);
        assert_eq!(unregister(base.cast()), 0);
    }

    // Several threads share the context and the connection.
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let ctx = ctx as usize;
            std::thread::spawn(move || {
                // SAFETY: calls with valid arguments.
                unsafe {
                    assert_eq!(set_current(ctx as *mut c_void), 0);
                    for i in 0..50u32 {
                        let mut p = 0u64;
                        assert_eq!(alloc(&mut p, 4096), 0);
                        let v = [t as u8, i as u8, 7, 9];
                        assert_eq!(htod(p, v.as_ptr().cast(), 4), 0);
                        let mut b = [0u8; 4];
                        assert_eq!(dtoh(b.as_mut_ptr().cast(), p, 4), 0);
                        assert_eq!(b, v);
                        assert_eq!(free(p), 0);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(d.vm("vm1")["memory_used"], 0);
}
