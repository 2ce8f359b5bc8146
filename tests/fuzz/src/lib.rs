//! Fuzz targets: every parser that reads bytes a guest (or an operator's
//! config file) controls, one function per parser taking the raw input.
//!
//! The same functions run under libFuzzer (`fuzz/`, `cargo fuzz run
//! TARGET`) and in this crate's tests, which replay the seed corpora in
//! `fuzz/corpus/<target>/` and a deterministic burst of mutations of them
//! under a cost oracle: an input that panics, allocates more than
//! [`MAX_INPUT_ALLOC`] or runs longer than [`MAX_INPUT_TIME`] is a finding.
//! A target returns normally for every input: errors are the expected answer
//! to bad input.

use std::io::{self, Read};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use virtio_bindings::bindings::virtio_ring::{
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_queue::desc::{RawDescriptor, split::Descriptor as SplitDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

use vgpu_vhost_vsock::packet::{GuestMem, TxPacket, parse_rx_chain};

/// Most bytes one input may allocate (peak) before it counts as a finding.
pub const MAX_INPUT_ALLOC: usize = 256 << 20;
/// Longest one input may run before it counts as a finding.
pub const MAX_INPUT_TIME: Duration = Duration::from_secs(1);

/// A fuzz target.
pub type Target = fn(&[u8]);

/// Every target by name (the names of `fuzz/fuzz_targets/*.rs` and of the
/// corpus directories).
pub const TARGETS: &[(&str, Target)] = &[
    ("frame", frame),
    ("ptx", ptx),
    ("fatbin", fatbin),
    ("config", config),
    ("vsock_chain", vsock_chain),
    ("vgpu_chain", vgpu_chain),
    ("session", session),
    ("session_ring", session_ring),
];

/// A protocol frame from the guest: the header, then the request payload
/// decoded as the header's opcode says.
pub fn frame(data: &[u8]) {
    let Some(head) = data.get(..vgpu_proto::frame::HEADER_LEN) else {
        return;
    };
    let mut h = [0u8; vgpu_proto::frame::HEADER_LEN];
    h.copy_from_slice(head);
    let opcode = match vgpu_proto::frame::Header::decode(&h) {
        Ok(header) => header.opcode,
        Err(_) => u16::from_le_bytes([data[4], data[5]]),
    };
    let _ = vgpu_proto::msg::Request::decode(opcode, &data[vgpu_proto::frame::HEADER_LEN..]);
}

/// The VM whose sessions [`session`] serves: a broker over a device whose memory is host
/// vectors, with a 16 MiB slice.
fn fuzz_vm() -> &'static (Arc<vgpu_broker::Broker>, Arc<vgpu_broker::tenant::Tenant>) {
    static VM: OnceLock<(Arc<vgpu_broker::Broker>, Arc<vgpu_broker::tenant::Tenant>)> =
        OnceLock::new();
    VM.get_or_init(new_fuzz_vm)
}

/// A VM like [`fuzz_vm`]'s, on a broker of its own.
fn new_fuzz_vm() -> (Arc<vgpu_broker::Broker>, Arc<vgpu_broker::tenant::Tenant>) {
    let dev: Arc<dyn vgpu_broker::device::Device> = Arc::new(
        vgpu_broker::testutils::MemDevice::new(1 << 30, Duration::ZERO),
    );
    let broker = Arc::new(vgpu_broker::Broker::new(vec![("gpu0".into(), dev)]));
    broker
        .add_tenant(&vgpu_broker::testutils::vm("fuzz", SESSION_SLICE))
        .expect("a tenant of a fresh broker");
    let tenant = broker.tenant("fuzz").expect("the tenant just added");
    (broker, tenant)
}

/// The memory slice of [`session`]'s VM.
const SESSION_SLICE: u64 = 16 << 20;
/// The runs in which [`session`]'s transport lends its bytes.
const SESSION_RUN: usize = 1000;

/// A guest's byte stream to its session on vgpud's GPU port: frames served by a broker session
/// over a transport that lends its bytes in place (`serve_in_place`), a large
/// `MemcpyHtoD`'s straight into device memory, run by run.
pub fn session(data: &[u8]) {
    let (broker, tenant) = fuzz_vm();
    let stream = LentBytes { data, at: 0 };
    let _ = vgpu_broker::session_loop::serve_in_place(
        broker,
        Arc::clone(tenant),
        stream,
        io::sink(),
        "fuzz",
        Some(gone_after(GIVE_UP)),
    );
}

/// How long a session of one input may wait (for its work, in a synchronizing call) before the
/// guest counts as gone, as a real guest's killed process would be: an input may wait for what
/// it never lets happen (a stream memory wait nobody writes, a host function nobody runs),
/// which on CUDA too hangs the program, not the driver.
const GIVE_UP: Duration = Duration::from_millis(300);

/// A hang-up probe that says the client is gone once `limit` has passed.
fn gone_after(limit: Duration) -> vgpu_broker::engine::HangupProbe {
    let t0 = std::time::Instant::now();
    Arc::new(move || t0.elapsed() > limit)
}

/// The bytes the guest's packets carry at a time in [`session_ring`]: not a divisor of any frame
/// size, so frames straddle packets.
const RING_PACKET: usize = 977;
/// How long [`session_ring`] waits for its session to end once the input is written: ten times
/// the cost oracle's limit (a session past it is a finding anyway).
const RING_LINGER: Duration = Duration::from_secs(10);

/// The same byte stream as [`session`], the way vgpud serves it: written packet by packet into
/// an in-process vsock connection (`vgpu_vhost_vsock::inproc`) by this thread, which plays the
/// device thread and so answers the quick calls itself (`serve_ring` with its answerer), while
/// a session thread serves the rest; the replies are drained as the device would.
pub fn session_ring(data: &[u8]) {
    serve_on_a_ring(fuzz_vm(), data);
}

/// [`session_ring`] on the VM `vm`.
fn serve_on_a_ring(vm: &(Arc<vgpu_broker::Broker>, Arc<vgpu_broker::tenant::Tenant>), data: &[u8]) {
    use vm_memory::{ReadVolatile, VolatileSlice};
    let (broker, tenant) = vm;
    let Ok((device, end)) =
        vgpu_vhost_vsock::inproc::pair(vgpu_vhost_vsock::inproc::DEFAULT_RING_CAPACITY)
    else {
        return;
    };
    let end = Arc::new(end);
    let (broker, tenant) = (Arc::clone(broker), Arc::clone(tenant));
    let probe = gone_after(GIVE_UP);
    let session = std::thread::spawn(move || {
        let writer: &vgpu_vhost_vsock::inproc::SessionEnd = &end;
        let _ = vgpu_broker::session_loop::serve_ring(
            &broker,
            tenant,
            Arc::clone(&end),
            writer,
            "fuzz",
            Some(probe),
            true,
        );
    });
    let mut replies = vec![0u8; RING_PACKET];
    let mut drain = || loop {
        match (&device).read_volatile(&mut VolatileSlice::from(&mut replies[..])) {
            Ok(n) if n > 0 => {}
            _ => return,
        }
    };
    let mut at = 0;
    while at < data.len() && !session.is_finished() {
        let packet = &data[at..(at + RING_PACKET).min(data.len())];
        match io::Write::write(&mut &device, packet) {
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(_) => break,
        }
        drain();
    }
    // The guest shuts its sending side: the session reads the end of its stream after the
    // bytes before it, answers them and ends. A session that does not end within the time
    // limit is cut off (the guest goes away: its replies can no longer be written).
    device.shutdown_write();
    let deadline = std::time::Instant::now() + RING_LINGER;
    while !session.is_finished() && std::time::Instant::now() < deadline {
        drain();
        std::thread::yield_now();
    }
    drop(device);
    let _ = session.join();
}

/// Input bytes as a stream that lends them in runs of [`SESSION_RUN`], each split in two
/// slices as a ring's wrap splits them.
struct LentBytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl Read for LentBytes<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.data.len() - self.at);
        buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl vgpu_proto::frame::ReadInPlace for LentBytes<'_> {
    fn read_in_place(
        &mut self,
        len: usize,
        f: &mut vgpu_proto::frame::RunFn<'_>,
    ) -> io::Result<()> {
        let mut left = len;
        let mut to = vgpu_proto::frame::Borrower::new(f);
        while left > 0 {
            let n = left.min(SESSION_RUN).min(self.data.len() - self.at);
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let (a, b) = self.data[self.at..self.at + n].split_at(n / 2);
            to.offer(&[a, b]);
            self.at += n;
            left -= n;
        }
        Ok(())
    }
}

