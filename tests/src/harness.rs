//! Test harness: builds the daemon and the shim, runs vgpud with a generated
//! config, talks to its admin API, and builds C test programs against the
//! shim.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Built binaries the tests use.
#[derive(Debug)]
pub struct Artifacts {
    /// The cargo profile directory (`target/debug`).
    pub profile_dir: PathBuf,
    /// `vgpud`.
    pub vgpud: PathBuf,
    /// `vgpuctl`.
    pub vgpuctl: PathBuf,
    /// `vgpu-smi`.
    pub vgpu_smi: PathBuf,
    /// A directory holding `libcuda.so` and `libcuda.so.1` (the shim).
    pub lib_dir: PathBuf,
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn profile_dir() -> PathBuf {
    // The test binary lives in <target>/<profile>/deps/.
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary in <profile>/deps")
        .to_path_buf()
}

/// Builds vgpud, vgpuctl, vgpu-smi and libcuda.so once per test process.
pub fn artifacts() -> &'static Artifacts {
    static A: OnceLock<Artifacts> = OnceLock::new();
    A.get_or_init(|| {
        let profile_dir = profile_dir();
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(workspace_root()).args([
            "build",
            "-q",
            "-p",
            "vgpud",
            "-p",
            "vgpu-shim",
            "-p",
            "vgpu-nvml",
            "-p",
            "vgpu-host-tools",
        ]);
        if release {
            cmd.arg("--release");
        }
        if let Some(target) = profile_dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        let st = cmd.status().expect("running cargo build");
        assert!(st.success(), "cargo build of the daemon and shim failed");
        let lib_dir = profile_dir.join("vgpu-lib");
        std::fs::create_dir_all(&lib_dir).expect("lib dir");
        // The shim, and NVML's library: a filter whose symbols resolve in the shim
        // (guest-shim/nvml).
        for (name, file) in [
            ("libcuda.so", "libcuda.so"),
            ("libcuda.so.1", "libcuda.so"),
            ("libnvidia-ml.so", "libnvidia_ml.so"),
            ("libnvidia-ml.so.1", "libnvidia_ml.so"),
        ] {
            let link = lib_dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(profile_dir.join(file), &link).expect("symlink");
        }
        Artifacts {
            vgpud: profile_dir.join("vgpud"),
            vgpuctl: profile_dir.join("vgpuctl"),
            vgpu_smi: profile_dir.join("vgpu-smi"),
            lib_dir,
            profile_dir,
        }
    })
}

/// Compiles a C test program from `tests/c/<name>.c` against the shim, once
/// per test process (built under a temporary name and renamed into place, so
/// a copy running from another test is never overwritten while it runs).
pub fn build_c_program(name: &str) -> PathBuf {
    build_c_program_linking(name, &[])
}

/// [`build_c_program`] for a program that also links `libs` (`-l` names) from the shim's
/// library directory, as `libnvidia-ml` for NVML programs.
pub fn build_c_program_linking(name: &str, libs: &[&str]) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, p)) = built.iter().find(|(n, _)| n == name) {
        return p.clone();
    }
    let a = artifacts();
    let src = workspace_root().join("tests/c").join(format!("{name}.c"));
    let out = a.profile_dir.join(format!("c-{name}"));
    let tmp = a
        .profile_dir
        .join(format!("c-{name}.{}.tmp", std::process::id()));
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&tmp)
        .arg(&src)
        .arg(format!("-L{}", a.lib_dir.display()))
        .args(libs.iter().map(|l| format!("-l{l}")))
        .arg("-lcuda")
        .arg(format!("-Wl,-rpath,{}", a.lib_dir.display()))
        .status()
        .expect("running cc");
    assert!(st.success(), "cc failed for {}", src.display());
    std::fs::rename(&tmp, &out).expect("installing the test program");
    built.push((name.to_string(), out.clone()));
    out
}

