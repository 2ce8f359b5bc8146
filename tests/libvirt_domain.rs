//! A libvirt domain gets a vgpu for real: libvirt's daemon (Debian's 9.0)
//! defines a plain domain from XML (direct kernel boot of the test image,
//! no ACPI feature, no shared memory, no vgpu device), `vgpuctl vm attach`
//! adds what the VM needs, libvirt starts QEMU (as `libvirt-qemu`), the
//! guest runs the demo CUDA workload through vgpud, then holds device
//! memory until the domain is destroyed; vgpud must free it. `vm detach`
//! then restores the domain.
//!
//! When libvirt's daemons are not running (a host without systemd), the test
//! starts them as root with `virtlogd -d` and `libvirtd -d` and leaves them
//! running. Skips, with a printed reason, only when libvirt or QEMU is not
//! installed (scripts/prereqs.sh installs both) or libvirt's daemon cannot run.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use vgpu_tests::harness::{Vgpud, artifacts, cuda_guest, guest_cuda_program, guest_workload, ptx};
use vgpu_tests::qemu;

const URI: &str = "qemu:///system";
/// QEMU's namespace in libvirt's domain XML.
const QEMU_NS: &str = "http://libvirt.org/schemas/domain/qemu/1.0";
const MIB: u64 = 1 << 20;
const SLICE_MIB: u64 = 256;
const HOLD_MIB: u64 = 48;
const GUEST_TIMEOUT: Duration = Duration::from_secs(300);
const RELEASE_TIMEOUT: Duration = Duration::from_secs(30);

