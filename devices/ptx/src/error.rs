//! Load errors and kernel faults.

use std::fmt;

/// Why a module failed to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadErrorKind {
    /// The text is not valid PTX (syntax error, undefined name, bad operand).
    InvalidPtx,
    /// Valid PTX that this interpreter does not implement (for example tensor-core or texture
    /// instructions).
    NotSupported,
    /// The load ran past its deadline ([`crate::LoadWatch`]); the module may be valid.
    TimedOut,
    /// The load was cancelled ([`crate::LoadWatch`]): its requester has gone.
    Cancelled,
}

/// A module failed to load; `line` is the 1-based PTX line (0 when no line applies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// Invalid or unsupported.
    pub kind: LoadErrorKind,
    /// 1-based line in the PTX text.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for LoadError {}

impl LoadError {
    pub(crate) fn invalid(line: usize, message: impl Into<String>) -> LoadError {
        LoadError {
            kind: LoadErrorKind::InvalidPtx,
            line,
            message: message.into(),
        }
    }

    pub(crate) fn unsupported(line: usize, message: impl Into<String>) -> LoadError {
        LoadError {
            kind: LoadErrorKind::NotSupported,
            line,
            message: message.into(),
        }
    }
}

/// Why a launch stopped with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// A memory access outside what the tenant owns (CUDA_ERROR_ILLEGAL_ADDRESS, 700).
    IllegalAddress,
    /// A memory access not aligned to its size (CUDA_ERROR_MISALIGNED_ADDRESS, 716).
    MisalignedAddress,
    /// `trap` executed or a similar fatal kernel condition (CUDA_ERROR_LAUNCH_FAILED, 719).
    Trap,
    /// A device-side `assert` failed (`__assertfail`; CUDA_ERROR_ASSERT, 710).
    Assert,
    /// The watchdog deadline passed, or the block deadlocked at a barrier
    /// (CUDA_ERROR_LAUNCH_TIMEOUT, 702).
    Timeout,
    /// An instruction that cannot execute as given (CUDA_ERROR_ILLEGAL_INSTRUCTION, 715).
    IllegalInstruction,
    /// Bad grid/block/shared-memory size or parameter buffer (CUDA_ERROR_INVALID_VALUE, 1, or
    /// CUDA_ERROR_INVALID_CONFIGURATION, 9; see [`Fault::cuda_error`]).
    InvalidConfig,
    /// The launch was cancelled through [`crate::LaunchControl::cancel`].
    Cancelled,
    /// The block's register file would pass what one block may hold
    /// (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, 701; not sticky: nothing ran).
    OutOfResources,
    /// A cooperative launch with more blocks than can run at once
    /// (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, 720; not sticky: nothing ran).
    CooperativeTooLarge,
    /// The tenant's budget for interpreter state ([`crate::StateBudget`]) has no room for even
    /// one block of the launch (CUDA_ERROR_OUT_OF_MEMORY, 2, as a driver that cannot allocate a
    /// launch's local memory reports; not sticky: nothing ran).
    OutOfMemory,
}

/// A launch failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// What went wrong.
    pub kind: FaultKind,
    /// Details: address, kernel name, PTX line, block and thread.
    pub message: String,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Fault {}

/// `CUDA_ERROR_INVALID_VALUE`.
pub const CUDA_ERROR_INVALID_VALUE: u32 = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;
/// `CUDA_ERROR_INVALID_CONFIGURATION` (the runtime's cudaErrorInvalidConfiguration value, which
/// the driver reports for bad launch geometry as CUDA_ERROR_INVALID_VALUE on some paths).
pub const CUDA_ERROR_INVALID_CONFIGURATION: u32 = 9;
/// `CUDA_ERROR_ILLEGAL_ADDRESS`.
pub const CUDA_ERROR_ILLEGAL_ADDRESS: u32 = 700;
/// `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`.
pub const CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: u32 = 701;
/// `CUDA_ERROR_LAUNCH_TIMEOUT`.
pub const CUDA_ERROR_LAUNCH_TIMEOUT: u32 = 702;
/// `CUDA_ERROR_ASSERT`.
pub const CUDA_ERROR_ASSERT: u32 = 710;
/// `CUDA_ERROR_ILLEGAL_INSTRUCTION`.
pub const CUDA_ERROR_ILLEGAL_INSTRUCTION: u32 = 715;
/// `CUDA_ERROR_MISALIGNED_ADDRESS`.
pub const CUDA_ERROR_MISALIGNED_ADDRESS: u32 = 716;
/// `CUDA_ERROR_LAUNCH_FAILED`.
pub const CUDA_ERROR_LAUNCH_FAILED: u32 = 719;
/// `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`.
pub const CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE: u32 = 720;

impl Fault {
    pub(crate) fn new(kind: FaultKind, message: impl Into<String>) -> Fault {
        Fault {
            kind,
            message: message.into(),
        }
    }

    /// The `CUresult` a driver reports for this fault. Invalid configurations report
    /// `CUDA_ERROR_INVALID_VALUE` (1), as `cuLaunchKernel` does; a cancelled launch reports
    /// `CUDA_ERROR_LAUNCH_FAILED`.
    pub fn cuda_error(&self) -> u32 {
        match self.kind {
            FaultKind::IllegalAddress => CUDA_ERROR_ILLEGAL_ADDRESS,
            FaultKind::MisalignedAddress => CUDA_ERROR_MISALIGNED_ADDRESS,
            FaultKind::Trap | FaultKind::Cancelled => CUDA_ERROR_LAUNCH_FAILED,
            FaultKind::Assert => CUDA_ERROR_ASSERT,
            FaultKind::Timeout => CUDA_ERROR_LAUNCH_TIMEOUT,
            FaultKind::IllegalInstruction => CUDA_ERROR_ILLEGAL_INSTRUCTION,
            FaultKind::InvalidConfig => CUDA_ERROR_INVALID_VALUE,
            FaultKind::OutOfResources => CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            FaultKind::CooperativeTooLarge => CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
            FaultKind::OutOfMemory => CUDA_ERROR_OUT_OF_MEMORY,
        }
    }

    /// True when the fault poisons the context (everything except a rejected configuration,
    /// which CUDA reports without running anything).
    pub fn is_sticky(&self) -> bool {
        !matches!(
            self.kind,
            FaultKind::InvalidConfig
                | FaultKind::OutOfResources
                | FaultKind::CooperativeTooLarge
                | FaultKind::OutOfMemory
        )
    }
}
