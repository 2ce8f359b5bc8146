//! Entry points vgpu exports but does not implement yet, so that libraries
//! which resolve them with `dlsym` when they start (cuBLAS and cuFFT look up
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
            #[doc = concat!("`", stringify!($name), "`: ", $what, ", not supported yet.")]
            #[unsafe(no_mangle)]
            pub extern "C" fn $name() -> CUresult {
                crate::debug!(concat!(stringify!($name), ": ", $what, " is not supported yet"));
                cuda::CUDA_ERROR_NOT_SUPPORTED
            }
        )*

        /// The names exported here.
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}

not_supported! {
    cuTensorMapEncodeTiled: "tensor maps (TMA)";
    cuLibraryGetUnifiedFunction: "unified functions (host and device share code on systems with HMM)";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_is_not_supported() {
        assert_eq!(NAMES.len(), 2);
        assert_eq!(cuTensorMapEncodeTiled(), cuda::CUDA_ERROR_NOT_SUPPORTED);
    }
}
