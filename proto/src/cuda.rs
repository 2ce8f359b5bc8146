//! CUDA driver-API constants shared by the guest shim and the host: `CUresult`
//! codes with their names and messages, and the device and function attribute
//! numbers the protocol carries.
//!
//! Values are those of NVIDIA's `cuda.h` (CUDA 12).

/// A `CUresult` value.
pub type CuResult = u32;

macro_rules! results {
    ($($name:ident = $val:literal, $msg:literal;)*) => {
        $(
            #[doc = $msg]
            pub const $name: CuResult = $val;
        )*
        /// Every known `CUresult`: (value, name, message).
        pub const RESULTS: &[(CuResult, &str, &str)] = &[
            $(($val, stringify!($name), $msg),)*
        ];
    };
}

results! {
    CUDA_SUCCESS = 0, "no error";
    CUDA_ERROR_INVALID_VALUE = 1, "invalid argument";
    CUDA_ERROR_OUT_OF_MEMORY = 2, "out of memory";
    CUDA_ERROR_NOT_INITIALIZED = 3, "initialization error";
    CUDA_ERROR_DEINITIALIZED = 4, "driver shutting down";
    CUDA_ERROR_PROFILER_DISABLED = 5, "profiler disabled while using external profiling tool";
    CUDA_ERROR_PROFILER_NOT_INITIALIZED = 6, "profiler not initialized: call cudaProfilerInitialize()";
    CUDA_ERROR_PROFILER_ALREADY_STARTED = 7, "profiler already started";
    CUDA_ERROR_PROFILER_ALREADY_STOPPED = 8, "profiler already stopped";
    CUDA_ERROR_STUB_LIBRARY = 34, "CUDA driver is a stub library";
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46, "CUDA-capable device(s) is/are busy or unavailable";
    CUDA_ERROR_NO_DEVICE = 100, "no CUDA-capable device is detected";
    CUDA_ERROR_INVALID_DEVICE = 101, "invalid device ordinal";
    CUDA_ERROR_DEVICE_NOT_LICENSED = 102, "device doesn't have valid Grid license";
    CUDA_ERROR_INVALID_IMAGE = 200, "device kernel image is invalid";
    CUDA_ERROR_INVALID_CONTEXT = 201, "invalid device context";
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT = 202, "context already current";
    CUDA_ERROR_MAP_FAILED = 205, "mapping of buffer object failed";
    CUDA_ERROR_UNMAP_FAILED = 206, "unmapping of buffer object failed";
    CUDA_ERROR_ARRAY_IS_MAPPED = 207, "array is mapped";
    CUDA_ERROR_ALREADY_MAPPED = 208, "resource already mapped";
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209, "no kernel image is available for execution on the device";
    CUDA_ERROR_ALREADY_ACQUIRED = 210, "resource already acquired";
    CUDA_ERROR_NOT_MAPPED = 211, "resource not mapped";
    CUDA_ERROR_NOT_MAPPED_AS_ARRAY = 212, "resource not mapped as array";
    CUDA_ERROR_NOT_MAPPED_AS_POINTER = 213, "resource not mapped as pointer";
    CUDA_ERROR_ECC_UNCORRECTABLE = 214, "uncorrectable ECC error encountered";
    CUDA_ERROR_UNSUPPORTED_LIMIT = 215, "limit is not supported on this architecture";
    CUDA_ERROR_CONTEXT_ALREADY_IN_USE = 216, "exclusive-thread device already in use by a different thread";
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217, "peer access is not supported between these two devices";
    CUDA_ERROR_INVALID_PTX = 218, "a PTX JIT compilation failed";
    CUDA_ERROR_INVALID_GRAPHICS_CONTEXT = 219, "invalid OpenGL or DirectX context";
    CUDA_ERROR_NVLINK_UNCORRECTABLE = 220, "uncorrectable NVLink error detected during the execution";
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221, "PTX JIT compiler library not found";
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222, "the provided PTX was compiled with an unsupported toolchain.";
    CUDA_ERROR_JIT_COMPILATION_DISABLED = 223, "PTX JIT compilation was disabled";
    CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY = 224, "the provided execution affinity is not supported";
    CUDA_ERROR_INVALID_SOURCE = 300, "device kernel image is invalid";
    CUDA_ERROR_FILE_NOT_FOUND = 301, "file not found";
    CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND = 302, "shared object symbol not found";
    CUDA_ERROR_SHARED_OBJECT_INIT_FAILED = 303, "shared object initialization failed";
    CUDA_ERROR_OPERATING_SYSTEM = 304, "OS call failed or operation not supported on this OS";
    CUDA_ERROR_INVALID_HANDLE = 400, "invalid resource handle";
    CUDA_ERROR_ILLEGAL_STATE = 401, "the operation cannot be performed in the present state";
    CUDA_ERROR_LOSSY_QUERY = 402, "attempted introspection would be semantically lossy";
    CUDA_ERROR_NOT_FOUND = 500, "named symbol not found";
    CUDA_ERROR_NOT_READY = 600, "device not ready";
    CUDA_ERROR_ILLEGAL_ADDRESS = 700, "an illegal memory access was encountered";
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701, "too many resources requested for launch";
    CUDA_ERROR_LAUNCH_TIMEOUT = 702, "the launch timed out and was terminated";
    CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING = 703, "launch uses incompatible texturing mode";
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704, "peer access is already enabled";
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705, "peer access has not been enabled";
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708, "cannot set while device is active in this process";
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709, "context is destroyed";
    CUDA_ERROR_ASSERT = 710, "device-side assert triggered";
    CUDA_ERROR_TOO_MANY_PEERS = 711, "peer mapping resources exhausted";
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712, "part or all of the requested memory range is already mapped";
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713, "pointer does not correspond to a registered memory region";
    CUDA_ERROR_HARDWARE_STACK_ERROR = 714, "hardware stack error";
    CUDA_ERROR_ILLEGAL_INSTRUCTION = 715, "an illegal instruction was encountered";
    CUDA_ERROR_MISALIGNED_ADDRESS = 716, "misaligned address";
    CUDA_ERROR_INVALID_ADDRESS_SPACE = 717, "operation not supported on global/shared address space";
    CUDA_ERROR_INVALID_PC = 718, "invalid program counter";
    CUDA_ERROR_LAUNCH_FAILED = 719, "unspecified launch failure";
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720, "too many blocks in cooperative launch";
    CUDA_ERROR_NOT_PERMITTED = 800, "operation not permitted";
    CUDA_ERROR_NOT_SUPPORTED = 801, "operation not supported";
    CUDA_ERROR_SYSTEM_NOT_READY = 802, "system not yet initialized";
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803, "system has unsupported display driver / cuda driver combination";
    CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804, "forward compatibility was attempted on non supported HW";
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900, "operation not permitted when stream is capturing";
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901, "operation failed due to a previous error during capture";
    CUDA_ERROR_STREAM_CAPTURE_MERGE = 902, "operation would result in a merge of separate capture sequences";
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903, "capture was not ended in the same stream as it began";
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904, "capturing stream has unjoined work";
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905, "dependency created on uncaptured work in another stream";
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906, "operation would make the legacy stream depend on a capturing blocking stream";
    CUDA_ERROR_CAPTURED_EVENT = 907, "operation not permitted on an event last recorded in a capturing stream";
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908, "attempt to terminate a thread-local capture sequence from another thread";
    CUDA_ERROR_TIMEOUT = 909, "wait operation timed out";
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910, "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update";
    CUDA_ERROR_EXTERNAL_DEVICE = 911, "an external device encountered an error";
    CUDA_ERROR_INVALID_CLUSTER_SIZE = 912, "invalid cluster size";
    CUDA_ERROR_FUNCTION_NOT_LOADED = 913, "function not loaded";
    CUDA_ERROR_INVALID_RESOURCE_TYPE = 914, "invalid resource type";
    CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION = 915, "invalid resource configuration";
    CUDA_ERROR_KEY_ROTATION = 916, "error during key rotation";
    CUDA_ERROR_STREAM_DETACHED = 917, "stream is detached";
    CUDA_ERROR_UNKNOWN = 999, "unknown error";
}

