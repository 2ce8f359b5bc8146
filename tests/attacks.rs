//! Attacks a hostile guest can make on vgpud's host resources, one test per
//! class not covered elsewhere (the register bomb and disconnects with queued
//! work are in shim_c.rs, oversized strings in the audit tests): vgpud
//! survives, answers the attacker with an error or a closed connection, keeps
//! serving another VM, and stays within its limits. Covered here: a connection
//! flood, the per-VM budgets, a flood of forged contexts and a declaration bomb.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vgpu_broker::testutils::TestClient;
use vgpu_proto::msg;
use vgpu_tests::harness::{TestVm, Vgpud, build_c_program, hold, run_against};

const MIB: u64 = 1 << 20;
/// vgpud's per-VM connection limit (`MAX_CONNECTIONS_PER_VM`).
const CONNECTION_LIMIT: usize = 1024;
/// Connections past the limit the attacker opens.
const EXTRA: usize = 64;
/// vgpud's greeting deadline, with room for a loaded machine.
const DEADLINE_WITH_SLACK: Duration = Duration::from_secs(30);

fn threads_of(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn driver_api_works(d: &Vgpud, vm: &str) {
    let prog = build_c_program("driver_api");
    let r = run_against(d, vm, &prog, &["basic"]);
    assert!(
        r.failures().is_empty() && r.code == 0,
        "{vm}: {}\n{}\n{}",
        r.stdout,
        r.stderr,
        d.log()
    );
}

/// A guest opens connections to its GPU socket and never says Hello: past
/// the per-VM limit new connections are closed at once (no thread each), the
/// idle ones are closed at the greeting deadline, another VM is served all
/// along, and the attacker's VM works again afterwards.
#[test]
fn a_connection_flood_costs_vgpud_one_bounded_set_of_threads() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)]);
    let threads_before = threads_of(d.pid());
    let socket = d.socket("vm1");
    let mut flood = Vec::new();
    for _ in 0..CONNECTION_LIMIT + EXTRA {
        let s = UnixStream::connect(&socket).expect("connect");
        s.set_read_timeout(Some(DEADLINE_WITH_SLACK)).unwrap();
        flood.push(s);
    }
    // The other VM is served while the flood is held.
    driver_api_works(&d, "vm2");
    let peak = threads_of(d.pid());
    // One thread per held connection, plus a few for vm2's session.
    assert!(
        peak <= threads_before + CONNECTION_LIMIT + 8,
        "vgpud runs {peak} threads (from {threads_before}) for {} idle connections",
        flood.len()
    );
    // Every idle connection ends: refused at once or closed at the deadline.
    let start = Instant::now();
    for (i, s) in flood.iter_mut().enumerate() {
        let mut byte = [0u8; 1];
        let n = s.read(&mut byte).unwrap_or_else(|e| {
            panic!(
                "connection {i} still open after {:?}: {e}\n{}",
                start.elapsed(),
                d.log()
            )
        });
        assert_eq!(n, 0, "connection {i} got data without a Hello");
    }
    println!(
        "{} idle connections closed within {:?}; threads {threads_before} -> {peak}",
        flood.len(),
        start.elapsed()
    );
    assert!(d.log().contains("connection limit"), "{}", d.log());
    let refused = |vm: &str| d.vm(vm)["limits"]["connections"]["refused"].as_u64();
    assert!(refused("vm1") >= Some(EXTRA as u64), "{:?}", refused("vm1"));
    assert_eq!(refused("vm2"), Some(0));
    drop(flood);
    driver_api_works(&d, "vm1");
    driver_api_works(&d, "vm2");
}

