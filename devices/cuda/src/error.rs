//! Errors: why a CUDA device could not be opened ([`CudaError`]), and how a
//! driver `CUresult` becomes the broker's [`DeviceError`] ([`classify`]).

use std::sync::Arc;

use thiserror::Error;
use vgpu_broker::device::DeviceError;
use vgpu_proto::cuda::{self, CuResult};

/// Why a `kind = "cuda"` device could not be opened.
#[derive(Debug, Clone, Error)]
pub enum CudaError {
    /// The driver library could not be loaded.
    #[error(
        "no NVIDIA driver found ({library}): {source}; use kind = \"sim\" or install the driver"
    )]
    NoDriver {
        /// The library that was looked for.
        library: String,
        /// What the dynamic loader said.
        #[source]
        source: Arc<libloading::Error>,
    },
    /// The library lacks a function every supported driver has.
    #[error("{library} is not a usable CUDA driver: it has no {symbol}")]
    MissingSymbol {
        /// The library.
        library: String,
        /// The missing function.
        symbol: &'static str,
    },
    /// The driver is older than CUDA 12.0.
    #[error(
        "the NVIDIA driver supports CUDA {}.{}, vgpu needs 12.0 or newer: update the driver",
        .version / 1000, .version % 1000 / 10
    )]
    DriverTooOld {
        /// `cuDriverGetVersion`.
        version: i32,
    },
    /// The driver library loaded but `cuInit` failed: typically NVIDIA's
    /// user-space libraries are installed (the CUDA toolkit brings them)
    /// without the kernel driver, or the GPU is hidden from this process.
    #[error(
        "{library} loaded, but cuInit failed with {}: no usable NVIDIA GPU. Check that the NVIDIA kernel driver is loaded (`lsmod | grep nvidia`, /dev/nvidia0 exists), that `nvidia-smi` lists the GPU, that CUDA_VISIBLE_DEVICES does not hide it, and that the device's index or uuid in the config is one nvidia-smi -L shows; or use kind = \"sim\"",
        cuda::result_name(*.code).unwrap_or("an unknown CUresult")
    )]
    InitFailed {
        /// The driver library.
        library: String,
        /// What cuInit returned.
        code: CuResult,
    },
    /// A driver call failed while opening the device.
    #[error("{call} failed with {}", cuda::result_name(*.code).unwrap_or("an unknown CUresult"))]
    Driver {
        /// The driver function.
        call: &'static str,
        /// Its result.
        code: CuResult,
    },
    /// `index = N` names a GPU the driver does not list.
    #[error(
        "CUDA device index {index} does not exist: the driver lists {count} device(s) ({listed})"
    )]
    NoSuchIndex {
        /// The configured index.
        index: u32,
        /// How many devices the driver lists.
        count: i32,
        /// Their UUIDs.
        listed: String,
    },
    /// `uuid = "…"` names no GPU or MIG instance the driver lists.
    #[error("no CUDA device has UUID {uuid}; the driver lists: {listed}{hint}")]
    NoSuchUuid {
        /// The configured UUID.
        uuid: String,
        /// The UUIDs the driver lists.
        listed: String,
        /// What to do (for MIG instances).
        hint: String,
    },
    /// A UUID that is not `GPU-` or `MIG-` followed by 32 hex digits.
    #[error(
        "`{0}` is not a GPU or MIG UUID: expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx or MIG-… as nvidia-smi -L prints it"
    )]
    BadUuid(String),
    /// The config entry is not `kind = "cuda"`.
    #[error("device `{0}` is not a kind = \"cuda\" device")]
    NotCuda(String),
    /// MIG instances cannot be combined like this in one process.
    #[error("{0}")]
    Mig(String),
}

/// Whether a `CUresult` leaves the context unusable: CUDA's sticky errors
/// (every later call in the context returns them) and the uncorrectable
/// hardware errors.
pub fn is_context_fatal(code: CuResult) -> bool {
    cuda::is_sticky(code)
        || matches!(
            code,
            cuda::CUDA_ERROR_ECC_UNCORRECTABLE
                | cuda::CUDA_ERROR_NVLINK_UNCORRECTABLE
                | cuda::CUDA_ERROR_CONTEXT_IS_DESTROYED
        )
}

/// What kind of operation a failed driver call belonged to; it decides
/// which [`DeviceError`] variant carries the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Loading a module image.
    Load,
    /// Launching a kernel (`cuLaunchKernel` itself).
    Launch,
    /// Anything else (memory, streams, events, waiting for work).
    Other,
}