/// A VM of a test daemon.
#[derive(Debug, Clone)]
pub struct TestVm {
    /// Name.
    pub name: String,
    /// Slice in bytes.
    pub memory: u64,
    /// Compute share weight (vgpud's default when `None`).
    pub weight: Option<u32>,
    /// With a CID: vgpud also serves a vhost-user vsock device for the VM at
    /// [`Vgpud::vhost_socket`], forwarding other ports to [`Vgpud::vsock_uds`].
    pub guest_cid: Option<u64>,
}

impl TestVm {
    /// A VM with a slice.
    pub fn new(name: &str, memory: u64) -> Self {
        Self {
            name: name.into(),
            memory,
            weight: None,
            guest_cid: None,
        }
    }

    /// Sets the compute share weight.
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = Some(weight);
        self
    }

    /// Gives the VM a vhost-user vsock device with this guest CID.
    pub fn vsock(mut self, guest_cid: u64) -> Self {
        self.guest_cid = Some(guest_cid);
        self
    }
}

/// Replaced by the daemon's directory in [`Vgpud::start_config`] texts.
pub const DIR_PLACEHOLDER: &str = "@DIR@";
/// How long vgpud may take to open its sockets.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(20);

/// A vgpud process serving unix sockets in a temporary directory.
pub struct Vgpud {
    child: Child,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Vgpud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vgpud")
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl Vgpud {
    /// Starts vgpud with a simulated GPU and the given VMs, and waits until
    /// its sockets accept connections.
    pub fn start(vms: &[TestVm]) -> Vgpud {
        Self::start_with(vms, "")
    }

    /// Like [`Vgpud::start`], with extra lines for the `[[device]]` table
    /// (e.g. `watchdog_ms = 300`).
    pub fn start_with(vms: &[TestVm], device_extra: &str) -> Vgpud {
        Self::start_config(&Self::config_for(vms, device_extra))
    }

    /// [`Vgpud::start`] under a hard limit on vgpud's private memory (`RLIMIT_DATA`), for tests
    /// of hostile guests: past it an allocation fails and vgpud aborts, which the test sees.
    pub fn start_limited(vms: &[TestVm], data_limit: u64) -> Vgpud {
        Self::start_config_limited(&Self::config_for(vms, ""), data_limit)
    }

    /// The `Max data size` soft limit vgpud runs under (`None`: unlimited or unreadable).
    pub fn data_limit(&self) -> Option<u64> {
        std::fs::read_to_string(format!("/proc/{}/limits", self.pid()))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("Max data size"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    }

    /// The config text [`Vgpud::start_with`] runs vgpud with.
    pub fn config_for(vms: &[TestVm], device_extra: &str) -> String {
        let mut cfg = format!(
            "[admin]\nsocket = \"{DIR_PLACEHOLDER}/admin.sock\"\n\n[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"4GiB\"\nworkers = 2\n{device_extra}\n",
        );
        for vm in vms {
            cfg += &format!(
                "\n[[vm]]\nname = \"{name}\"\ndevice = \"gpu0\"\nmemory = {}\nunix_socket = \"{DIR_PLACEHOLDER}/{name}.sock\"\n",
                vm.memory,
                name = vm.name,
            );
            if let Some(w) = vm.weight {
                cfg += &format!("weight = {w}\n");
            }
            if let Some(cid) = vm.guest_cid {
                cfg += &format!(
                    "vhost_user_socket = \"{DIR_PLACEHOLDER}/{}.vhost.sock\"\nguest_cid = {cid}\n",
                    vm.name
                );
            }
        }
        cfg
    }

    /// Starts vgpud with a complete config text, in which `@DIR@`
    /// ([`DIR_PLACEHOLDER`]) stands for the daemon's temporary directory.
    /// Waits until every `socket`, `unix_socket` and `vhost_user_socket` the
    /// config names is there (the listeners accept, the vhost-user sockets
    /// exist: connecting to those would attach a VMM).
    pub fn start_config(config_text: &str) -> Vgpud {
        Self::spawn(config_text, None)
    }

    /// Like [`Vgpud::start_config`], under a hard limit of `data_limit` bytes on vgpud's
    /// private writable memory (`RLIMIT_DATA`: its heap, thread stacks and the simulated GPU's
    /// memory, not the guest memory it maps shared). An allocation past it fails, and vgpud
    /// aborts: a test that checks [`Vgpud::is_running`] afterwards sees it.
    pub fn start_config_limited(config_text: &str, data_limit: u64) -> Vgpud {
        Self::spawn(config_text, Some(data_limit))
    }

    fn spawn(config_text: &str, data_limit: Option<u64>) -> Vgpud {
        let a = artifacts();
        let dir = tempfile::tempdir().expect("tempdir");
        let text = config_text.replace(DIR_PLACEHOLDER, &dir.path().to_string_lossy());
        let config = dir.path().join("vgpud.toml");
        std::fs::write(&config, &text).expect("config");
        let log = std::fs::File::create(dir.path().join("vgpud.log")).expect("log");
        let mut cmd = Command::new(&a.vgpud);
        cmd.arg("--config")
            .arg(&config)
            .arg("--log")
            .arg("debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(bytes) = data_limit {
            let limit = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            let set_limit = move || {
                // SAFETY: `setrlimit` only reads `limit`, a plain value owned by this closure.
                if unsafe { libc::setrlimit(libc::RLIMIT_DATA, &limit) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            };
            // SAFETY: the closure runs in the forked child before `exec`; it calls only
            // `setrlimit`, a system call that is async-signal-safe, and allocates nothing
            // (`last_os_error` reads `errno`).
            unsafe { cmd.pre_exec(set_limit) };
        }
        let child = cmd.spawn().expect("starting vgpud");
        let mut d = Vgpud { child, dir };
        let (listeners, vhost) = config_sockets(&text);
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while !(listeners.iter().all(|p| UnixStream::connect(p).is_ok())
            && vhost.iter().all(|p| p.exists()))
        {
            assert!(
                d.is_running(),
                "vgpud exited at start; config:\n{text}\nlog:\n{}",
                d.log()
            );
            assert!(
                Instant::now() < deadline,
                "vgpud did not come up; log:\n{}",
                d.log()
            );
            std::thread::sleep(POLL);
        }
        d
    }

    /// The daemon's temporary directory (sockets, config, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The vhost-user socket of a VM started with [`TestVm::vsock`].
    pub fn vhost_socket(&self, vm: &str) -> PathBuf {
        self.dir.path().join(format!("{vm}.vhost.sock"))
    }

    /// The hybrid-vsock socket of a VM started with [`TestVm::vsock`]
    /// (vgpud's default `vsock_uds_path`): guest connections to host port P
    /// go to `<this>_P`.
    pub fn vsock_uds(&self, vm: &str) -> PathBuf {
        self.dir.path().join(format!("{vm}.vsock"))
    }

    /// The unix socket of a VM.
    pub fn socket(&self, vm: &str) -> PathBuf {
        self.dir.path().join(format!("{vm}.sock"))
    }

    /// `VGPU_TRANSPORT` value for a VM.
    pub fn transport(&self, vm: &str) -> String {
        format!("unix:{}", self.socket(vm).display())
    }

    /// The admin socket.
    pub fn admin_socket(&self) -> PathBuf {
        self.dir.path().join("admin.sock")
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("vgpud.log")).unwrap_or_default()
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the daemon is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// GET on the admin API; returns (status, JSON body).
    pub fn get(&self, path: &str) -> (u16, serde_json::Value) {
        http_get(&self.admin_socket(), path)
    }

    /// The value of the Prometheus series `name{vm="VM",…}` on the admin socket's
    /// `/v1/metrics` (`None` when vgpud exports no such series).
    pub fn vm_metric(&self, name: &str, vm: &str) -> Option<f64> {
        let (st, text) = http_get_text(&self.admin_socket(), "/v1/metrics");
        assert_eq!(st, 200, "{text}");
        let prefix = format!("{name}{{vm=\"{vm}\"");
        text.lines()
            .find(|l| l.starts_with(&prefix))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse().ok())
    }

    /// A VM's admin JSON.
    pub fn vm(&self, name: &str) -> serde_json::Value {
        let (st, v) = self.get(&format!("/v1/vms/{name}"));
        assert_eq!(st, 200, "{v}");
        v
    }

    /// Waits until a VM's `memory_used` equals `bytes`.
    pub fn wait_memory_used(&self, vm: &str, bytes: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let used = self.vm(vm)["memory_used"].as_u64().unwrap_or(u64::MAX);
            if used == bytes {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "VM {vm} still uses {used} bytes, expected {bytes}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Unwraps a guest's result; on error panics with `what`, the error (it
    /// quotes the guest console and QEMU's messages) and vgpud's log tail.
    pub fn guest_ok<T>(&self, r: Result<T, crate::qemu::QemuError>, what: &str) -> T {
        r.unwrap_or_else(|e| panic!("{what}: {e}\nvgpud log tail:\n{}", log_tail(&self.log())))
    }

    /// Polls a VM's admin JSON until `pred` holds and returns that JSON;
    /// panics after `timeout` with `what`, the last JSON and the log.
    pub fn wait_vm(
        &self,
        vm: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.vm(vm);
            if pred(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "VM {vm}: {what} did not happen within {timeout:?}; admin view:\n{v:#}\nlog tail:\n{}",
                log_tail(&self.log())
            );
            std::thread::sleep(POLL);
        }
    }
}

/// The last lines of a log, for assertion messages.
fn log_tail(log: &str) -> String {
    const LINES: usize = 60;
    // The harness's own polling of the admin API would drown everything else.
    let lines: Vec<&str> = log.lines().filter(|l| !l.contains(ADMIN_GET_LOG)).collect();
    lines[lines.len().saturating_sub(LINES)..].join("\n")
}

/// How vgpud logs a GET on its admin API (at debug level).
const ADMIN_GET_LOG: &str = "admin request method=GET";

/// The listener sockets (`socket`, `unix_socket`) and vhost-user sockets a
/// config names, from its `key = "path"` lines.
fn config_sockets(text: &str) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut listeners = Vec::new();
    let mut vhost = Vec::new();
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.split('#').next().unwrap_or("").trim();
        let Some(path) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else {
            continue;
        };
        match key.trim() {
            "socket" | "unix_socket" => listeners.push(PathBuf::from(path)),
            "vhost_user_socket" => vhost.push(PathBuf::from(path)),
            _ => {}
        }
    }
    (listeners, vhost)
}

impl Drop for Vgpud {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal HTTP GET over a unix socket; returns (status, body text).
pub fn http_get_text(socket: &Path, path: &str) -> (u16, String) {
    let mut s = UnixStream::connect(socket).expect("admin socket");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: vgpud\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("response");
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

/// A minimal HTTP GET over a unix socket; returns (status, JSON body).
pub fn http_get(socket: &Path, path: &str) -> (u16, serde_json::Value) {
    let (status, body) = http_get_text(socket, path);
    (
        status,
        serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
    )
}

/// Output of a program run.
#[derive(Debug)]
pub struct Run {
    /// Exit code (-1 when killed).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// Lines starting with `FAIL`.
    pub fn failures(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|l| l.starts_with("FAIL"))
            .collect()
    }

    /// Asserts that a check-printing program (`tests/c/check.h`) ran clean: no `FAIL` line,
    /// exit status 0, and more than `min_ok` checks passed (the message has its output and
    /// `vgpud`'s log).
    pub fn assert_checks_passed(&self, vgpud: &Vgpud, min_ok: usize) {
        assert!(
            self.failures().is_empty() && self.code == 0,
            "{}\n{}\n{}",
            self.stdout,
            self.stderr,
            vgpud.log()
        );
        let ok = self.stdout.lines().filter(|l| l.starts_with("ok ")).count();
        assert!(ok > min_ok, "{ok} checks passed, want more than {min_ok}");
    }

    /// Asserts that a test program ran clean: no `FAIL` line, exit status 0, `PASS` printed (the
    /// message has its output and `vgpud`'s log).
    pub fn assert_passed(&self, vgpud: &Vgpud) {
        assert!(
            self.failures().is_empty() && self.code == 0 && self.stdout.contains("PASS"),
            "exit {}\n{}\n{}\n{}",
            self.code,
            self.stdout,
            self.stderr,
            vgpud.log()
        );
    }
}

/// Runs a program against a VM of `vgpud` and collects its output.
pub fn run_against(vgpud: &Vgpud, vm: &str, program: &Path, args: &[&str]) -> Run {
    run_against_with(vgpud, vm, program, args, &[])
}

/// [`run_against`] with more environment variables.
pub fn run_against_with(
    vgpud: &Vgpud,
    vm: &str,
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Run {
    run_command(
        Command::new(program)
            .args(args)
            .env("VGPU_TRANSPORT", vgpud.transport(vm))
            .envs(env.iter().copied()),
    )
}

/// Runs a program that loads `libcuda.so.1` by name (NVIDIA's runtime does)
/// with vgpu's shim first on the library path, against a VM of `vgpud`.
pub fn run_with_shim(vgpud: &Vgpud, vm: &str, program: &Path, args: &[&str]) -> Run {
    run_command(
        Command::new(program)
            .args(args)
            .env("VGPU_TRANSPORT", vgpud.transport(vm))
            .env("LD_LIBRARY_PATH", &artifacts().lib_dir),
    )
}

fn run_command(cmd: &mut Command) -> Run {
    let out = cmd.output().expect("running the test program");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A C test program holding device memory in a VM until killed.
#[derive(Debug)]
pub struct Holder {
    /// The process.
    pub child: Child,
    /// The device pointer it allocated.
    pub ptr: u64,
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `driver_api hold BYTES` in a VM and waits until it holds the memory.
pub fn hold(d: &Vgpud, vm: &str, bytes: u64) -> Holder {
    let prog = build_c_program("driver_api");
    let mut child = Command::new(prog)
        .args(["hold", &bytes.to_string()])
        .env("VGPU_TRANSPORT", d.transport(vm))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting the holder");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut ptr = 0;
    for l in lines.by_ref() {
        let l = l.expect("holder output");
        assert!(!l.starts_with("FAIL"), "{l}");
        if let Some(p) = l.strip_prefix("ptr 0x") {
            ptr = u64::from_str_radix(p, 16).expect("pointer");
        }
        if l == "holding" {
            break;
        }
    }
    assert_ne!(ptr, 0, "the holder printed no pointer");
    Holder { child, ptr }
}

// ---------------------------------------------------------------------------
// Guests of a test daemon (QEMU end-to-end tests)
// ---------------------------------------------------------------------------

/// Exit status of a guest script whose `guest-shim/install.sh` failed.
pub const INSTALL_FAILED_STATUS: i32 = 90;

/// `tests/guest/<name>.c` built for guests: linked against the shim
/// (`-lcuda`, no rpath), so it needs the shim installed in the guest.
pub fn guest_cuda_program(name: &str) -> PathBuf {
    let source = workspace_root()
        .join("tests/guest")
        .join(format!("{name}.c"));
    crate::qemu::build_guest_cuda_program(&source, name, &artifacts().lib_dir)
        .unwrap_or_else(|e| panic!("building the guest program {name}: {e}"))
}

/// `examples/workload.c` (the demo workload) built for guests.
pub fn guest_workload() -> PathBuf {
    let source = workspace_root().join("examples/workload.c");
    crate::qemu::build_guest_cuda_program(&source, "workload", &artifacts().lib_dir)
        .unwrap_or_else(|e| panic!("building examples/workload.c for guests: {e}"))
}

/// A kernel fixture, `tests/kernels/ptx/<file>`.
pub fn ptx(file: &str) -> PathBuf {
    workspace_root().join("tests/kernels/ptx").join(file)
}

/// A guest of VM `vm` of `d` (started with [`TestVm::vsock`]): the VM's
/// vhost-user vsock device, the guest shim bundle, `programs` in
/// `/payload/bin` (on `PATH`) and `files` at their guest paths. The script
/// first installs the shim with `guest-shim/install.sh` (exit
/// [`INSTALL_FAILED_STATUS`] if that fails) and unsets `LD_LIBRARY_PATH`, so
/// programs find `libcuda.so.1` through the loader cache as in any VM; then
/// `body` runs.
pub fn cuda_guest(
    d: &Vgpud,
    vm: &str,
    name: &str,
    programs: &[PathBuf],
    files: &[(PathBuf, &str)],
    body: &str,
) -> crate::qemu::GuestSpec {
    let a = artifacts();
    let mut spec = crate::qemu::GuestSpec::new(name, "");
    spec.vhost_user_vsock = Some(d.vhost_socket(vm));
    let install = spec.add_vgpu_shim(
        &a.profile_dir.join("libcuda.so"),
        &a.profile_dir.join("libnvidia_ml.so"),
        &a.vgpu_smi,
    );
    for program in programs {
        let file = program
            .file_name()
            .expect("a program file")
            .to_string_lossy()
            .into_owned();
        spec.payload
            .push((program.clone(), format!("/payload/bin/{file}")));
    }
    for (host, guest) in files {
        spec.payload.push((host.clone(), (*guest).to_string()));
    }
    spec.script = format!(
        "{install} || {{ echo 'guest-shim/install.sh failed'; exit {INSTALL_FAILED_STATUS}; }}\n\
         unset LD_LIBRARY_PATH\n\
         {body}"
    );
    spec
}

/// Connects to a guest listener through the VM's vsock device the
/// hybrid-vsock way (`CONNECT <port>` on [`Vgpud::vsock_uds`]), sends one
/// byte and waits for its echo (`vsock-echo listen` in the guest): the
/// guest's script continues once this returns. Test scripts use it to hold a
/// guest at a point until the host has checked what it wants to.
pub fn signal_guest(d: &Vgpud, vm: &str, port: u32, timeout: Duration) {
    let path = d.vsock_uds(vm);
    let deadline = Instant::now() + timeout;
    loop {
        match try_signal_guest(&path, port, timeout) {
            Ok(()) => return,
            Err(e) => {
                // The guest may not listen yet: the device closes the
                // connection without a reply then.
                assert!(
                    Instant::now() < deadline,
                    "cannot reach guest port {port} of VM {vm} through {}: {e}",
                    path.display()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn try_signal_guest(path: &Path, port: u32, timeout: Duration) -> std::io::Result<()> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(format!("CONNECT {port}\n").as_bytes())?;
    let mut reader = BufReader::new(s.try_clone()?);
    let mut reply = String::new();
    reader.read_line(&mut reply)?;
    if !reply.starts_with("OK ") {
        return Err(std::io::Error::other(format!("CONNECT answered {reply:?}")));
    }
    s.write_all(b"!")?;
    let mut echo = [0u8; 1];
    reader.read_exact(&mut echo)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_sockets_finds_listeners_and_vhost_sockets() {
        let text = "[admin]\nsocket = \"/d/admin.sock\"  # admin\n[[vm]]\nname = \"a\"\n\
                    unix_socket = \"/d/a.sock\"\nvhost_user_socket=\"/d/a.vhost.sock\"\n\
                    vsock_uds_path = \"/d/a.vsock\"\nmemory = 5\n";
        let (listeners, vhost) = config_sockets(text);
        assert_eq!(
            listeners,
            [PathBuf::from("/d/admin.sock"), PathBuf::from("/d/a.sock")]
        );
        assert_eq!(vhost, [PathBuf::from("/d/a.vhost.sock")]);
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let mut log: String = (0..100).map(|i| format!("line {i}\n")).collect();
        log += "DEBUG vgpud::admin: admin request method=GET path=/v1/vms/x\n";
        let tail = log_tail(&log);
        assert!(
            tail.starts_with("line 40\n") && tail.ends_with("line 99"),
            "{tail}"
        );
    }
}

/// The directory of a PyPI NVIDIA package (`nvidia.<module>`), which scripts/prereqs.sh
/// installs.
pub fn pypi_nvidia_package(module: &str) -> PathBuf {
    let out = Command::new("python3")
        .args([
            "-c",
            &format!("import nvidia.{module} as m; print(list(m.__path__)[0])"),
        ])
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "PyPI's nvidia.{module} is not installed: run scripts/prereqs.sh"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// What C headers declare and what a program compiled against them links: the checks that a
/// library exports every function of an API's headers (the driver API's, NVML's).
pub mod headers {
    use std::collections::HashSet;
    use std::path::Path;
    use std::process::Command;

    /// Marks where the names start in the preprocessor's output.
    const NAMES_MARKER: &str = "vgpu_linked_names_begin";

    /// Every function `headers` in `include` declare with `declaration` before its name
    /// (`"CUresult CUDAAPI "`, `"nvmlReturn_t DECLDIR "`), sorted, each once.
    pub fn declared_functions(include: &Path, headers: &[&str], declaration: &str) -> Vec<String> {
        let mut names = Vec::new();
        for header in headers {
            let text = std::fs::read_to_string(include.join(header))
                .unwrap_or_else(|e| panic!("reading {header} in {}: {e}", include.display()));
            for (at, _) in text.match_indices(declaration) {
                let name: String = text[at + declaration.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                names.push(name);
            }
        }
        names.sort();
        names.dedup();
        names
    }

    /// The symbols a C program compiled against `headers` in `include`, with the macros
    /// `defines`, links when it calls `names`: the names after the headers' macros (the
    /// driver API's `cuMemAlloc` is `cuMemAlloc_v2`, NVML's `nvmlInit` is `nvmlInit_v2`).
    pub fn linked_symbols(
        include: &Path,
        headers: &[&str],
        names: &[String],
        defines: &[&str],
    ) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("names.c");
        let mut text: String = headers
            .iter()
            .map(|h| format!("#include <{h}>\n"))
            .collect();
        text.push_str(NAMES_MARKER);
        text.push('\n');
        for n in names {
            text.push_str(n);
            text.push('\n');
        }
        std::fs::write(&src, text).unwrap();
        let out = Command::new("cc")
            .args(["-E", "-P"])
            .arg(format!("-I{}", include.display()))
            .args(defines.iter().map(|d| format!("-D{d}")))
            .arg(&src)
            .output()
            .expect("running cc");
        assert!(
            out.status.success(),
            "preprocessing {headers:?} in {} failed (scripts/prereqs.sh installs what they \
             include): {}",
            include.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        let at = out.rfind(NAMES_MARKER).expect("the marker in the output") + NAMES_MARKER.len();
        out[at..].split_whitespace().map(str::to_string).collect()
    }

    /// The symbols of `linked` that `exported` lacks, sorted, each once.
    pub fn missing(
        linked: impl IntoIterator<Item = String>,
        exported: &HashSet<String>,
    ) -> Vec<String> {
        let mut missing: Vec<String> = linked
            .into_iter()
            .filter(|s| !exported.contains(s))
            .collect();
        missing.sort();
        missing.dedup();
        missing
    }

    /// The names `lib` defines in its dynamic symbol table (`nm -D`).
    pub fn exported_symbols(lib: &Path) -> HashSet<String> {
        let out = Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(lib)
            .output()
            .expect("running nm (binutils)");
        assert!(out.status.success(), "nm {}", lib.display());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            .map(str::to_string)
            .collect()
    }
}
