//! The kernel corpus (NVRTC-compiled PTX for sm_52, sm_80 and sm_90, checked
//! against CPU references) through the full path: libcuda.so.1 (the shim) →
//! unix socket → vgpud → broker → simulated GPU.

use vgpu_corpus::{Arch, Gpu, run_all};
use vgpu_tests::cudalib::{CudaApi, CudaGpu};
use vgpu_tests::harness::{TestVm, Vgpud, artifacts};

#[test]
fn every_corpus_kernel_is_correct_through_the_shim() {
    let d = Vgpud::start(&[TestVm::new("corpus", 512 << 20)]);
    // SAFETY: set before the shim reads it; this test binary has a single test.
    unsafe { std::env::set_var("VGPU_TRANSPORT", d.transport("corpus")) };
    let api = CudaApi::load(&artifacts().lib_dir.join("libcuda.so.1")).unwrap();
    let mut factory = || CudaGpu::new(api).map(|g| Box::new(g) as Box<dyn Gpu>);
    let report = run_all(&mut factory, &[Arch::Sm52, Arch::Sm80, Arch::Sm90]);
    println!("{report}");
    assert_eq!(report.failed(), 0, "{report}\nvgpud log:\n{}", d.log());
    assert!(report.passed() >= 75, "only {} runs", report.passed());
    // Every context was destroyed: nothing is left allocated.
    d.wait_memory_used("corpus", 0, std::time::Duration::from_secs(5));
}
