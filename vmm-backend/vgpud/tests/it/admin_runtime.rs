//! The admin plane in-process: removing a VM ends its unix-socket and vsock
//! sessions and releases what they held; the metrics endpoint is valid
//! Prometheus text with the right values; reloads apply a changed file; the
//! audit log records sessions and changes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use vgpu_broker::testutils::TestClient;
use vgpu_config::Config;
use vgpu_proto::msg;
use vgpu_vmm_testutils::vsock::{GuestOptions, TestGuest};
use vgpud::Daemon;
use vgpud::audit::Actor;
use vgpud::daemon::OpErrorKind;

const MIB: u64 = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(10);

fn config_text(dir: &Path, extra_vm: &str, slice_ms: u32, vm1_weight: u32) -> String {
    let d = dir.display();
    format!(
        "[admin]\nsocket = \"{d}/admin.sock\"\nmetrics_listen = \"127.0.0.1:0\"\naudit_log = \"{d}/audit.jsonl\"\n\n\
         [[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\nworkers = 1\nslice_ms = {slice_ms}\n\n\
         [[vm]]\nname = \"vm1\"\ndevice = \"gpu0\"\nmemory = \"64MiB\"\nweight = {vm1_weight}\nunix_socket = \"{d}/vm1.sock\"\n\
         vhost_user_socket = \"{d}/vm1.vhost\"\nguest_cid = 3\n\n\
         [[vm]]\nname = \"vm2\"\ndevice = \"gpu0\"\nmemory = \"32MiB\"\nunix_socket = \"{d}/vm2.sock\"\n{extra_vm}"
    )
}

fn start(dir: &Path) -> (Daemon, std::path::PathBuf) {
    start_with(dir, "")
}

/// Like [`start`], with more `[[vm]]` entries.
fn start_with(dir: &Path, extra_vm: &str) -> (Daemon, std::path::PathBuf) {
    let path = dir.join("vgpud.toml");
    std::fs::write(&path, config_text(dir, extra_vm, 2, 1)).unwrap();
    let config = Config::load(&path).unwrap();
    (Daemon::start(&config).unwrap(), path)
}

/// Opens a session, creates a context and allocates `bytes`, copying 1 MiB in.
fn allocate<S: Read + Write>(c: &mut TestClient<S>, bytes: u64) {
    c.hello().unwrap();
    let ctx = c
        .call(
            &msg::CtxCreate {
                device: 0,
                flags: 0,
            },
            &[],
        )
        .unwrap()
        .0
        .handle;
    let p = c
        .call(&msg::MemAlloc { ctx, size: bytes }, &[])
        .unwrap()
        .0
        .ptr;
    c.call(
        &msg::MemcpyHtoD {
            ctx,
            stream: 0,
            dst: p,
        },
        &vec![7u8; MIB as usize],
    )
    .unwrap();
}

