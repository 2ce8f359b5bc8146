//! QEMU harness: boots the vgpu test guest and runs commands in it.
//!
//! The end-to-end tests and the demo start real Linux guests (Debian's cloud
//! kernel and a busybox initramfs built by `images/build.sh`) under QEMU, with
//! an optional `vhost-user-vsock-pci` device served by vgpud. A guest runs one
//! shell script, `/payload/run.sh`, and powers off; the serial console is
//! captured line by line (and to `tests/out/guests/<name>.log`).
//!
//! Per-run files travel in a second cpio archive appended to the base initrd
//! (Linux unpacks concatenated archives), so the base image stays generic and
//! cached. ELF files in the payload bring the host libraries `ldd` reports
//! that the image lacks. `docs/guest-image.md` describes the image and the
//! `/init` console protocol (the `VGPU-GUEST-*` markers).
//!
//! ```no_run
//! use std::time::Duration;
//! use vgpu_tests::qemu::{Guest, GuestSpec};
//!
//! let mut spec = GuestSpec::new("hello", "uname -r; exit 3");
//! spec.timeout = Duration::from_secs(120);
//! let mut guest = Guest::boot(&spec)?;
//! let outcome = guest.wait_exit(spec.timeout)?;
//! assert_eq!(outcome.exit_code, 3);
//! # Ok::<(), vgpu_tests::qemu::QemuError>(())
//! ```
//!
//! Environment: `VGPU_QEMU` (QEMU binary), `VGPU_QEMU_ACCEL` (`tcg`, `kvm` or
//! `auto`, the default: KVM only when a probe guest boots with it),
//! `VGPU_REPO_ROOT` (the checkout). Tests never install packages: `scripts/prereqs.sh` does.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// Printed by `/init` when it starts: `VGPU-GUEST-BOOT kernel=<release> uptime=<s>`.
pub const MARKER_BOOT: &str = "VGPU-GUEST-BOOT";
/// Printed by `/init` when something failed but the boot goes on.
pub const MARKER_WARN: &str = "VGPU-GUEST-WARN";
/// Printed when modules are loaded: `VGPU-GUEST-READY uptime=<s> modules=<n> vsock=<yes|no>`.
pub const MARKER_READY: &str = "VGPU-GUEST-READY";
/// Printed right before `/payload/run.sh` starts.
pub const MARKER_PAYLOAD_START: &str = "VGPU-GUEST-PAYLOAD-START";
/// Printed after `/payload/run.sh`: `VGPU-GUEST-EXIT <status>`.
pub const MARKER_EXIT: &str = "VGPU-GUEST-EXIT";
/// Printed when `/init` starts an interactive shell instead of a payload.
pub const MARKER_SHELL: &str = "VGPU-GUEST-SHELL";

/// The guest path of the payload script.
pub const PAYLOAD_SCRIPT: &str = "/payload/run.sh";
/// Where [`GuestSpec::add_vgpu_shim`] puts the shim, vgpu-smi and install.sh.
pub const SHIM_BUNDLE_DIR: &str = "/payload/vgpu";
/// The vsock CID of the host, as seen from a guest.
pub const HOST_CID: u32 = 2;

const QEMU_BINARY: &str = "qemu-system-x86_64";
const BASE_KERNEL_ARGS: &str = "console=ttyS0 quiet panic=-1";
/// Kernel argument that makes `/init` print READY and power off at once.
const PROBE_KERNEL_ARG: &str = "vgpu.probe";
/// Linux finds an uncompressed cpio after a compressed one only at a 4-byte
/// aligned offset of the initrd.
const INITRD_ALIGN: u64 = 4;
const DEFAULT_MEMORY_MIB: u32 = 512;
const MIN_MEMORY_MIB: u32 = 128;
const MAX_MEMORY_MIB: u32 = 64 * 1024;
const PROBE_MEMORY_MIB: u32 = 256;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(180);
/// A working KVM reaches `/init` in about a second; a host whose /dev/kvm
/// cannot run ordinary guests (PVM) hangs in early boot.
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long QEMU may take to exit after its console closed.
const EXIT_GRACE: Duration = Duration::from_secs(5);
const EXIT_POLL: Duration = Duration::from_millis(20);
/// Console lines quoted in error messages.
const ERROR_TAIL_LINES: usize = 40;
const CPIO_NEWC_MAGIC: &str = "070701";
const CPIO_TRAILER: &str = "TRAILER!!!";
const CPIO_ALIGN: usize = 4;
const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const DIR_MODE: u32 = 0o755;
const SCRIPT_MODE: u32 = 0o755;
const PERMISSION_BITS: u32 = 0o7777;
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const C_FLAGS: &[&str] = &["-O2", "-g", "-Wall", "-Wextra", "-Werror", "-std=gnu11"];
const C_LIBS: &[&str] = &["-ldl"];
/// Libraries of guest CUDA programs (after `-L <shim dir>`).
const CUDA_LIBS: &[&str] = &["-lcuda", "-lm", "-ldl"];

/// Errors of the QEMU harness. Messages say what to do where they can.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    /// QEMU is not installed.
    #[error(
        "QEMU ({QEMU_BINARY}) is not installed{detail}; install it with `sudo {}` \
         (Debian bookworm-backports qemu-system-x86) or point VGPU_QEMU at a binary",
        script.display()
    )]
    QemuMissing {
        /// The installer script.
        script: PathBuf,
        /// Why it was not found.
        detail: String,
    },
    /// A program could not be started.
    #[error("cannot run {program}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A helper tool ran but failed.
    #[error("{what} failed ({status}){details}")]
    ToolFailed {
        /// The tool and what it was doing.
        what: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its output, or where to look.
        details: String,
    },
    /// A file could not be read or written.
    #[error("{what} {}", path.display())]
    Io {
        /// What the harness was doing.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// `images/out/manifest.txt` is not what `images/build.sh` writes.
    #[error("malformed guest image manifest {}, line {line}: {reason}", path.display())]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The [`GuestSpec`] cannot be booted.
    #[error("invalid guest spec: {0}")]
    InvalidSpec(String),
    /// A payload ELF file needs a library that is nowhere to be found.
    #[error(
        "payload file {} needs {library}, which neither the host (ldd) nor the payload provides",
        path.display()
    )]
    MissingLibrary {
        /// The payload file.
        path: PathBuf,
        /// The missing library's name.
        library: String,
    },
    /// A guest test program did not compile.
    #[error("compiling {} failed:\n{stderr}", source_file.display())]
    Compile {
        /// The C source.
        source_file: PathBuf,
        /// The compiler's messages.
        stderr: String,
    },
    /// The guest did not print what was awaited in time. After `wait_for_line`
    /// QEMU is left running; after `wait_exit` it has been killed.
    #[error(
        "guest `{name}`: timed out after {waited:?} waiting for {what}; console log {}; last lines:\n{tail}",
        log.display()
    )]
    Timeout {
        /// The guest's name.
        name: String,
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
        /// The console log file.
        log: PathBuf,
        /// The last console lines and QEMU's messages.
        tail: String,
    },
    /// QEMU exited before the awaited line appeared.
    #[error(
        "guest `{name}`: QEMU exited ({status}) while waiting for {what}; console log {}; last lines:\n{tail}",
        log.display()
    )]
    Exited {
        /// The guest's name.
        name: String,
        /// What was awaited.
        what: String,
        /// QEMU's exit status.
        status: String,
        /// The console log file.
        log: PathBuf,
        /// The last console lines and QEMU's messages.
        tail: String,
    },
    /// `/init` found no `/payload/run.sh` and started a shell.
    #[error(
        "guest `{name}` started an interactive shell: {PAYLOAD_SCRIPT} did not reach the guest \
         (payload cpio not unpacked?); console log {}; last lines:\n{tail}",
        log.display()
    )]
    NoPayload {
        /// The guest's name.
        name: String,
        /// The console log file.
        log: PathBuf,
        /// The last console lines.
        tail: String,
    },
    /// QEMU exited without the exit marker (kernel panic, `/init` failure).
    #[error(
        "guest `{name}`: QEMU exited ({status}) without printing `{MARKER_EXIT} <status>` \
         (QEMU failed to start, the kernel panicked or /init failed); console log {}; last lines:\n{tail}",
        log.display()
    )]
    NoExitMarker {
        /// The guest's name.
        name: String,
        /// QEMU's exit status.
        status: String,
        /// The console log file.
        log: PathBuf,
        /// The last console lines and QEMU's messages.
        tail: String,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> QemuError + use<> {
    let path = path.to_path_buf();
    move |source| QemuError::Io { what, path, source }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The root of the vgpu checkout: `VGPU_REPO_ROOT`, or the parent of the tests crate.
pub fn repo_root() -> PathBuf {
    if let Some(root) = std::env::var_os("VGPU_REPO_ROOT") {
        return PathBuf::from(root);
    }
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.to_path_buf(), Path::to_path_buf)
}

/// Where tests write their artefacts (git-ignored): `tests/out`.
pub fn out_dir() -> PathBuf {
    repo_root().join("tests").join("out")
}

fn install_script() -> PathBuf {
    repo_root().join("images").join("install-qemu.sh")
}

// ---------------------------------------------------------------------------
// QEMU discovery and installation
// ---------------------------------------------------------------------------

/// Finds QEMU: `VGPU_QEMU`, else `qemu-system-x86_64` on `PATH`.
pub fn find_qemu() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("VGPU_QEMU") {
        let path = PathBuf::from(path);
        return path.is_file().then_some(path);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(QEMU_BINARY))
        .find(|candidate| candidate.is_file())
}

