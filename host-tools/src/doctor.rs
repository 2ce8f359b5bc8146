//! `vgpuctl doctor`: checks that this host has what vgpu needs, each check
//! with a verdict (pass / warn / fail), the reason and the fix.
//!
//! - KVM (`kvm-ioctls`): `/dev/kvm`, the API version, and the capabilities a
//!   vhost-user device relies on (ioeventfd for queue kicks, irqfd for
//!   interrupts);
//! - shared memory for vhost-user guest memory (`memfd_create` + shared
//!   mapping, as QEMU's `memory-backend-memfd,share=on` does);
//! - QEMU's version and its `vhost-user-vsock-pci` device;
//! - IOMMU groups and VFIO (needed for passthrough VMs only);
//! - the NVIDIA driver through NVML (needed for real GPUs only);
//! - memory: the simulated GPUs' memory against the host's, the slices
//!   against their devices;
//! - the config file and the running daemon.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use serde_json::json;
use vgpu_config::{Config, DeviceKind, VmMode};

use crate::api::{Client, typed};
use crate::outcome::{CliError, print_json};
use crate::table::bytes;

/// The KVM API version every Linux since 2.6.22 reports.
pub const KVM_API_VERSION: i32 = 12;
/// The config read when `--config` is not given and it exists.
pub const DEFAULT_CONFIG: &str = "/etc/vgpu/vgpud.toml";
/// QEMU binary looked up in PATH when `--qemu` is not given.
pub const DEFAULT_QEMU: &str = "qemu-system-x86_64";
/// The QEMU device vgpud's vsock device is attached with.
pub const QEMU_VSOCK_DEVICE: &str = "vhost-user-vsock-pci";
/// How long QEMU may take to answer `-version` / `-device help`.
const QEMU_TIMEOUT: Duration = Duration::from_secs(20);
/// Size of the memfd the shared-memory check maps.
const MEMFD_PROBE: usize = 2 << 20;

/// Arguments of `doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// vgpud config to check against (default: /etc/vgpu/vgpud.toml when it exists, else the running daemon's).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// QEMU binary to check (default: qemu-system-x86_64 in PATH).
    #[arg(long, value_name = "PATH")]
    pub qemu: Option<PathBuf>,
    /// Root of the sysfs tree (for tests and containers).
    #[arg(long, value_name = "DIR", default_value = "/sys", hide = true)]
    pub sysfs: PathBuf,
    /// Root of the device tree (for tests and containers).
    #[arg(long, value_name = "DIR", default_value = "/dev", hide = true)]
    pub devfs: PathBuf,
    /// /proc/meminfo to read (for tests and containers).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/proc/meminfo",
        hide = true
    )]
    pub meminfo: PathBuf,
}

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Pass,
    /// Works, with a limitation.
    Warn,
    /// vgpu cannot work like this.
    Fail,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What was checked.
    pub check: String,
    /// Verdict.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do (empty when it passed).
    pub fix: String,
}

fn check(name: &str, status: Status, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        check: name.into(),
        status,
        detail: detail.into(),
        fix: fix.into(),
    }
}

fn pass(name: &str, detail: impl Into<String>) -> Check {
    check(name, Status::Pass, detail, "")
}

/// KVM: the device, the API version, ioeventfd and irqfd.
pub fn kvm_checks() -> Vec<Check> {
    let kvm = match kvm_ioctls::Kvm::new() {
        Ok(k) => k,
        Err(e) => {
            let fix = match e.errno() {
                libc::ENOENT => {
                    "load the KVM module (modprobe kvm_intel or kvm_amd) and enable virtualization (VT-x/AMD-V) in the firmware"
                }
                libc::EACCES | libc::EPERM => {
                    "run as root or add the user to the kvm group (usermod -aG kvm USER)"
                }
                _ => "check `dmesg` for KVM errors",
            };
            return vec![check(
                "kvm",
                Status::Fail,
                format!("cannot open /dev/kvm: {e}"),
                fix,
            )];
        }
    };
    let v = kvm.get_api_version();
    let mut out = vec![if v == KVM_API_VERSION {
        pass("kvm", format!("/dev/kvm opened, KVM API version {v}"))
    } else {
        check(
            "kvm",
            Status::Fail,
            format!("KVM API version {v}, expected {KVM_API_VERSION}"),
            "use a mainline Linux kernel",
        )
    }];
    for (name, cap, why) in [
        (
            "kvm.ioeventfd",
            kvm_ioctls::Cap::Ioeventfd,
            "guest queue kicks reach vhost-user devices as eventfds",
        ),
        (
            "kvm.irqfd",
            kvm_ioctls::Cap::Irqfd,
            "vhost-user devices interrupt the guest through eventfds",
        ),
    ] {
        out.push(if kvm.check_extension(cap) {
            pass(name, format!("supported ({why})"))
        } else {
            check(
                name,
                Status::Fail,
                format!("not supported: {why}, so vhost-user devices cannot work"),
                "use a kernel with KVM eventfd support (CONFIG_HAVE_KVM_EVENTFD, CONFIG_HAVE_KVM_IRQFD; every distribution kernel has them)",
            )
        });
    }
    out
}