/// The name of a `CUresult`, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
pub fn result_name(code: CuResult) -> Option<&'static str> {
    RESULTS.iter().find(|r| r.0 == code).map(|r| r.1)
}

/// The message of a `CUresult`, as `cuGetErrorString` gives it.
pub fn result_message(code: CuResult) -> Option<&'static str> {
    RESULTS.iter().find(|r| r.0 == code).map(|r| r.2)
}

/// A 16-byte device UUID as NVIDIA's tools write it (`nvidia-smi`, NVML): `GPU-` and the bytes
/// in lower-case hexadecimal, grouped 4-2-2-2-6.
pub fn gpu_uuid_text(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Whether an error poisons its context for good, as CUDA's "sticky" errors do:
/// every later call in that context returns the same code.
pub fn is_sticky(code: CuResult) -> bool {
    matches!(
        code,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_ASSERT
    )
}

/// `CUarray_format` values of the formats vgpu's arrays and textures hold.
pub mod array_format {
    /// `CU_AD_FORMAT_UNSIGNED_INT8`.
    pub const U8: u32 = 0x01;
    /// `CU_AD_FORMAT_UNSIGNED_INT16`.
    pub const U16: u32 = 0x02;
    /// `CU_AD_FORMAT_UNSIGNED_INT32`.
    pub const U32: u32 = 0x03;
    /// `CU_AD_FORMAT_SIGNED_INT8`.
    pub const S8: u32 = 0x08;
    /// `CU_AD_FORMAT_SIGNED_INT16`.
    pub const S16: u32 = 0x09;
    /// `CU_AD_FORMAT_SIGNED_INT32`.
    pub const S32: u32 = 0x0a;
    /// `CU_AD_FORMAT_HALF`.
    pub const F16: u32 = 0x10;
    /// `CU_AD_FORMAT_FLOAT`.
    pub const F32: u32 = 0x20;
}

/// Bytes of one channel of a `CUarray_format`; `None` for formats vgpu does not hold (packed,
/// block-compressed and video formats).
pub fn channel_bytes(format: u32) -> Option<u64> {
    use array_format::*;
    match format {
        U8 | S8 => Some(1),
        U16 | S16 | F16 => Some(2),
        U32 | S32 | F32 => Some(4),
        _ => None,
    }
}

/// Channels a texel may have.
pub const CHANNEL_COUNTS: [u32; 3] = [1, 2, 4];

/// Where the levels of a mipmapped array lie: one allocation, level after level, each level
/// starting at a multiple of `level_align` bytes from the first and laid out as an array is
/// (rows of texels `pitch_align`-aligned, slices or layers one after the other). The shim
/// places a mipmapped array's levels so, vgpud checks a texture over them so, and the device
/// samples them so.
pub mod mip {
    /// Most levels a mipmapped array can have: one per halving of a 2^28-texel axis, the
    /// largest any texture has, and the last level of one texel.
    pub const MAX_LEVELS: u32 = 29;
    /// Largest alignment of rows and levels (the device's texture alignments are 32 and 512
    /// bytes).
    pub const MAX_ALIGN: u64 = 1 << 16;

    /// The first level's texels: width, height (0 for one dimension), depth (0 for one or two
    /// dimensions; layers of a layered array, which every level keeps).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Shape {
        pub width: u64,
        pub height: u64,
        pub depth: u64,
        pub layered: bool,
        /// Bytes of one texel.
        pub texel_bytes: u64,
    }

    /// One level: its bytes' offset from the first level's first byte, its texels (as in
    /// [`Shape`]: 0 for an axis the array lacks) and its pitches.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Level {
        pub offset: u64,
        pub width: u64,
        pub height: u64,
        pub depth: u64,
        pub pitch: u64,
        pub slice_pitch: u64,
        /// Bytes from the level's first byte to the end of its last texel.
        pub bytes: u64,
    }

    /// Levels a mipmapped array of `shape` can have: until every axis (layers aside) is one
    /// texel.
    pub fn max_levels(shape: &Shape) -> u32 {
        let depth = if shape.layered { 0 } else { shape.depth };
        let longest = shape.width.max(shape.height).max(depth).max(1);
        64 - longest.leading_zeros()
    }

    /// The first `count` levels of `shape`, rows aligned to `pitch_align` bytes and levels to
    /// `level_align` (powers of two); `None` when `count` is 0 or more than the shape has, an
    /// alignment is not a power of two up to [`MAX_ALIGN`], or the sizes overflow.
    pub fn levels(
        shape: &Shape,
        count: u32,
        pitch_align: u64,
        level_align: u64,
    ) -> Option<Vec<Level>> {
        let aligned = |a: u64| a.is_power_of_two() && a <= MAX_ALIGN;
        if count == 0
            || count > max_levels(shape).min(MAX_LEVELS)
            || !aligned(pitch_align)
            || !aligned(level_align)
            || shape.width == 0
        {
            return None;
        }
        let half = |n: u64, l: u32| if n == 0 { 0 } else { (n >> l).max(1) };
        let mut out = Vec::with_capacity(count as usize);
        let mut offset = 0u64;
        for l in 0..count {
            let width = half(shape.width, l);
            let height = half(shape.height, l);
            let depth = if shape.layered {
                shape.depth
            } else {
                half(shape.depth, l)
            };
            let row = width.checked_mul(shape.texel_bytes)?;
            let pitch = row.checked_next_multiple_of(pitch_align)?;
            let slice_pitch = pitch.checked_mul(height.max(1))?;
            let bytes = slice_pitch.checked_mul(depth.max(1))?;
            out.push(Level {
                offset,
                width,
                height,
                depth,
                pitch,
                slice_pitch,
                bytes,
            });
            offset = offset
                .checked_add(bytes)?
                .checked_next_multiple_of(level_align)?;
        }
        Some(out)
    }

    /// Bytes of a mipmapped array of `levels` (the last level's end).
    pub fn chain_bytes(levels: &[Level]) -> u64 {
        levels.last().map_or(0, |l| l.offset + l.bytes)
    }
}

