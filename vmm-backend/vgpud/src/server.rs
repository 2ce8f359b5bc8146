//! The control plane's HTTP servers, on tokio and hyper: the admin API on its unix socket and
//! the Prometheus endpoint on TCP. One thread (`vgpu-control-NAME`) runs a small tokio runtime
//! per server; handlers are the synchronous functions of [`crate::admin`] and
//! [`crate::metrics`], run on the runtime's blocking pool.
//!
//! What a client can make a server hold is bounded: connections at once
//! ([`Limits::connections`]; past it a new connection is closed at once), requests being handled
//! at once ([`Limits::requests`]; past it `503`), the time to send a request head
//! ([`HEAD_TIMEOUT`]) and a body ([`Limits::deadline`]), the body's size
//! ([`crate::http::MAX_BODY`]; `413`), and each request's handling ([`Limits::deadline`]; `503`
//! when it runs longer: the handler finishes in the background, its answer is dropped).
//! Connections are kept alive between requests (HTTP/1.1), as Prometheus and long-running
//! clients expect, and closed after [`CONNECTION_LIFETIME`]. The data path
//! (sessions, vhost-user devices, the interpreter) does not run here.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, Semaphore};
use tracing::{debug, warn};

use crate::audit::{Actor, peer_cred};
use crate::http::{HttpRequest, HttpResponse, MAX_BODY, MAX_HEAD};

/// Longest time a client may take to send a request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection is closed after this long, however busy (a client that keeps one open forever
/// holds one of [`Limits::connections`]; well-behaved clients reconnect).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(600);
/// How long a stopping server waits for handlers still running.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// What one server accepts at once.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once.
    pub connections: usize,
    /// Requests being handled at once.
    pub requests: usize,
    /// Longest time to receive a body and handle a request.
    pub deadline: Duration,
}

/// Who sent a request: the peer of a unix socket (`SO_PEERCRED`), or nobody known (TCP).
pub type Peer = Option<Actor>;

/// A server's request handler.
pub type Handler = Arc<dyn Fn(&Peer, HttpRequest) -> HttpResponse + Send + Sync>;

/// Where a server listens.
#[derive(Debug)]
pub enum Listen {
    /// A bound unix socket (the admin API): each connection's peer is identified.
    Unix(std::os::unix::net::UnixListener),
    /// A bound TCP socket (metrics).
    Tcp(std::net::TcpListener),
}

/// A running server. Dropping it stops it: no new connection is accepted, connections are
/// closed, and handlers still running get [`STOP_GRACE`] to finish.
pub struct HttpServer {
    name: &'static str,
    stop: Arc<Notify>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("name", &self.name)
            .finish()
    }
}