/// Finds QEMU. Tests never install it (an apt job during a test run fails whenever another one
/// holds the dpkg lock): `scripts/prereqs.sh` does, with `images/install-qemu.sh`.
pub fn ensure_qemu() -> Result<PathBuf, QemuError> {
    if let Some(qemu) = find_qemu() {
        return Ok(qemu);
    }
    let detail = if std::env::var_os("VGPU_QEMU").is_some() {
        " (VGPU_QEMU does not name a file)"
    } else {
        " (tests do not install packages; scripts/prereqs.sh does)"
    };
    Err(QemuError::QemuMissing {
        script: install_script(),
        detail: detail.to_string(),
    })
}

fn qemu_version(qemu: &Path) -> String {
    Command::new(qemu)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// The guest image
// ---------------------------------------------------------------------------

/// What `images/build.sh` wrote into `images/out/manifest.txt`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    /// `uname -r` of the guest kernel.
    pub kernel_release: String,
    /// The modules `/init` loads, in load order.
    pub modules: Vec<String>,
    values: BTreeMap<String, String>,
    files: BTreeSet<String>,
    /// Top-level symbolic links, e.g. (`/lib`, `/usr/lib`).
    symlinks: Vec<(String, String)>,
}

impl Manifest {
    /// Parses a manifest; `path` is only used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, QemuError> {
        let mut manifest = Manifest::default();
        let bad = |line: usize, reason: String| QemuError::Manifest {
            path: path.to_path_buf(),
            line,
            reason,
        };
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split('\t').collect();
            match fields.as_slice() {
                ["file", guest, _origin] => {
                    check_guest_path(guest).map_err(|reason| bad(number, reason))?;
                    manifest.files.insert((*guest).to_string());
                }
                ["symlink", from, to] => {
                    check_guest_path(from).map_err(|reason| bad(number, reason))?;
                    check_guest_path(to).map_err(|reason| bad(number, reason))?;
                    manifest
                        .symlinks
                        .push(((*from).to_string(), (*to).to_string()));
                }
                [single] => {
                    let (key, value) = single
                        .split_once('=')
                        .ok_or_else(|| bad(number, format!("expected key=value, got `{line}`")))?;
                    manifest.values.insert(key.to_string(), value.to_string());
                }
                _ => return Err(bad(number, format!("unknown entry `{line}`"))),
            }
        }
        manifest.kernel_release = manifest
            .values
            .get("kernel_release")
            .filter(|release| !release.is_empty())
            .cloned()
            .ok_or_else(|| bad(0, "no kernel_release".to_string()))?;
        manifest.modules = manifest
            .values
            .get("modules")
            .map(|m| m.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        Ok(manifest)
    }

    /// A `key=value` entry, e.g. `kernel_package` or `glibc`.
    pub fn value(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// The path a guest path really has in the image, through the top-level
    /// links (`/lib/x` is `/usr/lib/x`). Archives must use real paths: an
    /// entry for `lib` would replace the `/lib` link with a directory.
    pub fn canonical_path(&self, guest_path: &str) -> String {
        for (from, to) in &self.symlinks {
            if guest_path == from {
                return to.clone();
            }
            match guest_path.strip_prefix(from.as_str()) {
                Some(rest) if rest.starts_with('/') => return format!("{to}{rest}"),
                _ => {}
            }
        }
        guest_path.to_string()
    }

    /// Whether the image has a file at this guest path (after the links).
    pub fn contains_file(&self, guest_path: &str) -> bool {
        self.files.contains(&self.canonical_path(guest_path))
    }

    /// The number of files in the image.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }
}

/// The built guest image.
#[derive(Debug, Clone)]
pub struct GuestImage {
    /// The kernel (`images/out/vmlinuz`).
    pub kernel: PathBuf,
    /// The base initramfs (`images/out/initrd.cpio.gz`).
    pub initrd: PathBuf,
    /// `images/out/manifest.txt`.
    pub manifest: Manifest,
}

/// Builds (or finds up to date) the guest image with `images/build.sh` once per
/// process. Progress lines of a real build go to stderr.
pub fn ensure_image() -> Result<GuestImage, QemuError> {
    static IMAGE: Mutex<Option<GuestImage>> = Mutex::new(None);
    let mut cached = lock(&IMAGE);
    if let Some(image) = cached.as_ref() {
        return Ok(image.clone());
    }
    let images = repo_root().join("images");
    let script = images.join("build.sh");
    let status = Command::new("bash")
        .arg(&script)
        .arg("--quiet")
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|source| QemuError::Spawn {
            program: script.display().to_string(),
            source,
        })?;
    if !status.success() {
        return Err(QemuError::ToolFailed {
            what: format!("building the guest image with {}", script.display()),
            status,
            details: "; its messages are above (lines starting with [guest-image])".to_string(),
        });
    }
    let out = std::env::var_os("VGPU_IMAGE_OUT").map_or_else(|| images.join("out"), PathBuf::from);
    let manifest_path = out.join("manifest.txt");
    let text = fs::read_to_string(&manifest_path).map_err(io_err("cannot read", &manifest_path))?;
    let image = GuestImage {
        kernel: out.join("vmlinuz"),
        initrd: out.join("initrd.cpio.gz"),
        manifest: Manifest::parse(&text, &manifest_path)?,
    };
    *cached = Some(image.clone());
    Ok(image)
}

// ---------------------------------------------------------------------------
// Accelerator
// ---------------------------------------------------------------------------

/// The QEMU accelerator a guest runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// The portable binary translator.
    Tcg,
    /// Hardware virtualisation through /dev/kvm.
    Kvm,
}

impl Accel {
    /// QEMU's name for it (`-accel NAME`).
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Tcg => "tcg",
            Accel::Kvm => "kvm",
        }
    }
}

/// Chooses the accelerator: `VGPU_QEMU_ACCEL=tcg|kvm`, or (`auto`, the default)
/// KVM when /dev/kvm opens and a probe guest boots under it (a KVM that runs
/// only PVM guests hangs). The probe result is cached per host kernel and QEMU
/// version in `images/out/kvm-probe.txt`, and per process.
pub fn choose_accel(qemu: &Path, image: &GuestImage) -> Result<Accel, QemuError> {
    static CHOSEN: Mutex<Option<Accel>> = Mutex::new(None);
    let mut chosen = lock(&CHOSEN);
    if let Some(accel) = *chosen {
        return Ok(accel);
    }
    let accel = match std::env::var("VGPU_QEMU_ACCEL").as_deref() {
        Ok("tcg") => Accel::Tcg,
        Ok("kvm") => Accel::Kvm,
        Ok("auto") | Ok("") | Err(_) => probe_kvm(qemu, image),
        Ok(other) => {
            return Err(QemuError::InvalidSpec(format!(
                "VGPU_QEMU_ACCEL is `{other}`; use tcg, kvm or auto"
            )));
        }
    };
    tracing::info!(accel = accel.as_str(), "QEMU accelerator chosen");
    *chosen = Some(accel);
    Ok(accel)
}

