//! Attacks a hostile guest can make on vgpud's host resources, one test per
//! class not covered elsewhere (the register bomb and disconnects with queued
//! work are in shim_c.rs, under a memory limit too): vgpud
//! survives, answers the attacker with an error or a closed connection, keeps
//! serving another VM, and stays within its limits. Covered here: a connection
//! flood, the per-VM budgets (sessions, modules, streams, events, handles,
//! queued copy data, executable graphs, interpreter state), a flood of forged
//! contexts, a declaration bomb, a cubin bomb, deep recursion with large
//! frames, slow module loads, a virtio-vgpu queue flood with hostile
//! descriptors and oversized guest strings. Every test runs vgpud under a hard
//! memory limit ([`DATA_LIMIT`], or a tighter one) and ends with [`survived`].

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vgpu_broker::testutils::TestClient;
use vgpu_proto::frame::MAX_BULK_CHUNK;
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
    let mut d = start_limited(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)]);
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
    survived(&mut d, "vm2");
}

/// A VM with small budgets: its processes past `limits.sessions` are refused
/// at `cuInit` with `CUDA_ERROR_DEVICE_UNAVAILABLE`, its modules past
/// `limits.modules` with `CUDA_ERROR_OUT_OF_MEMORY` (before vgpud parses
/// them), an unload makes room again, and another VM is not affected.
#[test]
fn budgets_refuse_sessions_and_modules_past_the_vms_limits() {
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    const OUT_OF_MEMORY: &str = "refused 2";
    let mut d = Vgpud::start_config_limited(
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
        DATA_LIMIT,
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
    survived(&mut d, "other");
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
    let mut d = start_limited(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)]);
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
    survived(&mut d, "vm2");
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
    let mut d = start_limited(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)]);
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
    survived(&mut d, "vm2");
}

/// `CUDA_ERROR_OUT_OF_MEMORY`.
const OUT_OF_MEMORY: u32 = 2;

/// A config of two VMs on the simulated GPU: `small` with the `[vm.limits]`
/// lines given, `other` with the defaults.
fn two_vms_with_limits(limits: &str) -> Vgpud {
    Vgpud::start_config_limited(
        &format!(
            r#"
[admin]
socket = "@DIR@/admin.sock"

[[device]]
name = "gpu0"
kind = "sim"
memory = "1GiB"

[[vm]]
name = "small"
memory = "256MiB"
unix_socket = "@DIR@/small.sock"
[vm.limits]
{limits}

[[vm]]
name = "other"
memory = "256MiB"
unix_socket = "@DIR@/other.sock"
"#
        ),
        DATA_LIMIT,
    )
}

fn create_stream(c: &mut TestClient<UnixStream>, ctx: u64) -> Result<u64, (u32, String)> {
    c.call(
        &msg::StreamCreate {
            ctx,
            flags: 0,
            priority: 0,
        },
        &[],
    )
    .map(|r| r.0.handle)
}

fn create_event(c: &mut TestClient<UnixStream>, ctx: u64) -> Result<u64, (u32, String)> {
    c.call(&msg::EventCreate { ctx, flags: 0 }, &[])
        .map(|r| r.0.handle)
}

/// A guest floods stream and event creation from several processes: past
/// its VM's `limits.streams` and `limits.events` each creation gets
/// `CUDA_ERROR_OUT_OF_MEMORY` (as a real driver out of room says), the
/// refusals are counted for that VM only, another VM keeps creating streams
/// meanwhile, a destroy makes room again (create/destroy cycles far past the
/// budget keep working), and a process's end returns what it held.
#[test]
fn a_stream_and_event_flood_is_refused_at_the_vms_budget() {
    const STREAMS: u64 = 64;
    const EVENTS: u64 = 32;
    /// Processes of the attacking VM.
    const PROCESSES: usize = 4;
    /// Create/destroy cycles after the flood.
    const CYCLES: usize = 1000;
    let mut d = two_vms_with_limits(&format!("streams = {STREAMS}\nevents = {EVENTS}\n"));
    let mut attackers: Vec<_> = (0..PROCESSES).map(|_| session(&d, "small")).collect();
    let mut streams = Vec::new();
    let mut refused = 0;
    for round in 0..STREAMS as usize {
        for (i, (c, ctx)) in attackers.iter_mut().enumerate() {
            match create_stream(c, *ctx) {
                Ok(s) => streams.push((i, s)),
                Err((code, why)) => {
                    assert_eq!(code, OUT_OF_MEMORY, "round {round}: {why}");
                    assert!(why.contains("limits.streams"), "{why}");
                    refused += 1;
                }
            }
        }
    }
    assert_eq!(streams.len() as u64, STREAMS);
    for (c, ctx) in attackers.iter_mut() {
        while let Ok(_e) = create_event(c, *ctx) {}
    }
    // The other VM is not held to the attacker's budget.
    let (mut o, octx) = session(&d, "other");
    for _ in 0..2 * STREAMS {
        create_stream(&mut o, octx).unwrap();
    }
    let limits = |vm: &str| d.vm(vm)["limits"].clone();
    let small = limits("small");
    assert_eq!(small["streams"]["used"].as_u64(), Some(STREAMS), "{small}");
    assert_eq!(small["streams"]["refused"].as_u64(), Some(refused));
    assert_eq!(small["events"]["used"].as_u64(), Some(EVENTS), "{small}");
    assert_eq!(small["events"]["refused"].as_u64(), Some(PROCESSES as u64));
    let other = limits("other");
    assert_eq!(other["streams"]["used"].as_u64(), Some(2 * STREAMS));
    assert_eq!(other["streams"]["refused"].as_u64(), Some(0));
    // A destroy makes room; cycles far past the budget keep working.
    let (i, s) = streams.pop().unwrap();
    let (c, ctx) = &mut attackers[i];
    c.call(
        &msg::StreamDestroy {
            ctx: *ctx,
            stream: s,
        },
        &[],
    )
    .unwrap();
    for _ in 0..CYCLES {
        let s = create_stream(c, *ctx).unwrap();
        c.call(
            &msg::StreamDestroy {
                ctx: *ctx,
                stream: s,
            },
            &[],
        )
        .unwrap();
    }
    // The processes' ends return everything.
    drop(attackers);
    let start = Instant::now();
    while limits("small")["streams"]["used"].as_u64() != Some(0)
        || limits("small")["events"]["used"].as_u64() != Some(0)
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "budgets not returned: {}",
            limits("small")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (mut c, ctx) = session(&d, "small");
    for _ in 0..STREAMS {
        create_stream(&mut c, ctx).unwrap();
    }
    survived(&mut d, "other");
}

/// A guest's processes post many large host-to-device copies behind a stream
/// that does not move (a host function not run yet), without ever
/// synchronizing. The VM's queued copy data stays within its
/// `limits.queued_bytes` (its sessions wait: back-pressure, no error), vgpud's
/// memory grows by about that much and not by what was sent, another VM is
/// served meanwhile, and once the streams move every copy lands.
#[test]
fn a_queued_copy_flood_stays_within_the_vms_queued_bytes() {
    /// The attacking VM's budget.
    const BUDGET: u64 = 32 * MIB;
    /// Processes of the attacking VM; alone, each could queue 64 MiB.
    const PROCESSES: u64 = 4;
    /// Copies each posts, of `COPY` bytes: 96 MiB each, 384 MiB in all.
    const COPIES: u64 = 24;
    const COPY: u64 = 4 * MIB;
    /// Growth allowed besides the budget: the sessions' frame buffers (one
    /// frame each) and allocator noise.
    const SLACK: u64 = 48 * MIB;
    let mut d = two_vms_with_limits("queued_bytes = \"32MiB\"\n");
    let (mut opener, _) = session(&d, "small");
    let before = rss_of(d.pid());
    let mut writers = Vec::new();
    let mut checks = Vec::new();
    for i in 0..PROCESSES {
        let (mut c, ctx) = session(&d, "small");
        let p = c
            .call(&msg::MemAlloc { ctx, size: COPY }, &[])
            .unwrap()
            .0
            .ptr;
        c.call(
            &msg::StreamHostFunc {
                ctx,
                stream: 0,
                token_hi: 0xF100D,
                token_lo: i,
            },
            &[],
        )
        .unwrap();
        let mut s = c.stream.try_clone().unwrap();
        writers.push(std::thread::spawn(move || {
            let mut w = TestClient::new(&mut s);
            for k in 0..COPIES {
                let data = vec![(i * COPIES + k) as u8; COPY as usize];
                w.post(
                    &msg::MemcpyHtoD {
                        ctx,
                        stream: 0,
                        dst: p,
                    },
                    &data,
                )
                .unwrap();
            }
        }));
        checks.push((c, ctx, p, i));
    }
    // Sample while the flood is held back.
    let queued = || d.vm("small")["limits"]["queued_bytes"].clone();
    let start = Instant::now();
    let mut peak_used = 0;
    let mut peak_rss = 0;
    while start.elapsed() < Duration::from_secs(3) {
        let q = queued();
        peak_used = peak_used.max(q["used"].as_u64().unwrap());
        peak_rss = peak_rss.max(rss_of(d.pid()));
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "queued {} MiB at most (budget {} MiB); vgpud RSS {} -> {} MiB while {} MiB were posted",
        peak_used / MIB,
        BUDGET / MIB,
        before / MIB,
        peak_rss / MIB,
        PROCESSES * COPIES * COPY / MIB
    );
    assert_eq!(peak_used, BUDGET, "{}", queued());
    assert!(queued()["refused"].as_u64() >= Some(1), "{}", queued());
    assert!(
        peak_rss <= before + BUDGET + SLACK,
        "vgpud grew from {} to {} MiB",
        before / MIB,
        peak_rss / MIB
    );
    // Another VM is served while the attacker's sessions wait.
    driver_api_works(&d, "other");
    // The streams move: every copy lands, in order.
    for i in 0..PROCESSES {
        opener
            .call(
                &msg::HostFuncDone {
                    token_hi: 0xF100D,
                    token_lo: i,
                },
                &[],
            )
            .unwrap();
    }
    for w in writers {
        w.join().unwrap();
    }
    for (mut c, ctx, p, i) in checks {
        c.call(&msg::CtxSynchronize { ctx }, &[]).unwrap();
        let (_, v) = c
            .call(
                &msg::MemcpyDtoH {
                    ctx,
                    stream: 0,
                    src: p + COPY - 8,
                    len: 8,
                },
                &[],
            )
            .unwrap();
        assert_eq!(v, vec![(i * COPIES + COPIES - 1) as u8; 8]);
    }
    assert_eq!(queued()["used"].as_u64(), Some(0));
    survived(&mut d, "other");
}

