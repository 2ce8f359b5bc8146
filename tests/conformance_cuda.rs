//! The device conformance suite on a real NVIDIA GPU through the real-GPU
//! executor (`devices/cuda`), when this machine has one: the probe loads
//! `libcuda.so.1` and asks it for devices; without a driver or a GPU the test
//! prints why and passes without checking anything.
//!
//! `VGPU_TEST_CUDA_LIBRARY` names another driver library (default
//! `libcuda.so.1`); `tests/gpu/run.sh` runs this binary on a GPU machine.

use std::sync::Arc;

use vgpu_cuda::Driver;
use vgpu_tests::conformance::{Target, cuda_executor, run_checks, run_suite};

fn probe() -> Result<Arc<Driver>, String> {
    let lib = std::env::var("VGPU_TEST_CUDA_LIBRARY")
        .unwrap_or_else(|_| vgpu_cuda::driver::DEFAULT_LIBRARY.into());
    let driver = Driver::load(&lib).map_err(|e| e.to_string())?;
    match driver.device_count() {
        Ok(n) if n > 0 => Ok(driver),
        Ok(_) => Err(format!("{lib} lists no CUDA device")),
        Err(f) => Err(format!("{lib}: {} failed with CUresult {}", f.call, f.code)),
    }
}

#[test]
fn a_real_gpu_conforms() {
    let driver = match probe() {
        Ok(d) => d,
        Err(why) => {
            println!("\nSKIPPED: the real-GPU conformance suite needs an NVIDIA GPU: {why}");
            return;
        }
    };
    println!(
        "\nCUDA driver {} ({}), optional 12.4 entry points: {}",
        driver.version(),
        driver.library(),
        driver.has_param_info()
    );
    // Printed for tests/gpu/run.sh's summary: whether another context's kernel faults on a VMM
    // mapping decides whether movable allocations and guests' cuMemCreate are on.
    println!(
        "VMM isolation probe: {}",
        cuda_executor::open(&driver, None).vmm_isolation()
    );
    let d2 = Arc::clone(&driver);
    let target_driver = Arc::clone(&driver);
    let target = Target {
        name: "cuda".into(),
        make: Box::new(move |watchdog| cuda_executor::open(&d2, watchdog)),
        address_spaces: true,
        cuda_driver: Some(driver),
    };
    let mut report = run_suite(&target);
    report
        .results
        .extend(run_checks(&target, cuda_executor::CHECKS).results);
    println!("{report}");
    // A benchmark, printed only: staged copies against the driver's pinned copies.
    println!("{}", cuda_executor::copy_bandwidth(&target_driver, 256));
    assert_eq!(report.failed(), 0, "{report}");
}
