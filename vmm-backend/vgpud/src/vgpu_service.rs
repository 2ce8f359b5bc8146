//! The broker behind the device: every session of the device is a broker session of the VM's
//! tenant, with the same handshake, ordering and error rules as the stream transports
//! (`vgpu_broker::session_loop`), and bulk bytes copied straight between guest pages and device memory
//! (`Session::handle_bulk`).

use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::json;

use tracing::{debug, info, warn};
use vgpu_broker::session::{PostedCall, Session};
use vgpu_broker::tenant::Tenant;
use vgpu_broker::{Broker, CuError};
use vgpu_proto::frame::{FLAG_ASYNC, Header};
use vgpu_proto::msg::{self, ASYNC_OK, Message, Op, REQ_TAIL, Request};
use vgpu_proto::wire::DecodeError;

use crate::audit::{AuditLog, Durability};
use vgpu_vhost_vgpu::{BatchResult, Call, Reply, SessionExecutor, VgpuService, call_batched};

/// Runs the sessions of one VM's virtio-vgpu device on the broker.
pub struct BrokerService {
    broker: Arc<Broker>,
    tenant: Arc<Tenant>,
    transport: String,
    audit: Option<Arc<AuditLog>>,
}

impl std::fmt::Debug for BrokerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerService")
            .field("tenant", &self.tenant.name)
            .finish()
    }
}

impl BrokerService {
    /// Sessions of `tenant`, named `virtio-vgpu` in the admin view; they are recorded in
    /// `audit` (`session.open`, `session.close`, `session.refused`) as on the other transports.
    pub fn new(broker: Arc<Broker>, tenant: Arc<Tenant>, audit: Option<Arc<AuditLog>>) -> Self {
        BrokerService {
            broker,
            tenant,
            transport: "virtio-vgpu".to_string(),
            audit,
        }
    }
}

impl VgpuService for BrokerService {
    fn open(&self, gone: Arc<AtomicBool>) -> Result<Box<dyn SessionExecutor>, String> {
        if !self.tenant.is_open() {
            return Err(format!(
                "VM `{}` is not accepting sessions",
                self.tenant.name
            ));
        }
        Ok(Box::new(BrokerSession {
            broker: Arc::clone(&self.broker),
            tenant: Arc::clone(&self.tenant),
            transport: self.transport.clone(),
            audit: self.audit.clone(),
            session: None,
            gone,
            opened: None,
            requests: 0,
            out: Vec::new(),
            run: Vec::new(),
        }))
    }

    fn slice_size(&self) -> u64 {
        self.tenant.slice.limit()
    }

    fn gpu_name(&self) -> String {
        self.tenant.device().info().name.clone()
    }
}

/// One guest session: before its `Hello`, then a broker session.
struct BrokerSession {
    broker: Arc<Broker>,
    tenant: Arc<Tenant>,
    transport: String,
    audit: Option<Arc<AuditLog>>,
    session: Option<Session>,
    /// Set when the guest closed the session or the device was reset.
    gone: Arc<AtomicBool>,
    /// When the handshake succeeded (for the audit record of the close).
    opened: Option<Instant>,
    requests: u64,
    out: Vec<u8>,
    /// A run of a batch's posted calls, served together ([`Session::handle_posted_run`]).
    run: Vec<PostedCall>,
}

fn error_frame(e: &CuError) -> Reply {
    Reply::Frame {
        status: e.code,
        payload: e.message.as_bytes().to_vec(),
    }
}

impl BrokerSession {
    fn audit(&self, event: &str, fields: serde_json::Value) {
        if let Some(a) = &self.audit {
            a.record(event, fields, Durability::Written);
        }
    }

    /// Ends the broker session (releasing everything) and records why.
    fn end(&mut self, reason: &str) {
        if let Some(s) = self.session.take() {
            let info = std::sync::Arc::clone(s.info());
            drop(s);
            info!(tenant = %self.tenant.name, session = info.id, reason, "session closed");
            self.audit(
                "session.close",
                json!({
                    "vm": self.tenant.name, "session": info.id, "pid": info.pid,
                    "process": info.process_name, "transport": self.transport,
                    "reason": reason, "requests": self.requests,
                    "duration_s": self.opened.map(|t| t.elapsed().as_secs_f64()),
                }),
            );
        }
    }

