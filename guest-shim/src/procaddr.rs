//! `cuGetProcAddress`: driver functions by base name and CUDA version.
//!
//! Callers (cuda-python, the CUDA runtime) ask for a base name such as
//! `cuMemAlloc` with the CUDA version whose ABI they were built for; the
//! answer is the newest variant introduced at or before that version
//! (`cuMemAlloc_v2` for 3020 and later). A variant vgpu does not implement
//! is reported as not found rather than answered with an older ABI.

use std::ffi::c_void;

use crate::alloc_exports::*;
use crate::arrays::*;
use crate::compat::*;
use crate::copies::*;
use crate::exec_affinity::*;
use crate::exports::*;
use crate::graph::api::*;
use crate::graph::attrs::*;
use crate::graph::conditional::*;
use crate::graph::generic::*;
use crate::green_ctx::*;
use crate::interop::*;
use crate::legacy_launch::*;
use crate::library::*;
use crate::linker::*;
use crate::mem_ops::*;
use crate::not_supported::*;
use crate::peer::*;
use crate::pointer::*;
use crate::stream_capture::*;
use crate::texrefs::*;
use crate::textures::*;
use crate::user_objects::*;

/// The answer to a lookup.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The function.
    Found(*mut c_void),
    /// The symbol exists only in versions newer than asked for.
    VersionTooLow,
    /// Unknown, or a variant vgpu does not implement.
    NotFound,
}

type Entry = (&'static str, &'static [(i32, Option<usize>)]);

macro_rules! f {
    ($f:expr) => {
        Some($f as *const () as usize)
    };
}

