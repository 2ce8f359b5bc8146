//! The vgpu kernel corpus: real CUDA C++ kernels (`tests/kernels/*.cu`) compiled
//! by NVRTC into committed PTX fixtures, each paired with a case that builds
//! deterministic inputs, runs the kernel on some [`Gpu`], and checks the result
//! against a CPU reference computed at run time.
//!
//! The crate knows nothing about any backend: the simulated GPU, the guest shim
//! and a real GPU each implement [`Gpu`], and [`run_all`] produces a [`Report`].

mod cases;
mod check;
mod ctx;
mod fixtures;
mod float;
mod report;
mod rng;
#[cfg(test)]
mod testutils;

use std::fmt;

pub use check::CaseError;
pub use fixtures::{FILES, ptx};
pub use report::{GpuFactory, Outcome, Report, run_all, run_cases};

/// CUDA driver result codes the corpus itself names.
pub mod cuda {
    /// `CUDA_SUCCESS`.
    pub const SUCCESS: i32 = 0;
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub const ERROR_INVALID_VALUE: i32 = 1;
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const ERROR_OUT_OF_MEMORY: i32 = 2;
    /// `CUDA_ERROR_NOT_FOUND` (e.g. an unknown kernel or global name).
    pub const ERROR_NOT_FOUND: i32 = 500;
    /// `CUDA_ERROR_ILLEGAL_ADDRESS`: a kernel touched memory it does not own.
    pub const ERROR_ILLEGAL_ADDRESS: i32 = 700;
    /// `CUDA_ERROR_LAUNCH_FAILED`.
    pub const ERROR_LAUNCH_FAILED: i32 = 719;

    /// The `CUresult` enumerator name for the codes above, or "?" for others.
    pub fn name(code: i32) -> &'static str {
        match code {
            SUCCESS => "CUDA_SUCCESS",
            ERROR_INVALID_VALUE => "CUDA_ERROR_INVALID_VALUE",
            ERROR_OUT_OF_MEMORY => "CUDA_ERROR_OUT_OF_MEMORY",
            ERROR_NOT_FOUND => "CUDA_ERROR_NOT_FOUND",
            ERROR_ILLEGAL_ADDRESS => "CUDA_ERROR_ILLEGAL_ADDRESS",
            ERROR_LAUNCH_FAILED => "CUDA_ERROR_LAUNCH_FAILED",
            _ => "?",
        }
    }
}

/// Which PTX fixture a case loads: the `.target` NVRTC wrote for
/// `--gpu-architecture=compute_XX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    /// `compute_52` (Maxwell): no native f16 arithmetic, pre-Volta PTX idioms.
    Sm52,
    /// `compute_80` (Ampere).
    Sm80,
    /// `compute_90` (Hopper).
    Sm90,
}

impl Arch {
    /// Every fixture architecture, oldest first.
    pub const ALL: [Arch; 3] = [Arch::Sm52, Arch::Sm80, Arch::Sm90];

    /// The fixture file suffix, e.g. `sm_80` in `saxpy.sm_80.ptx`.
    pub fn suffix(self) -> &'static str {
        match self {
            Arch::Sm52 => "sm_52",
            Arch::Sm80 => "sm_80",
            Arch::Sm90 => "sm_90",
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.suffix())
    }
}

/// One kernel argument, as `cuLaunchKernel` would receive it through `kernelParams`.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// A device pointer.
    Ptr(u64),
    /// `char` / `signed char` / `unsigned char` (pass the bit pattern).
    I8(i8),
    /// `short` / `unsigned short` (pass the bit pattern).
    I16(i16),
    /// `int`.
    I32(i32),
    /// `unsigned int`.
    U32(u32),
    /// `long long`.
    I64(i64),
    /// `unsigned long long`.
    U64(u64),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
    /// A by-value struct, laid out exactly as the device compiler lays it out
    /// (the kernel's `.param .align A .b8 name[N]` gives alignment and size).
    Bytes(Vec<u8>),
}

impl Arg {
    /// The argument's little-endian bytes, the value `kernelParams[i]` points to.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            Arg::Ptr(v) | Arg::U64(v) => v.to_le_bytes().to_vec(),
            Arg::I8(v) => v.to_le_bytes().to_vec(),
            Arg::I16(v) => v.to_le_bytes().to_vec(),
            Arg::I32(v) => v.to_le_bytes().to_vec(),
            Arg::U32(v) => v.to_le_bytes().to_vec(),
            Arg::I64(v) => v.to_le_bytes().to_vec(),
            Arg::F32(v) => v.to_le_bytes().to_vec(),
            Arg::F64(v) => v.to_le_bytes().to_vec(),
            Arg::Bytes(b) => b.clone(),
        }
    }
}

