//! The device conformance suite on the simulated GPU (always runs).

use std::sync::Arc;

use vgpu_sim::{SimConfig, SimDevice};
use vgpu_tests::conformance::{Target, run_suite};

#[test]
fn the_simulated_gpu_conforms() {
    let target = Target {
        name: "sim".into(),
        make: Box::new(|watchdog| {
            Arc::new(SimDevice::new(SimConfig {
                name: "gpu0".into(),
                memory: 2 << 30,
                workers: 2,
                watchdog,
            }))
        }),
        address_spaces: true,
        cuda_driver: None,
    };
    let report = run_suite(&target);
    println!("{report}");
    assert_eq!(report.failed(), 0, "{report}");
}