/// A PTX module (what `cuModuleLoadData` sends), loaded by the interpreter's
/// front end.
pub fn ptx(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = vgpu_ptx::Module::load(text);
    }
}

/// A fat binary or cubin: entries, the images a device would keep, the PTX
/// it would run, and a cubin's kernels and variables.
pub fn fatbin(data: &[u8]) {
    if let Ok(entries) = vgpu_fatbin::entries(data) {
        for e in entries.iter().take(16) {
            let _ = e.contents();
        }
    }
    let _ = vgpu_fatbin::select(data, 80, vgpu_fatbin::PtxRange::UpTo);
    let _ = vgpu_fatbin::select(data, 80, vgpu_fatbin::PtxRange::Any);
    let _ = vgpu_fatbin::ptx_for(data, 80);
    let _ = vgpu_fatbin::cubin::read(data);
}

/// A config file (the operator's, but parsed with the same care).
pub fn config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = vgpu_config::Config::parse(Path::new("fuzz.toml"), text);
    }
}

/// Guest memory of the chain targets.
const MEM_SIZE: usize = 1 << 20;
/// Where the descriptor table and rings of the mock queue live.
const QUEUE_ADDR: u64 = 0;
/// Queue size of the mock queue.
const QUEUE_SIZE: u16 = 16;
/// Where the input's payload bytes are written in guest memory.
const PAYLOAD_ADDR: u64 = 0x8000;
/// Bytes describing one descriptor in an input.
const DESC_BYTES: usize = 12;