fn audit(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line {l:?} is not JSON: {e}"))
        })
        .collect()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn removing_a_vm_ends_its_unix_and_vsock_sessions_and_releases_everything() {
    let dir = tempfile::tempdir().unwrap();
    let (d, _) = start(dir.path());
    let rt = d.runtime().clone();
    let mut unix = TestClient::new(UnixStream::connect(dir.path().join("vm1.sock")).unwrap());
    allocate(&mut unix, 8 * MIB);
    let guest = TestGuest::start(&dir.path().join("vm1.vhost"), GuestOptions::default()).unwrap();
    let mut vsock = TestClient::new(guest.connect(vgpu_proto::GPU_VSOCK_PORT).unwrap());
    allocate(&mut vsock, 4 * MIB);
    let dev = d.broker().device("gpu0").unwrap().clone();
    let base = dev.memory_used();
    assert!(base >= 12 * MIB);
    let tenant = d.broker().tenant("vm1").unwrap();
    assert_eq!(tenant.sessions().len(), 2);

    let r = rt.remove_vm(Actor::Daemon, "vm1").unwrap();
    assert_eq!(r.sessions_ended, 2);
    assert_eq!(r.memory_released, 12 * MIB);
    assert!(r.complete);
    // Everything the sessions held is back: the slice and the device memory.
    assert_eq!(tenant.slice.used(), 0);
    assert!(tenant.sessions().is_empty());
    assert_eq!(dev.memory_used(), base - 12 * MIB);
    assert!(d.broker().tenant("vm1").is_none());
    assert!(
        !dir.path().join("vm1.sock").exists(),
        "the VM's socket is removed"
    );
    assert!(
        !dir.path().join("vm1.vhost").exists(),
        "the VM's vhost-user socket is removed"
    );
    // The clients see their sessions end.
    assert!(unix.call(&msg::Ping {}, &[]).is_err());
    // vm2 is untouched.
    assert!(d.broker().tenant("vm2").is_some());
    assert!(rt.remove_vm(Actor::Daemon, "vm1").unwrap_err().kind == OpErrorKind::NotFound);

    wait_for("the session records", || {
        audit(dir.path())
            .iter()
            .filter(|e| e["event"] == "session.close")
            .count()
            == 2
    });
    let log = audit(dir.path());
    let opens: Vec<_> = log
        .iter()
        .filter(|e| e["event"] == "session.open")
        .collect();
    assert_eq!(opens.len(), 2, "{log:?}");
    assert!(
        opens
            .iter()
            .all(|e| e["vm"] == "vm1" && e["pid"].as_u64().is_some())
    );
    assert!(
        opens
            .iter()
            .any(|e| e["transport"].as_str().unwrap().starts_with("unix:"))
    );
    assert!(opens.iter().any(|e| e["transport"] == "vsock:3"));
    let closes: Vec<_> = log
        .iter()
        .filter(|e| e["event"] == "session.close")
        .collect();
    assert!(
        closes.iter().all(|e| e["reason"] == "VM removed"),
        "{closes:?}"
    );
    let rm = log
        .iter()
        .find(|e| e["event"] == "vm.remove" && e["result"] == "ok")
        .unwrap();
    assert_eq!(rm["before"]["memory"], 64 * MIB);
    assert_eq!(rm["after"], Value::Null);
    assert_eq!(rm["actor"]["kind"], "daemon");
    assert_eq!(rm["memory_released"], 12 * MIB);
    d.shutdown();
    let last = audit(dir.path());
    assert_eq!(last.last().unwrap()["event"], "daemon.stop");
}

/// The metric names in a PromQL expression (vgpu's and DCGM's).
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("vgpu_") || w.starts_with("DCGM_FI_"))
        .map(str::to_string)
        .collect()
}

fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_string()
}