/// Shared memory for vhost-user guest memory: a memfd mapped shared.
pub fn memfd_check() -> Check {
    const NAME: &str = "shared-memory";
    let fix = "vhost-user needs shareable guest memory: use a kernel with memfd (3.17+) and do not forbid memfd_create in seccomp; or back guest memory with a file on /dev/shm or hugetlbfs";
    // SAFETY: the name is a valid NUL-terminated string; flags are valid.
    let fd = unsafe { libc::memfd_create(c"vgpu-doctor".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return check(
            NAME,
            Status::Fail,
            format!("memfd_create failed: {}", std::io::Error::last_os_error()),
            fix,
        );
    }
    let r = (|| {
        // SAFETY: fd is a memfd we own.
        if unsafe { libc::ftruncate(fd, MEMFD_PROBE as libc::off_t) } != 0 {
            return Err(format!(
                "ftruncate failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: maps MEMFD_PROBE bytes of our memfd; checked for MAP_FAILED below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MEMFD_PROBE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "shared mmap failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: p is a live mapping of MEMFD_PROBE bytes.
        unsafe { libc::munmap(p, MEMFD_PROBE) };
        Ok(())
    })();
    // SAFETY: fd is ours and closed once.
    unsafe { libc::close(fd) };
    match r {
        Ok(()) => pass(
            NAME,
            "memfd_create + shared mapping work (QEMU memory-backend-memfd,share=on; cloud-hypervisor shared=on)",
        ),
        Err(e) => check(NAME, Status::Fail, e, fix),
    }
}

fn run_with_timeout(bin: &Path, args: &[&str]) -> Result<String, String> {
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + QEMU_TIMEOUT;
    let mut out = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} s", QEMU_TIMEOUT.as_secs()));
            }
        }
    }
    reader
        .join()
        .map_err(|_| "cannot read its output".to_string())
}

