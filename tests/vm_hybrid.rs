//! cloud-hypervisor's hybrid vsock (`--vsock cid=N,socket=PATH`) connects a
//! guest's connection to host port P to the unix socket `PATH_P` (Firecracker's
//! convention, cloud-hypervisor docs/vsock.md "Connecting from Guest to
//! Host"). So a VM whose `unix_socket` is `PATH_22087` is reachable from such a
//! guest at the GPU port, with the stock shim and no vhost-user device. This
//! test stands in for cloud-hypervisor: for each guest connection it opens
//! `PATH_<port>` exactly as cloud-hypervisor's muxer does and relays the bytes
//! both ways; real CUDA programs (the guest test program, through the shim)
//! run through it.
//!
//! No QEMU needed; docs/attach.md documents the setup.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;

use vgpu_tests::harness::{Vgpud, artifacts, guest_cuda_program, ptx};

const MIB: u64 = 1 << 20;
const SLICE_MIB: u64 = 64;
const SAXPY_ROUNDS: u64 = 3;

/// The socket cloud-hypervisor connects to when its guest connects to host
/// (CID 2) port `port`: `<socket>_<port>`.
fn hybrid_port_path(socket: &Path, port: u32) -> PathBuf {
    PathBuf::from(format!("{}_{port}", socket.display()))
}

/// Copies one direction until end of file, then passes the end on.
fn pump(mut from: UnixStream, mut to: UnixStream) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Stands in for cloud-hypervisor with `--vsock cid=…,socket=<socket>`: each
/// connection accepted on `guest_side` is a guest connecting to host port
/// `port`; it is joined to a fresh connection to `<socket>_<port>`, or
/// dropped (the guest would get a reset) when nothing listens there.
fn hybrid_vsock(guest_side: UnixListener, socket: PathBuf, port: u32) {
    for guest in guest_side.incoming() {
        let Ok(guest) = guest else { return };
        let Ok(host) = UnixStream::connect(hybrid_port_path(&socket, port)) else {
            continue;
        };
        let (g2, h2) = (guest.try_clone(), host.try_clone());
        let (Ok(g2), Ok(h2)) = (g2, h2) else { continue };
        thread::spawn(move || pump(guest, host));
        thread::spawn(move || pump(h2, g2));
    }
}

/// Runs the guest test program on this host with `VGPU_TRANSPORT` at `socket`.
fn gpu_task(socket: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(guest_cuda_program("gpu-task"))
        .args(args)
        .env("VGPU_TRANSPORT", format!("unix:{}", socket.display()))
        .env("LD_LIBRARY_PATH", &artifacts().lib_dir)
        .output()
        .expect("running gpu-task");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_gpu_port_name_is_the_documented_one() {
    // docs/attach.md and docs/guest.md name the port; configs use it in paths.
    assert_eq!(vgpu_proto::GPU_VSOCK_PORT, 22087);
    assert_eq!(
        hybrid_port_path(Path::new("/run/vgpu/ch.vsock"), vgpu_proto::GPU_VSOCK_PORT),
        Path::new("/run/vgpu/ch.vsock_22087")
    );
}

#[test]
fn a_cloud_hypervisor_hybrid_vsock_guest_reaches_vgpud_at_socket_22087() {
    let port = vgpu_proto::GPU_VSOCK_PORT;
    let d = Vgpud::start_config(&format!(
        "[admin]\nsocket = \"@DIR@/admin.sock\"\n\n\
         [[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\nworkers = 2\n\n\
         # cloud-hypervisor --vsock cid=3,socket=@DIR@/ch.vsock: guest port {port} -> @DIR@/ch.vsock_{port}\n\
         [[vm]]\nname = \"ch\"\ndevice = \"gpu0\"\nmemory = \"{SLICE_MIB}MiB\"\n\
         unix_socket = \"@DIR@/ch.vsock_{port}\"\n"
    ));
    let ch_socket = d.dir().join("ch.vsock");
    assert!(hybrid_port_path(&ch_socket, port).exists());

    // The guest's AF_VSOCK connect(2, 22087), as cloud-hypervisor sees it.
    let guest_side = d.dir().join("guest-vsock-22087.sock");
    let listener = UnixListener::bind(&guest_side).expect("guest side");
    {
        let ch_socket = ch_socket.clone();
        thread::spawn(move || hybrid_vsock(listener, ch_socket, port));
    }

    let (code, out) = gpu_task(&guest_side, &["info"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!(
            "total={} free={}",
            SLICE_MIB * MIB,
            SLICE_MIB * MIB
        )),
        "the guest sees the VM's slice: {out}"
    );
    let (code, out) = gpu_task(&guest_side, &["alloc", "96", "2"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("result=2 CUDA_ERROR_OUT_OF_MEMORY"), "{out}");
    let saxpy = ptx("saxpy.sm_80.ptx");
    let rounds = SAXPY_ROUNDS.to_string();
    let (code, out) = gpu_task(
        &guest_side,
        &["saxpy", &saxpy.to_string_lossy(), "1024", &rounds],
    );
    assert_eq!(code, 0, "{out}\nvgpud log:\n{}", d.log());
    assert!(out.contains("GPU-TASK saxpy n=1024 rounds=3 ok"), "{out}");

    let v = d.wait_vm(
        "ch",
        "sessions ended",
        std::time::Duration::from_secs(20),
        |v| v["sessions"].as_array().is_some_and(Vec::is_empty),
    );
    assert_eq!(v["stats"]["sessions_total"], 3, "{v:#}");
    assert_eq!(v["stats"]["kernels"], SAXPY_ROUNDS, "{v:#}");
    assert_eq!(v["memory_used"], 0, "{v:#}");
    assert_eq!(v["memory_limit"], SLICE_MIB * MIB, "{v:#}");

    // Any other port has no listener: cloud-hypervisor's connect fails and
    // the guest's connection is reset.
    let err = UnixStream::connect(hybrid_port_path(&ch_socket, port + 1))
        .expect_err("nothing listens on another port");
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
        ),
        "{err}"
    );
}