/// Builds a descriptor chain from an input and hands it to `parse`: the
/// first byte is the descriptor count (1 to 8), each descriptor takes
/// [`DESC_BYTES`] (address u32 — scaled so some fall outside guest memory —,
/// length u32, flags u16 (its NEXT, WRITE and INDIRECT bits), next u16), and
/// the rest is written to guest memory as the buffers' contents (and as
/// indirect tables, for descriptors that point there).
fn with_chain(data: &[u8], parse: impl FnOnce(&GuestMem, virtio_queue::Queue)) {
    let Some((&count, rest)) = data.split_first() else {
        return;
    };
    let count = usize::from(count % 8) + 1;
    let Some(descs) = rest.get(..count * DESC_BYTES) else {
        return;
    };
    let payload = &rest[count * DESC_BYTES..];
    let Ok(mem) = GuestMem::from_ranges(&[(GuestAddress(0), MEM_SIZE)]) else {
        return;
    };
    let raw: Vec<RawDescriptor> = descs
        .chunks_exact(DESC_BYTES)
        .map(|d| {
            let addr =
                u64::from(u32::from_le_bytes([d[0], d[1], d[2], d[3]])) % (2 * MEM_SIZE as u64);
            let len = u32::from_le_bytes([d[4], d[5], d[6], d[7]]);
            let flags = u16::from_le_bytes([d[8], d[9]])
                & (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE | VRING_DESC_F_INDIRECT) as u16;
            let next = u16::from_le_bytes([d[10], d[11]]) % QUEUE_SIZE;
            RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
        })
        .collect();
    let q = MockSplitQueue::create(&mem, GuestAddress(QUEUE_ADDR), QUEUE_SIZE);
    if q.add_desc_chains(&raw, 0).is_err() {
        return;
    }
    let room = MEM_SIZE - PAYLOAD_ADDR as usize;
    let _ = mem.write_slice(
        &payload[..payload.len().min(room)],
        GuestAddress(PAYLOAD_ADDR),
    );
    let Ok(queue) = q.create_queue::<virtio_queue::Queue>() else {
        return;
    };
    parse(&mem, queue);
}

