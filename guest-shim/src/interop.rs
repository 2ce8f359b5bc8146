//! Interoperability with other APIs: OpenGL, EGL and VDPAU objects (graphics resources), and
//! memory and semaphores exported by Vulkan, Direct3D or NvSci (external memory and semaphores).
//!
//! A VM's GPU does not draw: the guest's graphics stack (virtio-gpu, a software renderer) runs on
//! another device, and no API in the guest exports memory or semaphores of vgpu's device. These
//! entry points exist so that a program linked against them loads and runs its other paths, and
//! they answer as CUDA does on a machine whose display is not on a CUDA device:
//! - which CUDA devices run a graphics context or device (`cuGLGetDevices`, `cuVDPAUGetDevice`):
//!   none, `CUDA_ERROR_NO_DEVICE`;
//! - registering an OpenGL buffer or image: `CUDA_ERROR_INVALID_GRAPHICS_CONTEXT`; EGL images
//!   and streams, EGL syncs and VDPAU surfaces: `CUDA_ERROR_NOT_SUPPORTED`;
//! - importing external memory or a semaphore: `CUDA_ERROR_NOT_SUPPORTED` once the descriptor's
//!   handle type is checked;
//! - anything on a graphics resource, an EGL stream connection, an external memory or an external
//!   semaphore: none can exist, so every handle is `CUDA_ERROR_INVALID_HANDLE` (a graph node is
//!   never an external semaphore node: `CUDA_ERROR_INVALID_VALUE`, CUDA's answer for a node of
//!   another type).
//!
//! docs/compatibility.md lists them.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_int, c_uint, c_void};

use vgpu_proto::cuda;

use crate::driver::{self as drv, CuRes};
use crate::exports::{CUdevice, CUdeviceptr, CUhandle};
use crate::ffi::{CUresult, ffi};

/// `CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD` .. `CU_EXTERNAL_MEMORY_HANDLE_TYPE_NVSCIBUF`.
const EXTERNAL_MEMORY_TYPES: std::ops::RangeInclusive<c_uint> = 1..=8;
/// `CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD` ..
/// `CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_WIN32`.
const EXTERNAL_SEMAPHORE_TYPES: std::ops::RangeInclusive<c_uint> = 1..=10;

/// Checks that the driver is initialized (as every entry point does first), then answers `code`
/// with the reason in the debug log.
fn refuse(what: &str, why: &str, code: CUresult) -> CuRes<()> {
    drv::driver()?;
    crate::debug!("{what}: {why}");
    Err(code)
}

/// A graphics object: it lives on the guest's display device, which is not vgpu's.
fn not_ours(what: &str, code: CUresult) -> CuRes<()> {
    refuse(
        what,
        "the guest's graphics objects are not on vgpu's device",
        code,
    )
}

/// A handle of a kind no call can make.
fn no_such_handle(what: &str) -> CuRes<()> {
    refuse(
        what,
        "no such object exists in a VM (interop is not offered)",
        cuda::CUDA_ERROR_INVALID_HANDLE,
    )
}

/// A required out-pointer or input.
fn required<T>(p: *const T) -> CuRes<()> {
    if p.is_null() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

// ---- OpenGL (cudaGL.h) ---------------------------------------------------------------------

/// `cuGLGetDevices`: the CUDA devices of the current OpenGL context, none in a VM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGLGetDevices_v2(
    count: *mut c_uint,
    _devices: *mut CUdevice,
    _capacity: c_uint,
    _list: c_int,
) -> CUresult {
    ffi("cuGLGetDevices_v2", || {
        required(count)?;
        drv::driver()?;
        crate::out!(count, 0)?;
        not_ours("cuGLGetDevices", cuda::CUDA_ERROR_NO_DEVICE)
    })
}