fn virsh(args: &[&str]) -> Result<String, String> {
    let out = Command::new("virsh")
        .arg("-c")
        .arg(URI)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run virsh: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "virsh {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Why libvirt cannot be used here, after starting its daemons if needed.
fn libvirt_skip_reason() -> Option<String> {
    if Command::new("virsh").arg("--version").output().is_err() {
        return Some("virsh is not installed (scripts/prereqs.sh installs libvirt)".into());
    }
    if virsh(&["version"]).is_ok() {
        return None;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("libvirtd is not running and only root can start it".into());
    }
    for daemon in ["virtlogd", "libvirtd"] {
        match Command::new(daemon).arg("-d").status() {
            Ok(s) if s.success() => {}
            Ok(s) => return Some(format!("{daemon} -d failed ({s})")),
            Err(e) => {
                return Some(format!(
                    "{daemon} is not installed ({e}); scripts/prereqs.sh installs libvirt"
                ));
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match virsh(&["version"]) {
            Ok(_) => return None,
            Err(e) if Instant::now() > deadline => {
                return Some(format!("libvirtd started but does not answer: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn vgpuctl(d: &Vgpud, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(&artifacts().vgpuctl)
        .arg("--socket")
        .arg(d.admin_socket())
        .args(args)
        .output()
        .expect("running vgpuctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

struct Domain(String);

impl Drop for Domain {
    fn drop(&mut self) {
        let _ = virsh(&["destroy", &self.0]);
        let _ = virsh(&["undefine", &self.0]);
    }
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_libvirt_domain_attached_with_vgpuctl_runs_a_cuda_workload_and_frees_its_memory() {
    if let Some(reason) = qemu::skip_reason() {
        println!("SKIPPED: cannot boot QEMU guests here: {reason}");
        return;
    }
    if let Some(reason) = libvirt_skip_reason() {
        println!("SKIPPED: libvirt cannot run here: {reason}");
        return;
    }
    let started = Instant::now();
    let d = Vgpud::start_config(
        "[admin]\nsocket = \"@DIR@/admin.sock\"\n\n[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"2GiB\"\nworkers = 2\n\n\
         [[profile]]\nname = \"q8\"\nmemory = \"1/8\"\nweight = 2\n\n\
         [[vm]]\nname = \"vm1\"\nprofile = \"q8\"\nvhost_user_socket = \"@DIR@/vm1.vhost.sock\"\nguest_cid = 9\n",
    );
    // libvirt's QEMU (libvirt-qemu) must reach the socket's directory, as
    // it reaches /run/vgpu.
    std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let vm = d.vm("vm1");
    assert_eq!(
        vm["memory_limit"],
        SLICE_MIB * MIB,
        "the q8 profile: 1/8 of 2 GiB"
    );

    // The guest: the demo workload, then a program that holds device memory.
    let programs = [guest_workload(), guest_cuda_program("gpu-task")];
    let files = [
        (ptx("matmul.sm_80.ptx"), "/payload/matmul.ptx"),
        (ptx("saxpy.sm_80.ptx"), "/payload/saxpy.ptx"),
    ];
    let body = format!(
        "workload /payload/matmul.ptx 32 2\necho \"workload status $?\"\n\
         gpu-task hold {HOLD_MIB} 0 /payload/saxpy.ptx\necho \"holder status $?\"\n"
    );
    let spec = cuda_guest(&d, "vm1", "libvirt-vm1", &programs, &files, &body);
    let boot = tempfile::Builder::new()
        .prefix("vgpu-libvirt-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(boot.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (kernel, initrd, cmdline) = qemu::boot_files(&spec, boot.path()).expect("guest boot files");
    let console = boot.path().join("console.log");
    let emulator = qemu::ensure_qemu().expect("QEMU");
    let image = qemu::ensure_image().expect("guest image");
    // KVM where the harness finds it usable, else TCG.
    let domain_type = match qemu::choose_accel(&emulator, &image)
        .expect("accelerator")
        .as_str()
    {
        "kvm" => "kvm",
        _ => "qemu",
    };

    // A plain domain, as a user would write it: no <acpi/>, private memory.
    let name = format!("vgpu-test-{}", std::process::id());
    let xml = format!(
        "<domain type='{domain_type}'>\n  <name>{name}</name>\n  <memory unit='MiB'>512</memory>\n  <vcpu>2</vcpu>\n  \
         <os>\n    <type arch='x86_64' machine='q35'>hvm</type>\n    <kernel>{}</kernel>\n    <initrd>{}</initrd>\n    <cmdline>{cmdline}</cmdline>\n  </os>\n  \
         <cpu mode='maximum'/>\n  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>destroy</on_reboot>\n  <on_crash>destroy</on_crash>\n  \
         <devices>\n    <emulator>{}</emulator>\n    <serial type='file'>\n      <source path='{}'/>\n      <target port='0'/>\n    </serial>\n    \
         <memballoon model='none'/>\n  </devices>\n</domain>\n",
        kernel.display(),
        initrd.display(),
        emulator.display(),
        console.display(),
    );
    let xml_path = boot.path().join("domain.xml");
    std::fs::write(&xml_path, &xml).unwrap();
    virsh(&["define", &xml_path.to_string_lossy()]).expect("libvirt defines the domain");
    let domain = Domain(name.clone());

    // attach-args --vmm libvirt shows the elements; attach applies them,
    // twice without change.
    let (ok, snippet, err) = vgpuctl(&d, &["vm", "attach-args", "vm1", "--vmm", "libvirt"]);
    assert!(ok, "{err}");
    for part in [
        "<source type='memfd'/>",
        "<access mode='shared'/>",
        "<acpi/>",
        "vhost-user-vsock-pci",
        "bus=pcie.0",
    ] {
        assert!(
            snippet.contains(part),
            "attach-args lacks {part}:\n{snippet}"
        );
    }
    let (ok, out, err) = vgpuctl(&d, &["vm", "attach", "vm1", "--domain", &name]);
    assert!(ok && out.contains("attached"), "{out}{err}");
    assert!(
        err.contains("libvirt-qemu"),
        "attach says it gave the socket to libvirt's QEMU user: {err}"
    );
    let (ok, out, err) = vgpuctl(&d, &["vm", "attach", "vm1", "--domain", &name]);
    assert!(ok && out.contains("already attached"), "{out}{err}");
    let defined = virsh(&["dumpxml", "--inactive", &name]).unwrap();
    assert_eq!(
        defined.matches("vhost-user-vsock-pci").count(),
        1,
        "{defined}"
    );

    // Start: libvirt runs QEMU; the guest runs the workload through vgpud.
    virsh(&["start", &name]).expect("the attached domain starts");
    let log = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    wait_for("the guest to hold device memory", GUEST_TIMEOUT, || {
        let c = log(&console);
        assert!(!c.contains("holder status"), "the holder ended early:\n{c}");
        c.contains("GPU-TASK holding")
    });
    let out = log(&console);
    assert!(
        out.contains("workload status 0"),
        "console:\n{out}\nvgpud:\n{}",
        d.log()
    );
    assert!(out.contains(": result OK"), "{out}");
    assert!(
        out.contains(&format!("memory slice {SLICE_MIB} MiB")),
        "the guest sees its profile's slice:\n{out}"
    );
    let v = d.vm("vm1");
    assert!(
        v["memory_used"].as_u64().unwrap() >= HOLD_MIB * MIB,
        "{v:#}"
    );
    assert!(v["stats"]["kernels"].as_u64().unwrap() >= 2, "{v:#}");
    assert_eq!(v["vsock"]["stats"]["frontend_connections"], 1, "{v:#}");

    // Destroy: vgpud frees the VM's memory.
    virsh(&["destroy", &name]).expect("destroy");
    wait_for("vgpud to free the VM's memory", RELEASE_TIMEOUT, || {
        let v = d.vm("vm1");
        v["memory_used"] == 0 && v["sessions"].as_array().is_some_and(Vec::is_empty)
    });

    // Detach restores the domain.
    let (ok, out, err) = vgpuctl(&d, &["vm", "detach", "vm1", "--domain", &name]);
    assert!(ok && out.contains("detached"), "{out}{err}");
    let after = virsh(&["dumpxml", "--inactive", &name]).unwrap();
    assert!(
        !after.contains("vhost-user-vsock-pci") && !after.contains("memfd"),
        "{after}"
    );
    drop(domain);
    println!(
        "libvirt_domain: define, attach, start, workload, destroy, release, detach in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The KubeVirt hook sidecar's domains, as libvirt takes them: each sample of virt-launcher's
/// XML (k8s/tests/fixtures) goes through the sidecar, and Debian's libvirt defines the result.
/// libvirt then assigns its own PCI addresses (root ports, controllers); none may take the
/// root-bus slot the sidecar gave the vgpu device, and the device's QEMU arguments and the
/// shared memory must survive libvirt's rewrite. Only what this host cannot run changes: KVM
/// (TCG here), KubeVirt's RHEL machine type (plain q35) and its emulator path (Debian's).
#[test]
fn kubevirt_domains_from_the_sidecar_are_defined_by_libvirt_without_slot_clashes() {
    if let Some(why) = libvirt_skip_reason() {
        eprintln!("skipping: {why}");
        return;
    }
    let fixtures = qemu::repo_root().join("k8s/tests/fixtures");
    let read =
        |f: &str| std::fs::read_to_string(fixtures.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    let dir = tempfile::tempdir().unwrap();
    for (i, (xml, vmi)) in [
        ("containerdisk.xml", "vmi-q4.json"),
        ("hugepages.xml", "vmi-two-q8.json"),
        ("addresses.xml", "vmi-addresses.json"),
    ]
    .into_iter()
    .enumerate()
    {
        let out = vgpu_k8s::sidecar::on_define_domain(&read(xml), read(vmi).as_bytes(), "vgpu.io")
            .unwrap_or_else(|e| panic!("{xml}: {e}"));
        let name = format!("vgpu-kubevirt-sample-{i}");
        let doc = roxmltree::Document::parse(&out).unwrap();
        let old_name = doc
            .descendants()
            .find(|n| n.has_tag_name("name"))
            .and_then(|n| n.text())
            .unwrap();
        let local = out
            .replacen("type=\"kvm\"", "type=\"qemu\"", 1)
            .replace("pc-q35-rhel9.4.0", "q35")
            .replace("/usr/libexec/qemu-kvm", "/usr/bin/qemu-system-x86_64")
            .replacen(
                &format!("<name>{old_name}</name>"),
                &format!("<name>{name}</name>"),
                1,
            );
        let file = dir.path().join(format!("{name}.xml"));
        std::fs::write(&file, &local).unwrap();
        let _ = virsh(&["undefine", &name]);
        virsh(&["define", file.to_str().unwrap()]).unwrap_or_else(|e| panic!("{xml}: {e}"));
        let _domain = Domain(name.clone());
        let defined = virsh(&["dumpxml", "--inactive", &name]).unwrap();
        let doc = roxmltree::Document::parse(&defined).unwrap();

        let args: Vec<&str> = doc
            .descendants()
            .filter(|n| n.tag_name().namespace() == Some(QEMU_NS) && n.has_tag_name("arg"))
            .filter_map(|n| n.attribute("value"))
            .collect();
        let ours: Vec<u32> = args
            .iter()
            .filter(|a| a.contains("chardev=vgpu-"))
            .filter_map(|a| a.split(',').find_map(|kv| kv.strip_prefix("addr=0x")))
            .map(|s| u32::from_str_radix(s, 16).unwrap())
            .collect();
        assert!(
            !ours.is_empty(),
            "{xml}: libvirt dropped the vgpu device: {args:?}"
        );
        let theirs: Vec<u32> = doc
            .descendants()
            .filter(|n| {
                n.has_tag_name("address")
                    && n.attribute("type") == Some("pci")
                    && n.attribute("bus")
                        .and_then(|b| u32::from_str_radix(b.trim_start_matches("0x"), 16).ok())
                        == Some(0)
                    && n.parent().is_some_and(|p| !p.has_tag_name("source"))
            })
            .filter_map(|n| n.attribute("slot"))
            .map(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap())
            .collect();
        assert!(
            theirs.len() >= 2,
            "{xml}: libvirt assigned root-bus addresses: {theirs:?}"
        );
        if xml == "addresses.xml" {
            // The interface's user-chosen 0x1e pushes the device down one slot.
            assert_eq!(ours, [0x1d], "{xml}: {args:?}");
        }
        for slot in &ours {
            assert!(
                !theirs.contains(slot),
                "{xml}: libvirt put a device at the vgpu device's slot {slot:#x}: {theirs:?}"
            );
        }
        let backing = doc
            .descendants()
            .find(|n| n.has_tag_name("memoryBacking"))
            .expect("memoryBacking");
        assert!(
            backing
                .descendants()
                .any(|n| n.has_tag_name("source") && n.attribute("type") == Some("memfd")),
            "{xml}: {defined}"
        );
        assert!(
            backing
                .descendants()
                .any(|n| n.has_tag_name("access") && n.attribute("mode") == Some("shared")),
            "{xml}: {defined}"
        );
    }
}