/// A vsock device chain: a tx packet (header, length checks) and an rx chain.
pub fn vsock_chain(data: &[u8]) {
    with_chain(data, |mem, mut queue| {
        // Taken as the device takes it (`next_head` on the device's vring).
        if let Ok(Some(head)) = vgpu_vhost_user::take_head(&mut queue, mem) {
            let _ = TxPacket::parse(head, mem);
            let _ = parse_rx_chain(head, mem);
        }
    });
}

/// A virtio-vgpu request chain.
pub fn vgpu_chain(data: &[u8]) {
    with_chain(data, |mem, mut queue| {
        if let Ok(Some(head)) = vgpu_vhost_vgpu::chain::take_head(&mut queue, mem) {
            let _ = vgpu_vhost_vgpu::chain::parse_chain(head, mem);
        }
    });
}

/// Seed inputs of a target, built from the project's fixtures: real frames,
/// the kernel corpus's PTX, a real cubin and fat binaries, the example
/// configs, and well-formed descriptor chains.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let read_dir = |dir: &str, ext: &str| -> Vec<Vec<u8>> {
        let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .collect();
        files.sort();
        files.iter().filter_map(|p| std::fs::read(p).ok()).collect()
    };
    match target {
        "frame" => {
            use vgpu_proto::msg::{self, Op};
            let mut v = Vec::new();
            let mut push = |opcode: u16, payload: Vec<u8>| {
                let mut f = Vec::new();
                let _ = vgpu_proto::frame::write_frame(&mut f, opcode, 0, 1, 0, &[&payload]);
                v.push(f);
            };
            push(
                msg::Hello::OPCODE,
                msg::encode(&msg::Hello {
                    protocol_version: vgpu_proto::PROTOCOL_VERSION,
                    pid: 1,
                    shim_version: "0.1".into(),
                    process_name: "seed".into(),
                }),
            );
            push(
                msg::MemAlloc::OPCODE,
                msg::encode(&msg::MemAlloc { ctx: 1, size: 4096 }),
            );
            let mut launch = msg::encode(&msg::LaunchKernel {
                ctx: 1,
                stream: 0,
                function: 2,
                grid_x: 1,
                grid_y: 1,
                grid_z: 1,
                block_x: 32,
                block_y: 1,
                block_z: 1,
                shared_bytes: 0,
            });
            launch.extend_from_slice(&[0; 16]);
            push(msg::LaunchKernel::OPCODE, launch);
            let mut load = msg::encode(&msg::ModuleLoad { ctx: 1 });
            load.extend_from_slice(b".version 7.0\n.target sm_52\n.address_size 64\n");
            push(msg::ModuleLoad::OPCODE, load);
            // An image in two parts.
            let image: &[u8] = b".version 7.0\n.target sm_52\n.address_size 64\n";
            for (offset, part) in [(0, &image[..20]), (20, &image[20..])] {
                let mut p = msg::encode(&msg::ModuleLoadPart {
                    ctx: 1,
                    total: image.len() as u64,
                    offset,
                });
                p.extend_from_slice(part);
                push(msg::ModuleLoadPart::OPCODE, p);
            }
            push(
                msg::ModuleGetFunction::OPCODE,
                msg::encode(&msg::ModuleGetFunction {
                    ctx: 1,
                    module: 2,
                    name: "k".into(),
                }),
            );
            v
        }
        "session" | "session_ring" => vec![session_seed()],
        "ptx" => {
            // The kernel corpus, the conformance suite's own kernels (textures and surfaces
            // among them) and the interpreter's nvcc fixtures (warp matrices, mipmapped and
            // cube map textures among them).
            let mut v = read_dir("tests/kernels/ptx", "ptx");
            v.extend(read_dir("tests/gpu/kernels", "ptx"));
            v.extend(read_dir("devices/ptx/fixtures", "ptx"));
            v.extend(read_dir("devices/ptx/fixtures/texture", "ptx"));
            v
        }
        "fatbin" => {
            let mut v = read_dir("devices/cuda/testdata", "cubin");
            let ptx = read_dir("tests/kernels/ptx", "ptx");
            for text in ptx.iter().take(4) {
                v.push(vgpu_fatbin::write(&[vgpu_fatbin::NewEntry {
                    kind: vgpu_fatbin::KIND_PTX,
                    arch: 52,
                    flags: 0,
                    payload: text,
                    uncompressed_len: 0,
                }]));
                // The same zstd-compressed, as CUDA 13's libraries store their entries.
                let frame = ruzstd::encoding::compress_to_vec(
                    &text[..],
                    ruzstd::encoding::CompressionLevel::Fastest,
                );
                v.push(vgpu_fatbin::write(&[vgpu_fatbin::NewEntry {
                    kind: vgpu_fatbin::KIND_PTX,
                    arch: 52,
                    flags: vgpu_fatbin::FLAG_ZSTD,
                    payload: &frame,
                    uncompressed_len: text.len() as u64,
                }]));
            }
            v
        }
        "config" => read_dir("examples", "toml"),
        "vsock_chain" | "vgpu_chain" => {
            // Two descriptors: a readable header then a writable reply.
            let mut one = vec![1u8];
            for (addr, len, flags, next) in [
                (PAYLOAD_ADDR as u32, 64u32, VRING_DESC_F_NEXT as u16, 1u16),
                (
                    PAYLOAD_ADDR as u32 + 0x1000,
                    4096,
                    VRING_DESC_F_WRITE as u16,
                    0,
                ),
            ] {
                one.extend_from_slice(&addr.to_le_bytes());
                one.extend_from_slice(&len.to_le_bytes());
                one.extend_from_slice(&flags.to_le_bytes());
                one.extend_from_slice(&next.to_le_bytes());
            }
            one.extend_from_slice(&[0u8; 64]);
            vec![one]
        }
        _ => Vec::new(),
    }
}