fn probe_kvm(qemu: &Path, image: &GuestImage) -> Accel {
    if OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return Accel::Tcg;
    }
    let host_kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let key = format!("{}|{}", host_kernel.trim(), qemu_version(qemu));
    let cache = image.kernel.with_file_name("kvm-probe.txt");
    let cached = fs::read_to_string(&cache).unwrap_or_default();
    match cached.trim_end().rsplit_once('|') {
        Some((cached_key, verdict)) if cached_key == key => {
            return if verdict == "kvm" {
                Accel::Kvm
            } else {
                Accel::Tcg
            };
        }
        _ => {}
    }
    let mut spec = GuestSpec::new("kvm-probe", "");
    spec.memory_mib = PROBE_MEMORY_MIB;
    spec.timeout = KVM_PROBE_TIMEOUT;
    spec.kernel_args.push(PROBE_KERNEL_ARG.to_string());
    let works = Guest::boot_with(&spec, qemu, image, Accel::Kvm)
        .and_then(|mut guest| guest.wait_for_line(MARKER_READY, KVM_PROBE_TIMEOUT))
        .is_ok();
    let accel = if works { Accel::Kvm } else { Accel::Tcg };
    tracing::info!(usable = works, "probed KVM with a guest boot");
    // A failed write only costs another probe next time.
    let _ = fs::write(&cache, format!("{key}|{}\n", accel.as_str()));
    accel
}

// ---------------------------------------------------------------------------
// Guest programs
// ---------------------------------------------------------------------------

/// Compiles `tests/guest/<name>.c` with the host `cc` (or `$CC`) into
/// `tests/out/guest-bin/<name>`, unless that binary is newer than its source.
/// The binary links dynamically against the host glibc, which the guest has.
pub fn build_guest_program(name: &str) -> Result<PathBuf, QemuError> {
    let source = repo_root()
        .join("tests")
        .join("guest")
        .join(format!("{name}.c"));
    let flags: Vec<OsString> = C_FLAGS.iter().map(OsString::from).collect();
    let libs: Vec<OsString> = C_LIBS.iter().map(OsString::from).collect();
    build_guest_program_from(&source, name, &flags, &libs)
}

/// Compiles a CUDA program for the guest: `source` (e.g. `tests/guest/<name>.c`
/// or `examples/workload.c`) linked with `-lcuda` against the shim in
/// `cuda_lib_dir` (a directory with `libcuda.so`), into
/// `tests/out/guest-bin/<name>`. No rpath: in the guest the loader finds the
/// `libcuda.so.1` that `guest-shim/install.sh` installed, as for any CUDA
/// program. Put the shim in the payload with [`GuestSpec::add_vgpu_shim`], or
/// the payload has no `libcuda.so.1` and [`Guest::boot`] refuses it.
pub fn build_guest_cuda_program(
    source: &Path,
    name: &str,
    cuda_lib_dir: &Path,
) -> Result<PathBuf, QemuError> {
    let flags: Vec<OsString> = C_FLAGS.iter().map(OsString::from).collect();
    let mut libs = vec![OsString::from("-L")];
    libs.push(cuda_lib_dir.as_os_str().to_os_string());
    libs.extend(CUDA_LIBS.iter().map(OsString::from));
    build_guest_program_from(source, name, &flags, &libs)
}

/// Compiles a C file with `cc` (or `$CC`) `flags -o OUT source libs` into
/// `tests/out/guest-bin/<name>`, unless that binary is newer than its source
/// and was built with the same command line.
pub fn build_guest_program_from(
    source: &Path,
    name: &str,
    flags: &[OsString],
    libs: &[OsString],
) -> Result<PathBuf, QemuError> {
    static BUILD: Mutex<()> = Mutex::new(());
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(QemuError::InvalidSpec(format!(
            "guest program name `{name}` must be letters, digits, - and _"
        )));
    }
    let _serialized = lock(&BUILD);
    let out_dir = out_dir().join("guest-bin");
    let binary = out_dir.join(name);
    let stamp = out_dir.join(format!(".{name}.cmd"));
    let compiler = std::env::var_os("CC").unwrap_or_else(|| OsString::from("cc"));
    let lossy = |a: &std::ffi::OsStr| a.to_string_lossy().into_owned();
    let mut parts = vec![lossy(&compiler)];
    parts.extend(flags.iter().map(|a| lossy(a)));
    parts.push(lossy(source.as_os_str()));
    parts.extend(libs.iter().map(|a| lossy(a)));
    let command = parts.join("\n");
    let source_time = fs::metadata(source)
        .and_then(|m| m.modified())
        .map_err(io_err("cannot read", source))?;
    let binary_time = fs::metadata(&binary).and_then(|m| m.modified());
    let same_command = fs::read_to_string(&stamp).is_ok_and(|c| c == command);
    if same_command && binary_time.is_ok_and(|built| built >= source_time) {
        return Ok(binary);
    }
    fs::create_dir_all(&out_dir).map_err(io_err("cannot create", &out_dir))?;
    let tmp = out_dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let output = Command::new(&compiler)
        .args(flags)
        .arg("-o")
        .arg(&tmp)
        .arg(source)
        .args(libs)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| QemuError::Spawn {
            program: compiler.to_string_lossy().into_owned(),
            source,
        })?;
    if !output.status.success() {
        let _ = fs::remove_file(&tmp);
        return Err(QemuError::Compile {
            source_file: source.to_path_buf(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    fs::rename(&tmp, &binary).map_err(io_err("cannot rename into", &binary))?;
    fs::write(&stamp, command).map_err(io_err("cannot write", &stamp))?;
    Ok(binary)
}

// ---------------------------------------------------------------------------
// Guest spec and payload
// ---------------------------------------------------------------------------

/// What to boot and run.
#[derive(Debug, Clone)]
pub struct GuestSpec {
    /// Names the QEMU process and the console log `tests/out/guests/<name>.log`
    /// (letters, digits, `.`, `-`, `_`); keep it unique among guests running at once.
    pub name: String,
    /// Guest memory (MiB); it is a shared memfd, as vhost-user needs.
    pub memory_mib: u32,
    /// vgpud's vhost-user socket: adds a `vhost-user-vsock-pci` device.
    pub vhost_user_vsock: Option<PathBuf>,
    /// Host files copied into the guest: (host path, absolute guest path).
    /// Files under `/payload/bin` are on `PATH`, under `/payload/lib` on the
    /// loader path; libraries anywhere are found too (`/init` runs ldconfig).
    pub payload: Vec<(PathBuf, String)>,
    /// The content of `/payload/run.sh`, run by `/bin/sh` (busybox ash) in
    /// `/payload`; its exit status is the outcome. Empty: no script, `/init`
    /// starts an interactive shell on the console (see [`Guest::send_line`]).
    pub script: String,
    /// The longest the guest may live, from the boot: no wait lasts beyond it,
    /// and `wait_exit` kills QEMU when it passes.
    pub timeout: Duration,
    /// Extra QEMU arguments, appended last.
    pub extra_args: Vec<String>,
    /// Extra kernel command line arguments (e.g. `vgpu.shell`).
    pub kernel_args: Vec<String>,
}

impl GuestSpec {
    /// A spec with defaults: 512 MiB, no vsock device, no files, 180 s.
    pub fn new(name: impl Into<String>, script: impl Into<String>) -> Self {
        GuestSpec {
            name: name.into(),
            memory_mib: DEFAULT_MEMORY_MIB,
            vhost_user_vsock: None,
            payload: Vec::new(),
            script: script.into(),
            timeout: DEFAULT_TIMEOUT,
            extra_args: Vec::new(),
            kernel_args: Vec::new(),
        }
    }

    /// Puts the guest shim (as `libcuda.so.1`), its NVML library (as `libnvidia-ml.so.1`),
    /// `vgpu-smi` and `guest-shim/install.sh` into the payload under [`SHIM_BUNDLE_DIR`],
    /// which is on no search path, and returns the shell command that installs
    /// them in the guest the way a user would.
    pub fn add_vgpu_shim(&mut self, libcuda: &Path, nvml: &Path, vgpu_smi: &Path) -> String {
        let install = repo_root().join("guest-shim").join("install.sh");
        for (host, file) in [
            (libcuda.to_path_buf(), "libcuda.so.1"),
            (nvml.to_path_buf(), "libnvidia-ml.so.1"),
            (vgpu_smi.to_path_buf(), "vgpu-smi"),
            (install, "install.sh"),
        ] {
            self.payload
                .push((host, format!("{SHIM_BUNDLE_DIR}/{file}")));
        }
        format!("sh {SHIM_BUNDLE_DIR}/install.sh --from {SHIM_BUNDLE_DIR}")
    }

    fn expects_payload(&self) -> bool {
        !self.script.is_empty() && !self.kernel_args.iter().any(|arg| arg == "vgpu.shell")
    }

    /// Checks everything that can be checked before QEMU starts.
    pub fn validate(&self) -> Result<(), QemuError> {
        let invalid = |msg: String| Err(QemuError::InvalidSpec(msg));
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return invalid(format!(
                "guest name `{}` must be non-empty letters, digits, `.`, `-` or `_`",
                self.name
            ));
        }
        if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&self.memory_mib) {
            return invalid(format!(
                "memory_mib {} is outside {MIN_MEMORY_MIB}..={MAX_MEMORY_MIB}",
                self.memory_mib
            ));
        }
        if self.timeout.is_zero() {
            return invalid("timeout is zero".to_string());
        }
        if let Some(socket) = self.vhost_user_vsock.as_ref().filter(|s| !s.exists()) {
            return invalid(format!(
                "vhost-user socket {} does not exist; start vgpud (with vhost_user_socket in its config) first",
                socket.display()
            ));
        }
        for arg in &self.kernel_args {
            if arg.is_empty() || arg.chars().any(char::is_whitespace) {
                return invalid(format!(
                    "kernel argument `{arg}` is empty or has white space"
                ));
            }
        }
        for (host, guest) in &self.payload {
            check_guest_path(guest)
                .map_err(|reason| QemuError::InvalidSpec(format!("payload `{guest}`: {reason}")))?;
            if guest == PAYLOAD_SCRIPT && !self.script.is_empty() {
                return invalid(format!(
                    "payload `{guest}` would replace the script; put it in `script`"
                ));
            }
            if !host.is_file() {
                return invalid(format!(
                    "payload host file {} does not exist or is not a file",
                    host.display()
                ));
            }
        }
        Ok(())
    }
}

/// Checks that a guest path is absolute and plain (no `.`, `..`, `//`, trailing `/`).
fn check_guest_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("`{path}` is not an absolute path"));
    }
    if path.len() == 1 || path.ends_with('/') {
        return Err(format!("`{path}` names a directory, not a file"));
    }
    if path.contains('\0') {
        return Err("the path has a NUL byte".to_string());
    }
    for part in path[1..].split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(format!("`{path}` has an empty, `.` or `..` component"));
        }
    }
    Ok(())
}