impl HttpServer {
    /// Serves `handler` on `listen` from a thread of its own.
    pub fn start(
        name: &'static str,
        listen: Listen,
        limits: Limits,
        handler: Handler,
    ) -> io::Result<HttpServer> {
        match &listen {
            Listen::Unix(l) => l.set_nonblocking(true)?,
            Listen::Tcp(l) => l.set_nonblocking(true)?,
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(limits.requests.max(1))
            .thread_name(format!("vgpu-{name}-handler"))
            .build()?;
        let stop = Arc::new(Notify::new());
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("vgpu-control-{name}"))
            .spawn(move || {
                runtime.block_on(serve(listen, limits, handler, stop2));
                runtime.shutdown_timeout(STOP_GRACE);
            })?;
        Ok(HttpServer {
            name,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The accept loop: until `stop`, each connection within the limit is served by a task.
async fn serve(listen: Listen, limits: Limits, handler: Handler, stop: Arc<Notify>) {
    let conn = Conn {
        limits,
        handler,
        requests: Arc::new(Semaphore::new(limits.requests.max(1))),
        connections: Arc::new(Semaphore::new(limits.connections.max(1))),
    };
    match listen {
        Listen::Unix(l) => {
            let Ok(l) = tokio::net::UnixListener::from_std(l) else {
                warn!("cannot serve a unix socket from tokio");
                return;
            };
            // The kernel says who connected; a client it cannot name is refused.
            let identify = |s: &tokio::net::UnixStream| match peer_cred(s) {
                Ok(a) => Some(Some(a)),
                Err(e) => {
                    warn!(error = %e, "cannot read an admin client's credentials; refused");
                    None
                }
            };
            accept_loop(
                &stop,
                || async { l.accept().await.map(|(s, _)| s) },
                identify,
                &conn,
            )
            .await;
        }
        Listen::Tcp(l) => {
            let Ok(l) = tokio::net::TcpListener::from_std(l) else {
                warn!("cannot serve a TCP socket from tokio");
                return;
            };
            let identify = |_: &tokio::net::TcpStream| Some(None);
            accept_loop(
                &stop,
                || async { l.accept().await.map(|(s, _)| s) },
                identify,
                &conn,
            )
            .await;
        }
    }
}

/// What each connection's task shares.
#[derive(Clone)]
struct Conn {
    limits: Limits,
    handler: Handler,
    requests: Arc<Semaphore>,
    connections: Arc<Semaphore>,
}

async fn accept_loop<S, A, F, I>(stop: &Notify, mut accept: F, identify: I, conn: &Conn)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: FnMut() -> A,
    A: Future<Output = io::Result<S>>,
    I: Fn(&S) -> Option<Peer>,
{
    loop {
        let accepted = tokio::select! {
            () = stop.notified() => return,
            r = accept() => r,
        };
        let Ok(stream) = accepted else { continue };
        // Past the limit a connection is closed at once: a flood costs the server nothing.
        let Ok(permit) = Arc::clone(&conn.connections).try_acquire_owned() else {
            debug!("connection limit reached; a new connection is closed");
            continue;
        };
        let Some(peer) = identify(&stream) else {
            continue;
        };
        let conn = conn.clone();
        tokio::spawn(async move {
            serve_connection(stream, peer, conn).await;
            drop(permit);
        });
    }
}

async fn serve_connection<S>(stream: S, peer: Peer, conn: Conn)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = Arc::new(peer);
    let service = service_fn(move |req: Request<Incoming>| {
        let conn = conn.clone();
        let peer = Arc::clone(&peer);
        async move { Ok::<_, Infallible>(respond(req, &peer, &conn).await) }
    });
    let served = http1::Builder::new()
        .keep_alive(true)
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD.max(8192))
        .serve_connection(TokioIo::new(stream), service);
    if let Ok(Err(e)) = tokio::time::timeout(CONNECTION_LIFETIME, served).await {
        debug!(error = %e, "an HTTP connection ended");
    }
}

/// One request: the body within its size and time, the handler within the concurrency limit
/// and the deadline.
async fn respond(req: Request<Incoming>, peer: &Arc<Peer>, conn: &Conn) -> Response<Full<Bytes>> {
    let deadline = conn.limits.deadline;
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let body = Limited::new(req.into_body(), MAX_BODY).collect();
    let body = match tokio::time::timeout(deadline, body).await {
        Ok(Ok(b)) => b.to_bytes().to_vec(),
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return encode(&HttpResponse::error(413, "request body too large"));
        }
        Ok(Err(_)) => return encode(&HttpResponse::error(400, "unreadable request body")),
        Err(_) => {
            return encode(&HttpResponse::error(
                408,
                "the request body did not arrive in time",
            ));
        }
    };
    let Ok(permit) = Arc::clone(&conn.requests).try_acquire_owned() else {
        return encode(&HttpResponse::error(
            503,
            "too many requests at once; try again",
        ));
    };
    let handler = Arc::clone(&conn.handler);
    let peer = Arc::clone(peer);
    let work = tokio::task::spawn_blocking(move || {
        let r = handler(&peer, HttpRequest { method, path, body });
        drop(permit);
        r
    });
    match tokio::time::timeout(deadline, work).await {
        Ok(Ok(r)) => encode(&r),
        Ok(Err(_)) => encode(&HttpResponse::error(500, "the request handler failed")),
        Err(_) => encode(&HttpResponse::error(
            503,
            format!(
                "the request did not finish within {} s; it may still complete",
                deadline.as_secs()
            ),
        )),
    }
}

/// An [`HttpResponse`] as hyper sends it.
fn encode(r: &HttpResponse) -> Response<Full<Bytes>> {
    let (content_type, body) = r.encode();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() =
        StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Some(allow) = r.allow {
        resp.headers_mut()
            .insert(ALLOW, HeaderValue::from_static(allow));
    }
    resp
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Instant;

    use super::*;

    /// Set when a `/hold` request (only one test sends it) reached its handler.
    static HOLD_STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    const QUICK: Limits = Limits {
        connections: 4,
        requests: 2,
        deadline: Duration::from_secs(2),
    };

    /// A server on a free loopback port whose handler echoes the path, and sleeps on `/slow`.
    fn start(limits: Limits) -> (HttpServer, SocketAddr) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let handler: Handler = Arc::new(|peer: &Peer, req: HttpRequest| {
            if req.path == "/slow" {
                std::thread::sleep(Duration::from_secs(4));
            }
            if req.path == "/hold" {
                HOLD_STARTED.store(true, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_secs(4));
            }
            HttpResponse::text(
                200,
                "text/plain",
                format!("{} {} {} {:?}", req.method, req.path, req.body.len(), peer),
            )
        });
        (
            HttpServer::start("test", Listen::Tcp(l), limits, handler).unwrap(),
            addr,
        )
    }

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn a_connection_is_kept_alive_between_requests() {
        let (_server, addr) = start(QUICK);
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        for path in ["/a", "/b"] {
            write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap();
            let r = String::from_utf8_lossy(&buf[..n]);
            assert!(r.starts_with("HTTP/1.1 200"), "{r}");
            assert!(r.contains(&format!("GET {path} 0 None")), "{r}");
        }
    }