/// `CUDA_TEXTURE_DESC`: how a texture object samples (the guest's and the real driver's ABI).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TextureDesc {
    pub address_mode: [u32; 3],
    pub filter_mode: u32,
    pub flags: u32,
    pub max_anisotropy: u32,
    pub mipmap_filter_mode: u32,
    pub mipmap_level_bias: f32,
    pub min_mipmap_level_clamp: f32,
    pub max_mipmap_level_clamp: f32,
    pub border_color: [f32; 4],
    pub reserved: [i32; 12],
}

const _: () = {
    assert!(std::mem::size_of::<TextureDesc>() == 104);
    assert!(std::mem::offset_of!(TextureDesc, border_color) == 40);
};

/// `CUdevice_attribute` numbers (the ones vgpu reports; see `cuda.h`).
pub mod attr {
    #![allow(missing_docs)]
    pub const MAX_THREADS_PER_BLOCK: usize = 1;
    pub const MAX_BLOCK_DIM_X: usize = 2;
    pub const MAX_BLOCK_DIM_Y: usize = 3;
    pub const MAX_BLOCK_DIM_Z: usize = 4;
    pub const MAX_GRID_DIM_X: usize = 5;
    pub const MAX_GRID_DIM_Y: usize = 6;
    pub const MAX_GRID_DIM_Z: usize = 7;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: usize = 8;
    pub const TOTAL_CONSTANT_MEMORY: usize = 9;
    pub const WARP_SIZE: usize = 10;
    pub const MAX_PITCH: usize = 11;
    pub const MAX_REGISTERS_PER_BLOCK: usize = 12;
    pub const CLOCK_RATE: usize = 13;
    pub const TEXTURE_ALIGNMENT: usize = 14;
    pub const GPU_OVERLAP: usize = 15;
    pub const MULTIPROCESSOR_COUNT: usize = 16;
    pub const KERNEL_EXEC_TIMEOUT: usize = 17;
    pub const INTEGRATED: usize = 18;
    pub const CAN_MAP_HOST_MEMORY: usize = 19;
    pub const COMPUTE_MODE: usize = 20;
    pub const MAXIMUM_TEXTURE1D_WIDTH: usize = 21;
    pub const MAXIMUM_TEXTURE2D_WIDTH: usize = 22;
    pub const MAXIMUM_TEXTURE2D_HEIGHT: usize = 23;
    pub const MAXIMUM_TEXTURE3D_WIDTH: usize = 24;
    pub const MAXIMUM_TEXTURE3D_HEIGHT: usize = 25;
    pub const MAXIMUM_TEXTURE3D_DEPTH: usize = 26;
    pub const MAXIMUM_TEXTURE2D_LAYERED_WIDTH: usize = 27;
    pub const MAXIMUM_TEXTURE2D_LAYERED_HEIGHT: usize = 28;
    pub const MAXIMUM_TEXTURE2D_LAYERED_LAYERS: usize = 29;
    pub const SURFACE_ALIGNMENT: usize = 30;
    pub const CONCURRENT_KERNELS: usize = 31;
    pub const ECC_ENABLED: usize = 32;
    pub const PCI_BUS_ID: usize = 33;
    pub const PCI_DEVICE_ID: usize = 34;
    pub const TCC_DRIVER: usize = 35;
    pub const MEMORY_CLOCK_RATE: usize = 36;
    pub const GLOBAL_MEMORY_BUS_WIDTH: usize = 37;
    pub const L2_CACHE_SIZE: usize = 38;
    pub const MAX_THREADS_PER_MULTIPROCESSOR: usize = 39;
    pub const ASYNC_ENGINE_COUNT: usize = 40;
    pub const UNIFIED_ADDRESSING: usize = 41;
    pub const MAXIMUM_TEXTURE1D_LAYERED_WIDTH: usize = 42;
    pub const MAXIMUM_TEXTURE1D_LAYERED_LAYERS: usize = 43;
    pub const MAXIMUM_TEXTURE2D_GATHER_WIDTH: usize = 45;
    pub const MAXIMUM_TEXTURE2D_GATHER_HEIGHT: usize = 46;
    pub const PCI_DOMAIN_ID: usize = 50;
    pub const TEXTURE_PITCH_ALIGNMENT: usize = 51;
    pub const MAXIMUM_TEXTURECUBEMAP_WIDTH: usize = 52;
    pub const MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH: usize = 53;
    pub const MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS: usize = 54;
    pub const MAXIMUM_SURFACE1D_WIDTH: usize = 55;
    pub const MAXIMUM_SURFACE2D_WIDTH: usize = 56;
    pub const MAXIMUM_SURFACE2D_HEIGHT: usize = 57;
    pub const MAXIMUM_SURFACE3D_WIDTH: usize = 58;
    pub const MAXIMUM_SURFACE3D_HEIGHT: usize = 59;
    pub const MAXIMUM_SURFACE3D_DEPTH: usize = 60;
    pub const MAXIMUM_SURFACE1D_LAYERED_WIDTH: usize = 61;
    pub const MAXIMUM_SURFACE1D_LAYERED_LAYERS: usize = 62;
    pub const MAXIMUM_SURFACE2D_LAYERED_WIDTH: usize = 63;
    pub const MAXIMUM_SURFACE2D_LAYERED_HEIGHT: usize = 64;
    pub const MAXIMUM_SURFACE2D_LAYERED_LAYERS: usize = 65;
    pub const MAXIMUM_SURFACECUBEMAP_WIDTH: usize = 66;
    pub const MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH: usize = 67;
    pub const MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS: usize = 68;
    pub const MAXIMUM_TEXTURE1D_LINEAR_WIDTH: usize = 69;
    pub const MAXIMUM_TEXTURE2D_LINEAR_WIDTH: usize = 70;
    pub const MAXIMUM_TEXTURE2D_LINEAR_HEIGHT: usize = 71;
    pub const MAXIMUM_TEXTURE2D_LINEAR_PITCH: usize = 72;
    pub const MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH: usize = 73;
    pub const MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT: usize = 74;
    pub const COMPUTE_CAPABILITY_MAJOR: usize = 75;
    pub const COMPUTE_CAPABILITY_MINOR: usize = 76;
    pub const MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH: usize = 77;
    pub const STREAM_PRIORITIES_SUPPORTED: usize = 78;
    pub const GLOBAL_L1_CACHE_SUPPORTED: usize = 79;
    pub const LOCAL_L1_CACHE_SUPPORTED: usize = 80;
    pub const MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: usize = 81;
    pub const MAX_REGISTERS_PER_MULTIPROCESSOR: usize = 82;
    pub const MANAGED_MEMORY: usize = 83;
    pub const MULTI_GPU_BOARD: usize = 84;
    pub const HOST_NATIVE_ATOMIC_SUPPORTED: usize = 86;
    pub const SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: usize = 87;
    pub const PAGEABLE_MEMORY_ACCESS: usize = 88;
    pub const CONCURRENT_MANAGED_ACCESS: usize = 89;
    pub const COMPUTE_PREEMPTION_SUPPORTED: usize = 90;
    pub const CAN_USE_STREAM_MEM_OPS_V1: usize = 92;
    pub const CAN_USE_64_BIT_STREAM_MEM_OPS_V1: usize = 93;
    pub const CAN_USE_STREAM_WAIT_VALUE_NOR_V1: usize = 94;
    pub const COOPERATIVE_LAUNCH: usize = 95;
    pub const COOPERATIVE_MULTI_DEVICE_LAUNCH: usize = 96;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: usize = 97;
    pub const CAN_FLUSH_REMOTE_WRITES: usize = 98;
    pub const HOST_REGISTER_SUPPORTED: usize = 99;
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: usize = 102;
    pub const MAX_BLOCKS_PER_MULTIPROCESSOR: usize = 106;
    pub const MAX_ACCESS_POLICY_WINDOW_SIZE: usize = 109;
    pub const GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: usize = 110;
    pub const RESERVED_SHARED_MEMORY_PER_BLOCK: usize = 111;
    pub const SPARSE_CUDA_ARRAY_SUPPORTED: usize = 112;
    pub const TIMELINE_SEMAPHORE_INTEROP_SUPPORTED: usize = 114;
    pub const MEMORY_POOLS_SUPPORTED: usize = 115;
    pub const GPU_DIRECT_RDMA_SUPPORTED: usize = 116;
    pub const GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: usize = 117;
    pub const GPU_DIRECT_RDMA_WRITES_ORDERING: usize = 118;
    pub const CAN_USE_64_BIT_STREAM_MEM_OPS: usize = 122;
    pub const CAN_USE_STREAM_WAIT_VALUE_NOR: usize = 123;
    pub const DMA_BUF_SUPPORTED: usize = 124;
    pub const TENSOR_MAP_ACCESS_SUPPORTED: usize = 127;
    pub const HANDLE_TYPE_FABRIC_SUPPORTED: usize = 128;
    pub const MULTICAST_SUPPORTED: usize = 132;
    pub const HOST_NUMA_ID: usize = 134;
    pub const D3D12_CIG_SUPPORTED: usize = 135;
    pub const MEM_DECOMPRESS_ALGORITHM_MASK: usize = 136;
    pub const MEM_DECOMPRESS_MAXIMUM_LENGTH: usize = 137;
    pub const VULKAN_CIG_SUPPORTED: usize = 138;
    pub const GPU_PCI_DEVICE_ID: usize = 139;
    pub const TENSOR_MAP_LARGE_TENSOR_MIN_SIZE: usize = 160;
    /// One past the highest attribute number the protocol carries (CUDA 13's
    /// `cuda.h` defines up to 161; the CUDA 13 runtime asks for 139 at start).
    pub const COUNT: usize = 162;
    /// vgpu's own slot after CUDA's, in a `DeviceGetProperties` reply only (never answered by
    /// `cuDeviceGetAttribute`): 1 when the device runs PTX written for any architecture (the
    /// simulated GPU interprets whatever instructions it knows), so the guest keeps a fat
    /// binary's PTX for a newer GPU where it has none for this one. A reply without it (an older
    /// vgpud, a real GPU) means CUDA's rule: PTX up to the device's own architecture.
    pub const VGPU_ANY_PTX: usize = COUNT;
}