    fn handshake(&mut self, c: &Call<'_>) -> Reply {
        let h = c.header;
        if h.opcode != msg::Hello::OPCODE || h.flags & FLAG_ASYNC != 0 {
            return Reply::Violation(format!(
                "the first frame must be a synchronous Hello, got opcode {:#06x}",
                h.opcode
            ));
        }
        let hello = match msg::decode_exact::<msg::Hello>(c.inline, false) {
            Ok((m, _)) if c.data.is_empty() => m,
            Ok(_) => return Reply::Violation("Hello carries bulk bytes".into()),
            Err(e) => return Reply::Violation(format!("malformed Hello: {e}")),
        };
        match vgpu_broker::session_loop::accept_hello(
            &self.broker,
            Arc::clone(&self.tenant),
            &hello,
            &self.transport,
        ) {
            Ok((mut session, reply)) => {
                // Waits for the session's work end when the guest closes the session.
                let gone = Arc::clone(&self.gone);
                session.watch_hangup(Arc::new(move || gone.load(Ordering::Acquire)));
                info!(
                    tenant = %self.tenant.name,
                    session = session.id(),
                    pid = hello.pid,
                    process = %session.info().process_name,
                    transport = %self.transport,
                    "session opened"
                );
                self.audit(
                    "session.open",
                    json!({
                        "vm": self.tenant.name, "session": session.id(), "pid": hello.pid,
                        "process": session.info().process_name, "transport": self.transport,
                    }),
                );
                self.opened = Some(Instant::now());
                self.session = Some(session);
                let mut payload = Vec::new();
                reply.encode(&mut payload);
                Reply::Frame { status: 0, payload }
            }
            // Refused (version, draining VM): the client gets the error; any further frame is
            // a violation, as on the stream transports where the connection closes.
            Err(e) => {
                self.audit(
                    "session.refused",
                    json!({ "vm": self.tenant.name, "transport": self.transport, "error": e.message }),
                );
                error_frame(&e)
            }
        }
    }
}

impl SessionExecutor for BrokerSession {
    /// The batch's posted `Memset`s and small `MemcpyHtoD`s go to the session in runs (the
    /// engine's bookkeeping once per stream's run, as on the stream transports); any other
    /// frame, and every frame before the session is open, as [`BrokerSession::call`] serves it.
    fn call_batch(&mut self, frames: &[(Header, Range<usize>)], bytes: &[u8]) -> BatchResult {
        let mut at = 0;
        while at < frames.len() {
            if let Some(session) = self.session.as_mut() {
                self.run.clear();
                self.run.extend(frames[at..].iter().map_while(|(h, range)| {
                    PostedCall::decode(h, &bytes[range.clone()], range.start)
                }));
                if !self.run.is_empty() {
                    self.requests += self.run.len() as u64;
                    let (run, out) = (&self.run, &mut self.out);
                    let served = catch_unwind(AssertUnwindSafe(|| {
                        session.handle_posted_run(run, bytes, out)
                    }));
                    if served.is_err() {
                        warn!(tenant = %self.tenant.name, "a run of posted calls panicked; closing the session");
                        self.end("internal error");
                        return Err((
                            at,
                            "internal error while handling posted calls; the session was closed"
                                .into(),
                        ));
                    }
                    // The frame after the run, if any, is not a posted call: served below.
                    at += self.run.len();
                }
            }
            let Some((header, range)) = frames.get(at) else {
                break;
            };
            call_batched(self, *header, &bytes[range.clone()]).map_err(|why| (at, why))?;
            at += 1;
        }
        Ok(())
    }

    fn output_ready(&self) -> bool {
        self.session.as_ref().is_some_and(Session::output_ready)
    }

    fn answers_at_once(&self, header: &Header) -> bool {
        header.flags & FLAG_ASYNC == 0
            && self
                .session
                .as_ref()
                .is_some_and(|s| s.answers_at_once(header.opcode))
    }

    fn call(&mut self, c: Call<'_>) -> Reply {
        let Some(session) = self.session.as_mut() else {
            return self.handshake(&c);
        };
        self.requests += 1;
        let h = c.header;
        let is_async = h.flags & FLAG_ASYNC != 0;
        let decoded = Request::decode(h.opcode, c.inline).and_then(|(req, at)| {
            if req.flags() & REQ_TAIL == 0 && !c.data.is_empty() {
                Err(DecodeError::TrailingBytes(c.data.len() as usize))
            } else {
                Ok((req, at))
            }
        });
        let (req, tail_at) = match decoded {
            Ok(d) => d,
            Err(e) => {
                let ce = CuError::rejected(h.opcode, &e);
                debug!(session = session.id(), error = %ce, "bad request");
                if is_async {
                    session.defer_error(ce);
                    return Reply::None;
                }
                return error_frame(&ce);
            }
        };
        if is_async && req.flags() & ASYNC_OK == 0 {
            self.end("protocol violation");
            return Reply::Violation(format!("{} cannot be sent asynchronously", req.name()));
        }
        if matches!(req, Request::Goodbye(_)) {
            // The session ends here; the guest closes its file next.
            self.end("client disconnected");
            return Reply::None;
        }
        self.out.clear();
        let name = req.name();
        let out = &mut self.out;
        let result = catch_unwind(AssertUnwindSafe(|| {
            session.handle_bulk(
                &req,
                &c.inline[tail_at..],
                c.data,
                c.reply_data,
                out,
                !is_async,
            )
        }));
        match (result, is_async) {
            (Err(_), _) => {
                warn!(tenant = %self.tenant.name, op = name, "request handler panicked; closing the session");
                self.end("internal error");
                Reply::Violation(format!(
                    "internal error while handling {name}; the session was closed"
                ))
            }
            (Ok(_), true) => Reply::None,
            (Ok(Ok(())), false) => Reply::Frame {
                status: 0,
                payload: std::mem::take(&mut self.out),
            },
            (Ok(Err(e)), false) => error_frame(&e),
        }
    }
}

impl Drop for BrokerSession {
    fn drop(&mut self) {
        // The guest closed its file, or the device was reset (VMM gone, reboot).
        self.end("session ended (file closed or device reset)");
    }
}