/// A writer of "newc" cpio archives, the format the kernel unpacks.
struct CpioWriter {
    out: Vec<u8>,
    next_inode: u32,
}

impl CpioWriter {
    fn new() -> Self {
        CpioWriter {
            out: Vec::new(),
            // Inodes only matter for hard links, which this writer never makes.
            next_inode: 1,
        }
    }

    fn pad(&mut self) {
        let padding = (CPIO_ALIGN - self.out.len() % CPIO_ALIGN) % CPIO_ALIGN;
        self.out.resize(self.out.len() + padding, 0);
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) -> Result<(), QemuError> {
        let too_big =
            || QemuError::InvalidSpec(format!("`{name}` is too large for a cpio archive"));
        let size = u32::try_from(data.len()).map_err(|_| too_big())?;
        let name_size = u32::try_from(name.len() + 1).map_err(|_| too_big())?;
        let inode = self.next_inode;
        self.next_inode += 1;
        let nlink: u32 = if mode & S_IFDIR != 0 { 2 } else { 1 };
        // magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
        // devminor, rdevmajor, rdevminor, namesize, check
        let fields = [inode, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, name_size, 0];
        let mut header = String::from(CPIO_NEWC_MAGIC);
        for field in fields {
            let _ = write!(header, "{field:08x}");
        }
        self.out.extend_from_slice(header.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
        Ok(())
    }

    fn finish(mut self) -> Result<Vec<u8>, QemuError> {
        self.entry(CPIO_TRAILER, 0, &[])?;
        Ok(self.out)
    }
}

/// One library line of `ldd` output.
#[derive(Debug, PartialEq, Eq)]
enum LddEntry {
    /// `libfoo.so.1 => /path/libfoo.so.1 (0x…)` or `/lib64/ld-linux…so.2 (0x…)`.
    Found { name: String, path: PathBuf },
    /// `libfoo.so.1 => not found`.
    NotFound { name: String },
}

fn parse_ldd(text: &str) -> Vec<LddEntry> {
    let mut entries = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some((name, rest)) = line.split_once(" => ") {
            let rest = rest.trim();
            if rest.starts_with("not found") {
                entries.push(LddEntry::NotFound {
                    name: name.to_string(),
                });
            } else if let Some(path) = rest
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/'))
            {
                entries.push(LddEntry::Found {
                    name: name.to_string(),
                    path: PathBuf::from(path),
                });
            }
        } else if let Some(path) = line
            .split_whitespace()
            .next()
            .filter(|p| p.starts_with('/'))
        {
            let name = Path::new(path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            entries.push(LddEntry::Found {
                name,
                path: PathBuf::from(path),
            });
        }
    }
    entries
}

fn is_elf(path: &Path) -> Result<bool, QemuError> {
    let mut magic = [0u8; 4];
    let mut file = File::open(path).map_err(io_err("cannot open", path))?;
    match file.read_exact(&mut magic) {
        Ok(()) => Ok(&magic == ELF_MAGIC),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(io_err("cannot read", path)(e)),
    }
}

fn ldd(path: &Path) -> Result<Vec<LddEntry>, QemuError> {
    let output = Command::new("ldd")
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| QemuError::Spawn {
            program: "ldd".to_string(),
            source,
        })?;
    // ldd fails for static executables ("not a dynamic executable"): no libraries.
    if !output.status.success() {
        return Ok(Vec::new());
    }
    Ok(parse_ldd(&String::from_utf8_lossy(&output.stdout)))
}

/// A file to put into the payload archive.
struct PayloadFile {
    guest: String,
    mode: u32,
    data: Vec<u8>,
}

fn read_payload_file(host: &Path, guest: String) -> Result<PayloadFile, QemuError> {
    let data = fs::read(host).map_err(io_err("cannot read payload file", host))?;
    let meta = fs::metadata(host).map_err(io_err("cannot stat payload file", host))?;
    use std::os::unix::fs::PermissionsExt as _;
    Ok(PayloadFile {
        guest,
        mode: meta.permissions().mode() & PERMISSION_BITS,
        data,
    })
}

/// Builds the payload cpio: the script, the files, and the libraries they need
/// that the image lacks.
fn build_payload(spec: &GuestSpec, manifest: &Manifest) -> Result<Vec<u8>, QemuError> {
    let mut files: BTreeMap<String, PayloadFile> = BTreeMap::new();
    if !spec.script.is_empty() {
        files.insert(
            PAYLOAD_SCRIPT.to_string(),
            PayloadFile {
                guest: PAYLOAD_SCRIPT.to_string(),
                mode: SCRIPT_MODE,
                data: spec.script.as_bytes().to_vec(),
            },
        );
    }
    for (host, guest) in &spec.payload {
        let guest = manifest.canonical_path(guest);
        if files.contains_key(&guest) {
            return Err(QemuError::InvalidSpec(format!(
                "two payload files go to `{guest}`"
            )));
        }
        files.insert(guest.clone(), read_payload_file(host, guest)?);
    }
    // Shared libraries of ELF payload files, by file name, that neither the
    // image nor the payload has.
    let payload_names: BTreeSet<String> = files
        .keys()
        .filter_map(|g| g.rsplit('/').next().map(str::to_string))
        .collect();
    let mut libraries: BTreeMap<String, PathBuf> = BTreeMap::new();
    for (host, _) in &spec.payload {
        if !is_elf(host)? {
            continue;
        }
        for entry in ldd(host)? {
            match entry {
                LddEntry::Found { name, path } => {
                    let guest = manifest.canonical_path(&path.to_string_lossy());
                    if !manifest.contains_file(&guest)
                        && !payload_names.contains(&name)
                        && !files.contains_key(&guest)
                    {
                        libraries.insert(guest, path);
                    }
                }
                LddEntry::NotFound { name } => {
                    if !payload_names.contains(&name) {
                        return Err(QemuError::MissingLibrary {
                            path: host.clone(),
                            library: name,
                        });
                    }
                }
            }
        }
    }
    for (guest, host) in libraries {
        files.insert(guest.clone(), read_payload_file(&host, guest)?);
    }

    let mut dirs: BTreeSet<String> = BTreeSet::new();
    for guest in files.keys() {
        let mut parent = Path::new(guest).parent();
        while let Some(dir) = parent {
            if dir.as_os_str() != "/" {
                dirs.insert(dir.to_string_lossy().into_owned());
            }
            parent = dir.parent();
        }
    }
    let mut cpio = CpioWriter::new();
    // BTreeSet order puts every directory before its children.
    for dir in &dirs {
        cpio.entry(dir.trim_start_matches('/'), S_IFDIR | DIR_MODE, &[])?;
    }
    for file in files.values() {
        cpio.entry(
            file.guest.trim_start_matches('/'),
            S_IFREG | file.mode,
            &file.data,
        )?;
    }
    cpio.finish()
}

