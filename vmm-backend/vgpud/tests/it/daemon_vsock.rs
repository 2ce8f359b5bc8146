//! vgpud's vsock devices end to end, with the in-process vhost-user
//! frontend acting as QEMU and the guest driver: GPU-port connections become
//! sessions of the VM whose device they came through, other ports are
//! forwarded, and a VMM disconnect releases everything the VM's sessions held.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::{Duration, Instant};

use vgpu_broker::testutils::TestClient;
use vgpu_config::Config;
use vgpu_proto::frame::{self, FLAG_ASYNC};
use vgpu_proto::msg::{self, Message, Op};
use vgpu_vmm_testutils::vsock::{GuestOptions, GuestStream, TestGuest};
use vgpud::Daemon;

const MIB: u64 = 1 << 20;

fn daemon(dir: &Path) -> Daemon {
    let d = dir.display();
    let cfg = format!(
        "[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\nworkers = 1\n\n\
         [[vm]]\nname = \"vm1\"\nmemory = \"64MiB\"\nvhost_user_socket = \"{d}/vm1.vhost\"\nguest_cid = 3\n\n\
         [[vm]]\nname = \"vm2\"\nmemory = \"32MiB\"\nvhost_user_socket = \"{d}/vm2.vhost\"\nguest_cid = 4\n"
    );
    let config = Config::parse(&dir.join("vgpud.toml"), &cfg).unwrap();
    assert_eq!(
        config.vms[0].vsock_uds_path.as_deref(),
        Some(dir.join("vm1.vsock").as_path())
    );
    Daemon::start(&config).unwrap()
}

fn session(guest: &TestGuest) -> TestClient<GuestStream> {
    let s = guest.connect(vgpu_proto::GPU_VSOCK_PORT).unwrap();
    TestClient::new(s)
}

fn wait_used(d: &Daemon, vm: &str, want: u64) {
    let t = d.broker().tenant(vm).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.slice.used() != want {
        assert!(
            Instant::now() < deadline,
            "{vm} still uses {}",
            t.slice.used()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_gpu_port_serves_the_vm_that_owns_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let g1 = TestGuest::start(&dir.path().join("vm1.vhost"), GuestOptions::default()).unwrap();
    let g2 = TestGuest::start(&dir.path().join("vm2.vhost"), GuestOptions::default()).unwrap();
    assert_eq!((g1.cid(), g2.cid()), (3, 4));

    let mut c1 = session(&g1);
    assert_eq!(c1.hello().unwrap().tenant, "vm1");
    let mut c2 = session(&g2);
    assert_eq!(c2.hello().unwrap().tenant, "vm2");

    let ctx = c1
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
    let p = c1
        .call(&msg::MemAlloc { ctx, size: 8 * MIB }, &[])
        .unwrap()
        .0
        .ptr;
    let data: Vec<u8> = (0..MIB as usize).map(|i| (i % 253) as u8).collect();
    c1.call(
        &msg::MemcpyHtoD {
            ctx,
            stream: 0,
            dst: p,
        },
        &data,
    )
    .unwrap();
    let (_, back) = c1
        .call(
            &msg::MemcpyDtoH {
                ctx,
                stream: 0,
                src: p,
                len: MIB,
            },
            &[],
        )
        .unwrap();
    assert_eq!(back, data);
    // Slices are per VM: vm2 cannot exceed its 32 MiB, vm1's use is its own.
    let ctx2 = c2
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
    assert_eq!(
        c2.call(
            &msg::MemAlloc {
                ctx: ctx2,
                size: 33 * MIB
            },
            &[]
        )
        .unwrap_err()
        .0,
        2
    );
    assert_eq!(d.broker().tenant("vm1").unwrap().slice.used(), 8 * MIB);
    let info = d.broker().tenant("vm1").unwrap().sessions();
    assert_eq!(info[0].transport, "vsock:3");

    // The VMM goes away (QEMU killed): vm1's sessions end and free their memory.
    drop(c1);
    g1.disconnect();
    wait_used(&d, "vm1", 0);
    assert!(d.broker().tenant("vm1").unwrap().sessions().is_empty());
    // vm2 is unaffected.
    c2.call(
        &msg::MemAlloc {
            ctx: ctx2,
            size: MIB,
        },
        &[],
    )
    .unwrap();
    // The VM comes back (QEMU restarted) and works again.
    let g1 = TestGuest::start(&dir.path().join("vm1.vhost"), GuestOptions::default()).unwrap();
    let mut c1 = session(&g1);
    c1.hello().unwrap();
    let ctx = c1
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
    c1.call(
        &msg::MemAlloc {
            ctx,
            size: 64 * MIB,
        },
        &[],
    )
    .unwrap();
    d.shutdown();
}

#[test]
fn other_ports_are_forwarded_to_the_vms_unix_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let l = UnixListener::bind(dir.path().join("vm1.vsock_9000")).unwrap();
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b).unwrap();
    });
    let g = TestGuest::start(&dir.path().join("vm1.vhost"), GuestOptions::default()).unwrap();
    let s = g.connect(9000).unwrap();
    s.write_all(b"hello").unwrap();
    let mut b = [0u8; 5];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello");
    echo.join().unwrap();
    // A port nobody serves is refused, not hung.
    assert!(g.connect_timeout(9001, Duration::from_secs(5)).is_err());
    d.shutdown();
}