/// `cuGLGetDevices` as CUDA 4.1 to 6.0 named it, with the same arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGLGetDevices(
    count: *mut c_uint,
    devices: *mut CUdevice,
    capacity: c_uint,
    list: c_int,
) -> CUresult {
    // SAFETY: the same contract as cuGLGetDevices_v2's.
    unsafe { cuGLGetDevices_v2(count, devices, capacity, list) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphicsGLRegisterBuffer(
    resource: *mut CUhandle,
    _buffer: c_uint,
    _flags: c_uint,
) -> CUresult {
    ffi("cuGraphicsGLRegisterBuffer", || {
        required(resource)?;
        not_ours(
            "cuGraphicsGLRegisterBuffer",
            cuda::CUDA_ERROR_INVALID_GRAPHICS_CONTEXT,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphicsGLRegisterImage(
    resource: *mut CUhandle,
    _image: c_uint,
    _target: c_uint,
    _flags: c_uint,
) -> CUresult {
    ffi("cuGraphicsGLRegisterImage", || {
        required(resource)?;
        not_ours(
            "cuGraphicsGLRegisterImage",
            cuda::CUDA_ERROR_INVALID_GRAPHICS_CONTEXT,
        )
    })
}

/// `cuGLCtxCreate` (deprecated since CUDA 5.0): a context needs no OpenGL association, so this
/// is `cuCtxCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGLCtxCreate_v2(
    ctx: *mut CUhandle,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the same contract as cuCtxCreate_v2's.
    unsafe { crate::exports::cuCtxCreate_v2(ctx, flags, dev) }
}

/// `cuGLInit` (deprecated since CUDA 3.0): there is nothing to set up beyond `cuInit`.
#[unsafe(no_mangle)]
pub extern "C" fn cuGLInit() -> CUresult {
    ffi("cuGLInit", || drv::driver().map(drop))
}

/// `cuGLRegisterBufferObject` (deprecated since CUDA 3.0).
#[unsafe(no_mangle)]
pub extern "C" fn cuGLRegisterBufferObject(_buffer: c_uint) -> CUresult {
    ffi("cuGLRegisterBufferObject", || {
        not_ours(
            "cuGLRegisterBufferObject",
            cuda::CUDA_ERROR_INVALID_GRAPHICS_CONTEXT,
        )
    })
}

/// `cuGLMapBufferObject` (deprecated): no buffer object is registered.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGLMapBufferObject_v2(
    _ptr: *mut CUdeviceptr,
    _size: *mut usize,
    _buffer: c_uint,
) -> CUresult {
    ffi("cuGLMapBufferObject_v2", || {
        no_such_handle("cuGLMapBufferObject")
    })
}

/// `cuGLMapBufferObjectAsync` (deprecated): no buffer object is registered.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGLMapBufferObjectAsync_v2(
    _ptr: *mut CUdeviceptr,
    _size: *mut usize,
    _buffer: c_uint,
    _stream: CUhandle,
) -> CUresult {
    ffi("cuGLMapBufferObjectAsync_v2", || {
        no_such_handle("cuGLMapBufferObjectAsync")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGLUnmapBufferObject(_buffer: c_uint) -> CUresult {
    ffi("cuGLUnmapBufferObject", || {
        no_such_handle("cuGLUnmapBufferObject")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGLUnmapBufferObjectAsync(_buffer: c_uint, _stream: CUhandle) -> CUresult {
    ffi("cuGLUnmapBufferObjectAsync", || {
        no_such_handle("cuGLUnmapBufferObjectAsync")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGLUnregisterBufferObject(_buffer: c_uint) -> CUresult {
    ffi("cuGLUnregisterBufferObject", || {
        no_such_handle("cuGLUnregisterBufferObject")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGLSetBufferObjectMapFlags(_buffer: c_uint, _flags: c_uint) -> CUresult {
    ffi("cuGLSetBufferObjectMapFlags", || {
        no_such_handle("cuGLSetBufferObjectMapFlags")
    })
}

// ---- graphics resources (cuda.h) -----------------------------------------------------------

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphicsUnregisterResource(_resource: CUhandle) -> CUresult {
    ffi("cuGraphicsUnregisterResource", || {
        no_such_handle("cuGraphicsUnregisterResource")
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphicsSubResourceGetMappedArray(
    array: *mut CUhandle,
    _resource: CUhandle,
    _index: c_uint,
    _level: c_uint,
) -> CUresult {
    ffi("cuGraphicsSubResourceGetMappedArray", || {
        required(array)?;
        no_such_handle("cuGraphicsSubResourceGetMappedArray")
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphicsResourceGetMappedMipmappedArray(
    array: *mut CUhandle,
    _resource: CUhandle,
) -> CUresult {
    ffi("cuGraphicsResourceGetMappedMipmappedArray", || {
        required(array)?;
        no_such_handle("cuGraphicsResourceGetMappedMipmappedArray")
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphicsResourceGetMappedPointer_v2(
    ptr: *mut CUdeviceptr,
    _size: *mut usize,
    _resource: CUhandle,
) -> CUresult {
    ffi("cuGraphicsResourceGetMappedPointer_v2", || {
        required(ptr)?;
        no_such_handle("cuGraphicsResourceGetMappedPointer")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphicsResourceSetMapFlags_v2(
    _resource: CUhandle,
    _flags: c_uint,
) -> CUresult {
    ffi("cuGraphicsResourceSetMapFlags_v2", || {
        no_such_handle("cuGraphicsResourceSetMapFlags")
    })
}

/// `cuGraphicsResourceSetMapFlags` as CUDA 3.0 to 6.0 named it, with the same arguments.
#[unsafe(no_mangle)]
pub extern "C" fn cuGraphicsResourceSetMapFlags(resource: CUhandle, flags: c_uint) -> CUresult {
    cuGraphicsResourceSetMapFlags_v2(resource, flags)
}

/// Maps or unmaps `count` resources: none exists.
fn map_resources(what: &str, count: c_uint, resources: *mut CUhandle) -> CuRes<()> {
    if count == 0 || resources.is_null() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    no_such_handle(what)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphicsMapResources(
    count: c_uint,
    resources: *mut CUhandle,
    _stream: CUhandle,
) -> CUresult {
    ffi("cuGraphicsMapResources", || {
        map_resources("cuGraphicsMapResources", count, resources)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphicsUnmapResources(
    count: c_uint,
    resources: *mut CUhandle,
    _stream: CUhandle,
) -> CUresult {
    ffi("cuGraphicsUnmapResources", || {
        map_resources("cuGraphicsUnmapResources", count, resources)
    })
}

// ---- EGL (cudaEGL.h) -----------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphicsEGLRegisterImage(
    resource: *mut CUhandle,
    _image: *mut c_void,
    _flags: c_uint,
) -> CUresult {
    ffi("cuGraphicsEGLRegisterImage", || {
        required(resource)?;
        not_ours("cuGraphicsEGLRegisterImage", cuda::CUDA_ERROR_NOT_SUPPORTED)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphicsResourceGetMappedEglFrame(
    frame: *mut c_void,
    _resource: CUhandle,
    _index: c_uint,
    _level: c_uint,
) -> CUresult {
    ffi("cuGraphicsResourceGetMappedEglFrame", || {
        required(frame)?;
        no_such_handle("cuGraphicsResourceGetMappedEglFrame")
    })
}

/// Connects to an EGL stream: streams belong to the guest's EGL display.
fn egl_connect(what: &str, connection: *mut CUhandle) -> CuRes<()> {
    required(connection)?;
    not_ours(what, cuda::CUDA_ERROR_NOT_SUPPORTED)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEGLStreamConsumerConnect(
    connection: *mut CUhandle,
    _stream: *mut c_void,
) -> CUresult {
    ffi("cuEGLStreamConsumerConnect", || {
        egl_connect("cuEGLStreamConsumerConnect", connection)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEGLStreamConsumerConnectWithFlags(
    connection: *mut CUhandle,
    _stream: *mut c_void,
    _flags: c_uint,
) -> CUresult {
    ffi("cuEGLStreamConsumerConnectWithFlags", || {
        egl_connect("cuEGLStreamConsumerConnectWithFlags", connection)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEGLStreamProducerConnect(
    connection: *mut CUhandle,
    _stream: *mut c_void,
    _width: c_int,
    _height: c_int,
) -> CUresult {
    ffi("cuEGLStreamProducerConnect", || {
        egl_connect("cuEGLStreamProducerConnect", connection)
    })
}

/// Generates entry points that take an EGL stream connection first: none is ever connected.
macro_rules! on_connection {
    ($($name:ident($($arg:ident: $t:ty),*);)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: no EGL stream connection exists.")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(connection: *mut CUhandle, $($arg: $t),*) -> CUresult {
            $(let _ = $arg;)*
            ffi(stringify!($name), || {
                required(connection)?;
                no_such_handle(stringify!($name))
            })
        }
    )*};
}

on_connection! {
    cuEGLStreamConsumerDisconnect();
    cuEGLStreamConsumerAcquireFrame(resource: *mut CUhandle, stream: *mut CUhandle, timeout: c_uint);
    cuEGLStreamConsumerReleaseFrame(resource: CUhandle, stream: *mut CUhandle);
    cuEGLStreamProducerDisconnect();
    cuEGLStreamProducerReturnFrame(frame: *mut c_void, stream: *mut CUhandle);
}

/// `CUeglFrame`: a frame of up to three planes, passed by value to
/// `cuEGLStreamProducerPresentFrame`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EglFrame {
    planes: [*mut c_void; 3],
    width: c_uint,
    height: c_uint,
    depth: c_uint,
    pitch: c_uint,
    plane_count: c_uint,
    num_channels: c_uint,
    frame_type: c_uint,
    color_format: c_uint,
    cu_format: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEGLStreamProducerPresentFrame(
    connection: *mut CUhandle,
    _frame: EglFrame,
    _stream: *mut CUhandle,
) -> CUresult {
    ffi("cuEGLStreamProducerPresentFrame", || {
        required(connection)?;
        no_such_handle("cuEGLStreamProducerPresentFrame")
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreateFromEGLSync(
    event: *mut CUhandle,
    _sync: *mut c_void,
    _flags: c_uint,
) -> CUresult {
    ffi("cuEventCreateFromEGLSync", || {
        required(event)?;
        not_ours("cuEventCreateFromEGLSync", cuda::CUDA_ERROR_NOT_SUPPORTED)
    })
}

// ---- VDPAU (cudaVDPAU.h) -------------------------------------------------------------------

/// `cuVDPAUGetDevice`: the CUDA device of a VDPAU device, none in a VM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuVDPAUGetDevice(
    device: *mut CUdevice,
    _vdp_device: c_uint,
    _get_proc_address: *mut c_void,
) -> CUresult {
    ffi("cuVDPAUGetDevice", || {
        required(device)?;
        not_ours("cuVDPAUGetDevice", cuda::CUDA_ERROR_NO_DEVICE)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuVDPAUCtxCreate_v2(
    ctx: *mut CUhandle,
    _flags: c_uint,
    _device: CUdevice,
    _vdp_device: c_uint,
    _get_proc_address: *mut c_void,
) -> CUresult {
    ffi("cuVDPAUCtxCreate_v2", || {
        required(ctx)?;
        not_ours("cuVDPAUCtxCreate", cuda::CUDA_ERROR_NOT_SUPPORTED)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphicsVDPAURegisterVideoSurface(
    resource: *mut CUhandle,
    _surface: c_uint,
    _flags: c_uint,
) -> CUresult {
    ffi("cuGraphicsVDPAURegisterVideoSurface", || {
        required(resource)?;
        not_ours(
            "cuGraphicsVDPAURegisterVideoSurface",
            cuda::CUDA_ERROR_NOT_SUPPORTED,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphicsVDPAURegisterOutputSurface(
    resource: *mut CUhandle,
    _surface: c_uint,
    _flags: c_uint,
) -> CUresult {
    ffi("cuGraphicsVDPAURegisterOutputSurface", || {
        required(resource)?;
        not_ours(
            "cuGraphicsVDPAURegisterOutputSurface",
            cuda::CUDA_ERROR_NOT_SUPPORTED,
        )
    })
}

// ---- external memory and semaphores (cuda.h) -----------------------------------------------

/// Checks an import's out-pointer and its descriptor's handle type (the descriptor's first
/// member), then refuses: nothing in the guest exports vgpu's device memory or semaphores.
fn import(
    what: &str,
    out: *mut CUhandle,
    desc: *const c_uint,
    types: std::ops::RangeInclusive<c_uint>,
) -> CuRes<()> {
    required(out)?;
    required(desc)?;
    // SAFETY: a non-NULL descriptor, whose first member is its handle type (CUDA contract).
    let handle_type = unsafe { desc.read_unaligned() };
    if !types.contains(&handle_type) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    refuse(
        what,
        "no API in the guest exports memory or semaphores of vgpu's device",
        cuda::CUDA_ERROR_NOT_SUPPORTED,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuImportExternalMemory(
    memory: *mut CUhandle,
    desc: *const c_void,
) -> CUresult {
    ffi("cuImportExternalMemory", || {
        import(
            "cuImportExternalMemory",
            memory,
            desc.cast(),
            EXTERNAL_MEMORY_TYPES,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuImportExternalSemaphore(
    semaphore: *mut CUhandle,
    desc: *const c_void,
) -> CUresult {
    ffi("cuImportExternalSemaphore", || {
        import(
            "cuImportExternalSemaphore",
            semaphore,
            desc.cast(),
            EXTERNAL_SEMAPHORE_TYPES,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuExternalMemoryGetMappedBuffer(
    ptr: *mut CUdeviceptr,
    _memory: CUhandle,
    desc: *const c_void,
) -> CUresult {
    ffi("cuExternalMemoryGetMappedBuffer", || {
        required(ptr)?;
        required(desc)?;
        no_such_handle("cuExternalMemoryGetMappedBuffer")
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuExternalMemoryGetMappedMipmappedArray(
    array: *mut CUhandle,
    _memory: CUhandle,
    desc: *const c_void,
) -> CUresult {
    ffi("cuExternalMemoryGetMappedMipmappedArray", || {
        required(array)?;
        required(desc)?;
        no_such_handle("cuExternalMemoryGetMappedMipmappedArray")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDestroyExternalMemory(_memory: CUhandle) -> CUresult {
    ffi("cuDestroyExternalMemory", || {
        no_such_handle("cuDestroyExternalMemory")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDestroyExternalSemaphore(_semaphore: CUhandle) -> CUresult {
    ffi("cuDestroyExternalSemaphore", || {
        no_such_handle("cuDestroyExternalSemaphore")
    })
}

/// Signals or waits on `count` semaphores: none exists (an empty list has nothing to do).
fn on_semaphores(
    what: &str,
    semaphores: *const CUhandle,
    params: *const c_void,
    count: c_uint,
) -> CuRes<()> {
    drv::driver()?;
    if count == 0 {
        return Ok(());
    }
    required(semaphores)?;
    required(params)?;
    no_such_handle(what)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuSignalExternalSemaphoresAsync(
    semaphores: *const CUhandle,
    params: *const c_void,
    count: c_uint,
    _stream: CUhandle,
) -> CUresult {
    ffi("cuSignalExternalSemaphoresAsync", || {
        on_semaphores("cuSignalExternalSemaphoresAsync", semaphores, params, count)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuWaitExternalSemaphoresAsync(
    semaphores: *const CUhandle,
    params: *const c_void,
    count: c_uint,
    _stream: CUhandle,
) -> CUresult {
    ffi("cuWaitExternalSemaphoresAsync", || {
        on_semaphores("cuWaitExternalSemaphoresAsync", semaphores, params, count)
    })
}

/// `CUDA_EXT_SEM_SIGNAL_NODE_PARAMS` and `CUDA_EXT_SEM_WAIT_NODE_PARAMS`.
#[repr(C)]
pub struct SemaphoreNodeParams {
    semaphores: *const CUhandle,
    params: *const c_void,
    count: c_uint,
}

/// Adds an external semaphore node: its semaphores cannot exist.
fn add_semaphore_node(
    what: &str,
    node: *mut CUhandle,
    params: *const SemaphoreNodeParams,
) -> CuRes<()> {
    required(node)?;
    // SAFETY: the caller's node parameters when non-NULL (CUDA contract); `as_ref` handles NULL.
    let p = unsafe { params.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    if p.count == 0 || p.semaphores.is_null() || p.params.is_null() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    no_such_handle(what)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddExternalSemaphoresSignalNode(
    node: *mut CUhandle,
    _graph: CUhandle,
    _dependencies: *const CUhandle,
    _count: usize,
    params: *const SemaphoreNodeParams,
) -> CUresult {
    ffi("cuGraphAddExternalSemaphoresSignalNode", || {
        add_semaphore_node("cuGraphAddExternalSemaphoresSignalNode", node, params)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddExternalSemaphoresWaitNode(
    node: *mut CUhandle,
    _graph: CUhandle,
    _dependencies: *const CUhandle,
    _count: usize,
    params: *const SemaphoreNodeParams,
) -> CUresult {
    ffi("cuGraphAddExternalSemaphoresWaitNode", || {
        add_semaphore_node("cuGraphAddExternalSemaphoresWaitNode", node, params)
    })
}

/// Generates the parameter accessors of external semaphore nodes: no node is one.
macro_rules! semaphore_node_params {
    ($($name:ident($($arg:ident: $t:ty),*);)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: no graph node is an external semaphore node.")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $t),*, params: *const c_void) -> CUresult {
            $(let _ = $arg;)*
            ffi(stringify!($name), || {
                required(params)?;
                refuse(
                    stringify!($name),
                    "no graph node is an external semaphore node",
                    cuda::CUDA_ERROR_INVALID_VALUE,
                )
            })
        }
    )*};
}

semaphore_node_params! {
    cuGraphExternalSemaphoresSignalNodeGetParams(node: CUhandle);
    cuGraphExternalSemaphoresSignalNodeSetParams(node: CUhandle);
    cuGraphExternalSemaphoresWaitNodeGetParams(node: CUhandle);
    cuGraphExternalSemaphoresWaitNodeSetParams(node: CUhandle);
    cuGraphExecExternalSemaphoresSignalNodeSetParams(exec: CUhandle, node: CUhandle);
    cuGraphExecExternalSemaphoresWaitNodeSetParams(exec: CUhandle, node: CUhandle);
}