fn find_in_path(name: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Parses `QEMU emulator version 10.0.2 (…)`.
pub fn qemu_version(text: &str) -> Option<(u32, u32, u32)> {
    let rest = text.split("version").nth(1)?.trim_start();
    let v: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
    Some((
        it.next()??,
        it.next().flatten().unwrap_or(0),
        it.next().flatten().unwrap_or(0),
    ))
}

/// QEMU: present, its version, and its vhost-user-vsock-pci device.
pub fn qemu_checks(qemu: Option<&Path>) -> Vec<Check> {
    let bin = match qemu {
        Some(p) => Some(p.to_path_buf()),
        None => find_in_path(OsStr::new(DEFAULT_QEMU)),
    };
    let Some(bin) = bin.filter(|b| b.is_file()) else {
        return vec![check(
            "qemu",
            Status::Warn,
            format!(
                "{} not found",
                qemu.map_or(DEFAULT_QEMU.into(), |p| p.display().to_string())
            ),
            "needed only for QEMU VMs: install QEMU (apt install qemu-system-x86) or pass --qemu PATH; cloud-hypervisor needs v53 or later for --generic-vhost-user",
        )];
    };
    let mut out = Vec::new();
    match run_with_timeout(&bin, &["-version"]) {
        Ok(text) => match qemu_version(&text) {
            Some((maj, min, pat)) => out.push(pass(
                "qemu",
                format!("{} is QEMU {maj}.{min}.{pat}", bin.display()),
            )),
            None => out.push(check(
                "qemu",
                Status::Warn,
                format!("{} printed no version", bin.display()),
                "check that it is QEMU",
            )),
        },
        Err(e) => out.push(check(
            "qemu",
            Status::Fail,
            format!("{} -version failed: {e}", bin.display()),
            "reinstall QEMU",
        )),
    }
    match run_with_timeout(&bin, &["-machine", "none", "-device", "help"]) {
        Ok(text)
            if text.contains(&format!("\"{QEMU_VSOCK_DEVICE}\""))
                || text.contains(QEMU_VSOCK_DEVICE) =>
        {
            out.push(pass(
                "qemu.vhost-user-vsock",
                format!("{QEMU_VSOCK_DEVICE} is available"),
            ))
        }
        Ok(_) => out.push(check(
            "qemu.vhost-user-vsock",
            Status::Fail,
            format!("this QEMU has no {QEMU_VSOCK_DEVICE} device, so VMs cannot attach to vgpud"),
            "use QEMU 5.1 or later built with vhost-user support (Debian's qemu-system-x86 has it)",
        )),
        Err(e) => out.push(check(
            "qemu.vhost-user-vsock",
            Status::Fail,
            format!("-device help failed: {e}"),
            "reinstall QEMU",
        )),
    }
    out
}

/// IOMMU groups and VFIO (passthrough VMs only).
pub fn iommu_checks(sysfs: &Path, devfs: &Path) -> Vec<Check> {
    let groups = std::fs::read_dir(sysfs.join(vgpu_pci::sysfs::IOMMU_GROUPS))
        .map(|d| d.count())
        .unwrap_or(0);
    let iommu = if groups > 0 {
        pass("iommu", format!("{groups} IOMMU groups"))
    } else {
        check(
            "iommu",
            Status::Warn,
            "no IOMMU groups: the IOMMU is off, so GPUs cannot be passed through (shared vGPUs are not affected)",
            "for passthrough VMs: enable VT-d/AMD-Vi in the firmware and boot with intel_iommu=on (or amd_iommu=on) iommu=pt",
        )
    };
    let vfio_dev = devfs.join("vfio/vfio").exists();
    let vfio_pci = sysfs
        .join(vgpu_pci::sysfs::driver_dir(vgpu_pci::VFIO_PCI))
        .exists()
        || sysfs.join("module/vfio_pci").exists();
    let vfio = match (vfio_dev, vfio_pci) {
        (true, true) => pass("vfio", "/dev/vfio/vfio and the vfio-pci driver are present"),
        (true, false) => check(
            "vfio",
            Status::Warn,
            "VFIO is present but the vfio-pci driver is not loaded",
            "for passthrough VMs: modprobe vfio-pci",
        ),
        _ => check(
            "vfio",
            Status::Warn,
            "no /dev/vfio/vfio: VFIO is not available, so GPUs cannot be passed through (shared vGPUs are not affected)",
            "for passthrough VMs: modprobe vfio-pci (and enable the IOMMU)",
        ),
    };
    vec![iommu, vfio]
}

/// The NVIDIA driver through NVML (real GPUs only).
pub fn nvidia_check() -> Check {
    let lib = std::env::var_os("VGPU_NVML_LIBRARY").unwrap_or_else(|| "libnvidia-ml.so.1".into());
    match nvml_wrapper::Nvml::builder().lib_path(&lib).init() {
        Ok(nvml) => {
            let n = nvml.device_count().unwrap_or(0);
            let v = nvml.sys_driver_version().unwrap_or_else(|_| "?".into());
            if n > 0 {
                pass("nvidia", format!("driver {v}, {n} GPU(s)"))
            } else {
                check(
                    "nvidia",
                    Status::Warn,
                    format!("driver {v} is loaded but reports no GPU"),
                    "check `nvidia-smi` and `lspci | grep -i nvidia`",
                )
            }
        }
        Err(e) => check(
            "nvidia",
            Status::Warn,
            format!(
                "no NVIDIA driver ({}: {e}): only the simulated GPU (kind = \"sim\") is available",
                Path::new(&lib).display()
            ),
            "to share real GPUs, install the NVIDIA driver (nvidia-smi must work)",
        ),
    }
}

/// `MemTotal` and `MemAvailable` in bytes.
pub fn meminfo(path: &Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib << 10)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// Transparent huge pages and reserved 2 MiB pages: the simulated GPU keeps large allocations
/// in huge-page-advised memory, and GPU VMs' guest RAM is best backed by hugetlb pages
/// (docs/attach.md). `thp` is the text of `transparent_hugepage/enabled`, `meminfo` of
/// `/proc/meminfo`.
pub fn huge_pages_check(thp: Option<&str>, meminfo: Option<&str>) -> Check {
    const NAME: &str = "huge-pages";
    let field = |k: &str| {
        meminfo?
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|r| r.trim().parse::<u64>().ok())
    };
    let reserved = match (field("HugePages_Total:"), field("HugePages_Free:")) {
        (Some(total), Some(free)) => format!(
            "{free} of {total} reserved 2 MiB pages free for guest RAM with hugetlb=on (vgpuctl vm attach-args --huge-pages)"
        ),
        _ => "no hugetlb pages reported".into(),
    };
    // The selected mode is the bracketed word: "always [madvise] never".
    let mode = thp.and_then(vgpu_hugemem::thp_mode_of);
    match mode {
        Some("always" | "madvise") => pass(
            NAME,
            format!(
                "transparent huge pages: {} (the simulated GPU's large allocations use them); {reserved}",
                mode.unwrap_or_default()
            ),
        ),
        Some(m) => check(
            NAME,
            Status::Warn,
            format!(
                "transparent huge pages: {m}: the simulated GPU's memory uses 4 KiB pages, so copies into it run slower; {reserved}"
            ),
            "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (or transparent_hugepage=madvise on the kernel command line)",
        ),
        None => check(
            NAME,
            Status::Warn,
            format!("transparent huge pages: not available in this kernel; {reserved}"),
            "use a kernel with CONFIG_TRANSPARENT_HUGEPAGE for the simulated GPU's memory",
        ),
    }
}