/// A session that allocates, copies 64 KiB in and out and leaves: the handles and the address
/// are those a fresh session gets (its first context, the device's first allocation).
fn session_seed() -> Vec<u8> {
    use vgpu_proto::msg::{self, Op};
    const FIRST_CONTEXT: u64 = (0x4C << 40) | (1 << 16);
    const FIRST_GRAPH_EXEC: u64 = (0x67 << 40) | (1 << 16);
    const COPY: usize = 64 << 10;
    let mut s = Vec::new();
    let mut push = |opcode: u16, flags: u16, payload: Vec<u8>| {
        let _ = vgpu_proto::frame::write_frame(&mut s, opcode, flags, 1, 0, &[&payload]);
    };
    push(
        msg::Hello::OPCODE,
        0,
        msg::encode(&msg::Hello {
            protocol_version: vgpu_proto::PROTOCOL_VERSION,
            pid: 1,
            shim_version: vgpu_proto::VERSION.into(),
            process_name: "seed".into(),
        }),
    );
    push(
        msg::CtxCreate::OPCODE,
        0,
        msg::encode(&msg::CtxCreate {
            device: 0,
            flags: 0,
        }),
    );
    push(
        msg::MemAlloc::OPCODE,
        0,
        msg::encode(&msg::MemAlloc {
            ctx: FIRST_CONTEXT,
            size: COPY as u64,
        }),
    );
    let htod = msg::MemcpyHtoD {
        ctx: FIRST_CONTEXT,
        stream: 0,
        dst: vgpu_broker::testutils::MEM_DEVICE_BASE,
    };
    let mut copy = msg::encode(&htod);
    copy.extend((0..COPY).map(|i| i as u8));
    push(msg::MemcpyHtoD::OPCODE, 0, copy.clone());
    push(msg::MemcpyHtoD::OPCODE, vgpu_proto::frame::FLAG_ASYNC, copy);
    push(
        msg::MemcpyDtoH::OPCODE,
        0,
        msg::encode(&msg::MemcpyDtoH {
            ctx: FIRST_CONTEXT,
            stream: 0,
            src: vgpu_broker::testutils::MEM_DEVICE_BASE,
            len: COPY as u64,
        }),
    );
    // Stream memory operations: a write, a wait it meets, and a 64-bit wait met at once.
    let mem_op = |op, flags, addr, value| {
        msg::encode(&msg::StreamMemOp {
            ctx: FIRST_CONTEXT,
            stream: 0,
            op,
            flags,
            addr,
            value,
        })
    };
    let word = vgpu_broker::testutils::MEM_DEVICE_BASE;
    push(
        msg::StreamMemOp::OPCODE,
        vgpu_proto::frame::FLAG_ASYNC,
        mem_op(2, 0, word, 0x0302_0100),
    );
    push(msg::StreamMemOp::OPCODE, 0, mem_op(1, 1, word, 0x0302_0100));
    push(msg::StreamMemOp::OPCODE, 0, mem_op(4, 0, word + 8, 0));
    push(
        msg::CtxSynchronize::OPCODE,
        0,
        msg::encode(&msg::CtxSynchronize { ctx: FIRST_CONTEXT }),
    );
    // A texture object over the copied bytes (64 rows of 256 four-byte texels), destroyed, and
    // a surface object left for the session's end.
    let texels = msg::TexObjectCreate {
        ctx: FIRST_CONTEXT,
        base: vgpu_broker::testutils::MEM_DEVICE_BASE,
        format: vgpu_broker::texture::format::U8,
        channels: 4,
        dims: 2,
        width: 256,
        height: 64,
        depth: 1,
        pitch: 1024,
        slice_pitch: COPY as u64,
        address_0: 1,
        address_1: 1,
        ..Default::default()
    };
    push(msg::TexObjectCreate::OPCODE, 0, msg::encode(&texels));
    // A mipmapped texture of four levels (64x64 bytes down to 8x8) over the same bytes, left for
    // the session's end.
    push(
        msg::TexObjectCreateMipmapped::OPCODE,
        0,
        msg::encode(&msg::TexObjectCreateMipmapped {
            ctx: FIRST_CONTEXT,
            base: vgpu_broker::testutils::MEM_DEVICE_BASE,
            format: vgpu_broker::texture::format::U8,
            channels: 1,
            dims: 2,
            width: 64,
            height: 64,
            depth: 1,
            levels: 4,
            pitch_align: 32,
            level_align: 512,
            max_level_clamp: 3.0,
            ..Default::default()
        }),
    );
    push(
        msg::TexObjectDestroy::OPCODE,
        0,
        msg::encode(&msg::TexObjectDestroy {
            ctx: FIRST_CONTEXT,
            handle: 1,
        }),
    );
    push(
        msg::SurfObjectCreate::OPCODE,
        0,
        msg::encode(&msg::SurfObjectCreate {
            ctx: FIRST_CONTEXT,
            base: texels.base,
            format: texels.format,
            channels: texels.channels,
            dims: texels.dims,
            width: texels.width,
            height: texels.height,
            depth: 1,
            layers: 0,
            pitch: texels.pitch,
            slice_pitch: texels.slice_pitch,
        }),
    );
    // A graph with a conditional node (an if, true by default) whose body fills a word, and
    // its launch.
    let mut body = Vec::new();
    vgpu_proto::graph::push_op(
        &mut body,
        &msg::Memset {
            ctx: FIRST_CONTEXT,
            stream: 0,
            dst: word + 16,
            value: 7,
            elem_size: 4,
            count: 1,
        },
        &[],
    );
    let mut bodies = Vec::new();
    vgpu_proto::graph::push_body(&mut bodies, &body);
    let mut nodes = Vec::new();
    vgpu_proto::graph::push_node(
        &mut nodes,
        vgpu_proto::graph::CONDITIONAL_NODE,
        &msg::GraphConditionalNode {
            handle: 0x6770_0000_1000,
            kind: vgpu_proto::graph::conditional::IF,
            bodies: 1,
            default: 1,
            flags: vgpu_proto::graph::conditional::ASSIGN_DEFAULT,
        },
        &bodies,
    );
    let mut instantiate = msg::encode(&msg::GraphInstantiate {
        ctx: FIRST_CONTEXT,
        replace: 0,
    });
    instantiate.extend_from_slice(&nodes);
    push(msg::GraphInstantiate::OPCODE, 0, instantiate);
    push(
        msg::GraphLaunch::OPCODE,
        0,
        msg::encode(&msg::GraphLaunch {
            ctx: FIRST_CONTEXT,
            stream: 0,
            exec: FIRST_GRAPH_EXEC,
        }),
    );
    push(msg::Goodbye::OPCODE, 0, Vec::new());
    s
}

