//! Device memory that stretches (issue 19, docs/memory.md): reservations,
//! over-committed slices, overflow to host memory with stable device
//! addresses, and the checks on config files and live changes.
//!
//! The end-to-end tests run guest programs (tests/c/memory_policy.c) through
//! the shim against a vgpud on the simulated GPU; the in-process ones drive
//! the broker's placement with the simulated GPU directly.

use crate::admin_support;

use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;

use admin_support::{Admin, DIR, MIB, admin_table, run};
use serde_json::Value;
use vgpu_broker::Broker;
use vgpu_broker::device::{Device, Residence};
use vgpu_broker::memory::movable;
use vgpu_broker::testutils::vm;
use vgpu_config::{Overcommit, Overflow, VmMemory};
use vgpu_sim::{SimConfig, SimDevice};
use vgpu_tests::harness::{artifacts, build_c_program};

/// A guest process of tests/c/memory_policy.c, driven line by line.
struct Guest {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Guest {
    fn start(d: &Admin, vm: &str) -> Guest {
        let mut child = Command::new(build_c_program("memory_policy"))
            .env("VGPU_TRANSPORT", d.transport(vm))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("guest program");
        let stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = lines.next().expect("a first line").expect("output");
        assert_eq!(first, "ready", "the guest program did not start");
        Guest {
            child,
            stdin,
            lines,
        }
    }

    /// Sends a command; returns its result lines.
    fn cmd(&mut self, c: &str) -> Vec<String> {
        writeln!(self.stdin, "{c}").expect("command");
        self.stdin.flush().expect("flush");
        let mut out = Vec::new();
        for l in self.lines.by_ref() {
            let l = l.expect("output");
            if l == "done" {
                return out;
            }
            out.push(l);
        }
        panic!("the guest program ended during `{c}`: {out:?}");
    }

    /// Sends a command that must succeed.
    fn ok(&mut self, c: &str) -> Vec<String> {
        let out = self.cmd(c);
        assert!(
            !out.iter().any(|l| l.starts_with("FAIL")),
            "`{c}` failed: {out:?}"
        );
        out
    }

    /// The over-budget notifications the process got so far (`bytesOverBudget` of each).
    fn notices(&mut self) -> Vec<u64> {
        self.cmd("notices")
            .iter()
            .filter_map(|l| l.strip_prefix("notice ")?.parse().ok())
            .collect()
    }

