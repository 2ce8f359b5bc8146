//! SIGHUP reloads of a running vgpud, and the audit log: who changed what,
//! before and after, and every session of every VM.

use crate::admin_support;

use std::process::Command;

use admin_support::{Admin, DIR, MIB, admin_table, run, two_vms};
use serde_json::json;
use vgpu_tests::harness::{artifacts, build_c_program};

#[test]
fn sighup_applies_the_changed_file_live() {
    let mut d = Admin::start(&two_vms());
    let mut h2 = d.hold("vm2", 4 * MIB);
    let _h1 = d.hold("vm1", 4 * MIB);
    // vm1's weight and slice change, vm2 goes, vm3 comes, the slice length changes.
    d.write_config(&format!(
        "{}[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\nworkers = 1\nslice_ms = 8\n\n\
         [[vm]]\nname = \"vm1\"\nmemory = \"128MiB\"\nweight = 9\nunix_socket = \"{DIR}/vm1.sock\"\n\n\
         [[vm]]\nname = \"vm3\"\nmemory = \"16MiB\"\nunix_socket = \"{DIR}/vm3.sock\"\n",
        admin_table()
    ));
    let r = d.hup();
    assert_eq!(r["result"], "ok", "{r}");
    assert_eq!(r["actor"]["kind"], "signal");
    assert_eq!(r["actor"]["signal"], libc::SIGHUP);
    assert_eq!(
        r["actor"]["pid"],
        std::process::id(),
        "the sender is recorded"
    );
    assert_eq!(r["applied"].as_array().unwrap().len(), 4, "{r}");
    // Each change with the state before and after.
    let changes = r["changes"].as_array().unwrap();
    let vm1 = changes
        .iter()
        .find(|c| c["change"].as_str().unwrap().contains("`vm1`"))
        .unwrap();
    assert_eq!(
        (
            vm1["before"]["weight"].as_u64(),
            vm1["after"]["weight"].as_u64()
        ),
        (Some(3), Some(9))
    );
    let vm2 = changes
        .iter()
        .find(|c| c["change"].as_str().unwrap().contains("`vm2`"))
        .unwrap();
    assert_eq!(
        (vm2["before"]["name"].as_str(), vm2["after"].is_null()),
        (Some("vm2"), true)
    );
    let sched = changes
        .iter()
        .find(|c| c["change"].as_str().unwrap().contains("scheduling"))
        .unwrap();
    assert_eq!(
        (
            sched["before"]["slice_ms"].as_u64(),
            sched["after"]["slice_ms"].as_u64()
        ),
        (Some(2), Some(8))
    );

    let vm1 = d.get("/v1/vms/vm1");
    assert_eq!(
        (vm1["weight"].as_u64(), vm1["memory_limit"].as_u64()),
        (Some(9), Some(128 * MIB))
    );
    assert_eq!(vm1["memory_used"], 4 * MIB, "vm1's session went on");
    assert_eq!(d.http("GET", "/v1/vms/vm2", None).0, 404);
    d.wait_for("vm2's session to end", || !h2.is_running());
    assert!(!d.path("vm2.sock").exists() && !d.path("vm2.vhost").exists());
    let _h3 = d.hold("vm3", 8 * MIB);
    assert_eq!(d.get("/v1/vms/vm3")["memory_used"], 8 * MIB);
    assert_eq!(d.get("/v1/devices/gpu0/scheduling")["slice_ms"], 8);

    // A broken file changes nothing; the daemon keeps running and says where.
    d.write_config("[[vm]]\nname = \"vm1\"\nmemory = \"1GB\"\n");
    let r = d.hup();
    assert_eq!(r["result"], "refused");
    assert!(
        r["error"].as_str().unwrap().contains("vgpud.toml:3:"),
        "{r}"
    );
    assert!(d.is_running());
    assert_eq!(d.get("/v1/vms").as_array().unwrap().len(), 2);
    d.wait_for("the error in the log", || {
        d.log().contains("config not reloaded")
    });
}

