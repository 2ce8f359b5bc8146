//! Entry points vgpu exports without the feature behind them, so that programs linked against
//! them and libraries which resolve them with `dlsym` when they start (cuBLAS and cuFFT look up
//! the tensor-map functions and refuse to start if any is missing) load and run everything
//! else. Each call returns `CUDA_ERROR_NOT_SUPPORTED`, as CUDA does for a
//! feature a device lacks, and logs which function was refused
//! (`VGPU_LOG=debug`). docs/compatibility.md lists them.
#![allow(non_snake_case)]

use vgpu_proto::cuda;

use crate::ffi::CUresult;

macro_rules! not_supported {
    ($($name:ident: $what:literal;)*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: ", $what, ", not supported by vgpu.")]
            #[unsafe(no_mangle)]
            pub extern "C" fn $name() -> CUresult {
                crate::debug!(concat!(stringify!($name), ": ", $what, " is not supported by vgpu"));
                cuda::CUDA_ERROR_NOT_SUPPORTED
            }
        )*

        /// The names exported here.
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}

not_supported! {
    cuTensorMapEncodeTiled: "tensor maps (TMA)";
    cuTensorMapEncodeIm2col: "tensor maps (TMA)";
    cuTensorMapEncodeIm2colWide: "tensor maps (TMA)";
    cuTensorMapReplaceAddress: "tensor maps (TMA)";
    cuLibraryGetUnifiedFunction: "unified functions (host and device share code on systems with HMM)";
    cuCheckpointProcessCheckpoint: "checkpointing a process's GPU state (cuda-checkpoint)";
    cuCheckpointProcessGetRestoreThreadId: "checkpointing a process's GPU state (cuda-checkpoint)";
    cuCheckpointProcessGetState: "checkpointing a process's GPU state (cuda-checkpoint)";
    cuCheckpointProcessLock: "checkpointing a process's GPU state (cuda-checkpoint)";
    cuCheckpointProcessRestore: "checkpointing a process's GPU state (cuda-checkpoint)";
    cuCheckpointProcessUnlock: "checkpointing a process's GPU state (cuda-checkpoint)";
    cuCheckpointOperationComplete: "checkpointing a process's GPU state (cuda-checkpoint)";
    cuTensorMapSetAllocationClass: "tensor maps (TMA)";
    cuCoredumpGetAttribute: "GPU core dumps";
    cuCoredumpGetAttributeGlobal: "GPU core dumps";
    cuCoredumpSetAttribute: "GPU core dumps";
    cuCoredumpSetAttributeGlobal: "GPU core dumps";
    cuCoredumpRegisterStartCallback: "GPU core dumps";
    cuCoredumpRegisterCompleteCallback: "GPU core dumps";
    cuCoredumpDeregisterStartCallback: "GPU core dumps";
    cuCoredumpDeregisterCompleteCallback: "GPU core dumps";
    cuDeviceGetLuid: "a device's Windows LUID (Windows only)";
    cuDeviceGetNvSciSyncAttributes: "NvSciSync objects (NVIDIA DRIVE and Jetson)";
    cuMemGetHandleForAddressRange: "dma-buf file descriptors of device memory (DMA_BUF_SUPPORTED is 0)";
    cuMemBatchDecompressAsync: "the copy engines' decompression (MEM_DECOMPRESS_ALGORITHM_MASK is 0)";
    cuMemBatchDecompressAsync_ptsz: "the copy engines' decompression (MEM_DECOMPRESS_ALGORITHM_MASK is 0)";
    cuStreamBeginCaptureToCig: "capture into a Direct3D 12 or Vulkan command list (CIG)";
    cuStreamBeginCaptureToCig_ptsz: "capture into a Direct3D 12 or Vulkan command list (CIG)";
    cuStreamEndCaptureToCig: "capture into a Direct3D 12 or Vulkan command list (CIG)";
    cuStreamEndCaptureToCig_ptsz: "capture into a Direct3D 12 or Vulkan command list (CIG)";
    cuProfilerInitialize: "the command-line profiler's configuration (removed from CUDA)";
    cuDeviceGetFabricClusterUuid: "NVLink fabric clusters (a VM's device is on no fabric)";
    cuDeviceGetCliqueCount: "NVLink fabric cliques (a VM's device is on no fabric)";
    cuDeviceGetCliqueInfo: "NVLink fabric cliques (a VM's device is on no fabric)";
    cuFabricCpyBatchAsync: "copies over an NVLink fabric (a VM's device is on no fabric)";
    cuFabricCpyBatchAsync_ptsz: "copies over an NVLink fabric (a VM's device is on no fabric)";
    cuLogicalEndpointIdReserve: "logical endpoints (multicast over an NVLink fabric)";
    cuLogicalEndpointIdRelease: "logical endpoints (multicast over an NVLink fabric)";
    cuLogicalEndpointCreate: "logical endpoints (multicast over an NVLink fabric)";
    cuLogicalEndpointDestroy: "logical endpoints (multicast over an NVLink fabric)";
    cuLogicalEndpointAddDevice: "logical endpoints (multicast over an NVLink fabric)";
    cuLogicalEndpointBindMem: "logical endpoints (multicast over an NVLink fabric)";
    cuLogicalEndpointBindAddr: "logical endpoints (multicast over an NVLink fabric)";
    cuLogicalEndpointUnbind: "logical endpoints (multicast over an NVLink fabric)";
    cuLogicalEndpointExport: "logical endpoints (multicast over an NVLink fabric)";
    cuLogicalEndpointImport: "logical endpoints (multicast over an NVLink fabric)";
    cuLogicalEndpointGetLimits: "logical endpoints (multicast over an NVLink fabric)";
    cuLogicalEndpointQuery: "logical endpoints (multicast over an NVLink fabric)";
    cuStreamBeginRecaptureToGraph: "recapture into an existing graph";
    cuStreamBeginRecaptureToGraph_ptsz: "recapture into an existing graph";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_is_not_supported() {
        let mut names = NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), NAMES.len(), "a name is listed twice");
        assert_eq!(cuTensorMapEncodeTiled(), cuda::CUDA_ERROR_NOT_SUPPORTED);
        assert_eq!(cuCheckpointProcessLock(), cuda::CUDA_ERROR_NOT_SUPPORTED);
        assert_eq!(cuLogicalEndpointQuery(), cuda::CUDA_ERROR_NOT_SUPPORTED);
    }
}
