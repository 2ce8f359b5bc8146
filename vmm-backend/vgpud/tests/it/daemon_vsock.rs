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
use vgpu_proto::msg;
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
