//! Real Linux guests on the virtio-vgpu device: QEMU 11.1 (from a Debian trixie root,
//! `images/qemu11/build.sh`) presents vgpud's device with its generic
//! `vhost-user-test-device-pci`; the guest (Debian's cloud kernel) installs the shim and the
//! `vgpu` kernel module built against that kernel's headers
//! (`guest-shim/kmod/build-against-debian.sh`), and CUDA programs reach the GPU through
//! `/dev/vgpu0`, their buffers pinned and read or written in place by vgpud.
//!
//! Checked: the driver-API program, threads waiting in synchronizations beside working ones, and
//! a kernel workload, 64 MiB transfers byte for byte,
//! hostile ioctl input (no oops), two VMs with different slices, and a VM killed in the middle of
//! transfers (vgpud frees its memory; the other VM's transfers go on and come back intact), and a
//! VM paused (QMP `stop`) and continued in the middle of transfers (its session goes on), and a
//! guest rebooted in the middle of transfers (its old session ends, the next boot works), and
//! pinned buffers reaching the device as 2 MiB runs in a guest whose THP mode is `madvise`.
//!
//! Skips, with a printed reason, only when QEMU 11.1 cannot be obtained (no root to build the
//! trixie root, no network to the Debian mirror) or no QEMU at all runs here.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use vgpu_tests::harness::{Vgpud, artifacts, guest_cuda_program, ptx, workspace_root};
use vgpu_tests::qemu::{self, Guest, GuestImage, GuestSpec};

const GUEST_TIMEOUT: Duration = Duration::from_secs(300);
const RELEASE_TIMEOUT: Duration = Duration::from_secs(30);
const MIB: u64 = 1 << 20;
/// The device ID QEMU presents: its generic device accepts only IDs it has a name for, so the
/// VMs are configured with `vgpu_device_id = 21`, which the module binds (besides vgpud's
/// default 63).
const DEVICE_ID: u16 = vgpu_vhost_vgpu::QEMU_DEVICE_ID;
/// Queues and their size, and the config space size, as the device serves them.
const NUM_VQS: usize = 2;
const VQ_SIZE: u16 = 1024;
const CONFIG_SIZE: usize = 96;
/// Exit status of the script when the installer fails.
const INSTALL_FAILED: i32 = 90;
const C_FLAGS: &[&str] = &["-O2", "-g", "-Wall", "-Wextra", "-Werror", "-std=gnu11"];

/// What every test needs: QEMU 11.1, the image, the module for its kernel.
struct Kit {
    qemu: PathBuf,
    image: GuestImage,
    accel: qemu::Accel,
    kmod: PathBuf,
}

