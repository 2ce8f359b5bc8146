//! The virtio-vgpu device driven in-process: vgpud's daemon (broker, simulated GPU, the device
//! on a vhost-user socket) and an in-process vhost-user frontend playing QEMU and the guest's
//! `vgpu` module (`vgpu_vmm_testutils::vgpu`): real virtqueues in shared memfd memory,
//! request chains in indirect tables, bulk data as scatter-gather lists of 4 KiB pages spread over
//! guest memory.
//!
//! Checked: large transfers byte for byte in both directions, kernels launched with parameters
//! and a module image carried as bulk data, the slice and isolation of two VMs, sessions that end
//! (close, reboot, VMM gone, protocol violation) releasing their memory, and hostile descriptor
//! chains that leave vgpud serving.

use std::path::Path;
use std::time::{Duration, Instant};

use vgpu_config::Config;
use vgpu_proto::cuda;
use vgpu_proto::frame::{FLAG_ASYNC, HEADER_LEN, Header};
use vgpu_proto::msg::{self, Message, Op};
use vgpu_vhost_vgpu::wire::{
    self, CTRL_QUEUE, REQ_CALL, ReqHeader, S_BAD_REQUEST, S_NO_SESSION, S_PROTOCOL, SUBMIT_QUEUE,
};
use vgpu_vmm_testutils::vgpu::{
    Batch, DEFAULT_TIMEOUT, DevError, DevGuest, DevGuestOptions, DevSession, GuestBuf, Request,
};
use vgpud::Daemon;

const MIB: u64 = 1 << 20;
/// A raw chain: (guest address, length, device-writable) per descriptor.
type RawChain = Vec<(u64, u32, bool)>;
const WAIT: Duration = Duration::from_secs(20);
/// Bytes per request a guest driver with 1024-entry rings moves: what the module reports as
/// `max_transfer` (1024 descriptors less 20 reserved and one for misalignment, in 4 KiB pages,
/// rounded down to 64 KiB).
const CHUNK: usize = 4_063_232;

struct Host {
    daemon: Daemon,
    dir: tempfile::TempDir,
}

