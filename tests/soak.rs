//! A short soak (the full one is `vgpu-bench soak`): concurrent sessions over
//! a vgpud's unix socket and vsock device, mixed calls checked against a model
//! of device memory, clients killed mid-stream. Every call gets its own reply
//! (no wake-up lost on the way), every slice returns to 0 and vgpud's memory
//! returns to its baseline.

use vgpu_bench::soak::{HEAP_GROWTH_LIMIT, Params, RSS_GROWTH_LIMIT, measure};
use vgpu_tests::harness::artifacts;

#[test]
fn sessions_killed_under_load_lose_nothing_and_leak_nothing() {
    let params = Params {
        sessions: 16,
        calls: 400,
        kill_percent: 50,
        vgpud: artifacts().vgpud.clone(),
        seed: 7,
        waves: 1,
    };
    let report = measure(&params).expect("the soak ran");
    println!("{report:?} (RSS ratio {:.3})", report.rss_ratio());
    assert_eq!(
        report.failures, 0,
        "{:?}; vgpud's last warnings: {:?}",
        report.failure_examples, report.vgpud_warnings
    );
    assert!(report.kills > 0, "no client was killed: {report:?}");
    // The vsock device's audit makes up for a lost wake-up within a second or two; one found at
    // all is a bug.
    assert_eq!(
        report.lost_wakeups, 0,
        "the vsock audit made up for lost wake-ups; vgpud's last warnings: {:?}",
        report.vgpud_warnings
    );
    // Each session makes `calls` calls and a final check.
    let expected = (params.sessions * (params.calls + 1)) as u64;
    assert_eq!(report.calls_ok, expected, "{report:?}");
    for (vm, used) in &report.memory_used_after {
        assert_eq!(*used, 0, "{vm} keeps memory after its sessions ended");
    }
    assert!(
        report.heap_ratio() <= HEAP_GROWTH_LIMIT,
        "vgpud's heap grew: {report:?}"
    );
    assert!(
        report.rss_ratio() <= RSS_GROWTH_LIMIT,
        "vgpud's memory did not come back: {report:?}"
    );
}
