//! One module per `.cu` file; each lists its cases.

mod atomics;
mod basic;
mod bitonic;
mod bitops;
mod constant;
mod device_funcs;
mod dynamic_shared;
mod float_special;
mod fp_rounding;
mod grid;
mod half;
mod histogram;
mod int64;
mod intdiv;
mod ldg;
mod mandelbrot;
mod matmul;
mod nbody;
mod oob;
mod params;
mod reduce;
mod scan;
mod softmax;
mod stencil;
mod transpose;
mod warp;

use crate::Case;

pub(crate) fn all() -> Vec<Case> {
    let groups: [&[Case]; 26] = [
        basic::CASES,
        grid::CASES,
        matmul::CASES,
        transpose::CASES,
        reduce::CASES,
        scan::CASES,
        histogram::CASES,
        softmax::CASES,
        stencil::CASES,
        mandelbrot::CASES,
        nbody::CASES,
        bitonic::CASES,
        int64::CASES,
        intdiv::CASES,
        device_funcs::CASES,
        dynamic_shared::CASES,
        constant::CASES,
        warp::CASES,
        atomics::CASES,
        half::CASES,
        bitops::CASES,
        float_special::CASES,
        fp_rounding::CASES,
        ldg::CASES,
        params::CASES,
        oob::CASES,
    ];
    groups.concat()
}

/// Imports every case module uses.
mod prelude {
    pub(crate) use crate::check::{
        CaseError, bits_f32, bits_f64, compare_by, exact, exact_hex32, exact_hex64, within,
    };
    pub(crate) use crate::ctx::{POISON, blocks, int, with_module};
    pub(crate) use crate::float::{U32, U64};
    pub(crate) use crate::rng::Rng;
    pub(crate) use crate::{Arch, Arg, Case, Gpu};
}