impl Host {
    /// A daemon with a 2 GiB simulated GPU and one virtio-vgpu VM per `(name, slice MiB)`.
    fn start(vms: &[(&str, u64)]) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let mut text = format!(
            "[admin]\naudit_log = \"{}\"\n\n[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"2GiB\"\nworkers = 2\n",
            dir.path().join("audit.jsonl").display()
        );
        for (name, mib) in vms {
            text += &format!(
                "\n[[vm]]\nname = \"{name}\"\nmemory = \"{mib}MiB\"\nvhost_user_socket = \"{}\"\ndevice_model = \"vgpu\"\n",
                dir.path().join(format!("{name}.sock")).display()
            );
        }
        let config = Config::parse(Path::new("vgpud.toml"), &text).unwrap();
        let daemon = Daemon::start(&config).unwrap();
        Host { daemon, dir }
    }

    fn guest(&self, vm: &str, memory: u64) -> DevGuest {
        let opts = DevGuestOptions {
            queue_size: 1024,
            memory,
            ..Default::default()
        };
        DevGuest::start(&self.dir.path().join(format!("{vm}.sock")), opts).unwrap()
    }

    fn used(&self, vm: &str) -> u64 {
        self.daemon.broker().tenant(vm).unwrap().slice.used()
    }

    fn wait_used(&self, vm: &str, want: u64) {
        let deadline = Instant::now() + WAIT;
        while self.used(vm) != want {
            assert!(
                Instant::now() < deadline,
                "VM {vm} still uses {} bytes, expected {want}",
                self.used(vm)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The audit log's records of `event`.
    fn audit(&self, event: &str) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["event"] == event)
            .collect()
    }

    fn stats(&self, vm: &str) -> vgpu_vhost_vgpu::VgpuDevStatsSnapshot {
        self.daemon.runtime().vgpu_dev_of(vm).unwrap().1
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A session past its handshake, with a context.
fn session(g: &DevGuest, id: u32) -> (DevSession, u64) {
    let mut s = DevSession::open(g, id).unwrap();
    let hello = s.hello("vgpu-dev-test").unwrap();
    assert_eq!(hello.protocol_version, vgpu_proto::PROTOCOL_VERSION);
    let ctx = s.ctx_create().unwrap();
    (s, ctx)
}

fn alloc(s: &mut DevSession, ctx: u64, size: u64) -> Result<u64, DevError> {
    s.call(&msg::MemAlloc { ctx, size }, &[]).map(|r| r.ptr)
}

/// Copies `buf` to device memory at `dst`, chunk by chunk, straight from its pages.
fn htod(s: &mut DevSession, ctx: u64, dst: u64, buf: &GuestBuf) {
    let mut off = 0;
    while off < buf.len {
        let n = CHUNK.min(buf.len - off);
        s.call_sg(
            &msg::MemcpyHtoD {
                ctx,
                stream: 0,
                dst: dst + off as u64,
            },
            &buf.segments(off, n),
            &[],
        )
        .unwrap();
        off += n;
    }
}

/// Copies device memory at `src` into `buf`, chunk by chunk, straight into its pages.
fn dtoh(s: &mut DevSession, ctx: u64, src: u64, buf: &GuestBuf) {
    let mut off = 0;
    while off < buf.len {
        let n = CHUNK.min(buf.len - off);
        let (_, resp) = s
            .call_sg(
                &msg::MemcpyDtoH {
                    ctx,
                    stream: 0,
                    src: src + off as u64,
                    len: n as u64,
                },
                &[],
                &buf.segments(off, n),
            )
            .unwrap();
        assert_eq!(resp.data_len, n as u64);
        off += n;
    }
}

#[test]
fn the_config_space_reports_version_slice_and_name() {
    let h = Host::start(&[("vm1", 192)]);
    let g = h.guest("vm1", 32 * MIB);
    let c = g.config().unwrap();
    assert_eq!(c.device_version, wire::DEVICE_VERSION);
    assert_eq!(c.protocol_version, vgpu_proto::PROTOCOL_VERSION);
    assert_eq!(c.slice_size, 192 * MIB);
    assert_eq!(c.name, "vgpu Simulated GPU");
    assert_eq!(c.max_segments, wire::MAX_SEGMENTS as u32);
    // A live resize shows at the next read.
    h.daemon
        .broker()
        .update_vm(
            "vm1",
            &vgpu_broker::VmUpdate {
                memory: Some(96 * MIB),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(g.config().unwrap().slice_size, 96 * MIB);
}

/// 64 MiB in and out, through pages in shuffled order, compared byte for byte; and a memset in
/// between shows the copies run in order with other work.
#[test]
fn large_transfers_go_straight_between_guest_pages_and_the_gpu() {
    const SIZE: usize = 64 << 20;
    let h = Host::start(&[("vm1", 256)]);
    let g = h.guest("vm1", 256 * MIB);
    let (mut s, ctx) = session(&g, 1);
    let p = alloc(&mut s, ctx, SIZE as u64).unwrap();
    let src = g.alloc(SIZE, false).unwrap();
    let data = pattern(1, SIZE);
    g.write_buf(&src, 0, &data).unwrap();
    let t0 = Instant::now();
    htod(&mut s, ctx, p, &src);
    let back = g.alloc(SIZE, false).unwrap();
    dtoh(&mut s, ctx, p, &back);
    let elapsed = t0.elapsed();
    let mut got = vec![0u8; SIZE];
    g.read_buf(&back, 0, &mut got).unwrap();
    assert!(got == data, "64 MiB came back different");
    // An unaligned copy whose first page is partial, posted asynchronously after a memset.
    s.post_sg(
        &msg::Memset {
            ctx,
            stream: 0,
            dst: p,
            value: 0xab,
            elem_size: 1,
            count: 10_000,
        },
        &[],
    )
    .unwrap();
    let odd = g.alloc(5000 + 100, false).unwrap();
    g.write_buf(&odd, 100, &data[..5000]).unwrap();
    s.post_sg(
        &msg::MemcpyHtoD {
            ctx,
            stream: 0,
            dst: p + 1,
        },
        &odd.segments(100, 5000),
    )
    .unwrap();
    let small = g.alloc(10_000, true).unwrap();
    dtoh(&mut s, ctx, p, &small);
    let mut got = vec![0u8; 10_000];
    g.read_buf(&small, 0, &mut got).unwrap();
    assert_eq!(got[0], 0xab);
    assert_eq!(&got[1..5001], &data[..5000]);
    assert!(got[5001..].iter().all(|&b| b == 0xab));
    let st = h.stats("vm1");
    assert!(st.bytes_from_guest >= SIZE as u64 + 5000, "{st:?}");
    assert!(st.bytes_to_guest >= SIZE as u64 + 10_000, "{st:?}");
    // Every guest range of the buffers was counted: scattered pages, a range per 4 KiB page.
    let ranges = |b: &GuestBuf, off: usize, len: usize| b.segments(off, len).len() as u64;
    assert_eq!(ranges(&src, 0, SIZE), (SIZE / 4096) as u64);
    assert_eq!(
        st.segments_from_guest,
        ranges(&src, 0, SIZE) + ranges(&odd, 100, 5000),
        "{st:?}"
    );
    assert_eq!(
        st.segments_to_guest,
        ranges(&back, 0, SIZE) + ranges(&small, 0, 10_000),
        "{st:?}"
    );
    assert_eq!((st.dropped_chains, st.refused_requests), (0, 0), "{st:?}");
    let t = h.daemon.broker().tenant("vm1").unwrap();
    assert!(
        t.stats
            .bytes_htod
            .load(std::sync::atomic::Ordering::Relaxed)
            >= SIZE as u64
    );
    println!(
        "vgpu_dev: 64 MiB in and 64 MiB out in {:.0} ms (debug build)",
        elapsed.as_secs_f64() * 1e3
    );
    s.close().unwrap();
    h.wait_used("vm1", 0);
}

/// A module image and kernel parameters are bulk data too: saxpy runs and its result comes back.
#[test]
fn kernels_run_with_module_and_parameters_carried_as_bulk_data() {
    const N: usize = 4096;
    let h = Host::start(&[("vm1", 64)]);
    let g = h.guest("vm1", 64 * MIB);
    let (mut s, ctx) = session(&g, 1);
    let k = Saxpy::load(&g, &mut s, ctx, N);
    k.launch(&mut s);
    s.call(&msg::CtxSynchronize { ctx }, &[]).unwrap();
    k.check(&g, &mut s);
    let t = h.daemon.broker().tenant("vm1").unwrap();
    assert_eq!(
        t.stats.kernels.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

/// `y = 2x + y` over `n` elements: the module, the function and the parameter buffer travel as
/// bulk data.
struct Saxpy {
    ctx: u64,
    n: usize,
    function: u64,
    y: u64,
    expected: Vec<f32>,
    params: GuestBuf,
    params_len: usize,
}

impl Saxpy {
    fn load(g: &DevGuest, s: &mut DevSession, ctx: u64, n: usize) -> Saxpy {
        let ptx = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/ptx/saxpy.sm_80.ptx"),
        )
        .unwrap();
        let module = s.call(&msg::ModuleLoad { ctx }, &ptx).unwrap().handle;
        let f = s
            .call(
                &msg::ModuleGetFunction {
                    ctx,
                    module,
                    name: "saxpy".into(),
                },
                &[],
            )
            .unwrap();
        let bytes = (n * 4) as u64;
        let x = alloc(s, ctx, bytes).unwrap();
        let y = alloc(s, ctx, bytes).unwrap();
        let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let ys: Vec<f32> = (0..n).map(|i| 1000.0 - i as f32).collect();
        let as_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|f| f.to_le_bytes()).collect() };
        for (dst, v) in [(x, &xs), (y, &ys)] {
            let buf = g.alloc(n * 4, false).unwrap();
            g.write_buf(&buf, 0, &as_bytes(v)).unwrap();
            htod(s, ctx, dst, &buf);
        }
        // The packed parameter buffer, laid out as the function reply says.
        let a = 2.0f32;
        let values: [Vec<u8>; 4] = [
            (n as u32).to_le_bytes().to_vec(),
            a.to_le_bytes().to_vec(),
            x.to_le_bytes().to_vec(),
            y.to_le_bytes().to_vec(),
        ];
        let total = f
            .param_offsets
            .iter()
            .zip(&f.param_sizes)
            .map(|(o, s)| o + s)
            .max()
            .unwrap() as usize;
        let mut params = vec![0u8; total];
        for (i, v) in values.iter().enumerate() {
            let o = f.param_offsets[i] as usize;
            params[o..o + v.len()].copy_from_slice(v);
        }
        let pbuf = g.alloc(params.len(), false).unwrap();
        g.write_buf(&pbuf, 0, &params).unwrap();
        Saxpy {
            ctx,
            n,
            function: f.function,
            y,
            expected: xs.iter().zip(&ys).map(|(x, y)| a * x + y).collect(),
            params: pbuf,
            params_len: params.len(),
        }
    }

    /// Posts the launch.
    fn launch(&self, s: &mut DevSession) {
        s.post_sg(
            &msg::LaunchKernel {
                ctx: self.ctx,
                stream: 0,
                function: self.function,
                grid_x: self.n.div_ceil(256) as u32,
                grid_y: 1,
                grid_z: 1,
                block_x: 256,
                block_y: 1,
                block_z: 1,
                shared_bytes: 0,
            },
            &self.params.segments(0, self.params_len),
        )
        .unwrap();
    }

    /// Reads `y` back and checks every element.
    fn check(&self, g: &DevGuest, s: &mut DevSession) {
        let out = g.alloc(self.n * 4, false).unwrap();
        dtoh(s, self.ctx, self.y, &out);
        let mut raw = vec![0u8; self.n * 4];
        g.read_buf(&out, 0, &mut raw).unwrap();
        for (i, want) in self.expected.iter().enumerate() {
            let got = f32::from_le_bytes(raw[i * 4..i * 4 + 4].try_into().unwrap());
            assert_eq!(got, *want, "element {i}");
        }
    }
}

/// Two VMs, two slices: each allocation is charged to its own VM, each VM is refused past its
/// own slice, and one VM's pointer means nothing to the other.
/// Asynchronous frames in `BATCH` requests run in order, on the GPU, with the frames around them;
/// their errors surface at the next synchronizing call, as for frames sent one by one.
#[test]
fn batches_of_asynchronous_frames_run_in_order_on_the_gpu() {
    let host = Host::start(&[("batch", 64)]);
    let g = host.guest("batch", 64 * MIB);
    let (mut s, ctx) = session(&g, 1);
    const PIECES: u64 = 300;
    const PIECE: u64 = 64;
    let ptr = alloc(&mut s, ctx, PIECES * PIECE).unwrap();
    let memset = |i: u64, value: u32| msg::Memset {
        ctx,
        stream: 0,
        dst: ptr + i * PIECE,
        value,
        elem_size: 1,
        count: PIECE,
    };
    // Piece i gets i, then a second batch overwrites every third piece with 255: order matters.
    let first: Vec<msg::Memset> = (0..PIECES).map(|i| memset(i, i as u32)).collect();
    let second: Vec<msg::Memset> = (0..PIECES).step_by(3).map(|i| memset(i, 255)).collect();
    let p1 = s.submit_batch(&first).unwrap();
    s.post_sg(&memset(1, 77), &[]).unwrap();
    let p2 = s.submit_batch(&second).unwrap();
    let out = g.alloc((PIECES * PIECE) as usize, false).unwrap();
    let (_, resp) = s
        .call_sg(
            &msg::MemcpyDtoH {
                ctx,
                stream: 0,
                src: ptr,
                len: PIECES * PIECE,
            },
            &[],
            &out.segments(0, out.len),
        )
        .unwrap();
    assert_eq!(resp.data_len, PIECES * PIECE);
    for p in [p1, p2] {
        assert_eq!(g.wait(p, WAIT).unwrap().resp.status, wire::S_OK);
    }
    let mut got = vec![0u8; out.len];
    g.read_buf(&out, 0, &mut got).unwrap();
    for i in 0..PIECES {
        let want = match i {
            _ if i % 3 == 0 => 255,
            1 => 77,
            _ => i as u8,
        };
        let piece = &got[(i * PIECE) as usize..((i + 1) * PIECE) as usize];
        assert!(piece.iter().all(|&b| b == want), "piece {i}: {piece:?}");
    }
    // A frame of a batch that fails on the GPU: its error surfaces at the next synchronize.
    let bad = [memset(0, 1), memset(PIECES * 4, 1)];
    let p = s.submit_batch(&bad).unwrap();
    let e = s.call(&msg::CtxSynchronize { ctx }, &[]).unwrap_err();
    assert!(
        matches!(e, DevError::Cuda(code, _) if code == vgpu_proto::cuda::CUDA_ERROR_INVALID_VALUE),
        "{e}"
    );
    assert_eq!(g.wait(p, WAIT).unwrap().resp.status, wire::S_OK);
    let st = host.stats("batch");
    assert_eq!(st.batches, 3, "{st:?}");
    assert_eq!(st.refused_requests, 0, "{st:?}");
    let text = vgpud::metrics::render(host.daemon.runtime());
    assert!(
        text.lines()
            .any(|l| l.starts_with("vgpu_vm_vgpu_device_batches_total{")
                && l.contains("vm=\"batch\"")
                && l.ends_with(" 3")),
        "{text}"
    );
}

#[test]
fn a_batch_of_mixed_posted_frames_runs_in_order_and_ends_at_a_violation() {
    let host = Host::start(&[("mixed", 64)]);
    let g = host.guest("mixed", 64 * MIB);
    let (mut s, ctx) = session(&g, 1);
    let ptr = alloc(&mut s, ctx, 4096).unwrap();
    let fill = |at: u64, value: u32, elem_size: u32, count: u64| msg::Memset {
        ctx,
        stream: 0,
        dst: ptr + at,
        value,
        elem_size,
        count,
    };
    let data: Vec<u8> = (100..200).collect();
    // Fills and uploads (served in runs) around a copy (served alone) and a refused fill.
    let mut batch = Batch::default();
    s.add_to_batch(&mut batch, &fill(0, 1, 1, 256), &[]);
    let upload = msg::MemcpyHtoD {
        ctx,
        stream: 0,
        dst: ptr + 64,
    };
    s.add_to_batch(&mut batch, &upload, &data);
    let copy = msg::MemcpyDtoD {
        ctx,
        stream: 0,
        dst: ptr + 512,
        src: ptr,
        len: 128,
    };
    s.add_to_batch(&mut batch, &copy, &[]);
    s.add_to_batch(&mut batch, &fill(128, 3, 1, 64), &[]);
    s.add_to_batch(&mut batch, &fill(0, 9, 3, 1), &[]);
    s.add_to_batch(&mut batch, &fill(192, 0x0404_0404, 4, 16), &[]);
    let p = s.submit_frames(batch).unwrap();
    assert_eq!(g.wait(p, WAIT).unwrap().resp.status, wire::S_OK);
    let e = s.call(&msg::CtxSynchronize { ctx }, &[]).unwrap_err();
    assert!(
        matches!(e, DevError::Cuda(code, _) if code == vgpu_proto::cuda::CUDA_ERROR_INVALID_VALUE),
        "{e}"
    );
    s.call(&msg::CtxSynchronize { ctx }, &[]).unwrap();
    let out = g.alloc(1024, false).unwrap();
    let read = msg::MemcpyDtoH {
        ctx,
        stream: 0,
        src: ptr,
        len: 1024,
    };
    s.call_sg(&read, &[], &out.segments(0, out.len)).unwrap();
    let mut got = vec![0u8; 1024];
    g.read_buf(&out, 0, &mut got).unwrap();
    assert_eq!(got[..64], [1; 64]);
    assert_eq!(got[64..128], data[..64]);
    assert_eq!(
        got[128..192],
        [3; 64],
        "the fill after the upload overwrote its end"
    );
    assert_eq!(got[192..256], [4; 64]);
    assert_eq!(
        got[512..576],
        [1; 64],
        "the copy ran after the fill before it"
    );
    assert_eq!(got[576..640], data[..64], "and after the upload");
    assert_eq!(got[640..], [0; 384], "and before the fill after it");

    // A frame that breaks the protocol (an allocation sent without waiting for its reply) ends
    // the session: the batch's frames after it do not run.
    let calls = host.stats("mixed").calls;
    let mut batch = Batch::default();
    s.add_to_batch(&mut batch, &fill(0, 7, 1, 64), &[]);
    s.add_to_batch(&mut batch, &msg::MemAlloc { ctx, size: 4096 }, &[]);
    s.add_to_batch(&mut batch, &fill(0, 8, 1, 64), &[]);
    let p = s.submit_frames(batch).unwrap();
    assert_eq!(g.wait(p, WAIT).unwrap().resp.status, wire::S_PROTOCOL);
    let st = host.stats("mixed");
    assert_eq!(st.calls - calls, 2, "{st:?}");
    assert_eq!(st.refused_requests, 1, "{st:?}");
    assert!(s.call(&msg::CtxSynchronize { ctx }, &[]).is_err());
    host.wait_used("mixed", 0);
}

#[test]
fn two_vms_have_their_own_slices() {
    let h = Host::start(&[("small", 32), ("big", 128)]);
    let ga = h.guest("small", 32 * MIB);
    let gb = h.guest("big", 32 * MIB);
    assert_eq!(ga.config().unwrap().slice_size, 32 * MIB);
    assert_eq!(gb.config().unwrap().slice_size, 128 * MIB);
    let (mut a, actx) = session(&ga, 1);
    let (mut b, bctx) = session(&gb, 1);
    let pa = alloc(&mut a, actx, 24 * MIB).unwrap();
    match alloc(&mut a, actx, 16 * MIB) {
        Err(DevError::Cuda(code, _)) => assert_eq!(code, cuda::CUDA_ERROR_OUT_OF_MEMORY),
        other => panic!("expected out of memory, got {other:?}"),
    }
    alloc(&mut b, bctx, 100 * MIB).unwrap();
    assert_eq!((h.used("small"), h.used("big")), (24 * MIB, 100 * MIB));
    let info = b.call(&msg::MemGetInfo { ctx: bctx }, &[]).unwrap();
    assert_eq!(info.total, 128 * MIB);
    // `big` cannot read `small`'s memory through its own device.
    let dst = gb.alloc(4096, true).unwrap();
    let r = b.call_sg(
        &msg::MemcpyDtoH {
            ctx: bctx,
            stream: 0,
            src: pa,
            len: 4096,
        },
        &[],
        &dst.segments(0, 4096),
    );
    assert!(
        matches!(r, Err(DevError::Cuda(c, _)) if c == cuda::CUDA_ERROR_INVALID_VALUE),
        "{r:?}"
    );
}

/// However a session ends — closed, the guest rebooted, a protocol violation — its memory goes
/// back to the slice and later requests of it are refused; other sessions carry on.
#[test]
fn sessions_end_by_close_reboot_or_violation_and_free_their_memory() {
    let h = Host::start(&[("vm1", 128)]);
    let g = h.guest("vm1", 32 * MIB);
    let (mut s1, c1) = session(&g, 1);
    let (mut s2, c2) = session(&g, 2);
    alloc(&mut s1, c1, 16 * MIB).unwrap();
    alloc(&mut s2, c2, 8 * MIB).unwrap();
    h.wait_used("vm1", 24 * MIB);
    s1.close().unwrap();
    h.wait_used("vm1", 8 * MIB);
    alloc(&mut s2, c2, MIB).unwrap();
    // Recorded in the audit log like sessions of the other transports.
    let opened = h.audit("session.open");
    assert_eq!(opened.len(), 2, "{opened:?}");
    assert!(
        opened
            .iter()
            .all(|o| o["transport"] == "virtio-vgpu" && o["vm"] == "vm1")
    );
    assert_eq!(opened[0]["process"], "vgpu-dev-test");
    let closed = h.audit("session.close");
    assert_eq!(closed.len(), 1, "{closed:?}");
    assert!(
        closed[0]["requests"].as_u64().unwrap_or(0) >= 2,
        "{closed:?}"
    );

    // A first frame that is not Hello breaks the protocol: that session ends, nothing else.
    let mut bad = DevSession::open(&g, 3).unwrap();
    let r = bad.call(&msg::MemGetInfo { ctx: 1 }, &[]);
    assert!(matches!(r, Err(DevError::Device(S_PROTOCOL))), "{r:?}");
    let r = bad.hello("again");
    assert!(matches!(r, Err(DevError::Device(S_NO_SESSION))), "{r:?}");
    // An asynchronous frame of an op that needs a reply breaks it too.
    let (mut s4, c4) = session(&g, 4);
    alloc(&mut s4, c4, MIB).unwrap();
    let r = s4.post_sg(&msg::MemGetInfo { ctx: c4 }, &[]);
    assert!(matches!(r, Err(DevError::Device(S_PROTOCOL))), "{r:?}");
    let r = s4.call(&msg::MemGetInfo { ctx: c4 }, &[]);
    assert!(matches!(r, Err(DevError::Device(S_NO_SESSION))), "{r:?}");
    h.wait_used("vm1", 9 * MIB);

    // The guest reboots: every session of the old driver is gone.
    g.reboot().unwrap();
    h.wait_used("vm1", 0);
    let r = s2.call(&msg::MemGetInfo { ctx: c2 }, &[]);
    assert!(matches!(r, Err(DevError::Device(S_NO_SESSION))), "{r:?}");
    let (mut s5, c5) = session(&g, 2);
    alloc(&mut s5, c5, 100 * MIB).unwrap();
    assert!(h.stats("vm1").device_resets >= 1);
}

/// A guest process closed while its session waits in a synchronizing call behind a kernel that
/// would spin until the watchdog (30 s): the session notices the close, cancels the kernel and
/// frees its memory at once, not when the kernel ends.
#[test]
fn a_session_closed_while_it_waits_for_kernels_ends_at_once() {
    let h = Host::start(&[("vm1", 64)]);
    let g = h.guest("vm1", 16 * MIB);
    let (mut s, ctx) = session(&g, 1);
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
    let flag = alloc(&mut s, ctx, 4).unwrap();
    let out = alloc(&mut s, ctx, 4).unwrap();
    alloc(&mut s, ctx, 8 * MIB).unwrap();
    let params = g.alloc(16, false).unwrap();
    let mut p = flag.to_le_bytes().to_vec();
    p.extend_from_slice(&out.to_le_bytes());
    g.write_buf(&params, 0, &p).unwrap();
    // The flag is never set: the kernel spins until the watchdog stops it.
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
        &params.segments(0, 16),
    )
    .unwrap();
    let waiting = s
        .submit_call(&msg::CtxSynchronize { ctx }, &[], &[])
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        g.poll(waiting).is_none(),
        "the synchronize waits for the kernel"
    );
    let start = Instant::now();
    s.close().unwrap();
    // `wait_used` allows 20 s, less than the watchdog's 30.
    h.wait_used("vm1", 0);
    println!("closed and freed in {:?}", start.elapsed());
}

/// Removing a VM through the admin plane ends its device sessions, waits until they have released
/// their memory, and says how many there were; the other VM is untouched.
#[test]
fn removing_a_vm_ends_its_device_sessions_and_reports_them() {
    let h = Host::start(&[("gone", 64), ("stays", 64)]);
    let g = h.guest("gone", 32 * MIB);
    let (mut s1, c1) = session(&g, 1);
    let (mut s2, c2) = session(&g, 2);
    alloc(&mut s1, c1, 8 * MIB).unwrap();
    alloc(&mut s2, c2, 4 * MIB).unwrap();
    let other = h.guest("stays", 32 * MIB);
    let (mut s3, c3) = session(&other, 1);
    alloc(&mut s3, c3, 2 * MIB).unwrap();
    let r = h
        .daemon
        .runtime()
        .remove_vm(vgpud::audit::Actor::Daemon, "gone")
        .unwrap();
    assert_eq!(r.sessions_ended, 2, "{r:?}");
    assert_eq!(r.memory_released, 12 * MIB, "{r:?}");
    assert!(r.complete, "{r:?}");
    assert_eq!(h.audit("session.close").len(), 2);
    assert!(h.daemon.broker().tenant("gone").is_none());
    // The other VM goes on.
    alloc(&mut s3, c3, MIB).unwrap();
    assert_eq!(h.used("stays"), 3 * MIB);
}

/// QEMU pauses the VM (`stop`: the queues stop) with copies in flight and continues it: the
/// session, its memory and the copies go on, byte for byte. Paused again and then rebooted: the
/// new driver starts the queues afresh and the old driver's sessions end.
#[test]
fn a_paused_vm_keeps_its_sessions_and_copies_and_a_reboot_while_paused_ends_them() {
    const SIZE: usize = 16 << 20;
    const ROUNDS: u64 = 3;
    let h = Host::start(&[("vm1", 128)]);
    let g = h.guest("vm1", 96 * MIB);
    let (mut s, ctx) = session(&g, 1);
    let ptr = alloc(&mut s, ctx, SIZE as u64).unwrap();
    let src = g.alloc(SIZE, false).unwrap();
    let data = pattern(7, SIZE);
    g.write_buf(&src, 0, &data).unwrap();
    htod(&mut s, ctx, ptr, &src);
    for round in 0..ROUNDS {
        let dst = g.alloc(SIZE, false).unwrap();
        // Every chunk of a device-to-host copy in flight, then the VM pauses.
        let mut pending = Vec::new();
        let mut off = 0;
        while off < SIZE {
            let n = CHUNK.min(SIZE - off);
            let req = msg::MemcpyDtoH {
                ctx,
                stream: 0,
                src: ptr + off as u64,
                len: n as u64,
            };
            pending.push((s.submit_call(&req, &[], &dst.segments(off, n)).unwrap(), n));
            off += n;
        }
        let bases = g.pause().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let st = h.stats("vm1");
        assert_eq!((st.pauses, st.sessions_open), (round + 1, 1), "{st:?}");
        assert_eq!(h.used("vm1"), SIZE as u64 + round * MIB);
        g.resume(bases).unwrap();
        for (p, n) in pending {
            let c = g.wait(p, WAIT).unwrap();
            let (_, resp) = DevSession::reply_of::<msg::MemcpyDtoH>(&c).unwrap();
            assert_eq!(resp.data_len, n as u64);
        }
        let mut back = vec![0u8; SIZE];
        g.read_buf(&dst, 0, &mut back).unwrap();
        assert!(
            back == data,
            "round {round}: the copies across the pause arrived intact"
        );
        // The session goes on.
        alloc(&mut s, ctx, MIB).unwrap();
    }
    let st = h.stats("vm1");
    assert_eq!((st.resumes, st.device_resets), (ROUNDS, 0), "{st:?}");
    // Paused, then the guest reboots: the old driver's session ends and frees its memory.
    g.pause().unwrap();
    g.reboot().unwrap();
    h.wait_used("vm1", 0);
    assert_eq!(h.stats("vm1").device_resets, 1);
    let (mut s2, c2) = session(&g, 1);
    alloc(&mut s2, c2, MIB).unwrap();
}

/// Pauses at random moments of a posted copy followed by a synchronous one: across 25 pauses no
/// answer is lost, duplicated or late past the resume, and no byte is wrong.
#[test]
fn pauses_at_random_moments_lose_and_corrupt_nothing() {
    const SIZE: usize = CHUNK;
    const ROUNDS: u64 = 25;
    let h = Host::start(&[("vm1", 64)]);
    let g = h.guest("vm1", 48 * MIB);
    let (mut s, ctx) = session(&g, 1);
    let ptr = alloc(&mut s, ctx, SIZE as u64).unwrap();
    let src = g.alloc(SIZE, false).unwrap();
    let dst = g.alloc(SIZE, false).unwrap();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |max: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % max
    };
    for round in 0..ROUNDS {
        let data = pattern(round + 100, SIZE);
        g.write_buf(&src, 0, &data).unwrap();
        let posted = s
            .submit_post(
                &msg::MemcpyHtoD {
                    ctx,
                    stream: 0,
                    dst: ptr,
                },
                &src.segments(0, SIZE),
            )
            .unwrap();
        let req = msg::MemcpyDtoH {
            ctx,
            stream: 0,
            src: ptr,
            len: SIZE as u64,
        };
        let call = s.submit_call(&req, &[], &dst.segments(0, SIZE)).unwrap();
        std::thread::sleep(Duration::from_micros(next(1500)));
        let bases = g.pause().unwrap();
        std::thread::sleep(Duration::from_micros(next(3000)));
        g.resume(bases).unwrap();
        let c = g.wait(posted, WAIT).unwrap();
        assert_eq!(c.resp.status, wire::S_OK, "round {round}: posted copy");
        let c = g.wait(call, WAIT).unwrap();
        let (_, resp) = DevSession::reply_of::<msg::MemcpyDtoH>(&c).unwrap();
        assert_eq!(resp.data_len, SIZE as u64, "round {round}");
        let mut back = vec![0u8; SIZE];
        g.read_buf(&dst, 0, &mut back).unwrap();
        assert!(back == data, "round {round}: wrong bytes after the pause");
    }
    // A resume is counted by the device's watcher thread once it sees the queues run again: the
    // last round's chains may complete before that, so give the count a moment to catch up.
    let deadline = Instant::now() + WAIT;
    let mut st = h.stats("vm1");
    while st.resumes < st.pauses && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
        st = h.stats("vm1");
    }
    assert_eq!(
        (
            st.pauses,
            st.resumes,
            st.device_resets,
            st.stale_completions
        ),
        (ROUNDS, ROUNDS, 0, 0),
        "{st:?}"
    );
    assert_eq!(h.used("vm1"), SIZE as u64);
    // The same counters on the Prometheus endpoint, named as the operator's guide says.
    let text = vgpud::metrics::render(h.daemon.runtime());
    let guide =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/admin.md"))
            .unwrap();
    let value_of = |metric: &str, label: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{metric}{{")) && l.contains(label))
            .unwrap_or_else(|| panic!("no {metric} with {label} in:\n{text}"));
        assert!(
            guide.contains(&format!("`{metric}")),
            "docs/admin.md lacks {metric}"
        );
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let vm = "vm=\"vm1\"";
    assert_eq!(value_of("vgpu_vm_vgpu_device_sessions", vm), 1.0);
    assert_eq!(
        value_of("vgpu_vm_vgpu_device_pauses_total", vm),
        ROUNDS as f64
    );
    assert_eq!(value_of("vgpu_vm_vgpu_device_resets_total", vm), 0.0);
    assert_eq!(value_of("vgpu_vm_vgpu_device_refused_total", vm), 0.0);
    let moved = value_of(
        "vgpu_vm_vgpu_device_bytes_total",
        "direction=\"guest_to_host\"",
    );
    assert!(moved >= (ROUNDS as usize * SIZE) as f64, "{moved}");
    let ranges = value_of(
        "vgpu_vm_vgpu_device_segments_total",
        "direction=\"host_to_guest\"",
    );
    assert_eq!(ranges, st.segments_to_guest as f64);
    assert!(ranges >= 1.0, "{ranges}");
}

/// A request the guest kicks while the VMM is still restarting the queues after a pause (one queue
/// runs again, the other not yet, so the device cannot resume): the kick finds the device paused,
/// and the request must still be taken once the device resumes, the session going on. (Over this
/// in-process vhost-user connection the vring worker happens to see another event when the second
/// queue starts; the device's unit test `a_request_kicked_before_the_resume_is_taken_on_the_rescan`
/// shows the case where nothing else comes, which a QEMU guest hit.)
#[test]
fn a_request_kicked_half_way_through_a_resume_is_taken_after_it() {
    let h = Host::start(&[("vm1", 64)]);
    let g = h.guest("vm1", 64 * MIB);
    let (mut s, ctx) = session(&g, 1);
    let bases = g.pause().unwrap();
    g.resume_queues(bases, &[CTRL_QUEUE]).unwrap();
    let call = s.submit_call(&msg::MemGetInfo { ctx }, &[], &[]).unwrap();
    // The kick reached a still-paused device; the watcher cannot resume it yet either.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(h.stats("vm1").resumes, 0);
    g.resume_queues(bases, &[SUBMIT_QUEUE]).unwrap();
    let c = g
        .wait(call, WAIT)
        .expect("the request kicked during the resume is answered");
    let (info, resp) = DevSession::reply_of::<msg::MemGetInfo>(&c).unwrap();
    assert_eq!(resp.status, wire::S_OK);
    assert_eq!(info.total, 64 * MIB);
    let st = h.stats("vm1");
    assert_eq!(
        (st.pauses, st.resumes, st.device_resets),
        (1, 1, 0),
        "{st:?}"
    );
    // And the session goes on.
    assert!(alloc(&mut s, ctx, 4096).is_ok());
}

/// A synchronize waiting for a long kernel when the VM pauses: its answer waits for the VM to
/// continue (nothing touches the ring while paused), then arrives, and the kernel's results are
/// right.
#[test]
fn a_call_in_flight_across_a_pause_is_answered_after_it() {
    // About 250 ms of kernel on the simulated GPU (debug build): the pause comes well before.
    const N: usize = 1 << 20;
    let h = Host::start(&[("vm1", 64)]);
    let g = h.guest("vm1", 64 * MIB);
    let (mut s, ctx) = session(&g, 1);
    let k = Saxpy::load(&g, &mut s, ctx, N);
    k.launch(&mut s);
    let sync = s
        .submit_call(&msg::CtxSynchronize { ctx }, &[], &[])
        .unwrap();
    let bases = g.pause().unwrap();
    // The kernel runs on while the VM is paused; its answer is held.
    let t = h.daemon.broker().tenant("vm1").unwrap();
    let deadline = Instant::now() + WAIT;
    while t.stats.kernels.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the kernel never finished");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(20));
    assert!(g.poll(sync).is_none(), "answered while the VM was paused");
    g.resume(bases).unwrap();
    let c = g.wait(sync, WAIT).unwrap();
    DevSession::reply_of::<msg::CtxSynchronize>(&c).unwrap();
    k.check(&g, &mut s);
    let st = h.stats("vm1");
    assert_eq!(
        (st.pauses, st.resumes, st.device_resets),
        (1, 1, 0),
        "{st:?}"
    );
}

/// The VMM dies in the middle of a stream of large copies: the VM's memory is freed and its
/// sessions end, while another VM's transfers go on; a new VMM on the same socket works.
#[test]
fn a_vmm_killed_mid_transfer_frees_its_vm_and_spares_the_other() {
    const SIZE: usize = 32 << 20;
    let h = Host::start(&[("victim", 128), ("bystander", 128)]);
    let gv = h.guest("victim", 96 * MIB);
    let gb = h.guest("bystander", 96 * MIB);
    let (mut v, vctx) = session(&gv, 1);
    let (mut b, bctx) = session(&gb, 1);
    let pv = alloc(&mut v, vctx, SIZE as u64).unwrap();
    let pb = alloc(&mut b, bctx, SIZE as u64).unwrap();
    let vbuf = gv.alloc(SIZE, false).unwrap();
    gv.write_buf(&vbuf, 0, &pattern(2, SIZE)).unwrap();
    // Queue the victim's copies without waiting, then pull the plug.
    let mut pending = Vec::new();
    let mut off = 0;
    while off < SIZE {
        let n = CHUNK.min(SIZE - off);
        pending.push(
            v.submit_post(
                &msg::MemcpyHtoD {
                    ctx: vctx,
                    stream: 0,
                    dst: pv + off as u64,
                },
                &vbuf.segments(off, n),
            )
            .unwrap(),
        );
        off += n;
    }
    let bbuf = gb.alloc(SIZE, false).unwrap();
    let data = pattern(3, SIZE);
    gb.write_buf(&bbuf, 0, &data).unwrap();
    let by = std::thread::spawn(move || {
        for _ in 0..3 {
            htod(&mut b, bctx, pb, &bbuf);
        }
        let back = b.guest().alloc(SIZE, false).unwrap();
        dtoh(&mut b, bctx, pb, &back);
        (b, back)
    });
    gv.disconnect();
    h.wait_used("victim", 0);
    let (_b, back) = by.join().unwrap();
    let mut got = vec![0u8; SIZE];
    gb.read_buf(&back, 0, &mut got).unwrap();
    assert!(got == data, "the bystander's data arrived intact");
    assert_eq!(h.used("bystander"), SIZE as u64);
    // The session thread frees the memory, then counts itself closed.
    let deadline = Instant::now() + WAIT;
    while h.stats("victim").sessions_open != 0 {
        assert!(Instant::now() < deadline, "{:?}", h.stats("victim"));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(h.stats("victim").device_resets >= 1);
    // A new VMM on the same socket gets a fresh device and the whole slice.
    let deadline = Instant::now() + WAIT;
    let g2 = loop {
        match DevGuest::start(
            &h.dir.path().join("victim.sock"),
            DevGuestOptions {
                queue_size: 1024,
                ..Default::default()
            },
        ) {
            Ok(g) => break g,
            Err(e) => {
                assert!(Instant::now() < deadline, "cannot reconnect: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let (mut v2, v2ctx) = session(&g2, 1);
    alloc(&mut v2, v2ctx, 128 * MIB).unwrap();
    assert_eq!(h.stats("victim").frontend_connections, 2);
}

/// Hostile chains through the real vhost-user path: each is refused, vgpud keeps serving this
/// VM and the other.
#[test]
fn hostile_descriptor_chains_are_refused_and_vgpud_keeps_serving() {
    let h = Host::start(&[("evil", 64), ("other", 64)]);
    let g = h.guest("evil", 32 * MIB);
    let go = h.guest("other", 32 * MIB);
    let (mut s, ctx) = session(&g, 1);
    let (mut o, octx) = session(&go, 1);
    let end = g.memory_size();
    let buf = g.alloc(64 * 1024, true).unwrap();
    let base = buf.pages[0];
    // A valid request header and frame in guest memory for the chains to point at.
    let mut fields = Vec::new();
    msg::MemGetInfo { ctx }.encode(&mut fields);
    let frame_header = Header {
        opcode: msg::MemGetInfo::OPCODE,
        flags: 0,
        call_id: 99,
        payload_len: fields.len() as u32,
        status: 0,
    };
    let mut inline = frame_header.encode().to_vec();
    inline.extend_from_slice(&fields);
    let hdr = ReqHeader {
        kind: REQ_CALL,
        session: 1,
        seq: 1000,
        inline_len: inline.len() as u32,
        reply_cap: 64,
        reserved: 0,
    };
    let mut req = hdr.to_bytes().to_vec();
    req.extend_from_slice(&inline);
    g.write_mem(base, &req).unwrap();
    let rlen = req.len() as u32;
    let resp = base + 0x1000;
    let chains: Vec<(&str, RawChain)> = vec![
        (
            "data outside guest RAM",
            vec![
                (base, rlen, false),
                (end - 8, 4096, false),
                (resp, 80, true),
            ],
        ),
        (
            "a range that wraps",
            vec![
                (base, rlen, false),
                (u64::MAX - 16, 64, false),
                (resp, 80, true),
            ],
        ),
        (
            "reply overlapping the request",
            vec![(base, rlen, false), (resp, 16, true), (base + 8, 64, true)],
        ),
        (
            "absurd length",
            vec![
                (base, rlen, false),
                (resp, 16, true),
                (base + 0x2000, 0xffff_0000, true),
            ],
        ),
        ("no response header", vec![(base, rlen, false)]),
    ];
    for (name, chain) in &chains {
        let head = g.submit_raw(CTRL_QUEUE, chain).unwrap();
        g.wait_raw(CTRL_QUEUE, head, DEFAULT_TIMEOUT)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut rb = [0u8; wire::RESP_HEADER_LEN];
        g.read_mem(resp, &mut rb).unwrap();
        if chain.iter().any(|c| c.2) {
            assert_eq!(
                wire::RespHeader::from_bytes(&rb).status,
                S_BAD_REQUEST,
                "{name}"
            );
        }
        g.write_mem(resp, &[0xff; 16]).unwrap();
    }
    assert!(h.stats("evil").dropped_chains >= chains.len() as u64 - 1);
    // Absurd segment counts: more descriptors than a chain may have, via an indirect table.
    let many: Vec<_> = (0..1100u64)
        .map(|i| vgpu_vhost_vgpu::chain::Segment {
            addr: base + 0x4000 + i * 8,
            len: 8,
        })
        .collect();
    let mut r = Request {
        hdr: ReqHeader { seq: 1, ..hdr },
        inline: inline.clone(),
        data: many,
        ..Default::default()
    };
    r.hdr.reply_cap = 64;
    let c = g.request(CTRL_QUEUE, &r, 64).unwrap();
    assert_eq!(c.resp.status, S_BAD_REQUEST);
    // Malformed frames of an open session are refused in their place in its sequence.
    let _raw = DevSession::open(&g, 7).unwrap();
    // A synchronous frame on the submission queue.
    let c = g
        .request(
            SUBMIT_QUEUE,
            &Request {
                hdr: ReqHeader {
                    session: 7,
                    seq: 1,
                    reply_cap: 0,
                    ..hdr
                },
                inline: inline.clone(),
                ..Default::default()
            },
            0,
        )
        .unwrap();
    assert_eq!(c.resp.status, S_BAD_REQUEST);
    // An asynchronous frame whose payload_len lies.
    let mut lying = inline.clone();
    let mut lh = frame_header;
    lh.flags = FLAG_ASYNC;
    lh.payload_len = 1 << 20;
    lying[..HEADER_LEN].copy_from_slice(&lh.encode());
    let c = g
        .request(
            SUBMIT_QUEUE,
            &Request {
                hdr: ReqHeader {
                    session: 7,
                    seq: 2,
                    reply_cap: 0,
                    ..hdr
                },
                inline: lying,
                ..Default::default()
            },
            0,
        )
        .unwrap();
    assert_eq!(c.resp.status, S_BAD_REQUEST);
    // Both VMs are still served.
    let info = s.call(&msg::MemGetInfo { ctx }, &[]).unwrap();
    assert_eq!(info.total, 64 * MIB);
    o.call(&msg::MemGetInfo { ctx: octx }, &[]).unwrap();
    let st = h.stats("other");
    assert_eq!((st.dropped_chains, st.refused_requests), (0, 0));
}

/// Device `printf` over the device transport: the synchronizing call's reply frame carries
/// `FLAG_OUTPUT` for a session that enabled the feature, and `TakeOutput` returns the text.
#[test]
fn device_printf_output_is_flagged_and_fetched_over_the_device() {
    let h = Host::start(&[("vm1", 64)]);
    let g = h.guest("vm1", 32 * MIB);
    let mut s = DevSession::open(&g, 1).unwrap();
    s.hello("printf").unwrap();
    let f = s
        .call(
            &msg::SetFeatures {
                features: msg::FEATURE_DEVICE_OUTPUT,
            },
            &[],
        )
        .unwrap();
    assert_eq!(f.features, msg::FEATURE_DEVICE_OUTPUT);
    let ctx = s.ctx_create().unwrap();
    let ptx = include_str!("../devices/ptx/fixtures/deviceio.compute_80.ptx");
    let module = s
        .call(&msg::ModuleLoad { ctx }, ptx.as_bytes())
        .unwrap()
        .handle;
    let lanes = s
        .call(
            &msg::ModuleGetFunction {
                ctx,
                module,
                name: "lanes".into(),
            },
            &[],
        )
        .unwrap();
    s.post_sg(
        &msg::LaunchKernel {
            ctx,
            stream: 0,
            function: lanes.function,
            grid_x: 1,
            grid_y: 1,
            grid_z: 1,
            block_x: 32,
            block_y: 1,
            block_z: 1,
            shared_bytes: 0,
        },
        &[],
    )
    .unwrap();
    let p = s
        .submit_call(&msg::CtxSynchronize { ctx }, &[], &[])
        .unwrap();
    let c = g.wait(p, DEFAULT_TIMEOUT).unwrap();
    let hb: [u8; HEADER_LEN] = c.reply[..HEADER_LEN].try_into().unwrap();
    let header = Header::decode(&hb).unwrap();
    assert_eq!(header.status, 0);
    assert!(header.has_output(), "{header:?}");
    let o = s
        .call(
            &msg::TakeOutput {
                max_bytes: 60 << 10,
            },
            &[],
        )
        .unwrap();
    let want: String = (0..32).map(|l| format!("lane {l:02}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&o.stdout), want);
    assert_eq!(o.more, 0);
    s.close().unwrap();
}