/// Builds (or finds) the kit once per process; `Err` is the reason to skip.
fn kit() -> Result<&'static Kit, String> {
    static KIT: OnceLock<Result<Kit, String>> = OnceLock::new();
    KIT.get_or_init(|| {
        if let Some(reason) = qemu::skip_reason() {
            return Err(format!("cannot boot QEMU guests here: {reason}"));
        }
        let qemu = qemu11()?;
        let image = qemu::ensure_image().map_err(|e| e.to_string())?;
        let accel = qemu::choose_accel(&qemu, &image).map_err(|e| e.to_string())?;
        let kmod = build_kmod(&image)?;
        Ok(Kit {
            qemu,
            image,
            accel,
            kmod,
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// QEMU ≥ 10.2 with the generic vhost-user device: `VGPU_QEMU11`, or QEMU 11.1 from
/// trixie-backports in a trixie root built by `images/qemu11/build.sh`.
/// The kit, or `None` after printing why the test is skipped.
fn kit_or_skip() -> Option<&'static Kit> {
    kit().map_err(|reason| println!("SKIPPED: {reason}")).ok()
}

fn qemu11() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("VGPU_QEMU11") {
        return Ok(PathBuf::from(p));
    }
    let script = workspace_root().join("images/qemu11/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--quiet")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "QEMU 11.1 could not be obtained with {} ({}): {}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(workspace_root().join("images/out/qemu11/qemu-system-x86_64"))
}

/// Exit status of `build-against-debian.sh` when the headers cannot be downloaded.
const KMOD_NO_HEADERS: i32 = 3;

/// The `vgpu` module built against the guest kernel's Debian headers; `Err` (a reason to skip)
/// only when the headers cannot be downloaded. A module that does not build fails the test.
fn build_kmod(image: &GuestImage) -> Result<PathBuf, String> {
    let release = &image.manifest.kernel_release;
    let version = image
        .manifest
        .value("kernel_package")
        .and_then(|p| p.split_whitespace().nth(1))
        .expect("the image manifest names its kernel package and version")
        .to_string();
    let out = workspace_root().join(format!("images/out/kmod/vgpu-{release}.ko"));
    let st = Command::new("bash")
        .arg(workspace_root().join("guest-shim/kmod/build-against-debian.sh"))
        .args([
            "--release",
            release,
            "--version",
            &version,
            "--quiet",
            "--out",
        ])
        .arg(&out)
        .status()
        .expect("running build-against-debian.sh");
    if st.code() == Some(KMOD_NO_HEADERS) {
        return Err(format!(
            "the headers of the guest kernel {release} cannot be downloaded (no Debian mirror)"
        ));
    }
    assert!(
        st.success(),
        "building the vgpu module for {release} failed"
    );
    Ok(out)
}

/// Guest programs: the C driver-API test, gpu-task, bigcopy, the ioctl test.
fn programs() -> Vec<PathBuf> {
    let lib = &artifacts().lib_dir;
    let kmod_tests = workspace_root().join("guest-shim/kmod/tests");
    let flags: Vec<OsString> = C_FLAGS.iter().map(OsString::from).collect();
    vec![
        qemu::build_guest_cuda_program(
            &workspace_root().join("tests/c/driver_api.c"),
            "driver_api",
            lib,
        )
        .expect("driver_api for guests"),
        qemu::build_guest_cuda_program(
            &workspace_root().join("tests/c/sync_threads.c"),
            "sync_threads",
            lib,
        )
        .expect("sync_threads for guests"),
        guest_cuda_program("gpu-task"),
        qemu::build_guest_cuda_program(&kmod_tests.join("bigcopy.c"), "bigcopy", lib)
            .expect("bigcopy for guests"),
        qemu::build_guest_program_from(
            &kmod_tests.join("vgpu_ioctl_test.c"),
            "vgpu_ioctl_test",
            &flags,
            &[],
        )
        .expect("vgpu_ioctl_test for guests"),
    ]
}

/// vgpud with one virtio-vgpu VM per `(name, slice MiB)`.
fn vgpud(vms: &[(&str, u64)]) -> Vgpud {
    let mut cfg = "[admin]\nsocket = \"@DIR@/admin.sock\"\n\n[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"2GiB\"\nworkers = 2\n".to_string();
    for (name, mib) in vms {
        cfg += &format!(
            "\n[[vm]]\nname = \"{name}\"\nmemory = \"{mib}MiB\"\nvhost_user_socket = \"@DIR@/{name}.vgpu.sock\"\ndevice_model = \"vgpu\"\nvgpu_device_id = {DEVICE_ID}\n"
        );
    }
    Vgpud::start_config(&cfg)
}

/// A guest on VM `vm`'s virtio-vgpu device: the shim bundle with the module, the test programs,
/// `files`; the script installs everything with install.sh, then runs `body`.
fn guest(
    d: &Vgpud,
    k: &Kit,
    vm: &str,
    name: &str,
    files: &[(PathBuf, &str)],
    body: &str,
) -> GuestSpec {
    let a = artifacts();
    let mut spec = GuestSpec::new(name, "");
    let install = spec.add_vgpu_shim(
        &a.profile_dir.join("libcuda.so"),
        &a.profile_dir.join("libnvidia_ml.so"),
        &a.vgpu_smi,
    );
    spec.payload
        .push((k.kmod.clone(), format!("{}/vgpu.ko", qemu::SHIM_BUNDLE_DIR)));
    for p in programs() {
        let file = p.file_name().unwrap().to_string_lossy().into_owned();
        spec.payload.push((p, format!("/payload/bin/{file}")));
    }
    for (host, guest) in files {
        spec.payload.push((host.clone(), (*guest).to_string()));
    }
    spec.extra_args = attach_args(d, vm);
    spec.script = format!(
        "{install} || {{ echo 'guest-shim/install.sh failed'; exit {INSTALL_FAILED}; }}\n\
         unset LD_LIBRARY_PATH\n{body}"
    );
    spec.timeout = GUEST_TIMEOUT;
    spec
}

/// The QEMU arguments that attach VM `vm`'s virtio-vgpu device, as `vgpuctl vm attach-args`
/// prints them (its `-chardev` and `-device`; the harness sets up the shared memory itself).
/// Checked against the device's own parameters first.
fn attach_args(d: &Vgpud, vm: &str) -> Vec<String> {
    let out = Command::new(&artifacts().vgpuctl)
        .arg("--socket")
        .arg(d.admin_socket())
        .args(["--json", "vm", "attach-args", vm, "--vmm", "qemu"])
        .output()
        .expect("running vgpuctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("attach-args JSON");
    let args: Vec<String> = v["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().unwrap_or_default().to_string())
        .collect();
    let socket = d.dir().join(format!("{vm}.vgpu.sock"));
    let want_device = format!(
        "vhost-user-test-device-pci,chardev=vgpu-dev-{vm},virtio-id={DEVICE_ID},num_vqs={NUM_VQS},vq_size={VQ_SIZE},config_size={CONFIG_SIZE}"
    );
    let mut picked = Vec::new();
    for pair in args.windows(2) {
        if pair[0] == "-chardev" {
            assert_eq!(
                pair[1],
                format!("socket,id=vgpu-dev-{vm},path={}", socket.display())
            );
            picked.extend_from_slice(pair);
        }
        if pair[0] == "-device" {
            assert_eq!(pair[1], want_device);
            picked.extend_from_slice(pair);
        }
    }
    assert_eq!(picked.len(), 4, "attach-args printed {args:?}");
    picked
}

fn boot(d: &Vgpud, k: &Kit, spec: &GuestSpec) -> Guest {
    d.guest_ok(Guest::boot_with(spec, &k.qemu, &k.image, k.accel), "boot")
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The guest's kernel log must not show an oops, a BUG or a warning splat.
fn assert_no_kernel_trouble(out: &str) {
    for bad in [
        "Oops",
        "BUG:",
        "WARNING:",
        "general protection",
        "Call Trace",
    ] {
        assert!(!out.contains(bad), "kernel trouble ({bad}) in:\n{out}");
    }
}

#[test]
fn a_guest_runs_cuda_programs_through_the_vgpu_device() {
    let Some(k) = kit_or_skip() else {
        return;
    };
    let d = vgpud(&[("vm1", 256)]);
    let body = "echo '== smi'\n\
                vgpu-smi || exit 81\n\
                echo '== driver_api'\n\
                driver_api basic > /tmp/basic.log 2>&1; echo \"driver_api status $?\"\n\
                grep -c '^ok ' /tmp/basic.log; grep FAIL /tmp/basic.log\n\
                echo '== latency'\n\
                driver_api latency 1000; echo \"latency polling status $?\"\n\
                echo 0 > /sys/module/vgpu/parameters/poll_us\n\
                driver_api latency 1000; echo \"latency sleeping status $?\"\n\
                echo 1000 > /sys/module/vgpu/parameters/poll_us\n\
                echo '== sync_threads'\n\
                sync_threads > /tmp/sync.log 2>&1; echo \"sync_threads status $?\"\n\
                grep -E 'FAIL|^#' /tmp/sync.log\n\
                echo '== saxpy'\n\
                gpu-task saxpy /payload/saxpy.ptx 4096 3; echo \"saxpy status $?\"\n\
                echo '== bigcopy'\n\
                bigcopy 64; echo \"bigcopy status $?\"\n\
                echo '== ioctl'\n\
                vgpu_ioctl_test; echo \"ioctl status $?\"\n\
                echo '== forced'\n\
                VGPU_TRANSPORT=dev:/dev/vgpu9 vgpu-smi; echo \"forced status $?\"\n\
                echo '== remove'\n\
                driver_api hold 1048576 > /tmp/hold.log 2>&1 &\n\
                HOLD=$!\n\
                for i in $(seq 200); do grep -q holding /tmp/hold.log && break; usleep 50000; done\n\
                rmmod vgpu 2>/dev/null; echo \"rmmod while open status $?\"\n\
                kill $HOLD; wait $HOLD\n\
                rmmod vgpu; echo \"rmmod status $?\"\n\
                [ -e /dev/vgpu0 ] && echo 'vgpu0 still there' || echo 'vgpu0 gone'\n\
                insmod /lib/modules/$(uname -r)/extra/vgpu.ko; echo \"insmod status $?\"\n\
                vgpu-smi | grep Transport\n\
                echo '== unbind'\n\
                driver_api hold 3145728 > /tmp/hold2.log 2>&1 &\n\
                HOLD=$!\n\
                for i in $(seq 200); do grep -q holding /tmp/hold2.log && break; usleep 50000; done\n\
                DEV=$(ls /sys/bus/virtio/drivers/vgpu | grep '^virtio' | head -n 1)\n\
                echo $DEV > /sys/bus/virtio/drivers/vgpu/unbind; echo \"unbind status $?\"\n\
                wait $HOLD; echo \"holder ended by the unbind: $?\"\n\
                echo $DEV > /sys/bus/virtio/drivers/vgpu/bind; echo \"bind status $?\"\n\
                vgpu-smi > /tmp/smi-after.txt; echo \"vgpu-smi after rebind status $?\"\n\
                echo \"sessions of the old driver left: $(grep -c driver_api /tmp/smi-after.txt)\"\n\
                echo '== module'\n\
                grep '^vgpu ' /proc/modules | cut -d' ' -f1,3\n\
                dmesg | grep -iE 'vgpu|oops|bug:|warning:|general protection|call trace'\n\
                echo '== end'\n";
    let spec = guest(
        &d,
        k,
        "vm1",
        "vgpu-dev-workload",
        &[(ptx("saxpy.sm_80.ptx"), "/payload/saxpy.ptx")],
        body,
    );
    let started = Instant::now();
    let mut g = boot(&d, k, &spec);
    let outcome = d.guest_ok(g.wait_exit(GUEST_TIMEOUT), "guest run");
    let out = outcome.output_text();
    assert_eq!(
        outcome.exit_code,
        0,
        "guest output:\n{out}\nvgpud log:\n{}",
        d.log()
    );
    let lines: Vec<String> = [
        "vgpu-install: installed: /lib/modules/".to_string(),
        "vgpu-install: loaded the vgpu kernel module".to_string(),
        "vgpu-install: virtio-vgpu device present: /dev/vgpu0".to_string(),
        format!("Transport: dev:/dev/vgpu0 (virtio-vgpu device, ID {DEVICE_ID})"),
        "256MiB".to_string(),
        "driver_api status 0".to_string(),
        // Synchronous calls work with the module polling for answers and with it sleeping.
        "latency polling status 0".to_string(),
        "latency sleeping status 0".to_string(),
        // Threads waiting in synchronizations do not stop the others (tests/c/sync_threads.c).
        "sync_threads status 0".to_string(),
        "GPU-TASK saxpy n=4096 rounds=3 ok".to_string(),
        "saxpy status 0".to_string(),
        "BIGCOPY round 1 ok: 64 MiB".to_string(),
        "bigcopy status 0".to_string(),
        "ok TenantInfo into 64 KiB (Message too long)".to_string(),
        "ok vgpu-smi shows all 240 sessions through a reply larger than 64 KiB".to_string(),
        "ok the device takes batches".to_string(),
        "ok a batch of one frame too many (Invalid argument)".to_string(),
        "ok a call after the batches (success)".to_string(),
        "vgpu_ioctl_test: 0 failures".to_string(),
        "ioctl status 0".to_string(),
        format!("/dev/vgpu0: virtio-vgpu device {DEVICE_ID}"),
    ]
    .into();
    for line in lines {
        assert!(out.contains(&line), "missing `{line}` in:\n{out}");
    }
    assert!(!out.contains("driver_api status 0\nFAIL"), "{out}");
    // VGPU_TRANSPORT forces the device node: a missing one is reported, not replaced by vsock.
    assert!(out.contains("forced status 2"), "{out}");
    assert!(
        out.contains("cuInit: cannot reach vgpud at dev:/dev/vgpu9: No such file or directory"),
        "{out}"
    );
    // Unloading the module: refused while a process has the device open, then the device is
    // removed (vgpud resets it) and bound again.
    // The device unbound while a process holds it (QEMU stops the queues with a session open:
    // vgpud pauses), then bound again: the new driver starts the queues afresh, so vgpud resets
    // the device and the old driver's session ends; vgpu-smi (on the new driver) shows none.
    for line in [
        "rmmod while open status 1",
        "rmmod status 0",
        "vgpu0 gone",
        "insmod status 0",
        "unbind status 0",
        "holder ended by the unbind: 1",
        "bind status 0",
        "vgpu-smi after rebind status 0",
        "sessions of the old driver left: 0",
    ] {
        assert!(out.contains(line), "missing `{line}` in:\n{out}");
    }
    assert!(
        out.matches(&format!(
            "Transport: dev:/dev/vgpu0 (virtio-vgpu device, ID {DEVICE_ID})"
        ))
        .count()
            >= 2,
        "the device works again after the module came back:\n{out}"
    );
    assert!(!out.contains("warning"), "install.sh warned:\n{out}");
    assert_no_kernel_trouble(&out);

    let v = d.vm("vm1");
    let st = &v["vgpu_device"]["stats"];
    assert!(v["vsock"].is_null(), "{v:#}");
    assert_eq!(v["vgpu_device"]["device_id"], DEVICE_ID, "{v:#}");
    assert!(u(&st["bytes_from_guest"]) >= 64 * MIB, "{v:#}");
    assert!(u(&st["bytes_to_guest"]) >= 64 * MIB, "{v:#}");
    assert!(u(&st["sessions_total"]) >= 6, "{v:#}");
    assert_eq!(st["dropped_chains"], 0, "{v:#}");
    // The unbind with a session open paused the device; the new driver's start reset it.
    assert!(u(&st["pauses"]) >= 1, "{v:#}");
    assert_eq!(st["resumes"], 0, "{v:#}");
    assert!(
        u(&st["refused_requests"]) >= 2,
        "the ioctl test's garbage frames: {v:#}"
    );
    assert!(u(&v["stats"]["kernels"]) >= 3, "{v:#}");
    // The module accepted the BATCH feature: the shim's asynchronous frames (launches, memsets)
    // and the ioctl test's batches went in BATCH requests.
    assert!(u(&st["batches"]) >= 3, "{v:#}");
    // Synchronous calls with nothing queued ahead of them (synchronizes, small copies) were
    // answered by the queue thread, without waking a session thread.
    assert!(u(&st["calls_on_queue_thread"]) >= 1, "{v:#}");
    assert!(
        u(&st["device_resets"]) >= 1,
        "the module's removal reset the device: {v:#}"
    );
    d.wait_vm(
        "vm1",
        "sessions closed and memory returned",
        RELEASE_TIMEOUT,
        |v| v["memory_used"] == 0 && v["sessions"].as_array().is_some_and(Vec::is_empty),
    );
    println!(
        "vgpu_dev_vm workload: boot to payload {:.2} s, whole run {:.2} s ({}), test {:.1} s",
        outcome.boot_to_payload.unwrap_or_default().as_secs_f64(),
        outcome.elapsed.as_secs_f64(),
        outcome.accel.as_str(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn two_vms_with_their_own_slices_and_one_killed_mid_transfer() {
    let Some(k) = kit_or_skip() else {
        return;
    };
    let started = Instant::now();
    let d = vgpud(&[("victim", 160), ("bystander", 96)]);
    let victim = guest(
        &d,
        k,
        "victim",
        "vgpu-dev-victim",
        &[],
        &format!(
            "driver_api fill {} | grep -E 'allocated|FAIL'\n\
             driver_api hold {}\n\
             echo \"victim status $?\"\n",
            160 * MIB,
            64 * MIB
        ),
    );
    let bystander = guest(
        &d,
        k,
        "bystander",
        "vgpu-dev-bystander",
        &[],
        &format!(
            "driver_api fill {} | grep -E 'allocated|FAIL'\n\
             bigcopy 16 600 /tmp/stop > /tmp/copy.log 2>&1 &\n\
             COPY=$!\n\
             echo BYSTANDER-COPYING\n\
             read go </dev/console\n\
             touch /tmp/stop; wait $COPY; echo \"bystander status $?\"\n\
             grep -c 'ok:' /tmp/copy.log; grep -E 'FAIL|done' /tmp/copy.log\n",
            96 * MIB
        ),
    );
    let mut gv = boot(&d, k, &victim);
    let mut gb = boot(&d, k, &bystander);
    // The victim holds 64 MiB and copies 8 MiB into it back to back (`driver_api hold`).
    d.guest_ok(
        gv.wait_for_line("holding", GUEST_TIMEOUT),
        "the victim copies",
    );
    let copying = u(&d.vm("victim")["stats"]["bytes_htod"]);
    d.wait_vm("victim", "the victim's copies", GUEST_TIMEOUT, |v| {
        u(&v["stats"]["bytes_htod"]) > copying + 64 * MIB
    });
    d.wait_vm("bystander", "the bystander copies", GUEST_TIMEOUT, |v| {
        u(&v["stats"]["bytes_htod"]) > 16 * MIB
    });
    let held = d.vm("victim");
    assert!(u(&held["memory_used"]) >= 64 * MIB, "{held:#}");
    let killed = Instant::now();
    gv.kill();
    let after = d.wait_vm(
        "victim",
        "memory freed after SIGKILL",
        RELEASE_TIMEOUT,
        |v| {
            // The session thread frees the memory, then counts itself closed.
            v["memory_used"] == 0
                && v["sessions"].as_array().is_some_and(Vec::is_empty)
                && v["vgpu_device"]["stats"]["sessions_open"] == 0
        },
    );
    let released = killed.elapsed();
    let st = &after["vgpu_device"]["stats"];
    assert!(u(&st["device_resets"]) >= 1, "{after:#}");
    // The bystander's transfers keep going after the kill.
    let moved = u(&d.vm("bystander")["stats"]["bytes_htod"]);
    d.wait_vm("bystander", "copies after the kill", GUEST_TIMEOUT, |v| {
        u(&v["stats"]["bytes_htod"]) >= moved + 32 * MIB
    });
    d.guest_ok(gb.send_line("go"), "telling the bystander to stop");
    let by = d.guest_ok(gb.wait_exit(GUEST_TIMEOUT), "the bystander's run");
    let out = by.output_text();
    assert_eq!(by.exit_code, 0, "{out}\nvgpud log:\n{}", d.log());
    assert!(
        out.contains(&format!("allocated {} bytes before result 2", 96 * MIB)),
        "the bystander's slice is 96 MiB:\n{out}"
    );
    assert!(out.contains("bystander status 0"), "{out}");
    assert!(out.contains("BIGCOPY done rounds="), "{out}");
    assert!(!out.contains("FAIL"), "{out}");
    assert_no_kernel_trouble(&out);
    let victim_console = std::fs::read_to_string(gv.log_path()).unwrap_or_default();
    assert!(
        victim_console.contains(&format!("allocated {} bytes before result 2", 160 * MIB)),
        "the victim's slice is 160 MiB:\n{victim_console}"
    );
    d.wait_vm("bystander", "memory returned", RELEASE_TIMEOUT, |v| {
        v["memory_used"] == 0
    });
    println!(
        "vgpu_dev_vm kill: victim memory released {:.2} s after SIGKILL; bystander ran {:.1} s; test {:.1} s",
        released.as_secs_f64(),
        by.elapsed.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// One QMP command on QEMU's monitor socket `path`; the `return` (or `error`) object.
fn qmp(path: &Path, command: &str) -> serde_json::Value {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(path).expect("QMP socket");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("QMP timeout");
    let mut reader = BufReader::new(stream.try_clone().expect("QMP socket"));
    let mut greeting = String::new();
    reader.read_line(&mut greeting).expect("QMP greeting");
    let mut answer = |stream: &mut std::os::unix::net::UnixStream, cmd: &str| {
        writeln!(stream, "{{\"execute\": \"{cmd}\"}}").expect("QMP write");
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).expect("QMP read");
            assert!(!line.is_empty(), "QEMU closed the QMP socket");
            let v: serde_json::Value = serde_json::from_str(&line).expect("QMP JSON");
            if v.get("return").is_some() || v.get("error").is_some() {
                return v;
            }
        }
    };
    answer(&mut stream, "qmp_capabilities");
    answer(&mut stream, command)
}

/// The VM is paused (QMP `stop`: QEMU stops the device's queues) in the middle of a stream of
/// copies checked byte for byte, then continued: its GPU session, memory and copies go on.
#[test]
fn a_paused_vm_keeps_its_gpu_session() {
    let Some(k) = kit_or_skip() else {
        return;
    };
    let started = Instant::now();
    let d = vgpud(&[("pausing", 96)]);
    let mut spec = guest(
        &d,
        k,
        "pausing",
        "vgpu-dev-pausing",
        &[],
        "bigcopy 16 600 /tmp/stop > /tmp/copy.log 2>&1 &\n\
         COPY=$!\n\
         echo PAUSING-COPYING\n\
         read go </dev/console\n\
         touch /tmp/stop; wait $COPY; echo \"copy status $?\"\n\
         grep -E 'FAIL|done' /tmp/copy.log\n",
    );
    let monitor = d.dir().join("pausing.qmp");
    spec.extra_args.extend([
        "-qmp".to_string(),
        format!("unix:{},server=on,wait=off", monitor.display()),
    ]);
    let mut g = boot(&d, k, &spec);
    d.guest_ok(
        g.wait_for_line("PAUSING-COPYING", GUEST_TIMEOUT),
        "the copies start",
    );
    d.wait_vm("pausing", "copies before the pause", GUEST_TIMEOUT, |v| {
        u(&v["stats"]["bytes_htod"]) > 32 * MIB
    });
    let r = qmp(&monitor, "stop");
    assert!(r.get("return").is_some(), "QMP stop: {r}");
    std::thread::sleep(Duration::from_millis(500));
    let paused = d.vm("pausing");
    std::thread::sleep(Duration::from_millis(1000));
    let still = d.vm("pausing");
    let st = &still["vgpu_device"]["stats"];
    assert_eq!(u(&st["pauses"]), 1, "{still:#}");
    assert_eq!(u(&st["device_resets"]), 0, "{still:#}");
    assert_eq!(u(&st["sessions_open"]), 1, "{still:#}");
    assert!(u(&still["memory_used"]) >= 16 * MIB, "{still:#}");
    assert_eq!(
        u(&paused["stats"]["bytes_htod"]),
        u(&still["stats"]["bytes_htod"]),
        "nothing moves while the VM is paused"
    );
    let r = qmp(&monitor, "cont");
    assert!(r.get("return").is_some(), "QMP cont: {r}");
    let before = u(&still["stats"]["bytes_htod"]);
    let resumed = d.wait_vm("pausing", "copies after the pause", GUEST_TIMEOUT, |v| {
        u(&v["stats"]["bytes_htod"]) > before + 32 * MIB
    });
    let st = &resumed["vgpu_device"]["stats"];
    assert_eq!(
        (u(&st["pauses"]), u(&st["resumes"]), u(&st["device_resets"])),
        (1, 1, 0),
        "{resumed:#}"
    );
    d.guest_ok(g.send_line("go"), "telling the guest to stop copying");
    let run = d.guest_ok(g.wait_exit(GUEST_TIMEOUT), "the guest's run");
    let out = run.output_text();
    assert_eq!(run.exit_code, 0, "{out}\nvgpud log:\n{}", d.log());
    assert!(out.contains("copy status 0"), "{out}");
    assert!(out.contains("BIGCOPY done rounds="), "{out}");
    assert!(!out.contains("FAIL"), "{out}");
    assert_no_kernel_trouble(&out);
    println!(
        "vgpu_dev_vm pause: paused 1.5 s mid-copy, resumed; test {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The guest reboots (`reboot -f`, QEMU resetting the VM rather than exiting) in the middle of a
/// stream of copies: QEMU stops the device's queues (a pause, as far as vgpud can tell), the new
/// kernel's module starts them afresh, and vgpud resets the device: the old boot's session ends
/// and its memory returns to the slice. The second boot runs CUDA programs as usual.
#[test]
fn a_guest_reboot_mid_copy_ends_the_old_sessions_and_the_next_boot_works() {
    let Some(k) = kit_or_skip() else {
        return;
    };
    let started = Instant::now();
    let d = vgpud(&[("rebooting", 96)]);
    let mut spec = guest(
        &d,
        k,
        "rebooting",
        "vgpu-dev-rebooting",
        &[],
        "echo WHICH-BOOT\n\
         read boot </dev/console\n\
         if [ \"$boot\" = first ]; then\n\
           bigcopy 16 600 /tmp/stop > /tmp/copy.log 2>&1 &\n\
           echo REBOOTING-COPYING\n\
           read go </dev/console\n\
           reboot -f\n\
           sleep 60; exit 70\n\
         fi\n\
         vgpu-smi > /tmp/smi.txt; echo \"smi status $?\"\n\
         echo \"sessions of the old boot left: $(grep -c bigcopy /tmp/smi.txt)\"\n\
         driver_api basic > /tmp/basic.log 2>&1; echo \"driver_api status $?\"\n\
         grep FAIL /tmp/basic.log\n\
         bigcopy 16; echo \"bigcopy status $?\"\n",
    );
    // A guest reboot resets the VM instead of ending QEMU (the harness's -no-reboot).
    spec.extra_args
        .extend(["-action".to_string(), "reboot=reset".to_string()]);
    let mut g = boot(&d, k, &spec);
    d.guest_ok(g.wait_for_line("WHICH-BOOT", GUEST_TIMEOUT), "first boot");
    d.guest_ok(g.send_line("first"), "starting the first boot's copies");
    d.guest_ok(
        g.wait_for_line("REBOOTING-COPYING", GUEST_TIMEOUT),
        "the copies start",
    );
    let copying = d.wait_vm(
        "rebooting",
        "copies before the reboot",
        GUEST_TIMEOUT,
        |v| u(&v["stats"]["bytes_htod"]) > 32 * MIB,
    );
    assert_eq!(
        u(&copying["vgpu_device"]["stats"]["sessions_open"]),
        1,
        "{copying:#}"
    );
    assert!(u(&copying["memory_used"]) >= 16 * MIB, "{copying:#}");
    d.guest_ok(g.send_line("go"), "rebooting the guest");
    d.guest_ok(g.wait_for_line("WHICH-BOOT", GUEST_TIMEOUT), "second boot");
    // The second boot's module has started the queues afresh (install.sh loaded it).
    let after = d.wait_vm(
        "rebooting",
        "the old boot's session ended and its memory freed",
        GUEST_TIMEOUT,
        |v| {
            let st = &v["vgpu_device"]["stats"];
            u(&st["device_resets"]) >= 1
                && u(&st["sessions_open"]) == 0
                && u(&v["memory_used"]) == 0
        },
    );
    let st = &after["vgpu_device"]["stats"];
    assert!(u(&st["pauses"]) >= 1, "QEMU stopped the queues: {after:#}");
    assert_eq!(u(&st["resumes"]), 0, "a reboot is not a resume: {after:#}");
    d.guest_ok(g.send_line("second"), "running the second boot's programs");
    let run = d.guest_ok(g.wait_exit(GUEST_TIMEOUT), "the guest's run");
    let out = run.output_text();
    assert_eq!(run.exit_code, 0, "{out}\nvgpud log:\n{}", d.log());
    for want in [
        "smi status 0",
        "sessions of the old boot left: 0",
        "driver_api status 0",
        "bigcopy status 0",
    ] {
        assert!(out.contains(want), "missing `{want}` in:\n{out}");
    }
    assert!(!out.contains("FAIL"), "{out}");
    assert_no_kernel_trouble(&out);
    let done = d.wait_vm(
        "rebooting",
        "the second boot's sessions closed",
        RELEASE_TIMEOUT,
        |v| v["memory_used"] == 0 && v["sessions"].as_array().is_some_and(Vec::is_empty),
    );
    assert!(
        u(&done["vgpu_device"]["stats"]["sessions_total"]) >= 3,
        "{done:#}"
    );
    println!(
        "vgpu_dev_vm reboot: rebooted mid-copy, old session reset, second boot ran; test {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// In a guest whose transparent huge pages are `madvise` (Ubuntu's default), the pinned buffers
/// of `cuMemHostAlloc` are huge pages (the shim advises them), so the module hands them to the
/// device as runs of up to 2 MiB instead of one descriptor per 4 KiB page.
#[test]
fn pinned_buffers_reach_the_device_as_2_mib_runs_in_a_madvise_guest() {
    let Some(k) = kit_or_skip() else {
        return;
    };
    let d = vgpud(&[("pinned", 96)]);
    let spec = guest(
        &d,
        k,
        "pinned",
        "vgpu-dev-pinned",
        &[],
        "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled\n\
         cat /sys/kernel/mm/transparent_hugepage/enabled\n\
         bigcopy -p 16; echo \"pinned status $?\"\n",
    );
    let run = d.guest_ok(
        boot(&d, k, &spec).wait_exit(GUEST_TIMEOUT),
        "the guest's run",
    );
    let out = run.output_text();
    assert_eq!(run.exit_code, 0, "{out}\nvgpud log:\n{}", d.log());
    assert!(out.contains("always [madvise] never"), "{out}");
    assert!(out.contains("pinned status 0"), "{out}");
    // Both 16 MiB buffers are (nearly) all huge pages in the guest.
    let line = out
        .lines()
        .find(|l| l.contains("BIGCOPY pinned thp_kb"))
        .unwrap_or_else(|| panic!("no THP report in:\n{out}"));
    let kb = |key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    for key in ["src=", "dst="] {
        assert!(kb(key) >= 12 * 1024, "{key} mostly huge pages: {line}");
    }
    assert_no_kernel_trouble(&out);
    // What the device saw: 16 MiB each way in a few runs (5 and 6 here), not 4096 pages. With
    // 2 MiB pages no run is shorter than the request it ends (requests cut the buffer), so the
    // average is at least 1 MiB. (This alone would not prove the huge pages: in a freshly booted
    // guest even 4 KiB pages come mostly contiguous, 23 and 5 ranges here; the guest's own
    // AnonHugePages above does.)
    let v = d.vm("pinned");
    let st = &v["vgpu_device"]["stats"];
    for (bytes, ranges) in [
        ("bytes_from_guest", "segments_from_guest"),
        ("bytes_to_guest", "segments_to_guest"),
    ] {
        let (b, r) = (u(&st[bytes]), u(&st[ranges]));
        assert!(b >= 16 * MIB && r > 0, "{v:#}");
        assert!(
            b / r >= MIB,
            "average run {} KiB ({b} bytes in {r} ranges): {v:#}",
            b / r / 1024
        );
    }
}
