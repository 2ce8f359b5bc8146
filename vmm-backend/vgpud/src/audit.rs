//! The audit log: append-only JSON lines (`[admin] audit_log`).
//!
//! Every admin change (API call or config reload), refused or applied, is
//! recorded with who asked (the peer's uid/gid/pid from `SO_PEERCRED`, or the
//! sender of `SIGHUP`), what, and the state before and after; so are the
//! sessions of every VM (opened, closed, refused, ended by an error). Each
//! entry is one `write(2)` of one line on a file opened with `O_APPEND`: an
//! entry is in the kernel before the call that caused it returns, so a crash
//! of vgpud loses nothing; admin changes are also `fdatasync`ed, so they
//! survive a crash of the machine.
//!
//! A guest must not be able to fill the host's disk through it: the log
//! rotates at [`AuditLimits::max_bytes`] keeping [`AuditLimits::keep`] old
//! files, session events of one VM are rate-limited (a token bucket; what is
//! dropped is counted in one `audit.suppressed` entry), and strings a guest
//! supplies are cut to [`GUEST_TEXT_MAX`] characters ([`guest_text`]).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{Map, Value, json};
use thiserror::Error;
use tracing::error;

/// Mode of a newly created audit log: the daemon's user writes, its group reads.
pub const AUDIT_LOG_MODE: u32 = 0o640;
/// Characters of a guest-supplied string kept in an entry.
pub const GUEST_TEXT_MAX: usize = 256;

/// Bounds on what the audit log may take from the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditLimits {
    /// The log rotates when it would pass this many bytes.
    pub max_bytes: u64,
    /// Rotated files kept (`audit.jsonl.1` … `.N`): at most
    /// `(keep + 1) × max_bytes` on disk.
    pub keep: u32,
    /// Session events per second one VM may add, on average.
    pub vm_events_per_s: u32,
    /// Session events one VM may add at once.
    pub vm_burst: u32,
}

impl Default for AuditLimits {
    fn default() -> Self {
        AuditLimits {
            max_bytes: 64 << 20,
            keep: 4,
            vm_events_per_s: 20,
            vm_burst: 200,
        }
    }
}

/// A guest-supplied string as the log keeps it: at most [`GUEST_TEXT_MAX`]
/// characters, marked when cut (JSON encoding escapes control characters).
pub fn guest_text(s: &str) -> String {
    if s.chars().count() <= GUEST_TEXT_MAX {
        return s.to_string();
    }
    let mut t: String = s.chars().take(GUEST_TEXT_MAX).collect();
    t.push_str("…(cut)");
    t
}

/// One VM's session-event budget.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    suppressed: u64,
}

/// Why the audit log could not be opened.
#[derive(Debug, Error)]
#[error(
    "cannot open the audit log {path}: check that its directory exists and is writable by vgpud"
)]
pub struct AuditError {
    /// The path.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: io::Error,
}

/// Who asked for a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Actor {
    /// A client of the admin socket, identified by the kernel (`SO_PEERCRED`).
    Peer {
        /// User id.
        uid: u32,
        /// Group id.
        gid: u32,
        /// Process id.
        pid: i32,
    },
    /// A signal (`SIGHUP` reload), with its sender where the kernel says.
    Signal {
        /// Signal number.
        signal: i32,
        /// Sender's process id (0 when unknown).
        pid: i32,
        /// Sender's user id.
        uid: u32,
    },
    /// vgpud itself (start-up, shutdown).
    Daemon,
    /// The tuning controller (`[tuning] mode = "auto"`).
    Tuner,
}

/// The credentials of the process at the other end of a unix socket.
pub fn peer_cred(s: &impl AsRawFd) -> io::Result<Actor> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes and `len` holds the size of `cred`.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Actor::Peer {
        uid: cred.uid,
        gid: cred.gid,
        pid: cred.pid,
    })
}

/// An open audit log.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    limits: AuditLimits,
    /// The file and its size.
    file: Mutex<(File, u64)>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

fn open_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(AUDIT_LOG_MODE)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// Whether an entry must reach the disk before the call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Written to the kernel (survives a crash of vgpud).
    Written,
    /// Written and `fdatasync`ed (survives a crash of the machine).
    Synced,
}

impl AuditLog {
    /// Opens (creating it and its directory if needed) the log at `path` for
    /// appending, with the default [`AuditLimits`].
    pub fn open(path: &Path) -> Result<AuditLog, AuditError> {
        Self::open_with(path, AuditLimits::default())
    }

