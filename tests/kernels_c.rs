//! Kernels through the shim from a plain C program: faults poison only their
//! own context (and VM), bad PTX fails at load with a log, module globals
//! are charged to the slice, and kernels cannot reach another VM's memory.

use std::path::PathBuf;

use vgpu_tests::harness::{TestVm, Vgpud, build_c_program, hold, run_against, workspace_root};

const MIB: u64 = 1 << 20;

fn ptx(name: &str) -> String {
    let p: PathBuf = workspace_root()
        .join("tests/kernels/ptx")
        .join(format!("{name}.sm_80.ptx"));
    p.display().to_string()
}

fn run_ok(d: &Vgpud, vm: &str, args: &[&str]) -> String {
    let prog = build_c_program("kernels");
    let r = run_against(d, vm, &prog, args);
    assert!(
        r.failures().is_empty() && r.code == 0,
        "{args:?}:\n{}\n{}\nvgpud:\n{}",
        r.stdout,
        r.stderr,
        d.log()
    );
    r.stdout
}

#[test]
fn a_kernel_fault_poisons_only_its_context_and_vm() {
    let d = Vgpud::start(&[TestVm::new("bad", 64 * MIB), TestVm::new("good", 64 * MIB)]);
    let prog = build_c_program("kernels");
    let (oob, vec) = (ptx("oob"), ptx("vector_add"));
    // The other VM keeps working while (and after) the fault happens.
    let other = std::thread::spawn({
        let d_transport = d.transport("good");
        let prog = prog.clone();
        let vec = vec.clone();
        move || {
            let out = std::process::Command::new(prog)
                .args(["fault", &ptx("oob"), &vec])
                .env("VGPU_TRANSPORT", d_transport)
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    });
    run_ok(&d, "bad", &["fault", &oob, &vec]);
    let out = other.join().unwrap();
    assert!(!out.contains("FAIL"), "{out}");
    d.wait_memory_used("bad", 0, std::time::Duration::from_secs(5));
}

#[test]
fn unsupported_ptx_fails_at_load_with_the_instruction_and_line() {
    let d = Vgpud::start(&[TestVm::new("vm", 64 * MIB)]);
    let out = run_ok(&d, "vm", &["badptx"]);
    assert!(out.contains("frobnicate"), "{out}");
}

#[test]
fn module_globals_are_charged_to_the_slice() {
    let d = Vgpud::start(&[TestVm::new("vm", 32 * MIB)]);
    run_ok(&d, "vm", &["globals", &(32 * MIB).to_string()]);
    d.wait_memory_used("vm", 0, std::time::Duration::from_secs(5));
}

#[test]
fn a_kernel_cannot_write_another_vms_memory() {
    let d = Vgpud::start(&[
        TestVm::new("victim", 64 * MIB),
        TestVm::new("thief", 64 * MIB),
    ]);
    let h = hold(&d, "victim", MIB);
    run_ok(
        &d,
        "thief",
        &["steal", &ptx("vector_add"), &format!("{:#x}", h.ptr)],
    );
}