/// A loaded module, as the backend numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModuleId(pub u64);

/// A CUDA-like device. Implemented over libcuda.so.1 (the guest shim), over the
/// PTX interpreter directly, and over a real GPU. Errors are raw `CUresult` codes.
pub trait Gpu {
    /// `cuModuleLoadData` with PTX text.
    fn load_module(&mut self, ptx: &str) -> Result<ModuleId, i32>;
    /// `cuModuleGetGlobal`: the device address and size of a module global.
    fn global(&mut self, m: ModuleId, name: &str) -> Result<(u64, usize), i32>;
    /// `cuMemAlloc`.
    fn alloc(&mut self, bytes: usize) -> Result<u64, i32>;
    /// `cuMemFree`.
    fn free(&mut self, ptr: u64) -> Result<(), i32>;
    /// `cuMemcpyHtoD`.
    fn htod(&mut self, dst: u64, data: &[u8]) -> Result<(), i32>;
    /// `cuMemcpyDtoH`.
    fn dtoh(&mut self, src: u64, out: &mut [u8]) -> Result<(), i32>;
    /// `cuMemsetD32`: `count` 32-bit words.
    fn memset_d32(&mut self, dst: u64, value: u32, count: usize) -> Result<(), i32>;
    /// `cuModuleGetFunction` + `cuLaunchKernel` on the default stream.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        m: ModuleId,
        kernel: &str,
        grid: [u32; 3],
        block: [u32; 3],
        dynamic_shared: u32,
        args: &[Arg],
    ) -> Result<(), i32>;
    /// `cuCtxSynchronize`: where asynchronous launch errors surface.
    fn synchronize(&mut self) -> Result<(), i32>;
}

/// One corpus case: a check of one or more kernels from one `.cu` file.
#[derive(Clone, Copy)]
pub struct Case {
    /// Unique case name.
    pub name: &'static str,
    /// The `.cu` file stem (fixture `tests/kernels/ptx/<file>.<arch>.ptx`).
    pub file: &'static str,
    /// The `extern "C"` kernels the case launches (each an `.entry` in the PTX).
    pub kernels: &'static [&'static str],
    /// Runs the case; frees everything it allocated, pass or fail.
    pub run: fn(&mut dyn Gpu, Arch) -> Result<(), CaseError>,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("file", &self.file)
            .field("kernels", &self.kernels)
            .finish()
    }
}

