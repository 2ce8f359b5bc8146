//! A vgpud process with the admin plane on (admin socket, metrics endpoint,
//! audit log) for the admin_* tests, and helpers to talk to it over HTTP
//! and through vgpuctl.

#![allow(dead_code)] // each test binary uses part of it

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use vgpu_tests::harness::{artifacts, build_c_program};

/// Replaced by the daemon's directory in config texts.
pub const DIR: &str = "@DIR@";
const STARTUP: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(20);
pub const MIB: u64 = 1 << 20;

/// A running vgpud.
pub struct Admin {
    child: Child,
    dir: tempfile::TempDir,
}

/// A program's exit code and output.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// The JSON on stdout.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", self.stdout, self.stderr))
    }
}

/// The `[admin]` table every test daemon gets.
pub fn admin_table() -> String {
    format!(
        "[admin]\nsocket = \"{DIR}/admin.sock\"\nmetrics_listen = \"127.0.0.1:0\"\naudit_log = \"{DIR}/audit.jsonl\"\n\n"
    )
}

/// A simulated device and two VMs with unix sockets (vm1 64 MiB weight 3,
/// vm2 32 MiB batch).
pub fn two_vms() -> String {
    format!(
        "{}[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\nworkers = 1\n\n\
         [[vm]]\nname = \"vm1\"\nmemory = \"64MiB\"\nweight = 3\nunix_socket = \"{DIR}/vm1.sock\"\n\n\
         [[vm]]\nname = \"vm2\"\nmemory = \"32MiB\"\npriority = \"batch\"\nunix_socket = \"{DIR}/vm2.sock\"\n\
         vhost_user_socket = \"{DIR}/vm2.vhost\"\nguest_cid = 5\n",
        admin_table()
    )
}

impl Admin {
    /// Starts vgpud with `config` (`@DIR@` stands for its directory) and
    /// waits for its admin socket.
    pub fn start(config: &str) -> Admin {
        let a = artifacts();
        let dir = tempfile::tempdir().expect("tempdir");
        let config_path = dir.path().join("vgpud.toml");
        std::fs::write(
            &config_path,
            config.replace(DIR, &dir.path().display().to_string()),
        )
        .expect("config");
        let log = std::fs::File::create(dir.path().join("vgpud.log")).expect("log");
        let child = Command::new(&a.vgpud)
            .arg("--config")
            .arg(&config_path)
            .args(["--log", "debug"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting vgpud");
        let mut d = Admin { child, dir };
        let deadline = Instant::now() + STARTUP;
        while UnixStream::connect(d.admin_socket()).is_err() {
            assert!(
                Instant::now() < deadline,
                "vgpud did not come up; log:\n{}",
                d.log()
            );
            assert!(d.is_running(), "vgpud exited; log:\n{}", d.log());
            std::thread::sleep(POLL);
        }
        d
    }

    /// The daemon's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A path in the daemon's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The config file.
    pub fn config(&self) -> PathBuf {
        self.path("vgpud.toml")
    }

    /// Rewrites the config file (`@DIR@` stands for the directory).
    pub fn write_config(&self, config: &str) {
        std::fs::write(
            self.config(),
            config.replace(DIR, &self.dir().display().to_string()),
        )
        .expect("config");
    }

    /// The admin socket.
    pub fn admin_socket(&self) -> PathBuf {
        self.path("admin.sock")
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether vgpud still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The daemon's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("vgpud.log")).unwrap_or_default()
    }

    /// The audit log's entries (each line must be JSON).
    pub fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.path("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line {l:?}: {e}")))
            .collect()
    }

    /// One HTTP request on the admin socket: (status, raw head, JSON body or Null).
    pub fn http(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String, Value) {
        http(&self.admin_socket(), method, path, body)
    }

    /// GET returning 200's JSON.
    pub fn get(&self, path: &str) -> Value {
        let (st, _, v) = self.http("GET", path, None);
        assert_eq!(st, 200, "GET {path}: {v}");
        v
    }

    /// Runs vgpuctl against this daemon.
    pub fn vgpuctl(&self, args: &[&str]) -> Out {
        run(Command::new(&artifacts().vgpuctl)
            .arg("--socket")
            .arg(self.admin_socket())
            .args(args))
    }

    /// Runs vgpuctl with --json and returns its JSON (asserting success).
    pub fn vgpuctl_json(&self, args: &[&str]) -> Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let o = self.vgpuctl(&a);
        assert_eq!(o.code, 0, "vgpuctl {args:?}: {}", o.stderr);
        o.json()
    }

    /// Sends SIGHUP and waits until the reload has been logged to the audit log.
    pub fn hup(&self) -> Value {
        let before = self
            .audit()
            .iter()
            .filter(|e| e["event"] == "config.reload")
            .count();
        // SAFETY: kill with a valid pid and signal.
        assert_eq!(unsafe { libc::kill(self.pid() as i32, libc::SIGHUP) }, 0);
        let deadline = Instant::now() + STARTUP;
        loop {
            let reloads: Vec<Value> = self
                .audit()
                .into_iter()
                .filter(|e| e["event"] == "config.reload")
                .collect();
            if reloads.len() > before {
                return reloads.last().cloned().expect("one");
            }
            assert!(
                Instant::now() < deadline,
                "no reload logged; log:\n{}",
                self.log()
            );
            std::thread::sleep(POLL);
        }
    }

    /// `VGPU_TRANSPORT` for a VM's unix socket.
    pub fn transport(&self, vm: &str) -> String {
        format!("unix:{}", self.path(&format!("{vm}.sock")).display())
    }

    /// Starts a program holding `bytes` of device memory in `vm` until killed.
    pub fn hold(&self, vm: &str, bytes: u64) -> Holder {
        let mut child = Command::new(build_c_program("driver_api"))
            .args(["hold", &bytes.to_string()])
            .env("VGPU_TRANSPORT", self.transport(vm))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("holder");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        for l in lines.by_ref() {
            let l = l.expect("holder output");
            assert!(!l.starts_with("FAIL"), "{l}");
            if l == "holding" {
                break;
            }
        }
        Holder { child }
    }

    /// Waits until `f` holds.
    pub fn wait_for(&self, what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + STARTUP;
        while !f() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; log:\n{}",
                self.log()
            );
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Admin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process holding device memory.
pub struct Holder {
    pub child: Child,
}

impl Holder {
    /// Whether it still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a command and collects its output.
pub fn run(cmd: &mut Command) -> Out {
    let o = cmd
        .stdin(Stdio::null())
        .output()
        .expect("running a program");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// One HTTP/1.1 request over a unix socket: (status, head, JSON body or Null).
pub fn http(socket: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String, Value) {
    let mut s = UnixStream::connect(socket).expect("admin socket");
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: vgpud\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("request");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("response");
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (
        status,
        head.to_string(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}