#[test]
fn metrics_are_valid_prometheus_text_with_the_right_values() {
    let dir = tempfile::tempdir().unwrap();
    // vm3 has a virtio-vgpu device, so that its series are exported too; it is on a GPU of its
    // own, so that gpu0's shares stay those of vm1 and vm2. It has a p99 target (exported).
    let vm3 = format!(
        "\n[[device]]\nname = \"gpu1\"\nkind = \"sim\"\nmemory = \"64MiB\"\n\n\
         [[vm]]\nname = \"vm3\"\ndevice = \"gpu1\"\nmemory = \"16MiB\"\ntarget_wait_p99 = \"5ms\"\n\
         vhost_user_socket = \"{}/vm3.vgpu\"\ndevice_model = \"vgpu\"\n",
        dir.path().display()
    );
    let (d, _) = start_with(dir.path(), &vm3);
    let addr = d.runtime().metrics_addr().unwrap();
    let mut c = TestClient::new(UnixStream::connect(dir.path().join("vm2.sock")).unwrap());
    allocate(&mut c, 8 * MIB);
    let text = scrape(addr);

    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let sample_lines = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    assert_eq!(
        scrape.samples.len(),
        sample_lines,
        "every sample line parses:\n{text}"
    );
    for s in &scrape.samples {
        assert!(
            scrape.docs.contains_key(&s.metric),
            "{} has no HELP",
            s.metric
        );
        match s.value {
            prometheus_parse::Value::Counter(_) => {
                assert!(s.metric.ends_with("_total"), "{}", s.metric)
            }
            prometheus_parse::Value::Gauge(_) => {
                assert!(!s.metric.ends_with("_total"), "{}", s.metric)
            }
            ref other => panic!("{} is {other:?}: every family has a TYPE", s.metric),
        }
    }
    let value = |metric: &str, labels: &[(&str, &str)]| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .unwrap_or_else(|| panic!("no {metric} {labels:?} in\n{text}"));
        match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
            _ => unreachable!(),
        }
    };
    let vm2 = [("vm", "vm2"), ("device", "gpu0")];
    assert_eq!(value("vgpu_vm_fb_used_bytes", &vm2), (8 * MIB) as f64);
    assert_eq!(value("vgpu_vm_fb_limit_bytes", &vm2), (32 * MIB) as f64);
    assert_eq!(value("vgpu_vm_sessions", &vm2), 1.0);
    // Budgets besides memory: the default limits, what is held, nothing refused yet.
    let budget = |b| [("vm", "vm2"), ("budget", b)];
    assert_eq!(value("vgpu_vm_limit", &budget("sessions")), 1024.0);
    assert_eq!(value("vgpu_vm_limit_used", &budget("sessions")), 1.0);
    assert_eq!(
        value("vgpu_vm_limit", &budget("module_bytes")),
        (1u64 << 30) as f64
    );
    assert_eq!(
        value("vgpu_vm_limit_refused_total", &budget("modules")),
        0.0
    );
    assert_eq!(value("vgpu_vm_limit", &budget("streams")), 16384.0);
    assert_eq!(value("vgpu_vm_limit", &budget("events")), 65536.0);
    // The session's context is one handle.
    assert_eq!(value("vgpu_vm_limit_used", &budget("handles")), 1.0);
    assert_eq!(
        value("vgpu_vm_limit", &budget("queued_bytes")),
        (256u64 << 20) as f64
    );
    assert_eq!(value("vgpu_vm_limit_used", &budget("queued_bytes")), 0.0);
    assert_eq!(
        value("vgpu_vm_limit", &budget("graph_bytes")),
        (256u64 << 20) as f64
    );
    assert_eq!(
        value(
            "vgpu_vm_copy_bytes_total",
            &[("vm", "vm2"), ("direction", "htod")]
        ),
        MIB as f64
    );
    assert_eq!(value("vgpu_vm_kernels_total", &vm2), 0.0);
    assert_eq!(value("vgpu_vm_errors_total", &vm2), 0.0);
    assert_eq!(value("vgpu_vm_configured_share", &vm2), 0.5);
    assert!(value("vgpu_vm_compute_share", &[("vm", "vm2"), ("window", "10s")]) >= 0.0);
    assert_eq!(
        value("vgpu_vm_fb_limit_bytes", &[("vm", "vm1")]),
        (64 * MIB) as f64
    );
    // Device metrics use dcgm-exporter's names and units (MiB).
    assert_eq!(
        value("DCGM_FI_DEV_FB_TOTAL", &[("device", "gpu0"), ("gpu", "0")]),
        1024.0
    );
    let used = value("DCGM_FI_DEV_FB_USED", &[("device", "gpu0")]);
    let free = value("DCGM_FI_DEV_FB_FREE", &[("device", "gpu0")]);
    assert!(
        used >= 8.0 && (used + free - 1024.0).abs() < 1.0,
        "{used} + {free}"
    );
    assert!(value("DCGM_FI_DEV_GPU_UTIL", &[("device", "gpu0")]) >= 0.0);
    // The simulated GPU's execution units: no kernel runs.
    for state in ["busy", "waiting"] {
        assert_eq!(
            value(
                "vgpu_device_execution_units",
                &[("device", "gpu0"), ("state", state)]
            ),
            0.0
        );
    }
    assert_eq!(value("vgpu_vm_vsock_connections", &[("vm", "vm1")]), 0.0);
    assert_eq!(value("vgpu_vm_vgpu_device_sessions", &[("vm", "vm3")]), 0.0);
    assert_eq!(
        value("vgpu_vm_vgpu_device_pauses_total", &[("vm", "vm3")]),
        0.0
    );

    // The dashboard and the operator's guide use exactly what is exported.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let exported: std::collections::BTreeSet<&str> =
        scrape.samples.iter().map(|s| s.metric.as_str()).collect();
    let dashboard = std::fs::read_to_string(root.join("docs/grafana-dashboard.json")).unwrap();
    let dash: Value = serde_json::from_str(&dashboard).unwrap();
    let mut used = 0;
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            for name in metric_names(t["expr"].as_str().unwrap()) {
                assert!(
                    exported.contains(name.as_str()),
                    "the dashboard uses {name}, which vgpud does not export"
                );
                used += 1;
            }
        }
    }
    assert!(used > 15, "the dashboard has queries");
    let guide = std::fs::read_to_string(root.join("docs/admin.md")).unwrap();
    for m in &exported {
        assert!(
            guide.contains(&format!("`{m}")) || guide.contains(&format!(", `{m}")),
            "docs/admin.md does not list {m}"
        );
    }

    // Only GET /metrics.
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET /other HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
    d.shutdown();
    assert!(
        TcpStream::connect(addr).is_err(),
        "the endpoint closes with the daemon"
    );
}