/// (base name, [(introduced in CUDA version, function or None = not implemented)]), oldest first.
fn table() -> &'static [Entry] {
    static T: std::sync::OnceLock<Vec<Entry>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        macro_rules! e {
            ($name:literal, $( ($v:literal, $f:expr) ),+ ) => {
                ($name, Box::leak(Box::new([ $( ($v, $f) ),+ ])) as &'static [(i32, Option<usize>)])
            };
        }
        vec![
            e!("cuInit", (2000, f!(cuInit))),
            e!("cuDriverGetVersion", (2020, f!(cuDriverGetVersion))),
            e!("cuGetErrorName", (6000, f!(cuGetErrorName))),
            e!("cuGetErrorString", (6000, f!(cuGetErrorString))),
            e!(
                "cuLogsRegisterCallback",
                (12090, f!(cuLogsRegisterCallback))
            ),
            e!(
                "cuLogsUnregisterCallback",
                (12090, f!(cuLogsUnregisterCallback))
            ),
            e!("cuLogsCurrent", (12090, f!(cuLogsCurrent))),
            e!("cuLogsDumpToFile", (12090, f!(cuLogsDumpToFile))),
            e!("cuLogsDumpToMemory", (12090, f!(cuLogsDumpToMemory))),
            e!(
                "cuGetProcAddress",
                (11030, f!(cuGetProcAddress)),
                (12000, f!(cuGetProcAddress_v2))
            ),
            e!("cuGetExportTable", (3000, f!(cuGetExportTable))),
            e!("cuDeviceGetCount", (2000, f!(cuDeviceGetCount))),
            e!("cuDeviceGet", (2000, f!(cuDeviceGet))),
            e!("cuDeviceGetName", (2000, f!(cuDeviceGetName))),
            e!(
                "cuDeviceGetUuid",
                (9020, f!(cuDeviceGetUuid)),
                (11040, f!(cuDeviceGetUuid_v2))
            ),
            e!("cuDeviceTotalMem", (3020, f!(cuDeviceTotalMem_v2))),
            e!("cuDeviceGetAttribute", (2000, f!(cuDeviceGetAttribute))),
            e!(
                "cuDeviceComputeCapability",
                (2000, f!(cuDeviceComputeCapability))
            ),
            e!("cuDeviceGetPCIBusId", (4010, f!(cuDeviceGetPCIBusId))),
            e!(
                "cuCtxCreate",
                (3020, f!(cuCtxCreate_v2)),
                (11040, f!(cuCtxCreate_v3)),
                (12050, f!(cuCtxCreate_v4))
            ),
            e!("cuCtxDestroy", (4000, f!(cuCtxDestroy_v2))),
            e!("cuCtxGetCurrent", (4000, f!(cuCtxGetCurrent))),
            e!("cuCtxSetCurrent", (4000, f!(cuCtxSetCurrent))),
            e!("cuCtxPushCurrent", (4000, f!(cuCtxPushCurrent_v2))),
            e!("cuCtxPopCurrent", (4000, f!(cuCtxPopCurrent_v2))),
            e!(
                "cuCtxGetDevice",
                (2000, f!(cuCtxGetDevice)),
                (13000, f!(cuCtxGetDevice_v2))
            ),
            e!(
                "cuCtxSynchronize",
                (2000, f!(cuCtxSynchronize)),
                (13000, f!(cuCtxSynchronize_v2))
            ),
            e!("cuCtxRecordEvent", (12050, f!(cuCtxRecordEvent))),
            e!(
                "cuOccupancyMaxPotentialClusterSize",
                (11070, f!(cuOccupancyMaxPotentialClusterSize))
            ),
            e!(
                "cuOccupancyMaxActiveClusters",
                (11070, f!(cuOccupancyMaxActiveClusters))
            ),
            e!("cuGreenCtxCreate", (12040, f!(cuGreenCtxCreate))),
            e!("cuGreenCtxDestroy", (12040, f!(cuGreenCtxDestroy))),
            e!("cuCtxFromGreenCtx", (12040, f!(cuCtxFromGreenCtx))),
            e!(
                "cuDeviceGetDevResource",
                (12040, f!(cuDeviceGetDevResource))
            ),
            e!("cuCtxGetDevResource", (12040, f!(cuCtxGetDevResource))),
            e!(
                "cuGreenCtxGetDevResource",
                (12040, f!(cuGreenCtxGetDevResource))
            ),
            e!(
                "cuDevSmResourceSplitByCount",
                (12040, f!(cuDevSmResourceSplitByCount))
            ),
            e!("cuDevSmResourceSplit", (13010, f!(cuDevSmResourceSplit))),
            e!(
                "cuDevResourceGenerateDesc",
                (12040, f!(cuDevResourceGenerateDesc))
            ),
            e!("cuGreenCtxRecordEvent", (12040, f!(cuGreenCtxRecordEvent))),
            e!("cuGreenCtxWaitEvent", (12040, f!(cuGreenCtxWaitEvent))),
            e!("cuStreamGetGreenCtx", (12040, f!(cuStreamGetGreenCtx))),
            e!(
                "cuGreenCtxStreamCreate",
                (12050, f!(cuGreenCtxStreamCreate))
            ),
            e!("cuGreenCtxGetId", (12090, f!(cuGreenCtxGetId))),
            e!(
                "cuStreamGetDevResource",
                (13000, f!(cuStreamGetDevResource))
            ),
            e!(
                "cuDeviceRegisterAsyncNotification",
                (12040, f!(cuDeviceRegisterAsyncNotification))
            ),
            e!(
                "cuDeviceUnregisterAsyncNotification",
                (12040, f!(cuDeviceUnregisterAsyncNotification))
            ),
            e!("cuCtxWaitEvent", (12050, f!(cuCtxWaitEvent))),
            e!("cuCtxGetApiVersion", (3020, f!(cuCtxGetApiVersion))),
            e!("cuCtxGetFlags", (7000, f!(cuCtxGetFlags))),
            e!("cuCtxSetFlags", (12010, f!(cuCtxSetFlags))),
            e!(
                "cuCtxGetStreamPriorityRange",
                (5050, f!(cuCtxGetStreamPriorityRange))
            ),
            e!("cuCtxGetLimit", (3010, f!(cuCtxGetLimit))),
            e!("cuCtxSetLimit", (3010, f!(cuCtxSetLimit))),
            e!("cuCtxGetCacheConfig", (3020, f!(cuCtxGetCacheConfig))),
            e!("cuCtxSetCacheConfig", (3020, f!(cuCtxSetCacheConfig))),
            e!(
                "cuDevicePrimaryCtxRetain",
                (7000, f!(cuDevicePrimaryCtxRetain))
            ),
            e!(
                "cuDevicePrimaryCtxRelease",
                (7000, f!(cuDevicePrimaryCtxRelease_v2)),
                (11000, f!(cuDevicePrimaryCtxRelease_v2))
            ),
            e!(
                "cuDevicePrimaryCtxReset",
                (7000, f!(cuDevicePrimaryCtxReset_v2)),
                (11000, f!(cuDevicePrimaryCtxReset_v2))
            ),
            e!(
                "cuDevicePrimaryCtxSetFlags",
                (7000, f!(cuDevicePrimaryCtxSetFlags_v2)),
                (11000, f!(cuDevicePrimaryCtxSetFlags_v2))
            ),
            e!(
                "cuDevicePrimaryCtxGetState",
                (7000, f!(cuDevicePrimaryCtxGetState))
            ),
            e!("cuMemAlloc", (3020, f!(cuMemAlloc_v2))),
            e!("cuMemAllocPitch", (3020, f!(cuMemAllocPitch_v2))),
            e!("cuMemFree", (3020, f!(cuMemFree_v2))),
            e!("cuMemGetInfo", (3020, f!(cuMemGetInfo_v2))),
            e!("cuMemGetAddressRange", (3020, f!(cuMemGetAddressRange_v2))),
            e!("cuMemcpy", (4000, f!(cuMemcpy))),
            e!("cuMemcpyAsync", (4000, f!(cuMemcpyAsync))),
            e!(
                "cuMemcpyBatchAsync",
                (12080, f!(cuMemcpyBatchAsync)),
                (13000, f!(cuMemcpyBatchAsync_v2))
            ),
            e!(
                "cuMemcpy3DBatchAsync",
                (12080, f!(cuMemcpy3DBatchAsync)),
                (13000, f!(cuMemcpy3DBatchAsync_v2))
            ),
            e!(
                "cuMemcpyWithAttributesAsync",
                (13020, f!(cuMemcpyWithAttributesAsync))
            ),
            e!(
                "cuMemcpy3DWithAttributesAsync",
                (13020, f!(cuMemcpy3DWithAttributesAsync))
            ),
            e!(
                "cuMemPrefetchBatchAsync",
                (13000, f!(cuMemPrefetchBatchAsync))
            ),
            e!(
                "cuMemDiscardBatchAsync",
                (13000, f!(cuMemDiscardBatchAsync))
            ),
            e!(
                "cuMemDiscardAndPrefetchBatchAsync",
                (13000, f!(cuMemDiscardAndPrefetchBatchAsync))
            ),
            e!("cuMemcpyHtoD", (3020, f!(cuMemcpyHtoD_v2))),
            e!("cuMemcpyDtoH", (3020, f!(cuMemcpyDtoH_v2))),
            e!("cuMemcpyDtoD", (3020, f!(cuMemcpyDtoD_v2))),
            e!("cuMemcpyHtoDAsync", (3020, f!(cuMemcpyHtoDAsync_v2))),
            e!("cuMemcpyDtoHAsync", (3020, f!(cuMemcpyDtoHAsync_v2))),
            e!("cuMemcpyDtoDAsync", (3020, f!(cuMemcpyDtoDAsync_v2))),
            e!("cuMemsetD8", (3020, f!(cuMemsetD8_v2))),
            e!("cuMemsetD16", (3020, f!(cuMemsetD16_v2))),
            e!("cuMemsetD32", (3020, f!(cuMemsetD32_v2))),
            e!("cuMemsetD8Async", (3020, f!(cuMemsetD8Async))),
            e!("cuMemsetD16Async", (3020, f!(cuMemsetD16Async))),
            e!("cuMemsetD32Async", (3020, f!(cuMemsetD32Async))),
            e!("cuMemAllocHost", (3020, f!(cuMemAllocHost_v2))),
            e!("cuMemHostAlloc", (2020, f!(cuMemHostAlloc))),
            e!("cuMemFreeHost", (2000, f!(cuMemFreeHost))),
            e!(
                "cuMemHostRegister",
                (4000, f!(cuMemHostRegister)),
                (6050, f!(cuMemHostRegister_v2))
            ),
            e!("cuMemHostUnregister", (4000, f!(cuMemHostUnregister))),
            e!(
                "cuMemHostGetDevicePointer",
                (3020, f!(cuMemHostGetDevicePointer_v2))
            ),
            e!("cuMemHostGetFlags", (2030, f!(cuMemHostGetFlags))),
            e!("cuMemAllocManaged", (6000, f!(cuMemAllocManaged))),
            e!("cuStreamAttachMemAsync", (6000, f!(cuStreamAttachMemAsync))),
            e!(
                "cuMemPrefetchAsync",
                (8000, f!(cuMemPrefetchAsync)),
                (12020, f!(cuMemPrefetchAsync_v2))
            ),
            e!(
                "cuMemAdvise",
                (8000, f!(cuMemAdvise)),
                (12020, f!(cuMemAdvise_v2))
            ),
            e!("cuMemRangeGetAttribute", (8000, f!(cuMemRangeGetAttribute))),
            e!(
                "cuMemRangeGetAttributes",
                (8000, f!(cuMemRangeGetAttributes))
            ),
            e!("cuPointerSetAttribute", (6000, f!(cuPointerSetAttribute))),
            e!("cuMemAllocAsync", (11020, f!(cuMemAllocAsync))),
            e!(
                "cuMemAllocFromPoolAsync",
                (11020, f!(cuMemAllocFromPoolAsync))
            ),
            e!("cuMemFreeAsync", (11020, f!(cuMemFreeAsync))),
            e!("cuMemPoolCreate", (11020, f!(cuMemPoolCreate))),
            e!("cuMemPoolDestroy", (11020, f!(cuMemPoolDestroy))),
            e!(
                "cuDeviceGetDefaultMemPool",
                (11020, f!(cuDeviceGetDefaultMemPool))
            ),
            e!("cuDeviceGetMemPool", (11020, f!(cuDeviceGetMemPool))),
            e!("cuDeviceSetMemPool", (11020, f!(cuDeviceSetMemPool))),
            e!(
                "cuMemGetDefaultMemPool",
                (13000, f!(cuMemGetDefaultMemPool))
            ),
            e!("cuMemGetMemPool", (13000, f!(cuMemGetMemPool))),
            e!("cuMemSetMemPool", (13000, f!(cuMemSetMemPool))),
            e!("cuMemPoolSetAttribute", (11020, f!(cuMemPoolSetAttribute))),
            e!("cuMemPoolGetAttribute", (11020, f!(cuMemPoolGetAttribute))),
            e!("cuMemPoolTrimTo", (11020, f!(cuMemPoolTrimTo))),
            e!("cuMemPoolSetAccess", (11020, f!(cuMemPoolSetAccess))),
            e!("cuMemPoolGetAccess", (11020, f!(cuMemPoolGetAccess))),
            e!(
                "cuMemPoolExportToShareableHandle",
                (11020, f!(cuMemPoolExportToShareableHandle))
            ),
            e!(
                "cuMemPoolImportFromShareableHandle",
                (11020, f!(cuMemPoolImportFromShareableHandle))
            ),
            e!(
                "cuMemPoolExportPointer",
                (11020, f!(cuMemPoolExportPointer))
            ),
            e!(
                "cuMemPoolImportPointer",
                (11020, f!(cuMemPoolImportPointer))
            ),
            e!(
                "cuMemGetAllocationGranularity",
                (10020, f!(cuMemGetAllocationGranularity))
            ),
            e!("cuMemCreate", (10020, f!(cuMemCreate))),
            e!("cuMemRelease", (10020, f!(cuMemRelease))),
            e!("cuMemAddressReserve", (10020, f!(cuMemAddressReserve))),
            e!("cuMemAddressFree", (10020, f!(cuMemAddressFree))),
            e!("cuMemMap", (10020, f!(cuMemMap))),
            e!("cuMemMapArrayAsync", (11010, f!(cuMemMapArrayAsync))),
            e!("cuMemUnmap", (10020, f!(cuMemUnmap))),
            e!("cuMemSetAccess", (10020, f!(cuMemSetAccess))),
            e!("cuMemGetAccess", (10020, f!(cuMemGetAccess))),
            e!(
                "cuMemGetAllocationPropertiesFromHandle",
                (10020, f!(cuMemGetAllocationPropertiesFromHandle))
            ),
            e!(
                "cuMemRetainAllocationHandle",
                (11000, f!(cuMemRetainAllocationHandle))
            ),
            e!(
                "cuMemExportToShareableHandle",
                (10020, f!(cuMemExportToShareableHandle))
            ),
            e!(
                "cuMemImportFromShareableHandle",
                (10020, f!(cuMemImportFromShareableHandle))
            ),
            e!("cuIpcGetMemHandle", (4010, f!(cuIpcGetMemHandle))),
            e!(
                "cuIpcOpenMemHandle",
                (4010, f!(cuIpcOpenMemHandle)),
                (11000, f!(cuIpcOpenMemHandle_v2))
            ),
            e!("cuIpcCloseMemHandle", (4010, f!(cuIpcCloseMemHandle))),
            e!("cuIpcGetEventHandle", (4010, f!(cuIpcGetEventHandle))),
            e!("cuIpcOpenEventHandle", (4010, f!(cuIpcOpenEventHandle))),
            e!("cuStreamCreate", (2000, f!(cuStreamCreate))),
            e!(
                "cuStreamCreateWithPriority",
                (5050, f!(cuStreamCreateWithPriority))
            ),
            e!("cuStreamDestroy", (4000, f!(cuStreamDestroy_v2))),
            e!("cuStreamSynchronize", (2000, f!(cuStreamSynchronize))),
            e!("cuStreamQuery", (2000, f!(cuStreamQuery))),
            e!(
                "cuLaunchHostFunc",
                (10000, f!(cuLaunchHostFunc)),
                (13010, f!(cuLaunchHostFunc_v2))
            ),
            e!("cuStreamAddCallback", (5000, f!(cuStreamAddCallback))),
            e!("cuStreamWaitEvent", (3020, f!(cuStreamWaitEvent))),
            e!("cuStreamGetPriority", (5050, f!(cuStreamGetPriority))),
            e!("cuStreamGetFlags", (5050, f!(cuStreamGetFlags))),
            e!("cuStreamGetId", (12000, f!(cuStreamGetId))),
            e!("cuStreamGetDevice", (12080, f!(cuStreamGetDevice))),
            e!("cuStreamGetAttribute", (11000, f!(cuStreamGetAttribute))),
            e!("cuStreamSetAttribute", (11000, f!(cuStreamSetAttribute))),
            e!(
                "cuStreamCopyAttributes",
                (11000, f!(cuStreamCopyAttributes))
            ),
            e!(
                "cuCtxResetPersistingL2Cache",
                (11000, f!(cuCtxResetPersistingL2Cache))
            ),
            e!("cuCtxGetId", (12000, f!(cuCtxGetId))),
            e!(
                "cuCtxGetSharedMemConfig",
                (4020, f!(cuCtxGetSharedMemConfig))
            ),
            e!(
                "cuCtxSetSharedMemConfig",
                (4020, f!(cuCtxSetSharedMemConfig))
            ),
            e!(
                "cuFuncSetSharedMemConfig",
                (4020, f!(cuFuncSetSharedMemConfig))
            ),
            e!("cuDeviceGetProperties", (2000, f!(cuDeviceGetProperties))),
            e!("cuArrayCreate", (3020, f!(cuArrayCreate_v2))),
            e!("cuArray3DCreate", (3020, f!(cuArray3DCreate_v2))),
            e!("cuArrayDestroy", (2000, f!(cuArrayDestroy))),
            e!("cuArrayGetDescriptor", (3020, f!(cuArrayGetDescriptor_v2))),
            e!(
                "cuArray3DGetDescriptor",
                (3020, f!(cuArray3DGetDescriptor_v2))
            ),
            e!(
                "cuArrayGetMemoryRequirements",
                (11060, f!(cuArrayGetMemoryRequirements))
            ),
            e!("cuArrayGetPlane", (11020, f!(cuArrayGetPlane))),
            e!(
                "cuArrayGetSparseProperties",
                (11010, f!(cuArrayGetSparseProperties))
            ),
            e!("cuMipmappedArrayCreate", (5000, f!(cuMipmappedArrayCreate))),
            e!(
                "cuMipmappedArrayDestroy",
                (5000, f!(cuMipmappedArrayDestroy))
            ),
            e!(
                "cuMipmappedArrayGetLevel",
                (5000, f!(cuMipmappedArrayGetLevel))
            ),
            e!("cuUserObjectCreate", (11030, f!(cuUserObjectCreate))),
            e!("cuUserObjectRetain", (11030, f!(cuUserObjectRetain))),
            e!("cuUserObjectRelease", (11030, f!(cuUserObjectRelease))),
            e!(
                "cuGraphRetainUserObject",
                (11030, f!(cuGraphRetainUserObject))
            ),
            e!(
                "cuGraphReleaseUserObject",
                (11030, f!(cuGraphReleaseUserObject))
            ),
            e!("cuMemcpyHtoA", (3020, f!(cuMemcpyHtoA_v2))),
            e!("cuMemcpyHtoAAsync", (3020, f!(cuMemcpyHtoAAsync_v2))),
            e!("cuMemcpyAtoH", (3020, f!(cuMemcpyAtoH_v2))),
            e!("cuMemcpyAtoHAsync", (3020, f!(cuMemcpyAtoHAsync_v2))),
            e!("cuMemcpyDtoA", (3020, f!(cuMemcpyDtoA_v2))),
            e!("cuMemcpyAtoD", (3020, f!(cuMemcpyAtoD_v2))),
            e!("cuMemcpyAtoA", (3020, f!(cuMemcpyAtoA_v2))),
            e!(
                "cuDeviceGetTexture1DLinearMaxWidth",
                (11010, f!(cuDeviceGetTexture1DLinearMaxWidth))
            ),
            e!("cuModuleGetTexRef", (2000, f!(cuModuleGetTexRef))),
            e!("cuModuleGetSurfRef", (3000, f!(cuModuleGetSurfRef))),
            e!("cuTexRefSetArray", (2000, f!(cuTexRefSetArray))),
            e!(
                "cuTexRefSetAddress",
                (2000, None),
                (3020, f!(cuTexRefSetAddress_v2))
            ),
            e!(
                "cuTexRefSetAddress2D",
                (2020, None),
                (3020, f!(cuTexRefSetAddress2D_v2)),
                (4010, f!(cuTexRefSetAddress2D_v3))
            ),
            e!("cuTexRefSetFormat", (2000, f!(cuTexRefSetFormat))),
            e!("cuTexRefSetAddressMode", (2000, f!(cuTexRefSetAddressMode))),
            e!("cuTexRefSetFilterMode", (2000, f!(cuTexRefSetFilterMode))),
            e!("cuTexRefSetFlags", (2000, f!(cuTexRefSetFlags))),
            e!("cuTexRefSetBorderColor", (8000, f!(cuTexRefSetBorderColor))),
            e!(
                "cuTexRefSetMaxAnisotropy",
                (5000, f!(cuTexRefSetMaxAnisotropy))
            ),
            e!(
                "cuTexRefSetMipmapFilterMode",
                (5000, f!(cuTexRefSetMipmapFilterMode))
            ),
            e!(
                "cuTexRefSetMipmapLevelBias",
                (5000, f!(cuTexRefSetMipmapLevelBias))
            ),
            e!(
                "cuTexRefSetMipmapLevelClamp",
                (5000, f!(cuTexRefSetMipmapLevelClamp))
            ),
            e!(
                "cuTexRefSetMipmappedArray",
                (5000, f!(cuTexRefSetMipmappedArray))
            ),
            e!(
                "cuTexRefGetAddress",
                (2000, None),
                (3020, f!(cuTexRefGetAddress_v2))
            ),
            e!("cuTexRefGetArray", (2000, f!(cuTexRefGetArray))),
            e!(
                "cuTexRefGetMipmappedArray",
                (5000, f!(cuTexRefGetMipmappedArray))
            ),
            e!("cuTexRefGetAddressMode", (2000, f!(cuTexRefGetAddressMode))),
            e!("cuTexRefGetFilterMode", (2000, f!(cuTexRefGetFilterMode))),
            e!("cuTexRefGetFormat", (2000, f!(cuTexRefGetFormat))),
            e!("cuTexRefGetFlags", (2000, f!(cuTexRefGetFlags))),
            e!("cuTexRefGetBorderColor", (8000, f!(cuTexRefGetBorderColor))),
            e!(
                "cuTexRefGetMaxAnisotropy",
                (5000, f!(cuTexRefGetMaxAnisotropy))
            ),
            e!(
                "cuTexRefGetMipmapFilterMode",
                (5000, f!(cuTexRefGetMipmapFilterMode))
            ),
            e!(
                "cuTexRefGetMipmapLevelBias",
                (5000, f!(cuTexRefGetMipmapLevelBias))
            ),
            e!(
                "cuTexRefGetMipmapLevelClamp",
                (5000, f!(cuTexRefGetMipmapLevelClamp))
            ),
            e!("cuParamSetTexRef", (2000, f!(cuParamSetTexRef))),
            e!("cuSurfRefSetArray", (3000, f!(cuSurfRefSetArray))),
            e!("cuSurfRefGetArray", (3000, f!(cuSurfRefGetArray))),
            e!("cuTexObjectCreate", (5000, f!(cuTexObjectCreate))),
            e!("cuTexObjectDestroy", (5000, f!(cuTexObjectDestroy))),
            e!(
                "cuTexObjectGetResourceDesc",
                (5000, f!(cuTexObjectGetResourceDesc))
            ),
            e!(
                "cuTexObjectGetTextureDesc",
                (5000, f!(cuTexObjectGetTextureDesc))
            ),
            e!(
                "cuTexObjectGetResourceViewDesc",
                (5000, f!(cuTexObjectGetResourceViewDesc))
            ),
            e!("cuSurfObjectCreate", (5000, f!(cuSurfObjectCreate))),
            e!("cuSurfObjectDestroy", (5000, f!(cuSurfObjectDestroy))),
            e!(
                "cuSurfObjectGetResourceDesc",
                (5000, f!(cuSurfObjectGetResourceDesc))
            ),
            e!("cuMemcpy2D", (3020, f!(cuMemcpy2D_v2))),
            e!("cuMemcpy2DUnaligned", (3020, f!(cuMemcpy2DUnaligned_v2))),
            e!("cuMemcpy2DAsync", (3020, f!(cuMemcpy2DAsync_v2))),
            e!("cuMemcpy3D", (3020, f!(cuMemcpy3D_v2))),
            e!("cuMemcpy3DAsync", (3020, f!(cuMemcpy3DAsync_v2))),
            e!("cuMemsetD2D8", (3020, f!(cuMemsetD2D8_v2))),
            e!("cuMemsetD2D16", (3020, f!(cuMemsetD2D16_v2))),
            e!("cuMemsetD2D32", (3020, f!(cuMemsetD2D32_v2))),
            e!("cuMemsetD2D8Async", (3020, f!(cuMemsetD2D8Async))),
            e!("cuMemsetD2D16Async", (3020, f!(cuMemsetD2D16Async))),
            e!("cuMemsetD2D32Async", (3020, f!(cuMemsetD2D32Async))),
            e!("cuMemcpyPeer", (4000, f!(cuMemcpyPeer))),
            e!("cuMemcpyPeerAsync", (4000, f!(cuMemcpyPeerAsync))),
            e!("cuMemcpy3DPeer", (4000, f!(cuMemcpy3DPeer))),
            e!("cuMemcpy3DPeerAsync", (4000, f!(cuMemcpy3DPeerAsync))),
            e!("cuDeviceGetByPCIBusId", (4010, f!(cuDeviceGetByPCIBusId))),
            e!("cuDeviceCanAccessPeer", (4000, f!(cuDeviceCanAccessPeer))),
            e!(
                "cuDeviceGetHostAtomicCapabilities",
                (13000, f!(cuDeviceGetHostAtomicCapabilities))
            ),
            e!(
                "cuDeviceGetP2PAtomicCapabilities",
                (13000, f!(cuDeviceGetP2PAtomicCapabilities))
            ),
            e!("cuMulticastCreate", (12010, f!(cuMulticastCreate))),
            e!("cuMulticastAddDevice", (12010, f!(cuMulticastAddDevice))),
            e!(
                "cuMulticastBindMem",
                (12010, f!(cuMulticastBindMem)),
                (13010, f!(cuMulticastBindMem_v2))
            ),
            e!(
                "cuMulticastBindAddr",
                (12010, f!(cuMulticastBindAddr)),
                (13010, f!(cuMulticastBindAddr_v2))
            ),
            e!("cuMulticastUnbind", (12010, f!(cuMulticastUnbind))),
            e!(
                "cuMulticastGetGranularity",
                (12010, f!(cuMulticastGetGranularity))
            ),
            e!(
                "cuDeviceGetP2PAttribute",
                (8000, f!(cuDeviceGetP2PAttribute))
            ),
            e!("cuCtxEnablePeerAccess", (4000, f!(cuCtxEnablePeerAccess))),
            e!("cuCtxDisablePeerAccess", (4000, f!(cuCtxDisablePeerAccess))),
            e!(
                "cuDeviceGetExecAffinitySupport",
                (11040, f!(cuDeviceGetExecAffinitySupport))
            ),
            e!("cuCtxGetExecAffinity", (11040, f!(cuCtxGetExecAffinity))),
            e!(
                "cuStreamWriteValue32",
                (8000, f!(cuStreamWriteValue32)),
                (11070, f!(cuStreamWriteValue32_v2))
            ),
            e!(
                "cuStreamWriteValue64",
                (9000, f!(cuStreamWriteValue64)),
                (11070, f!(cuStreamWriteValue64_v2))
            ),
            e!(
                "cuStreamWaitValue32",
                (8000, f!(cuStreamWaitValue32)),
                (11070, f!(cuStreamWaitValue32_v2))
            ),
            e!(
                "cuStreamWaitValue64",
                (9000, f!(cuStreamWaitValue64)),
                (11070, f!(cuStreamWaitValue64_v2))
            ),
            e!(
                "cuStreamBatchMemOp",
                (8000, f!(cuStreamBatchMemOp)),
                (11070, f!(cuStreamBatchMemOp_v2))
            ),
            e!(
                "cuGraphAddBatchMemOpNode",
                (11070, f!(cuGraphAddBatchMemOpNode))
            ),
            e!(
                "cuGraphBatchMemOpNodeGetParams",
                (11070, f!(cuGraphBatchMemOpNodeGetParams))
            ),
            e!(
                "cuGraphBatchMemOpNodeSetParams",
                (11070, f!(cuGraphBatchMemOpNodeSetParams))
            ),
            e!(
                "cuGraphExecBatchMemOpNodeSetParams",
                (11070, f!(cuGraphExecBatchMemOpNodeSetParams))
            ),
            e!(
                "cuStreamGetCtx",
                (9020, f!(cuStreamGetCtx)),
                (12050, f!(cuStreamGetCtx_v2))
            ),
            e!(
                "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
                (
                    7000,
                    f!(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags)
                )
            ),
            e!("cuPointerGetAttribute", (4000, f!(cuPointerGetAttribute))),
            e!("cuPointerGetAttributes", (7000, f!(cuPointerGetAttributes))),
            e!("cuStreamIsCapturing", (10000, f!(cuStreamIsCapturing))),
            e!(
                "cuStreamBeginCapture",
                (10000, f!(cuStreamBeginCapture)),
                (10010, f!(cuStreamBeginCapture_v2))
            ),
            e!(
                "cuStreamBeginCaptureToGraph",
                (12030, f!(cuStreamBeginCaptureToGraph))
            ),
            e!("cuStreamEndCapture", (10000, f!(cuStreamEndCapture))),
            e!(
                "cuStreamUpdateCaptureDependencies",
                (11030, f!(cuStreamUpdateCaptureDependencies)),
                (12030, f!(cuStreamUpdateCaptureDependencies_v2))
            ),
            e!("cuGraphCreate", (10000, f!(cuGraphCreate))),
            e!("cuGraphDestroy", (10000, f!(cuGraphDestroy))),
            e!("cuGraphClone", (10000, f!(cuGraphClone))),
            e!(
                "cuGraphNodeFindInClone",
                (10000, f!(cuGraphNodeFindInClone))
            ),
            e!("cuGraphGetNodes", (10000, f!(cuGraphGetNodes))),
            e!("cuGraphGetRootNodes", (10000, f!(cuGraphGetRootNodes))),
            e!(
                "cuGraphGetEdges",
                (10000, f!(cuGraphGetEdges)),
                (12030, f!(cuGraphGetEdges_v2))
            ),
            e!(
                "cuGraphAddDependencies",
                (10000, f!(cuGraphAddDependencies)),
                (12030, f!(cuGraphAddDependencies_v2))
            ),
            e!(
                "cuGraphRemoveDependencies",
                (10000, f!(cuGraphRemoveDependencies)),
                (12030, f!(cuGraphRemoveDependencies_v2))
            ),
            e!(
                "cuGraphNodeGetDependencies",
                (10000, f!(cuGraphNodeGetDependencies)),
                (12030, f!(cuGraphNodeGetDependencies_v2))
            ),
            e!(
                "cuGraphNodeGetDependentNodes",
                (10000, f!(cuGraphNodeGetDependentNodes)),
                (12030, f!(cuGraphNodeGetDependentNodes_v2))
            ),
            e!("cuGraphNodeGetType", (10000, f!(cuGraphNodeGetType))),
            e!(
                "cuGraphNodeGetContainingGraph",
                (13010, f!(cuGraphNodeGetContainingGraph))
            ),
            e!("cuGraphNodeGetLocalId", (13010, f!(cuGraphNodeGetLocalId))),
            e!("cuGraphNodeGetToolsId", (13010, f!(cuGraphNodeGetToolsId))),
            e!("cuGraphGetId", (13010, f!(cuGraphGetId))),
            e!("cuGraphExecGetId", (13010, f!(cuGraphExecGetId))),
            e!(
                "cuGraphAddNode",
                (12020, f!(cuGraphAddNode)),
                (12030, f!(cuGraphAddNode_v2)),
                (13040, f!(cuGraphAddNode_v3))
            ),
            e!(
                "cuGraphNodeSetParams",
                (12020, f!(cuGraphNodeSetParams)),
                (13040, f!(cuGraphNodeSetParams_v2))
            ),
            e!("cuGraphNodeGetParams", (13020, f!(cuGraphNodeGetParams))),
            e!(
                "cuGraphConditionalHandleCreate",
                (12030, f!(cuGraphConditionalHandleCreate))
            ),
            e!(
                "cuGraphKernelNodeSetAttribute",
                (11000, f!(cuGraphKernelNodeSetAttribute))
            ),
            e!(
                "cuGraphKernelNodeGetAttribute",
                (11000, f!(cuGraphKernelNodeGetAttribute))
            ),
            e!(
                "cuGraphKernelNodeCopyAttributes",
                (11000, f!(cuGraphKernelNodeCopyAttributes))
            ),
            e!(
                "cuGraphExecNodeSetParams",
                (12020, f!(cuGraphExecNodeSetParams))
            ),
            e!(
                "cuGraphExecChildGraphNodeSetParams",
                (11010, f!(cuGraphExecChildGraphNodeSetParams))
            ),
            e!("cuGraphDestroyNode", (10000, f!(cuGraphDestroyNode))),
            e!("cuGraphDebugDotPrint", (11030, f!(cuGraphDebugDotPrint))),
            e!("cuGraphAddEmptyNode", (10000, f!(cuGraphAddEmptyNode))),
            e!(
                "cuGraphAddKernelNode",
                (10000, f!(cuGraphAddKernelNode)),
                (12000, f!(cuGraphAddKernelNode_v2))
            ),
            e!(
                "cuGraphKernelNodeGetParams",
                (10000, f!(cuGraphKernelNodeGetParams)),
                (12000, f!(cuGraphKernelNodeGetParams_v2))
            ),
            e!(
                "cuGraphKernelNodeSetParams",
                (10000, f!(cuGraphKernelNodeSetParams)),
                (12000, f!(cuGraphKernelNodeSetParams_v2))
            ),
            e!("cuGraphAddMemcpyNode", (10000, f!(cuGraphAddMemcpyNode))),
            e!(
                "cuGraphMemcpyNodeGetParams",
                (10000, f!(cuGraphMemcpyNodeGetParams))
            ),
            e!(
                "cuGraphMemcpyNodeSetParams",
                (10000, f!(cuGraphMemcpyNodeSetParams))
            ),
            e!("cuGraphAddMemsetNode", (10000, f!(cuGraphAddMemsetNode))),
            e!(
                "cuGraphMemsetNodeGetParams",
                (10000, f!(cuGraphMemsetNodeGetParams))
            ),
            e!(
                "cuGraphMemsetNodeSetParams",
                (10000, f!(cuGraphMemsetNodeSetParams))
            ),
            e!("cuGraphAddHostNode", (10000, f!(cuGraphAddHostNode))),
            e!(
                "cuGraphHostNodeGetParams",
                (10000, f!(cuGraphHostNodeGetParams))
            ),
            e!(
                "cuGraphHostNodeSetParams",
                (10000, f!(cuGraphHostNodeSetParams))
            ),
            e!(
                "cuGraphAddChildGraphNode",
                (10000, f!(cuGraphAddChildGraphNode))
            ),
            e!(
                "cuGraphChildGraphNodeGetGraph",
                (10000, f!(cuGraphChildGraphNodeGetGraph))
            ),
            e!(
                "cuGraphAddEventRecordNode",
                (11010, f!(cuGraphAddEventRecordNode))
            ),
            e!(
                "cuGraphEventRecordNodeGetEvent",
                (11010, f!(cuGraphEventRecordNodeGetEvent))
            ),
            e!(
                "cuGraphEventRecordNodeSetEvent",
                (11010, f!(cuGraphEventRecordNodeSetEvent))
            ),
            e!(
                "cuGraphExecEventRecordNodeSetEvent",
                (11010, f!(cuGraphExecEventRecordNodeSetEvent))
            ),
            e!(
                "cuGraphAddEventWaitNode",
                (11010, f!(cuGraphAddEventWaitNode))
            ),
            e!(
                "cuGraphEventWaitNodeGetEvent",
                (11010, f!(cuGraphEventWaitNodeGetEvent))
            ),
            e!(
                "cuGraphEventWaitNodeSetEvent",
                (11010, f!(cuGraphEventWaitNodeSetEvent))
            ),
            e!(
                "cuGraphExecEventWaitNodeSetEvent",
                (11010, f!(cuGraphExecEventWaitNodeSetEvent))
            ),
            e!(
                "cuGraphAddMemAllocNode",
                (11040, f!(cuGraphAddMemAllocNode))
            ),
            e!(
                "cuGraphMemAllocNodeGetParams",
                (11040, f!(cuGraphMemAllocNodeGetParams))
            ),
            e!("cuGraphAddMemFreeNode", (11040, f!(cuGraphAddMemFreeNode))),
            e!(
                "cuGraphMemFreeNodeGetParams",
                (11040, f!(cuGraphMemFreeNodeGetParams))
            ),
            e!("cuDeviceGraphMemTrim", (11040, f!(cuDeviceGraphMemTrim))),
            e!(
                "cuDeviceGetGraphMemAttribute",
                (11040, f!(cuDeviceGetGraphMemAttribute))
            ),
            e!(
                "cuDeviceSetGraphMemAttribute",
                (11040, f!(cuDeviceSetGraphMemAttribute))
            ),
            e!(
                "cuGraphInstantiate",
                (10000, f!(cuGraphInstantiate)),
                (11000, f!(cuGraphInstantiate_v2)),
                (12000, f!(cuGraphInstantiateWithFlags))
            ),
            e!(
                "cuGraphInstantiateWithFlags",
                (11040, f!(cuGraphInstantiateWithFlags))
            ),
            e!(
                "cuGraphInstantiateWithParams",
                (12000, f!(cuGraphInstantiateWithParams))
            ),
            e!("cuGraphExecGetFlags", (12000, f!(cuGraphExecGetFlags))),
            e!("cuGraphUpload", (11010, f!(cuGraphUpload))),
            e!("cuGraphLaunch", (10000, f!(cuGraphLaunch))),
            e!("cuGraphExecDestroy", (10000, f!(cuGraphExecDestroy))),
            e!(
                "cuGraphExecUpdate",
                (10020, f!(cuGraphExecUpdate)),
                (12000, f!(cuGraphExecUpdate_v2))
            ),
            e!(
                "cuGraphExecKernelNodeSetParams",
                (10010, f!(cuGraphExecKernelNodeSetParams)),
                (12000, f!(cuGraphExecKernelNodeSetParams_v2))
            ),
            e!(
                "cuGraphExecMemcpyNodeSetParams",
                (10020, f!(cuGraphExecMemcpyNodeSetParams))
            ),
            e!(
                "cuGraphExecMemsetNodeSetParams",
                (10020, f!(cuGraphExecMemsetNodeSetParams))
            ),
            e!(
                "cuGraphExecHostNodeSetParams",
                (10020, f!(cuGraphExecHostNodeSetParams))
            ),
            e!("cuGraphNodeSetEnabled", (11060, f!(cuGraphNodeSetEnabled))),
            e!("cuGraphNodeGetEnabled", (11060, f!(cuGraphNodeGetEnabled))),
            e!(
                "cuStreamGetCaptureInfo",
                (10010, f!(cuStreamGetCaptureInfo)),
                (11030, f!(cuStreamGetCaptureInfo_v2)),
                (12030, f!(cuStreamGetCaptureInfo_v3))
            ),
            e!(
                "cuThreadExchangeStreamCaptureMode",
                (10010, f!(cuThreadExchangeStreamCaptureMode))
            ),
            e!("cuEventCreate", (2000, f!(cuEventCreate))),
            e!("cuEventRecord", (2000, f!(cuEventRecord))),
            e!(
                "cuEventRecordWithFlags",
                (11010, f!(cuEventRecordWithFlags))
            ),
            e!("cuEventQuery", (2000, f!(cuEventQuery))),
            e!("cuEventSynchronize", (2000, f!(cuEventSynchronize))),
            e!(
                "cuEventElapsedTime",
                (2000, f!(cuEventElapsedTime)),
                (12080, f!(cuEventElapsedTime_v2))
            ),
            e!("cuEventDestroy", (4000, f!(cuEventDestroy_v2))),
            e!("cuModuleLoadData", (2000, f!(cuModuleLoadData))),
            e!("cuModuleLoadDataEx", (2010, f!(cuModuleLoadDataEx))),
            e!("cuModuleUnload", (2000, f!(cuModuleUnload))),
            e!("cuModuleGetFunction", (2000, f!(cuModuleGetFunction))),
            e!("cuModuleGetGlobal", (3020, f!(cuModuleGetGlobal_v2))),
            e!("cuLaunchKernel", (4000, f!(cuLaunchKernel))),
            e!("cuLaunchKernelEx", (11060, f!(cuLaunchKernelEx))),
            e!(
                "cuLaunchCooperativeKernelMultiDevice",
                (9000, f!(cuLaunchCooperativeKernelMultiDevice))
            ),
            e!(
                "cuLaunchCooperativeKernel",
                (9000, f!(cuLaunchCooperativeKernel))
            ),
            e!("cuFuncGetAttribute", (2020, f!(cuFuncGetAttribute))),
            e!("cuFuncSetAttribute", (9000, f!(cuFuncSetAttribute))),
            e!("cuFuncSetCacheConfig", (3000, f!(cuFuncSetCacheConfig))),
            e!(
                "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                (6050, f!(cuOccupancyMaxActiveBlocksPerMultiprocessor))
            ),
            e!(
                "cuOccupancyMaxPotentialBlockSize",
                (6050, f!(cuOccupancyMaxPotentialBlockSize))
            ),
            e!(
                "cuOccupancyMaxPotentialBlockSizeWithFlags",
                (7000, f!(cuOccupancyMaxPotentialBlockSizeWithFlags))
            ),
            e!(
                "cuOccupancyAvailableDynamicSMemPerBlock",
                (10020, f!(cuOccupancyAvailableDynamicSMemPerBlock))
            ),
            e!("cuFuncIsLoaded", (12040, f!(cuFuncIsLoaded))),
            e!("cuFuncLoad", (12040, f!(cuFuncLoad))),
            e!("cuFuncSetBlockShape", (2000, f!(cuFuncSetBlockShape))),
            e!("cuFuncSetSharedSize", (2000, f!(cuFuncSetSharedSize))),
            e!("cuParamSetSize", (2000, f!(cuParamSetSize))),
            e!("cuParamSeti", (2000, f!(cuParamSeti))),
            e!("cuParamSetf", (2000, f!(cuParamSetf))),
            e!("cuParamSetv", (2000, f!(cuParamSetv))),
            e!("cuLaunch", (2000, f!(cuLaunch))),
            e!("cuLaunchGrid", (2000, f!(cuLaunchGrid))),
            e!("cuLaunchGridAsync", (2000, f!(cuLaunchGridAsync))),
            e!("cuModuleLoad", (2000, f!(cuModuleLoad))),
            e!("cuModuleLoadFatBinary", (2000, f!(cuModuleLoadFatBinary))),
            e!(
                "cuModuleGetLoadingMode",
                (11070, f!(cuModuleGetLoadingMode))
            ),
            e!(
                "cuModuleGetFunctionCount",
                (12040, f!(cuModuleGetFunctionCount))
            ),
            e!(
                "cuModuleEnumerateFunctions",
                (12040, f!(cuModuleEnumerateFunctions))
            ),
            e!("cuFuncGetName", (12030, f!(cuFuncGetName))),
            e!("cuFuncGetModule", (11000, f!(cuFuncGetModule))),
            e!("cuFuncGetParamInfo", (12040, f!(cuFuncGetParamInfo))),
            e!("cuFuncGetParamCount", (13020, f!(cuFuncGetParamCount))),
            e!(
                "cuLinkCreate",
                (5050, f!(cuLinkCreate)),
                (6050, f!(cuLinkCreate_v2))
            ),
            e!(
                "cuLinkAddData",
                (5050, f!(cuLinkAddData)),
                (6050, f!(cuLinkAddData_v2))
            ),
            e!(
                "cuLinkAddFile",
                (5050, f!(cuLinkAddFile)),
                (6050, f!(cuLinkAddFile_v2))
            ),
            e!("cuLinkComplete", (5050, f!(cuLinkComplete))),
            e!("cuLinkDestroy", (5050, f!(cuLinkDestroy))),
            e!("cuLibraryLoadData", (12000, f!(cuLibraryLoadData))),
            e!("cuLibraryLoadFromFile", (12000, f!(cuLibraryLoadFromFile))),
            e!("cuLibraryUnload", (12000, f!(cuLibraryUnload))),
            e!("cuLibraryGetModule", (12000, f!(cuLibraryGetModule))),
            e!("cuLibraryGetKernel", (12000, f!(cuLibraryGetKernel))),
            e!(
                "cuLibraryGetKernelCount",
                (12040, f!(cuLibraryGetKernelCount))
            ),
            e!(
                "cuLibraryEnumerateKernels",
                (12040, f!(cuLibraryEnumerateKernels))
            ),
            e!("cuLibraryGetGlobal", (12000, f!(cuLibraryGetGlobal))),
            e!("cuLibraryGetManaged", (12000, f!(cuLibraryGetManaged))),
            e!("cuKernelGetFunction", (12000, f!(cuKernelGetFunction))),
            e!("cuKernelGetName", (12030, f!(cuKernelGetName))),
            e!("cuKernelGetLibrary", (12050, f!(cuKernelGetLibrary))),
            e!("cuKernelGetParamInfo", (12040, f!(cuKernelGetParamInfo))),
            e!("cuKernelGetParamCount", (13020, f!(cuKernelGetParamCount))),
            e!("cuKernelGetAttribute", (12000, f!(cuKernelGetAttribute))),
            e!("cuKernelSetAttribute", (12000, f!(cuKernelSetAttribute))),
            e!(
                "cuKernelSetCacheConfig",
                (12000, f!(cuKernelSetCacheConfig))
            ),
            // Interop with graphics APIs and external memory (crate::interop): they refuse.
            e!("cuGLGetDevices", (4010, f!(cuGLGetDevices_v2))),
            e!(
                "cuGraphicsGLRegisterBuffer",
                (3000, f!(cuGraphicsGLRegisterBuffer))
            ),
            e!(
                "cuGraphicsGLRegisterImage",
                (3000, f!(cuGraphicsGLRegisterImage))
            ),
            e!("cuGLCtxCreate", (2000, None), (3020, f!(cuGLCtxCreate_v2))),
            e!("cuGLInit", (2000, f!(cuGLInit))),
            e!(
                "cuGLRegisterBufferObject",
                (2000, f!(cuGLRegisterBufferObject))
            ),
            e!(
                "cuGLMapBufferObject",
                (2000, None),
                (3020, f!(cuGLMapBufferObject_v2))
            ),
            e!(
                "cuGLMapBufferObjectAsync",
                (2030, None),
                (3020, f!(cuGLMapBufferObjectAsync_v2))
            ),
            e!("cuGLUnmapBufferObject", (2000, f!(cuGLUnmapBufferObject))),
            e!(
                "cuGLUnmapBufferObjectAsync",
                (2030, f!(cuGLUnmapBufferObjectAsync))
            ),
            e!(
                "cuGLUnregisterBufferObject",
                (2000, f!(cuGLUnregisterBufferObject))
            ),
            e!(
                "cuGLSetBufferObjectMapFlags",
                (2030, f!(cuGLSetBufferObjectMapFlags))
            ),
            e!(
                "cuGraphicsUnregisterResource",
                (3000, f!(cuGraphicsUnregisterResource))
            ),
            e!(
                "cuGraphicsSubResourceGetMappedArray",
                (3000, f!(cuGraphicsSubResourceGetMappedArray))
            ),
            e!(
                "cuGraphicsResourceGetMappedMipmappedArray",
                (5000, f!(cuGraphicsResourceGetMappedMipmappedArray))
            ),
            e!(
                "cuGraphicsResourceGetMappedPointer",
                (3000, None),
                (3020, f!(cuGraphicsResourceGetMappedPointer_v2))
            ),
            e!(
                "cuGraphicsResourceSetMapFlags",
                (3000, f!(cuGraphicsResourceSetMapFlags_v2))
            ),
            e!("cuGraphicsMapResources", (3000, f!(cuGraphicsMapResources))),
            e!(
                "cuGraphicsUnmapResources",
                (3000, f!(cuGraphicsUnmapResources))
            ),
            e!(
                "cuGraphicsEGLRegisterImage",
                (7000, f!(cuGraphicsEGLRegisterImage))
            ),
            e!(
                "cuGraphicsResourceGetMappedEglFrame",
                (7000, f!(cuGraphicsResourceGetMappedEglFrame))
            ),
            e!(
                "cuEGLStreamConsumerConnect",
                (7000, f!(cuEGLStreamConsumerConnect))
            ),
            e!(
                "cuEGLStreamConsumerConnectWithFlags",
                (8000, f!(cuEGLStreamConsumerConnectWithFlags))
            ),
            e!(
                "cuEGLStreamProducerConnect",
                (7000, f!(cuEGLStreamProducerConnect))
            ),
            e!(
                "cuEGLStreamConsumerDisconnect",
                (7000, f!(cuEGLStreamConsumerDisconnect))
            ),
            e!(
                "cuEGLStreamConsumerAcquireFrame",
                (7000, f!(cuEGLStreamConsumerAcquireFrame))
            ),
            e!(
                "cuEGLStreamConsumerReleaseFrame",
                (7000, f!(cuEGLStreamConsumerReleaseFrame))
            ),
            e!(
                "cuEGLStreamProducerDisconnect",
                (7000, f!(cuEGLStreamProducerDisconnect))
            ),
            e!(
                "cuEGLStreamProducerReturnFrame",
                (7000, f!(cuEGLStreamProducerReturnFrame))
            ),
            e!(
                "cuEGLStreamProducerPresentFrame",
                (7000, f!(cuEGLStreamProducerPresentFrame))
            ),
            e!(
                "cuEventCreateFromEGLSync",
                (9000, f!(cuEventCreateFromEGLSync))
            ),
            e!("cuVDPAUGetDevice", (3010, f!(cuVDPAUGetDevice))),
            e!(
                "cuVDPAUCtxCreate",
                (3010, None),
                (3020, f!(cuVDPAUCtxCreate_v2))
            ),
            e!(
                "cuGraphicsVDPAURegisterVideoSurface",
                (3010, f!(cuGraphicsVDPAURegisterVideoSurface))
            ),
            e!(
                "cuGraphicsVDPAURegisterOutputSurface",
                (3010, f!(cuGraphicsVDPAURegisterOutputSurface))
            ),
            e!(
                "cuImportExternalMemory",
                (10000, f!(cuImportExternalMemory))
            ),
            e!(
                "cuImportExternalSemaphore",
                (10000, f!(cuImportExternalSemaphore))
            ),
            e!(
                "cuExternalMemoryGetMappedBuffer",
                (10000, f!(cuExternalMemoryGetMappedBuffer))
            ),
            e!(
                "cuExternalMemoryGetMappedMipmappedArray",
                (10000, f!(cuExternalMemoryGetMappedMipmappedArray))
            ),
            e!(
                "cuDestroyExternalMemory",
                (10000, f!(cuDestroyExternalMemory))
            ),
            e!(
                "cuDestroyExternalSemaphore",
                (10000, f!(cuDestroyExternalSemaphore))
            ),
            e!(
                "cuSignalExternalSemaphoresAsync",
                (10000, f!(cuSignalExternalSemaphoresAsync))
            ),
            e!(
                "cuWaitExternalSemaphoresAsync",
                (10000, f!(cuWaitExternalSemaphoresAsync))
            ),
            e!(
                "cuGraphAddExternalSemaphoresSignalNode",
                (11020, f!(cuGraphAddExternalSemaphoresSignalNode))
            ),
            e!(
                "cuGraphAddExternalSemaphoresWaitNode",
                (11020, f!(cuGraphAddExternalSemaphoresWaitNode))
            ),
            e!(
                "cuGraphExternalSemaphoresSignalNodeGetParams",
                (11020, f!(cuGraphExternalSemaphoresSignalNodeGetParams))
            ),
            e!(
                "cuGraphExternalSemaphoresSignalNodeSetParams",
                (11020, f!(cuGraphExternalSemaphoresSignalNodeSetParams))
            ),
            e!(
                "cuGraphExternalSemaphoresWaitNodeGetParams",
                (11020, f!(cuGraphExternalSemaphoresWaitNodeGetParams))
            ),
            e!(
                "cuGraphExternalSemaphoresWaitNodeSetParams",
                (11020, f!(cuGraphExternalSemaphoresWaitNodeSetParams))
            ),
            e!(
                "cuGraphExecExternalSemaphoresSignalNodeSetParams",
                (11020, f!(cuGraphExecExternalSemaphoresSignalNodeSetParams))
            ),
            e!(
                "cuGraphExecExternalSemaphoresWaitNodeSetParams",
                (11020, f!(cuGraphExecExternalSemaphoresWaitNodeSetParams))
            ),
            // Features a VM's device does not have (crate::not_supported).
            e!(
                "cuTensorMapEncodeTiled",
                (12000, f!(cuTensorMapEncodeTiled))
            ),
            e!(
                "cuTensorMapEncodeIm2col",
                (12000, f!(cuTensorMapEncodeIm2col))
            ),
            e!(
                "cuTensorMapEncodeIm2colWide",
                (12080, f!(cuTensorMapEncodeIm2colWide))
            ),
            e!(
                "cuTensorMapReplaceAddress",
                (12000, f!(cuTensorMapReplaceAddress))
            ),
            e!(
                "cuLibraryGetUnifiedFunction",
                (12000, f!(cuLibraryGetUnifiedFunction))
            ),
            e!(
                "cuCheckpointProcessCheckpoint",
                (12080, f!(cuCheckpointProcessCheckpoint))
            ),
            e!(
                "cuCheckpointProcessGetRestoreThreadId",
                (12080, f!(cuCheckpointProcessGetRestoreThreadId))
            ),
            e!(
                "cuCheckpointProcessGetState",
                (12080, f!(cuCheckpointProcessGetState))
            ),
            e!(
                "cuCheckpointProcessLock",
                (12080, f!(cuCheckpointProcessLock))
            ),
            e!(
                "cuCheckpointProcessRestore",
                (12080, f!(cuCheckpointProcessRestore))
            ),
            e!(
                "cuCheckpointProcessUnlock",
                (12080, f!(cuCheckpointProcessUnlock))
            ),
            e!(
                "cuCheckpointOperationComplete",
                (13040, f!(cuCheckpointOperationComplete))
            ),
            e!(
                "cuTensorMapSetAllocationClass",
                (13050, f!(cuTensorMapSetAllocationClass))
            ),
            e!(
                "cuCoredumpGetAttribute",
                (12010, f!(cuCoredumpGetAttribute))
            ),
            e!(
                "cuCoredumpGetAttributeGlobal",
                (12010, f!(cuCoredumpGetAttributeGlobal))
            ),
            e!(
                "cuCoredumpSetAttribute",
                (12010, f!(cuCoredumpSetAttribute))
            ),
            e!(
                "cuCoredumpSetAttributeGlobal",
                (12010, f!(cuCoredumpSetAttributeGlobal))
            ),
            e!(
                "cuCoredumpRegisterStartCallback",
                (13020, f!(cuCoredumpRegisterStartCallback))
            ),
            e!(
                "cuCoredumpRegisterCompleteCallback",
                (13020, f!(cuCoredumpRegisterCompleteCallback))
            ),
            e!(
                "cuCoredumpDeregisterStartCallback",
                (13020, f!(cuCoredumpDeregisterStartCallback))
            ),
            e!(
                "cuCoredumpDeregisterCompleteCallback",
                (13020, f!(cuCoredumpDeregisterCompleteCallback))
            ),
            e!("cuDeviceGetLuid", (10000, f!(cuDeviceGetLuid))),
            e!(
                "cuDeviceGetNvSciSyncAttributes",
                (10020, f!(cuDeviceGetNvSciSyncAttributes))
            ),
            e!(
                "cuMemGetHandleForAddressRange",
                (11070, f!(cuMemGetHandleForAddressRange))
            ),
            e!(
                "cuMemBatchDecompressAsync",
                (12060, f!(cuMemBatchDecompressAsync))
            ),
            e!(
                "cuStreamBeginCaptureToCig",
                (13010, f!(cuStreamBeginCaptureToCig))
            ),
            e!(
                "cuStreamEndCaptureToCig",
                (13010, f!(cuStreamEndCaptureToCig))
            ),
            e!("cuProfilerInitialize", (4000, f!(cuProfilerInitialize))),
            e!("cuProfilerStart", (4000, f!(cuProfilerStart))),
            e!("cuProfilerStop", (4000, f!(cuProfilerStop))),
            e!(
                "cuDeviceGetFabricClusterUuid",
                (13040, f!(cuDeviceGetFabricClusterUuid))
            ),
            e!(
                "cuDeviceGetCliqueCount",
                (13040, f!(cuDeviceGetCliqueCount))
            ),
            e!("cuDeviceGetCliqueInfo", (13040, f!(cuDeviceGetCliqueInfo))),
            e!("cuFabricCpyBatchAsync", (13050, f!(cuFabricCpyBatchAsync))),
            e!(
                "cuLogicalEndpointIdReserve",
                (13030, f!(cuLogicalEndpointIdReserve))
            ),
            e!(
                "cuLogicalEndpointIdRelease",
                (13030, f!(cuLogicalEndpointIdRelease))
            ),
            e!(
                "cuLogicalEndpointCreate",
                (13030, f!(cuLogicalEndpointCreate))
            ),
            e!(
                "cuLogicalEndpointDestroy",
                (13030, f!(cuLogicalEndpointDestroy))
            ),
            e!(
                "cuLogicalEndpointAddDevice",
                (13030, f!(cuLogicalEndpointAddDevice))
            ),
            e!(
                "cuLogicalEndpointBindMem",
                (13030, f!(cuLogicalEndpointBindMem))
            ),
            e!(
                "cuLogicalEndpointBindAddr",
                (13030, f!(cuLogicalEndpointBindAddr))
            ),
            e!(
                "cuLogicalEndpointUnbind",
                (13030, f!(cuLogicalEndpointUnbind))
            ),
            e!(
                "cuLogicalEndpointExport",
                (13030, f!(cuLogicalEndpointExport))
            ),
            e!(
                "cuLogicalEndpointImport",
                (13030, f!(cuLogicalEndpointImport))
            ),
            e!(
                "cuLogicalEndpointGetLimits",
                (13030, f!(cuLogicalEndpointGetLimits))
            ),
            e!(
                "cuLogicalEndpointQuery",
                (13030, f!(cuLogicalEndpointQuery))
            ),
            e!(
                "cuStreamBeginRecaptureToGraph",
                (13030, f!(cuStreamBeginRecaptureToGraph))
            ),
            // Older and newer forms of the API (crate::exports, crate::texrefs, crate::arrays).
            e!("cuCtxAttach", (2000, f!(cuCtxAttach))),
            e!("cuCtxDetach", (2000, f!(cuCtxDetach))),
            e!("cuTexRefCreate", (2000, f!(cuTexRefCreate))),
            e!("cuTexRefDestroy", (2000, f!(cuTexRefDestroy))),
            e!(
                "cuMipmappedArrayGetMemoryRequirements",
                (11060, f!(cuMipmappedArrayGetMemoryRequirements))
            ),
            e!(
                "cuMipmappedArrayGetSparseProperties",
                (11010, f!(cuMipmappedArrayGetSparseProperties))
            ),
            e!(
                "cuFlushGPUDirectRDMAWrites",
                (11030, f!(cuFlushGPUDirectRDMAWrites))
            ),
        ]
    })
}