/// A device as the memory checks see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Name.
    pub name: String,
    /// Simulated (its memory is host RAM)?
    pub simulated: bool,
    /// Device memory.
    pub memory: u64,
    /// Sum of the VMs' slices on it.
    pub sliced: u64,
}

/// Devices from a config.
pub fn devices_of_config(c: &Config) -> Vec<DeviceMemory> {
    c.devices
        .iter()
        .map(|d| DeviceMemory {
            name: d.name.clone(),
            simulated: d.kind == DeviceKind::Sim,
            memory: d.memory,
            sliced: c
                .vms
                .iter()
                .filter(|v| v.mode == VmMode::Shared && v.device == d.name)
                .map(|v| v.memory)
                .sum(),
        })
        .collect()
}

/// Devices from the running daemon's `/v1/devices`.
pub fn devices_of_daemon(devices: &[vgpu_api::Device]) -> Vec<DeviceMemory> {
    devices
        .iter()
        .map(|d| DeviceMemory {
            name: d.name.clone(),
            simulated: d.kind == "sim",
            memory: d.memory_total,
            sliced: d.memory_sliced,
        })
        .collect()
}

/// Free memory against the configured slices.
pub fn memory_checks(devices: &[DeviceMemory], mem: Option<(u64, u64)>) -> Vec<Check> {
    let mut out = Vec::new();
    let sim: u64 = devices
        .iter()
        .filter(|d| d.simulated)
        .map(|d| d.memory)
        .sum();
    match mem {
        None => out.push(check(
            "memory",
            Status::Warn,
            "cannot read /proc/meminfo",
            "check that /proc is mounted",
        )),
        Some((total, avail)) if sim > 0 => out.push(if sim > total {
            check(
                "memory",
                Status::Fail,
                format!(
                    "the simulated GPUs have {} of memory, more than the host's {}",
                    bytes(sim),
                    bytes(total)
                ),
                "lower `memory` of the sim devices in the config",
            )
        } else if sim > avail {
            check(
                "memory",
                Status::Warn,
                format!(
                    "the simulated GPUs may use {} of host memory; {} is available now",
                    bytes(sim),
                    bytes(avail)
                ),
                "free host memory or lower `memory` of the sim devices",
            )
        } else {
            pass(
                "memory",
                format!(
                    "{} available for {} of simulated GPU memory",
                    bytes(avail),
                    bytes(sim)
                ),
            )
        }),
        Some((_, avail)) => out.push(pass(
            "memory",
            format!("{} of host memory available", bytes(avail)),
        )),
    }
    for d in devices {
        let name = format!("slices.{}", d.name);
        out.push(if d.sliced > d.memory {
            check(
                &name,
                Status::Warn,
                format!("the VMs' slices add up to {} on a {} device: over-committed, so a VM can get out-of-memory before its slice is full", bytes(d.sliced), bytes(d.memory)),
                "if the device's `overcommit` is intended, give the VMs that need a guarantee `reserved` memory and the others `overflow = \"host\"` (docs/memory.md); otherwise shrink slices (vgpuctl vm set NAME --memory SIZE)",
            )
        } else {
            pass(&name, format!("{} of {} sliced", bytes(d.sliced), bytes(d.memory)))
        });
    }
    out
}