/// `CUlimit` numbers of the limits vgpud keeps for each process, and CUDA's values of the
/// device runtime's (dynamic parallelism's) limits.
pub mod limit {
    /// `CU_LIMIT_STACK_SIZE`.
    pub const STACK_SIZE: u32 = 0;
    /// `CU_LIMIT_PRINTF_FIFO_SIZE`.
    pub const PRINTF_FIFO_SIZE: u32 = 1;
    /// `CU_LIMIT_MALLOC_HEAP_SIZE`.
    pub const MALLOC_HEAP_SIZE: u32 = 2;
    /// `CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH`.
    pub const DEV_RUNTIME_SYNC_DEPTH: u32 = 3;
    /// `CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT`.
    pub const DEV_RUNTIME_PENDING_LAUNCH_COUNT: u32 = 4;
    /// One past the highest of those numbers.
    pub const COUNT: usize = 5;
    /// CUDA's sync depth until a program sets one: grids at depth 0 and 1 may wait.
    pub const DEFAULT_SYNC_DEPTH: u32 = 2;
    /// CUDA's pending launch count until a program sets one.
    pub const DEFAULT_PENDING_LAUNCH_COUNT: u32 = 2048;
    /// How deep grids nest (CUDA's 24 levels; the host's launch is depth 0), and so the most
    /// a sync depth means.
    pub const MAX_DEPTH: u32 = 24;
    /// The most vgpud lets a process set the pending launch count to: with their bookkeeping
    /// (under 100 bytes each beside their parameters) about 12 MiB of host memory per launch.
    pub const MAX_PENDING_LAUNCH_COUNT: u32 = 1 << 17;
}