/// Writes base initrd + padding + payload cpio into `dest`.
fn write_initrd(base: &Path, payload: &[u8], dest: &Path) -> Result<(), QemuError> {
    fs::copy(base, dest).map_err(io_err("cannot copy the base initrd to", dest))?;
    let mut file = OpenOptions::new()
        .append(true)
        .open(dest)
        .map_err(io_err("cannot open", dest))?;
    let len = file.metadata().map_err(io_err("cannot stat", dest))?.len();
    let padding = (INITRD_ALIGN - len % INITRD_ALIGN) % INITRD_ALIGN;
    let zeros = [0u8; INITRD_ALIGN as usize];
    file.write_all(&zeros[..padding as usize])
        .and_then(|()| file.write_all(payload))
        .map_err(io_err("cannot write", dest))
}

/// What another VMM (libvirt) needs to boot `spec`'s guest: the kernel, an
/// initrd with the payload (written into `dir`) and the kernel command line.
/// The console is the first serial port.
pub fn boot_files(spec: &GuestSpec, dir: &Path) -> Result<(PathBuf, PathBuf, String), QemuError> {
    spec.validate()?;
    let image = ensure_image()?;
    let payload = build_payload(spec, &image.manifest)?;
    let initrd = dir.join("initrd.img");
    write_initrd(&image.initrd, &payload, &initrd)?;
    let kernel = dir.join("vmlinuz");
    fs::copy(&image.kernel, &kernel).map_err(io_err("cannot copy the kernel to", &kernel))?;
    let mut cmdline = BASE_KERNEL_ARGS.to_string();
    for arg in &spec.kernel_args {
        cmdline.push(' ');
        cmdline.push_str(arg);
    }
    Ok((kernel, initrd, cmdline))
}

/// QEMU's option syntax doubles commas inside a value.
fn qemu_escape(value: &str) -> String {
    value.replace(',', ",,")
}

fn qemu_args(spec: &GuestSpec, kernel: &Path, initrd: &Path, accel: Accel) -> Vec<OsString> {
    let mut cmdline = BASE_KERNEL_ARGS.to_string();
    for arg in &spec.kernel_args {
        cmdline.push(' ');
        cmdline.push_str(arg);
    }
    let mib = spec.memory_mib;
    let mut args: Vec<OsString> = [
        "-name".to_string(),
        format!("vgpu-{}", spec.name),
        "-machine".to_string(),
        "q35".to_string(),
        "-accel".to_string(),
        accel.as_str().to_string(),
        "-cpu".to_string(),
        "max".to_string(),
        "-m".to_string(),
        format!("{mib}M"),
        "-object".to_string(),
        format!("memory-backend-memfd,id=mem,size={mib}M,share=on"),
        "-numa".to_string(),
        "node,memdev=mem".to_string(),
        "-nodefaults".to_string(),
        "-no-user-config".to_string(),
        "-display".to_string(),
        "none".to_string(),
        "-no-reboot".to_string(),
        "-chardev".to_string(),
        "stdio,id=console,signal=off".to_string(),
        "-serial".to_string(),
        "chardev:console".to_string(),
        "-append".to_string(),
        cmdline,
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    args.push("-kernel".into());
    args.push(kernel.into());
    args.push("-initrd".into());
    // -initrd splits its value at commas (several files); never a comma here.
    args.push(initrd.into());
    if let Some(socket) = &spec.vhost_user_vsock {
        args.push("-chardev".into());
        args.push(
            format!(
                "socket,id=vsock0,path={}",
                qemu_escape(&socket.to_string_lossy())
            )
            .into(),
        );
        args.push("-device".into());
        args.push("vhost-user-vsock-pci,chardev=vsock0".into());
    }
    args.extend(spec.extra_args.iter().map(OsString::from));
    args
}

// ---------------------------------------------------------------------------
// The running guest
// ---------------------------------------------------------------------------

/// One console line and when it arrived (since QEMU started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleLine {
    /// Time since QEMU was started.
    pub at: Duration,
    /// The line, without the line ending.
    pub text: String,
}

enum ConsoleEvent {
    Line(ConsoleLine),
    Eof,
}

/// How a guest ended.
#[derive(Debug, Clone)]
pub struct GuestOutcome {
    /// The exit status of `/payload/run.sh` (from `VGPU-GUEST-EXIT`).
    pub exit_code: i32,
    /// Every console line.
    pub console: Vec<String>,
    /// The lines between `VGPU-GUEST-PAYLOAD-START` and `VGPU-GUEST-EXIT`:
    /// what the script printed (kernel messages may interleave).
    pub payload_output: Vec<String>,
    /// From QEMU's start to `VGPU-GUEST-PAYLOAD-START`.
    pub boot_to_payload: Option<Duration>,
    /// From QEMU's start to its exit.
    pub elapsed: Duration,
    /// The accelerator the guest ran under.
    pub accel: Accel,
    /// The console log file.
    pub log_path: PathBuf,
}

impl GuestOutcome {
    /// The payload's output as one string, lines joined by `\n`.
    pub fn output_text(&self) -> String {
        self.payload_output.join("\n")
    }
}

/// Parses the status of a `VGPU-GUEST-EXIT <status>` line.
fn parse_exit_marker(line: &str) -> Option<i32> {
    let (_, rest) = line.split_once(MARKER_EXIT)?;
    let rest = rest.strip_prefix(' ')?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn payload_output(console: &[ConsoleLine]) -> Vec<String> {
    let start = console
        .iter()
        .position(|l| l.text.contains(MARKER_PAYLOAD_START))
        .map_or(console.len(), |i| i + 1);
    let end = console
        .iter()
        .rposition(|l| parse_exit_marker(&l.text).is_some())
        .unwrap_or(console.len())
        .max(start);
    let mut lines: Vec<String> = console[start..end].iter().map(|l| l.text.clone()).collect();
    // /init prints a newline before the exit marker in case the output was
    // not newline-terminated.
    if lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    lines
}

fn clean_line(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    text.trim_end_matches(['\n', '\r']).replace('\r', "")
}

/// A running QEMU guest. Dropping it kills QEMU.
pub struct Guest {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    events: Receiver<ConsoleEvent>,
    console: Vec<ConsoleLine>,
    /// Lines before this index were matched by `wait_for_line` already.
    cursor: usize,
    eof: bool,
    qemu_stderr: Arc<Mutex<Vec<String>>>,
    /// Joined once QEMU has exited, so error messages have all its messages.
    stderr_reader: Option<thread::JoinHandle<()>>,
    started: Instant,
    deadline: Instant,
    log_path: PathBuf,
    accel: Accel,
    expects_payload: bool,
    status: Option<ExitStatus>,
    /// Holds the combined initrd until QEMU is gone.
    _workdir: tempfile::TempDir,
}

impl std::fmt::Debug for Guest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guest")
            .field("name", &self.name)
            .field("pid", &self.child.id())
            .field("accel", &self.accel)
            .field("log_path", &self.log_path)
            .finish_non_exhaustive()
    }
}

impl Guest {
    /// Finds QEMU and builds the image if needed, then starts the guest.
    /// Returns once QEMU runs; use [`Guest::wait_for_line`] and
    /// [`Guest::wait_exit`] to follow it.
    pub fn boot(spec: &GuestSpec) -> Result<Guest, QemuError> {
        spec.validate()?;
        let qemu = ensure_qemu()?;
        let image = ensure_image()?;
        let accel = choose_accel(&qemu, &image)?;
        Guest::boot_with(spec, &qemu, &image, accel)
    }

