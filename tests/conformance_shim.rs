//! The device conformance suite on the real-GPU executor (`devices/cuda`)
//! driving vgpu's own guest shim as its `libcuda.so.1`: the shim forwards
//! every driver call to a vgpud with a simulated GPU. This is NOT a GPU test
//! — it exercises the executor's whole driver path (driver loading through
//! `cuGetProcAddress_v2`, one context per VM, kernel layouts through
//! `cuFuncGetParamInfo` (the PTX scan that older drivers need is unit-tested
//! in `devices/cuda`), launches with a packed
//! `extra` buffer, staged copies, event timing, sticky-error recreation)
//! against a real implementation of the same ABI, on any machine.

use std::sync::Arc;

use vgpu_cuda::Driver;
use vgpu_tests::conformance::{Target, cuda_executor, run_checks, run_suite};
use vgpu_tests::harness::{TestVm, Vgpud, artifacts};

#[test]
fn the_real_gpu_executor_conforms_over_the_shim() {
    let d = Vgpud::start(&[TestVm::new("host", 3 << 30)]);
    // SAFETY: set before the shim reads it, while this binary's only test
    // runs no other thread that reads the environment.
    unsafe { std::env::set_var("VGPU_TRANSPORT", d.transport("host")) };
    let lib = artifacts().lib_dir.join("libcuda.so.1");
    let driver = Driver::load(&lib.to_string_lossy()).expect("loading the shim as the driver");
    assert!(
        driver.has_param_info(),
        "the shim answers cuFuncGetParamInfo: kernel layouts come from the driver"
    );
    let isolation = cuda_executor::open(&driver, None).vmm_isolation().clone();
    println!("VMM isolation probe over the shim: {isolation}");
    // The probe's two contexts are contexts of one remote VM, which share its address space:
    // the probe must see that, and the suite then checks that VMM features are refused.
    assert_eq!(isolation, vgpu_cuda::VmmIsolation::Shared);
    let d2 = Arc::clone(&driver);
    let driver_again = Arc::clone(&driver);
    let target = Target {
        name: "cuda over the shim".into(),
        make: Box::new(move |watchdog| cuda_executor::open(&d2, watchdog)),
        address_spaces: false,
        cuda_driver: Some(driver),
    };
    let mut report = run_suite(&target);
    report
        .results
        .extend(run_checks(&target, cuda_executor::CHECKS).results);
    println!("{report}");
    assert_eq!(report.failed(), 0, "{report}\nvgpud log:\n{}", d.log());

    // Again as on a GPU that keeps VMM mappings private to their context, so that the
    // executor's guest VMM and movable-allocation code runs too (the probe is overridden for
    // this process only; vgpud never does that).
    vgpu_cuda::override_vmm_isolation(Some(vgpu_cuda::VmmIsolation::Isolated));
    let isolated = cuda_executor::open(&driver_again, None)
        .vmm_isolation()
        .clone();
    assert_eq!(isolated, vgpu_cuda::VmmIsolation::Isolated);
    let d3 = Arc::clone(&driver_again);
    let target = Target {
        name: "cuda over the shim, VMM isolation assumed".into(),
        make: Box::new(move |watchdog| cuda_executor::open(&d3, watchdog)),
        address_spaces: false,
        cuda_driver: Some(Arc::clone(&driver_again)),
    };
    let mut report = run_suite(&target);
    report
        .results
        .extend(run_checks(&target, cuda_executor::CHECKS).results);
    vgpu_cuda::override_vmm_isolation(None);
    println!("{report}");
    assert_eq!(report.failed(), 0, "{report}\nvgpud log:\n{}", d.log());
    // The benchmark's code path (its numbers measure the shim and a simulated GPU, not a GPU).
    println!(
        "over the shim: {}",
        cuda_executor::copy_bandwidth(target.cuda_driver.as_ref().unwrap(), 8)
    );
}
