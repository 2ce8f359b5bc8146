//! Legacy interprocess memory (`cuIpc*MemHandle`) through shim → vgpud → simulated GPU, from
//! a C program (tests/c/ipc.c) run as an exporter and as importers: processes of one VM share
//! `cuMemAlloc` memory (reads, writes and kernels on both sides), the memory is charged once
//! to the VM, another VM's process and forged handles are refused, memory opened elsewhere
//! outlives its exporter's free until the last close, and the VM's use returns to 0. IPC
//! events order an importer's stream after the exporter's record (and the exporter's after an
//! importer's record: any holder records the event), a wait whose exporter dies ends with an
//! error, and an importer killed in `cuEventSynchronize` leaves the others unaffected. Stream-ordered pools (tests/c/pool_ipc.c) are shared the same
//! way: an imported block outlives its exporter's free, charged once, until its importer frees
//! it or dies.

use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use vgpu_tests::harness::{Run, TestVm, Vgpud, build_c_program, run_against};

const MIB: u64 = 1 << 20;
/// Words of the shared allocation.
const WORDS: &str = "65536";
/// `CUDA_ERROR_INVALID_HANDLE`.
const INVALID_HANDLE: &str = "400";

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

/// A program kept running, driven line by line on its stdin.
struct Held {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    checks: usize,
}

impl Held {
    fn start(d: &Vgpud, vm: &str, args: &[&str]) -> Self {
        Self::start_program(d, "ipc", vm, args)
    }

    /// Starts tests/c/`program`.c.
    fn start_program(d: &Vgpud, program: &str, vm: &str, args: &[&str]) -> Self {
        let mut child = Command::new(build_c_program(program))
            .args(args)
            .env("VGPU_TRANSPORT", d.transport(vm))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the test program");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Held {
            child,
            lines,
            checks: 0,
        }
    }

    /// Reads output until `until`; returns the last line seen that starts with `prefix`.
    fn read_until(&mut self, until: &str, prefix: &str) -> String {
        let mut found = String::new();
        for l in self.lines.by_ref() {
            let l = l.expect("program output");
            assert!(!l.starts_with("FAIL"), "{l}");
            if l.starts_with("ok ") {
                self.checks += 1;
            }
            if let Some(v) = l.strip_prefix(prefix) {
                found = v.to_string();
            }
            if l == until {
                return found;
            }
        }
        panic!("the program ended before printing {until:?}");
    }

    fn next_step(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(b"go\n").expect("writing to the program");
        stdin.flush().expect("writing to the program");
    }

    /// Lets the program finish; asserts it passed every check.
    fn finish(mut self) -> usize {
        self.next_step();
        self.end()
    }

    /// Reads the program's output to its end; asserts it passed every check.
    fn end(mut self) -> usize {
        for l in self.lines.by_ref() {
            let l = l.expect("program output");
            assert!(!l.starts_with("FAIL"), "{l}");
            if l.starts_with("ok ") {
                self.checks += 1;
            }
        }
        let st = self.child.wait().expect("waiting for the program");
        assert!(st.success(), "exit {st}");
        self.checks
    }
}

/// Waits until vgpud has ended every session of `vm` but `n` (a killed process's goes soon after).
fn wait_sessions(d: &Vgpud, vm: &str, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while d.vm(vm)["sessions"].as_array().map_or(0, Vec::len) != n {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            d.vm(vm)["sessions"]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn memory_used(d: &Vgpud, vm: &str) -> u64 {
    d.vm(vm)["memory_used"].as_u64().expect("memory_used")
}

#[test]
fn processes_of_one_vm_share_memory_and_other_vms_are_refused() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)]);
    let prog = build_c_program("ipc");
    let mut exporter = Held::start(&d, "vm1", &["export", WORDS]);
    let handle = exporter.read_until("holding", "handle ");
    assert_eq!(handle.len(), 128, "{handle}");
    let charged = memory_used(&d, "vm1");
    assert!(charged >= 256 << 10, "{charged} bytes charged");

    // Another process of the VM opens it, reads, runs a kernel on it, writes, closes.
    let r = run_against(&d, "vm1", &prog, &["import", &handle, WORDS]);
    assert_passed(&r, &d, 20);
    assert_eq!(memory_used(&d, "vm1"), charged, "charged once, to the VM");

    // A process of another VM is refused, and nothing is charged there.
    let r = run_against(&d, "vm2", &prog, &["open", &handle, INVALID_HANDLE]);
    assert_passed(&r, &d, 1);
    assert!(
        d.log().contains("another VM"),
        "vgpud says why:\n{}",
        d.log()
    );
    assert_eq!(memory_used(&d, "vm2"), 0);

    // A process holds it open while the exporter frees it: the memory stays, charged once.
    let mut holder = Held::start(&d, "vm1", &["hold", &handle, WORDS]);
    holder.read_until("holding", "-");
    assert_eq!(memory_used(&d, "vm1"), charged);
    exporter.next_step();
    exporter.read_until("freed", "-");
    assert!(exporter.finish() >= 10);
    assert_eq!(memory_used(&d, "vm1"), charged, "still open in the holder");
    // The freed allocation's handle opens no more.
    let r = run_against(&d, "vm1", &prog, &["open", &handle, INVALID_HANDLE]);
    assert_passed(&r, &d, 1);
    // The holder still reads and runs kernels on it; its close gives the memory back.
    assert!(holder.finish() >= 5);
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