    /// Opens the log at `path` with `limits`.
    pub fn open_with(path: &Path, limits: AuditLimits) -> Result<AuditLog, AuditError> {
        let err = |source| AuditError {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(err)?;
        }
        let file = open_file(path).map_err(err)?;
        let size = file.metadata().map_err(err)?.len();
        Ok(AuditLog {
            path: path.to_path_buf(),
            limits,
            file: Mutex::new((file, size)),
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// The path of rotated file `n` (`audit.jsonl.1` is the newest).
    pub fn rotated(&self, n: u32) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    }

    /// Moves the current file to `.1` (and `.1` to `.2`, …, dropping the
    /// oldest) and starts a new one.
    fn rotate(&self, slot: &mut (File, u64)) -> io::Result<()> {
        if self.limits.keep == 0 {
            slot.0.set_len(0)?;
            slot.1 = 0;
            return Ok(());
        }
        for n in (1..self.limits.keep).rev() {
            let from = self.rotated(n);
            if from.exists() {
                std::fs::rename(&from, self.rotated(n + 1))?;
            }
        }
        std::fs::rename(&self.path, self.rotated(1))?;
        *slot = (open_file(&self.path)?, 0);
        Ok(())
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one entry: `event` plus `fields`, with the time first.
    pub fn record(&self, event: &str, fields: Value, durability: Durability) {
        let now = SystemTime::now();
        let mut m = Map::new();
        m.insert("time".into(), Value::String(rfc3339(now)));
        m.insert("event".into(), Value::String(event.into()));
        if let Value::Object(f) = fields {
            m.extend(f);
        }
        let mut line = serde_json::to_vec(&Value::Object(m)).unwrap_or_default();
        line.push(b'\n');
        let mut slot = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if slot.1 > 0
            && slot.1 + line.len() as u64 > self.limits.max_bytes
            && let Err(e) = self.rotate(&mut slot)
        {
            error!(path = %self.path.display(), error = %e, "cannot rotate the audit log");
        }
        let f = &mut slot.0;
        // One write of the whole line: O_APPEND keeps concurrent lines whole.
        let r = f.write_all(&line).and_then(|()| {
            if durability == Durability::Synced {
                f.sync_data()
            } else {
                Ok(())
            }
        });
        match r {
            Ok(()) => slot.1 += line.len() as u64,
            Err(e) => {
                error!(path = %self.path.display(), error = %e, event, "cannot write the audit log")
            }
        }
    }

    /// Appends a session event of `vm`, within the VM's rate budget: past it
    /// the event is dropped and counted, and the count is recorded
    /// (`audit.suppressed`) with the VM's next event that fits. Returns
    /// whether `event` was written.
    pub fn record_vm(&self, vm: &str, event: &str, fields: Value) -> bool {
        let (allowed, suppressed) = {
            let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let burst = f64::from(self.limits.vm_burst.max(1));
            let b = buckets.entry(vm.to_string()).or_insert(Bucket {
                tokens: burst,
                at: now,
                suppressed: 0,
            });
            let refill =
                now.duration_since(b.at).as_secs_f64() * f64::from(self.limits.vm_events_per_s);
            b.tokens = (b.tokens + refill).min(burst);
            b.at = now;
            if b.tokens >= 1.0 {
                b.tokens -= 1.0;
                (true, std::mem::take(&mut b.suppressed))
            } else {
                b.suppressed += 1;
                (false, 0)
            }
        };
        if suppressed > 0 {
            self.record(
                "audit.suppressed",
                json!({ "vm": vm, "events": suppressed, "why": "the VM's session events passed its rate limit" }),
                Durability::Written,
            );
        }
        if allowed {
            self.record(event, fields, Durability::Written);
        }
        allowed
    }

    /// Records an admin change by `actor`: `what` was asked, with the state
    /// `before` and `after` (null when absent) and the outcome.
    pub fn change(&self, actor: Actor, event: &str, detail: Value, outcome: Result<(), &str>) {
        let mut fields = json!({ "actor": actor });
        if let (Value::Object(m), Value::Object(d)) = (&mut fields, detail) {
            m.extend(d);
            match outcome {
                Ok(()) => {
                    m.insert("result".into(), "ok".into());
                }
                Err(e) => {
                    m.insert("result".into(), "refused".into());
                    m.insert("error".into(), e.into());
                }
            }
        }
        self.record(event, fields, Durability::Synced);
    }
}

/// Formats a time as RFC 3339 UTC with milliseconds (`2025-01-31T12:00:00.123Z`).
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, mo, da) = civil_from_days(days as i64);
    format!(
        "{y:04}-{mo:02}-{da:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day)
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    const DAYS_PER_ERA: i64 = 146_097;
    let z = z + 719_468;
    let era = z.div_euclid(DAYS_PER_ERA);
    let doe = z - era * DAYS_PER_ERA;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(951_827_696_789); // leap day 2000
        assert_eq!(rfc3339(t), "2000-02-29T12:34:56.789Z");
        let t = UNIX_EPOCH + Duration::from_secs(4_102_444_799); // last second of 2099
        assert_eq!(rfc3339(t), "2099-12-31T23:59:59.000Z");
    }

    #[test]
    fn entries_are_whole_lines_appended_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/audit.jsonl");
        let log = AuditLog::open(&p).unwrap();
        log.change(
            Actor::Peer {
                uid: 7,
                gid: 8,
                pid: 9,
            },
            "vm.update",
            json!({ "vm": "a", "before": { "weight": 1 }, "after": { "weight": 2 } }),
            Ok(()),
        );
        drop(log);
        let log = AuditLog::open(&p).unwrap();
        log.change(
            Actor::Daemon,
            "vm.remove",
            json!({ "vm": "b" }),
            Err("no VM named `b`"),
        );
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["event"], "vm.update");
        assert_eq!(
            lines[0]["actor"],
            json!({"kind": "peer", "uid": 7, "gid": 8, "pid": 9})
        );
        assert_eq!(lines[0]["after"]["weight"], 2);
        assert_eq!(lines[0]["result"], "ok");
        assert_eq!(lines[1]["result"], "refused");
        assert_eq!(lines[1]["error"], "no VM named `b`");
        assert!(lines[1]["time"].as_str().unwrap().ends_with('Z'));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, AUDIT_LOG_MODE);
    }

    #[test]
    fn the_log_rotates_and_keeps_a_bounded_number_of_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("audit.jsonl");
        let limits = AuditLimits {
            max_bytes: 4096,
            keep: 2,
            vm_events_per_s: 1_000_000,
            vm_burst: 1_000_000,
        };
        let log = AuditLog::open_with(&p, limits).unwrap();
        for i in 0..1000 {
            log.record_vm("vm1", "session.open", json!({ "vm": "vm1", "i": i }));
        }
        let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        assert!(size(&p) <= 4096, "{}", size(&p));
        assert!(size(&log.rotated(1)) > 0 && size(&log.rotated(1)) <= 4096);
        assert!(size(&log.rotated(2)) > 0);
        assert!(!log.rotated(3).exists(), "only `keep` rotated files");
        // The newest entry is in the current file, whole.
        let text = std::fs::read_to_string(&p).unwrap();
        let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["i"], 999);
    }

    #[test]
    fn a_flood_of_one_vms_events_is_cut_and_counted_and_others_are_not_affected() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("audit.jsonl");
        let limits = AuditLimits {
            vm_events_per_s: 1,
            vm_burst: 10,
            ..AuditLimits::default()
        };
        let log = AuditLog::open_with(&p, limits).unwrap();
        let written = (0..1000)
            .filter(|_| log.record_vm("noisy", "session.refused", json!({ "vm": "noisy" })))
            .count();
        assert!((10..=12).contains(&written), "{written}");
        assert!(log.record_vm("quiet", "session.open", json!({ "vm": "quiet" })));
        // Later, the next event of the noisy VM records what was dropped.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert!(log.record_vm("noisy", "session.open", json!({ "vm": "noisy" })));
        let text = std::fs::read_to_string(&p).unwrap();
        let suppressed: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|v| v["event"] == "audit.suppressed")
            .collect();
        assert_eq!(suppressed.len(), 1, "{text}");
        assert_eq!(
            suppressed[0]["events"].as_u64().unwrap() + written as u64,
            1000
        );
    }

    #[test]
    fn guest_strings_are_cut() {
        assert_eq!(guest_text("short"), "short");
        let long = "x".repeat(4 << 20);
        let t = guest_text(&long);
        assert!(t.len() < GUEST_TEXT_MAX + 16, "{}", t.len());
        assert!(t.ends_with("…(cut)"));
    }

    #[test]
    fn peer_credentials_name_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        let Actor::Peer { pid, uid, .. } = peer_cred(&a).unwrap() else {
            panic!("not a peer")
        };
        assert_eq!(pid as u32, std::process::id());
        // SAFETY: getuid has no preconditions.
        assert_eq!(uid, unsafe { libc::getuid() });
    }

    #[test]
    fn an_unwritable_path_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("file");
        std::fs::write(&f, b"").unwrap();
        let e = AuditLog::open(&f.join("audit.jsonl")).unwrap_err();
        assert!(e.to_string().contains("cannot open the audit log"), "{e}");
    }
}