/// Runs every check.
pub fn checks(a: &DoctorArgs, c: &Client) -> Vec<Check> {
    let mut out = kvm_checks();
    out.push(memfd_check());
    out.push(huge_pages_check(
        std::fs::read_to_string(a.sysfs.join("kernel/mm/transparent_hugepage/enabled"))
            .ok()
            .as_deref(),
        std::fs::read_to_string(&a.meminfo).ok().as_deref(),
    ));
    out.extend(qemu_checks(a.qemu.as_deref()));
    out.extend(iommu_checks(&a.sysfs, &a.devfs));
    out.push(nvidia_check());
    let daemon = c
        .get("/v1/info")
        .and_then(|i| typed::<vgpu_api::Info>(&i))
        .ok();
    out.push(match &daemon {
        Some(i) => pass(
            "vgpud",
            format!(
                "vgpud {} is running (pid {}, {} VMs)",
                i.version, i.pid, i.vms
            ),
        ),
        None => check(
            "vgpud",
            Status::Warn,
            format!("no vgpud answers on {}", c.socket().display()),
            "start it (systemctl start vgpud, or vgpud --config FILE) or pass --socket",
        ),
    });
    let config_path = a.config.clone().or_else(|| {
        Path::new(DEFAULT_CONFIG)
            .exists()
            .then(|| PathBuf::from(DEFAULT_CONFIG))
    });
    let mut devices = None;
    if let Some(p) = &config_path {
        match Config::load(p) {
            Ok(cfg) => {
                out.push(pass(
                    "config",
                    format!(
                        "{} is valid ({} devices, {} VMs)",
                        p.display(),
                        cfg.devices.len(),
                        cfg.vms.len()
                    ),
                ));
                devices = Some(devices_of_config(&cfg));
            }
            Err(e) => out.push(check(
                "config",
                Status::Fail,
                e.to_string(),
                "fix the line named; `vgpud --check-config FILE` checks again",
            )),
        }
    }
    if devices.is_none() && daemon.is_some() {
        devices = c
            .get("/v1/devices")
            .and_then(|d| typed::<Vec<vgpu_api::Device>>(&d))
            .ok()
            .map(|d| devices_of_daemon(&d));
    }
    match devices {
        Some(d) => out.extend(memory_checks(&d, meminfo(&a.meminfo))),
        None => out.push(check(
            "memory",
            Status::Warn,
            "no config and no running vgpud: the slices were not checked",
            "pass --config FILE",
        )),
    }
    out
}

