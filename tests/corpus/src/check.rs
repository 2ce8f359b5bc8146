//! Case failures and the comparisons that produce them.

use std::fmt::Debug;

use crate::cuda;

/// Why a case failed.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    /// A driver call returned an error the case did not expect.
    #[error("{op} returned {code} ({name})", name = cuda::name(*code))]
    Cuda {
        /// The call, e.g. `cuLaunchKernel(saxpy)`.
        op: String,
        /// The `CUresult` it returned.
        code: i32,
    },
    /// A call expected to fail with a specific code succeeded or failed differently.
    #[error("{op}: expected {expected} ({ename}), got {got} ({gname})",
            ename = cuda::name(*expected), gname = cuda::name(*got))]
    WrongResult {
        /// What was attempted.
        op: String,
        /// The `CUresult` the case expects.
        expected: i32,
        /// The `CUresult` that came back (0 for success).
        got: i32,
    },
    /// Output differs from the CPU reference.
    #[error(
        "{what}: {count} of {total} elements differ; first at index {index}: expected {expected}, got {got}"
    )]
    Mismatch {
        /// Which output (and comparison rule).
        what: String,
        /// First differing element.
        index: usize,
        /// The reference value there.
        expected: String,
        /// The device value there.
        got: String,
        /// How many elements differ.
        count: usize,
        /// How many elements were compared.
        total: usize,
    },
    /// Anything else the device reported that contradicts CUDA semantics.
    #[error("{0}")]
    Invalid(String),
}

impl CaseError {
    /// A failed driver call.
    pub(crate) fn cuda(op: impl Into<String>, code: i32) -> CaseError {
        CaseError::Cuda {
            op: op.into(),
            code,
        }
    }
}

/// Compares element by element with `same(got, expected)`; reports the first
/// difference (with `show` for both sides) and how many differ.
pub(crate) fn compare_by<T, U>(
    what: &str,
    got: &[T],
    expected: &[U],
    same: impl Fn(usize, &T, &U) -> bool,
    show: impl Fn(usize, &T, &U) -> (String, String),
) -> Result<(), CaseError> {
    if got.len() != expected.len() {
        return Err(CaseError::Invalid(format!(
            "{what}: got {} elements, expected {}",
            got.len(),
            expected.len()
        )));
    }
    let mut first = None;
    let mut count = 0;
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        if !same(i, g, e) {
            count += 1;
            first.get_or_insert(i);
        }
    }
    match first {
        None => Ok(()),
        Some(index) => {
            let (expected_s, got_s) = show(index, &got[index], &expected[index]);
            Err(CaseError::Mismatch {
                what: what.to_string(),
                index,
                expected: expected_s,
                got: got_s,
                count,
                total: got.len(),
            })
        }
    }
}

/// Exact equality (integers, or floats that must match bit for bit without NaNs).
pub(crate) fn exact<T: PartialEq + Debug>(
    what: &str,
    got: &[T],
    expected: &[T],
) -> Result<(), CaseError> {
    compare_by(
        what,
        got,
        expected,
        |_, g, e| g == e,
        |_, g, e| (format!("{e:?}"), format!("{g:?}")),
    )
}

/// Exact u32 equality, shown in hex.
pub(crate) fn exact_hex32(what: &str, got: &[u32], expected: &[u32]) -> Result<(), CaseError> {
    compare_by(
        what,
        got,
        expected,
        |_, g, e| g == e,
        |_, g, e| (format!("{e:#010x}"), format!("{g:#010x}")),
    )
}

/// Exact u64 equality, shown in hex.
pub(crate) fn exact_hex64(what: &str, got: &[u64], expected: &[u64]) -> Result<(), CaseError> {
    compare_by(
        what,
        got,
        expected,
        |_, g, e| g == e,
        |_, g, e| (format!("{e:#018x}"), format!("{g:#018x}")),
    )
}

/// f32 bit equality, any NaN matching any NaN.
pub(crate) fn bits_f32(what: &str, got: &[f32], expected: &[f32]) -> Result<(), CaseError> {
    compare_by(
        what,
        got,
        expected,
        |_, g, e| crate::float::same_f32(*g, *e),
        |_, g, e| {
            (
                format!("{e:e} ({:#010x})", e.to_bits()),
                format!("{g:e} ({:#010x})", g.to_bits()),
            )
        },
    )
}

/// f64 bit equality, any NaN matching any NaN.
pub(crate) fn bits_f64(what: &str, got: &[f64], expected: &[f64]) -> Result<(), CaseError> {
    compare_by(
        what,
        got,
        expected,
        |_, g, e| crate::float::same_f64(*g, *e),
        |_, g, e| {
            (
                format!("{e:e} ({:#018x})", e.to_bits()),
                format!("{g:e} ({:#018x})", g.to_bits()),
            )
        },
    )
}

/// `|got - expected| <= tol[i]` with the reference and bound in f64; a NaN
/// reference needs a NaN result.
pub(crate) fn within<T: Copy + Into<f64>>(
    what: &str,
    got: &[T],
    expected: &[f64],
    tol: &[f64],
) -> Result<(), CaseError> {
    compare_by(
        what,
        got,
        expected,
        |i, g, e| {
            let g: f64 = (*g).into();
            if e.is_nan() {
                g.is_nan()
            } else {
                (g - e).abs() <= tol[i]
            }
        },
        |i, g, e| {
            let g: f64 = (*g).into();
            (
                format!("{e:e} (+-{:e})", tol[i]),
                format!("{g:e} (off by {:e})", (g - e).abs()),
            )
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_reports_first_index_and_count() {
        let err = exact("v", &[1, 2, 9, 4, 8], &[1, 2, 3, 4, 5]).unwrap_err();
        match err {
            CaseError::Mismatch {
                index,
                count,
                total,
                ref expected,
                ref got,
                ..
            } => {
                assert_eq!((index, count, total), (2, 2, 5));
                assert_eq!((expected.as_str(), got.as_str()), ("3", "9"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(exact("v", &[1u8], &[1u8]).is_ok());
        assert!(matches!(
            exact("v", &[1u8], &[1u8, 2]),
            Err(CaseError::Invalid(_))
        ));
    }

    #[test]
    fn nan_and_tolerance_rules() {
        assert!(bits_f32("f", &[f32::NAN, -0.0], &[-f32::NAN, -0.0]).is_ok());
        assert!(bits_f32("f", &[0.0], &[-0.0]).is_err());
        assert!(within("w", &[1.0f32, f32::NAN], &[1.001, f64::NAN], &[0.01, 0.0]).is_ok());
        assert!(within("w", &[1.0f32], &[1.1], &[0.01]).is_err());
        assert!(within("w", &[f32::NAN], &[1.0], &[1e9]).is_err());
        assert!(within("w", &[1.0f32], &[f64::NAN], &[1e9]).is_err());
    }

    #[test]
    fn messages_name_the_code() {
        let e = CaseError::cuda("cuLaunchKernel(k)", 700);
        assert_eq!(
            e.to_string(),
            "cuLaunchKernel(k) returned 700 (CUDA_ERROR_ILLEGAL_ADDRESS)"
        );
    }
}