fn context(c: &mut TestClient<GuestStream>) -> u64 {
    c.call(
        &msg::CtxCreate {
            device: 0,
            flags: 0,
        },
        &[],
    )
    .unwrap()
    .0
    .handle
}

/// Copies many times the size of the in-process rings and of the guest's credit: each request
/// frame is split across hundreds of vsock packets, each reply is larger than the ring the
/// session writes it into.
#[test]
fn frames_far_larger_than_the_in_process_rings_cross_the_gpu_port_intact() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let g = TestGuest::start(&dir.path().join("vm1.vhost"), GuestOptions::default()).unwrap();
    let mut c = session(&g);
    c.hello().unwrap();
    let ctx = context(&mut c);
    // The largest device-to-host request the protocol allows.
    let size = 4 * MIB;
    assert!(size as usize > 8 * vgpu_vhost_vsock::inproc::DEFAULT_RING_CAPACITY);
    let p = c.call(&msg::MemAlloc { ctx, size }, &[]).unwrap().0.ptr;
    let data: Vec<u8> = (0..size as usize).map(|i| (i * 31 % 251) as u8).collect();
    for _ in 0..2 {
        c.call(
            &msg::MemcpyHtoD {
                ctx,
                stream: 0,
                dst: p,
            },
            &data,
        )
        .unwrap();
        let (_, back) = c
            .call(
                &msg::MemcpyDtoH {
                    ctx,
                    stream: 0,
                    src: p,
                    len: size,
                },
                &[],
            )
            .unwrap();
        assert!(back == data, "the copy came back changed");
    }
    // Small calls still work after the large ones.
    c.call(&msg::CtxSynchronize { ctx }, &[]).unwrap();
    d.shutdown();
}

