//! The host's CUDA driver, loaded at run time.
//!
//! vgpud links nothing from NVIDIA: `libcuda.so.1` is opened with
//! `libloading` when a `kind = "cuda"` device is configured, so the daemon
//! builds and runs on machines without a driver. Functions are resolved the
//! way cuda-python does it: `cuGetProcAddress_v2(name, version)` returns the
//! variant with the ABI of the CUDA version this file was written against
//! (e.g. `cuMemAlloc` at 3020 is `cuMemAlloc_v2`); without it, the versioned
//! export name is looked up with `dlsym`. Entry points newer than CUDA 12.0
//! are optional and used only when the driver has them.
//!
//! Every function pointer is wrapped in a method that takes and returns
//! Rust values. Handles ([`Ctx`], [`Stream`], …) are only ever made from the
//! driver's own outputs, and their owners (`context.rs`, `module.rs`) destroy
//! each exactly once, after which it is never used again.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use libloading::Library;
use vgpu_broker::device::DeviceError;
use vgpu_proto::cuda::{self, CuResult};

use crate::error::{CudaError, Op, classify};

/// The driver library's name (its soname).
pub const DEFAULT_LIBRARY: &str = "libcuda.so.1";
/// Oldest driver API supported (CUDA 12.0).
pub const MIN_DRIVER_VERSION: i32 = 12000;
/// `CU_GET_PROC_ADDRESS_LEGACY_STREAM`: vgpu uses explicit streams only.
const PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
/// `CU_GET_PROC_ADDRESS_SUCCESS`.
const PROC_ADDRESS_SUCCESS: c_int = 0;
/// Bytes `cuDeviceGetName` may write.
const NAME_BUFFER: usize = 256;

/// `cudaVersion` of the ABIs vgpu calls (first CUDA version with that ABI).
mod abi {
    pub const V2000: i32 = 2000;
    pub const V2010: i32 = 2010;
    pub const V2020: i32 = 2020;
    pub const V3020: i32 = 3020;
    pub const V4000: i32 = 4000;
    pub const V5000: i32 = 5000;
    pub const V9000: i32 = 9000;
    pub const V10000: i32 = 10000;
    pub const V10010: i32 = 10010;
    pub const V10020: i32 = 10020;
    pub const V11040: i32 = 11040;
    pub const V11080: i32 = 11080;
    pub const V12030: i32 = 12030;
    pub const V12040: i32 = 12040;
    pub const V12050: i32 = 12050;
}

macro_rules! handles {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name(pub(crate) *mut c_void);
        // SAFETY: a CUDA handle is an opaque token the driver accepts from any
        // thread (with its context current); it is never dereferenced here.
        unsafe impl Send for $name {}
        // SAFETY: as above; sharing the token shares no Rust-visible state.
        unsafe impl Sync for $name {}
    )*};
}

handles! {
    /// A `CUcontext`.
    Ctx;
    /// A `CUstream`.
    Stream;
    /// A `CUevent`.
    Event;
    /// A `CUmodule`.
    Module;
    /// A `CUfunction`.
    Function;
    /// A `CUgraph`.
    Graph;
    /// A `CUgraphExec`.
    GraphExec;
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED`: a capture that does not forbid other threads' calls.
const CAPTURE_MODE_RELAXED: c_int = 2;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`: kernel nodes run at their own priority.
const INSTANTIATE_USE_NODE_PRIORITY: u64 = 8;

/// A pinned host buffer from `cuMemHostAlloc`.
#[derive(Debug, Clone, Copy)]
pub struct HostPtr(pub(crate) *mut u8);
// SAFETY: pinned host memory is plain memory; its owner (`context::Staging`)
// hands out access to one thread at a time.
unsafe impl Send for HostPtr {}
// SAFETY: as above.
unsafe impl Sync for HostPtr {}

impl HostPtr {
    /// The buffer's address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.0
    }
}

/// A failed driver call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed {
    /// The function.
    pub call: &'static str,
    /// Its result.
    pub code: CuResult,
}

impl Failed {
    /// The broker's error for this failure during an operation of kind `op`.
    pub fn device(self, op: Op) -> DeviceError {
        classify(op, self.call, self.code)
    }

    /// The open-time error.
    pub fn open(self) -> CudaError {
        CudaError::Driver {
            call: self.call,
            code: self.code,
        }
    }
}

impl From<Failed> for DeviceError {
    fn from(f: Failed) -> DeviceError {
        f.device(Op::Other)
    }
}

/// Result of a driver call.
pub type DrvResult<T> = Result<T, Failed>;

/// A kernel as the driver lists it: name, function, parameter (offset, size) pairs.
pub type ListedKernel = (String, Function, Vec<(u32, u32)>);

fn check(call: &'static str, r: CuResult) -> DrvResult<()> {
    if r == cuda::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Failed { call, code: r })
    }
}

type R = CuResult;
type P = *mut c_void;

pub use crate::texture_abi::{ResourceDesc, TextureDesc};

#[allow(clippy::type_complexity)]
struct Functions {
    init: unsafe extern "C" fn(c_uint) -> R,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> R,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> R,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> R,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> R,
    device_get_uuid: unsafe extern "C" fn(*mut [u8; 16], c_int) -> R,
    device_total_mem: unsafe extern "C" fn(*mut usize, c_int) -> R,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> R,
    ctx_create_v2: Option<unsafe extern "C" fn(*mut P, c_uint, c_int) -> R>,
    ctx_create_v4: Option<unsafe extern "C" fn(*mut P, P, c_uint, c_int) -> R>,
    ctx_destroy: unsafe extern "C" fn(P) -> R,
    ctx_push: unsafe extern "C" fn(P) -> R,
    ctx_pop: unsafe extern "C" fn(*mut P) -> R,
    ctx_get_limit: Option<unsafe extern "C" fn(*mut usize, c_int) -> R>,
    ctx_set_limit: Option<unsafe extern "C" fn(c_int, usize) -> R>,
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> R,
    mem_free: unsafe extern "C" fn(u64) -> R,
    mem_host_alloc: unsafe extern "C" fn(*mut P, usize, c_uint) -> R,
    mem_free_host: unsafe extern "C" fn(P) -> R,
    memcpy_htod_async: unsafe extern "C" fn(u64, *const c_void, usize, P) -> R,
    memcpy_dtoh_async: unsafe extern "C" fn(P, u64, usize, P) -> R,
    memcpy_dtod_async: unsafe extern "C" fn(u64, u64, usize, P) -> R,
    memset_d8_async: unsafe extern "C" fn(u64, u8, usize, P) -> R,
    memset_d16_async: unsafe extern "C" fn(u64, u16, usize, P) -> R,
    memset_d32_async: unsafe extern "C" fn(u64, c_uint, usize, P) -> R,
    stream_create: unsafe extern "C" fn(*mut P, c_uint) -> R,
    stream_destroy: unsafe extern "C" fn(P) -> R,
    event_create: unsafe extern "C" fn(*mut P, c_uint) -> R,
    event_destroy: unsafe extern "C" fn(P) -> R,
    event_record: unsafe extern "C" fn(P, P) -> R,
    event_query: unsafe extern "C" fn(P) -> R,
    event_elapsed_time: unsafe extern "C" fn(*mut f32, P, P) -> R,
    module_load_data_ex:
        unsafe extern "C" fn(*mut P, *const c_void, c_uint, *mut c_int, *mut P) -> R,
    module_unload: unsafe extern "C" fn(P) -> R,
    module_get_function: unsafe extern "C" fn(*mut P, P, *const c_char) -> R,
    module_get_global: unsafe extern "C" fn(*mut u64, *mut usize, P, *const c_char) -> R,
    func_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, P) -> R,
    func_set_attribute: unsafe extern "C" fn(P, c_int, c_int) -> R,
    launch_kernel: unsafe extern "C" fn(
        P,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        P,
        *mut P,
        *mut P,
    ) -> R,
    /// `cuLaunchCooperativeKernel` (CUDA 9): the launch of `cuLaunchKernel` without `extra`.
    launch_cooperative_kernel: Option<
        unsafe extern "C" fn(
            P,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            P,
            *mut P,
        ) -> R,
    >,
    /// `cuLaunchKernelEx` (CUDA 11.8): a launch with attributes (here, its priority).
    launch_kernel_ex: Option<unsafe extern "C" fn(*const LaunchConfig, P, *mut P, *mut P) -> R>,
    // CUDA 12.3 / 12.4 (optional).
    module_get_function_count: Option<unsafe extern "C" fn(*mut c_uint, P) -> R>,
    module_enumerate_functions: Option<unsafe extern "C" fn(*mut P, c_uint, P) -> R>,
    func_get_name: Option<unsafe extern "C" fn(*mut *const c_char, P) -> R>,
    func_get_param_info: Option<unsafe extern "C" fn(P, usize, *mut usize, *mut usize) -> R>,
    // Texture objects, CUDA 5.0 (optional).
    tex_object_create: Option<
        unsafe extern "C" fn(*mut u64, *const ResourceDesc, *const TextureDesc, *const c_void) -> R,
    >,
    tex_object_destroy: Option<unsafe extern "C" fn(u64) -> R>,
    // Virtual memory management, CUDA 10.2 (optional).
    mem_create: Option<unsafe extern "C" fn(*mut u64, usize, *const MemAllocationProp, u64) -> R>,
    mem_release: Option<unsafe extern "C" fn(u64) -> R>,
    mem_address_reserve: Option<unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> R>,
    mem_address_free: Option<unsafe extern "C" fn(u64, usize) -> R>,
    mem_map: Option<unsafe extern "C" fn(u64, usize, usize, u64, u64) -> R>,
    mem_unmap: Option<unsafe extern "C" fn(u64, usize) -> R>,
    mem_set_access: Option<unsafe extern "C" fn(u64, usize, *const MemAccessDesc, usize) -> R>,
    // Graphs, CUDA 10.0 / 11.4 (optional: without them the executor launches kernels one by
    // one).
    stream_begin_capture: Option<unsafe extern "C" fn(P, c_int) -> R>,
    stream_end_capture: Option<unsafe extern "C" fn(P, *mut P) -> R>,
    graph_instantiate_with_flags: Option<unsafe extern "C" fn(*mut P, P, u64) -> R>,
    graph_launch: Option<unsafe extern "C" fn(P, P) -> R>,
    graph_exec_destroy: Option<unsafe extern "C" fn(P) -> R>,
    graph_destroy: Option<unsafe extern "C" fn(P) -> R>,
    mem_get_allocation_granularity:
        Option<unsafe extern "C" fn(*mut usize, *const MemAllocationProp, c_int) -> R>,
}