/// `CUfunction_attribute` numbers.
pub mod func_attr {
    #![allow(missing_docs)]
    pub const MAX_THREADS_PER_BLOCK: usize = 0;
    pub const SHARED_SIZE_BYTES: usize = 1;
    pub const CONST_SIZE_BYTES: usize = 2;
    pub const LOCAL_SIZE_BYTES: usize = 3;
    pub const NUM_REGS: usize = 4;
    pub const PTX_VERSION: usize = 5;
    pub const BINARY_VERSION: usize = 6;
    pub const CACHE_MODE_CA: usize = 7;
    pub const MAX_DYNAMIC_SHARED_SIZE_BYTES: usize = 8;
    pub const PREFERRED_SHARED_MEMORY_CARVEOUT: usize = 9;
    /// One past the highest attribute number the protocol carries.
    pub const COUNT: usize = 16;
    /// vgpu's own slot after CUDA's, in a `ModuleGetFunction` reply's attributes only (never
    /// answered by `cuFuncGetAttribute`): 1 when the device cannot run the kernel (a cubin's on
    /// the simulated GPU), whose launches the guest then refuses at once with
    /// `CUDA_ERROR_NO_BINARY_FOR_GPU`, as CUDA refuses a kernel without an image. A reply without
    /// it (an older vgpud) means runnable.
    pub const VGPU_NO_BINARY: usize = 16;
}