#[test]
fn an_exporter_that_exits_leaves_nothing_behind() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let prog = build_c_program("ipc");
    let mut exporter = Held::start(&d, "vm1", &["export", WORDS]);
    let handle = exporter.read_until("holding", "handle ");
    let mut holder = Held::start(&d, "vm1", &["hold", &handle, WORDS]);
    holder.read_until("holding", "-");
    exporter.child.kill().expect("killing the exporter");
    exporter.child.wait().expect("waiting for the exporter");
    wait_sessions(&d, "vm1", 1);
    let r = run_against(&d, "vm1", &prog, &["open", &handle, INVALID_HANDLE]);
    assert_passed(&r, &d, 1);
    assert!(memory_used(&d, "vm1") > 0, "the holder keeps the memory");
    holder.child.kill().expect("killing the holder");
    holder.child.wait().expect("waiting for the holder");
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

/// Starts an exporter of one word and an interprocess event whose record is held back.
fn event_exporter(d: &Vgpud, args: &[&str]) -> (Held, String, String) {
    let mut exporter = Held::start(d, "vm1", args);
    let mut mem = String::new();
    let mut ev = String::new();
    for l in exporter.lines.by_ref() {
        let l = l.expect("program output");
        assert!(!l.starts_with("FAIL"), "{l}");
        if let Some(h) = l.strip_prefix("handle ") {
            mem = h.to_string();
        } else if let Some(h) = l.strip_prefix("event ") {
            ev = h.to_string();
        } else if l == "holding" {
            break;
        }
    }
    assert_eq!((mem.len(), ev.len()), (128, 128), "{mem} {ev}");
    (exporter, mem, ev)
}

#[test]
fn an_ipc_event_orders_the_importers_stream_after_the_exporters_record() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)]);
    let (mut exporter, mem, ev) = event_exporter(&d, &["evexport"]);
    // Another VM cannot open the event.
    let prog = build_c_program("ipc");
    let r = run_against(&d, "vm2", &prog, &["evopen", &ev, INVALID_HANDLE]);
    assert_passed(&r, &d, 1);
    assert!(
        d.log().contains("refused an IPC handle of another VM") && d.log().contains("events"),
        "{}",
        d.log()
    );
    let mut importer = Held::start(&d, "vm1", &["evimport", &mem, &ev]);
    importer.read_until("waiting", "-");
    // Only now does the exporter's stream go on: its record, then the importer's kernel.
    exporter.next_step();
    exporter.read_until("released", "-");
    assert!(importer.end() >= 10);
    assert!(
        exporter.finish() >= 5,
        "the exporter checks what the importer wrote"
    );
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    wait_sessions(&d, "vm1", 0);
}

#[test]
fn an_exporter_that_dies_ends_the_importers_wait_with_an_error() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    // The exporter's record waits behind a kernel that spins for minutes: it never runs.
    let (mut exporter, mem, ev) = event_exporter(&d, &["evexport", "spin"]);
    let mut importer = Held::start(&d, "vm1", &["evorphan", &mem, &ev]);
    importer.read_until("waiting", "-");
    exporter.child.kill().expect("killing the exporter");
    exporter.child.wait().expect("waiting for the exporter");
    assert!(importer.end() >= 8);
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    wait_sessions(&d, "vm1", 0);
}

#[test]
fn an_importers_record_is_the_one_the_exporters_wait_follows() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    // The exporter never records its event: the importer does.
    let (mut exporter, mem, ev) = event_exporter(&d, &["evshare"]);
    let mut importer = Held::start(&d, "vm1", &["evrecord", &mem, &ev]);
    importer.read_until("recorded", "-");
    // The exporter waits for the importer's record, still held by its host function.
    exporter.next_step();
    exporter.read_until("waiting", "-");
    // The importer's stream goes on: it sets the word to MARK2, then records; only then does
    // the exporter's kernel increment it (it checks MARK2 + 1).
    importer.next_step();
    importer.read_until("released", "-");
    assert!(exporter.end() >= 11);
    assert!(importer.finish() >= 9);
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    wait_sessions(&d, "vm1", 0);
}