/// The [`DeviceError`] for a failed driver call.
pub fn classify(op: Op, call: &'static str, code: CuResult) -> DeviceError {
    let name = cuda::result_name(code).unwrap_or("an unknown CUresult");
    if code == cuda::CUDA_ERROR_OUT_OF_MEMORY {
        return DeviceError::OutOfMemory;
    }
    if is_context_fatal(code) {
        return DeviceError::Fault {
            code,
            message: format!(
                "{call} failed with {name}: the VM's GPU context is unusable until its processes end"
            ),
        };
    }
    match (op, code) {
        (
            Op::Load,
            cuda::CUDA_ERROR_INVALID_PTX
            | cuda::CUDA_ERROR_INVALID_IMAGE
            | cuda::CUDA_ERROR_INVALID_SOURCE
            | cuda::CUDA_ERROR_NO_BINARY_FOR_GPU
            | cuda::CUDA_ERROR_UNSUPPORTED_PTX_VERSION
            | cuda::CUDA_ERROR_JIT_COMPILER_NOT_FOUND
            | cuda::CUDA_ERROR_JIT_COMPILATION_DISABLED
            | cuda::CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND
            | cuda::CUDA_ERROR_SHARED_OBJECT_INIT_FAILED
            | cuda::CUDA_ERROR_NOT_SUPPORTED,
        ) => DeviceError::InvalidImage {
            code,
            message: format!("{call} refused the module image with {name}"),
        },
        (
            Op::Launch,
            cuda::CUDA_ERROR_INVALID_VALUE
            | cuda::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
            | cuda::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
            | cuda::CUDA_ERROR_INVALID_IMAGE
            | cuda::CUDA_ERROR_NO_BINARY_FOR_GPU,
        ) => DeviceError::InvalidLaunch {
            code,
            message: format!("{call} refused the launch with {name}"),
        },
        _ => DeviceError::Driver { call, code },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_is_the_broker_out_of_memory() {
        assert_eq!(
            classify(Op::Other, "cuMemAlloc_v2", cuda::CUDA_ERROR_OUT_OF_MEMORY),
            DeviceError::OutOfMemory
        );
        assert_eq!(
            classify(Op::Load, "cuModuleLoadDataEx", 2).cu_result(),
            cuda::CUDA_ERROR_OUT_OF_MEMORY
        );
    }

    #[test]
    fn sticky_errors_are_faults_whatever_the_call() {
        for code in [700, 702, 710, 714, 715, 716, 717, 718, 719, 214] {
            for op in [Op::Load, Op::Launch, Op::Other] {
                let e = classify(op, "cuEventQuery", code);
                assert!(
                    matches!(e, DeviceError::Fault { code: c, .. } if c == code),
                    "{code}: {e:?}"
                );
                assert_eq!(e.cu_result(), code);
            }
        }
        assert!(!is_context_fatal(cuda::CUDA_ERROR_INVALID_VALUE));
        assert!(!is_context_fatal(cuda::CUDA_ERROR_NOT_READY));
    }

    #[test]
    fn load_and_launch_errors_keep_their_codes() {
        let e = classify(Op::Load, "cuModuleLoadDataEx", cuda::CUDA_ERROR_INVALID_PTX);
        assert!(
            matches!(e, DeviceError::InvalidImage { code: 218, .. }),
            "{e:?}"
        );
        let e = classify(
            Op::Launch,
            "cuLaunchKernel",
            cuda::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        );
        assert!(
            matches!(e, DeviceError::InvalidLaunch { code: 701, .. }),
            "{e:?}"
        );
        // The same code outside its operation is a plain driver error.
        let e = classify(
            Op::Other,
            "cuMemcpyHtoDAsync_v2",
            cuda::CUDA_ERROR_INVALID_VALUE,
        );
        assert_eq!(
            e.to_string(),
            "cuMemcpyHtoDAsync_v2 failed with CUDA_ERROR_INVALID_VALUE"
        );
        assert_eq!(e.cu_result(), 1);
    }

    #[test]
    fn open_errors_say_what_to_do() {
        let e = CudaError::DriverTooOld { version: 11080 };
        assert_eq!(
            e.to_string(),
            "the NVIDIA driver supports CUDA 11.8, vgpu needs 12.0 or newer: update the driver"
        );
        let e = CudaError::NoSuchIndex {
            index: 3,
            count: 1,
            listed: "GPU-0".into(),
        };
        assert!(e.to_string().contains("index 3 does not exist"), "{e}");
    }
}