/// Occupancy: how many blocks of `block_size` threads with `dyn_smem` bytes of dynamic shared
/// memory fit on one multiprocessor at once, from the device's attributes (`dev`, by
/// [`attr`] number) and the kernel's (`func`, by [`func_attr`] number), as
/// `cuOccupancyMaxActiveBlocksPerMultiprocessor` computes it. A cooperative launch may have
/// this many blocks per multiprocessor.
pub fn blocks_per_multiprocessor(
    dev: &dyn Fn(usize) -> i64,
    func: &dyn Fn(usize) -> i64,
    block_size: i64,
    dyn_smem: i64,
) -> i64 {
    if block_size <= 0 || block_size > func(func_attr::MAX_THREADS_PER_BLOCK) {
        return 0;
    }
    let warp = dev(attr::WARP_SIZE).max(1);
    let warps = (block_size + warp - 1) / warp;
    let by_threads = dev(attr::MAX_THREADS_PER_MULTIPROCESSOR) / (warps * warp);
    let regs = func(func_attr::NUM_REGS).max(1) * warps * warp;
    let by_regs = dev(attr::MAX_REGISTERS_PER_MULTIPROCESSOR) / regs.max(1);
    let smem = func(func_attr::SHARED_SIZE_BYTES)
        .saturating_add(dyn_smem)
        .saturating_add(dev(attr::RESERVED_SHARED_MEMORY_PER_BLOCK));
    let by_smem = if smem > 0 {
        dev(attr::MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) / smem
    } else {
        i64::MAX
    };
    by_threads
        .min(by_regs)
        .min(by_smem)
        .min(dev(attr::MAX_BLOCKS_PER_MULTIPROCESSOR))
        .max(0)
}

#[cfg(test)]
mod mip_tests {
    use super::mip::*;

    #[test]
    fn levels_halve_each_axis_and_keep_layers() {
        let shape = Shape {
            width: 10,
            height: 3,
            depth: 0,
            layered: false,
            texel_bytes: 4,
        };
        assert_eq!(max_levels(&shape), 4);
        let l = levels(&shape, 4, 32, 512).unwrap();
        let dims: Vec<_> = l.iter().map(|l| (l.width, l.height, l.depth)).collect();
        assert_eq!(dims, [(10, 3, 0), (5, 1, 0), (2, 1, 0), (1, 1, 0)]);
        assert_eq!(l[0].pitch, 64);
        assert_eq!(l[0].bytes, 192);
        assert_eq!(l[1].offset, 512);
        assert_eq!(l[3].offset, 1536);
        assert_eq!(chain_bytes(&l), 1536 + 32);
        let layered = Shape {
            depth: 6,
            layered: true,
            ..shape
        };
        let l = levels(&layered, 2, 32, 512).unwrap();
        assert_eq!((l[1].depth, l[1].slice_pitch, l[1].bytes), (6, 32, 192));
        let cube = Shape {
            width: 8,
            height: 8,
            depth: 16,
            layered: false,
            texel_bytes: 1,
        };
        assert_eq!(max_levels(&cube), 5);
        assert_eq!(levels(&cube, 5, 32, 512).unwrap()[4].depth, 1);
    }