// ---------------------------------------------------------------------------
// vgpud under a memory limit, and the attacks on the graph, handle and
// virtio-vgpu queue budgets
// ---------------------------------------------------------------------------

/// Private writable memory vgpud may map in every attack test (`RLIMIT_DATA`,
/// [`Vgpud::start_config_limited`]): past it an allocation fails and vgpud
/// aborts, which [`survived`] catches. Measured on this machine (debug build):
/// 13 MiB idle with two VMs; 2.6 GiB with one VM's 1024 connections held (a
/// session thread costs its 2 MiB stack and thread-local data, 2.6 MiB in
/// all). The simulated GPU maps device memory as the VMs allocate it. So the
/// limit is one VM's whole connection budget plus 64 threads at 3 MiB, the
/// slices of these tests (at most 512 MiB), the host memory the other budgets
/// let a VM hold (queued copy data and executable graphs, 256 MiB each by
/// default; 2048 virtio-vgpu chains in flight with at most 64 KiB of inline
/// bytes each, 128 MiB) and 128 MiB for the rest: 4544 MiB.
const DATA_LIMIT: u64 =
    (CONNECTION_LIMIT as u64 + 64) * 3 * MIB + 512 * MIB + 640 * MIB + 128 * MIB;

/// [`Vgpud::start`] under [`DATA_LIMIT`].
fn start_limited(vms: &[TestVm]) -> Vgpud {
    Vgpud::start_limited(vms, DATA_LIMIT)
}

