//! The error a CUDA call returns: a `CUresult` and a message for logs.

use std::fmt;

use vgpu_proto::cuda::{self, CuResult};

/// A failed call: the `CUresult` the guest sees and a message that says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CuError {
    /// The `CUresult` code.
    pub code: CuResult,
    /// A sentence for logs and `VGPU_LOG=debug` in the guest.
    pub message: String,
}

impl CuError {
    /// An error with a code and a message.
    pub fn new(code: CuResult, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `CUDA_ERROR_INVALID_VALUE`.
    pub fn invalid_value(message: impl Into<String>) -> Self {
        Self::new(cuda::CUDA_ERROR_INVALID_VALUE, message)
    }

    /// A request that does not decode: `CUDA_ERROR_NOT_SUPPORTED` for an opcode this broker does
    /// not know, `CUDA_ERROR_INVALID_VALUE` for a malformed body.
    pub fn rejected(opcode: u16, e: &vgpu_proto::wire::DecodeError) -> Self {
        let code = match e {
            vgpu_proto::wire::DecodeError::UnknownOpcode(_) => cuda::CUDA_ERROR_NOT_SUPPORTED,
            _ => cuda::CUDA_ERROR_INVALID_VALUE,
        };
        Self::new(code, format!("request {opcode:#06x} rejected: {e}"))
    }

    /// `CUDA_ERROR_INVALID_HANDLE`.
    pub fn invalid_handle(message: impl Into<String>) -> Self {
        Self::new(cuda::CUDA_ERROR_INVALID_HANDLE, message)
    }

    /// `CUDA_ERROR_INVALID_CONTEXT`.
    pub fn invalid_context(message: impl Into<String>) -> Self {
        Self::new(cuda::CUDA_ERROR_INVALID_CONTEXT, message)
    }

    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn out_of_memory(message: impl Into<String>) -> Self {
        Self::new(cuda::CUDA_ERROR_OUT_OF_MEMORY, message)
    }

    /// `CUDA_ERROR_NOT_SUPPORTED`.
    pub fn not_supported(message: impl Into<String>) -> Self {
        Self::new(cuda::CUDA_ERROR_NOT_SUPPORTED, message)
    }

    /// `CUDA_ERROR_NOT_READY` (not a failure: work is still running).
    pub fn not_ready() -> Self {
        Self::new(cuda::CUDA_ERROR_NOT_READY, "work is still pending")
    }

    /// The code's name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn name(&self) -> &'static str {
        cuda::result_name(self.code).unwrap_or("CUDA_ERROR_UNKNOWN")
    }
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.name(), self.code, self.message)
    }
}

impl std::error::Error for CuError {}

/// Result of a broker operation.
pub type CuResultOf<T> = Result<T, CuError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_code() {
        let e = CuError::out_of_memory("slice of 1 MiB exhausted");
        assert_eq!(
            e.to_string(),
            "CUDA_ERROR_OUT_OF_MEMORY (2): slice of 1 MiB exhausted"
        );
    }
}
