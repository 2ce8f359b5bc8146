//! The admin API: REST/JSON over HTTP/1.1 on the `[admin] socket` unix
//! socket (mode 0600, so only the daemon's user and root can connect; the
//! server also checks the peer's uid with `SO_PEERCRED`). docs/admin-api.yaml
//! is the OpenAPI description; docs/admin.md the operator's guide.
//!
//! Errors are JSON `{"error": "…"}` with 400 (invalid request), 403 (peer
//! not allowed), 404 (unknown VM, device or path), 405 (method not allowed),
//! 409 (conflicts with the current state), 413 (body too large).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;
use tracing::{debug, warn};
use vgpu_api as api;
use vgpu_broker::tenant::Tenant;

use crate::audit::Actor;
use crate::daemon::{OpError, OpErrorKind, Runtime, scheduling};
use crate::http::{HttpRequest, HttpResponse};
use crate::listener::{ListenerError, bind_socket};
use crate::metrics;
use crate::server::{Handler, HttpServer, Limits, Listen, Peer};
use crate::session_hub::unix_seconds;
use crate::usage::{device_usage, vm_usage};

/// Mode of the admin socket: the daemon's user only.
pub const ADMIN_SOCKET_MODE: u32 = 0o600;
/// The admin API's bounds: a few operators and controllers at once; a request (a reload, a
/// drain) may take a while, but not forever.
const LIMITS: Limits = Limits {
    connections: 64,
    requests: 8,
    deadline: Duration::from_secs(120),
};

impl From<OpError> for HttpResponse {
    fn from(e: OpError) -> Self {
        let status = match e.kind {
            OpErrorKind::Invalid => 400,
            OpErrorKind::NotFound => 404,
            OpErrorKind::Conflict => 409,
            OpErrorKind::Failed => 500,
        };
        HttpResponse::error(status, e.message)
    }
}