/// A `VmHWM:`-style line of `/proc/PID/status`, in bytes.
fn status_bytes(pid: u32, key: &str) -> u64 {
    let kib: u64 = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

/// The end of every attack test: vgpud is alive, ran under [`DATA_LIMIT`],
/// and serves `other` (a VM with a unix socket).
fn survived(d: &mut Vgpud, other: &str) {
    survived_under(d, other, DATA_LIMIT);
}

/// [`survived`] for a test that ran vgpud under a tighter `limit`.
fn survived_under(d: &mut Vgpud, other: &str, limit: u64) {
    assert!(d.is_running(), "vgpud died; log:\n{}", d.log());
    assert_eq!(d.data_limit(), Some(limit), "vgpud ran without its limit");
    driver_api_works(d, other);
    assert!(d.is_running(), "vgpud died; log:\n{}", d.log());
    println!(
        "vgpud survived: peak resident {} MiB, private data {} MiB of its {} MiB limit",
        status_bytes(d.pid(), "VmHWM:") / MIB,
        status_bytes(d.pid(), "VmData:") / MIB,
        limit / MIB
    );
}

/// Polls `what` (a VM's `limits.BUDGET.used`) until it is 0.
fn wait_returned(d: &Vgpud, vm: &str, budget: &str) {
    let start = Instant::now();
    loop {
        let v = d.vm(vm)["limits"][budget].clone();
        if v["used"].as_u64() == Some(0) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{vm}'s {budget} not returned: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A graph of `nodes` event records, as the shim uploads at `cuGraphInstantiate`.
fn event_graph(c: &mut TestClient<UnixStream>, ctx: u64, nodes: usize) -> Vec<u8> {
    let event = create_event(c, ctx).unwrap();
    let mut bytes = Vec::new();
    for _ in 0..nodes {
        vgpu_proto::graph::push_op(
            &mut bytes,
            &msg::EventRecord {
                ctx,
                stream: 0,
                event,
            },
            &[],
        );
    }
    bytes
}

fn instantiate(
    c: &mut TestClient<UnixStream>,
    ctx: u64,
    nodes: &[u8],
) -> Result<u64, (u32, String)> {
    c.call(&msg::GraphInstantiate { ctx, replace: 0 }, nodes)
        .map(|r| r.0.handle)
}

/// A guest's processes instantiate executable graphs without end: past its
/// VM's `limits.graph_bytes` each instantiation gets `CUDA_ERROR_OUT_OF_MEMORY`
/// (what the shim's `cuGraphInstantiate` returns), the VM holds no more than
/// its budget, another VM instantiates more than that meanwhile, a destroyed
/// graph makes room, and the processes' ends return everything.
#[test]
fn a_graph_flood_is_refused_at_the_vms_graph_bytes() {
    const BUDGET: u64 = 4 * MIB;
    /// Nodes per graph.
    const NODES: usize = 1024;
    const PROCESSES: usize = 3;
    let mut d = two_vms_with_limits("graph_bytes = \"4MiB\"\n");
    let graph_bytes = |vm: &str| d.vm(vm)["limits"]["graph_bytes"].clone();
    let mut attackers: Vec<_> = (0..PROCESSES)
        .map(|_| {
            let (mut c, ctx) = session(&d, "small");
            let nodes = event_graph(&mut c, ctx, NODES);
            (c, ctx, nodes, Vec::new())
        })
        .collect();
    // What one graph holds, as vgpud counts it.
    let (c, ctx, nodes, execs) = &mut attackers[0];
    execs.push(instantiate(c, *ctx, nodes).unwrap());
    let per_graph = graph_bytes("small")["used"].as_u64().unwrap();
    assert!(per_graph > 0 && per_graph < BUDGET / 8, "{per_graph}");
    // The flood, the processes in turn; each stops at its first refusal.
    let mut refused = [false; PROCESSES];
    while refused.contains(&false) {
        for (i, (c, ctx, nodes, execs)) in attackers.iter_mut().enumerate() {
            if refused[i] {
                continue;
            }
            match instantiate(c, *ctx, nodes) {
                Ok(h) => execs.push(h),
                Err((code, why)) => {
                    assert_eq!(code, OUT_OF_MEMORY, "{why}");
                    assert!(why.contains("limits.graph_bytes"), "{why}");
                    refused[i] = true;
                }
            }
        }
    }
    let held: usize = attackers.iter().map(|a| a.3.len()).sum();
    let small = graph_bytes("small");
    println!("{held} graphs of {per_graph} bytes instantiated, then refused: {small}");
    assert_eq!(held as u64, BUDGET / per_graph, "{small}");
    assert_eq!(small["used"].as_u64(), Some(held as u64 * per_graph));
    assert_eq!(small["refused"].as_u64(), Some(PROCESSES as u64));
    // The other VM is not held to the attacker's budget.
    let (mut o, octx) = session(&d, "other");
    let onodes = event_graph(&mut o, octx, NODES);
    for _ in 0..2 * held {
        instantiate(&mut o, octx, &onodes).unwrap();
    }
    let other = graph_bytes("other");
    assert_eq!(other["used"].as_u64(), Some(2 * held as u64 * per_graph));
    assert_eq!(other["refused"].as_u64(), Some(0));
    // The graphs held are real: one runs. A destroy makes room for another.
    let (c, ctx, nodes, execs) = &mut attackers[0];
    c.call(
        &msg::GraphLaunch {
            ctx: *ctx,
            stream: 0,
            exec: execs[0],
        },
        &[],
    )
    .unwrap();
    c.call(&msg::CtxSynchronize { ctx: *ctx }, &[]).unwrap();
    let exec = execs.pop().unwrap();
    c.call(&msg::GraphExecDestroy { ctx: *ctx, exec }, &[])
        .unwrap();
    assert!(instantiate(c, *ctx, nodes).is_ok());
    assert!(instantiate(c, *ctx, nodes).is_err());
    // The processes' ends return everything.
    drop(attackers);
    wait_returned(&d, "small", "graph_bytes");
    let (mut c, ctx) = session(&d, "small");
    let nodes = event_graph(&mut c, ctx, NODES);
    for _ in 0..held {
        instantiate(&mut c, ctx, &nodes).unwrap();
    }
    survived(&mut d, "other");
}

/// A guest's processes create contexts and memory pools (and look kernels up)
/// without end: these count together against the VM's `limits.handles`, past
/// which each creation gets `CUDA_ERROR_OUT_OF_MEMORY`, counted for that VM
/// only; another VM creates twice as many meanwhile, a destroy of one kind
/// makes room for another, and the processes' ends return everything.
#[test]
fn a_handle_flood_is_refused_at_the_vms_handles_budget() {
    const HANDLES: u64 = 48;
    const PROCESSES: usize = 3;
    /// Create/destroy cycles after the flood.
    const CYCLES: usize = 500;
    let mut d = two_vms_with_limits(&format!("handles = {HANDLES}\n"));
    let handles = |vm: &str| d.vm(vm)["limits"]["handles"].clone();
    let create_ctx = |c: &mut TestClient<UnixStream>| {
        c.call(
            &msg::CtxCreate {
                device: 0,
                flags: 0,
            },
            &[],
        )
        .map(|r| r.0.handle)
    };
    let create_pool = |c: &mut TestClient<UnixStream>, ctx: u64| {
        c.call(
            &msg::MemPoolCreate {
                ctx,
                max_size: 0,
                handle_types: 0,
            },
            &[],
        )
        .map(|r| r.0.handle)
    };
    // Each process holds a context (from `session`); a kernel lookup is a handle too.
    let mut attackers: Vec<_> = (0..PROCESSES).map(|_| session(&d, "small")).collect();
    assert_eq!(handles("small")["used"].as_u64(), Some(PROCESSES as u64));
    let mut image = std::fs::read(vgpu_tests::harness::ptx("saxpy.sm_80.ptx")).unwrap();
    image.push(0);
    let (c, ctx) = &mut attackers[0];
    let module = c
        .call(&msg::ModuleLoad { ctx: *ctx }, &image)
        .unwrap()
        .0
        .handle;
    c.call(
        &msg::ModuleGetFunction {
            ctx: *ctx,
            module,
            name: "saxpy".into(),
        },
        &[],
    )
    .unwrap();
    let start = handles("small")["used"].as_u64().unwrap();
    assert_eq!(start, PROCESSES as u64 + 1, "a function is a handle");
    // The flood: contexts and pools in turn, the processes in turn.
    let mut held = Vec::new();
    let mut refused = [false; PROCESSES];
    let mut k = 0;
    while refused.contains(&false) {
        for (i, (c, ctx)) in attackers.iter_mut().enumerate() {
            if refused[i] {
                continue;
            }
            k += 1;
            let r = if k % 2 == 0 {
                create_ctx(c).map(|h| (i, true, h))
            } else {
                create_pool(c, *ctx).map(|h| (i, false, h))
            };
            match r {
                Ok(h) => held.push(h),
                Err((code, why)) => {
                    assert_eq!(code, OUT_OF_MEMORY, "{why}");
                    assert!(why.contains("limits.handles"), "{why}");
                    refused[i] = true;
                }
            }
        }
    }
    let small = handles("small");
    println!(
        "{} contexts and pools created, then refused: {small}",
        held.len()
    );
    assert_eq!(held.len() as u64, HANDLES - start, "{small}");
    assert_eq!(small["used"].as_u64(), Some(HANDLES));
    assert_eq!(small["refused"].as_u64(), Some(PROCESSES as u64));
    // The other VM is not held to the attacker's budget.
    let (mut o, octx) = session(&d, "other");
    for i in 0..2 * HANDLES {
        if i % 2 == 0 {
            create_ctx(&mut o).unwrap();
        } else {
            create_pool(&mut o, octx).unwrap();
        }
    }
    let other = handles("other");
    assert_eq!(other["used"].as_u64(), Some(2 * HANDLES + 1), "{other}");
    assert_eq!(other["refused"].as_u64(), Some(0));
    // A context destroyed makes room for a pool; cycles far past the budget keep working.
    let (i, _, h) = *held.iter().find(|(_, is_ctx, _)| *is_ctx).unwrap();
    let (c, ctx) = &mut attackers[i];
    c.call(&msg::CtxDestroy { ctx: h }, &[]).unwrap();
    for _ in 0..CYCLES {
        let pool = create_pool(c, *ctx).unwrap();
        c.call(&msg::MemPoolDestroy { ctx: *ctx, pool }, &[])
            .unwrap();
    }
    assert!(create_pool(c, *ctx).is_ok());
    assert!(create_pool(c, *ctx).is_err());
    // The processes' ends return everything.
    drop(attackers);
    wait_returned(&d, "small", "handles");
    let (mut c, _) = session(&d, "small");
    for _ in 1..HANDLES {
        create_ctx(&mut c).unwrap();
    }
    survived(&mut d, "other");
}

/// A raw descriptor: address, length, `VRING_DESC_F_*` flags, where `next` points.
type WiredDesc = (u64, u32, u16, vgpu_vmm_testutils::vgpu::Next);

/// Most descriptor chains a virtio-vgpu device holds at once: both queues
/// full (`MAX_IN_FLIGHT` in `vmm-backend/vhost-vgpu/src/shared.rs`).
const MAX_IN_FLIGHT: usize = 2 * 1024;

/// vgpud with two VMs on virtio-vgpu devices (and unix sockets, for
/// [`survived`]), the simulated GPU's watchdog at `watchdog_ms`.
fn two_device_vms(watchdog_ms: u64) -> Vgpud {
    let mut text = format!(
        "[admin]\nsocket = \"@DIR@/admin.sock\"\n\n[[device]]\nname = \"gpu0\"\nkind = \"sim\"\n\
         memory = \"1GiB\"\nworkers = 2\nwatchdog_ms = {watchdog_ms}\n"
    );
    for vm in ["evil", "other"] {
        text += &format!(
            "\n[[vm]]\nname = \"{vm}\"\nmemory = \"256MiB\"\nunix_socket = \"@DIR@/{vm}.sock\"\n\
             vhost_user_socket = \"@DIR@/{vm}.vhost.sock\"\ndevice_model = \"vgpu\"\n"
        );
    }
    Vgpud::start_config_limited(&text, DATA_LIMIT)
}

/// A VMM and guest driver for a device VM of `d` (the in-process frontend
/// over vgpud's real vhost-user socket).
fn device_guest(d: &Vgpud, vm: &str) -> vgpu_vmm_testutils::vgpu::DevGuest {
    use vgpu_vmm_testutils::vgpu::{DevGuest, DevGuestOptions};
    let opts = DevGuestOptions {
        queue_size: 1024,
        memory: 64 * MIB,
        ..Default::default()
    };
    DevGuest::start(&d.dir().join(format!("{vm}.vhost.sock")), opts).unwrap()
}

/// A device session past its handshake, with a context.
fn device_session(
    g: &vgpu_vmm_testutils::vgpu::DevGuest,
    id: u32,
) -> (vgpu_vmm_testutils::vgpu::DevSession, u64) {
    let mut s = vgpu_vmm_testutils::vgpu::DevSession::open(g, id).unwrap();
    s.hello("attacker").unwrap();
    let ctx = s.ctx_create().unwrap();
    (s, ctx)
}

/// A device session copies a pattern to the GPU and back.
fn device_roundtrip(s: &mut vgpu_vmm_testutils::vgpu::DevSession, ctx: u64) {
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7) as u8).collect();
    let p = s
        .call(
            &msg::MemAlloc {
                ctx,
                size: data.len() as u64,
            },
            &[],
        )
        .unwrap()
        .ptr;
    s.call(
        &msg::MemcpyHtoD {
            ctx,
            stream: 0,
            dst: p,
        },
        &data,
    )
    .unwrap();
    let back = s.guest().alloc(data.len(), false).unwrap();
    s.call_sg(
        &msg::MemcpyDtoH {
            ctx,
            stream: 0,
            src: p,
            len: data.len() as u64,
        },
        &[],
        &back.segments(0, data.len()),
    )
    .unwrap();
    let mut got = vec![0u8; data.len()];
    s.guest().read_buf(&back, 0, &mut got).unwrap();
    assert!(got == data, "the round trip changed the data");
    s.call(&msg::MemFree { ctx, ptr: p }, &[]).unwrap();
}

/// A hostile guest driver over real vhost-user: its session waits behind a
/// kernel that spins until the watchdog, and meanwhile the driver places one
/// control and one submission chain, each carrying the most inline bytes a
/// request may (64 KiB), on the rings again and again without getting them
/// back. vgpud takes no more than both queues' worth of chains (2048) and then
/// stops reading the rings (its memory grows by at most those chains'
/// bytes, not by what the guest posts), another VM's device is served all
/// along, and once the kernel stops every placing is answered (the repeats
/// refused as repeated sequence numbers): nothing hangs. Then chains that loop
/// or point outside the ring or guest memory are refused one by one.
#[test]
fn a_virtio_queue_flood_is_held_to_the_in_flight_limit() {
    use vgpu_proto::msg::Message;
    use vgpu_vhost_vgpu::wire::{CTRL_QUEUE, MAX_INLINE, REQ_CALL, ReqHeader, SUBMIT_QUEUE};
    use vgpu_vmm_testutils::vgpu::{DEFAULT_TIMEOUT, DevError, Next};
    /// The attacker's kernel spins this long.
    const WATCHDOG_MS: u64 = 20_000;
    /// Placings the guest tries to make: four times what the device may hold.
    const TARGET: usize = 4 * MAX_IN_FLIGHT;
    /// How long the guest tries after the device last took something.
    const STALL: Duration = Duration::from_secs(2);
    /// Growth allowed besides the chains held: allocator noise, thread stacks.
    const SLACK: u64 = 48 * MIB;
    let mut d = two_device_vms(WATCHDOG_MS);
    let g = device_guest(&d, "evil");
    let go = device_guest(&d, "other");
    let (mut o, octx) = device_session(&go, 1);
    device_roundtrip(&mut o, octx);
    let (mut s, ctx) = device_session(&g, 1);
    let dst = s
        .call(
            &msg::MemAlloc {
                ctx,
                size: MAX_INLINE as u64,
            },
            &[],
        )
        .unwrap()
        .ptr;
    // Busy: a kernel that spins until the watchdog, and a synchronize waiting for it.
    let module = s
        .call(
            &msg::ModuleLoad { ctx },
            vgpu_tests::conformance_streams::FLAG_PTX.as_bytes(),
        )
        .unwrap()
        .handle;
    let function = s
        .call(
            &msg::ModuleGetFunction {
                ctx,
                module,
                name: "wait_flag".into(),
            },
            &[],
        )
        .unwrap()
        .function;
    let flag = s.call(&msg::MemAlloc { ctx, size: 4 }, &[]).unwrap().ptr;
    let out = s.call(&msg::MemAlloc { ctx, size: 4 }, &[]).unwrap().ptr;
    let mut params = flag.to_le_bytes().to_vec();
    params.extend_from_slice(&out.to_le_bytes());
    let launch_started = Instant::now();
    s.post_sg(
        &msg::LaunchKernel {
            ctx,
            stream: 0,
            function,
            grid_x: 1,
            grid_y: 1,
            grid_z: 1,
            block_x: 1,
            block_y: 1,
            block_z: 1,
            shared_bytes: 0,
        },
        &{
            let buf = g.alloc(params.len(), false).unwrap();
            g.write_buf(&buf, 0, &params).unwrap();
            buf.segments(0, params.len())
        },
    )
    .unwrap();
    let sync = s
        .submit_call(&msg::CtxSynchronize { ctx }, &[], &[])
        .unwrap();
    // The two requests to post over and over: copies carrying 64 KiB inline.
    let copy = msg::MemcpyHtoD {
        ctx,
        stream: 0,
        dst,
    };
    let mut fields = Vec::new();
    copy.encode(&mut fields);
    let extra = MAX_INLINE - vgpu_proto::frame::HEADER_LEN - fields.len();
    let mut request = |asynchronous: bool| {
        let mut r = s.frame_request(&copy, asynchronous, extra);
        r.inline.resize(MAX_INLINE, 0x5a);
        r.hdr.reply_cap = if asynchronous { 0 } else { 64 };
        r
    };
    let ctrl_req = request(false);
    let sub_req = request(true);
    let ctrl = g.submit(CTRL_QUEUE, &ctrl_req, 64).unwrap();
    let sub = g.submit(SUBMIT_QUEUE, &sub_req, 0).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let before = rss_of(d.pid());
    // The flood.
    let mut posted = [0usize; 2];
    let mut peak = before;
    let mut progress = Instant::now();
    while posted.iter().sum::<usize>() < TARGET && progress.elapsed() < STALL {
        let n = [g.repost(&ctrl, 64), g.repost(&sub, 64)];
        posted[0] += n[0];
        posted[1] += n[1];
        if n != [0, 0] {
            progress = Instant::now();
        } else {
            std::thread::sleep(Duration::from_millis(10));
        }
        peak = peak.max(rss_of(d.pid()));
    }
    let flood_time = launch_started.elapsed();
    let stats = |vm: &str| d.vm(vm)["vgpu_device"]["stats"].clone();
    println!(
        "the guest placed its chains {posted:?} more times in {flood_time:?}; vgpud RSS {} -> {} MiB; {}",
        before / MIB,
        peak / MIB,
        stats("evil")
    );
    assert!(
        flood_time < Duration::from_millis(WATCHDOG_MS),
        "the flood outlasted the kernel: nothing was measured"
    );
    let total = posted.iter().sum::<usize>();
    assert!(
        total < TARGET,
        "the device kept taking chains ({total}) while the session was busy"
    );
    assert!(total >= MAX_IN_FLIGHT, "{posted:?}");
    assert!(stats("evil")["in_flight_throttles"].as_u64() >= Some(1));
    assert!(
        d.log()
            .contains(&format!("the guest has {MAX_IN_FLIGHT} requests in flight")),
        "{}",
        d.log()
    );
    assert!(
        peak <= before + (MAX_IN_FLIGHT * MAX_INLINE) as u64 + SLACK,
        "vgpud grew from {} to {} MiB",
        before / MIB,
        peak / MIB
    );
    // The other VM's device is served while the attacker's is full.
    device_roundtrip(&mut o, octx);
    assert_eq!(stats("other")["in_flight_throttles"].as_u64(), Some(0));
    // The kernel stops at the watchdog; every placing is answered.
    let synced = g
        .wait(sync, Duration::from_millis(WATCHDOG_MS) + DEFAULT_TIMEOUT)
        .unwrap();
    match vgpu_vmm_testutils::vgpu::DevSession::reply_of::<msg::CtxSynchronize>(&synced) {
        Err(DevError::Cuda(702, _)) => {}
        other => panic!("the synchronize ended with {other:?}"),
    }
    let deadline = Instant::now() + DEFAULT_TIMEOUT;
    while g.returned(&ctrl) < 1 + posted[0] as u64 || g.returned(&sub) < 1 + posted[1] as u64 {
        assert!(
            Instant::now() < deadline,
            "{} and {} of {posted:?} placings came back; {}",
            g.returned(&ctrl),
            g.returned(&sub),
            stats("evil")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    g.wait(ctrl, DEFAULT_TIMEOUT).unwrap();
    g.wait(sub, DEFAULT_TIMEOUT).unwrap();
    let refused = stats("evil")["refused_requests"].as_u64().unwrap();
    assert!(refused >= total as u64, "{refused} of {total} refused");
    assert!(
        d.log().contains("is stale, repeated or too far ahead"),
        "{}",
        d.log()
    );
    // Hostile chains, each refused on its own (none has a response descriptor).
    let end = g.memory_size();
    let area = g.alloc(64 * 1024, true).unwrap().pages[0];
    let mut hdr = ReqHeader {
        kind: REQ_CALL,
        session: 1,
        seq: 1 << 40,
        inline_len: 0,
        reply_cap: 0,
        reserved: 0,
    }
    .to_bytes()
    .to_vec();
    hdr.resize(64, 0);
    g.write_mem(area, &hdr).unwrap();
    let table = area + 0x1000;
    // An indirect table whose one descriptor links to itself.
    let mut looped = Vec::new();
    looped.extend_from_slice(&area.to_le_bytes());
    looped.extend_from_slice(&64u32.to_le_bytes());
    looped.extend_from_slice(&1u16.to_le_bytes()); // VRING_DESC_F_NEXT
    looped.extend_from_slice(&0u16.to_le_bytes());
    g.write_mem(table, &looped).unwrap();
    const NEXT: u16 = 1;
    const INDIRECT: u16 = 4;
    let chains: Vec<(&str, Vec<WiredDesc>)> = vec![
        ("a loop", vec![(area, 64, NEXT, Next::Desc(0))]),
        (
            "a loop of two",
            vec![
                (area, 32, NEXT, Next::Desc(1)),
                (area, 32, NEXT, Next::Desc(0)),
            ],
        ),
        (
            "next out of range",
            vec![(area, 64, NEXT, Next::Raw(60_000))],
        ),
        (
            "an indirect table that loops",
            vec![(table, 16, INDIRECT, Next::Raw(0))],
        ),
        (
            "an indirect table of absurd length",
            vec![(table, 0xffff_fff0, INDIRECT, Next::Raw(0))],
        ),
        (
            "an indirect table outside guest RAM",
            vec![(end + 4096, 64, INDIRECT, Next::Raw(0))],
        ),
        (
            "a descriptor of 4 GiB",
            vec![(area, u32::MAX, 0, Next::Raw(0))],
        ),
    ];
    let dropped = stats("evil")["dropped_chains"].as_u64().unwrap();
    for (name, chain) in &chains {
        for queue in [CTRL_QUEUE, SUBMIT_QUEUE] {
            let t = g.submit_wired(queue, chain).unwrap();
            g.wait_raw(queue, t, DEFAULT_TIMEOUT)
                .unwrap_or_else(|e| panic!("{name}: {e}\n{}", d.log()));
        }
    }
    let now = stats("evil")["dropped_chains"].as_u64().unwrap();
    assert_eq!(now - dropped, 2 * chains.len() as u64, "{}", stats("evil"));
    // The attacker's VM is served again, and so is the other.
    let (mut s2, ctx2) = device_session(&g, 2);
    device_roundtrip(&mut s2, ctx2);
    device_roundtrip(&mut o, octx);
    assert_eq!(stats("other")["dropped_chains"].as_u64(), Some(0));
    survived(&mut d, "other");
}

/// Hand-written PTX for the interpreter-state attacks: `heavy` gives each thread 128 KiB of
/// local memory (128 MiB for a block of 1024 threads), and `deep` recurses `depth` calls into
/// `rec`, whose frames hold 65536 64-bit registers (16 MiB per warp and call): its control flow
/// (a chain of blocks laid out backwards, `CHAIN`) is one the interpreter's register packing
/// gives up on, so every declared register stays in the frame.
const INTERPRETER_BOMBS: &str = r#"
.version 7.0
.target sm_52
.address_size 64

.func (.param .b32 ret) rec(.param .b32 n)
{
    .reg .b64 %big<65536>;
    .reg .b32 %r<4>;
    .reg .pred %p<2>;
    ld.param.b32 %r1, [n];
    setp.eq.s32 %p1, %r1, 0;
    @%p1 bra DONE;
CHAIN
    sub.s32 %r2, %r1, 1;
    {
    .param .b32 a;
    .param .b32 rv;
    st.param.b32 [a], %r2;
    call.uni (rv), rec, (a);
    ld.param.b32 %r3, [rv];
    }
    add.s32 %r1, %r3, 1;
DONE:
    st.param.b32 [ret], %r1;
    ret;
}

.visible .entry deep(.param .u64 out, .param .u32 depth)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [depth];
    {
    .param .b32 a;
    .param .b32 rv;
    st.param.b32 [a], %r1;
    call.uni (rv), rec, (a);
    ld.param.b32 %r2, [rv];
    }
    st.global.u32 [%rd1], %r2;
    ret;
}

.visible .entry heavy(.param .u64 out)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<5>;
    .local .align 8 .b8 depot[131072];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %ctaid.x;
    mov.u64 %rd2, depot;
    st.local.u32 [%rd2], %r1;
    ld.local.u32 %r2, [%rd2];
    mul.wide.u32 %rd3, %r1, 4;
    add.u64 %rd4, %rd1, %rd3;
    st.global.u32 [%rd4], %r2;
    ret;
}
"#;

/// `CUDA_ERROR_ILLEGAL_ADDRESS`.
const ILLEGAL_ADDRESS: u32 = 700;
/// `CUDA_ERROR_INVALID_PTX`.
const INVALID_PTX: u32 = 218;

/// [`INTERPRETER_BOMBS`] with its chain: 100 blocks, each jumping to the one laid out before
/// it and reading `%big65535`, so liveness settles one block per pass.
fn interpreter_bombs() -> String {
    let mut chain = String::from("    bra.uni C99;\n");
    for i in 0..100 {
        chain += &format!("C{i}:\n    add.u64 %big65535, %big65535, 1;\n");
        chain += &if i == 0 {
            "    bra.uni CHAIN_END;\n".to_string()
        } else {
            format!("    bra.uni C{};\n", i - 1)
        };
    }
    chain += "CHAIN_END:";
    INTERPRETER_BOMBS.replace("CHAIN", &chain)
}

/// Loads [`interpreter_bombs`] and allocates a small output buffer: (module, buffer).
fn load_bombs(c: &mut TestClient<UnixStream>, ctx: u64) -> (u64, u64) {
    load_with_buffer(c, ctx, &interpreter_bombs())
}

/// Loads PTX `ptx` and allocates a small output buffer: (module, buffer).
fn load_with_buffer(c: &mut TestClient<UnixStream>, ctx: u64, ptx: &str) -> (u64, u64) {
    let module = c
        .call(&msg::ModuleLoad { ctx }, ptx.as_bytes())
        .unwrap()
        .0
        .handle;
    let out = c
        .call(&msg::MemAlloc { ctx, size: 4096 }, &[])
        .unwrap()
        .0
        .ptr;
    (module, out)
}

/// Launches kernel `name` of `module` with 64-bit `out` and, when given, a 32-bit second
/// parameter, on `blocks` blocks of `threads`; then synchronizes: the launch's result.
fn launch_and_sync(
    c: &mut TestClient<UnixStream>,
    ctx: u64,
    module: u64,
    name: &str,
    [blocks, threads]: [u32; 2],
    out: u64,
    second: Option<u32>,
) -> Result<(), (u32, String)> {
    let f = c
        .call(
            &msg::ModuleGetFunction {
                ctx,
                module,
                name: name.into(),
            },
            &[],
        )
        .unwrap()
        .0;
    let size = f
        .param_offsets
        .iter()
        .zip(&f.param_sizes)
        .map(|(o, s)| (o + s) as usize)
        .max()
        .unwrap_or(0);
    let mut params = vec![0u8; size];
    params[f.param_offsets[0] as usize..][..8].copy_from_slice(&out.to_le_bytes());
    if let Some(v) = second {
        params[f.param_offsets[1] as usize..][..4].copy_from_slice(&v.to_le_bytes());
    }
    c.post(
        &msg::LaunchKernel {
            ctx,
            stream: 0,
            function: f.function,
            grid_x: blocks,
            grid_y: 1,
            grid_z: 1,
            block_x: threads,
            block_y: 1,
            block_z: 1,
            shared_bytes: 0,
        },
        &params,
    )
    .unwrap();
    c.call(&msg::CtxSynchronize { ctx }, &[]).map(|_| ())
}

/// A VM whose kernels need more interpreter state than its `limits.interpreter_bytes`: each
/// launch gets `CUDA_ERROR_OUT_OF_MEMORY` (not sticky: the context goes on, and a smaller
/// launch runs), the refusals are counted for that VM only, and another VM runs the same
/// kernels at the same time.
#[test]
fn a_vm_past_its_interpreter_budget_is_refused_and_another_vm_runs() {
    /// Refused launches of the attacker.
    const ATTEMPTS: usize = 8;
    let mut d = two_vms_with_limits("interpreter_bytes = \"64MiB\"\n");
    let (mut a, actx) = session(&d, "small");
    let (amod, aout) = load_bombs(&mut a, actx);
    let other = std::thread::scope(|s| {
        // The other VM runs 128 MiB blocks (within its default budget) meanwhile.
        let other = s.spawn(|| {
            let (mut o, octx) = session(&d, "other");
            let (omod, oout) = load_bombs(&mut o, octx);
            let mut ran = 0;
            for _ in 0..ATTEMPTS {
                launch_and_sync(&mut o, octx, omod, "heavy", [4, 1024], oout, None)
                    .unwrap_or_else(|e| panic!("the other VM's launch failed: {e:?}"));
                ran += 1;
            }
            let (_, v) = o
                .call(
                    &msg::MemcpyDtoH {
                        ctx: octx,
                        stream: 0,
                        src: oout,
                        len: 16,
                    },
                    &[],
                )
                .unwrap();
            (ran, v)
        });
        for i in 0..ATTEMPTS {
            let (code, why) = launch_and_sync(&mut a, actx, amod, "heavy", [4, 1024], aout, None)
                .expect_err("a 128 MiB block ran on a 64 MiB budget");
            assert_eq!(code, OUT_OF_MEMORY, "attempt {i}: {why}");
            assert!(why.contains("interpreter budget"), "{why}");
        }
        other.join().unwrap()
    });
    assert_eq!(other.0, ATTEMPTS);
    assert_eq!(other.1, [0u32, 1, 2, 3].map(u32::to_le_bytes).concat());
    // Not sticky: 256 threads × 128 KiB (32 MiB) fit the attacker's budget, in the same context.
    launch_and_sync(&mut a, actx, amod, "heavy", [2, 256], aout, None).unwrap();
    let budget = |vm: &str| d.vm(vm)["limits"]["interpreter_bytes"].clone();
    let small = budget("small");
    assert_eq!(small["limit"].as_u64(), Some(64 * MIB), "{small}");
    assert!(
        small["refused"].as_u64() >= Some(ATTEMPTS as u64),
        "{small}"
    );
    assert_eq!(small["used"].as_u64(), Some(0), "{small}");
    assert_eq!(budget("other")["refused"].as_u64(), Some(0));
    assert_eq!(budget("other")["used"].as_u64(), Some(0));
    survived(&mut d, "other");
}

/// A kernel that recurses 60 calls deep through a function with 16 MiB of registers per warp
/// (32 warps: 30 GiB if every frame were kept) faults as a stack overflow
/// (`CUDA_ERROR_ILLEGAL_ADDRESS`, sticky for that context only) within the block's frame
/// limit; vgpud's memory stays bounded, and another VM is served.
#[test]
fn deep_recursion_with_large_frames_fails_cleanly() {
    /// Growth allowed: one block's frames (128 MiB) and allocator noise.
    const SLACK: u64 = 192 * MIB;
    let mut d = start_limited(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)]);
    let (mut c, ctx) = session(&d, "vm1");
    let (module, out) = load_bombs(&mut c, ctx);
    let before = rss_of(d.pid());
    let start = Instant::now();
    let (code, why) = launch_and_sync(&mut c, ctx, module, "deep", [1, 1024], out, Some(60))
        .expect_err("the recursion finished");
    let after = rss_of(d.pid());
    println!(
        "deep recursion refused in {:?}; vgpud RSS {} -> {} MiB",
        start.elapsed(),
        before / MIB,
        after / MIB
    );
    assert_eq!(code, ILLEGAL_ADDRESS, "{why}");
    assert!(why.contains("call stack overflow"), "{why}");
    assert!(
        after <= before + SLACK,
        "vgpud grew from {} to {} MiB",
        before / MIB,
        after / MIB
    );
    assert_eq!(
        d.vm("vm1")["limits"]["interpreter_bytes"]["used"].as_u64(),
        Some(0)
    );
    // A shallow recursion runs in a fresh session of the same VM.
    let (mut c2, ctx2) = session(&d, "vm1");
    let (module2, out2) = load_bombs(&mut c2, ctx2);
    launch_and_sync(&mut c2, ctx2, module2, "deep", [1, 32], out2, Some(3)).unwrap();
    let (_, v) = c2
        .call(
            &msg::MemcpyDtoH {
                ctx: ctx2,
                stream: 0,
                src: out2,
                len: 4,
            },
            &[],
        )
        .unwrap();
    assert_eq!(v, 3u32.to_le_bytes());
    survived(&mut d, "vm2");
}

