//! The allocation APIs beyond `cuMemAlloc` through shim → vgpud → simulated GPU, from a C
//! program (tests/c/alloc_api.c): mapped host memory, managed memory and stream-ordered
//! pools work, each is charged to the VM's slice (past it: `CUDA_ERROR_OUT_OF_MEMORY`),
//! freeing or trimming gives it back, a killed process returns every byte, and the admin
//! API breaks the VM's use down by kind.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use vgpu_tests::harness::{Run, TestVm, Vgpud, build_c_program, run_against};

const MIB: u64 = 1 << 20;

fn assert_passed(r: &Run, d: &Vgpud, min_checks: usize) {
    assert!(
        r.failures().is_empty() && r.code == 0,
        "exit {}\n{}\n{}\n{}",
        r.code,
        r.stdout,
        r.stderr,
        d.log()
    );
    let n = r.stdout.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(n >= min_checks, "only {n} checks\n{}", r.stdout);
}

fn run_mode(args: &[&str], min_checks: usize) -> Run {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let r = run_against(&d, "vm1", &build_c_program("alloc_api"), args);
    assert_passed(&r, &d, min_checks);
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    r
}

#[test]
fn kernels_read_and_write_mapped_host_memory() {
    run_mode(&["mapped"], 30);
}

#[test]
fn managed_memory_is_one_pointer_on_host_and_device() {
    run_mode(&["managed"], 45);
}

#[test]
fn stream_ordered_pools_charge_their_reservation() {
    run_mode(&["pools"], 50);
}

#[test]
fn virtual_memory_management_maps_charged_physical_memory() {
    run_mode(&["vmm"], 50);
}

#[test]
fn physical_memory_is_shared_within_a_vm_only() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)]);
    let prog = build_c_program("alloc_api");
    let mut child = Command::new(&prog)
        .arg("vmm-export")
        .env("VGPU_TRANSPORT", d.transport("vm1"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting the exporter");
    let mut handle = String::new();
    for l in BufReader::new(child.stdout.take().expect("stdout")).lines() {
        let l = l.expect("exporter output");
        assert!(!l.starts_with("FAIL"), "{l}");
        if let Some(h) = l.strip_prefix("fabric ") {
            handle = h.to_string();
        }
        if l == "holding" {
            break;
        }
    }
    assert_eq!(handle.len(), 128);
    // Another process of the same VM imports it; a process of another VM is refused.
    let r = run_against(&d, "vm1", &prog, &["vmm-import", &handle, "0"]);
    assert_passed(&r, &d, 2);
    let r = run_against(&d, "vm2", &prog, &["vmm-import", &handle, "1"]);
    assert_passed(&r, &d, 1);
    assert_eq!(d.vm("vm1")["memory_by_kind"]["vmm_physical"], 2 * MIB);
    assert_eq!(d.vm("vm2")["memory_used"], 0);
    child.kill().unwrap();
    child.wait().unwrap();
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

#[test]
fn every_kind_fills_exactly_the_slice_and_gives_it_back() {
    let d = Vgpud::start(&[TestVm::new("vm1", 24 * MIB)]);
    let prog = build_c_program("alloc_api");
    for kind in ["managed", "mapped", "registered", "pool", "vmm"] {
        let r = run_against(&d, "vm1", &prog, &["fill", kind]);
        assert_passed(&r, &d, 4);
        assert!(
            r.stdout
                .contains(&format!("allocated 24 MiB of {kind} before result 2")),
            "{}",
            r.stdout
        );
        d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    }
}

#[test]
fn a_killed_process_returns_every_kind_and_the_breakdown_shows_it() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let prog = build_c_program("alloc_api");
    let mut holders = Vec::new();
    for (kind, mib) in [
        ("managed", 3),
        ("mapped", 5),
        ("registered", 1),
        ("pool", 7),
        ("vmm", 4),
    ] {
        let mut child = Command::new(&prog)
            .args(["hold", kind, &(mib * MIB).to_string()])
            .env("VGPU_TRANSPORT", d.transport("vm1"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the holder");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        for l in lines {
            let l = l.expect("holder output");
            assert!(!l.starts_with("FAIL"), "{kind}: {l}");
            if l == "holding" {
                break;
            }
        }
        holders.push(child);
    }
    let vm = d.vm("vm1");
    assert_eq!(vm["memory_used"], 20 * MIB, "{vm}");
    assert_eq!(by_kind_of(&vm, "vmm_physical"), 4 * MIB, "{vm}");
    let by_kind = &vm["memory_by_kind"];
    assert_eq!(by_kind["managed"], 3 * MIB, "{vm}");
    assert_eq!(by_kind["mapped_host"], 6 * MIB, "{vm}");
    assert_eq!(by_kind["pool_reserved"], 7 * MIB, "{vm}");
    assert_eq!(by_kind["pool_used"], 7 * MIB, "{vm}");
    assert_eq!(by_kind["plain"], 0, "{vm}");
    for mut c in holders {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    let vm = d.vm("vm1");
    for k in [
        "managed",
        "mapped_host",
        "pool_reserved",
        "pool_used",
        "plain",
    ] {
        assert_eq!(vm["memory_by_kind"][k], 0, "{k}: {vm}");
    }
}

fn by_kind_of(vm: &serde_json::Value, k: &str) -> u64 {
    vm["memory_by_kind"][k].as_u64().unwrap_or(u64::MAX)
}

/// Managed memory moves by changed pages: 16 MiB touched a few words at a time for eight
/// launch-and-synchronize rounds costs one full push and pages after it, not 16 MiB per round
/// each way (vgpud's per-VM byte counters).
#[test]
fn managed_memory_moves_only_changed_pages() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let r = run_against(&d, "vm1", &build_c_program("alloc_api"), &["delta"]);
    assert_passed(&r, &d, 4);
    let vm = d.vm("vm1");
    let (htod, dtoh) = (
        vm["stats"]["bytes_htod"].as_u64().unwrap(),
        vm["stats"]["bytes_dtoh"].as_u64().unwrap(),
    );
    eprintln!("16 MiB managed, 8 rounds: {htod} bytes host to device, {dtoh} device to host");
    // One full push of 16 MiB, then at most four pages a round each way.
    let round = 4 * 4096 * 8;
    assert!(
        htod <= 16 * MIB + 4096 + round,
        "{htod} bytes host to device"
    );
    assert!(dtoh <= 4096 + round, "{dtoh} bytes device to host");
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

#[test]
fn the_managed_mirror_cost_is_measured() {
    let r = run_mode(&["bench", "32"], 3);
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("bench "))
        .expect("a bench line");
    eprintln!("{line}");
}