#[test]
fn a_reload_applies_what_changed_in_the_file_and_keeps_runtime_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (d, path) = start(dir.path());
    let rt = d.runtime().clone();
    // A change through the API that the file does not know about.
    rt.add_vm(
        Actor::Daemon,
        &json!({ "name": "api", "memory": "16MiB", "device": "gpu0" }),
    )
    .unwrap();
    let extra = format!(
        "\n[[vm]]\nname = \"vm3\"\nmemory = \"16MiB\"\nunix_socket = \"{}/vm3.sock\"\n",
        dir.path().display()
    );
    std::fs::write(&path, config_text(dir.path(), &extra, 9, 4)).unwrap();
    let r = d.reload(Actor::Daemon, &path).unwrap();
    assert!(r.refused.is_empty() && r.restart_needed.is_empty(), "{r:?}");
    assert_eq!(r.applied.len(), 3, "{r:?}");
    assert_eq!(d.broker().tenant("vm1").unwrap().settings().weight, 4);
    assert!(
        UnixStream::connect(dir.path().join("vm3.sock")).is_ok(),
        "vm3 serves"
    );
    assert_eq!(
        d.broker().scheduling("gpu0").unwrap().slice,
        Duration::from_millis(9)
    );
    assert!(
        d.broker().tenant("api").is_some(),
        "a VM added through the API stays"
    );

    // Nothing changed: nothing to do.
    assert_eq!(d.reload(Actor::Daemon, &path).unwrap(), Default::default());

    // A change that cannot apply (a slice below what is in use) is refused;
    // the rest applies, and the next reload tries again.
    let mut c = TestClient::new(UnixStream::connect(dir.path().join("vm2.sock")).unwrap());
    allocate(&mut c, 24 * MIB);
    let text = config_text(dir.path(), &extra, 9, 4)
        .replace("memory = \"32MiB\"", "memory = \"8MiB\"")
        .replace("memory = \"1GiB\"", "memory = \"2GiB\"");
    std::fs::write(&path, &text).unwrap();
    let r = d.reload(Actor::Daemon, &path).unwrap();
    assert_eq!(r.refused.len(), 1, "{r:?}");
    assert!(r.refused[0].contains("cannot shrink the slice"), "{r:?}");
    assert_eq!(r.restart_needed.len(), 1, "{r:?}");
    assert_eq!(d.broker().tenant("vm2").unwrap().slice.limit(), 32 * MIB);
    drop(c);
    wait_for("vm2's session to end", || {
        d.broker().tenant("vm2").unwrap().slice.used() == 0
    });
    let r = d.reload(Actor::Daemon, &path).unwrap();
    assert!(r.refused.is_empty() && r.applied.len() == 1, "{r:?}");
    assert_eq!(d.broker().tenant("vm2").unwrap().slice.limit(), 8 * MIB);

    // An invalid file changes nothing and says where the error is.
    std::fs::write(&path, "[[vm]]\nname = \"x\"\nmemory = \"lots\"\n").unwrap();
    let e = d.reload(Actor::Daemon, &path).unwrap_err();
    assert_eq!(e.kind, OpErrorKind::Invalid);
    assert!(
        e.message.contains("vgpud.toml:3:") && e.message.contains("nothing was changed"),
        "{e}"
    );
    assert!(d.broker().tenant("vm1").is_some());
    let log = audit(dir.path());
    let reloads: Vec<_> = log
        .iter()
        .filter(|e| e["event"] == "config.reload")
        .collect();
    assert_eq!(reloads.len(), 5);
    assert_eq!(reloads[2]["result"], "refused");
    assert_eq!(reloads[4]["result"], "refused");
    d.shutdown();
}

/// Routes `method path` (with `body`) and returns the JSON reply.
fn call(d: &Daemon, config: &Path, method: &str, path: &str, body: Option<Value>) -> Value {
    let req = vgpud::http::HttpRequest {
        method: method.into(),
        path: path.into(),
        body: body.map(|b| b.to_string().into_bytes()).unwrap_or_default(),
    };
    let resp = vgpud::admin::route(d.runtime(), config, Actor::Daemon, &req);
    assert!(
        (200..300).contains(&resp.status),
        "{method} {path}: {resp:?}"
    );
    match resp.body {
        vgpud::http::Body::Json(v) => v,
        other => panic!("{method} {path}: not JSON: {other:?}"),
    }
}