/// Names the shim exports, by base name and variant version (for tests and docs).
pub fn base_names() -> impl Iterator<Item = &'static str> {
    table().iter().map(|e| e.0)
}

fn strip_variant(name: &str) -> &str {
    let mut n = name;
    for suffix in ["_ptds", "_ptsz"] {
        n = n.strip_suffix(suffix).unwrap_or(n);
    }
    for suffix in ["_v2", "_v3", "_v4"] {
        n = n.strip_suffix(suffix).unwrap_or(n);
    }
    n
}

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// Looks up `name` for callers built against `cuda_version`. With the
/// per-thread default stream flag, or a `_ptsz`/`_ptds` name, an entry point
/// that uses the default stream comes in its per-thread variant
/// ([`crate::per_thread`]).
pub fn lookup(name: &str, cuda_version: i32, flags: u64) -> Lookup {
    let Some((_, variants)) = table()
        .iter()
        .find(|e| e.0 == name)
        .or_else(|| table().iter().find(|e| e.0 == strip_variant(name)))
    else {
        return Lookup::NotFound;
    };
    let per_thread = flags & PER_THREAD_DEFAULT_STREAM != 0
        || name.ends_with("_ptsz")
        || name.ends_with("_ptds");
    match variants.iter().rev().find(|(v, _)| *v <= cuda_version) {
        Some((_, Some(f))) if per_thread => {
            Lookup::Found(crate::per_thread::variant_of(*f).unwrap_or(*f) as *mut c_void)
        }
        Some((_, Some(f))) => Lookup::Found(*f as *mut c_void),
        Some((_, None)) => Lookup::NotFound,
        None => Lookup::VersionTooLow,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(name: &str, v: i32) -> usize {
        match lookup(name, v, 0) {
            Lookup::Found(p) => p as usize,
            other => panic!("{name}@{v}: {other:?}"),
        }
    }

    #[test]
    fn base_names_resolve_to_the_versioned_abi() {
        assert_eq!(
            found("cuMemAlloc", 12090),
            cuMemAlloc_v2 as *const () as usize
        );
        assert_eq!(
            found("cuCtxCreate", 3020),
            cuCtxCreate_v2 as *const () as usize
        );
        assert_eq!(
            found("cuCtxCreate", 11040),
            cuCtxCreate_v3 as *const () as usize
        );
        assert_eq!(
            found("cuGetProcAddress", 12000),
            cuGetProcAddress_v2 as *const () as usize
        );
        assert_eq!(
            found("cuMemcpyHtoDAsync_v2_ptsz", 12000),
            crate::per_thread::cuMemcpyHtoDAsync_v2_ptsz as *const () as usize
        );
        // The flag selects the per-thread variant where there is one.
        match lookup("cuLaunchKernel", 12000, PER_THREAD_DEFAULT_STREAM) {
            Lookup::Found(p) => assert_eq!(
                p as usize,
                crate::per_thread::cuLaunchKernel_ptsz as *const () as usize
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            found("cuMemAlloc", 12000),
            match lookup("cuMemAlloc", 12000, PER_THREAD_DEFAULT_STREAM) {
                Lookup::Found(p) => p as usize,
                other => panic!("{other:?}"),
            }
        );
    }

    #[test]
    fn newer_queries_and_the_old_launch_api_resolve_from_the_version_cuda_introduced_them() {
        assert_eq!(lookup("cuStreamGetId", 11080, 0), Lookup::VersionTooLow);
        assert_eq!(
            found("cuStreamGetId", 12000),
            cuStreamGetId as *const () as usize
        );
        match lookup("cuStreamGetId", 12000, PER_THREAD_DEFAULT_STREAM) {
            Lookup::Found(p) => assert_eq!(
                p as usize,
                crate::per_thread::cuStreamGetId_ptsz as *const () as usize
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(lookup("cuFuncLoad", 12030, 0), Lookup::VersionTooLow);
        assert_eq!(found("cuFuncLoad", 12040), cuFuncLoad as *const () as usize);
        assert_eq!(
            found("cuEventRecordWithFlags", 11010),
            cuEventRecordWithFlags as *const () as usize
        );
        assert_eq!(
            found("cuLaunchGrid", 2000),
            cuLaunchGrid as *const () as usize
        );
        assert_eq!(
            found("cuMemcpy3DPeer", 12000),
            cuMemcpy3DPeer as *const () as usize
        );
    }

    #[test]
    fn old_abis_and_unimplemented_variants_are_not_answered_with_a_wrong_one() {
        assert_eq!(lookup("cuMemAlloc", 3010, 0), Lookup::VersionTooLow);
        // CUDA 2.0's buffer mapping took 32-bit sizes; only CUDA 3.2's form is answered.
        assert_eq!(lookup("cuGLMapBufferObject", 3010, 0), Lookup::NotFound);
        assert_eq!(
            found("cuGLMapBufferObject", 3020),
            crate::interop::cuGLMapBufferObject_v2 as *const () as usize
        );
        // CUDA 13.1 added a sync mode to host functions and a device to multicast binds.
        assert_eq!(
            found("cuLaunchHostFunc", 13000),
            cuLaunchHostFunc as *const () as usize
        );
        assert_eq!(
            found("cuLaunchHostFunc", 13010),
            cuLaunchHostFunc_v2 as *const () as usize
        );
        assert_eq!(
            found("cuMulticastBindMem", 13050),
            crate::peer::cuMulticastBindMem_v2 as *const () as usize
        );
        // CUDA 6.5's `_v2` linker functions; CUDA 5.5 callers get the first names.
        assert_eq!(
            found("cuLinkCreate", 5050),
            crate::linker::cuLinkCreate as *const () as usize
        );
        assert_eq!(
            found("cuLinkCreate", 12000),
            crate::linker::cuLinkCreate_v2 as *const () as usize
        );
        // CUDA 11.7 renamed the stream memory operations (`_v2`); older callers get the first.
        assert_eq!(
            found("cuStreamWaitValue32", 11060),
            crate::mem_ops::cuStreamWaitValue32 as *const () as usize
        );
        assert_eq!(
            found("cuStreamWaitValue32", 11070),
            crate::mem_ops::cuStreamWaitValue32_v2 as *const () as usize
        );
        assert_eq!(
            lookup("cuStreamWaitValue64", 8000, 0),
            Lookup::VersionTooLow
        );
        assert_eq!(
            found("cuGraphNodeSetEnabled", 12000),
            crate::graph::api::cuGraphNodeSetEnabled as *const () as usize
        );
        assert_eq!(
            lookup("cuGraphNodeGetEnabled", 11000, 0),
            Lookup::VersionTooLow
        );
        assert_eq!(
            found("cuGraphInstantiate", 12000),
            cuGraphInstantiateWithFlags as *const () as usize
        );
        // CUDA 13 asks for the ABIs it was built with.
        assert_eq!(
            found("cuCtxCreate", 13000),
            cuCtxCreate_v4 as *const () as usize
        );
        assert_eq!(
            found("cuCtxGetDevice", 13000),
            cuCtxGetDevice_v2 as *const () as usize
        );
        assert_eq!(
            found("cuCtxSynchronize", 12090),
            cuCtxSynchronize as *const () as usize
        );
    }

    #[test]
    fn the_generic_node_api_resolves_by_the_version_cuda_introduced_it() {
        use crate::graph::generic;
        assert_eq!(lookup("cuGraphAddNode", 12010, 0), Lookup::VersionTooLow);
        assert_eq!(
            found("cuGraphAddNode", 12020),
            generic::cuGraphAddNode as *const () as usize
        );
        assert_eq!(
            found("cuGraphAddNode", 12030),
            generic::cuGraphAddNode_v2 as *const () as usize
        );
        assert_eq!(
            found("cuGraphAddNode_v2", 12090),
            generic::cuGraphAddNode_v2 as *const () as usize
        );
        assert_eq!(
            found("cuGraphNodeSetParams", 12020),
            generic::cuGraphNodeSetParams as *const () as usize
        );
        assert_eq!(
            lookup("cuGraphExecNodeSetParams", 12010, 0),
            Lookup::VersionTooLow
        );
        assert_eq!(
            found("cuGraphExecNodeSetParams", 13000),
            generic::cuGraphExecNodeSetParams as *const () as usize
        );
        assert_eq!(
            found("cuGraphKernelNodeSetAttribute", 11000),
            crate::graph::attrs::cuGraphKernelNodeSetAttribute as *const () as usize
        );
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = base_names().collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
    }
}
