//! The admin API of a running vgpud, endpoint by endpoint: what it shows,
//! what it changes, and how it refuses (400 with a message, 404, 405, 409,
//! 403 / no connection for other users).

use crate::admin_support;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use admin_support::{Admin, MIB, run, two_vms};
use serde_json::json;
use vgpu_tests::harness::{artifacts, build_c_program};

#[test]
fn every_read_endpoint_describes_the_daemon() {
    let d = Admin::start(&two_vms());
    let _h = d.hold("vm1", 8 * MIB);

    let info = d.get("/v1/info");
    assert_eq!(info["name"], "vgpud");
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(info["pid"], d.pid());
    assert_eq!(info["vms"], 2);
    assert!(
        info["metrics_listen"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
    assert_eq!(
        info["audit_log"],
        d.path("audit.jsonl").display().to_string()
    );

    let devs = d.get("/v1/devices");
    assert_eq!(devs.as_array().unwrap().len(), 1);
    let g = &devs[0];
    assert_eq!(
        (g["name"].as_str(), g["kind"].as_str()),
        (Some("gpu0"), Some("sim"))
    );
    assert_eq!(g["memory_total"], 1u64 << 30);
    assert!(g["memory_used"].as_u64().unwrap() >= 8 * MIB);
    assert_eq!(g["memory_sliced"], 96 * MIB);
    assert_eq!(g["vms"], json!(["vm1", "vm2"]));
    assert_eq!(
        g["scheduling"],
        json!({ "policy": "fair", "slice_ms": 2, "batch_min_share": 5 })
    );
    assert!(g["uuid"].as_str().unwrap().starts_with("GPU-"));
    assert!(g["utilization"].as_f64().is_some());
    assert_eq!(d.get("/v1/devices/gpu0")["memory_sliced"], 96 * MIB);
    assert_eq!(d.get("/v1/devices/gpu0/scheduling")["slice_ms"], 2);

    let vm1 = d.get("/v1/vms/vm1");
    assert_eq!(vm1["memory_used"], 8 * MIB);
    assert_eq!(vm1["memory_limit"], 64 * MIB);
    assert_eq!(
        (vm1["weight"].as_u64(), vm1["priority"].as_str()),
        (Some(3), Some("normal"))
    );
    assert_eq!(vm1["policy"], "fair");
    assert_eq!(vm1["state"], "running");
    assert_eq!(vm1["usage"]["configured_share"], 0.75);
    for k in [
        "busy_s",
        "share_1s",
        "share_10s",
        "share_60s",
        "queue_wait_s",
    ] {
        assert!(vm1["usage"][k].as_f64().is_some(), "{k}: {vm1}");
    }
    assert_eq!(vm1["processes"], 1);
    let s = &vm1["sessions"][0];
    assert_eq!(s["process"], "c-driver_api");
    assert_eq!(s["memory_used"], 8 * MIB);
    assert_eq!(s["transport"], d.transport("vm1"));
    assert_eq!(vm1["unix_socket"], d.path("vm1.sock").display().to_string());
    assert_eq!(vm1["config"]["memory"], 64 * MIB);
    let vm2 = d.get("/v1/vms/vm2");
    assert_eq!(vm2["vsock"]["guest_cid"], 5);
    assert_eq!(vm2["vsock"]["stats"]["connections_open"], 0);
    assert_eq!(d.get("/v1/vms").as_array().unwrap().len(), 2);

    // No NVIDIA driver here: the inventory says so plainly.
    let gpus = d.get("/v1/gpus");
    assert_eq!(gpus["nvml"], false);
    assert_eq!(gpus["gpus"], json!([]));
    // NVIDIA's user-space libraries without the kernel driver (as the CUDA
    // toolkit installs them) are reported as such.
    let reason = gpus["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("no NVIDIA driver found")
            || reason.starts_with("the NVIDIA kernel driver is not loaded"),
        "{gpus}"
    );

    let (st, head, _) = d.http("GET", "/v1/metrics", None);
    assert_eq!(st, 200);
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
}

#[test]
fn vms_are_added_changed_drained_and_removed_live() {
    let d = Admin::start(&two_vms());
    let body = json!({
        "name": "vm3", "device": "gpu0", "memory": "16MiB", "weight": 2, "priority": "realtime",
        "unix_socket": d.path("vm3.sock").display().to_string(),
    });
    let (st, _, v) = d.http("POST", "/v1/vms", Some(&body.to_string()));
    assert_eq!(st, 201, "{v}");
    assert_eq!(
        (v["memory_limit"].as_u64(), v["priority"].as_str()),
        (Some(16 * MIB), Some("realtime"))
    );
    // It serves at once, with its slice.
    let h3 = d.hold("vm3", 12 * MIB);
    assert_eq!(d.get("/v1/vms/vm3")["memory_used"], 12 * MIB);

    // Live update: weight, priority, memory; shrinking below use is a conflict.
    let (st, _, v) = d.http(
        "PATCH",
        "/v1/vms/vm3",
        Some(r#"{"weight": 7, "priority": "batch", "memory": "32MiB"}"#),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (
            v["weight"].as_u64(),
            v["priority"].as_str(),
            v["memory_limit"].as_u64()
        ),
        (Some(7), Some("batch"), Some(32 * MIB))
    );
    let (st, _, v) = d.http("PATCH", "/v1/vms/vm3", Some(r#"{"memory": "8MiB"}"#));
    assert_eq!(st, 409, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("cannot shrink the slice"),
        "{v}"
    );
    assert_eq!(
        d.get("/v1/vms/vm3")["memory_limit"],
        32 * MIB,
        "a refused change changes nothing"
    );

    // Drain: new sessions are refused, the running one goes on.
    let (st, _, v) = d.http("POST", "/v1/vms/vm3/drain", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["state"].as_str(), v["accepting_sessions"].as_bool()),
        (Some("draining"), Some(false))
    );
    let refused = run(Command::new(build_c_program("driver_api"))
        .arg("hold")
        .arg("1024")
        .env("VGPU_TRANSPORT", d.transport("vm3")));
    assert!(
        refused.stdout.contains("CUDA_ERROR_DEVICE_UNAVAILABLE"),
        "{refused:?}"
    );
    let mut h3 = h3;
    assert!(h3.is_running());
    assert_eq!(d.get("/v1/vms/vm3")["memory_used"], 12 * MIB);

    // Remove: the session ends, its memory returns, the socket goes.
    let used_before = d.get("/v1/devices/gpu0")["memory_used"].as_u64().unwrap();
    let (st, _, v) = d.http("DELETE", "/v1/vms/vm3", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({ "removed": "vm3", "sessions_ended": 1, "memory_released": 12 * MIB, "complete": true })
    );
    assert_eq!(
        d.get("/v1/devices/gpu0")["memory_used"].as_u64().unwrap(),
        used_before - 12 * MIB
    );
    assert!(!d.path("vm3.sock").exists());
    d.wait_for("the holder to see its session end", || !h3.is_running());
    assert_eq!(d.http("GET", "/v1/vms/vm3", None).0, 404);

    // The name and socket can be used again.
    let (st, _, v) = d.http("POST", "/v1/vms", Some(&body.to_string()));
    assert_eq!(st, 201, "{v}");

    // Device scheduling.
    let (st, _, v) = d.http(
        "PATCH",
        "/v1/devices/gpu0/scheduling",
        Some(r#"{"policy": "fixed", "slice_ms": 10}"#),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({ "policy": "fixed", "slice_ms": 10, "batch_min_share": 5 })
    );
    assert_eq!(d.get("/v1/vms/vm1")["policy"], "fixed");
}

#[test]
fn bad_requests_get_400_with_a_message_unknown_names_404_wrong_methods_405() {
    let d = Admin::start(&two_vms());
    let sock = d.path("vm1.sock").display().to_string();
    for (body, want) in [
        ("not json".to_string(), "not valid JSON"),
        ("[1, 2]".to_string(), "JSON object"),
        (String::new(), "needs a JSON object body"),
        (json!({ "memory": "1MiB" }).to_string(), "needs a \"name\""),
        (
            json!({ "name": "x", "device": "gpu0" }).to_string(),
            "needs `memory",
        ),
        (
            json!({ "name": "x", "memory": "1GB" }).to_string(),
            "`1GB` is not a size",
        ),
        (
            json!({ "name": "x", "memory": 1, "device": "gpu9" }).to_string(),
            "defined devices: gpu0",
        ),
        (
            json!({ "name": "vm1", "memory": 1 }).to_string(),
            "already defined",
        ),
        (
            json!({ "name": "x", "memory": 1, "unix_socket": sock }).to_string(),
            "used twice",
        ),
        (
            json!({ "name": "x", "memory": 1, "weight": 0 }).to_string(),
            "weight must be between 1 and 10000",
        ),
        (
            json!({ "name": "x", "memory": 1, "vhost_user_socket": "/tmp/x.vhost" }).to_string(),
            "no guest_cid",
        ),
        (
            json!({ "name": "x", "memory": 1, "colour": "red" }).to_string(),
            "unknown field `colour`",
        ),
        (
            json!({ "name": "x", "memory": 1, "guest_cid": 5, "vhost_user_socket": "/tmp/y" })
                .to_string(),
            "guest_cid 5 is already used by VM `vm2`",
        ),
    ] {
        let (st, _, v) = d.http("POST", "/v1/vms", Some(&body));
        assert_eq!(st, 400, "{body}: {v}");
        let msg = v["error"].as_str().unwrap_or_default();
        assert!(msg.contains(want), "{body}: {msg}");
        assert!(
            !msg.contains("request:"),
            "no synthetic file position: {msg}"
        );
    }
    for (body, want) in [
        (r#"{}"#, "nothing to change"),
        (r#"{"device": "gpu1"}"#, "cannot change while the VM runs"),
        (r#"{"weight": 20000}"#, "weight must be between"),
        (r#"{"priority": "urgent"}"#, "realtime"),
        (r#"{"memory": "lots"}"#, "is not a size"),
    ] {
        let (st, _, v) = d.http("PATCH", "/v1/vms/vm1", Some(body));
        assert_eq!(st, 400, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(want), "{body}: {v}");
    }
    for (body, want) in [
        (r#"{"slice_ms": 0}"#, "slice_ms must be between 1 and 100"),
        (r#"{"policy": "rr"}"#, "unknown policy"),
        (r#"{"batch_min_share": 90}"#, "percentage from 0 to 50"),
        (r#"{"quantum": 3}"#, "not a scheduling setting"),
    ] {
        let (st, _, v) = d.http("PATCH", "/v1/devices/gpu0/scheduling", Some(body));
        assert_eq!(st, 400, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(want), "{body}: {v}");
    }
    assert_eq!(
        d.get("/v1/devices/gpu0/scheduling")["slice_ms"],
        2,
        "refused changes change nothing"
    );

    for (m, p) in [
        ("GET", "/v1/vms/nope"),
        ("PATCH", "/v1/vms/nope"),
        ("DELETE", "/v1/vms/nope"),
        ("POST", "/v1/vms/nope/drain"),
        ("GET", "/v1/devices/nope"),
        ("PATCH", "/v1/devices/nope/scheduling"),
        ("GET", "/v2/whatever"),
    ] {
        let (st, _, v) = d.http(m, p, Some(r#"{"weight": 2}"#));
        assert_eq!(st, 404, "{m} {p}: {v}");
        assert!(v["error"].as_str().unwrap().len() > 10, "{v}");
    }
    for (m, p, allow) in [
        ("DELETE", "/v1/info", "GET"),
        ("PUT", "/v1/vms", "GET, POST"),
        ("POST", "/v1/vms/vm1", "GET, PATCH, DELETE"),
        ("GET", "/v1/vms/vm1/drain", "POST"),
        ("DELETE", "/v1/devices/gpu0/scheduling", "GET, PATCH, PUT"),
    ] {
        let (st, head, v) = d.http(m, p, None);
        assert_eq!(st, 405, "{m} {p}: {v}");
        // Header names are case-insensitive (hyper writes them in lower case).
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("allow: {}\r\n", allow.to_ascii_lowercase())),
            "{head}"
        );
    }
    // The daemon is unharmed.
    assert_eq!(d.get("/v1/vms").as_array().unwrap().len(), 2);
}

fn as_nobody(cmd: &str, args: &[&str]) -> admin_support::Out {
    run(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(cmd)
        .args(args))
}

#[test]
fn other_users_cannot_use_the_api() {
    let d = Admin::start(&two_vms());
    let mode = std::fs::metadata(d.admin_socket())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "the admin socket is the daemon's user's only");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || Command::new("setpriv").arg("--version").output().is_err()
    {
        eprintln!("skipping the other-user part: needs root and setpriv");
        return;
    }
    // Let nobody reach the socket file and run a copy of vgpuctl; the
    // socket's mode still refuses it.
    std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = d.path("vgpuctl");
    std::fs::copy(&artifacts().vgpuctl, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let vgpuctl = copy.display().to_string();
    let sock = d.admin_socket().display().to_string();
    let o = as_nobody(&vgpuctl, &["--socket", &sock, "vm", "list"]);
    if o.code == 126 || o.code == 127 {
        eprintln!("skipping: nobody cannot run {vgpuctl} here: {o:?}");
        return;
    }
    assert_eq!(o.code, 3, "{o:?}");
    assert!(
        o.stderr.contains("ermission denied") && o.stderr.contains("sudo"),
        "{o:?}"
    );
    // Even with the socket opened up, the daemon checks the peer's uid.
    std::fs::set_permissions(d.admin_socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = as_nobody(&vgpuctl, &["--socket", &sock, "vm", "remove", "vm1"]);
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stderr.contains("only root and vgpud's own user"), "{o:?}");
    assert!(d.get("/v1/vms/vm1")["name"] == "vm1", "nothing was removed");
}