/// `CUmemAllocationType`: `CU_MEM_ALLOCATION_TYPE_PINNED`.
const MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CUmemLocationType`: `CU_MEM_LOCATION_TYPE_DEVICE` (id: device ordinal).
const MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `CUmemLocationType`: `CU_MEM_LOCATION_TYPE_HOST` (id ignored; `cuMemCreate` takes it on
/// drivers newer than CUDA 12.2).
const MEM_LOCATION_TYPE_HOST: c_int = 2;
/// `CUmemLocationType`: `CU_MEM_LOCATION_TYPE_HOST_NUMA` (id: host NUMA node; CUDA 12.2).
const MEM_LOCATION_TYPE_HOST_NUMA: c_int = 3;
/// `CUmemAccess_flags`: `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;
/// `CUmemAllocationGranularity_flags`: `CU_MEM_ALLOC_GRANULARITY_MINIMUM`, the unit every
/// `cuMemCreate` size and `cuMemMap` range must be a multiple of.
const MEM_ALLOC_GRANULARITY_MINIMUM: c_int = 0;

/// `CUlaunchAttributeID`: `CU_LAUNCH_ATTRIBUTE_PRIORITY` (value: `int priority`).
const LAUNCH_ATTRIBUTE_PRIORITY: u32 = 8;
/// Bytes of `CUlaunchAttributeValue` (a union padded to 64 bytes in cuda.h).
const LAUNCH_ATTRIBUTE_VALUE_BYTES: usize = 64;

/// `CUlaunchAttribute` (cuda.h, CUDA 12): `{ CUlaunchAttributeID id; char pad[4];
/// CUlaunchAttributeValue value; }`, the value a 64-byte union whose largest members hold
/// pointers (so 8-byte aligned).
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy)]
pub struct LaunchAttribute {
    id: u32,
    pad: [u8; 4],
    value: [u8; LAUNCH_ATTRIBUTE_VALUE_BYTES],
}

impl LaunchAttribute {
    /// `CU_LAUNCH_ATTRIBUTE_PRIORITY` with `priority` (the union's `int priority`, its first
    /// four bytes).
    fn priority(priority: i32) -> LaunchAttribute {
        let mut value = [0u8; LAUNCH_ATTRIBUTE_VALUE_BYTES];
        value[..4].copy_from_slice(&priority.to_ne_bytes());
        LaunchAttribute {
            id: LAUNCH_ATTRIBUTE_PRIORITY,
            pad: [0; 4],
            value,
        }
    }
}

/// `CUlaunchConfig` (cuda.h, CUDA 12): grid and block dimensions, dynamic shared memory,
/// stream, attribute array and its length.
#[repr(C)]
#[derive(Debug)]
pub struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: P,
    attrs: *mut LaunchAttribute,
    num_attrs: c_uint,
}

/// Where `cuMemCreate` places physical memory (`CUmemLocation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemPlace {
    /// Device memory of the device with this ordinal.
    Device(i32),
    /// Host memory, no NUMA node given (`CU_MEM_LOCATION_TYPE_HOST`).
    Host,
    /// Host memory of this NUMA node (`CU_MEM_LOCATION_TYPE_HOST_NUMA`, CUDA 12.2).
    HostNuma(i32),
}

impl MemPlace {
    fn location(self) -> MemLocation {
        let (type_, id) = match self {
            MemPlace::Device(d) => (MEM_LOCATION_TYPE_DEVICE, d),
            MemPlace::Host => (MEM_LOCATION_TYPE_HOST, 0),
            MemPlace::HostNuma(n) => (MEM_LOCATION_TYPE_HOST_NUMA, n),
        };
        MemLocation { type_, id }
    }

    fn prop(self) -> MemAllocationProp {
        MemAllocationProp {
            type_: MEM_ALLOCATION_TYPE_PINNED,
            requested_handle_types: 0,
            location: self.location(),
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: MemAllocFlags::default(),
        }
    }
}

/// `CUmemLocation` (cuda.h, CUDA 12): `{ CUmemLocationType type; int id; }`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemLocation {
    type_: c_int,
    id: c_int,
}

/// The `allocFlags` member of `CUmemAllocationProp`: `{ unsigned char compressionType;
/// unsigned char gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; }`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MemAllocFlags {
    compression_type: u8,
    gpu_direct_rdma_capable: u8,
    usage: u16,
    reserved: [u8; 4],
}

/// `CUmemAllocationProp` (cuda.h, CUDA 12): type, requested handle types, location, Windows
/// metadata pointer, allocation flags.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemAllocationProp {
    type_: c_int,
    requested_handle_types: c_int,
    location: MemLocation,
    win32_handle_meta_data: P,
    alloc_flags: MemAllocFlags,
}

/// `CUmemAccessDesc` (cuda.h, CUDA 12): `{ CUmemLocation location; CUmemAccess_flags flags; }`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemAccessDesc {
    location: MemLocation,
    flags: c_int,
}

// The layouts the driver reads (x86-64 and aarch64 Linux, LP64), checked at compile time.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<MemLocation>() == 8);
    assert!(offset_of!(MemLocation, id) == 4);
    assert!(size_of::<MemAllocFlags>() == 8);
    assert!(offset_of!(MemAllocFlags, usage) == 2);
    assert!(offset_of!(MemAllocFlags, reserved) == 4);
    assert!(size_of::<MemAllocationProp>() == 32);
    assert!(offset_of!(MemAllocationProp, requested_handle_types) == 4);
    assert!(offset_of!(MemAllocationProp, location) == 8);
    assert!(offset_of!(MemAllocationProp, win32_handle_meta_data) == 16);
    assert!(offset_of!(MemAllocationProp, alloc_flags) == 24);
    assert!(size_of::<MemAccessDesc>() == 12);
    assert!(size_of::<LaunchAttribute>() == 72);
    assert!(offset_of!(LaunchAttribute, value) == 8);
    assert!(size_of::<LaunchConfig>() == 56);
    assert!(offset_of!(LaunchConfig, shared_mem_bytes) == 24);
    assert!(offset_of!(LaunchConfig, stream) == 32);
    assert!(offset_of!(LaunchConfig, attrs) == 40);
    assert!(offset_of!(LaunchConfig, num_attrs) == 48);
    assert!(offset_of!(MemAccessDesc, flags) == 8);
};