    /// Starts a guest with a given QEMU binary, image and accelerator.
    pub fn boot_with(
        spec: &GuestSpec,
        qemu: &Path,
        image: &GuestImage,
        accel: Accel,
    ) -> Result<Guest, QemuError> {
        spec.validate()?;
        let payload = build_payload(spec, &image.manifest)?;
        let workdir = tempfile::Builder::new()
            .prefix("vgpu-guest-")
            .tempdir()
            .map_err(io_err(
                "cannot create a temporary directory in",
                &std::env::temp_dir(),
            ))?;
        let initrd = workdir.path().join("initrd.img");
        write_initrd(&image.initrd, &payload, &initrd)?;

        let log_dir = out_dir().join("guests");
        fs::create_dir_all(&log_dir).map_err(io_err("cannot create", &log_dir))?;
        let log_path = log_dir.join(format!("{}.log", spec.name));
        let mut log = File::create(&log_path).map_err(io_err("cannot create", &log_path))?;

        let args = qemu_args(spec, &image.kernel, &initrd, accel);
        let command_line = std::iter::once(qemu.as_os_str())
            .chain(args.iter().map(OsString::as_os_str))
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        // The log is for debugging; failing to write it must not fail the guest.
        let _ = writeln!(log, "# {command_line}");
        tracing::info!(guest = %spec.name, accel = accel.as_str(), "booting guest");

        let started = Instant::now();
        let mut child = Command::new(qemu)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| QemuError::Spawn {
                program: qemu.display().to_string(),
                source,
            })?;
        let log = Arc::new(Mutex::new(log));
        let qemu_stderr = Arc::new(Mutex::new(Vec::new()));
        let (tx, events) = mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            let log = Arc::clone(&log);
            thread::spawn(move || read_console(stdout, tx, log, started));
        }
        let stderr_reader = child.stderr.take().map(|stderr| {
            let lines = Arc::clone(&qemu_stderr);
            thread::spawn(move || read_qemu_stderr(stderr, lines, log))
        });
        Ok(Guest {
            name: spec.name.clone(),
            stdin: child.stdin.take(),
            child,
            events,
            console: Vec::new(),
            cursor: 0,
            eof: false,
            qemu_stderr,
            stderr_reader,
            started,
            deadline: started + spec.timeout,
            log_path,
            accel,
            expects_payload: spec.expects_payload(),
            status: None,
            _workdir: workdir,
        })
    }

    /// QEMU's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The console log file (`tests/out/guests/<name>.log`).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The accelerator this guest runs under.
    pub fn accel(&self) -> Accel {
        self.accel
    }

    /// The console lines received so far.
    pub fn console(&self) -> &[ConsoleLine] {
        &self.console
    }

    /// Types a line on the serial console (for the interactive shell).
    pub fn send_line(&mut self, line: &str) -> Result<(), QemuError> {
        let log = self.log_path.clone();
        let stdin = self.stdin.as_mut().ok_or_else(|| QemuError::Io {
            what: "the console input is closed; console log",
            path: log.clone(),
            source: io::Error::from(io::ErrorKind::BrokenPipe),
        })?;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(io_err(
                "cannot type on the console; console log",
                &self.log_path,
            ))
    }

    /// Waits until a console line contains `pattern` and returns that line.
    /// Each call looks at lines after the previous match, so repeated calls
    /// see successive occurrences.
    pub fn wait_for_line(&mut self, pattern: &str, timeout: Duration) -> Result<String, QemuError> {
        let what = format!("a console line with `{pattern}`");
        let begin = Instant::now();
        let deadline = (begin + timeout).min(self.deadline);
        let mut scanned = self.cursor;
        loop {
            while scanned < self.console.len() {
                let text = &self.console[scanned].text;
                if text.contains(pattern) {
                    self.cursor = scanned + 1;
                    return Ok(text.clone());
                }
                if self.expects_payload && text.contains(MARKER_SHELL) {
                    return Err(QemuError::NoPayload {
                        name: self.name.clone(),
                        log: self.log_path.clone(),
                        tail: self.tail(),
                    });
                }
                scanned += 1;
            }
            if self.eof {
                let status = self.reap();
                return Err(QemuError::Exited {
                    name: self.name.clone(),
                    what,
                    status,
                    log: self.log_path.clone(),
                    tail: self.tail(),
                });
            }
            if !self.pump(deadline) {
                return Err(QemuError::Timeout {
                    name: self.name.clone(),
                    what,
                    waited: begin.elapsed(),
                    log: self.log_path.clone(),
                    tail: self.tail(),
                });
            }
        }
    }

    /// Waits for the guest to power off and returns the payload's exit status
    /// and the console. On timeout QEMU is killed.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<GuestOutcome, QemuError> {
        let begin = Instant::now();
        let deadline = (begin + timeout).min(self.deadline);
        let mut scanned = 0;
        while !self.eof {
            while scanned < self.console.len() {
                if self.expects_payload && self.console[scanned].text.contains(MARKER_SHELL) {
                    self.kill();
                    return Err(QemuError::NoPayload {
                        name: self.name.clone(),
                        log: self.log_path.clone(),
                        tail: self.tail(),
                    });
                }
                scanned += 1;
            }
            if !self.pump(deadline) {
                let waited = begin.elapsed();
                self.kill();
                return Err(QemuError::Timeout {
                    name: self.name.clone(),
                    what: "the guest to power off".to_string(),
                    waited,
                    log: self.log_path.clone(),
                    tail: self.tail(),
                });
            }
        }
        let status = self.reap();
        let elapsed = self.started.elapsed();
        let exit_code = self
            .console
            .iter()
            .rev()
            .find_map(|l| parse_exit_marker(&l.text));
        let Some(exit_code) = exit_code else {
            return Err(QemuError::NoExitMarker {
                name: self.name.clone(),
                status,
                log: self.log_path.clone(),
                tail: self.tail(),
            });
        };
        Ok(GuestOutcome {
            exit_code,
            console: self.console.iter().map(|l| l.text.clone()).collect(),
            payload_output: payload_output(&self.console),
            boot_to_payload: self
                .console
                .iter()
                .find(|l| l.text.contains(MARKER_PAYLOAD_START))
                .map(|l| l.at),
            elapsed,
            accel: self.accel,
            log_path: self.log_path.clone(),
        })
    }

    /// Kills QEMU (if it still runs) and reaps it.
    pub fn kill(&mut self) {
        if self.status.is_none() {
            // Errors mean it has exited already; wait() below reaps it either way.
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
        self.stdin = None;
        self.join_stderr();
    }

    /// QEMU has exited: its stderr reaches EOF, so this join is short.
    fn join_stderr(&mut self) {
        if self.status.is_none() {
            return;
        }
        if let Some(reader) = self.stderr_reader.take() {
            let _ = reader.join();
        }
    }

    /// Receives one console event, or returns false at the deadline.
    fn pump(&mut self, deadline: Instant) -> bool {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        match self.events.recv_timeout(deadline - now) {
            Ok(ConsoleEvent::Line(line)) => {
                self.console.push(line);
                true
            }
            Ok(ConsoleEvent::Eof) | Err(RecvTimeoutError::Disconnected) => {
                self.eof = true;
                true
            }
            Err(RecvTimeoutError::Timeout) => false,
        }
    }

    /// After the console closed: waits briefly for QEMU to exit, else kills it.
    /// Returns its exit status in words.
    fn reap(&mut self) -> String {
        let grace = Instant::now() + EXIT_GRACE;
        while self.status.is_none() && Instant::now() < grace {
            match self.child.try_wait() {
                Ok(Some(status)) => self.status = Some(status),
                Ok(None) => thread::sleep(EXIT_POLL),
                Err(_) => break,
            }
        }
        if self.status.is_none() {
            self.kill();
        }
        self.join_stderr();
        self.status
            .map_or_else(|| "unknown status".to_string(), |s| s.to_string())
    }

    fn tail(&self) -> String {
        let start = self.console.len().saturating_sub(ERROR_TAIL_LINES);
        let mut tail: Vec<String> = self.console[start..]
            .iter()
            .map(|l| format!("  | {}", l.text))
            .collect();
        for line in lock(&self.qemu_stderr).iter() {
            tail.push(format!("  [qemu] {line}"));
        }
        tail.join("\n")
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.kill();
    }
}