#[test]
fn an_importer_killed_in_cu_event_synchronize_leaves_nothing_behind() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let (mut exporter, mem, ev) = event_exporter(&d, &["evexport"]);
    // An importer blocks in cuEventSynchronize on the exporter's held record, and is killed.
    let mut doomed = Held::start(&d, "vm1", &["evsyncdie", &ev]);
    doomed.read_until("waiting", "-");
    doomed.child.kill().expect("killing the importer");
    doomed.child.wait().expect("waiting for the importer");
    for l in doomed.lines.by_ref() {
        let l = l.expect("program output");
        assert!(!l.starts_with("FAIL"), "{l}");
    }
    // vgpud ends its session (and its wait) although the record it waited for is still held:
    // the exporter's two (its own and its host functions' connection) remain.
    wait_sessions(&d, "vm1", 2);
    // The exporter and another importer are unaffected: the importer's kernel runs after the
    // exporter's record (it checks MARK + 1), and the exporter sees what it wrote.
    let mut importer = Held::start(&d, "vm1", &["evimport", &mem, &ev]);
    importer.read_until("waiting", "-");
    exporter.next_step();
    exporter.read_until("released", "-");
    assert!(importer.end() >= 10);
    assert!(exporter.finish() >= 5);
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    wait_sessions(&d, "vm1", 0);
}

/// Words of the shared pool block.
const POOL_WORDS: &str = "65536";
/// `CUDA_ERROR_INVALID_VALUE`.
const INVALID_VALUE: &str = "1";

/// Starts a pool exporter; returns it, the path of its pool descriptor and the pointer's
/// export data.
fn pool_exporter(d: &Vgpud) -> (Held, String, String) {
    let mut exporter = Held::start_program(d, "pool_ipc", "vm1", &["export", POOL_WORDS]);
    let mut pool = String::new();
    let mut ptr = String::new();
    for l in exporter.lines.by_ref() {
        let l = l.expect("program output");
        assert!(!l.starts_with("FAIL"), "{l}");
        if l.starts_with("ok ") {
            exporter.checks += 1;
        } else if let Some(p) = l.strip_prefix("pool ") {
            pool = p.to_string();
        } else if let Some(p) = l.strip_prefix("ptr ") {
            ptr = p.to_string();
        } else if l == "holding" {
            break;
        }
    }
    assert!(pool.starts_with("/proc/"), "{pool}");
    assert_eq!(ptr.len(), 128, "{ptr}");
    (exporter, pool, ptr)
}

#[test]
fn processes_of_one_vm_share_a_pool_and_other_vms_are_refused() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)]);
    let prog = build_c_program("pool_ipc");
    let (mut exporter, pool, ptr) = pool_exporter(&d);
    let charged = memory_used(&d, "vm1");
    assert!(charged >= 256 << 10, "{charged} bytes charged");

    // A process of another VM is refused, and nothing is charged there.
    let r = run_against(&d, "vm2", &prog, &["open", &pool, INVALID_VALUE]);
    assert_passed(&r, &d, 2);
    assert!(
        d.log()
            .contains("refused a memory pool handle of another VM"),
        "vgpud says why:\n{}",
        d.log()
    );
    assert_eq!(memory_used(&d, "vm2"), 0);
    // Forged export data is refused.
    let r = run_against(&d, "vm1", &prog, &["forged", &pool]);
    assert_passed(&r, &d, 4);

    // Another process imports the block: reads, runs a kernel, writes; charged once.
    let mut importer =
        Held::start_program(&d, "pool_ipc", "vm1", &["import", &pool, &ptr, POOL_WORDS]);
    importer.read_until("holding", "-");
    assert_eq!(memory_used(&d, "vm1"), charged, "charged once, to the VM");
    // The exporter sees the writes and frees its block first: it stays, charged once.
    exporter.next_step();
    exporter.read_until("freed", "-");
    assert_eq!(
        memory_used(&d, "vm1"),
        charged,
        "still held by the importer"
    );
    // The importer still reads it; its free gives every byte back.
    assert!(importer.finish() >= 10);
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    assert!(exporter.finish() >= 15);
    wait_sessions(&d, "vm1", 0);
}

#[test]
fn an_importer_that_dies_returns_a_freed_pool_block() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let (mut exporter, pool, ptr) = pool_exporter(&d);
    let charged = memory_used(&d, "vm1");
    let mut holder = Held::start_program(&d, "pool_ipc", "vm1", &["hold", &pool, &ptr, POOL_WORDS]);
    holder.read_until("holding", "-");
    // The exporter sees the holder's writes and frees its block while the holder has it open.
    exporter.next_step();
    exporter.read_until("freed", "-");
    assert_eq!(memory_used(&d, "vm1"), charged);
    holder.child.kill().expect("killing the holder");
    holder.child.wait().expect("waiting for the holder");
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    exporter.child.kill().expect("killing the exporter");
    exporter.child.wait().expect("waiting for the exporter");
    wait_sessions(&d, "vm1", 0);
}