type GetProcAddress = unsafe extern "C" fn(*const c_char, *mut P, c_int, u64, *mut c_int) -> R;

struct Resolver {
    lib: &'static Library,
    get_proc_address: Option<GetProcAddress>,
}

impl Resolver {
    /// The driver's `base` function with the ABI of CUDA `version`, exported as `export`.
    fn find(&self, base: &str, version: i32, export: &str) -> Option<P> {
        if let (Some(gpa), Ok(name)) = (self.get_proc_address, CString::new(base)) {
            let mut p: P = std::ptr::null_mut();
            let mut status: c_int = -1;
            // SAFETY: NUL-terminated name and valid out-pointers, per cuGetProcAddress_v2's contract.
            let r = unsafe {
                gpa(
                    name.as_ptr(),
                    &mut p,
                    version,
                    PROC_ADDRESS_LEGACY_STREAM,
                    &mut status,
                )
            };
            if r == cuda::CUDA_SUCCESS && status == PROC_ADDRESS_SUCCESS && !p.is_null() {
                return Some(p);
            }
        }
        // SAFETY: the symbol's address is read as a pointer and only turned into
        // a function pointer of its documented type by the caller.
        let sym = unsafe { self.lib.get::<unsafe extern "C" fn()>(export.as_bytes()) }.ok()?;
        let p = *sym as P;
        (!p.is_null()).then_some(p)
    }
}

/// A loaded, initialised CUDA driver.
pub struct Driver {
    library: String,
    version: i32,
    f: Functions,
    /// Kernels launched through `cuLaunchKernelEx` with a priority attribute.
    priority_launches: AtomicU64,
    /// `cuGraphLaunch` calls.
    graph_launches: AtomicU64,
    /// Graphs instantiated (`cuGraphInstantiateWithFlags`).
    graph_instantiations: AtomicU64,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("library", &self.library)
            .field("version", &self.version)
            .field("param_info", &self.has_param_info())
            .finish()
    }
}

/// Reads a symbol address as a function pointer of type `F`.
///
/// # Safety
/// `p` must be the address of a function whose C signature is `F`.
unsafe fn as_fn<F: Copy>(p: P) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<P>());
    // SAFETY: same size (checked); the caller guarantees `p` is a function of type `F`.
    unsafe { std::mem::transmute_copy::<P, F>(&p) }
}

macro_rules! required {
    ($r:expr, $lib:expr, $base:literal, $ver:expr, $export:literal) => {{
        let p = $r
            .find($base, $ver, $export)
            .ok_or_else(|| CudaError::MissingSymbol {
                library: $lib.to_string(),
                symbol: $export,
            })?;
        // SAFETY: `p` is the driver's `$export`, whose C signature (cuda.h) is
        // the type of the field this initialises.
        unsafe { as_fn(p) }
    }};
}

macro_rules! optional {
    ($r:expr, $base:literal, $ver:expr, $export:literal) => {
        $r.find($base, $ver, $export).map(|p| {
            // SAFETY: `p` is the driver's `$export`, whose C signature (cuda.h)
            // is the type of the field this initialises.
            unsafe { as_fn(p) }
        })
    };
}

static SYSTEM: OnceLock<Result<Arc<Driver>, CudaError>> = OnceLock::new();

impl Driver {
    /// The system driver (`libcuda.so.1`), loaded and initialised once per process.
    pub fn system() -> Result<Arc<Driver>, CudaError> {
        SYSTEM.get_or_init(|| Driver::load(DEFAULT_LIBRARY)).clone()
    }

    /// Whether [`Driver::system`] was already called (`cuInit` ran, so the
    /// environment the driver reads is fixed).
    pub fn system_initialised() -> bool {
        SYSTEM.get().is_some()
    }