/// A VM with small budgets: its processes past `limits.sessions` are refused
/// at `cuInit` with `CUDA_ERROR_DEVICE_UNAVAILABLE`, its modules past
/// `limits.modules` with `CUDA_ERROR_OUT_OF_MEMORY` (before vgpud parses
/// them), an unload makes room again, and another VM is not affected.
#[test]
fn budgets_refuse_sessions_and_modules_past_the_vms_limits() {
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    const OUT_OF_MEMORY: &str = "refused 2";
    let d = Vgpud::start_config(
        r#"
[admin]
socket = "@DIR@/admin.sock"

[[device]]
name = "gpu0"
kind = "sim"
memory = "1GiB"

[[vm]]
name = "small"
memory = "64MiB"
unix_socket = "@DIR@/small.sock"
[vm.limits]
sessions = 2
modules = 5

[[vm]]
name = "other"
memory = "64MiB"
unix_socket = "@DIR@/other.sock"
"#,
    );
    let prog = build_c_program("driver_api");
    // Modules: five load, the sixth is refused; the other VM loads 64.
    let r = run_against(&d, "small", &prog, &["modules", "100"]);
    assert!(r.stdout.contains("loaded 5\n"), "{}\n{}", r.stdout, d.log());
    assert!(r.stdout.contains(OUT_OF_MEMORY), "{}", r.stdout);
    assert!(r.failures().is_empty(), "{}", r.stdout);
    let r = run_against(&d, "other", &prog, &["modules", "64"]);
    assert!(r.stdout.contains("loaded 64\n"), "{}", r.stdout);
    // Each refusal is counted for the VM that hit its budget, and only for it.
    let refused = |vm: &str, b: &str| d.vm(vm)["limits"][b]["refused"].as_u64();
    assert_eq!(refused("small", "modules"), Some(1));
    assert_eq!(refused("other", "modules"), Some(0));
    // Sessions: two processes hold the VM's sessions; a third is refused.
    let a = hold(&d, "small", MIB);
    let b = hold(&d, "small", MIB);
    let r = run_against(&d, "small", &prog, &["basic"]);
    assert!(
        r.stdout
            .contains("FAIL cuInit: got 46 (CUDA_ERROR_DEVICE_UNAVAILABLE)"),
        "a third session was admitted:\n{}",
        r.stdout
    );
    assert_eq!(refused("small", "sessions"), Some(1));
    driver_api_works(&d, "other");
    drop(a);
    drop(b);
    // Sessions end when their processes do; the VM takes new ones again.
    let start = Instant::now();
    while d.vm("small")["sessions"]
        .as_array()
        .is_some_and(|s| !s.is_empty())
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "sessions did not end"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    driver_api_works(&d, "small");
}

/// vgpud's resident memory, in bytes.
fn rss_of(pid: u32) -> u64 {
    let kib: u64 = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

/// A protocol session of `vm` with a context of its own.
fn session(d: &Vgpud, vm: &str) -> (TestClient<UnixStream>, u64) {
    let mut c = TestClient::new(UnixStream::connect(d.socket(vm)).unwrap());
    c.hello().unwrap();
    let ctx = c
        .call(
            &msg::CtxCreate {
                device: 0,
                flags: 0,
            },
            &[],
        )
        .unwrap()
        .0
        .handle;
    (c, ctx)
}

/// Fills posted (no reply wanted) in contexts the guest made up.
fn post_forged_fills(c: &mut TestClient<UnixStream>, seeds: std::ops::Range<u64>) {
    for i in seeds {
        // Spread over the whole value space, so each names another "context".
        let forged = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        c.post(
            &msg::Memset {
                ctx: forged,
                stream: 0,
                dst: 0,
                value: 0,
                elem_size: 1,
                count: 1,
            },
            &[],
        )
        .unwrap();
    }
}

/// A guest posts work naming hundreds of thousands of contexts it made up.
/// Each is refused; the refusal surfaces at the guest's next synchronizing
/// call, as a malformed request's does; vgpud keeps nothing per forged value
/// (its memory stays flat) and serves another VM throughout.
#[test]
fn a_forged_context_flood_leaves_nothing_behind() {
    /// Forged fills posted before the baseline is taken.
    const WARM_UP: u64 = 20_000;
    /// Forged fills posted after it. Kept per value, their errors (a message each) would
    /// take well over 64 MiB.
    const FLOOD: u64 = 400_000;
    /// Growth allowed for allocator noise.
    const SLACK: u64 = 24 * MIB;
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)]);
    let (mut c, ctx) = session(&d, "vm1");
    post_forged_fills(&mut c, 0..WARM_UP);
    let refused = c.call(&msg::CtxSynchronize { ctx }, &[]).unwrap_err();
    assert_ne!(refused.0, 0, "a forged context's fill surfaces as an error");
    let before = rss_of(d.pid());
    post_forged_fills(&mut c, WARM_UP..WARM_UP + FLOOD);
    // The first refusal surfaces once; then the session is clean again.
    assert!(c.call(&msg::CtxSynchronize { ctx }, &[]).is_err());
    assert_eq!(
        c.call(&msg::CtxSynchronize { ctx }, &[]).map(|_| ()),
        Ok(())
    );
    let after = rss_of(d.pid());
    assert!(
        after <= before + SLACK,
        "vgpud grew from {} to {} MiB over {FLOOD} forged contexts",
        before / MIB,
        after / MIB
    );
    // The attacker's own context works, and so does another VM.
    let p = c
        .call(&msg::MemAlloc { ctx, size: 4096 }, &[])
        .unwrap()
        .0
        .ptr;
    c.call(
        &msg::Memset {
            ctx,
            stream: 0,
            dst: p,
            value: 7,
            elem_size: 1,
            count: 4096,
        },
        &[],
    )
    .unwrap();
    driver_api_works(&d, "vm2");
}