/// Every case, in a stable order. The out-of-bounds case, which may leave a real
/// GPU context unusable, comes last.
pub fn cases() -> Vec<Case> {
    cases::all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutils::{FakeGpu, LaunchMode};

    /// A device that stores data but never computes must fail every case: no
    /// case can pass without the kernel doing its work.
    #[test]
    fn every_case_fails_on_a_device_that_computes_nothing() {
        for case in cases() {
            let mut gpu = FakeGpu::new(LaunchMode::Ignore);
            let result = (case.run)(&mut gpu, Arch::Sm80);
            assert!(
                result.is_err(),
                "{} passed without any kernel running",
                case.name
            );
            assert_eq!(
                gpu.live(),
                0,
                "{} leaked {} allocations",
                case.name,
                gpu.live()
            );
        }
    }

    /// Launch errors surface as the CUresult that came back, and every
    /// allocation is still freed.
    #[test]
    fn launch_errors_are_reported_and_nothing_leaks() {
        for case in cases() {
            let mut gpu = FakeGpu::new(LaunchMode::Fail(cuda::ERROR_LAUNCH_FAILED));
            let err = (case.run)(&mut gpu, Arch::Sm52).expect_err(case.name);
            let msg = err.to_string();
            // The fake has no module globals, so cases that need one stop there.
            assert!(
                msg.contains("719") || msg.contains("cuModuleGetGlobal"),
                "{}: {msg}",
                case.name
            );
            assert_eq!(gpu.allocs, gpu.frees, "{} leaked", case.name);
            if !msg.contains("cuModuleGetGlobal") {
                assert!(
                    gpu.launches
                        .iter()
                        .all(|k| case.kernels.contains(&k.as_str())),
                    "{} launched {:?}, declares {:?}",
                    case.name,
                    gpu.launches,
                    case.kernels
                );
            }
        }
    }

    /// The out-of-bounds case passes only on exactly 700, from launch or sync.
    #[test]
    fn oob_case_accepts_only_illegal_address() {
        let oob = cases()
            .into_iter()
            .find(|c| c.name == "oob_write")
            .expect("oob case");
        let mut ok = FakeGpu::new(LaunchMode::Fail(cuda::ERROR_ILLEGAL_ADDRESS));
        assert!((oob.run)(&mut ok, Arch::Sm90).is_ok());
        let mut wrong = FakeGpu::new(LaunchMode::Fail(cuda::ERROR_LAUNCH_FAILED));
        let err = (oob.run)(&mut wrong, Arch::Sm90).unwrap_err().to_string();
        assert!(
            err.contains("expected 700") && err.contains("got 719"),
            "{err}"
        );
    }

    #[test]
    fn report_counts_and_prints_a_table() {
        let mut factory =
            || -> Result<Box<dyn Gpu>, i32> { Ok(Box::new(FakeGpu::new(LaunchMode::Ignore))) };
        let some: Vec<Case> = cases().into_iter().filter(|c| c.file == "saxpy").collect();
        let report = run_cases(&some, &mut factory, &[Arch::Sm52, Arch::Sm90]);
        assert_eq!((report.passed(), report.failed()), (0, 4));
        let text = report.to_string();
        assert!(
            text.contains("saxpy") && text.contains("sm_90") && text.contains("FAIL daxpy [sm_52]"),
            "{text}"
        );
        assert!(text.ends_with("corpus: 0 passed, 4 failed\n"), "{text}");

        let mut broken = || -> Result<Box<dyn Gpu>, i32> { Err(cuda::ERROR_OUT_OF_MEMORY) };
        let report = run_cases(&some[..1], &mut broken, &[Arch::Sm80]);
        assert!(
            report.outcomes[0]
                .error
                .as_deref()
                .unwrap_or("")
                .contains("CUresult 2")
        );
    }

    #[test]
    fn a_panicking_device_is_a_failure_not_a_crash() {
        struct Panics;
        impl Gpu for Panics {
            fn load_module(&mut self, _: &str) -> Result<ModuleId, i32> {
                panic!("backend bug")
            }
            fn global(&mut self, _: ModuleId, _: &str) -> Result<(u64, usize), i32> {
                Err(1)
            }
            fn alloc(&mut self, _: usize) -> Result<u64, i32> {
                Err(2)
            }
            fn free(&mut self, _: u64) -> Result<(), i32> {
                Err(1)
            }
            fn htod(&mut self, _: u64, _: &[u8]) -> Result<(), i32> {
                Err(1)
            }
            fn dtoh(&mut self, _: u64, _: &mut [u8]) -> Result<(), i32> {
                Err(1)
            }
            fn memset_d32(&mut self, _: u64, _: u32, _: usize) -> Result<(), i32> {
                Err(1)
            }
            fn launch(
                &mut self,
                _: ModuleId,
                _: &str,
                _: [u32; 3],
                _: [u32; 3],
                _: u32,
                _: &[Arg],
            ) -> Result<(), i32> {
                Err(1)
            }
            fn synchronize(&mut self) -> Result<(), i32> {
                Err(1)
            }
        }
        let mut factory = || -> Result<Box<dyn Gpu>, i32> { Ok(Box::new(Panics)) };
        let report = run_cases(&cases()[..1], &mut factory, &[Arch::Sm80]);
        assert_eq!(report.failed(), 1);
        assert!(
            report.outcomes[0]
                .error
                .as_deref()
                .unwrap_or("")
                .contains("panicked: backend bug")
        );
    }

    #[test]
    fn arg_bytes_are_little_endian_and_sized() {
        assert_eq!(Arg::I8(-1).to_le_bytes(), vec![0xff]);
        assert_eq!(Arg::I16(0x0102).to_le_bytes(), vec![2, 1]);
        assert_eq!(Arg::F32(1.0).to_le_bytes(), 1.0f32.to_le_bytes().to_vec());
        assert_eq!(Arg::Ptr(1).to_le_bytes().len(), 8);
        assert_eq!(Arg::Bytes(vec![1, 2, 3]).to_le_bytes(), vec![1, 2, 3]);
    }
}