/// A small deterministic pseudo-random generator (xorshift64*), so that the
/// mutation runs of the tests repeat exactly.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (0 is replaced).
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// One mutation of `input`, as libFuzzer's basic mutators do: flip bits,
/// set bytes to interesting values, insert, erase, duplicate a block, or
/// splice with `other`.
pub fn mutate(input: &[u8], other: &[u8], rng: &mut Rng) -> Vec<u8> {
    const INTERESTING: [u8; 8] = [0, 1, 0x7f, 0x80, 0xff, b'.', b'{', b';'];
    let mut v = input.to_vec();
    for _ in 0..=rng.below(4) {
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let i = rng.below(v.len() + 1);
                v.insert(i, rng.next_u64() as u8);
            }
            3 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = rng.below(v.len() - i).min(64) + 1;
                v.drain(i..(i + n).min(v.len()));
            }
            4 if !v.is_empty() && v.len() < (1 << 20) => {
                let i = rng.below(v.len());
                let n = rng.below(v.len() - i).min(256) + 1;
                let block: Vec<u8> = v[i..(i + n).min(v.len())].to_vec();
                let at = rng.below(v.len() + 1);
                v.splice(at..at, block);
            }
            5 if !other.is_empty() => {
                let cut = rng.below(v.len() + 1);
                let from = rng.below(other.len());
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            _ => {
                // A 4-byte little-endian field set to an extreme value.
                if v.len() >= 4 {
                    let i = rng.below(v.len() - 3);
                    let x: u32 = [0, 1, u32::MAX, 0x8000_0000, 0x7fff_ffff][rng.below(5)];
                    v[i..i + 4].copy_from_slice(&x.to_le_bytes());
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    #[test]
    fn the_session_seed_is_served_whole_on_a_ring() {
        // A VM of its own: the seed's handles are those of a broker's first session.
        let vm = super::new_fuzz_vm();
        super::serve_on_a_ring(&vm, &super::session_seed());
        let s = &vm.1.stats;
        assert_eq!(
            (
                s.bytes_htod.load(Ordering::Relaxed),
                s.bytes_dtoh.load(Ordering::Relaxed)
            ),
            (2 << 16, 1 << 16),
            "both 64 KiB copies in, one out, through the ring in 977-byte packets"
        );
        assert_eq!(
            s.errors.load(Ordering::Relaxed),
            0,
            "every call of the seed succeeds (its stream memory waits are met)"
        );
    }

    #[test]
    fn the_session_seed_reaches_the_copies_in_place() {
        let (_, tenant) = super::fuzz_vm();
        let s = &tenant.stats;
        let before = (
            s.bytes_htod.load(Ordering::Relaxed),
            s.bytes_dtoh.load(Ordering::Relaxed),
        );
        super::session(&super::session_seed());
        let after = (
            s.bytes_htod.load(Ordering::Relaxed),
            s.bytes_dtoh.load(Ordering::Relaxed),
        );
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (2 << 16, 1 << 16),
            "both 64 KiB copies in, one out: the seed's handles and address are a fresh session's"
        );
    }
}