#[test]
fn the_audit_log_records_changes_and_sessions() {
    let d = Admin::start(&two_vms());
    let start = &d.audit()[0];
    assert_eq!(start["event"], "daemon.start");
    assert_eq!(start["pid"], d.pid());

    // A session: opened with the guest process's pid and name, then closed.
    let mut h = d.hold("vm1", 2 * MIB);
    let holder_pid = h.child.id();
    let _ = h.child.kill();
    let _ = h.child.wait();
    d.wait_for("the session to close", || {
        d.audit().iter().any(|e| e["event"] == "session.close")
    });

    // Changes through vgpuctl: who (vgpuctl's pid and uid), what, before → after.
    let o = d.vgpuctl(&["vm", "set", "vm1", "--weight", "6"]);
    assert_eq!(o.code, 0, "{o:?}");
    let o = d.vgpuctl(&["vm", "set", "vm1", "--memory", "1TiB", "--weight", "0"]);
    assert_ne!(o.code, 0);
    let o = d.vgpuctl(&["vm", "drain", "vm2"]);
    assert_eq!(o.code, 0, "{o:?}");
    // A refused session on the drained VM.
    let r = run(Command::new(build_c_program("driver_api"))
        .args(["hold", "1024"])
        .env("VGPU_TRANSPORT", d.transport("vm2")));
    assert!(r.stdout.contains("FAIL"), "{r:?}");
    let o = run(Command::new(&artifacts().vgpuctl)
        .arg("--socket")
        .arg(d.admin_socket())
        .args(["vm", "remove", "vm2"]));
    assert_eq!(o.code, 0, "{o:?}");

    let log = d.audit();
    let find = |event: &str| {
        log.iter()
            .filter(|e| e["event"] == event)
            .cloned()
            .collect::<Vec<_>>()
    };
    let open = &find("session.open")[0];
    assert_eq!(
        (open["vm"].as_str(), open["pid"].as_u64()),
        (Some("vm1"), Some(u64::from(holder_pid)))
    );
    assert_eq!(open["process"], "c-driver_api");
    assert_eq!(open["transport"], d.transport("vm1"));
    let close = &find("session.close")[0];
    assert_eq!(close["session"], open["session"]);
    // Killed between two requests or in the middle of one.
    let reason = close["reason"].as_str().unwrap();
    assert!(
        ["client disconnected", "connection lost mid-request"].contains(&reason),
        "{close}"
    );
    assert!(close["duration_s"].as_f64().unwrap() >= 0.0);

    let updates = find("vm.update");
    assert_eq!(updates.len(), 2, "{updates:?}");
    assert_eq!(updates[0]["result"], "ok");
    assert_eq!(updates[0]["before"]["weight"], 3);
    assert_eq!(updates[0]["after"]["weight"], 6);
    assert_eq!(updates[0]["actor"]["kind"], "peer");
    // SAFETY: getuid has no preconditions.
    assert_eq!(updates[0]["actor"]["uid"], unsafe { libc::getuid() });
    assert!(updates[0]["actor"]["pid"].as_u64().unwrap() > 0);
    assert_eq!(updates[1]["result"], "refused");
    assert!(
        updates[1]["error"]
            .as_str()
            .unwrap()
            .contains("weight must be between"),
        "{:?}",
        updates[1]
    );
    assert_eq!(
        updates[1]["request"],
        json!({ "memory": "1TiB", "weight": 0 })
    );

    let drain = &find("vm.drain")[0];
    assert_eq!(
        (
            drain["before"]["accepting_sessions"].as_bool(),
            drain["after"]["accepting_sessions"].as_bool()
        ),
        (Some(true), Some(false))
    );
    let refused = &find("session.refused")[0];
    assert_eq!(refused["vm"], "vm2");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("not accepting new sessions"),
        "{refused}"
    );
    let rm = &find("vm.remove")[0];
    assert_eq!(rm["before"]["name"], "vm2");
    assert_eq!(rm["after"], serde_json::Value::Null);
    // Every entry has a time.
    assert!(
        log.iter()
            .all(|e| e["time"].as_str().is_some_and(|t| t.ends_with('Z')))
    );
}

#[test]
fn a_session_that_breaks_the_protocol_is_an_audited_error() {
    use std::io::Write;
    let d = Admin::start(&two_vms());
    let mut s = std::os::unix::net::UnixStream::connect(d.path("vm1.sock")).unwrap();
    s.write_all(&[0xAB; 64]).unwrap();
    d.wait_for("the error entry", || {
        d.audit().iter().any(|e| e["event"] == "session.error")
    });
    let e = d
        .audit()
        .into_iter()
        .find(|e| e["event"] == "session.error")
        .unwrap();
    assert_eq!(e["vm"], "vm1");
    assert!(e["error"].as_str().unwrap().contains("bad frame"), "{e}");
    assert!(
        d.get("/v1/vms/vm1")["name"] == "vm1",
        "the daemon is unharmed"
    );
}