/// PTX whose declarations name a quarter of a billion registers in 7 KiB
/// loads in bounded memory and time: declarations are never expanded. The
/// attacker gets an answer for every load, vgpud's memory stays flat, and
/// another VM is served.
#[test]
fn a_declaration_bomb_costs_its_size_not_what_it_declares() {
    /// Declaration lines per module, each of 2^20 registers.
    const LINES: usize = 256;
    /// Modules loaded (and unloaded) in a row.
    const LOADS: usize = 16;
    const SLACK: u64 = 32 * MIB;
    let mut ptx =
        String::from(".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry bomb()\n{\n");
    for i in 0..LINES {
        ptx.push_str(&format!(" .reg .b32 %q{i}_<1048576>;\n"));
    }
    ptx.push_str(" ret;\n}\n");
    let mut image = ptx.into_bytes();
    image.push(0);
    loads_leave_vgpud_flat(&image, LOADS, SLACK);
}

/// A cubin of the simulated GPU's architecture built to make a naive reader
/// quadratic: 30 000 kernels, each with a parameter section of its own (30 000
/// sections to look names up in). vgpud answers every load, stays flat in
/// memory and serves another VM.
#[test]
fn a_cubin_bomb_is_read_in_one_pass() {
    use vgpu_fatbin::cubin::{SHT_NOBITS, STO_CUDA_ENTRY, STT_FUNC};
    use vgpu_fatbin::testutils::ElfBuilder;
    /// Kernels, and parameter sections.
    const KERNELS: usize = 30_000;
    /// Loads in a row.
    const LOADS: usize = 4;
    /// Offset of `e_flags` in an ELF64 header; the simulated GPU's architecture, sm_80.
    const E_FLAGS: usize = 48;
    const SM_80: u32 = 80;
    const SLACK: u64 = 64 * MIB;
    let mut b = ElfBuilder::new();
    let text = b.section(".text", SHT_NOBITS, Vec::new());
    let info = ElfBuilder::nv_info(&[(0, 0, 8), (1, 8, 8)]);
    for k in 0..KERNELS {
        b.section(&format!(".nv.info.k{k}"), 0x7000_0000, info.clone());
        b.symbol(&format!("k{k}"), STT_FUNC, 1, STO_CUDA_ENTRY, text, 16);
    }
    let mut image = b.build();
    image[E_FLAGS..E_FLAGS + 4].copy_from_slice(&SM_80.to_le_bytes());
    assert!(image.len() < 8 << 20, "one request: {} bytes", image.len());
    loads_leave_vgpud_flat(&image, LOADS, SLACK);
}

/// Loads (and unloads) `image` `loads` times in a VM's session: every load is answered (a
/// refusal names its reason), vgpud's resident memory grows by at most `slack`, and another VM
/// is served afterwards.
fn loads_leave_vgpud_flat(image: &[u8], loads: usize, slack: u64) {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)]);
    let (mut c, ctx) = session(&d, "vm1");
    let before = rss_of(d.pid());
    for _ in 0..loads {
        match c.call(&msg::ModuleLoad { ctx }, image) {
            Ok((m, _)) => {
                c.call(
                    &msg::ModuleUnload {
                        ctx,
                        module: m.handle,
                    },
                    &[],
                )
                .unwrap();
            }
            Err((code, why)) => assert!(code != 0 && !why.is_empty(), "{code}: {why}"),
        }
    }
    let after = rss_of(d.pid());
    assert!(
        after <= before + slack,
        "vgpud grew from {} to {} MiB over {loads} loads",
        before / MIB,
        after / MIB
    );
    driver_api_works(&d, "vm2");
}