    /// Loads a driver library (a path or a soname) and calls `cuInit`. The
    /// library stays loaded for the life of the process: drivers start
    /// threads and register handlers that must not be unloaded.
    pub fn load(library: &str) -> Result<Arc<Driver>, CudaError> {
        // SAFETY: loading a CUDA driver runs its initialisers, which are sound
        // to run in any process.
        let lib = unsafe { Library::new(library) }.map_err(|e| CudaError::NoDriver {
            library: library.to_string(),
            source: Arc::new(e),
        })?;
        let lib: &'static Library = Box::leak(Box::new(lib));
        let get_proc_address = {
            // SAFETY: the symbol is turned into a function pointer of its documented type.
            let sym = unsafe { lib.get::<GetProcAddress>(b"cuGetProcAddress_v2") };
            sym.ok().map(|s| *s)
        };
        let r = Resolver {
            lib,
            get_proc_address,
        };
        let f = Functions {
            init: required!(r, library, "cuInit", abi::V2000, "cuInit"),
            driver_get_version: required!(
                r,
                library,
                "cuDriverGetVersion",
                abi::V2020,
                "cuDriverGetVersion"
            ),
            device_get_count: required!(
                r,
                library,
                "cuDeviceGetCount",
                abi::V2000,
                "cuDeviceGetCount"
            ),
            device_get: required!(r, library, "cuDeviceGet", abi::V2000, "cuDeviceGet"),
            device_get_name: required!(
                r,
                library,
                "cuDeviceGetName",
                abi::V2000,
                "cuDeviceGetName"
            ),
            device_get_uuid: required!(
                r,
                library,
                "cuDeviceGetUuid",
                abi::V11040,
                "cuDeviceGetUuid_v2"
            ),
            device_total_mem: required!(
                r,
                library,
                "cuDeviceTotalMem",
                abi::V3020,
                "cuDeviceTotalMem_v2"
            ),
            device_get_attribute: required!(
                r,
                library,
                "cuDeviceGetAttribute",
                abi::V2000,
                "cuDeviceGetAttribute"
            ),
            ctx_create_v2: optional!(r, "cuCtxCreate", abi::V3020, "cuCtxCreate_v2"),
            ctx_create_v4: optional!(r, "cuCtxCreate", abi::V12050, "cuCtxCreate_v4"),
            ctx_destroy: required!(r, library, "cuCtxDestroy", abi::V4000, "cuCtxDestroy_v2"),
            ctx_push: required!(
                r,
                library,
                "cuCtxPushCurrent",
                abi::V4000,
                "cuCtxPushCurrent_v2"
            ),
            ctx_pop: required!(
                r,
                library,
                "cuCtxPopCurrent",
                abi::V4000,
                "cuCtxPopCurrent_v2"
            ),
            ctx_get_limit: optional!(r, "cuCtxGetLimit", abi::V3020, "cuCtxGetLimit"),
            ctx_set_limit: optional!(r, "cuCtxSetLimit", abi::V3020, "cuCtxSetLimit"),
            mem_alloc: required!(r, library, "cuMemAlloc", abi::V3020, "cuMemAlloc_v2"),
            mem_free: required!(r, library, "cuMemFree", abi::V3020, "cuMemFree_v2"),
            mem_host_alloc: required!(r, library, "cuMemHostAlloc", abi::V2020, "cuMemHostAlloc"),
            mem_free_host: required!(r, library, "cuMemFreeHost", abi::V2000, "cuMemFreeHost"),
            memcpy_htod_async: required!(
                r,
                library,
                "cuMemcpyHtoDAsync",
                abi::V3020,
                "cuMemcpyHtoDAsync_v2"
            ),
            memcpy_dtoh_async: required!(
                r,
                library,
                "cuMemcpyDtoHAsync",
                abi::V3020,
                "cuMemcpyDtoHAsync_v2"
            ),
            memcpy_dtod_async: required!(
                r,
                library,
                "cuMemcpyDtoDAsync",
                abi::V3020,
                "cuMemcpyDtoDAsync_v2"
            ),
            memset_d8_async: required!(
                r,
                library,
                "cuMemsetD8Async",
                abi::V3020,
                "cuMemsetD8Async"
            ),
            memset_d16_async: required!(
                r,
                library,
                "cuMemsetD16Async",
                abi::V3020,
                "cuMemsetD16Async"
            ),
            memset_d32_async: required!(
                r,
                library,
                "cuMemsetD32Async",
                abi::V3020,
                "cuMemsetD32Async"
            ),
            stream_create: required!(r, library, "cuStreamCreate", abi::V2000, "cuStreamCreate"),
            stream_destroy: required!(
                r,
                library,
                "cuStreamDestroy",
                abi::V4000,
                "cuStreamDestroy_v2"
            ),
            event_create: required!(r, library, "cuEventCreate", abi::V2000, "cuEventCreate"),
            event_destroy: required!(
                r,
                library,
                "cuEventDestroy",
                abi::V4000,
                "cuEventDestroy_v2"
            ),
            event_record: required!(r, library, "cuEventRecord", abi::V2000, "cuEventRecord"),
            event_query: required!(r, library, "cuEventQuery", abi::V2000, "cuEventQuery"),
            event_elapsed_time: required!(
                r,
                library,
                "cuEventElapsedTime",
                abi::V2000,
                "cuEventElapsedTime"
            ),
            module_load_data_ex: required!(
                r,
                library,
                "cuModuleLoadDataEx",
                abi::V2010,
                "cuModuleLoadDataEx"
            ),
            module_unload: required!(r, library, "cuModuleUnload", abi::V2000, "cuModuleUnload"),
            module_get_function: required!(
                r,
                library,
                "cuModuleGetFunction",
                abi::V2000,
                "cuModuleGetFunction"
            ),
            module_get_global: required!(
                r,
                library,
                "cuModuleGetGlobal",
                abi::V3020,
                "cuModuleGetGlobal_v2"
            ),
            func_get_attribute: required!(
                r,
                library,
                "cuFuncGetAttribute",
                abi::V2020,
                "cuFuncGetAttribute"
            ),
            func_set_attribute: required!(
                r,
                library,
                "cuFuncSetAttribute",
                abi::V9000,
                "cuFuncSetAttribute"
            ),
            launch_kernel: required!(r, library, "cuLaunchKernel", abi::V4000, "cuLaunchKernel"),
            launch_cooperative_kernel: optional!(
                r,
                "cuLaunchCooperativeKernel",
                abi::V9000,
                "cuLaunchCooperativeKernel"
            ),
            launch_kernel_ex: optional!(r, "cuLaunchKernelEx", abi::V11080, "cuLaunchKernelEx"),
            module_get_function_count: optional!(
                r,
                "cuModuleGetFunctionCount",
                abi::V12040,
                "cuModuleGetFunctionCount"
            ),
            module_enumerate_functions: optional!(
                r,
                "cuModuleEnumerateFunctions",
                abi::V12040,
                "cuModuleEnumerateFunctions"
            ),
            func_get_name: optional!(r, "cuFuncGetName", abi::V12030, "cuFuncGetName"),
            func_get_param_info: optional!(
                r,
                "cuFuncGetParamInfo",
                abi::V12040,
                "cuFuncGetParamInfo"
            ),
            tex_object_create: optional!(r, "cuTexObjectCreate", abi::V5000, "cuTexObjectCreate"),
            tex_object_destroy: optional!(
                r,
                "cuTexObjectDestroy",
                abi::V5000,
                "cuTexObjectDestroy"
            ),
            mem_create: optional!(r, "cuMemCreate", abi::V10020, "cuMemCreate"),
            mem_release: optional!(r, "cuMemRelease", abi::V10020, "cuMemRelease"),
            mem_address_reserve: optional!(
                r,
                "cuMemAddressReserve",
                abi::V10020,
                "cuMemAddressReserve"
            ),
            mem_address_free: optional!(r, "cuMemAddressFree", abi::V10020, "cuMemAddressFree"),
            mem_map: optional!(r, "cuMemMap", abi::V10020, "cuMemMap"),
            mem_unmap: optional!(r, "cuMemUnmap", abi::V10020, "cuMemUnmap"),
            mem_set_access: optional!(r, "cuMemSetAccess", abi::V10020, "cuMemSetAccess"),
            stream_begin_capture: optional!(
                r,
                "cuStreamBeginCapture",
                abi::V10010,
                "cuStreamBeginCapture_v2"
            ),
            stream_end_capture: optional!(
                r,
                "cuStreamEndCapture",
                abi::V10000,
                "cuStreamEndCapture"
            ),
            graph_instantiate_with_flags: optional!(
                r,
                "cuGraphInstantiateWithFlags",
                abi::V11040,
                "cuGraphInstantiateWithFlags"
            ),
            graph_launch: optional!(r, "cuGraphLaunch", abi::V10000, "cuGraphLaunch"),
            graph_exec_destroy: optional!(
                r,
                "cuGraphExecDestroy",
                abi::V10000,
                "cuGraphExecDestroy"
            ),
            graph_destroy: optional!(r, "cuGraphDestroy", abi::V10000, "cuGraphDestroy"),
            mem_get_allocation_granularity: optional!(
                r,
                "cuMemGetAllocationGranularity",
                abi::V10020,
                "cuMemGetAllocationGranularity"
            ),
        };
        if f.ctx_create_v2.is_none() && f.ctx_create_v4.is_none() {
            return Err(CudaError::MissingSymbol {
                library: library.to_string(),
                symbol: "cuCtxCreate_v2",
            });
        }
        // SAFETY: plain call with flags 0, as cuInit requires.
        check("cuInit", unsafe { (f.init)(0) }).map_err(|e| CudaError::InitFailed {
            library: library.to_string(),
            code: e.code,
        })?;
        let mut version = 0;
        // SAFETY: valid out-pointer.
        check("cuDriverGetVersion", unsafe {
            (f.driver_get_version)(&mut version)
        })
        .map_err(Failed::open)?;
        if version < MIN_DRIVER_VERSION {
            return Err(CudaError::DriverTooOld { version });
        }
        tracing::info!(library, version, "CUDA driver loaded");
        Ok(Arc::new(Driver {
            library: library.to_string(),
            version,
            f,
            priority_launches: AtomicU64::new(0),
            graph_launches: AtomicU64::new(0),
            graph_instantiations: AtomicU64::new(0),
        }))
    }

    /// The library it was loaded from.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// `cuDriverGetVersion` (e.g. 12040 for CUDA 12.4).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// Whether kernels and their parameter layouts can be read from the
    /// driver (CUDA ≥ 12.4) rather than from the image.
    pub fn has_param_info(&self) -> bool {
        self.f.module_get_function_count.is_some()
            && self.f.module_enumerate_functions.is_some()
            && self.f.func_get_name.is_some()
            && self.f.func_get_param_info.is_some()
    }

    /// `cuDeviceGetCount`.
    pub fn device_count(&self) -> DrvResult<i32> {
        let mut n = 0;
        // SAFETY: valid out-pointer.
        check("cuDeviceGetCount", unsafe {
            (self.f.device_get_count)(&mut n)
        })?;
        Ok(n)
    }

    /// `cuDeviceGet`.
    pub fn device(&self, ordinal: i32) -> DrvResult<i32> {
        let mut d = 0;
        // SAFETY: valid out-pointer.
        check("cuDeviceGet", unsafe {
            (self.f.device_get)(&mut d, ordinal)
        })?;
        Ok(d)
    }

    /// `cuDeviceGetName`.
    pub fn device_name(&self, dev: i32) -> DrvResult<String> {
        let mut buf = [0 as c_char; NAME_BUFFER];
        // SAFETY: the buffer holds NAME_BUFFER bytes and the driver writes at most that many.
        check("cuDeviceGetName", unsafe {
            (self.f.device_get_name)(buf.as_mut_ptr(), NAME_BUFFER as c_int, dev)
        })?;
        buf[NAME_BUFFER - 1] = 0;
        // SAFETY: the buffer is NUL-terminated (forced above).
        let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Ok(name.to_string_lossy().into_owned())
    }

    /// `cuDeviceGetUuid_v2` (the MIG instance's UUID on a MIG device).
    pub fn device_uuid(&self, dev: i32) -> DrvResult<[u8; 16]> {
        let mut u = [0u8; 16];
        // SAFETY: valid out-pointer to 16 bytes (a CUuuid).
        check("cuDeviceGetUuid_v2", unsafe {
            (self.f.device_get_uuid)(&mut u, dev)
        })?;
        Ok(u)
    }