    #[test]
    fn impossible_chains_are_none() {
        let shape = Shape {
            width: 8,
            height: 0,
            depth: 0,
            layered: false,
            texel_bytes: 16,
        };
        assert!(levels(&shape, 0, 32, 512).is_none());
        assert!(levels(&shape, 5, 32, 512).is_none());
        assert!(levels(&shape, 4, 24, 512).is_none());
        assert!(levels(&shape, 4, 32, MAX_ALIGN * 2).is_none());
        let huge = Shape {
            width: u64::MAX / 2,
            height: u64::MAX / 2,
            ..shape
        };
        assert!(levels(&huge, 2, 32, 512).is_none());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_messages_match_cuda_h() {
        assert_eq!(result_name(2), Some("CUDA_ERROR_OUT_OF_MEMORY"));
        assert_eq!(
            result_message(700),
            Some("an illegal memory access was encountered")
        );
        assert_eq!(result_name(12345), None);
    }

    #[test]
    fn gpu_uuids_look_like_nvidia_smi() {
        let u = [
            0x12u8, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8,
        ];
        assert_eq!(
            gpu_uuid_text(&u),
            "GPU-12345678-9abc-def0-0102-030405060708"
        );
    }

    #[test]
    fn result_values_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for (v, name, _) in RESULTS {
            assert!(seen.insert(*v), "duplicate value for {name}");
        }
    }

    #[test]
    fn kernel_faults_are_sticky_but_user_errors_are_not() {
        assert!(is_sticky(CUDA_ERROR_ILLEGAL_ADDRESS));
        assert!(is_sticky(CUDA_ERROR_LAUNCH_FAILED));
        assert!(!is_sticky(CUDA_ERROR_INVALID_VALUE));
        assert!(!is_sticky(CUDA_ERROR_OUT_OF_MEMORY));
    }
}

/// Stream memory operations (`cuStreamWaitValue32`, `cuStreamWriteValue64`,
/// `cuStreamBatchMemOp`, …): CUDA's operation types and flags, and what they mean.
pub mod mem_op {
    /// `CU_STREAM_MEM_OP_WAIT_VALUE_32`.
    pub const WAIT_VALUE_32: u32 = 1;
    /// `CU_STREAM_MEM_OP_WRITE_VALUE_32`.
    pub const WRITE_VALUE_32: u32 = 2;
    /// `CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES`.
    pub const FLUSH_REMOTE_WRITES: u32 = 3;
    /// `CU_STREAM_MEM_OP_WAIT_VALUE_64`.
    pub const WAIT_VALUE_64: u32 = 4;
    /// `CU_STREAM_MEM_OP_WRITE_VALUE_64`.
    pub const WRITE_VALUE_64: u32 = 5;
    /// `CU_STREAM_MEM_OP_BARRIER`.
    pub const BARRIER: u32 = 6;

    /// `CU_STREAM_WAIT_VALUE_GEQ`: until `(int)(*addr - value) >= 0`.
    pub const WAIT_GEQ: u32 = 0;
    /// `CU_STREAM_WAIT_VALUE_EQ`: until `*addr == value`.
    pub const WAIT_EQ: u32 = 1;
    /// `CU_STREAM_WAIT_VALUE_AND`: until `(*addr & value) != 0`.
    pub const WAIT_AND: u32 = 2;
    /// `CU_STREAM_WAIT_VALUE_NOR`: until `~(*addr | value) != 0`.
    pub const WAIT_NOR: u32 = 3;
    /// The bits of a wait's flags that name its condition.
    pub const WAIT_CONDITION_MASK: u32 = 3;
    /// `CU_STREAM_WAIT_VALUE_FLUSH`: flush remote writes after the wait (needs
    /// `CAN_FLUSH_REMOTE_WRITES`, which vgpu reports as 0: there are no remote writers).
    pub const WAIT_FLUSH: u32 = 1 << 30;
    /// `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER`.
    pub const WRITE_NO_MEMORY_BARRIER: u32 = 1;
    /// `CU_STREAM_MEMORY_BARRIER_TYPE_SYS` and `_GPU`: the barrier's flags.
    pub const BARRIER_TYPES: [u32; 2] = [0, 1];
    /// `cuStreamBatchMemOp`: "the number of operations in the array. Must be less than 256".
    pub const MAX_BATCH: u32 = 255;