/// PTX of `n` trivial kernels: a module the loader needs seconds for (each kernel's
/// reachability walks every function), in under 1 MiB.
fn slow_module(n: usize) -> Vec<u8> {
    let mut s = String::from(".version 7.0\n.target sm_52\n.address_size 64\n");
    for i in 0..n {
        s.push_str(&format!(".visible .entry k{i}()\n{{\n ret;\n}}\n"));
    }
    s.into_bytes()
}

/// A module that takes seconds to load: on a device whose watchdog is 50 ms the load is cut
/// at the deadline with `CUDA_ERROR_INVALID_PTX` (sooner than the same load takes where the
/// watchdog is long), and the session answers at once afterwards; a guest that disconnects
/// mid-load has its load stopped and its session ended before the load would have finished.
#[test]
fn slow_module_loads_are_cut_by_the_watchdog_and_stop_when_the_guest_leaves() {
    /// Kernels of the slow module.
    const KERNELS: usize = 10_000;
    let mut d = Vgpud::start_config_limited(
        r#"
[admin]
socket = "@DIR@/admin.sock"

[[device]]
name = "quick"
kind = "sim"
memory = "256MiB"
watchdog_ms = 50

[[device]]
name = "patient"
kind = "sim"
memory = "256MiB"
watchdog_ms = 600000

[[vm]]
name = "cut"
device = "quick"
memory = "64MiB"
unix_socket = "@DIR@/cut.sock"

[[vm]]
name = "full"
device = "patient"
memory = "64MiB"
unix_socket = "@DIR@/full.sock"
"#,
        DATA_LIMIT,
    );
    let image = slow_module(KERNELS);
    // The whole load, where the watchdog allows it.
    let (mut f, fctx) = session(&d, "full");
    let start = Instant::now();
    f.call(&msg::ModuleLoad { ctx: fctx }, &image)
        .expect("the module is valid");
    let full = start.elapsed();
    // The same load under a 50 ms watchdog.
    let (mut c, ctx) = session(&d, "cut");
    let start = Instant::now();
    let (code, why) = c
        .call(&msg::ModuleLoad { ctx }, &image)
        .expect_err("the load outlived the watchdog");
    let cut = start.elapsed();
    println!("module of {KERNELS} kernels: loaded in {full:?}; cut after {cut:?}");
    assert_eq!(code, INVALID_PTX, "{why}");
    assert!(why.contains("watchdog (50 ms)"), "{why}");
    assert!(cut < full, "cut after {cut:?}, a full load takes {full:?}");
    // The stopped load is counted for its VM, in the API and in Prometheus; the full load is
    // not counted for the other.
    let stopped = |vm: &str| {
        let api = d.vm(vm)["stats"]["module_loads_stopped"].as_u64();
        let prom = d.vm_metric("vgpu_vm_module_loads_stopped_total", vm);
        assert_eq!(
            api.map(|n| n as f64),
            prom,
            "{vm}: the API and Prometheus differ"
        );
        api.unwrap_or_else(|| panic!("{vm}: no module_loads_stopped"))
    };
    assert_eq!((stopped("cut"), stopped("full")), (1, 0));
    // The session answers, and a small module loads.
    c.call(&msg::MemAlloc { ctx, size: 4096 }, &[]).unwrap();
    assert_eq!(d.vm("cut")["limits"]["modules"]["used"].as_u64(), Some(0));
    const SMALL: &str =
        ".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry k()\n{\n    ret;\n}\n";
    c.call(&msg::ModuleLoad { ctx }, SMALL.as_bytes()).unwrap();
    // A guest that sends the load and leaves: its session ends well before the load would.
    let (mut g, gctx) = session(&d, "full");
    let sessions = || d.vm("full")["sessions"].as_array().map_or(0, Vec::len);
    assert_eq!(sessions(), 2);
    g.send_only(&msg::ModuleLoad { ctx: gctx }, &image).unwrap();
    let start = Instant::now();
    drop(g);
    while sessions() > 1 {
        assert!(
            start.elapsed() < full,
            "the departed guest's session still loads after {:?}\n{}",
            start.elapsed(),
            d.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    println!(
        "a departed guest's load stopped within {:?}",
        start.elapsed()
    );
    // A load cancelled because its guest left is not a deadline stop.
    assert_eq!(stopped("full"), 0);
    survived(&mut d, "full");
}

// ---------------------------------------------------------------------------
// Oversized guest strings
// ---------------------------------------------------------------------------

/// Private memory vgpud may map in [`oversized_guest_strings_cost_vgpud_no_memory_or_disk`]:
/// the daemon idle (13 MiB), [`NAMED_SESSIONS`] session threads at 3 MiB with a frame buffer
/// each (at most a frame, 8 MiB), the other VM's run of the C program (its 64 MiB slice and a
/// session) and room to spare. The strings the attacker sends add up to more
/// ([`ATTACK_BYTES`]): a vgpud that kept them would abort here.
const STRINGS_DATA_LIMIT: u64 = 512 * MIB;
/// Characters of each oversized string: half the largest frame.
const HUGE_STRING: usize = 4 << 20;
/// Hellos with a wrong protocol version and a [`HUGE_STRING`] shim version, each on its own
/// connection, one after another.
const REFUSED_HELLOS: usize = 144;
/// Sessions opened at once with a [`HUGE_STRING`] process name, held until the end.
const NAMED_SESSIONS: usize = 16;
/// What the attacker sends in strings in all.
const ATTACK_BYTES: u64 = ((REFUSED_HELLOS + NAMED_SESSIONS) * HUGE_STRING) as u64;
/// Disk the attack may cost in vgpud's log and audit log together: the issue's attack grew
/// the audit log by 160 MiB.
const DISK_ALLOWED: u64 = MIB;

/// Bytes of the files in `dir` whose names start with `prefix` (a log and its rotations).
fn bytes_of_files(dir: &std::path::Path, prefix: &str) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// The issue's oversized-string attack and more, with the audit log on: Hellos of a wrong
/// protocol version with a 4 MiB shim version, then sessions with 4 MiB process names. Each
/// Hello is refused with `CUDA_ERROR_SYSTEM_DRIVER_MISMATCH` and a short message, each process
/// name is kept cut, vgpud's memory stays under a limit smaller than what was sent, its log and
/// audit log grow by well under 1 MiB, and the other VM is served.
#[test]
fn oversized_guest_strings_cost_vgpud_no_memory_or_disk() {
    /// `CUDA_ERROR_SYSTEM_DRIVER_MISMATCH`.
    const DRIVER_MISMATCH: u32 = 803;
    /// Longest refusal message allowed: vgpud's text and a cut shim version.
    const MESSAGE_MAX: usize = 512;
    /// Longest process name as the admin API shows it (256 characters, escapes aside).
    const PROCESS_SHOWN_MAX: usize = 1024;
    const { assert!(ATTACK_BYTES > STRINGS_DATA_LIMIT) };
    let mut d = Vgpud::start_config_limited(
        r#"
[admin]
socket = "@DIR@/admin.sock"
audit_log = "@DIR@/audit.jsonl"

[[device]]
name = "gpu0"
kind = "sim"
memory = "1GiB"

[[vm]]
name = "vm1"
memory = "64MiB"
unix_socket = "@DIR@/vm1.sock"

[[vm]]
name = "vm2"
memory = "64MiB"
unix_socket = "@DIR@/vm2.sock"
"#,
        STRINGS_DATA_LIMIT,
    );
    let disk_before = bytes_of_files(d.dir(), "audit.jsonl") + bytes_of_files(d.dir(), "vgpud.log");
    // A string with a control character early, as a log-forging attacker would send.
    let huge = format!("1.0\n{}", "v".repeat(HUGE_STRING - 4));
    for i in 0..REFUSED_HELLOS {
        let mut c = TestClient::new(UnixStream::connect(d.socket("vm1")).unwrap());
        let (code, why) = c
            .call(
                &msg::Hello {
                    protocol_version: vgpu_proto::PROTOCOL_VERSION + 1,
                    pid: 1,
                    shim_version: huge.clone(),
                    process_name: "attacker".into(),
                },
                &[],
            )
            .expect_err("a Hello of another protocol was accepted");
        assert_eq!(code, DRIVER_MISMATCH, "Hello {i}: {why}");
        assert!(why.len() < MESSAGE_MAX, "Hello {i}: {} bytes", why.len());
        assert!(!why.contains('\n'), "Hello {i}: {why}");
    }
    let mut named: Vec<_> = (0..NAMED_SESSIONS)
        .map(|i| {
            let mut c = TestClient::new(UnixStream::connect(d.socket("vm1")).unwrap());
            c.call(
                &msg::Hello {
                    protocol_version: vgpu_proto::PROTOCOL_VERSION,
                    pid: i as u32,
                    shim_version: vgpu_proto::VERSION.into(),
                    process_name: huge.clone(),
                },
                &[],
            )
            .unwrap_or_else(|e| panic!("session {i}: {e:?}"));
            c
        })
        .collect();
    let sessions = d.vm("vm1")["sessions"].as_array().unwrap().clone();
    assert_eq!(sessions.len(), NAMED_SESSIONS);
    for s in &sessions {
        let name = s["process"].as_str().unwrap();
        assert!(name.len() <= PROCESS_SHOWN_MAX, "{} bytes", name.len());
        assert!(name.starts_with("1.0\\nvvv"), "{name:.80}");
    }
    // The sessions work; then they end.
    for c in &mut named {
        c.call(
            &msg::CtxCreate {
                device: 0,
                flags: 0,
            },
            &[],
        )
        .unwrap();
    }
    drop(named);
    let start = Instant::now();
    while !d.vm("vm1")["sessions"].as_array().unwrap().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "sessions did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The audit log has every refusal and session, each cut.
    let audit = std::fs::read_to_string(d.dir().join("audit.jsonl")).unwrap();
    let count = |event: &str| audit.matches(&format!("\"event\":\"{event}\"")).count();
    assert!(count("session.refused") > 0, "{audit:.2000}");
    assert_eq!(count("session.open"), NAMED_SESSIONS, "{audit:.2000}");
    let disk =
        bytes_of_files(d.dir(), "audit.jsonl") + bytes_of_files(d.dir(), "vgpud.log") - disk_before;
    println!(
        "{} MiB of guest strings sent; vgpud's log and audit log grew by {} KiB",
        ATTACK_BYTES / MIB,
        disk / 1024
    );
    assert!(disk < DISK_ALLOWED, "the logs grew by {disk} bytes");
    survived_under(&mut d, "vm2", STRINGS_DATA_LIMIT);
}

/// A graph's host copy gates (`StreamHostCopy`): sizes are bounded, ranges must lie in the
/// process's own allocations, and neither another process's nor another VM's session can write
/// through a gate it did not make, or write more than the gate's length.
#[test]
fn host_copy_gates_are_bounded_and_reach_only_their_own_memory() {
    let d = two_vms_with_limits("");
    let (mut c, ctx) = session(&d, "small");
    let (mut other_proc, octx) = session(&d, "small");
    let (mut other_vm, _) = session(&d, "other");
    let (mut waiter, _) = session(&d, "small");
    let p = c
        .call(&msg::MemAlloc { ctx, size: 4096 }, &[])
        .unwrap()
        .0
        .ptr;
    let q = other_proc
        .call(
            &msg::MemAlloc {
                ctx: octx,
                size: 4096,
            },
            &[],
        )
        .unwrap()
        .0
        .ptr;
    let gate = |dev: u64, len: u64, to_device: u32, lo: u64| msg::StreamHostCopy {
        ctx,
        stream: 0,
        token_hi: 0xC0B1,
        token_lo: lo,
        dev,
        len,
        to_device,
    };
    let refused = [
        ("no bytes", gate(p, 0, 1, 1)),
        (
            "past a bulk chunk",
            gate(p, (MAX_BULK_CHUNK + 1) as u64, 1, 2),
        ),
        ("past the allocation", gate(p + 4000, 200, 1, 3)),
        ("another process's allocation", gate(q, 8, 1, 4)),
        ("an unknown direction", gate(p, 8, 2, 5)),
        ("a wrapping range", gate(u64::MAX - 4, 8, 0, 6)),
    ];
    for (what, m) in refused {
        let e = c.call(&m, &[]).unwrap_err();
        assert_ne!(e.0, 0, "{what}");
    }
    // A real gate: 8 bytes to p.
    c.call(&gate(p, 8, 1, 7), &[]).unwrap();
    let token = |lo| msg::HostFuncDoneWrite {
        token_hi: 0xC0B1,
        token_lo: lo,
    };
    assert!(
        other_vm.call(&token(7), &[1; 8]).is_err(),
        "another VM cannot name it"
    );
    // Reached at once (the stream is idle).
    let reached = waiter
        .call(
            &msg::HostFuncWait {
                token_hi: 0xC0B1,
                token_lo: 7,
                timeout_ms: 5000,
            },
            &[],
        )
        .unwrap()
        .0
        .value;
    assert_eq!(reached, 1);
    assert!(
        waiter.call(&token(7), &[1; 9]).is_err(),
        "one byte too many"
    );
    assert!(waiter.call(&token(7), &[1; 4]).is_err(), "too few");
    assert!(
        waiter.call(&token(6), &[1; 8]).is_err(),
        "a refused gate's token names nothing"
    );
    waiter.call(&token(7), &[0xAB; 8]).unwrap();
    c.call(&msg::CtxSynchronize { ctx }, &[]).unwrap();
    let (_, v) = c
        .call(
            &msg::MemcpyDtoH {
                ctx,
                stream: 0,
                src: p,
                len: 8,
            },
            &[],
        )
        .unwrap();
    assert_eq!(v, vec![0xAB; 8]);
    driver_api_works(&d, "other");
}

/// A hostile module for the device heap and dynamic parallelism, written against the device
/// runtime's own calls: `hog` mallocs 1 MiB blocks until the heap answers `NULL` and counts
/// them, then frees a pointer malloc never returned; `bomb` has each of its two threads launch
/// two more copies of itself.
const DEVICE_RUNTIME_BOMBS: &str = r#"
.version 7.0
.target sm_52
.address_size 64
.extern .func (.param .b64 r) malloc(.param .b64 n);
.extern .func free(.param .b64 p);
.extern .func (.param .b64 r) cnpGetParameterBufferV2(.param .b64 f, .param .align 4 .b8 g[12], .param .align 4 .b8 b[12], .param .b32 s);
.extern .func (.param .b32 r) cnpLaunchDeviceV2(.param .b64 buf, .param .b64 stream);
.extern .func (.param .b32 r) cudaDeviceSynchronize();

.visible .entry hog(.param .u64 out)
{
    .reg .b64 %rd<4>;
    .reg .b32 %r<2>;
    .reg .pred %p1;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, 0;
AGAIN:
    {
    .param .b64 n;
    .param .b64 rv;
    mov.u64 %rd2, 1048576;
    st.param.b64 [n], %rd2;
    call.uni (rv), malloc, (n);
    ld.param.b64 %rd3, [rv];
    }
    setp.eq.u64 %p1, %rd3, 0;
    @%p1 bra FULL;
    add.u32 %r1, %r1, 1;
    bra.uni AGAIN;
FULL:
    st.global.u32 [%rd1], %r1;
    {
    .param .b64 p;
    st.param.b64 [p], %rd1;
    call.uni free, (p);
    }
    ret;
}

.visible .entry bomb(.param .u64 out)
{
    .reg .b64 %rd<4>;
    .reg .b32 %r<4>;
    .reg .pred %p1;
    ld.param.u64 %rd1, [out];
    atom.global.add.u32 %r1, [%rd1], 1;
    mov.u64 %rd2, bomb;
    mov.u32 %r2, 1;
    mov.u32 %r3, 2;
    {
    .param .b64 f;
    .param .align 4 .b8 g[12];
    .param .align 4 .b8 b[12];
    .param .b32 s;
    .param .b64 rv;
    st.param.b64 [f], %rd2;
    st.param.b32 [g], %r2;
    st.param.b32 [g+4], %r2;
    st.param.b32 [g+8], %r2;
    st.param.b32 [b], %r3;
    st.param.b32 [b+4], %r2;
    st.param.b32 [b+8], %r2;
    st.param.b32 [s], 0;
    call.uni (rv), cnpGetParameterBufferV2, (f, g, b, s);
    ld.param.b64 %rd3, [rv];
    }
    setp.eq.u64 %p1, %rd3, 0;
    @%p1 bra DONE;
    st.u64 [%rd3], %rd1;
    {
    .param .b64 a;
    .param .b64 q;
    .param .b32 rv2;
    st.param.b64 [a], %rd3;
    mov.u64 %rd2, 0;
    st.param.b64 [q], %rd2;
    call.uni (rv2), cnpLaunchDeviceV2, (a, q);
    ld.param.b32 %r3, [rv2];
    }
DONE:
    ret;
}
"#;

/// `DEVICE_RUNTIME_BOMBS` with `wait_bomb`: `bomb` whose threads then wait for the copies they
/// launched with CUDA 11's device-side `cudaDeviceSynchronize`; with the sync depth at its 24
/// levels, a tree of 2^24 waiting grids.
fn wait_bomb_ptx() -> String {
    let bomb = &DEVICE_RUNTIME_BOMBS[DEVICE_RUNTIME_BOMBS
        .find(".visible .entry bomb")
        .expect("the bomb kernel")..];
    let waiting = bomb.replace("bomb", "wait_bomb").replace(
        "DONE:",
        "{\n    .param .b32 rv3;\n    call.uni (rv3), cudaDeviceSynchronize, ();\n    }\nDONE:",
    );
    format!("{DEVICE_RUNTIME_BOMBS}\n{waiting}")
}

/// A hostile VM whose kernels wait for kernels they launch, as deep as CUDA lets them (a tree of
/// 2^24 grids, each level waiting on a thread of its own in vgpud): the watchdog ends the launch
/// in its own context, vgpud's threads and memory come back to where they were, and another VM
/// is served.
#[test]
fn a_tree_of_waiting_kernels_ends_at_the_watchdog() {
    const SLACK: u64 = 192 * MIB;
    let vms = [TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)];
    let mut d =
        Vgpud::start_config_limited(&Vgpud::config_for(&vms, "watchdog_ms = 2000"), DATA_LIMIT);
    let (mut c, ctx) = session(&d, "vm1");
    let (before, threads_before) = (rss_of(d.pid()), threads_of(d.pid()));
    // CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH: every level may wait.
    c.call(
        &msg::CtxSetLimit {
            ctx,
            limit: 3,
            value: 24,
        },
        &[],
    )
    .unwrap();
    let (module, out) = load_with_buffer(&mut c, ctx, &wait_bomb_ptx());
    let start = Instant::now();
    let (code, why) = launch_and_sync(&mut c, ctx, module, "wait_bomb", [1, 2], out, None)
        .expect_err("2^24 grids finished");
    assert_eq!(code, 702, "CUDA_ERROR_LAUNCH_TIMEOUT: {why}");
    let took = start.elapsed();
    let (threads_after, after) = (threads_of(d.pid()), rss_of(d.pid()));
    println!(
        "wait bomb: ended after {took:?}; vgpud RSS {} -> {} MiB, threads {threads_before} -> {threads_after}",
        before / MIB,
        after / MIB
    );
    assert!(took < Duration::from_secs(20), "the watchdog took {took:?}");
    assert!(
        after <= before + SLACK,
        "vgpud grew from {} to {} MiB",
        before / MIB,
        after / MIB
    );
    drop(c);
    d.wait_memory_used("vm1", 0, Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(10);
    while threads_of(d.pid()) > threads_before + 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        threads_of(d.pid()) <= threads_before + 2,
        "the waiting levels' threads are gone: {} against {threads_before}",
        threads_of(d.pid())
    );
    survived(&mut d, "vm2");
}

/// A hostile VM against the device heap and dynamic parallelism: a heap past its slice is
/// refused; a kernel that mallocs until the heap is full gets `NULL` at the heap's end (the heap
/// charged to the slice, not more), and freeing a forged pointer faults its own context
/// (`CUDA_ERROR_ILLEGAL_ADDRESS`); a kernel whose threads each launch two copies of itself (a
/// tree of 2^24 grids, run depth first) ends at the watchdog; vgpud's memory stays bounded, the
/// slice comes back whole when the sessions end, and another VM is served.
#[test]
fn device_heap_and_launch_bombs_stay_in_their_vm() {
    /// Growth allowed: the heap (48 MiB) and interpreter state.
    const SLACK: u64 = 192 * MIB;
    let vms = [TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)];
    let mut d =
        Vgpud::start_config_limited(&Vgpud::config_for(&vms, "watchdog_ms = 3000"), DATA_LIMIT);
    let (mut c, ctx) = session(&d, "vm1");
    let before = rss_of(d.pid());
    let set = |c: &mut TestClient<UnixStream>, value| {
        c.call(
            &msg::CtxSetLimit {
                ctx,
                limit: 2,
                value,
            },
            &[],
        )
        .map(|_| ())
    };
    assert_eq!(set(&mut c, 1 << 40).unwrap_err().0, OUT_OF_MEMORY);
    set(&mut c, 48 * MIB).unwrap();
    let (module, out) = load_with_buffer(&mut c, ctx, DEVICE_RUNTIME_BOMBS);
    let (code, why) = launch_and_sync(&mut c, ctx, module, "hog", [1, 1], out, None)
        .expect_err("a forged free went through");
    assert_eq!(code, ILLEGAL_ADDRESS, "{why}");
    assert!(why.contains("free("), "{why}");
    let used = d.vm("vm1")["memory_used"].as_u64().unwrap_or(0);
    assert!(
        (48 * MIB..=50 * MIB).contains(&used),
        "the heap and the buffer are charged, nothing else: {used}"
    );
    drop(c);
    d.wait_memory_used("vm1", 0, Duration::from_secs(10));

    let (mut c, ctx) = session(&d, "vm1");
    let (module, out) = load_with_buffer(&mut c, ctx, DEVICE_RUNTIME_BOMBS);
    let start = Instant::now();
    let (code, why) = launch_and_sync(&mut c, ctx, module, "bomb", [1, 2], out, None)
        .expect_err("2^24 grids finished");
    assert_eq!(code, 702, "ends at the watchdog: {why}");
    // The context is lost with the timeout (CUDA's sticky error): the grids' count cannot be
    // read back; the time says the tree ran until the watchdog.
    let after = rss_of(d.pid());
    println!(
        "launch bomb: ended after {:?}; vgpud RSS {} -> {} MiB",
        start.elapsed(),
        before / MIB,
        after / MIB
    );
    assert!(
        after <= before + SLACK,
        "vgpud grew from {} to {} MiB",
        before / MIB,
        after / MIB
    );
    drop(c);
    d.wait_memory_used("vm1", 0, Duration::from_secs(10));
    survived(&mut d, "vm2");
}