fn read_console(
    stdout: impl Read,
    tx: Sender<ConsoleEvent>,
    log: Arc<Mutex<File>>,
    started: Instant,
) {
    let mut reader = BufReader::new(stdout);
    let mut raw = Vec::new();
    loop {
        raw.clear();
        match reader.read_until(b'\n', &mut raw) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = clean_line(&raw);
                let _ = writeln!(lock(&log), "{text}");
                // A dropped Guest stops listening; keep draining so QEMU never
                // blocks on a full pipe before it is killed.
                let _ = tx.send(ConsoleEvent::Line(ConsoleLine {
                    at: started.elapsed(),
                    text,
                }));
            }
        }
    }
    let _ = tx.send(ConsoleEvent::Eof);
}

fn read_qemu_stderr(stderr: impl Read, lines: Arc<Mutex<Vec<String>>>, log: Arc<Mutex<File>>) {
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        let _ = writeln!(lock(&log), "[qemu] {line}");
        lock(&lines).push(line);
    }
}

/// Boots a guest, waits for it to power off (within `spec.timeout`) and
/// returns the outcome.
pub fn run_guest(spec: &GuestSpec) -> Result<GuestOutcome, QemuError> {
    let mut guest = Guest::boot(spec)?;
    guest.wait_exit(spec.timeout)
}