    #[test]
    fn slow_clients_do_not_hold_up_others() {
        let (_server, addr) = start(Limits {
            connections: 16,
            ..QUICK
        });
        // Eight clients that send half a request head and stall.
        let stalled: Vec<TcpStream> = (0..8)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(b"GET /x HTTP/1.1\r\nHo").unwrap();
                s
            })
            .collect();
        let t = Instant::now();
        let r = get(addr, "/fine");
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        drop(stalled);
    }

    #[test]
    fn a_request_past_its_deadline_gets_503_in_time() {
        let (_server, addr) = start(QUICK);
        let t = Instant::now();
        let r = get(addr, "/slow");
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.contains("did not finish within 2 s"), "{r}");
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    }

    #[test]
    fn requests_past_the_concurrency_limit_get_503() {
        let (_server, addr) = start(Limits {
            requests: 1,
            deadline: Duration::from_secs(10),
            ..QUICK
        });
        let slow = std::thread::spawn(move || get(addr, "/hold"));
        // Once the slow request holds the only handler, another one is refused.
        let t = Instant::now();
        while !HOLD_STARTED.load(std::sync::atomic::Ordering::SeqCst) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the slow request never started"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let r = get(addr, "/quick");
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.contains("too many requests at once"), "{r}");
        assert!(slow.join().unwrap().starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn bodies_past_the_limit_get_413() {
        let (_server, addr) = start(QUICK);
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let n = MAX_BODY + 1;
        write!(
            s,
            "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let _ = s.write_all(&vec![b'a'; n]);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 413"), "{out}");
    }

    #[test]
    fn connections_past_the_limit_are_closed_at_once() {
        let (_server, addr) = start(Limits {
            connections: 2,
            ..QUICK
        });
        let held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut buf = [0u8; 64];
        assert!(
            matches!(s.read(&mut buf), Ok(0) | Err(_)),
            "closed without an answer"
        );
        drop(held);
        std::thread::sleep(Duration::from_millis(200));
        assert!(get(addr, "/after").starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn a_unix_client_is_identified_by_the_kernel() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let handler: Handler = Arc::new(|peer: &Peer, _req: HttpRequest| {
            HttpResponse::text(200, "text/plain", format!("{peer:?}"))
        });
        let _server = HttpServer::start("test-unix", Listen::Unix(l), QUICK, handler).unwrap();
        let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
        write!(s, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        assert!(out.contains(&format!("uid: {uid}")), "{out}");
        assert!(
            out.contains(&format!("pid: {}", std::process::id())),
            "{out}"
        );
    }
}