/// A VM as the API shows it.
pub fn vm(rt: &Runtime, t: &Tenant) -> api::Vm {
    let s = t.settings();
    let sessions: Vec<api::Session> = t
        .sessions()
        .iter()
        .map(|x| api::Session {
            id: x.id,
            pid: x.pid,
            process: x.process_name.clone(),
            transport: x.transport.clone(),
            started: unix_seconds(x.started),
            memory_used: x.memory.load(Ordering::Relaxed),
        })
        .collect();
    let mut pids: Vec<u32> = t.sessions().iter().map(|x| x.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    let st = &t.stats;
    let vsock = rt.vsock_of(&t.name).map(|(c, stats)| api::VmVsock {
        guest_cid: c.guest_cid,
        socket: path_string(&c.socket),
        uds_path: path_string(&c.uds_path),
        stats: counters(&stats),
    });
    let vgpu_device = rt.vgpu_dev_of(&t.name).map(|(c, stats)| api::VmVgpuDevice {
        device_id: c.device_id,
        socket: path_string(&c.socket),
        stats: counters(&stats),
    });
    let policy = rt
        .broker()
        .scheduling(&t.device_name)
        .map(|s| s.policy.as_str().to_string());
    let vm_cfg = rt.vm_config(&t.name);
    let config = vm_cfg
        .as_ref()
        .map(|c| serde_json::to_value(vgpu_config::reload::vm_table(c)).unwrap_or(Value::Null));
    let sst = t.sched_stats();
    let tuning = vm_cfg.as_ref().map(|c| {
        let tu = &c.tuning;
        api::VmTuning {
            mode: rt.running_config().tuning.mode.as_str().into(),
            baseline_weight: sst.baseline_weight,
            adjust: sst.weight_adjust,
            weight_min: tu.weight_min.unwrap_or(1),
            weight_max: tu
                .weight_max
                .unwrap_or_else(|| c.weight.saturating_mul(4).min(vgpu_config::MAX_WEIGHT)),
            target_wait_p99_s: tu.target_wait_p99.map(|d| d.as_secs_f64()),
            min_share: tu.min_share,
            last_change: rt.tuner().last_change(&t.name),
        }
    });
    let by_kind = t.usage.breakdown(t.slice.used());
    api::Vm {
        name: t.name.clone(),
        device: t.device_name.clone(),
        state: if t.is_open() { "running" } else { "draining" }.into(),
        accepting_sessions: t.is_open(),
        memory_limit: t.slice.limit(),
        memory_used: t.slice.used(),
        memory_by_kind: api::MemoryByKind {
            plain: by_kind.plain,
            pool_reserved: by_kind.pool_reserved,
            pool_used: by_kind.pool_used,
            managed: by_kind.managed,
            mapped_host: by_kind.mapped_host,
            vmm_physical: by_kind.vmm_physical,
        },
        limits: limits(t),
        memory_placement: t.placement().map(|m| vm_placement(&m.snapshot())),
        weight: s.weight,
        priority: s.priority.as_str().into(),
        policy,
        usage: vm_usage(rt.broker(), t),
        sessions,
        processes: pids.len() as u64,
        stats: api::VmStats {
            sessions_total: st.sessions_total.load(Ordering::Relaxed),
            bytes_htod: st.bytes_htod.load(Ordering::Relaxed),
            bytes_dtoh: st.bytes_dtoh.load(Ordering::Relaxed),
            kernels: st.kernels.load(Ordering::Relaxed),
            errors: st.errors.load(Ordering::Relaxed),
            module_loads_stopped: st.module_loads_stopped.load(Ordering::Relaxed),
        },
        unix_socket: rt.unix_socket_of(&t.name).map(|p| path_string(&p)),
        vsock,
        vgpu_device,
        config,
        tuning,
    }
}

/// The JSON description of a VM.
pub fn vm_json(rt: &Runtime, t: &Tenant) -> Value {
    to_json(&vm(rt, t))
}

/// A path as the API writes it.
fn path_string(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A device's counters (a struct of `u64`s) as the API's open set of counters.
fn counters<T: serde::Serialize>(stats: &T) -> api::Counters {
    serde_json::to_value(stats)
        .and_then(serde_json::from_value)
        .unwrap_or_default()
}

/// Any API type as JSON.
fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// A VM's budgets and what its sessions hold against them, by config key
/// (`connections` has no `used`: the session hub counts them).
fn limits(t: &Tenant) -> api::VmLimits {
    use vgpu_config::limits::Budget;
    let l = t.limits.limits();
    let budget = |b: Budget| api::Budget {
        limit: l.get(b),
        refused: t.limits.refused(b),
        used: match b {
            Budget::Connections => None,
            Budget::Sessions => Some(t.sessions().len() as u64),
            _ => Some(t.limits.used(b)),
        },
    };
    api::VmLimits {
        sessions: budget(Budget::Sessions),
        connections: budget(Budget::Connections),
        modules: budget(Budget::Modules),
        module_bytes: budget(Budget::ModuleBytes),
        streams: budget(Budget::Streams),
        events: budget(Budget::Events),
        handles: budget(Budget::Handles),
        queued_bytes: budget(Budget::QueuedBytes),
        graph_bytes: budget(Budget::GraphBytes),
        interpreter_bytes: budget(Budget::InterpreterBytes),
    }
}

/// A VM's memory placement: reservation, overflow settings, where its bytes are, and moves.
pub fn vm_placement(m: &vgpu_broker::memory::placement::TenantMemorySnapshot) -> api::VmPlacement {
    api::VmPlacement {
        reserved: m.policy.reserved,
        overflow: m.policy.overflow.as_str().into(),
        overflow_limit: m.policy.overflow_limit,
        device_bytes: m.device,
        host_bytes: m.host,
        borrowed_bytes: m.borrowed,
        demotions: m.demotions,
        demoted_bytes: m.demoted_bytes,
        promotions: m.promotions,
        promoted_bytes: m.promoted_bytes,
    }
}

/// A device as the API shows it.
pub fn device(rt: &Runtime, name: &str) -> Option<api::Device> {
    let broker = rt.broker();
    let d = broker.device(name)?;
    let i = d.info();
    let vms: Vec<_> = broker
        .tenants()
        .into_iter()
        .filter(|t| t.device_name == name)
        .collect();
    let usage = device_usage(broker, name);
    Some(api::Device {
        name: name.to_string(),
        kind: i.kind.into(),
        model: i.name.clone(),
        uuid: vgpu_proto::cuda::gpu_uuid_text(&i.uuid),
        memory_total: i.total_memory,
        memory_used: d.memory_used(),
        memory_sliced: vms.iter().map(|t| t.slice.limit()).sum::<u64>(),
        memory_placement: broker.placement(name).map(|p| {
            let s = p.snapshot();
            api::DevicePlacement {
                overcommit: s.overcommit.map(|o| o.as_f64()),
                device_bytes: s.device_used,
                host_bytes: s.host_used,
                reserved: s.reserved,
                host_overflow_budget: broker.host_budget().limit(),
                host_overflow_used: broker.host_budget().used(),
            }
        }),
        utilization: usage.as_ref().map(|u| u.utilization_1s),
        usage,
        scheduling: broker.scheduling(name).map(|s| scheduling(&s)),
        execution_units: d.execution_units().map(|u| api::ExecutionUnits {
            total: u.total,
            busy: u.busy,
            waiting: u.waiting,
        }),
        vms: vms.iter().map(|t| t.name.clone()).collect(),
    })
}

/// The JSON description of a device.
pub fn device_json(rt: &Runtime, name: &str) -> Option<Value> {
    device(rt, name).map(|d| to_json(&d))
}

/// The profiles with, per device, the slice a VM of the profile gets, how
/// many such VMs the device holds (`slots`), how many more fit in its
/// unsliced memory now (`free`) and the VMs created from the profile.
pub fn profiles(rt: &Runtime) -> Vec<api::Profile> {
    let config = rt.running_config();
    let broker = rt.broker();
    let tenants = broker.tenants();
    config
        .profiles
        .iter()
        .map(|p| {
            let devices = broker
                .devices()
                .iter()
                .map(|(name, d)| {
                    let total = d.info().total_memory;
                    let size = p.memory.bytes_of(total);
                    let sliced: u64 = tenants
                        .iter()
                        .filter(|t| &t.device_name == name)
                        .map(|t| t.slice.limit())
                        .sum();
                    let vms: Vec<String> = config
                        .vms
                        .iter()
                        .filter(|v| &v.device == name && v.profile.as_deref() == Some(&p.name))
                        .map(|v| v.name.clone())
                        .collect();
                    api::ProfileDevice {
                        device: name.clone(),
                        memory_total: total,
                        memory_sliced: sliced,
                        memory: size,
                        slots: total.checked_div(size).unwrap_or(0),
                        free: total.saturating_sub(sliced).checked_div(size).unwrap_or(0),
                        vms,
                    }
                })
                .collect();
            api::Profile {
                name: p.name.clone(),
                memory: p.memory.to_config_string(),
                weight: p.weight,
                priority: p.priority.as_str().into(),
                devices,
            }
        })
        .collect()
}

/// The daemon as `GET /v1/info` shows it.
pub fn info(rt: &Runtime, config_path: &Path) -> api::Info {
    api::Info {
        name: "vgpud".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        protocol_version: vgpu_proto::PROTOCOL_VERSION,
        pid: std::process::id(),
        started: unix_seconds(rt.started()),
        uptime_s: rt.started().elapsed().map_or(0, |d| d.as_secs()),
        config: path_string(config_path),
        metrics_listen: rt.metrics_addr().map(|a| a.to_string()),
        audit_log: rt.audit().map(|a| path_string(a.path())),
        devices: rt.broker().devices().len() as u64,
        vms: rt.broker().tenants().len() as u64,
    }
}

fn parse_body(req: &HttpRequest) -> Result<Value, HttpResponse> {
    if req.body.is_empty() {
        return Err(HttpResponse::error(
            400,
            "this request needs a JSON object body",
        ));
    }
    let v: Value = serde_json::from_slice(&req.body)
        .map_err(|e| HttpResponse::error(400, format!("the body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(HttpResponse::error(400, "the body must be a JSON object"));
    }
    Ok(v)
}

/// Routes a request from `actor`.
pub fn route(rt: &Runtime, config_path: &Path, actor: Actor, req: &HttpRequest) -> HttpResponse {
    let segs: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    let m = req.method.as_str();
    let p = req.path.as_str();
    let body = || parse_body(req);
    match segs.as_slice() {
        ["v1", "info"] => match m {
            "GET" => HttpResponse::ok(to_json(&info(rt, config_path))),
            _ => HttpResponse::not_allowed(m, p, "GET"),
        },
        ["v1", "devices"] => match m {
            "GET" => HttpResponse::ok(Value::Array(
                rt.broker()
                    .devices()
                    .iter()
                    .filter_map(|(n, _)| device_json(rt, n))
                    .collect(),
            )),
            _ => HttpResponse::not_allowed(m, p, "GET"),
        },
        ["v1", "devices", name] => match m {
            "GET" => device_json(rt, name).map_or_else(
                || {
                    HttpResponse::error(
                        404,
                        format!(
                            "no device named `{name}`; `vgpuctl device list` shows the devices"
                        ),
                    )
                },
                HttpResponse::ok,
            ),
            "PATCH" | "PUT" => match body() {
                Ok(b) => match rt.set_device(actor, name, &b) {
                    Ok(()) => device_json(rt, name).map_or_else(
                        || HttpResponse::error(404, format!("device `{name}` is gone")),
                        HttpResponse::ok,
                    ),
                    Err(e) => HttpResponse::from(e),
                },
                Err(r) => r,
            },
            _ => HttpResponse::not_allowed(m, p, "GET, PATCH, PUT"),
        },
        ["v1", "devices", name, "scheduling"] => match m {
            "GET" => rt.broker().scheduling(name).map_or_else(
                || {
                    HttpResponse::error(
                        404,
                        format!(
                            "no device named `{name}`; `vgpuctl device list` shows the devices"
                        ),
                    )
                },
                |s| HttpResponse::ok(to_json(&scheduling(&s))),
            ),
            "PATCH" | "PUT" => match body() {
                Ok(b) => rt
                    .set_scheduling(actor, name, &b)
                    .map_or_else(HttpResponse::from, |s| HttpResponse::ok(to_json(&s))),
                Err(r) => r,
            },
            _ => HttpResponse::not_allowed(m, p, "GET, PATCH, PUT"),
        },
        ["v1", "gpus"] => match m {
            "GET" => HttpResponse::ok(to_json(&rt.inventory().report())),
            _ => HttpResponse::not_allowed(m, p, "GET"),
        },
        ["v1", "profiles"] => match m {
            "GET" => HttpResponse::ok(to_json(&profiles(rt))),
            _ => HttpResponse::not_allowed(m, p, "GET"),
        },
        ["v1", "passthrough"] => match m {
            "GET" => HttpResponse::ok(rt.passthrough_json()),
            _ => HttpResponse::not_allowed(m, p, "GET"),
        },
        ["v1", "analyze"] => match m {
            "GET" => HttpResponse::ok(to_json(&crate::tuning::analyze(rt))),
            _ => HttpResponse::not_allowed(m, p, "GET"),
        },
        ["v1", "metrics"] => match m {
            "GET" => HttpResponse::text(200, metrics::CONTENT_TYPE, metrics::render(rt)),
            _ => HttpResponse::not_allowed(m, p, "GET"),
        },
        ["v1", "reload"] => match m {
            "POST" => rt
                .reload(actor, config_path)
                .map_or_else(HttpResponse::from, |r| HttpResponse::ok(to_json(&r))),
            _ => HttpResponse::not_allowed(m, p, "POST"),
        },
        ["v1", "vms"] => match m {
            "GET" => HttpResponse::ok(Value::Array(
                rt.broker()
                    .tenants()
                    .iter()
                    .map(|t| vm_json(rt, t))
                    .collect(),
            )),
            "POST" => match body() {
                Ok(b) => match rt.add_vm(actor, &b) {
                    Ok(vm) => match rt.broker().tenant(&vm.name) {
                        Some(t) => HttpResponse::json(201, vm_json(rt, &t)),
                        None => HttpResponse::error(
                            409,
                            format!("VM `{}` was removed meanwhile", vm.name),
                        ),
                    },
                    Err(e) => e.into(),
                },
                Err(r) => r,
            },
            _ => HttpResponse::not_allowed(m, p, "GET, POST"),
        },
        ["v1", "vms", name] => match m {
            "GET" => match rt.broker().tenant(name) {
                Some(t) => HttpResponse::ok(vm_json(rt, &t)),
                None => HttpResponse::error(
                    404,
                    format!("no VM named `{name}`; `vgpuctl vm list` shows the VMs"),
                ),
            },
            "PATCH" => match body() {
                Ok(b) => match rt.update_vm(actor, name, &b) {
                    Ok(_) => match rt.broker().tenant(name) {
                        Some(t) => HttpResponse::ok(vm_json(rt, &t)),
                        None => HttpResponse::error(404, format!("no VM named `{name}`")),
                    },
                    Err(e) => e.into(),
                },
                Err(r) => r,
            },
            "DELETE" => match rt.remove_vm(actor, name) {
                Ok(r) => HttpResponse::ok(to_json(&api::Removal {
                    removed: (*name).to_string(),
                    sessions_ended: r.sessions_ended as u64,
                    memory_released: r.memory_released,
                    complete: r.complete,
                })),
                Err(e) => e.into(),
            },
            _ => HttpResponse::not_allowed(m, p, "GET, PATCH, DELETE"),
        },
        ["v1", "vms", name, "drain"] => match m {
            "POST" => match rt.drain_vm(actor, name) {
                Ok(t) => HttpResponse::ok(vm_json(rt, &t)),
                Err(e) => e.into(),
            },
            _ => HttpResponse::not_allowed(m, p, "POST"),
        },
        _ => HttpResponse::error(
            404,
            format!(
                "unknown path {}; docs/admin-api.yaml lists the endpoints",
                req.path
            ),
        ),
    }
}

/// Whether a peer may use the API: root or the daemon's own user.
pub fn permitted(actor: &Actor) -> bool {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    match actor {
        Actor::Peer { uid, .. } => *uid == 0 || *uid == me,
        Actor::Signal { .. } | Actor::Daemon | Actor::Tuner => true,
    }
}

/// The running admin server.
pub struct AdminServer {
    path: PathBuf,
    server: Option<HttpServer>,
}

impl std::fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminServer")
            .field("path", &self.path)
            .finish()
    }
}

impl AdminServer {
    /// Serves the admin API on `path`; `config_path` is the file `POST
    /// /v1/reload` reads.
    pub fn start(
        rt: Arc<Runtime>,
        path: &Path,
        config_path: &Path,
    ) -> Result<AdminServer, ListenerError> {
        let l = bind_socket(path, ADMIN_SOCKET_MODE)?;
        let config_path = config_path.to_path_buf();
        let handler: Handler =
            Arc::new(move |peer: &Peer, req: HttpRequest| handle(&rt, &config_path, peer, &req));
        let server =
            HttpServer::start("admin", Listen::Unix(l), LIMITS, handler).map_err(|source| {
                ListenerError::Bind {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        Ok(AdminServer {
            path: path.to_path_buf(),
            server: Some(server),
        })
    }
}

/// One admin request from `peer`: only root and the daemon's own user may use the API.
fn handle(rt: &Runtime, config_path: &Path, peer: &Peer, req: &HttpRequest) -> HttpResponse {
    let Some(actor) = peer else {
        return HttpResponse::error(403, "cannot identify the client");
    };
    if !permitted(actor) {
        warn!(?actor, "admin request from a user that is not allowed");
        return HttpResponse::error(
            403,
            "only root and vgpud's own user may use the admin API; run vgpuctl as one of them (e.g. with sudo)",
        );
    }
    debug!(method = %req.method, path = %req.path, ?actor, "admin request");
    route(rt, config_path, *actor, req)
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        drop(self.server.take());
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_openapi_document_describes_every_route() {
        let doc = include_str!("../../../docs/admin-api.yaml");
        for path in [
            "/v1/info:",
            "/v1/devices:",
            "/v1/devices/{device}:",
            "/v1/devices/{device}/scheduling:",
            "/v1/gpus:",
            "/v1/passthrough:",
            "/v1/profiles:",
            "/v1/vms:",
            "/v1/vms/{vm}:",
            "/v1/vms/{vm}/drain:",
            "/v1/reload:",
            "/v1/analyze:",
            "/v1/metrics:",
        ] {
            assert!(
                doc.contains(&format!("  {path}\n")),
                "{path} is not in docs/admin-api.yaml"
            );
        }
        assert_eq!(doc.matches("\n  /v1/").count(), 13, "and nothing else");
    }

    #[test]
    fn only_root_and_the_daemons_user_are_permitted() {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert!(permitted(&Actor::Peer {
            uid: me,
            gid: 0,
            pid: 1
        }));
        assert!(permitted(&Actor::Peer {
            uid: 0,
            gid: 0,
            pid: 1
        }));
        let other = if me == 65534 { 65533 } else { 65534 };
        assert!(!permitted(&Actor::Peer {
            uid: other,
            gid: 0,
            pid: 1
        }));
    }
}