    /// `cuDeviceTotalMem_v2`.
    pub fn device_total_mem(&self, dev: i32) -> DrvResult<u64> {
        let mut n = 0usize;
        // SAFETY: valid out-pointer.
        check("cuDeviceTotalMem_v2", unsafe {
            (self.f.device_total_mem)(&mut n, dev)
        })?;
        Ok(n as u64)
    }

    /// `cuDeviceGetAttribute`.
    pub fn device_attribute(&self, dev: i32, attr: i32) -> DrvResult<i32> {
        let mut v = 0;
        // SAFETY: valid out-pointer.
        check("cuDeviceGetAttribute", unsafe {
            (self.f.device_get_attribute)(&mut v, attr, dev)
        })?;
        Ok(v)
    }

    /// `cuCtxCreate` (flags 0). The new context is current on this thread
    /// afterwards; the caller pops it.
    pub fn ctx_create(&self, dev: i32) -> DrvResult<Ctx> {
        let mut c: P = std::ptr::null_mut();
        if let Some(create) = self.f.ctx_create_v2 {
            // SAFETY: valid out-pointer.
            check("cuCtxCreate_v2", unsafe { create(&mut c, 0, dev) })?;
        } else if let Some(create) = self.f.ctx_create_v4 {
            // SAFETY: valid out-pointer; NULL creation parameters are allowed.
            check("cuCtxCreate_v4", unsafe {
                create(&mut c, std::ptr::null_mut(), 0, dev)
            })?;
        }
        Ok(Ctx(c))
    }

    /// `cuCtxDestroy_v2`.
    pub fn ctx_destroy(&self, c: Ctx) -> DrvResult<()> {
        // SAFETY: a context this process created, destroyed once by its owner.
        check("cuCtxDestroy_v2", unsafe { (self.f.ctx_destroy)(c.0) })
    }

    /// `cuCtxPushCurrent_v2`.
    pub fn ctx_push(&self, c: Ctx) -> DrvResult<()> {
        // SAFETY: a live context.
        check("cuCtxPushCurrent_v2", unsafe { (self.f.ctx_push)(c.0) })
    }

    /// `cuCtxPopCurrent_v2`.
    pub fn ctx_pop(&self) -> DrvResult<Ctx> {
        let mut c: P = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cuCtxPopCurrent_v2", unsafe { (self.f.ctx_pop)(&mut c) })?;
        Ok(Ctx(c))
    }

    /// `cuCtxGetLimit` of the current context.
    pub fn ctx_get_limit(&self, limit: c_int) -> DrvResult<u64> {
        let f = self.f.ctx_get_limit.ok_or(Failed {
            call: "cuCtxGetLimit",
            code: cuda::CUDA_ERROR_NOT_SUPPORTED,
        })?;
        let mut v = 0usize;
        // SAFETY: valid out-pointer.
        check("cuCtxGetLimit", unsafe { f(&mut v, limit) })?;
        Ok(v as u64)
    }

    /// `cuCtxSetLimit` of the current context.
    pub fn ctx_set_limit(&self, limit: c_int, value: u64) -> DrvResult<()> {
        let f = self.f.ctx_set_limit.ok_or(Failed {
            call: "cuCtxSetLimit",
            code: cuda::CUDA_ERROR_NOT_SUPPORTED,
        })?;
        let value = usize::try_from(value).map_err(|_| Failed {
            call: "cuCtxSetLimit",
            code: cuda::CUDA_ERROR_INVALID_VALUE,
        })?;
        // SAFETY: plain values.
        check("cuCtxSetLimit", unsafe { f(limit, value) })
    }

    /// `cuMemAlloc_v2` in the current context.
    pub fn mem_alloc(&self, size: u64) -> DrvResult<u64> {
        let size = usize::try_from(size).map_err(|_| Failed {
            call: "cuMemAlloc_v2",
            code: cuda::CUDA_ERROR_OUT_OF_MEMORY,
        })?;
        let mut p = 0u64;
        // SAFETY: valid out-pointer.
        check("cuMemAlloc_v2", unsafe { (self.f.mem_alloc)(&mut p, size) })?;
        Ok(p)
    }

    /// Whether the driver has the virtual memory management calls.
    pub fn has_vmm(&self) -> bool {
        self.f.mem_create.is_some()
            && self.f.mem_release.is_some()
            && self.f.mem_address_reserve.is_some()
            && self.f.mem_address_free.is_some()
            && self.f.mem_map.is_some()
            && self.f.mem_unmap.is_some()
            && self.f.mem_set_access.is_some()
            && self.f.mem_get_allocation_granularity.is_some()
    }

    /// `cuMemCreate`: `size` bytes of pinned memory on device `dev`.
    pub fn vmm_create(&self, size: u64, dev: i32) -> DrvResult<u64> {
        self.vmm_create_at(size, MemPlace::Device(dev))
    }

    /// `cuMemCreate`: `size` bytes of pinned memory at `place` (device or host memory).
    pub fn vmm_create_at(&self, size: u64, place: MemPlace) -> DrvResult<u64> {
        let f = vmm_fn(self.f.mem_create, "cuMemCreate")?;
        let size = vmm_size(size, "cuMemCreate")?;
        let prop = place.prop();
        let mut h = 0u64;
        // SAFETY: valid out-pointer; `prop` is a complete `CUmemAllocationProp` (layout checked
        // at compile time) that outlives the call; flags must be 0.
        check("cuMemCreate", unsafe { f(&mut h, size, &prop, 0) })?;
        Ok(h)
    }

    /// `cuMemGetAllocationGranularity` (minimum) of physical memory at `place`: what sizes of
    /// `cuMemCreate` and ranges of `cuMemMap` must be multiples of.
    pub fn vmm_granularity(&self, place: MemPlace) -> DrvResult<u64> {
        let f = vmm_fn(
            self.f.mem_get_allocation_granularity,
            "cuMemGetAllocationGranularity",
        )?;
        let prop = place.prop();
        let mut g = 0usize;
        // SAFETY: valid out-pointer and a complete `CUmemAllocationProp` alive across the call.
        check("cuMemGetAllocationGranularity", unsafe {
            f(&mut g, &prop, MEM_ALLOC_GRANULARITY_MINIMUM)
        })?;
        if g == 0 {
            return Err(Failed {
                call: "cuMemGetAllocationGranularity",
                code: cuda::CUDA_ERROR_NOT_SUPPORTED,
            });
        }
        Ok(g as u64)
    }

    /// `cuMemRelease`.
    pub fn vmm_release(&self, h: u64) -> DrvResult<()> {
        let f = vmm_fn(self.f.mem_release, "cuMemRelease")?;
        // SAFETY: the driver checks the handle.
        check("cuMemRelease", unsafe { f(h) })
    }

    /// `cuMemAddressReserve`.
    pub fn vmm_reserve(&self, size: u64, align: u64) -> DrvResult<u64> {
        let f = vmm_fn(self.f.mem_address_reserve, "cuMemAddressReserve")?;
        let size = vmm_size(size, "cuMemAddressReserve")?;
        let align = vmm_size(align, "cuMemAddressReserve")?;
        let mut p = 0u64;
        // SAFETY: valid out-pointer.
        check("cuMemAddressReserve", unsafe {
            f(&mut p, size, align, 0, 0)
        })?;
        Ok(p)
    }

    /// `cuMemAddressFree`.
    pub fn vmm_free(&self, addr: u64, size: u64) -> DrvResult<()> {
        let f = vmm_fn(self.f.mem_address_free, "cuMemAddressFree")?;
        let size = vmm_size(size, "cuMemAddressFree")?;
        // SAFETY: the driver checks the range.
        check("cuMemAddressFree", unsafe { f(addr, size) })
    }

