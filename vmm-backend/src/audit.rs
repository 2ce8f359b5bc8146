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

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{Map, Value, json};
use thiserror::Error;
use tracing::error;

/// Mode of a newly created audit log: the daemon's user writes, its group reads.
pub const AUDIT_LOG_MODE: u32 = 0o640;

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
pub fn peer_cred(s: &UnixStream) -> io::Result<Actor> {
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
    file: Mutex<File>,
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
    /// Opens (creating it and its directory if needed) the log at `path` for appending.
    pub fn open(path: &Path) -> Result<AuditLog, AuditError> {
        let err = |source| AuditError {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(err)?;
        }
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(AUDIT_LOG_MODE)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(err)?;
        Ok(AuditLog {
            path: path.to_path_buf(),
            file: Mutex::new(file),
        })
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
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        // One write of the whole line: O_APPEND keeps concurrent lines whole.
        let r = f.write_all(&line).and_then(|()| {
            if durability == Durability::Synced {
                f.sync_data()
            } else {
                Ok(())
            }
        });
        if let Err(e) = r {
            error!(path = %self.path.display(), error = %e, event, "cannot write the audit log");
        }
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
