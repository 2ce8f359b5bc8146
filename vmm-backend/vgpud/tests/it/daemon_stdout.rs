//! The vgpud binary: while it serves, its standard output is `/dev/null`, so that device-side
//! `printf` output of guests' kernels (which the CUDA driver writes to the process's stdout)
//! never reaches the host's logs.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const READY: &str = "vgpud ready";
const TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn a_serving_vgpud_has_its_stdout_on_dev_null() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("vgpud.toml");
    std::fs::write(
        &config,
        format!(
            "[[vm]]\nname = \"vm1\"\nmemory = \"16MiB\"\nunix_socket = \"{}\"\n",
            dir.path().join("vm1.sock").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vgpud"))
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + TIMEOUT;
    let mut log = Vec::new();
    while !log.iter().any(|l: &String| l.contains(READY)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => log.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("vgpud did not get ready:\n{}", log.join("\n"));
            }
        }
    }
    let fd1 = std::fs::read_link(format!("/proc/{}/fd/1", child.id()));
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(
        fd1.unwrap().to_str(),
        Some("/dev/null"),
        "{}",
        log.join("\n")
    );
    assert!(
        status.success(),
        "vgpud exits cleanly on SIGTERM: {status:?}"
    );
}