/// A guest that resets its connection while the session is in the middle of reading a large
/// frame: the session ends at once and frees its memory; the VM's next session works.
#[test]
fn a_reset_in_the_middle_of_a_large_frame_ends_the_session_and_frees_its_memory() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let g = TestGuest::start(&dir.path().join("vm1.vhost"), GuestOptions::default()).unwrap();
    let (c, ctx, p) = with_memory(&g, 8 * MIB);
    assert_eq!(d.broker().tenant("vm1").unwrap().slice.used(), 8 * MIB);
    // A 7 MiB MemcpyHtoD frame (within MAX_PAYLOAD) of which only 3 MiB arrive.
    let frame = htod_frame(ctx, p, 0, 99, &vec![0x5au8; 7 * MIB as usize]);
    c.stream.write_all(&frame[..3 * MIB as usize]).unwrap();
    // Dropping the guest socket sends an RST.
    drop(c);
    wait_used(&d, "vm1", 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.broker().tenant("vm1").unwrap().sessions().is_empty() {
        assert!(Instant::now() < deadline, "the session outlived the reset");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut c = session(&g);
    c.hello().unwrap();
    let ctx = context(&mut c);
    c.call(&msg::MemAlloc { ctx, size: 8 * MIB }, &[]).unwrap();
    d.shutdown();
}

/// A whole `MemcpyHtoD` frame of `body` to `dst` on the legacy stream.
fn htod_frame(ctx: u64, dst: u64, flags: u16, call_id: u64, body: &[u8]) -> Vec<u8> {
    let mut fields = Vec::new();
    msg::MemcpyHtoD {
        ctx,
        stream: 0,
        dst,
    }
    .encode(&mut fields);
    let mut frame = Vec::new();
    frame::write_frame(
        &mut frame,
        <msg::MemcpyHtoD as Op>::OPCODE,
        flags,
        call_id,
        0,
        &[&fields, body],
    )
    .unwrap();
    frame
}

/// A session of `g`'s VM with a context and 1 MiB of device memory: the client, the context, the
/// memory's address.
fn with_a_mib(g: &TestGuest) -> (TestClient<GuestStream>, u64, u64) {
    with_memory(g, MIB)
}

/// A session of `g`'s VM with a context and `size` bytes of device memory.
fn with_memory(g: &TestGuest, size: u64) -> (TestClient<GuestStream>, u64, u64) {
    let mut c = session(g);
    c.hello().unwrap();
    let ctx = context(&mut c);
    let p = c.call(&msg::MemAlloc { ctx, size }, &[]).unwrap().0.ptr;
    (c, ctx, p)
}

fn read_back(c: &mut TestClient<GuestStream>, ctx: u64, src: u64, len: usize) -> Vec<u8> {
    let req = msg::MemcpyDtoH {
        ctx,
        stream: 0,
        src,
        len: len as u64,
    };
    c.call(&req, &[]).unwrap().1
}

fn calls_on_device_thread(d: &Daemon) -> u64 {
    d.runtime()
        .vsock_of("vm1")
        .unwrap()
        .1
        .calls_on_device_thread
}

/// Runs `round` (given its number) up to `rounds` times, until vm1's device thread answered a
/// call itself, which it does only while the session thread is idle: a loaded machine may keep it
/// busy for a while. Fails saying `none` if it never did.
fn until_on_device_thread(d: &Daemon, rounds: usize, none: &str, mut round: impl FnMut(usize)) {
    let before = calls_on_device_thread(d);
    for i in 0..rounds {
        round(i);
        if calls_on_device_thread(d) > before {
            return;
        }
    }
    panic!("{none}");
}

/// The bytes of a large host-to-device copy that arrive while the session thread waits for
/// them go from the guest's tx descriptors to device memory on the device thread (no ring in
/// between, `bytes_lent_in_place`), whole and in order.
#[test]
fn copy_bytes_go_from_descriptors_to_device_memory() {
    const LEN: usize = 4 << 20;
    const HEAD: usize = 4096;
    const ROUNDS: u8 = 20;
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let g = TestGuest::start(&dir.path().join("vm1.vhost"), GuestOptions::default()).unwrap();
    let (mut c, ctx, p) = with_memory(&g, LEN as u64);
    let lent = || d.runtime().vsock_of("vm1").unwrap().1.bytes_lent_in_place;
    // Each round posts a copy whose first bytes arrive before the rest, so that the session
    // thread waits for the rest; a loaded machine may deliver them all first, hence the rounds.
    for round in 0..ROUNDS {
        let body: Vec<u8> = (0..LEN).map(|i| (i % 249) as u8 ^ round).collect();
        let frame = htod_frame(ctx, p, FLAG_ASYNC, 1000 + u64::from(round), &body);
        c.stream.write_all(&frame[..HEAD]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        c.stream.write_all(&frame[HEAD..]).unwrap();
        assert!(read_back(&mut c, ctx, p, LEN) == body, "round {round}");
        if lent() > 0 {
            break;
        }
    }
    let lent = lent();
    assert!(
        lent > 0 && lent <= u64::from(ROUNDS) * LEN as u64,
        "{lent} bytes lent in place"
    );
    d.shutdown();
}

/// The bytes of a device-to-host copy of 64 KiB or more that the session thread serves go from
/// device memory straight into the guest's rx buffers on the device thread (no reply buffer, no
/// ring, `bytes_filled_in_place`), whole and in order; smaller ones, and those the device thread
/// answers itself (an idle session, a reply that fits the ring; the bytes of those of 64 KiB or more
/// go from device memory straight into the ring), go through the ring. A copy that fails its
/// checks gets its error, and the session goes on.
#[test]
fn copy_bytes_go_from_device_memory_to_rx_buffers() {
    const LEN: usize = 4 << 20;
    const IN_PLACE: usize = 64 << 10;
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let g = TestGuest::start(&dir.path().join("vm1.vhost"), GuestOptions::default()).unwrap();
    let (mut c, ctx, p) = with_memory(&g, LEN as u64);
    let body: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    c.call(
        &msg::MemcpyHtoD {
            ctx,
            stream: 0,
            dst: p,
        },
        &body,
    )
    .unwrap();
    let filled = || d.runtime().vsock_of("vm1").unwrap().1.bytes_filled_in_place;
    let before = filled();
    // Replies larger than the ring towards the device (1 MiB) are always the session thread's.
    let (mut larger_than_ring, mut in_place) = (0, 0);
    for (at, len) in [
        (0, LEN),
        (7, (1 << 20) + 13),
        (4096, IN_PLACE),
        (100, IN_PLACE - 1),
        (LEN - 3, 3),
    ] {
        let back = read_back(&mut c, ctx, p + at as u64, len);
        assert!(back == body[at..at + len], "{len} bytes from {at}");
        if len >= IN_PLACE {
            in_place += len as u64;
        }
        if len > 1 << 20 {
            larger_than_ring += len as u64;
        }
    }
    let filled = filled() - before;
    assert!(
        (larger_than_ring..=in_place).contains(&filled),
        "{filled} bytes went in place: the large copies', not the small ones'"
    );
    // A copy that fits the ring, of an idle session, the device thread answers itself, its
    // bytes read from device memory straight into the ring: whole and in order too. A loaded
    // machine may leave the session thread busy when a copy arrives, hence the rounds.
    until_on_device_thread(
        &d,
        50,
        "no copy was answered on the device thread",
        |round| {
            let at = 4096 * round;
            let back = read_back(&mut c, ctx, p + at as u64, 256 << 10);
            assert!(back == body[at..at + (256 << 10)], "round {round}");
        },
    );
    // Past the allocation's end: larger than the ring (the session thread's), and not.
    for len in [1 << 20, 256 << 10] {
        let (code, message) = c
            .call(
                &msg::MemcpyDtoH {
                    ctx,
                    stream: 0,
                    src: p + LEN as u64 - 4096,
                    len,
                },
                &[],
            )
            .unwrap_err();
        assert_eq!(
            code,
            vgpu_proto::cuda::CUDA_ERROR_INVALID_VALUE,
            "{len} bytes: {message}"
        );
    }
    assert!(read_back(&mut c, ctx, p, IN_PLACE) == body[..IN_PLACE]);
    d.shutdown();
}

/// Quick calls of an idle session are answered by the device thread itself, not handed to the
/// session's thread; the replies are the same and come in order, behind posted work too.
#[test]
fn the_device_thread_answers_quick_calls_in_order() {
    const ROUNDS: usize = 200;
    const CHUNK: usize = 4096;
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let g = TestGuest::start(&dir.path().join("vm1.vhost"), GuestOptions::default()).unwrap();
    let (mut c, ctx, p) = with_a_mib(&g);
    let before = calls_on_device_thread(&d);
    for round in 0..ROUNDS {
        c.call(&msg::CtxSynchronize { ctx }, &[]).unwrap();
        let data: Vec<u8> = (0..CHUNK).map(|i| (i * 7 + round) as u8).collect();
        let dst = p + (round * CHUNK) as u64 % MIB;
        c.call(
            &msg::MemcpyHtoD {
                ctx,
                stream: 0,
                dst,
            },
            &data,
        )
        .unwrap();
        let back = read_back(&mut c, ctx, dst, CHUNK);
        assert!(back == data, "round {round}: the copy came back changed");
        // A posted memset, then a read right behind it: the read sees the memset.
        c.post(
            &msg::Memset {
                ctx,
                stream: 0,
                dst,
                value: round as u32 % 251,
                elem_size: 1,
                count: CHUNK as u64,
            },
            &[],
        )
        .unwrap();
        let back = read_back(&mut c, ctx, dst, CHUNK);
        assert!(
            back.iter().all(|&b| u32::from(b) == round as u32 % 251),
            "round {round}: the read did not see the memset before it"
        );
    }
    // A forged context gets the same error wherever it is answered.
    let (code, _) = c
        .call(
            &msg::CtxSynchronize {
                ctx: ctx ^ 0xdead_0000,
            },
            &[],
        )
        .unwrap_err();
    assert_eq!(code, vgpu_proto::cuda::CUDA_ERROR_INVALID_CONTEXT);
    c.call(&msg::CtxSynchronize { ctx }, &[]).unwrap();
    let here = calls_on_device_thread(&d) - before;
    assert!(here >= 1, "no call was answered on the device thread");
    assert!(
        here <= 4 * ROUNDS as u64 + 2,
        "{here} calls answered on the device thread, more than were quick"
    );
    let requests = d.broker().tenant("vm1").unwrap().sessions();
    assert_eq!(requests.len(), 1);
    drop(c);
    wait_used(&d, "vm1", 0);
    d.shutdown();
}

/// A guest that pipelines thousands of frames in one write, split over packets wherever the
/// guest's driver cuts them: quick calls, failing ones and posted ones interleaved. Every
/// synchronous one is answered, in order, with its own status, and the posted work is done
/// before the calls behind it; another VM is served meanwhile. Frames run on the device thread
/// whenever the session thread is idle as they arrive; on a loaded host a flood may keep it busy
/// throughout, so the flood is sent again (each time checked) until some ran there.
#[test]
fn pipelined_frames_are_answered_in_order_wherever_they_run() {
    const FLOODS: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let g = TestGuest::start(&dir.path().join("vm1.vhost"), GuestOptions::default()).unwrap();
    let g2 = TestGuest::start(&dir.path().join("vm2.vhost"), GuestOptions::default()).unwrap();
    let (mut c, ctx, p) = with_a_mib(&g);
    let mut c2 = session(&g2);
    c2.hello().unwrap();
    let ctx2 = context(&mut c2);
    let none = format!("no frame of {FLOODS} floods ran on the device thread");
    until_on_device_thread(&d, FLOODS, &none, |_| {
        flood_and_check(&mut c, ctx, p, || {
            // The other VM is served while vm1's flood is answered.
            c2.call(&msg::CtxSynchronize { ctx: ctx2 }, &[]).unwrap();
        });
    });
    drop(c);
    wait_used(&d, "vm1", 0);
    d.shutdown();
}

/// Writes 5000 frames in one go (see `pipelined_frames_are_answered_in_order_wherever_they_run`),
/// runs `meanwhile`, then checks every reply and the posted work's result.
fn flood_and_check(c: &mut TestClient<GuestStream>, ctx: u64, p: u64, meanwhile: impl FnOnce()) {
    const FRAMES: u64 = 5000;
    const FORGED_EVERY: u64 = 7;
    const POSTED_EVERY: u64 = 13;
    const FIRST_ID: u64 = 1 << 20;
    let mut bytes = Vec::new();
    let mut expected = Vec::new();
    for i in 0..FRAMES {
        let id = FIRST_ID + i;
        let mut body = Vec::new();
        if i % POSTED_EVERY == 0 {
            msg::Memset {
                ctx,
                stream: 0,
                dst: p,
                value: (i % 251) as u32,
                elem_size: 1,
                count: MIB,
            }
            .encode(&mut body);
            frame::write_frame(&mut bytes, msg::Memset::OPCODE, FLAG_ASYNC, id, 0, &[&body])
                .unwrap();
            continue;
        }
        let forged = i % FORGED_EVERY == 0;
        let target = if forged { ctx ^ 0xdead_0000 } else { ctx };
        msg::CtxSynchronize { ctx: target }.encode(&mut body);
        frame::write_frame(&mut bytes, msg::CtxSynchronize::OPCODE, 0, id, 0, &[&body]).unwrap();
        let status = if forged {
            vgpu_proto::cuda::CUDA_ERROR_INVALID_CONTEXT
        } else {
            0
        };
        expected.push((id, status));
    }
    c.stream.write_all(&bytes).unwrap();
    c.stream.flush().unwrap();
    meanwhile();
    let mut payload = Vec::new();
    for &(id, status) in &expected {
        let h = frame::read_frame(&mut c.stream, &mut payload).unwrap();
        assert!(h.is_reply(), "{h:?}");
        assert_eq!((h.call_id, h.status), (id, status), "replies out of order");
    }
    // The last posted memset ran before the read behind it.
    let last = (FRAMES - 1) / POSTED_EVERY * POSTED_EVERY;
    let back = read_back(c, ctx, p, 4096);
    assert!(back.iter().all(|&b| u64::from(b) == last % 251));
}

/// A process that floods quick calls and never reads their replies: its replies stop at its own
/// credit and ring, the device thread stops answering it, and another process of the same VM,
/// on the same device thread, is served meanwhile; the flood's replies all come, in order, once
/// it reads them.
#[test]
fn a_flood_of_unread_quick_calls_holds_up_no_other_connection() {
    const FRAMES: u64 = 60_000;
    const FIRST_ID: u64 = 1 << 20;
    const OTHER_CALLS: usize = 100;
    const PATIENCE: Duration = Duration::from_secs(20);
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let g = TestGuest::start(&dir.path().join("vm1.vhost"), GuestOptions::default()).unwrap();
    let (mut flood, ctx, _) = with_a_mib(&g);
    let (mut other, other_ctx, _) = with_a_mib(&g);
    let mut bytes = Vec::new();
    let mut body = Vec::new();
    msg::CtxSynchronize { ctx }.encode(&mut body);
    for i in 0..FRAMES {
        frame::write_frame(
            &mut bytes,
            msg::CtxSynchronize::OPCODE,
            0,
            FIRST_ID + i,
            0,
            &[&body],
        )
        .unwrap();
    }
    // More replies than the flooding connection's credit and ring hold.
    assert!(
        FRAMES as usize * frame::HEADER_LEN > 4 * vgpu_vhost_vsock::inproc::DEFAULT_RING_CAPACITY
    );
    flood.stream.write_all(&bytes).unwrap();
    flood.stream.flush().unwrap();
    let t = Instant::now();
    for _ in 0..OTHER_CALLS {
        other
            .call(&msg::CtxSynchronize { ctx: other_ctx }, &[])
            .unwrap();
    }
    assert!(
        t.elapsed() < PATIENCE,
        "the other connection waited {:?}",
        t.elapsed()
    );
    let mut payload = Vec::new();
    for i in 0..FRAMES {
        let h = frame::read_frame(&mut flood.stream, &mut payload).unwrap();
        assert_eq!(
            (h.call_id, h.status),
            (FIRST_ID + i, 0),
            "replies out of order"
        );
    }
    assert!(g.violations().is_empty(), "{:?}", g.violations());
    assert_eq!(d.runtime().vsock_of("vm1").unwrap().1.dropped_chains, 0);
    d.shutdown();
}