/// Sends `image` as `ModuleLoadPart`s of `part` bytes: the last reply's handle, or the first
/// refusal.
fn load_in_parts(
    c: &mut TestClient<UnixStream>,
    ctx: u64,
    image: &[u8],
    part: usize,
) -> Result<u64, (u32, String)> {
    let total = image.len() as u64;
    let mut handle = 0;
    for (i, p) in image.chunks(part).enumerate() {
        let offset = (i * part) as u64;
        handle = c
            .call(&msg::ModuleLoadPart { ctx, total, offset }, p)?
            .0
            .handle;
    }
    Ok(handle)
}

/// Module images larger than one request arrive in parts (CuPy's Thrust module is 8.9 MB):
/// a whole image loads and its kernels are found; a part out of order or past the declared
/// size is `CUDA_ERROR_INVALID_VALUE` and drops the image; a declared size past the VM's
/// `limits.module_bytes` is refused before any byte is held; an image abandoned halfway (a
/// new one started, or the process gone) returns its charge; another VM is served.
#[test]
fn module_images_in_parts_are_checked_and_charged_from_their_first_part() {
    /// `CUDA_ERROR_INVALID_VALUE`.
    const INVALID_VALUE: u32 = 1;
    /// Parts smaller than a request's limit, so that the image stays small.
    const PART: usize = 256 << 10;
    let mut d = two_vms_with_limits("module_bytes = \"3MiB\"\n");
    let (mut c, ctx) = session(&d, "small");
    // A 1.25 MiB image: a kernel and a long comment.
    let mut ptx = String::from(
        ".version 7.0\n.target sm_52\n.address_size 64\n\
         .visible .entry k(.param .u64 out)\n{\n.reg .b64 %rd<2>;\n.reg .b32 %r<2>;\n\
         ld.param.u64 %rd1, [out];\ncvta.to.global.u64 %rd1, %rd1;\n\
         mov.u32 %r1, 42;\nst.global.u32 [%rd1], %r1;\nret;\n}\n",
    );
    let line = format!("// {}\n", "x".repeat(1021));
    while ptx.len() < 5 * PART {
        ptx.push_str(&line);
    }
    let image = ptx.as_bytes();
    let module_bytes = |d: &Vgpud| d.vm("small")["limits"]["module_bytes"]["used"].as_u64();
    let m = load_in_parts(&mut c, ctx, image, PART).expect("an image in parts");
    assert_ne!(m, 0);
    assert_eq!(module_bytes(&d), Some(image.len() as u64));
    c.call(
        &msg::ModuleGetFunction {
            ctx,
            module: m,
            name: "k".into(),
        },
        &[],
    )
    .expect("the kernel of an image sent in parts");
    c.call(&msg::ModuleUnload { ctx, module: m }, &[]).unwrap();
    assert_eq!(module_bytes(&d), Some(0));

    let total = image.len() as u64;
    let part = |c: &mut TestClient<UnixStream>, offset: u64, bytes: &[u8]| {
        c.call(&msg::ModuleLoadPart { ctx, total, offset }, bytes)
            .map(|r| r.0.handle)
    };
    // Out of order: a part skipped, a part repeated, a part starting nowhere.
    for (first, second) in [(0, 2 * PART), (0, PART / 2)] {
        assert_eq!(part(&mut c, first, &image[..PART]), Ok(0));
        let e = part(&mut c, second as u64, &image[..PART]).unwrap_err();
        assert_eq!(e.0, INVALID_VALUE, "{e:?}");
        assert!(e.1.contains("in order"), "{e:?}");
        // The image was dropped: its next part has nothing to follow.
        let e = part(&mut c, PART as u64, &image[PART..2 * PART]).unwrap_err();
        assert_eq!(e.0, INVALID_VALUE, "{e:?}");
        assert_eq!(module_bytes(&d), Some(0));
    }
    // Past the declared size.
    let e = c
        .call(
            &msg::ModuleLoadPart {
                ctx,
                total: 16,
                offset: 0,
            },
            &image[..32],
        )
        .unwrap_err();
    assert_eq!(e.0, INVALID_VALUE, "{e:?}");
    assert_eq!(module_bytes(&d), Some(0));
    // Past the VM's budget, refused at the first part.
    for total in [(3 << 20) + 1, u64::MAX] {
        let e = c
            .call(
                &msg::ModuleLoadPart {
                    ctx,
                    total,
                    offset: 0,
                },
                &image[..PART],
            )
            .unwrap_err();
        assert_eq!(e.0, OUT_OF_MEMORY, "{e:?}");
        assert!(e.1.contains("limits.module_bytes"), "{e:?}");
    }
    // Abandoned: a new image starts, then the process leaves halfway.
    assert_eq!(part(&mut c, 0, &image[..PART]), Ok(0));
    assert_eq!(module_bytes(&d), Some(total));
    assert_eq!(part(&mut c, 0, &image[..PART]), Ok(0));
    assert_eq!(module_bytes(&d), Some(total));
    drop(c);
    wait_returned(&d, "small", "module_bytes");
    wait_returned(&d, "small", "modules");
    // Two images fit the 3 MiB budget, a third does not.
    let (mut c, ctx) = session(&d, "small");
    load_in_parts(&mut c, ctx, image, PART).unwrap();
    load_in_parts(&mut c, ctx, image, PART).unwrap();
    let e = load_in_parts(&mut c, ctx, image, PART).unwrap_err();
    assert_eq!(e.0, OUT_OF_MEMORY, "{e:?}");
    survived(&mut d, "other");
}
