//! oob.cu.

use super::prelude::*;
use crate::cuda::ERROR_ILLEGAL_ADDRESS;

pub(crate) const CASES: &[Case] = &[Case {
    name: "oob_write",
    file: "oob",
    kernels: &["oob_write"],
    run: oob_write,
}];

/// 2^38 ints = 1 TiB past a 1 KiB buffer: outside any allocation on the
/// simulator and unmapped on a real GPU (a store just past the end would land in
/// the same 2 MiB page there and not fault).
const OFFSET_ELEMS: i64 = 1 << 38;

/// The launch or the following synchronize must return exactly
/// CUDA_ERROR_ILLEGAL_ADDRESS; any other code, or success, fails the case. After
/// it, frees may report the same sticky error (a real GPU's context is dead).
fn oob_write(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    with_module(gpu, arch, "oob", |c| {
        let buf = c.zeros::<i32>(256)?;
        c.tolerate_sticky(ERROR_ILLEGAL_ADDRESS);
        let module = c.module();
        let args = [Arg::Ptr(buf), Arg::I64(OFFSET_ELEMS), Arg::I32(42)];
        let got = match c
            .gpu()
            .launch(module, "oob_write", [1, 1, 1], [64, 1, 1], 0, &args)
        {
            Err(code) => code,
            Ok(()) => match c.gpu().synchronize() {
                Err(code) => code,
                Ok(()) => 0,
            },
        };
        if got != ERROR_ILLEGAL_ADDRESS {
            return Err(CaseError::WrongResult {
                op: "out-of-bounds store (launch + synchronize)".into(),
                expected: ERROR_ILLEGAL_ADDRESS,
                got,
            });
        }
        Ok(())
    })
}