    /// What an operation that reaches a stream does.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Kind {
        /// Stops the stream until the word meets the condition (one of the `WAIT_*` values).
        Wait {
            /// 4 or 8 bytes.
            width: u32,
            /// `WAIT_GEQ`, `WAIT_EQ`, `WAIT_AND` or `WAIT_NOR`.
            condition: u32,
        },
        /// Stores the low `width` bytes of the value.
        Write {
            /// 4 or 8 bytes.
            width: u32,
        },
        /// Nothing to do here: a memory barrier (the stream's work is already ordered).
        Barrier,
    }

    impl Kind {
        /// The bytes a write or a wait touches; `None` for a barrier.
        pub fn width(self) -> Option<u32> {
            match self {
                Kind::Barrier => None,
                Kind::Write { width } | Kind::Wait { width, .. } => Some(width),
            }
        }
    }

    /// [`kind`] of an operation on the word at `addr`, which must be aligned to the
    /// operation's width (`CUDA_ERROR_INVALID_VALUE`), as CUDA checks it.
    pub fn kind_at(op: u32, flags: u32, addr: u64) -> Result<Kind, (super::CuResult, String)> {
        let kind = kind(op, flags).map_err(|(code, why)| (code, why.to_string()))?;
        if let Some(width) = kind.width()
            && !addr.is_multiple_of(u64::from(width))
        {
            return Err((
                super::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "a {}-bit stream memory operation's address {addr:#x} is not aligned to \
                     {width} bytes",
                    width * 8
                ),
            ));
        }
        Ok(kind)
    }

    /// The kind of operation `op` with `flags`, or why CUDA refuses it
    /// (`CUDA_ERROR_INVALID_VALUE`; a flush: `CUDA_ERROR_NOT_SUPPORTED`, see [`WAIT_FLUSH`]).
    pub fn kind(op: u32, flags: u32) -> Result<Kind, (super::CuResult, &'static str)> {
        let invalid = |why| Err((super::CUDA_ERROR_INVALID_VALUE, why));
        let flush = (
            super::CUDA_ERROR_NOT_SUPPORTED,
            "flushing remote writes is not supported (CAN_FLUSH_REMOTE_WRITES is 0)",
        );
        match op {
            WAIT_VALUE_32 | WAIT_VALUE_64 => {
                if flags & WAIT_FLUSH != 0 {
                    return Err(flush);
                }
                if flags & !WAIT_CONDITION_MASK != 0 {
                    return invalid("unknown flags of a wait");
                }
                Ok(Kind::Wait {
                    width: if op == WAIT_VALUE_32 { 4 } else { 8 },
                    condition: flags,
                })
            }
            WRITE_VALUE_32 | WRITE_VALUE_64 => {
                if flags & !WRITE_NO_MEMORY_BARRIER != 0 {
                    return invalid("unknown flags of a write");
                }
                Ok(Kind::Write {
                    width: if op == WRITE_VALUE_32 { 4 } else { 8 },
                })
            }
            BARRIER if BARRIER_TYPES.contains(&flags) => Ok(Kind::Barrier),
            BARRIER => invalid("unknown memory barrier type"),
            FLUSH_REMOTE_WRITES => Err(flush),
            _ => invalid("unknown stream memory operation"),
        }
    }

    /// Whether `word` (the `width` bytes at the wait's address) meets `condition` for `value`
    /// (of which a 32-bit wait uses the low half), as CUDA defines each.
    pub fn met(condition: u32, width: u32, word: u64, value: u64) -> bool {
        let mask = if width == 4 {
            u64::from(u32::MAX)
        } else {
            u64::MAX
        };
        let (word, value, sign) = (word & mask, value & mask, (mask >> 1) + 1);
        match condition {
            // `(int32_t)(*addr - value) >= 0`: the difference, wrapped, has its sign bit clear.
            WAIT_GEQ => word.wrapping_sub(value) & mask & sign == 0,
            WAIT_EQ => word == value,
            WAIT_AND => word & value != 0,
            WAIT_NOR => !(word | value) & mask != 0,
            _ => false,
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn conditions_are_cudas() {
            // GEQ is cyclic: a counter that wrapped past the value still meets it.
            assert!(met(WAIT_GEQ, 4, 5, 5));
            assert!(met(WAIT_GEQ, 4, 6, 5));
            assert!(!met(WAIT_GEQ, 4, 4, 5));
            assert!(met(WAIT_GEQ, 4, 2, 0xffff_fff0));
            assert!(!met(WAIT_GEQ, 4, 0xffff_fff0, 2));
            assert!(met(WAIT_GEQ, 8, 1 << 40, 1 << 39));
            assert!(!met(WAIT_GEQ, 8, 1 << 39, 1 << 40));
            // A 32-bit wait looks at the low half of its value only.
            assert!(met(WAIT_EQ, 4, 7, 0x1_0000_0007));
            assert!(!met(WAIT_EQ, 8, 7, 0x1_0000_0007));
            assert!(met(WAIT_AND, 4, 0b0110, 0b0100));
            assert!(!met(WAIT_AND, 4, 0b0110, 0b1001));
            assert!(met(WAIT_NOR, 4, 0xffff_0000, 0x0000_fff0));
            assert!(!met(WAIT_NOR, 4, 0xffff_0000, 0x0000_ffff));
            assert!(!met(WAIT_NOR, 8, u64::MAX, 0));
        }

        #[test]
        fn kinds_and_refusals() {
            assert_eq!(
                kind(WAIT_VALUE_64, WAIT_NOR),
                Ok(Kind::Wait {
                    width: 8,
                    condition: WAIT_NOR
                })
            );
            assert_eq!(
                kind(WRITE_VALUE_32, WRITE_NO_MEMORY_BARRIER),
                Ok(Kind::Write { width: 4 })
            );
            assert_eq!(kind(BARRIER, 1), Ok(Kind::Barrier));
            let code = |r: Result<Kind, (super::super::CuResult, &str)>| r.unwrap_err().0;
            assert_eq!(
                code(kind(WAIT_VALUE_32, 4)),
                super::super::CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(
                code(kind(WRITE_VALUE_64, 2)),
                super::super::CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(
                code(kind(BARRIER, 2)),
                super::super::CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(code(kind(0, 0)), super::super::CUDA_ERROR_INVALID_VALUE);
            assert_eq!(code(kind(7, 0)), super::super::CUDA_ERROR_INVALID_VALUE);
            assert_eq!(
                code(kind(WAIT_VALUE_32, WAIT_FLUSH)),
                super::super::CUDA_ERROR_NOT_SUPPORTED
            );
            assert_eq!(
                code(kind(FLUSH_REMOTE_WRITES, 0)),
                super::super::CUDA_ERROR_NOT_SUPPORTED
            );
        }
    }
}