    /// `cuMemMap` of all of `h` at `va`, then `cuMemSetAccess` read-write for device `dev`.
    pub fn vmm_map(&self, va: u64, size: u64, h: u64, dev: i32) -> DrvResult<()> {
        let map = vmm_fn(self.f.mem_map, "cuMemMap")?;
        let access = vmm_fn(self.f.mem_set_access, "cuMemSetAccess")?;
        let size = vmm_size(size, "cuMemMap")?;
        // SAFETY: the driver checks the range and the handle.
        check("cuMemMap", unsafe { map(va, size, 0, h, 0) })?;
        let desc = MemAccessDesc {
            location: MemPlace::Device(dev).location(),
            flags: MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one valid descriptor (layout checked at compile time), alive across the call.
        let r = check("cuMemSetAccess", unsafe { access(va, size, &desc, 1) });
        if r.is_err() {
            let _ = self.vmm_unmap(va, size as u64);
        }
        r
    }

    /// `cuMemUnmap`.
    pub fn vmm_unmap(&self, va: u64, size: u64) -> DrvResult<()> {
        let f = vmm_fn(self.f.mem_unmap, "cuMemUnmap")?;
        let size = vmm_size(size, "cuMemUnmap")?;
        // SAFETY: the driver checks the range.
        check("cuMemUnmap", unsafe { f(va, size) })
    }

    /// `cuMemFree_v2` in the current context.
    pub fn mem_free(&self, p: u64) -> DrvResult<()> {
        // SAFETY: the driver checks the pointer; nothing here dereferences it.
        check("cuMemFree_v2", unsafe { (self.f.mem_free)(p) })
    }

    /// `cuMemHostAlloc` (portable pinned memory) in the current context.
    pub fn mem_host_alloc(&self, size: usize, flags: u32) -> DrvResult<HostPtr> {
        let mut p: P = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cuMemHostAlloc", unsafe {
            (self.f.mem_host_alloc)(&mut p, size, flags)
        })?;
        Ok(HostPtr(p.cast()))
    }

    /// `cuMemFreeHost`.
    pub fn mem_free_host(&self, p: HostPtr) -> DrvResult<()> {
        // SAFETY: a buffer from `mem_host_alloc`, freed once by its owner.
        check("cuMemFreeHost", unsafe {
            (self.f.mem_free_host)(p.0.cast())
        })
    }

    /// `cuMemcpyHtoDAsync_v2` from pinned memory.
    ///
    /// # Safety
    /// `src` must stay valid and unmodified for `len` bytes until the copy
    /// completes on `s`.
    pub unsafe fn memcpy_htod_async(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        s: Stream,
    ) -> DrvResult<()> {
        // SAFETY: the caller keeps `src` valid until the copy completes.
        check("cuMemcpyHtoDAsync_v2", unsafe {
            (self.f.memcpy_htod_async)(dst, src.cast(), len, s.0)
        })
    }

    /// `cuMemcpyDtoHAsync_v2` into pinned memory.
    ///
    /// # Safety
    /// `dst` must stay valid for `len` bytes, and not be read or written by
    /// anything else, until the copy completes on `s`.
    pub unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        s: Stream,
    ) -> DrvResult<()> {
        // SAFETY: the caller keeps `dst` valid and unaliased until the copy completes.
        check("cuMemcpyDtoHAsync_v2", unsafe {
            (self.f.memcpy_dtoh_async)(dst.cast(), src, len, s.0)
        })
    }

    /// `cuMemcpyDtoDAsync_v2`.
    pub fn memcpy_dtod_async(&self, dst: u64, src: u64, len: usize, s: Stream) -> DrvResult<()> {
        // SAFETY: device addresses only; the driver checks them.
        check("cuMemcpyDtoDAsync_v2", unsafe {
            (self.f.memcpy_dtod_async)(dst, src, len, s.0)
        })
    }

    /// `cuMemsetD8Async` / `D16` / `D32` for `elem_size` 1, 2 or 4.
    pub fn memset_async(
        &self,
        dst: u64,
        value: u32,
        elem_size: u32,
        count: usize,
        s: Stream,
    ) -> DrvResult<()> {
        match elem_size {
            // SAFETY: device addresses only; the driver checks them.
            1 => check("cuMemsetD8Async", unsafe {
                (self.f.memset_d8_async)(dst, value as u8, count, s.0)
            }),
            // SAFETY: as above.
            2 => check("cuMemsetD16Async", unsafe {
                (self.f.memset_d16_async)(dst, value as u16, count, s.0)
            }),
            // SAFETY: as above.
            4 => check("cuMemsetD32Async", unsafe {
                (self.f.memset_d32_async)(dst, value, count, s.0)
            }),
            _ => Err(Failed {
                call: "cuMemsetD32Async",
                code: cuda::CUDA_ERROR_INVALID_VALUE,
            }),
        }
    }

    /// `cuTexObjectCreate` in the current context (no resource view).
    pub fn tex_object_create(&self, res: &ResourceDesc, tex: &TextureDesc) -> DrvResult<u64> {
        let f = self.f.tex_object_create.ok_or(Failed {
            call: "cuTexObjectCreate",
            code: cuda::CUDA_ERROR_NOT_SUPPORTED,
        })?;
        let mut h = 0u64;
        // SAFETY: valid out-pointer and descriptors of cuda.h's layout (checked at compile time
        // in `texture_abi`); a null resource view is allowed.
        check("cuTexObjectCreate", unsafe {
            f(&mut h, res, tex, std::ptr::null())
        })?;
        Ok(h)
    }

    /// `cuTexObjectDestroy`.
    pub fn tex_object_destroy(&self, h: u64) -> DrvResult<()> {
        let f = self.f.tex_object_destroy.ok_or(Failed {
            call: "cuTexObjectDestroy",
            code: cuda::CUDA_ERROR_NOT_SUPPORTED,
        })?;
        // SAFETY: a handle by value; the driver checks it.
        check("cuTexObjectDestroy", unsafe { f(h) })
    }

    /// `cuStreamCreate` in the current context.
    pub fn stream_create(&self, flags: u32) -> DrvResult<Stream> {
        let mut s: P = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cuStreamCreate", unsafe {
            (self.f.stream_create)(&mut s, flags)
        })?;
        Ok(Stream(s))
    }

    /// `cuStreamDestroy_v2`.
    pub fn stream_destroy(&self, s: Stream) -> DrvResult<()> {
        // SAFETY: a stream of this process, destroyed once by its owner.
        check("cuStreamDestroy_v2", unsafe {
            (self.f.stream_destroy)(s.0)
        })
    }

    /// `cuEventCreate` in the current context.
    pub fn event_create(&self, flags: u32) -> DrvResult<Event> {
        let mut e: P = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cuEventCreate", unsafe {
            (self.f.event_create)(&mut e, flags)
        })?;
        Ok(Event(e))
    }

    /// `cuEventDestroy_v2`.
    pub fn event_destroy(&self, e: Event) -> DrvResult<()> {
        // SAFETY: an event of this process, destroyed once by its owner.
        check("cuEventDestroy_v2", unsafe { (self.f.event_destroy)(e.0) })
    }

    /// `cuEventRecord`.
    pub fn event_record(&self, e: Event, s: Stream) -> DrvResult<()> {
        // SAFETY: live handles.
        check("cuEventRecord", unsafe { (self.f.event_record)(e.0, s.0) })
    }

    /// `cuEventQuery`: `Ok(true)` when complete, `Ok(false)` while pending.
    pub fn event_query(&self, e: Event) -> DrvResult<bool> {
        // SAFETY: a live event.
        match unsafe { (self.f.event_query)(e.0) } {
            cuda::CUDA_SUCCESS => Ok(true),
            cuda::CUDA_ERROR_NOT_READY => Ok(false),
            code => Err(Failed {
                call: "cuEventQuery",
                code,
            }),
        }
    }

    /// `cuEventElapsedTime` in milliseconds.
    pub fn event_elapsed_ms(&self, start: Event, end: Event) -> DrvResult<f32> {
        let mut ms = 0f32;
        // SAFETY: valid out-pointer and live events.
        check("cuEventElapsedTime", unsafe {
            (self.f.event_elapsed_time)(&mut ms, start.0, end.0)
        })?;
        Ok(ms)
    }

    /// `cuModuleLoadDataEx` with an error log buffer; on failure the log's
    /// text comes back with the error.
    pub fn module_load(&self, image: &[u8]) -> Result<Module, (Failed, String)> {
        /// `CU_JIT_ERROR_LOG_BUFFER`.
        const JIT_ERROR_LOG_BUFFER: c_int = 5;
        /// `CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES`.
        const JIT_ERROR_LOG_BUFFER_SIZE_BYTES: c_int = 6;
        /// Bytes of JIT error log kept.
        const LOG_BYTES: usize = 16 << 10;
        let mut log = vec![0u8; LOG_BYTES];
        let mut options = [JIT_ERROR_LOG_BUFFER, JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
        // The size option's value is passed in the pointer itself (cuda.h).
        let mut values: [P; 2] = [log.as_mut_ptr().cast(), LOG_BYTES as P];
        let mut m: P = std::ptr::null_mut();
        // SAFETY: `image` is a complete image (validated by `image::prepare`,
        // NUL-terminated when PTX); options and values have two entries each
        // and the log buffer holds LOG_BYTES bytes.
        let r = unsafe {
            (self.f.module_load_data_ex)(
                &mut m,
                image.as_ptr().cast(),
                options.len() as c_uint,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        match check("cuModuleLoadDataEx", r) {
            Ok(()) => Ok(Module(m)),
            Err(f) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                Err((f, String::from_utf8_lossy(&log[..end]).trim().to_string()))
            }
        }
    }

    /// `cuModuleUnload`.
    pub fn module_unload(&self, m: Module) -> DrvResult<()> {
        // SAFETY: a module of this process, unloaded once by its owner.
        check("cuModuleUnload", unsafe { (self.f.module_unload)(m.0) })
    }

    /// `cuModuleGetFunction`.
    pub fn module_function(&self, m: Module, name: &str) -> DrvResult<Function> {
        let n = CString::new(name).map_err(|_| Failed {
            call: "cuModuleGetFunction",
            code: cuda::CUDA_ERROR_NOT_FOUND,
        })?;
        let mut f: P = std::ptr::null_mut();
        // SAFETY: valid out-pointer and C string.
        check("cuModuleGetFunction", unsafe {
            (self.f.module_get_function)(&mut f, m.0, n.as_ptr())
        })?;
        Ok(Function(f))
    }

    /// `cuModuleGetGlobal_v2`: address and size.
    pub fn module_global(&self, m: Module, name: &str) -> DrvResult<(u64, u64)> {
        let n = CString::new(name).map_err(|_| Failed {
            call: "cuModuleGetGlobal_v2",
            code: cuda::CUDA_ERROR_NOT_FOUND,
        })?;
        let (mut p, mut s) = (0u64, 0usize);
        // SAFETY: valid out-pointers and C string.
        check("cuModuleGetGlobal_v2", unsafe {
            (self.f.module_get_global)(&mut p, &mut s, m.0, n.as_ptr())
        })?;
        Ok((p, s as u64))
    }

    /// `cuFuncGetAttribute`.
    pub fn func_attribute(&self, f: Function, attr: i32) -> DrvResult<i32> {
        let mut v = 0;
        // SAFETY: valid out-pointer.
        check("cuFuncGetAttribute", unsafe {
            (self.f.func_get_attribute)(&mut v, attr, f.0)
        })?;
        Ok(v)
    }

    /// `cuFuncSetAttribute`.
    pub fn func_set_attribute(&self, f: Function, attr: i32, value: i32) -> DrvResult<()> {
        // SAFETY: a live function.
        check("cuFuncSetAttribute", unsafe {
            (self.f.func_set_attribute)(f.0, attr, value)
        })
    }

    /// Whether the driver has `cuLaunchKernelEx`, so launches can carry a priority.
    pub fn has_launch_priority(&self) -> bool {
        self.f.launch_kernel_ex.is_some()
    }

    /// How many kernels were launched with a priority attribute (`cuLaunchKernelEx`).
    pub fn priority_launches(&self) -> u64 {
        self.priority_launches.load(Ordering::Relaxed)
    }

    /// `cuLaunchKernel` with the packed parameter buffer passed through
    /// `extra` (`CU_LAUNCH_PARAM_BUFFER_POINTER` / `_SIZE`). A non-zero `priority` (lower
    /// numbers first, as stream priorities) launches with `cuLaunchKernelEx` and a
    /// `CU_LAUNCH_ATTRIBUTE_PRIORITY` attribute instead, where the driver has it (CUDA 11.8);
    /// elsewhere, and at priority 0, the kernel takes its stream's priority.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        f: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        s: Stream,
        params: &[u8],
        priority: i32,
    ) -> DrvResult<()> {
        if self.issue_launch(f, grid, block, shared, s, params, priority)? {
            self.priority_launches.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// [`Driver::launch`] without counting (also a launch inside [`Driver::capture_graph`]);
    /// `true` when the launch carried a priority.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn issue_launch(
        &self,
        f: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        s: Stream,
        params: &[u8],
        priority: i32,
    ) -> DrvResult<bool> {
        /// `CU_LAUNCH_PARAM_END`.
        const END: P = std::ptr::null_mut();
        /// `CU_LAUNCH_PARAM_BUFFER_POINTER`.
        const BUFFER_POINTER: usize = 1;
        /// `CU_LAUNCH_PARAM_BUFFER_SIZE`.
        const BUFFER_SIZE: usize = 2;
        // The driver reads the buffer at launch; a copy keeps it aligned for
        // any parameter type and alive across the call.
        let mut buf: Vec<u64> = vec![0; params.len().div_ceil(8).max(1)];
        // SAFETY: `buf` holds at least `params.len()` bytes; u64 has no invalid bit patterns.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), params.len()) };
        bytes.copy_from_slice(params);
        let mut size = params.len();
        let mut extra: [P; 5] = [
            BUFFER_POINTER as P,
            buf.as_mut_ptr().cast(),
            BUFFER_SIZE as P,
            (&raw mut size).cast(),
            END,
        ];
        if priority != 0
            && let Some(launch_ex) = self.f.launch_kernel_ex
        {
            let mut attr = LaunchAttribute::priority(priority);
            let config = LaunchConfig {
                grid,
                block,
                shared_mem_bytes: shared,
                stream: s.0,
                attrs: &raw mut attr,
                num_attrs: 1,
            };
            // SAFETY: a live function and stream; `config` is a CUlaunchConfig (layout
            // checked above) whose one attribute outlives the call; `extra` is a well-formed
            // CU_LAUNCH_PARAM list whose buffer and size outlive the call.
            check("cuLaunchKernelEx", unsafe {
                launch_ex(&config, f.0, std::ptr::null_mut(), extra.as_mut_ptr())
            })?;
            return Ok(true);
        }
        // SAFETY: a live function and stream; `extra` is a well-formed
        // CU_LAUNCH_PARAM list whose buffer and size outlive the call.
        check("cuLaunchKernel", unsafe {
            (self.f.launch_kernel)(
                f.0,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared,
                s.0,
                std::ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        })
        .map(|()| false)
    }

    /// Whether the driver has what [`Driver::capture_graph`] and [`Driver::graph_launch`]
    /// need (stream capture and graphs, CUDA 11.4).
    pub fn has_graphs(&self) -> bool {
        self.f.stream_begin_capture.is_some()
            && self.f.stream_end_capture.is_some()
            && self.f.graph_instantiate_with_flags.is_some()
            && self.f.graph_launch.is_some()
            && self.f.graph_exec_destroy.is_some()
            && self.f.graph_destroy.is_some()
    }

    /// How many `cuGraphLaunch` calls were made.
    pub fn graph_launches(&self) -> u64 {
        self.graph_launches.load(Ordering::Relaxed)
    }

    /// How many graphs were instantiated.
    pub fn graph_instantiations(&self) -> u64 {
        self.graph_instantiations.load(Ordering::Relaxed)
    }

    /// Captures the launches `issue` makes on `s` (through [`Driver::issue_launch`]: not
    /// counted as launches, the graph's launch is) into a graph: `cuStreamBeginCapture_v2` in
    /// relaxed mode, `issue`, `cuStreamEndCapture`. The
    /// stream must be one nothing else issues work on meanwhile. A failed `issue` still ends
    /// the capture (and destroys what it captured).
    pub fn capture_graph(
        &self,
        s: Stream,
        issue: impl FnOnce() -> DrvResult<()>,
    ) -> DrvResult<Graph> {
        let begin = graph_fn(self.f.stream_begin_capture, "cuStreamBeginCapture_v2")?;
        let end = graph_fn(self.f.stream_end_capture, "cuStreamEndCapture")?;
        // SAFETY: a live stream of the current context; the mode is a CUstreamCaptureMode.
        check("cuStreamBeginCapture_v2", unsafe {
            begin(s.0, CAPTURE_MODE_RELAXED)
        })?;
        let issued = issue();
        let mut g: P = std::ptr::null_mut();
        // SAFETY: the stream is capturing (begun above); valid out-pointer.
        let ended = check("cuStreamEndCapture", unsafe { end(s.0, &mut g) });
        match (issued, ended) {
            (Ok(()), Ok(())) if !g.is_null() => Ok(Graph(g)),
            (Ok(()), Ok(())) => Err(Failed {
                call: "cuStreamEndCapture",
                code: cuda::CUDA_ERROR_UNKNOWN,
            }),
            (Err(e), _) | (Ok(()), Err(e)) => {
                if !g.is_null() {
                    let _ = self.graph_destroy(Graph(g));
                }
                Err(e)
            }
        }
    }

    /// `cuGraphInstantiateWithFlags`; with `node_priority`, kernel nodes run at the priority
    /// they were captured with (`CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`).
    pub fn graph_instantiate(&self, g: Graph, node_priority: bool) -> DrvResult<GraphExec> {
        let inst = graph_fn(
            self.f.graph_instantiate_with_flags,
            "cuGraphInstantiateWithFlags",
        )?;
        let flags = if node_priority {
            INSTANTIATE_USE_NODE_PRIORITY
        } else {
            0
        };
        let mut e: P = std::ptr::null_mut();
        // SAFETY: a live graph; valid out-pointer; flags are CUgraphInstantiate_flags.
        check("cuGraphInstantiateWithFlags", unsafe {
            inst(&mut e, g.0, flags)
        })?;
        self.graph_instantiations.fetch_add(1, Ordering::Relaxed);
        Ok(GraphExec(e))
    }

    /// `cuGraphLaunch` on `s`.
    pub fn graph_launch(&self, e: GraphExec, s: Stream) -> DrvResult<()> {
        let launch = graph_fn(self.f.graph_launch, "cuGraphLaunch")?;
        // SAFETY: a live executable graph and stream of the current context.
        check("cuGraphLaunch", unsafe { launch(e.0, s.0) })?;
        self.graph_launches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// `cuGraphExecDestroy`.
    pub fn graph_exec_destroy(&self, e: GraphExec) -> DrvResult<()> {
        let destroy = graph_fn(self.f.graph_exec_destroy, "cuGraphExecDestroy")?;
        // SAFETY: a live executable graph, destroyed once by its owner.
        check("cuGraphExecDestroy", unsafe { destroy(e.0) })
    }

    /// `cuGraphDestroy`.
    pub fn graph_destroy(&self, g: Graph) -> DrvResult<()> {
        let destroy = graph_fn(self.f.graph_destroy, "cuGraphDestroy")?;
        // SAFETY: a live graph, destroyed once by its owner.
        check("cuGraphDestroy", unsafe { destroy(g.0) })
    }

    /// `cuLaunchCooperativeKernel`: every block at once. It takes one pointer per
    /// parameter, not a packed buffer: `offsets` are the parameters' offsets in `params`.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_cooperative(
        &self,
        f: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        s: Stream,
        params: &[u8],
        offsets: &[u32],
    ) -> DrvResult<()> {
        let launch = self.f.launch_cooperative_kernel.ok_or(Failed {
            call: "cuLaunchCooperativeKernel",
            code: cuda::CUDA_ERROR_NOT_SUPPORTED,
        })?;
        if offsets.iter().any(|&o| o as usize > params.len()) {
            return Err(Failed {
                call: "cuLaunchCooperativeKernel",
                code: cuda::CUDA_ERROR_INVALID_VALUE,
            });
        }
        // An aligned copy, alive across the call: each parameter pointer points into it.
        let mut buf: Vec<u64> = vec![0; params.len().div_ceil(8).max(1)];
        // SAFETY: `buf` holds at least `params.len()` bytes; u64 has no invalid bit patterns.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), params.len()) };
        bytes.copy_from_slice(params);
        let base = buf.as_mut_ptr().cast::<u8>();
        let mut pointers: Vec<P> = offsets
            .iter()
            .map(|&o| base.wrapping_add(o as usize).cast::<c_void>())
            .collect();
        // SAFETY: a live function and stream; one pointer per kernel parameter, each into
        // `buf` at the parameter's offset (checked against its length above), alive across
        // the call, which copies the values.
        check("cuLaunchCooperativeKernel", unsafe {
            launch(
                f.0,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared,
                s.0,
                pointers.as_mut_ptr(),
            )
        })
    }

    /// The module's kernels with their parameter (offset, size) lists, from
    /// the driver (CUDA ≥ 12.4); `None` on older drivers.
    pub fn enumerate_kernels(&self, m: Module) -> Option<DrvResult<Vec<ListedKernel>>> {
        let count_fn = self.f.module_get_function_count?;
        let enum_fn = self.f.module_enumerate_functions?;
        let name_fn = self.f.func_get_name?;
        let param_fn = self.f.func_get_param_info?;
        Some((|| {
            let mut n: c_uint = 0;
            // SAFETY: valid out-pointer and a live module.
            check("cuModuleGetFunctionCount", unsafe { count_fn(&mut n, m.0) })?;
            let mut fs: Vec<P> = vec![std::ptr::null_mut(); n as usize];
            // SAFETY: `fs` has room for `n` handles.
            check("cuModuleEnumerateFunctions", unsafe {
                enum_fn(fs.as_mut_ptr(), n, m.0)
            })?;
            let mut out = Vec::with_capacity(fs.len());
            for f in fs {
                let mut name: *const c_char = std::ptr::null();
                // SAFETY: valid out-pointer and a function of a live module.
                check("cuFuncGetName", unsafe { name_fn(&mut name, f) })?;
                if name.is_null() {
                    continue;
                }
                // SAFETY: the driver returns a NUL-terminated name that lives as long as the module.
                let name = unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned();
                let mut params = Vec::new();
                loop {
                    let (mut off, mut size) = (0usize, 0usize);
                    // SAFETY: valid out-pointers; an index past the last parameter
                    // is answered with CUDA_ERROR_INVALID_VALUE.
                    let r = unsafe { param_fn(f, params.len(), &mut off, &mut size) };
                    if r != cuda::CUDA_SUCCESS {
                        break;
                    }
                    params.push((off as u32, size as u32));
                }
                out.push((name, Function(f), params));
            }
            Ok(out)
        })())
    }
}

/// Makes `ctx` current on this thread until the guard is dropped.
pub struct Current<'a> {
    driver: &'a Driver,
}

impl<'a> Current<'a> {
    /// Pushes `ctx`.
    pub fn push(driver: &'a Driver, ctx: Ctx) -> DrvResult<Current<'a>> {
        driver.ctx_push(ctx)?;
        Ok(Current { driver })
    }
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.driver.ctx_pop() {
            tracing::warn!(
                call = e.call,
                code = e.code,
                "popping a CUDA context failed"
            );
        }
    }
}

fn vmm_fn<F>(f: Option<F>, call: &'static str) -> DrvResult<F> {
    f.ok_or(Failed {
        call,
        code: cuda::CUDA_ERROR_NOT_SUPPORTED,
    })
}

fn graph_fn<F>(f: Option<F>, call: &'static str) -> DrvResult<F> {
    f.ok_or(Failed {
        call,
        code: cuda::CUDA_ERROR_NOT_SUPPORTED,
    })
}

fn vmm_size(v: u64, call: &'static str) -> DrvResult<usize> {
    usize::try_from(v).map_err(|_| Failed {
        call,
        code: cuda::CUDA_ERROR_OUT_OF_MEMORY,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_clear_error() {
        let e = Driver::load("/nonexistent/vgpu-test/libcuda.so.1").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("no NVIDIA driver found (/nonexistent/vgpu-test/libcuda.so.1): "),
            "{msg}"
        );
        assert!(
            msg.ends_with("; use kind = \"sim\" or install the driver"),
            "{msg}"
        );
        assert!(matches!(e, CudaError::NoDriver { .. }));
        // The loader's reason is kept as the source.
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn a_library_that_is_not_a_driver_is_refused() {
        // libc is a real shared library without any cu* symbol.
        let e = Driver::load("libc.so.6").unwrap_err();
        assert!(
            matches!(
                e,
                CudaError::MissingSymbol {
                    symbol: "cuInit",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("is not a usable CUDA driver"), "{e}");
    }
}