/// `vgpuctl` reads vgpud's replies as `vgpu_api` types: each reply deserializes, and
/// serializes back to exactly the JSON vgpud sent (no field dropped, renamed or reshaped).
fn round_trips<T: serde::de::DeserializeOwned + serde::Serialize>(what: &str, v: &Value) -> T {
    let t: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{what}: {e}\n{v:#}"));
    assert_eq!(&serde_json::to_value(&t).unwrap(), v, "{what}");
    t
}

#[test]
fn every_reply_round_trips_through_the_api_types() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "\n[[profile]]\nname = \"q4\"\nmemory = \"1/4\"\n";
    let (d, path) = start_with(dir.path(), extra);
    let mut unix = TestClient::new(UnixStream::connect(dir.path().join("vm1.sock")).unwrap());
    allocate(&mut unix, 8 * MIB);
    let guest = TestGuest::start(&dir.path().join("vm1.vhost"), GuestOptions::default()).unwrap();

    round_trips::<vgpu_api::Info>("info", &call(&d, &path, "GET", "/v1/info", None));
    let devices: Vec<vgpu_api::Device> =
        round_trips("devices", &call(&d, &path, "GET", "/v1/devices", None));
    assert!(devices[0].usage.is_some() && devices[0].scheduling.is_some());
    round_trips::<vgpu_api::Device>("device", &call(&d, &path, "GET", "/v1/devices/gpu0", None));
    let sched = json!({ "slice_ms": 3 });
    let s: vgpu_api::Scheduling = round_trips(
        "scheduling",
        &call(
            &d,
            &path,
            "PATCH",
            "/v1/devices/gpu0/scheduling",
            Some(sched),
        ),
    );
    assert_eq!(s.slice_ms, 3);
    round_trips::<vgpu_api::Inventory>("gpus", &call(&d, &path, "GET", "/v1/gpus", None));
    let _: Vec<vgpu_api::PassthroughAssignment> = round_trips(
        "passthrough",
        &call(&d, &path, "GET", "/v1/passthrough", None),
    );
    let profiles: Vec<vgpu_api::Profile> =
        round_trips("profiles", &call(&d, &path, "GET", "/v1/profiles", None));
    assert_eq!(profiles[0].devices[0].memory, 256 * MIB);
    let vms: Vec<vgpu_api::Vm> = round_trips("vms", &call(&d, &path, "GET", "/v1/vms", None));
    let vm1 = vms.iter().find(|v| v.name == "vm1").unwrap();
    assert_eq!(vm1.sessions.len(), 1);
    assert!(vm1.vsock.is_some() && vm1.unix_socket.is_some() && vm1.tuning.is_some());
    assert_eq!(vm1.limits.connections.used, None);
    let body = serde_json::to_value(vgpu_api::VmUpdate {
        weight: Some(2),
        ..Default::default()
    })
    .unwrap();
    let vm: vgpu_api::Vm = round_trips(
        "vm update",
        &call(&d, &path, "PATCH", "/v1/vms/vm2", Some(body)),
    );
    assert_eq!(vm.weight, 2);
    let entry = serde_json::to_value(vgpu_api::VmEntry {
        name: "vm4".into(),
        memory: Some(vgpu_api::Size::Text("16MiB".into())),
        ..Default::default()
    })
    .unwrap();
    round_trips::<vgpu_api::Vm>("vm add", &call(&d, &path, "POST", "/v1/vms", Some(entry)));
    round_trips::<vgpu_api::Analysis>("analyze", &call(&d, &path, "GET", "/v1/analyze", None));
    round_trips::<vgpu_api::Vm>("drain", &call(&d, &path, "POST", "/v1/vms/vm4/drain", None));
    let r: vgpu_api::Removal =
        round_trips("remove", &call(&d, &path, "DELETE", "/v1/vms/vm4", None));
    assert!(r.complete);
    std::fs::write(&path, config_text(dir.path(), extra, 9, 4)).unwrap();
    let report: vgpu_api::ReloadReport =
        round_trips("reload", &call(&d, &path, "POST", "/v1/reload", None));
    assert!(!report.changes.is_empty(), "{report:?}");
    drop(guest);
}
