//! Test harness: builds the daemon and the shim, runs vgpud with a generated
//! config, talks to its admin API, and builds C test programs against the
//! shim.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
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
            "vgpu-vmm",
            "-p",
            "vgpu-shim",
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
        for name in ["libcuda.so", "libcuda.so.1"] {
            let link = lib_dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(profile_dir.join("libcuda.so"), &link).expect("symlink");
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
}

impl TestVm {
    /// A VM with a slice.
    pub fn new(name: &str, memory: u64) -> Self {
        Self {
            name: name.into(),
            memory,
        }
    }
}

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
        let a = artifacts();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = format!(
            "[admin]\nsocket = \"{}\"\n\n[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"4GiB\"\nworkers = 2\n{device_extra}\n",
            dir.path().join("admin.sock").display()
        );
        for vm in vms {
            cfg += &format!(
                "\n[[vm]]\nname = \"{}\"\ndevice = \"gpu0\"\nmemory = {}\nunix_socket = \"{}\"\n",
                vm.name,
                vm.memory,
                dir.path().join(format!("{}.sock", vm.name)).display()
            );
        }
        let config = dir.path().join("vgpud.toml");
        std::fs::write(&config, cfg).expect("config");
        let log = std::fs::File::create(dir.path().join("vgpud.log")).expect("log");
        let child = Command::new(&a.vgpud)
            .arg("--config")
            .arg(&config)
            .arg("--log")
            .arg("debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting vgpud");
        let d = Vgpud { child, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut wanted: Vec<PathBuf> = vms.iter().map(|v| d.socket(&v.name)).collect();
        wanted.push(d.admin_socket());
        while !wanted.iter().all(|p| UnixStream::connect(p).is_ok()) {
            assert!(
                Instant::now() < deadline,
                "vgpud did not come up; log:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
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
}

impl Drop for Vgpud {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal HTTP GET over a unix socket; returns (status, JSON body).
pub fn http_get(socket: &Path, path: &str) -> (u16, serde_json::Value) {
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
    (
        status,
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
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
}

/// Runs a program against a VM of `vgpud` and collects its output.
pub fn run_against(vgpud: &Vgpud, vm: &str, program: &Path, args: &[&str]) -> Run {
    let out = Command::new(program)
        .args(args)
        .env("VGPU_TRANSPORT", vgpud.transport(vm))
        .output()
        .expect("running the test program");
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