    /// The CUresult of one more allocation of `bytes`.
    fn try_alloc(&mut self, bytes: u64) -> i64 {
        let out = self.cmd(&format!("try {bytes}"));
        out.iter()
            .find_map(|l| l.strip_prefix("result "))
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("no result: {out:?}"))
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Longer than the shim's notification watcher takes to see a change (it asks every 100 ms).
const NOTICE_WINDOW: std::time::Duration = std::time::Duration::from_millis(500);

/// 64 MiB device, slices may add up to 96 MiB. vm1: 48 MiB slice, 16 MiB
/// reserved, may overflow 32 MiB to host memory. vm2: 48 MiB slice, 32 MiB
/// reserved, no overflow.
fn overcommitted() -> String {
    format!(
        "{}[memory]\nhost_overflow_budget = \"256MiB\"\n\n\
         [[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"64MiB\"\nworkers = 1\novercommit = 1.5\n\n\
         [[vm]]\nname = \"vm1\"\nmemory = \"48MiB\"\nreserved = \"16MiB\"\noverflow = \"host\"\n\
         overflow_limit = \"32MiB\"\nunix_socket = \"{DIR}/vm1.sock\"\n\n\
         [[vm]]\nname = \"vm2\"\nmemory = \"48MiB\"\nreserved = \"32MiB\"\nunix_socket = \"{DIR}/vm2.sock\"\n",
        admin_table()
    )
}

fn placement(d: &Admin, vm: &str) -> Value {
    d.get(&format!("/v1/vms/{vm}"))["memory_placement"].clone()
}

fn n(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {v:#}"))
}

fn ptrs(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("ptr "))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_vm_claims_its_reservation_from_a_borrower_whose_pointers_data_and_kernels_survive() {
    let d = Admin::start(&overcommitted());
    let mut g1 = Guest::start(&d, "vm1");
    // vm1 asks to be told when it goes over its device memory budget.
    g1.ok("notify");
    // vm1 fills its reservation, the unreserved 16 MiB, and borrows 8 MiB of vm2's reservation.
    let p1 = ptrs(&g1.ok(&format!("alloc 10 {}", 4 * MIB)));
    assert_eq!(p1.len(), 10);
    let m = placement(&d, "vm1");
    assert_eq!(
        (
            n(&m, "device_bytes"),
            n(&m, "host_bytes"),
            n(&m, "borrowed_bytes")
        ),
        (40 * MIB, 0, 24 * MIB),
        "{m:#}"
    );
    g1.ok("check");
    // Borrowed memory is device memory: not over budget.
    std::thread::sleep(NOTICE_WINDOW);
    assert!(g1.notices().is_empty(), "no notice while on the device");

    // vm2 claims its whole reservation: 8 MiB of vm1's buffers move to host memory.
    let mut g2 = Guest::start(&d, "vm2");
    g2.ok(&format!("alloc 8 {}", 4 * MIB));
    let m1 = placement(&d, "vm1");
    let m2 = placement(&d, "vm2");
    assert_eq!(n(&m2, "device_bytes"), 32 * MIB, "{m2:#}");
    assert_eq!(
        (n(&m1, "device_bytes"), n(&m1, "host_bytes")),
        (32 * MIB, 8 * MIB),
        "{m1:#}"
    );
    // Exactly the two buffers the claim needed moved, once each: nothing was promoted back into
    // the memory the claim was freeing (to be demoted again).
    assert_eq!(
        (
            n(&m1, "demotions"),
            n(&m1, "demoted_bytes"),
            n(&m1, "promotions")
        ),
        (2, 8 * MIB, 0),
        "{m1:#}"
    );
    let dev = d.get("/v1/devices/gpu0");
    assert!(
        n(&dev, "memory_used") <= n(&dev, "memory_total"),
        "the device is never over-filled: {dev:#}"
    );
    assert_eq!(n(&dev["memory_placement"], "host_overflow_used"), 8 * MIB);

    // vm1's process is told it went over its budget, once, with the bytes in host memory when
    // the shim looked: one or both of the demoted 4 MiB buffers (they move one after the other).
    d.wait_for("the over-budget notice", || !g1.notices().is_empty());
    let notices = g1.notices();
    assert!(
        matches!(notices[..], [n] if n == 4 * MIB || n == 8 * MIB),
        "{notices:?}"
    );
    // vm1's data, read through its unchanged pointers, is intact, and its kernels run on
    // the host-resident buffers.
    g1.ok("check");
    // The guest still sees its slice.
    let info = g1.ok("info");
    assert!(
        info.iter().any(|l| l.ends_with(&format!(" {}", 48 * MIB))),
        "cuMemGetInfo reports the slice: {info:?}"
    );
    // Limits hold: vm2 (no overflow) cannot go past the full device; vm1 cannot go past its
    // slice, but can overflow within it.
    assert_eq!(g2.try_alloc(4 * MIB), 2, "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(g1.try_alloc(12 * MIB), 2, "past vm1's slice");
    assert_eq!(g1.try_alloc(8 * MIB), 0, "within the slice, overflowed");

    // vm2 frees half: vm1's buffers move back to the device.
    g2.ok("free 4");
    d.wait_for("vm1's buffers to move back to device memory", || {
        n(&placement(&d, "vm1"), "host_bytes") == 0
    });
    let m1 = placement(&d, "vm1");
    assert_eq!(n(&m1, "device_bytes"), 40 * MIB, "{m1:#}");
    assert!(n(&m1, "promotions") >= 2, "{m1:#}");
    g1.ok("check");

    // The operator sees it: vgpuctl, Prometheus.
    let show = d.vgpuctl(&["vm", "show", "vm1"]);
    assert!(
        show.stdout.contains("placement: 40 MiB on the device"),
        "{}",
        show.stdout
    );
    drop(g2);
    drop(g1);
    d.wait_for("the VMs' memory to be released", || {
        let dev = d.get("/v1/devices/gpu0");
        n(&dev, "memory_used") == 0 && n(&dev["memory_placement"], "host_overflow_used") == 0
    });
}

#[test]
fn a_borrower_killed_during_a_demotion_frees_everything() {
    let d = Admin::start(&overcommitted());
    let mut g1 = Guest::start(&d, "vm1");
    g1.ok(&format!("alloc 10 {}", 4 * MIB));
    // A kernel that runs for minutes holds vm1's buffers: a demotion waits for it.
    g1.ok("spin");
    let mut g2 = Guest::start(&d, "vm2");
    writeln!(g2.stdin, "alloc 8 {}", 4 * MIB).unwrap();
    g2.stdin.flush().unwrap();
    let _ = g1.child.kill();
    let _ = g1.child.wait();
    let mut out = Vec::new();
    for l in g2.lines.by_ref() {
        let l = l.unwrap();
        if l == "done" {
            break;
        }
        out.push(l);
    }
    assert!(
        out.iter().any(|l| l == "ok alloc"),
        "vm2 got its reservation: {out:?}"
    );
    d.wait_for("vm1's memory to be released", || {
        let m = placement(&d, "vm1");
        n(&m, "device_bytes") == 0 && n(&m, "host_bytes") == 0
    });
    let dev = d.get("/v1/devices/gpu0");
    assert_eq!(n(&dev, "memory_used"), 32 * MIB, "{dev:#}");
    assert_eq!(
        n(&dev["memory_placement"], "host_overflow_used"),
        0,
        "{dev:#}"
    );
    g2.ok("check");
}

/// 4 GiB device, two VMs of 2 GiB (the slices fit exactly).
fn exact_fit() -> String {
    format!(
        "{}[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"4GiB\"\nworkers = 1\n\n\
         [[vm]]\nname = \"vm1\"\nmemory = \"2GiB\"\nunix_socket = \"{DIR}/vm1.sock\"\n\n\
         [[vm]]\nname = \"vm2\"\nmemory = \"2GiB\"\nunix_socket = \"{DIR}/vm2.sock\"\n",
        admin_table()
    )
}

#[test]
fn slices_that_do_not_fit_are_refused_at_load_reload_and_live_naming_overcommit() {
    let d = Admin::start(&exact_fit());
    // Live: the slice would take the sum past 1.0 × the device.
    let o = d.vgpuctl(&["vm", "set", "vm1", "--memory", "5GiB"]);
    assert_ne!(o.code, 0, "{o:?}");
    assert!(o.stderr.contains("overcommit"), "{}", o.stderr);
    assert_eq!(d.get("/v1/vms/vm1")["memory_limit"], 2u64 << 30);
    // Reservations: at most the slice, at most the device together.
    let o = d.vgpuctl(&["vm", "set", "vm1", "--reserved", "3GiB"]);
    assert!(o.code != 0 && o.stderr.contains("reserved"), "{o:?}");
    // Overflow settings change live.
    let v = d.vgpuctl_json(&[
        "vm",
        "set",
        "vm1",
        "--reserved",
        "1GiB",
        "--overflow",
        "host",
        "--overflow-limit",
        "1GiB",
    ]);
    let m = &v["memory_placement"];
    assert_eq!(
        (
            n(m, "reserved"),
            m["overflow"].as_str(),
            n(m, "overflow_limit")
        ),
        (1 << 30, Some("host"), 1 << 30),
        "{v:#}"
    );
    // Shrinking the slice under the limit is fine; `--overflow none` drops the limit.
    d.vgpuctl_json(&["vm", "set", "vm1", "--memory", "1GiB"]);
    let v = d.vgpuctl_json(&["vm", "set", "vm1", "--overflow", "none"]);
    let m = &v["memory_placement"];
    assert_eq!(
        (
            m["overflow"].as_str(),
            n(m, "overflow_limit"),
            n(m, "reserved")
        ),
        (Some("none"), 0, 1 << 30),
        "{v:#}"
    );
    let o = d.vgpuctl(&["vm", "set", "vm2", "--overflow-limit", "1GiB"]);
    assert!(
        o.code != 0 && o.stderr.contains("overflow_limit applies"),
        "{o:?}"
    );

    // A file whose slices do not fit is refused at reload; nothing changes.
    let bad = exact_fit().replace(
        "memory = \"2GiB\"\nunix_socket = \"@DIR@/vm2.sock\"",
        "memory = \"3GiB\"\nunix_socket = \"@DIR@/vm2.sock\"",
    );
    assert_ne!(bad, exact_fit());
    d.write_config(&bad);
    let (status, _, body) = d.http("POST", "/v1/reload", None);
    assert_eq!(status, 400, "{body:#}");
    assert!(body.to_string().contains("overcommit"), "{body:#}");
    assert_eq!(d.get("/v1/vms/vm2")["memory_limit"], 2u64 << 30);
    // ...and at load, with the file and line.
    let o = run(Command::new(&artifacts().vgpud)
        .arg("--check-config")
        .arg(d.config()));
    assert_ne!(o.code, 0, "{o:?}");
    let all = format!("{}{}", o.stdout, o.stderr);
    assert!(
        all.contains("vgpud.toml:") && all.contains("`overcommit`"),
        "{all}"
    );
    // With overcommit, the same file loads.
    d.write_config(&bad.replace("workers = 1\n", "workers = 1\novercommit = 1.5\n"));
    let o = run(Command::new(&artifacts().vgpud)
        .arg("--check-config")
        .arg(d.config()));
    assert_eq!(o.code, 0, "{o:?}");
}

#[test]
fn overcommit_changes_live_through_vgpuctl_and_reload() {
    let d = Admin::start(&exact_fit());
    let overcommit =
        |d: &Admin| d.get("/v1/devices/gpu0")["memory_placement"]["overcommit"].as_f64();
    // Raised live, it lets a slice grow past the device.
    let v = d.vgpuctl_json(&["device", "set", "gpu0", "--overcommit", "1.5"]);
    assert_eq!(
        v["memory_placement"]["overcommit"].as_f64(),
        Some(1.5),
        "{v:#}"
    );
    d.vgpuctl_json(&["vm", "set", "vm1", "--memory", "4GiB"]);
    // Cut below what the slices add up to (6 GiB on 4 GiB): refused, naming it; nothing moves.
    let o = d.vgpuctl(&["device", "set", "gpu0", "--overcommit", "1.0"]);
    assert!(o.code != 0 && o.stderr.contains("overcommit"), "{o:?}");
    let o = d.vgpuctl(&["device", "set", "gpu0", "--overcommit", "20"]);
    assert!(o.code != 0 && o.stderr.contains("between 1.0"), "{o:?}");
    let (status, _, body) = d.http("PATCH", "/v1/devices/gpu0", Some(r#"{"workers": 2}"#));
    assert_eq!(status, 400, "{body:#}");
    assert_eq!(overcommit(&d), Some(1.5));

    // Reload: a raise applies before the slice it makes room for (4 + 3 GiB on 2.0 × 4 GiB).
    let file = |oc: &str, vm2: &str| {
        exact_fit()
            .replace(
                "workers = 1\n",
                &format!("workers = 1\novercommit = {oc}\n"),
            )
            .replace(
                "memory = \"2GiB\"\nunix_socket = \"@DIR@/vm2.sock\"",
                &format!("memory = \"{vm2}\"\nunix_socket = \"@DIR@/vm2.sock\""),
            )
    };
    d.write_config(&file("2.0", "3GiB"));
    let (status, _, body) = d.http("POST", "/v1/reload", None);
    assert_eq!(status, 200, "{body:#}");
    assert!(
        body["refused"].as_array().is_some_and(Vec::is_empty),
        "{body:#}"
    );
    assert_eq!(overcommit(&d), Some(2.0));
    assert_eq!(d.get("/v1/vms/vm2")["memory_limit"], 3u64 << 30);
    // A cut applies after the slices shrink; here vm1's live 4 GiB still does not fit 1.0,
    // so the cut is refused and tried again at the next reload.
    d.write_config(&file("1.0", "2GiB"));
    let (_, _, body) = d.http("POST", "/v1/reload", None);
    assert!(body.to_string().contains("overcommit"), "{body:#}");
    assert_eq!(d.get("/v1/vms/vm2")["memory_limit"], 2u64 << 30);
    assert_eq!(overcommit(&d), Some(2.0));
    d.vgpuctl_json(&["vm", "set", "vm1", "--memory", "2GiB"]);
    let (status, _, body) = d.http("POST", "/v1/reload", None);
    assert_eq!(status, 200, "{body:#}");
    assert!(
        body["applied"]
            .to_string()
            .contains("set overcommit of device `gpu0` to 1"),
        "{body:#}"
    );
    assert_eq!(overcommit(&d), Some(1.0));
}

// In-process: the placement rules with the simulated GPU.

const KIB64: u64 = 64 << 10;

fn broker(total: u64, oc: f64) -> (Broker, Arc<SimDevice>) {
    let sim = Arc::new(SimDevice::new(SimConfig {
        name: "gpu0".into(),
        memory: total,
        workers: 1,
        watchdog: None,
    }));
    let b = Broker::new(vec![("gpu0".into(), Arc::clone(&sim) as Arc<dyn Device>)]);
    b.set_overcommit("gpu0", Overcommit::from_f64(oc).unwrap())
        .unwrap();
    (b, sim)
}

fn tenant(b: &Broker, name: &str, slice: u64, m: VmMemory) -> Arc<vgpu_broker::tenant::Tenant> {
    let mut v = vm(name, slice);
    v.memory_policy = m;
    b.add_tenant(&v).unwrap()
}

/// A VM that may overflow its whole 4-block slice, and one that reserved its 4 blocks.
fn borrower_and_owner(
    b: &Broker,
) -> (
    Arc<vgpu_broker::tenant::Tenant>,
    Arc<vgpu_broker::tenant::Tenant>,
) {
    let borrower = tenant(
        b,
        "borrower",
        4 * KIB64,
        VmMemory {
            overflow: Overflow::Host,
            overflow_limit: 4 * KIB64,
            ..VmMemory::default()
        },
    );
    let owner = tenant(
        b,
        "owner",
        4 * KIB64,
        VmMemory {
            reserved: 4 * KIB64,
            ..VmMemory::default()
        },
    );
    (borrower, owner)
}

#[test]
fn a_vm_without_overflow_never_takes_another_vms_reservation() {
    let (b, sim) = broker(16 * KIB64, 2.0);
    let owner = tenant(
        &b,
        "owner",
        8 * KIB64,
        VmMemory {
            reserved: 8 * KIB64,
            ..VmMemory::default()
        },
    );
    let other = tenant(&b, "other", 16 * KIB64, VmMemory::default());
    let ctx = other.context().unwrap();
    let pm = other.placement().unwrap().clone();
    for _ in 0..8 {
        movable::allocate(&pm, &other, &ctx, KIB64, KIB64).unwrap();
    }
    // The device has 8 blocks free, all reserved for `owner`.
    let e = movable::allocate(&pm, &other, &ctx, KIB64, KIB64).unwrap_err();
    assert_eq!(e.code, 2, "{e:?}");
    assert!(
        e.message.contains("reserved for other VMs"),
        "{}",
        e.message
    );
    assert_eq!(sim.memory_used(), 8 * KIB64);
    assert_eq!(other.slice.used(), 8 * KIB64, "nothing stays charged");
    // The owner gets all of it, without any move.
    let octx = owner.context().unwrap();
    let opm = owner.placement().unwrap().clone();
    for _ in 0..8 {
        movable::allocate(&opm, &owner, &octx, KIB64, KIB64).unwrap();
    }
    assert_eq!(sim.memory_used(), 16 * KIB64);
    assert_eq!(pm.snapshot().demotions, 0);
}

#[test]
fn overflow_stays_within_the_vm_limit_and_the_host_budget() {
    let (b, sim) = broker(4 * KIB64, 4.0);
    b.host_budget().set_limit(3 * KIB64);
    let mk = |name| {
        tenant(
            &b,
            name,
            8 * KIB64,
            VmMemory {
                overflow: Overflow::Host,
                overflow_limit: 2 * KIB64,
                ..VmMemory::default()
            },
        )
    };
    let (a, c) = (mk("a"), mk("c"));
    let alloc = |t: &Arc<vgpu_broker::tenant::Tenant>| {
        let pm = t.placement().unwrap().clone();
        movable::allocate(&pm, t, &t.context().unwrap(), KIB64, KIB64).map(|_| ())
    };
    for _ in 0..4 {
        alloc(&a).unwrap();
    }
    assert_eq!(sim.memory_used(), 4 * KIB64);
    // Two blocks overflow, the third is past a's limit.
    alloc(&a).unwrap();
    alloc(&a).unwrap();
    let e = alloc(&a).unwrap_err();
    assert!(e.message.contains("overflow_limit"), "{}", e.message);
    // c has its own limit, but the host budget has one block left.
    alloc(&c).unwrap();
    let e = alloc(&c).unwrap_err();
    assert!(e.message.contains("budget"), "{}", e.message);
    assert_eq!(sim.host_memory_used(), 3 * KIB64);
    assert_eq!(b.host_budget().used(), 3 * KIB64);
    let s = a.placement().unwrap().snapshot();
    assert_eq!((s.device, s.host), (4 * KIB64, 2 * KIB64));
    b.remove_tenant("a");
    b.remove_tenant("c");
    drop((a, c));
    assert_eq!(
        b.host_budget().used(),
        0,
        "a removed VM gives its overflow back"
    );
}

#[test]
fn demotion_and_promotion_keep_the_bytes_behind_the_same_address() {
    let (b, sim) = broker(4 * KIB64, 2.0);
    let (borrower, owner) = borrower_and_owner(&b);
    let bctx = borrower.context().unwrap();
    let bpm = borrower.placement().unwrap().clone();
    let ptr = movable::allocate(&bpm, &borrower, &bctx, 4 * KIB64, 4 * KIB64).unwrap();
    let data: Vec<u8> = (0..4 * KIB64).map(|i| (i * 7 % 251) as u8).collect();
    bctx.write(ptr, &data).unwrap();
    assert_eq!(bpm.snapshot().borrowed, 4 * KIB64);
    // The owner claims its reservation: the borrower's buffer moves to host memory.
    let octx = owner.context().unwrap();
    let opm = owner.placement().unwrap().clone();
    let optr = movable::allocate(&opm, &owner, &octx, 4 * KIB64, 4 * KIB64).unwrap();
    assert_eq!(
        (sim.memory_used(), sim.host_memory_used()),
        (4 * KIB64, 4 * KIB64)
    );
    let mut back = vec![0u8; data.len()];
    bctx.read(ptr, &mut back).unwrap();
    assert!(back == data, "the data moved with the allocation");
    assert_eq!(bctx.migrate(ptr, Residence::Host), Ok(()), "already there");
    // The owner frees: the buffer comes back (once the owner has left its reservation alone
    // for `RESERVATION_HOLD`).
    octx.free(optr).unwrap();
    opm.untrack(optr);
    owner.slice.refund_unplaced(4 * KIB64);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while bpm.snapshot().host != 0 {
        assert!(std::time::Instant::now() < deadline, "no promotion");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!((sim.memory_used(), sim.host_memory_used()), (4 * KIB64, 0));
    bctx.read(ptr, &mut back).unwrap();
    assert!(back == data);
    let s = bpm.snapshot();
    assert_eq!((s.demotions, s.promotions), (1, 1));
}

#[test]
fn an_owner_allocating_and_freeing_in_a_loop_moves_the_borrower_once_per_hold() {
    use vgpu_broker::memory::placement::RESERVATION_HOLD;
    let (b, _sim) = broker(4 * KIB64, 2.0);
    let (borrower, owner) = borrower_and_owner(&b);
    let bpm = borrower.placement().unwrap().clone();
    movable::allocate(&bpm, &borrower, &borrower.context().unwrap(), KIB64, KIB64).unwrap();
    assert_eq!(bpm.snapshot().borrowed, KIB64);
    let octx = owner.context().unwrap();
    let opm = owner.placement().unwrap().clone();
    // A program that allocates its whole reservation and frees it again, ten times, with time
    // between for the promotion thread to act on every free.
    const CYCLES: u32 = 10;
    let start = std::time::Instant::now();
    for _ in 0..CYCLES {
        let p = movable::allocate(&opm, &owner, &octx, 4 * KIB64, 4 * KIB64).unwrap();
        octx.free(p).unwrap();
        opm.untrack(p);
        owner.slice.refund_unplaced(4 * KIB64);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let elapsed = start.elapsed();
    // Each hold lets the borrower back in at most once (without the hold: once per cycle).
    let s = bpm.snapshot();
    let allowed = 1 + (elapsed.as_secs_f64() / RESERVATION_HOLD.as_secs_f64()) as u64;
    assert!(
        (1..=allowed).contains(&s.demotions),
        "{} demotions in {CYCLES} cycles over {elapsed:?} (1 to {allowed}): {s:?}",
        s.demotions
    );
}
