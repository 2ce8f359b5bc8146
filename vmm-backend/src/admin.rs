//! The admin API: REST/JSON over the `[admin] socket` unix socket (mode
//! 0600). docs/admin-api.md lists the endpoints.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tracing::{debug, warn};
use vgpu_broker::Broker;
use vgpu_broker::tenant::Tenant;

use crate::daemon::Transports;
use crate::listener::{ListenerError, bind_socket};

/// Mode of the admin socket: the daemon's user only.
pub const ADMIN_SOCKET_MODE: u32 = 0o600;
/// Longest request head accepted.
const MAX_HEAD: usize = 16 << 10;
/// Largest request body accepted.
const MAX_BODY: usize = 1 << 20;
/// A client that sends nothing for this long is dropped.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A parsed request.
#[derive(Debug)]
pub struct HttpRequest {
    /// `GET`, `POST`, …
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// A response: status and JSON body.
#[derive(Debug)]
pub struct HttpResponse {
    /// HTTP status.
    pub status: u16,
    /// JSON body.
    pub body: Value,
}

impl HttpResponse {
    fn ok(body: Value) -> Self {
        Self { status: 200, body }
    }
    fn error(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            body: json!({ "error": message.into() }),
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        _ => "Error",
    }
}

/// Reads one HTTP/1.1 request.
pub fn read_request<R: Read>(r: R) -> Result<HttpRequest, HttpResponse> {
    let mut r = BufReader::new(r.take((MAX_HEAD + MAX_BODY) as u64));
    let mut head_len = 0;
    let mut line = String::new();
    let mut next_line = |r: &mut BufReader<_>, line: &mut String| -> Result<(), HttpResponse> {
        line.clear();
        let n = r
            .read_line(line)
            .map_err(|_| HttpResponse::error(400, "unreadable request"))?;
        head_len += n;
        if n == 0 || head_len > MAX_HEAD {
            return Err(HttpResponse::error(
                400,
                "incomplete or oversized request head",
            ));
        }
        Ok(())
    };
    next_line(&mut r, &mut line)?;
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(HttpResponse::error(400, "malformed request line"));
    };
    let method = method.to_string();
    let path = target.split('?').next().unwrap_or("").to_string();
    let mut content_length = 0usize;
    loop {
        next_line(&mut r, &mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':')
            && k.trim().eq_ignore_ascii_case("content-length")
        {
            content_length = v
                .trim()
                .parse()
                .map_err(|_| HttpResponse::error(400, "bad Content-Length"))?;
        }
    }
    if content_length > MAX_BODY {
        return Err(HttpResponse::error(413, "request body too large"));
    }
    let mut body = vec![0; content_length];
    r.read_exact(&mut body)
        .map_err(|_| HttpResponse::error(400, "request body shorter than Content-Length"))?;
    Ok(HttpRequest { method, path, body })
}