/// Runs `doctor`.
pub fn run(a: &DoctorArgs, c: &Client, json_out: bool) -> Result<(), CliError> {
    let all = checks(a, c);
    let failed = all.iter().filter(|c| c.status == Status::Fail).count();
    if json_out {
        print_json(&json!({ "checks": all, "failed": failed }));
    } else {
        for ch in &all {
            let tag = match ch.status {
                Status::Pass => "PASS",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            println!("{tag}  {:<22} {}", ch.check, ch.detail);
            if !ch.fix.is_empty() && ch.status != Status::Pass {
                println!("      {:<22} fix: {}", "", ch.fix);
            }
        }
    }
    if failed > 0 {
        return Err(CliError::ChecksFailed(failed));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn qemu_versions_parse() {
        assert_eq!(
            qemu_version("QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-1)\n"),
            Some((10, 0, 2))
        );
        assert_eq!(qemu_version("QEMU emulator version 8.2\n"), Some((8, 2, 0)));
        assert_eq!(qemu_version("nonsense"), None);
    }

    #[test]
    fn iommu_and_vfio_are_read_from_sysfs_and_dev() {
        let d = tempfile::tempdir().unwrap();
        let (sys, dev) = (d.path().join("sys"), d.path().join("dev"));
        let r = iommu_checks(&sys, &dev);
        assert_eq!((r[0].status, r[1].status), (Status::Warn, Status::Warn));
        assert!(r[0].fix.contains("intel_iommu=on"), "{r:?}");
        std::fs::create_dir_all(sys.join("kernel/iommu_groups/0")).unwrap();
        std::fs::create_dir_all(sys.join("kernel/iommu_groups/1")).unwrap();
        std::fs::create_dir_all(sys.join("bus/pci/drivers/vfio-pci")).unwrap();
        std::fs::create_dir_all(dev.join("vfio")).unwrap();
        std::fs::write(dev.join("vfio/vfio"), b"").unwrap();
        let r = iommu_checks(&sys, &dev);
        assert_eq!(r[0], pass("iommu", "2 IOMMU groups"));
        assert_eq!(r[1].status, Status::Pass);
    }

    #[test]
    fn memory_is_checked_against_slices_and_host_ram() {
        let d = tempfile::tempdir().unwrap();
        let mi = d.path().join("meminfo");
        std::fs::write(
            &mi,
            "MemTotal:       16777216 kB\nMemFree: 1 kB\nMemAvailable:    8388608 kB\n",
        )
        .unwrap();
        let mem = meminfo(&mi);
        assert_eq!(mem, Some((16 * GIB, 8 * GIB)));
        let dev = |memory, sliced| DeviceMemory {
            name: "gpu0".into(),
            simulated: true,
            memory,
            sliced,
        };
        let r = memory_checks(&[dev(4 * GIB, 3 * GIB)], mem);
        assert!(r.iter().all(|c| c.status == Status::Pass), "{r:?}");
        let r = memory_checks(&[dev(12 * GIB, 16 * GIB)], mem);
        assert_eq!(
            (r[0].status, r[1].status),
            (Status::Warn, Status::Warn),
            "{r:?}"
        );
        assert!(r[1].detail.contains("over-committed"), "{r:?}");
        let r = memory_checks(&[dev(32 * GIB, GIB)], mem);
        assert_eq!(r[0].status, Status::Fail, "{r:?}");
    }

    #[test]
    fn slices_come_from_the_config() {
        let c = Config::parse(
            Path::new("t.toml"),
            "[[device]]\nname = \"g\"\nkind = \"sim\"\nmemory = \"1GiB\"\novercommit = 1.5\n[[vm]]\nname = \"a\"\nmemory = \"768MiB\"\n[[vm]]\nname = \"b\"\nmemory = \"512MiB\"\n",
        )
        .unwrap();
        let d = devices_of_config(&c);
        assert_eq!(
            d,
            vec![DeviceMemory {
                name: "g".into(),
                simulated: true,
                memory: GIB,
                sliced: 1280 << 20
            }]
        );
    }

    #[test]
    fn huge_pages_are_reported_and_thp_off_warns() {
        let meminfo = "MemTotal: 100 kB\nHugePages_Total:     900\nHugePages_Free:      640\n";
        let c = huge_pages_check(Some("always [madvise] never\n"), Some(meminfo));
        assert_eq!(c.status, Status::Pass);
        assert!(c.detail.contains("madvise"), "{}", c.detail);
        assert!(c.detail.contains("640 of 900"), "{}", c.detail);
        let c = huge_pages_check(Some("[always] madvise never"), None);
        assert_eq!(c.status, Status::Pass);
        assert!(c.detail.contains("no hugetlb pages"), "{}", c.detail);
        let c = huge_pages_check(Some("always madvise [never]"), Some(meminfo));
        assert_eq!(c.status, Status::Warn);
        assert!(c.detail.contains("4 KiB pages"), "{}", c.detail);
        assert!(c.fix.contains("madvise"), "{}", c.fix);
        let c = huge_pages_check(None, Some(meminfo));
        assert_eq!(c.status, Status::Warn);
        assert!(c.detail.contains("not available"), "{}", c.detail);
        // Garbage is not mistaken for a mode.
        assert_eq!(huge_pages_check(Some("madvise"), None).status, Status::Warn);
    }

    #[test]
    fn shared_memory_works_here() {
        assert_eq!(memfd_check().status, Status::Pass);
    }
}