/// Returns `Some(reason)` when guests cannot run here because QEMU is missing
/// and cannot be installed; tests print it and skip.
pub fn skip_reason() -> Option<String> {
    static REASON: OnceLock<Option<String>> = OnceLock::new();
    REASON
        .get_or_init(|| match ensure_qemu() {
            Ok(_) => None,
            Err(e @ QemuError::QemuMissing { .. }) => Some(e.to_string()),
            Err(e) => Some(format!("cannot find QEMU: {e}")),
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = "# comment\nkey=abc\nkernel_release=6.1.0-56-cloud-amd64\n\
        modules=virtio_ring virtio vsock\n\
        symlink\t/lib\t/usr/lib\nsymlink\t/bin\t/usr/bin\n\
        file\t/usr/lib/x86_64-linux-gnu/libc.so.6\thost libc6 2.36\n\
        file\t/usr/bin/busybox\tbusybox-static 1.35\n";

    fn manifest() -> Manifest {
        Manifest::parse(MANIFEST, Path::new("manifest.txt")).unwrap()
    }

    /// A minimal newc reader: (name, mode, data) per entry, trailer excluded.
    fn read_cpio(mut bytes: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let align = |n: usize| n.div_ceil(CPIO_ALIGN) * CPIO_ALIGN;
        let total = bytes.len();
        let mut entries = Vec::new();
        loop {
            let offset = total - bytes.len();
            assert_eq!(offset % CPIO_ALIGN, 0, "entry at unaligned offset {offset}");
            assert_eq!(&bytes[..6], CPIO_NEWC_MAGIC.as_bytes());
            let field = |i: usize| {
                let s = std::str::from_utf8(&bytes[6 + i * 8..14 + i * 8]).unwrap();
                u32::from_str_radix(s, 16).unwrap() as usize
            };
            let (mode, size, name_size) = (field(1) as u32, field(6), field(11));
            let name = std::str::from_utf8(&bytes[110..110 + name_size - 1])
                .unwrap()
                .to_string();
            assert_eq!(bytes[110 + name_size - 1], 0);
            let data_start = align(110 + name_size);
            let data = bytes[data_start..data_start + size].to_vec();
            bytes = &bytes[align(data_start + size)..];
            if name == CPIO_TRAILER {
                assert!(bytes.is_empty());
                return entries;
            }
            entries.push((name, mode, data));
        }
    }

    #[test]
    fn manifest_parses_values_files_and_links() {
        let m = manifest();
        assert_eq!(m.kernel_release, "6.1.0-56-cloud-amd64");
        assert_eq!(m.modules, ["virtio_ring", "virtio", "vsock"]);
        assert_eq!(m.value("key"), Some("abc"));
        assert_eq!(m.file_count(), 2);
        assert!(m.contains_file("/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(m.contains_file("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(!m.contains_file("/lib/x86_64-linux-gnu/libcuda.so.1"));
        assert_eq!(m.canonical_path("/lib"), "/usr/lib");
        assert_eq!(m.canonical_path("/library/x"), "/library/x");
        assert_eq!(m.canonical_path("/bin/sh"), "/usr/bin/sh");
        assert_eq!(m.canonical_path("/payload/bin/x"), "/payload/bin/x");
    }

    #[test]
    fn malformed_manifests_are_rejected_with_the_line() {
        let cases = [
            ("kernel_release=x\nfile\trelative\tsrc\n", 2),
            ("kernel_release=x\nbogus line\n", 2),
            ("kernel_release=x\nfile\t/a\n", 2),
            ("modules=a\n", 0),
            ("kernel_release=x\nsymlink\t/lib\t../usr\n", 2),
        ];
        for (text, line) in cases {
            match Manifest::parse(text, Path::new("m")) {
                Err(QemuError::Manifest { line: got, .. }) => assert_eq!(got, line, "{text:?}"),
                other => panic!("{text:?}: expected a manifest error, got {other:?}"),
            }
        }
    }

    #[test]
    fn guest_paths_must_be_plain_and_absolute() {
        for good in [
            "/a",
            "/payload/bin/vsock-echo",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        ] {
            assert_eq!(check_guest_path(good), Ok(()), "{good}");
        }
        for bad in ["", "a/b", "/", "/a/", "/a//b", "/a/./b", "/a/../b", "/a\0b"] {
            assert!(check_guest_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ldd_output_is_parsed() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
            \tlibdl.so.2 => /lib/x86_64-linux-gnu/libdl.so.2 (0x00007f1)\n\
            \tlibcuda.so.1 => not found\n\
            \t/lib64/ld-linux-x86-64.so.2 (0x00007f2)\n";
        assert_eq!(
            parse_ldd(text),
            [
                LddEntry::Found {
                    name: "libdl.so.2".into(),
                    path: "/lib/x86_64-linux-gnu/libdl.so.2".into()
                },
                LddEntry::NotFound {
                    name: "libcuda.so.1".into()
                },
                LddEntry::Found {
                    name: "ld-linux-x86-64.so.2".into(),
                    path: "/lib64/ld-linux-x86-64.so.2".into()
                },
            ]
        );
        assert!(parse_ldd("\tnot a dynamic executable\n").is_empty());
    }

    #[test]
    fn exit_markers_are_parsed() {
        assert_eq!(parse_exit_marker("VGPU-GUEST-EXIT 0"), Some(0));
        assert_eq!(parse_exit_marker("VGPU-GUEST-EXIT 127"), Some(127));
        assert_eq!(parse_exit_marker("[ 3.1] noise VGPU-GUEST-EXIT 7"), Some(7));
        assert_eq!(parse_exit_marker("VGPU-GUEST-EXIT"), None);
        assert_eq!(parse_exit_marker("VGPU-GUEST-EXIT x"), None);
        assert_eq!(parse_exit_marker("VGPU-GUEST-EXITED 3"), None);
    }

    #[test]
    fn payload_output_is_between_the_markers() {
        let lines = |texts: &[&str]| -> Vec<ConsoleLine> {
            texts
                .iter()
                .map(|t| ConsoleLine {
                    at: Duration::ZERO,
                    text: (*t).to_string(),
                })
                .collect()
        };
        let console = lines(&[
            "VGPU-GUEST-READY uptime=2",
            "VGPU-GUEST-PAYLOAD-START uptime=2",
            "hello",
            "",
            "world",
            "",
            "VGPU-GUEST-EXIT 0",
            "reboot: Power down",
        ]);
        assert_eq!(payload_output(&console), ["hello", "", "world"]);
        let unterminated = lines(&["VGPU-GUEST-PAYLOAD-START", "partial", "VGPU-GUEST-EXIT 1"]);
        assert_eq!(payload_output(&unterminated), ["partial"]);
        assert!(payload_output(&lines(&["panic"])).is_empty());
    }

    #[test]
    fn console_lines_lose_line_endings() {
        assert_eq!(clean_line(b"abc\r\n"), "abc");
        assert_eq!(clean_line(b"a\rb\n"), "ab");
        assert_eq!(clean_line(b"\xffx\n"), "\u{fffd}x");
    }

    #[test]
    fn payload_archive_has_script_files_and_parent_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("data.bin");
        fs::write(&host, b"0123456789").unwrap();
        let mut spec = GuestSpec::new("t", "echo hi\n");
        spec.payload.push((
            host.clone(),
            "/lib/x86_64-linux-gnu/libfake.so.1".to_string(),
        ));
        spec.payload.push((host, "/payload/data/x".to_string()));
        let archive = build_payload(&spec, &manifest()).unwrap();
        assert_eq!(archive.len() % CPIO_ALIGN, 0);
        let entries = read_cpio(&archive);
        let names: Vec<&str> = entries.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "payload",
                "payload/data",
                "usr",
                "usr/lib",
                "usr/lib/x86_64-linux-gnu",
                "payload/data/x",
                "payload/run.sh",
                "usr/lib/x86_64-linux-gnu/libfake.so.1",
            ]
        );
        let by_name = |n: &str| entries.iter().find(|(name, _, _)| name == n).unwrap();
        assert_eq!(by_name("payload").1, S_IFDIR | DIR_MODE);
        assert_eq!(by_name("payload/run.sh").1, S_IFREG | SCRIPT_MODE);
        assert_eq!(by_name("payload/run.sh").2, b"echo hi\n");
        assert_eq!(by_name("payload/data/x").2, b"0123456789");
    }

    #[test]
    fn payload_archive_is_read_by_cpio() {
        let Ok(probe) = Command::new("cpio").arg("--version").output() else {
            eprintln!("cpio is not installed; skipping the cross-check with GNU cpio");
            return;
        };
        assert!(probe.status.success());
        let archive = build_payload(&GuestSpec::new("t", "exit 0"), &manifest()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.cpio");
        fs::write(&path, &archive).unwrap();
        let out = Command::new("cpio")
            .args(["-it", "--quiet", "-F"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "payload\npayload/run.sh\n"
        );
    }

    #[test]
    fn elf_payloads_bring_missing_libraries() {
        // The test binary itself is a dynamically linked ELF file whose libc
        // the manifest has; any other library it needs must come along.
        let exe = std::env::current_exe().unwrap();
        let mut spec = GuestSpec::new("t", "");
        spec.payload
            .push((exe.clone(), "/payload/bin/t".to_string()));
        let m = manifest();
        let entries = read_cpio(&build_payload(&spec, &m).unwrap());
        let names: Vec<String> = entries.iter().map(|(n, _, _)| format!("/{n}")).collect();
        assert!(names.contains(&"/payload/bin/t".to_string()));
        for entry in ldd(&exe).unwrap() {
            if let LddEntry::Found { path, .. } = entry {
                let guest = m.canonical_path(&path.to_string_lossy());
                assert!(
                    m.contains_file(&guest) || names.contains(&guest),
                    "{guest} is neither in the image nor in the payload: {names:?}"
                );
            }
        }
        assert!(!names.contains(&"/usr/lib/x86_64-linux-gnu/libc.so.6".to_string()));
    }

    #[test]
    fn written_initrd_aligns_the_payload() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        fs::write(&base, b"12345").unwrap();
        let dest = dir.path().join("initrd");
        write_initrd(&base, b"070701rest", &dest).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"12345\x00\x00\x00070701rest");
    }

    #[test]
    fn invalid_specs_are_refused_before_qemu_starts() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        let mut cases: Vec<(GuestSpec, &str)> = Vec::new();
        let base = GuestSpec::new("ok", "true");
        assert!(base.validate().is_ok());
        let mut s = base.clone();
        s.name = "a b".into();
        cases.push((s, "guest name"));
        let mut s = base.clone();
        s.memory_mib = 1;
        cases.push((s, "memory_mib"));
        let mut s = base.clone();
        s.timeout = Duration::ZERO;
        cases.push((s, "timeout"));
        let mut s = base.clone();
        s.vhost_user_vsock = Some(dir.path().join("missing.sock"));
        cases.push((s, "start vgpud"));
        let mut s = base.clone();
        s.payload.push((file.clone(), "relative".into()));
        cases.push((s, "absolute"));
        let mut s = base.clone();
        s.payload.push((dir.path().join("nope"), "/x".into()));
        cases.push((s, "does not exist"));
        let mut s = base.clone();
        s.payload.push((file.clone(), PAYLOAD_SCRIPT.into()));
        cases.push((s, "replace the script"));
        let mut s = base.clone();
        s.kernel_args.push("a b".into());
        cases.push((s, "white space"));
        for (spec, needle) in cases {
            match spec.validate() {
                Err(QemuError::InvalidSpec(msg)) => assert!(msg.contains(needle), "{msg}"),
                other => panic!("expected InvalidSpec with `{needle}`, got {other:?}"),
            }
        }
        let mut s = base;
        s.payload.push((file.clone(), "/x".into()));
        s.payload.push((file, "/x".into()));
        assert!(matches!(
            build_payload(&s, &manifest()),
            Err(QemuError::InvalidSpec(msg)) if msg.contains("two payload files")
        ));
    }

    #[test]
    fn qemu_command_line_has_shared_memory_and_the_vsock_device() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("a,b.sock");
        let mut spec = GuestSpec::new("g", "true");
        spec.memory_mib = 256;
        spec.vhost_user_vsock = Some(socket.clone());
        spec.kernel_args.push("vgpu.shell".into());
        spec.extra_args.push("-smp".into());
        spec.extra_args.push("2".into());
        let args: Vec<String> = qemu_args(&spec, Path::new("/k"), Path::new("/i"), Accel::Tcg)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let joined = args.join(" ");
        for expected in [
            "-machine q35",
            "-accel tcg",
            "-cpu max",
            "-m 256M",
            "-object memory-backend-memfd,id=mem,size=256M,share=on",
            "-numa node,memdev=mem",
            "-no-reboot",
            "-kernel /k",
            "-initrd /i",
            "-device vhost-user-vsock-pci,chardev=vsock0",
        ] {
            assert!(
                joined.contains(expected),
                "missing `{expected}` in {joined}"
            );
        }
        let chardev = format!(
            "socket,id=vsock0,path={}",
            socket.to_string_lossy().replace(',', ",,")
        );
        assert!(args.contains(&chardev), "{joined}");
        let append = args.iter().position(|a| a == "-append").unwrap();
        assert_eq!(args[append + 1], "console=ttyS0 quiet panic=-1 vgpu.shell");
        assert_eq!(&args[args.len() - 2..], ["-smp", "2"]);
        assert!(!spec.expects_payload());
    }

    #[test]
    fn guest_programs_compile_or_report_the_compiler_error() {
        if Command::new("cc").arg("--version").output().is_err() {
            eprintln!("no C compiler; skipping");
            return;
        }
        let binary = build_guest_program("vsock-echo").unwrap();
        assert!(is_elf(&binary).unwrap());
        let out = Command::new(&binary).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "usage error expected");
        assert!(String::from_utf8_lossy(&out.stderr).contains("usage: vsock-echo"));
        assert!(matches!(
            build_guest_program("../etc/passwd"),
            Err(QemuError::InvalidSpec(_))
        ));
        assert!(matches!(
            build_guest_program("no-such-program"),
            Err(QemuError::Io { .. })
        ));
    }

    #[test]
    fn the_shim_bundle_goes_off_the_search_paths_with_its_installer() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libcuda.so");
        let nvml = dir.path().join("libnvidia_ml.so");
        let smi = dir.path().join("vgpu-smi");
        fs::write(&lib, b"lib").unwrap();
        fs::write(&nvml, b"nvml").unwrap();
        fs::write(&smi, b"smi").unwrap();
        let mut spec = GuestSpec::new("g", "true");
        let cmd = spec.add_vgpu_shim(&lib, &nvml, &smi);
        assert_eq!(cmd, "sh /payload/vgpu/install.sh --from /payload/vgpu");
        let guests: Vec<&str> = spec.payload.iter().map(|(_, g)| g.as_str()).collect();
        assert_eq!(
            guests,
            [
                "/payload/vgpu/libcuda.so.1",
                "/payload/vgpu/libnvidia-ml.so.1",
                "/payload/vgpu/vgpu-smi",
                "/payload/vgpu/install.sh"
            ]
        );
        assert!(spec.payload[3].0.ends_with("guest-shim/install.sh"));
        spec.validate().unwrap();
        // The bundle's libcuda.so.1 satisfies programs linked with -lcuda.
        let cpio = build_payload(&spec, &manifest()).unwrap();
        let names: Vec<String> = read_cpio(&cpio).into_iter().map(|e| e.0).collect();
        assert!(
            names.contains(&"payload/vgpu/libcuda.so.1".to_string()),
            "{names:?}"
        );
    }
}