/// Writes a response and closes the exchange.
pub fn write_response<W: Write>(mut w: W, resp: &HttpResponse) -> io::Result<()> {
    let body = serde_json::to_vec_pretty(&resp.body).unwrap_or_default();
    write!(
        w,
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        resp.status,
        reason(resp.status),
        body.len() + 1
    )?;
    w.write_all(&body)?;
    w.write_all(b"\n")?;
    w.flush()
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The JSON description of a VM.
pub fn vm_json(t: &Tenant, transports: &Transports) -> Value {
    let s = t.settings();
    let sessions: Vec<Value> = t
        .sessions()
        .iter()
        .map(|x| {
            json!({
                "id": x.id,
                "pid": x.pid,
                "process": x.process_name,
                "transport": x.transport,
                "started": unix_seconds(x.started),
                "memory_used": x.memory.load(Ordering::Relaxed),
            })
        })
        .collect();
    let st = &t.stats;
    let vsock = transports.vsock_of(&t.name).map(|d| {
        json!({
            "guest_cid": d.config.guest_cid,
            "socket": d.config.socket,
            "uds_path": d.config.uds_path,
            "stats": d.stats.snapshot(),
        })
    });
    json!({
        "name": t.name,
        "vsock": vsock,
        "device": t.device_name,
        "memory_limit": t.slice.limit(),
        "memory_used": t.slice.used(),
        "weight": s.weight,
        "priority": s.priority.as_str(),
        "accepting_sessions": t.is_open(),
        "sessions": sessions,
        "stats": {
            "sessions_total": st.sessions_total.load(Ordering::Relaxed),
            "bytes_htod": st.bytes_htod.load(Ordering::Relaxed),
            "bytes_dtoh": st.bytes_dtoh.load(Ordering::Relaxed),
            "kernels": st.kernels.load(Ordering::Relaxed),
            "errors": st.errors.load(Ordering::Relaxed),
        },
    })
}

/// Routes a request.
pub fn route(broker: &Broker, transports: &Transports, req: &HttpRequest) -> HttpResponse {
    let segs: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    match (req.method.as_str(), segs.as_slice()) {
        ("GET", ["v1", "info"]) => HttpResponse::ok(json!({
            "name": "vgpud",
            "version": env!("CARGO_PKG_VERSION"),
            "protocol_version": vgpu_proto::PROTOCOL_VERSION,
            "pid": std::process::id(),
        })),
        ("GET", ["v1", "devices"]) => HttpResponse::ok(Value::Array(
            broker
                .devices()
                .iter()
                .map(|(name, d)| {
                    let i = d.info();
                    json!({
                        "name": name,
                        "kind": i.kind,
                        "model": i.name,
                        "memory_total": i.total_memory,
                        "memory_used": d.memory_used(),
                        "vms": broker.tenants().iter().filter(|t| &t.device_name == name).map(|t| t.name.clone()).collect::<Vec<_>>(),
                    })
                })
                .collect(),
        )),
        ("GET", ["v1", "vms"]) => HttpResponse::ok(Value::Array(broker.tenants().iter().map(|t| vm_json(t, transports)).collect())),
        ("GET", ["v1", "vms", name]) => match broker.tenant(name) {
            Some(t) => HttpResponse::ok(vm_json(&t, transports)),
            None => HttpResponse::error(404, format!("no VM named `{name}`")),
        },
        (_, ["v1", ..]) => HttpResponse::error(405, format!("{} {} is not supported", req.method, req.path)),
        _ => HttpResponse::error(404, format!("unknown path {}", req.path)),
    }
}

/// The running admin server.
pub struct AdminServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminServer")
            .field("path", &self.path)
            .finish()
    }
}

impl AdminServer {
    /// Serves the admin API on `path`.
    pub fn start(
        broker: Arc<Broker>,
        transports: Arc<Transports>,
        path: &Path,
    ) -> Result<AdminServer, ListenerError> {
        let l = bind_socket(path, ADMIN_SOCKET_MODE)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("vgpu-admin".into())
            .spawn(move || serve_admin(&l, &broker, &transports, &stop2))
            .map_err(|source| ListenerError::Bind {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(AdminServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }
}

fn serve_admin(
    l: &UnixListener,
    broker: &Arc<Broker>,
    transports: &Arc<Transports>,
    stop: &AtomicBool,
) {
    for conn in l.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(stream) = conn else { continue };
        let broker = Arc::clone(broker);
        let transports = Arc::clone(transports);
        let _ = std::thread::Builder::new()
            .name("vgpu-admin-conn".into())
            .spawn(move || handle_conn(&broker, &transports, stream));
    }
}

fn handle_conn(broker: &Broker, transports: &Transports, stream: UnixStream) {
    let _ = stream.set_read_timeout(Some(CLIENT_TIMEOUT));
    let resp = match read_request(&stream) {
        Ok(req) => {
            debug!(method = %req.method, path = %req.path, "admin request");
            route(broker, transports, &req)
        }
        Err(resp) => resp,
    };
    if let Err(e) = write_response(&stream, &resp) {
        warn!(error = %e, "cannot write an admin response");
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_bad_ones_get_400() {
        let r = read_request(&b"GET /v1/vms?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"[..]).unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str()), ("GET", "/v1/vms"));
        let r = read_request(&b"POST /v1/vms HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"[..]).unwrap();
        assert_eq!(r.body, b"{}");
        for bad in [
            &b""[..],
            b"GET\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab",
        ] {
            assert_eq!(read_request(bad).unwrap_err().status, 400);
        }
        let big = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        assert_eq!(read_request(big.as_bytes()).unwrap_err().status, 413);
    }
}
