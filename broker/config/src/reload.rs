//! Live configuration changes with the config file's rules.
//!
//! Every change — a VM added, removed or updated through the API, a device's
//! scheduling changed, a `SIGHUP` reload — is checked the same way: the
//! running configuration is rendered back to TOML, the change is applied to
//! that text, and [`Config::parse`] validates the result. So an API request
//! is refused for exactly the reasons a config file would be, with the same
//! messages (unique names, CIDs and socket paths, ranges, known devices, …).
//!
//! A reload compares the file as it was last applied with the file now, and
//! applies what changed (see [`diff`]).
//!
//! Everything here is pure: rendering, validating and diffing configurations.
//! vgpud's runtime (`vmm-backend/vgpud/src/daemon.rs`) applies the changes.

use std::path::Path;

use serde_json::Value;
use thiserror::Error;
use toml::{Table, Value as Toml};

use crate::limits::VmLimits;
use crate::{Config, DeviceConfig, DeviceKind, DeviceModel, VmConfig, VmMode};

/// Pseudo file name used in messages about API requests.
pub const REQUEST_SOURCE: &str = "request";

/// Why a requested change is invalid.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChangeError {
    /// The request body is not what the API takes.
    #[error("{0}")]
    BadRequest(String),
    /// The resulting configuration would be invalid (the config rules' message).
    #[error("{0}")]
    Invalid(String),
}

fn device_table(d: &DeviceConfig) -> Table {
    let mut t = Table::new();
    t.insert("name".into(), d.name.clone().into());
    match &d.kind {
        DeviceKind::Sim => {
            t.insert("kind".into(), "sim".into());
            t.insert("memory".into(), Toml::Integer(d.memory as i64));
            if let Some(w) = d.workers {
                t.insert("workers".into(), Toml::Integer(w as i64));
            }
        }
        DeviceKind::Cuda { index, uuid } => {
            t.insert("kind".into(), "cuda".into());
            if let Some(i) = index {
                t.insert("index".into(), Toml::Integer(i64::from(*i)));
            }
            if let Some(u) = uuid {
                t.insert("uuid".into(), u.clone().into());
            }
        }
    }
    let watchdog_ms = d.watchdog.map_or(0, |w| w.as_millis().max(1) as i64);
    t.insert("watchdog_ms".into(), Toml::Integer(watchdog_ms));
    t.insert("policy".into(), d.scheduling.policy.as_str().into());
    t.insert(
        "slice_ms".into(),
        Toml::Integer(d.scheduling.slice.as_millis() as i64),
    );
    t.insert(
        "batch_min_share".into(),
        Toml::Integer(i64::from(d.scheduling.batch_min_share)),
    );
    t.insert("overcommit".into(), Toml::Float(d.overcommit.as_f64()));
    t
}

fn path_value(p: &Path) -> Toml {
    Toml::String(p.to_string_lossy().into_owned())
}

/// A `[[vm]]` entry as a TOML table (what the config file would say).
pub fn vm_table(v: &VmConfig) -> Table {
    let mut t = Table::new();
    t.insert("name".into(), v.name.clone().into());
    if let VmMode::Passthrough { pci } = &v.mode {
        t.insert("mode".into(), "passthrough".into());
        t.insert("pci".into(), pci.clone().into());
        return t;
    }
    t.insert("device".into(), v.device.clone().into());
    t.insert("memory".into(), Toml::Integer(v.memory as i64));
    t.insert("weight".into(), Toml::Integer(i64::from(v.weight)));
    t.insert("priority".into(), v.priority.as_str().into());
    if let Some(p) = &v.unix_socket {
        t.insert("unix_socket".into(), path_value(p));
    }
    if let Some(p) = &v.vhost_user_socket {
        t.insert("vhost_user_socket".into(), path_value(p));
    }
    if let Some(c) = v.guest_cid {
        t.insert("guest_cid".into(), Toml::Integer(c as i64));
    }
    if let Some(p) = &v.vsock_uds_path {
        t.insert("vsock_uds_path".into(), path_value(p));
    }
    if let DeviceModel::Vgpu { device_id } = v.device_model {
        t.insert("device_model".into(), v.device_model.as_str().into());
        t.insert("vgpu_device_id".into(), Toml::Integer(i64::from(device_id)));
    }
    if let Some(p) = &v.profile {
        t.insert("profile".into(), p.clone().into());
    }
    if let Some(o) = &v.socket_owner {
        t.insert("socket_owner".into(), o.clone().into());
    }
    if !v.schedule.is_empty() {
        let windows = v
            .schedule
            .iter()
            .map(|w| {
                let mut wt = Table::new();
                wt.insert("from".into(), w.from.to_string().into());
                wt.insert("to".into(), w.to.to_string().into());
                wt.insert("weight".into(), Toml::Integer(i64::from(w.weight)));
                Toml::Table(wt)
            })
            .collect();
        t.insert("schedule".into(), Toml::Array(windows));
    }
    // Always written out: a VM's budgets may differ from the file's `[limits]`
    // even where they equal the built-in defaults.
    t.insert("limits".into(), Toml::Table(limits_table(&v.limits)));
    let mp = &v.memory_policy;
    if mp.reserved > 0 {
        t.insert("reserved".into(), Toml::Integer(mp.reserved as i64));
    }
    if mp.overflow != crate::Overflow::None {
        t.insert("overflow".into(), mp.overflow.as_str().into());
        t.insert(
            "overflow_limit".into(),
            Toml::Integer(mp.overflow_limit as i64),
        );
    }
    let tu = &v.tuning;
    if let Some(d) = tu.target_wait_p99 {
        t.insert(
            "target_wait_p99".into(),
            format!("{}us", d.as_micros()).into(),
        );
    }
    for (key, val) in [
        ("min_share", tu.min_share),
        ("weight_min", tu.weight_min),
        ("weight_max", tu.weight_max),
    ] {
        if let Some(x) = val {
            t.insert(key.into(), Toml::Integer(i64::from(x)));
        }
    }
    t
}

/// A `[limits]` table.
fn limits_table(l: &VmLimits) -> Table {
    let mut t = Table::new();
    t.insert("sessions".into(), Toml::Integer(i64::from(l.sessions)));
    t.insert(
        "connections".into(),
        Toml::Integer(i64::from(l.connections)),
    );
    t.insert("modules".into(), Toml::Integer(i64::from(l.modules)));
    t.insert("module_bytes".into(), Toml::Integer(l.module_bytes as i64));
    t.insert("streams".into(), Toml::Integer(i64::from(l.streams)));
    t.insert("events".into(), Toml::Integer(i64::from(l.events)));
    t.insert("handles".into(), Toml::Integer(i64::from(l.handles)));
    t.insert("queued_bytes".into(), Toml::Integer(l.queued_bytes as i64));
    t.insert("graph_bytes".into(), Toml::Integer(l.graph_bytes as i64));
    t.insert(
        "interpreter_bytes".into(),
        Toml::Integer(l.interpreter_bytes as i64),
    );
    t
}

/// Renders a configuration as TOML that [`Config::parse`] reads back to the
/// same configuration.
pub fn render(c: &Config) -> String {
    let mut doc = Table::new();
    let mut admin = Table::new();
    if let Some(s) = &c.admin.socket {
        admin.insert("socket".into(), path_value(s));
    }
    if let Some(m) = &c.admin.metrics_listen {
        admin.insert("metrics_listen".into(), m.to_string().into());
    }
    if let Some(a) = &c.admin.audit_log {
        admin.insert("audit_log".into(), path_value(a));
    }
    if !admin.is_empty() {
        doc.insert("admin".into(), Toml::Table(admin));
    }
    doc.insert(
        "device".into(),
        Toml::Array(
            c.devices
                .iter()
                .map(|d| Toml::Table(device_table(d)))
                .collect(),
        ),
    );
    if !c.profiles.is_empty() {
        let profiles = c
            .profiles
            .iter()
            .map(|p| {
                let mut t = Table::new();
                t.insert("name".into(), p.name.clone().into());
                t.insert("memory".into(), p.memory.to_config_string().into());
                t.insert("weight".into(), Toml::Integer(i64::from(p.weight)));
                t.insert("priority".into(), p.priority.as_str().into());
                Toml::Table(t)
            })
            .collect();
        doc.insert("profile".into(), Toml::Array(profiles));
    }
    if c.tuning != crate::TuningConfig::default() {
        let mut tu = Table::new();
        tu.insert("mode".into(), c.tuning.mode.as_str().into());
        tu.insert(
            "tune_interval".into(),
            format!("{}ms", c.tuning.interval.as_millis()).into(),
        );
        doc.insert("tuning".into(), Toml::Table(tu));
    }
    if c.limits != VmLimits::default() {
        doc.insert("limits".into(), Toml::Table(limits_table(&c.limits)));
    }
    if let Some(b) = c.memory.host_overflow_budget {
        let mut m = Table::new();
        m.insert("host_overflow_budget".into(), Toml::Integer(b as i64));
        doc.insert("memory".into(), Toml::Table(m));
    }
    if !c.vms.is_empty() {
        doc.insert(
            "vm".into(),
            Toml::Array(c.vms.iter().map(|v| Toml::Table(vm_table(v))).collect()),
        );
    }
    toml::to_string(&doc).unwrap_or_default()
}

/// Validates a candidate configuration with the config file's rules; the
/// error is the rule's message without a file position.
pub fn validate(candidate: &Config) -> Result<Config, ChangeError> {
    Config::parse(Path::new(REQUEST_SOURCE), &render(candidate))
        .map(|mut c| {
            c.path = candidate.path.clone();
            c
        })
        .map_err(|e| ChangeError::Invalid(e.message))
}

/// Converts a JSON object (an API request body) into a TOML table with the
/// same keys. Nulls are dropped (the key is absent).
pub fn json_to_table(v: &Value) -> Result<Table, ChangeError> {
    match json_to_toml(v)? {
        Some(Toml::Table(t)) => Ok(t),
        _ => Err(ChangeError::BadRequest(
            "the request body must be a JSON object".into(),
        )),
    }
}

fn json_to_toml(v: &Value) -> Result<Option<Toml>, ChangeError> {
    Ok(Some(match v {
        Value::Null => return Ok(None),
        Value::Bool(b) => Toml::Boolean(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Toml::Integer(i),
            (None, Some(f)) if n.is_f64() => Toml::Float(f),
            _ => {
                return Err(ChangeError::BadRequest(format!(
                    "{n} is not a whole number in range"
                )));
            }
        },
        Value::String(s) => Toml::String(s.clone()),
        Value::Array(a) => Toml::Array(
            a.iter()
                .map(json_to_toml)
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .flatten()
                .collect(),
        ),
        Value::Object(m) => {
            let mut t = Table::new();
            for (k, v) in m {
                if let Some(x) = json_to_toml(v)? {
                    t.insert(k.clone(), x);
                }
            }
            Toml::Table(t)
        }
    }))
}

/// `running` with one more `[[vm]]` entry given as a table (an API request
/// body), validated; returns the new configuration and the new VM.
pub fn with_vm_added(running: &Config, entry: Table) -> Result<(Config, VmConfig), ChangeError> {
    let name = entry
        .get("name")
        .and_then(Toml::as_str)
        .ok_or_else(|| ChangeError::BadRequest("the VM needs a \"name\"".into()))?
        .to_string();
    if entry.get("mode").and_then(Toml::as_str) == Some("passthrough") {
        return Err(ChangeError::BadRequest(
            "passthrough VMs own a whole GPU through VFIO: declare them in the config file and prepare them with `vgpuctl passthrough`; the API adds shared VMs".into(),
        ));
    }
    let mut doc = Table::new();
    doc.insert("vm".into(), Toml::Array(vec![Toml::Table(entry)]));
    let extra = toml::to_string(&doc)
        .map_err(|e| ChangeError::BadRequest(format!("cannot read the VM entry: {e}")))?;
    let text = format!("{}\n{extra}", render(running));
    let mut c = Config::parse(Path::new(REQUEST_SOURCE), &text)
        .map_err(|e| ChangeError::Invalid(e.message))?;
    c.path = running.path.clone();
    let vm = c
        .vms
        .iter()
        .rev()
        .find(|v| v.name == name)
        .cloned()
        .ok_or_else(|| ChangeError::Invalid(format!("VM `{name}` was not added")))?;
    Ok((c, vm))
}

/// A difference between two configurations that can be applied live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new shared VM.
    AddVm(VmConfig),
    /// A VM that is gone.
    RemoveVm(String),
    /// A VM whose memory slice, weight, priority or weight schedule changed.
    UpdateVm {
        /// Before.
        old: VmConfig,
        /// After.
        new: VmConfig,
    },
    /// A VM whose device or transports changed: it is removed and added
    /// again (its sessions end).
    ReplaceVm {
        /// Before.
        old: VmConfig,
        /// After.
        new: VmConfig,
    },
    /// A device whose scheduling settings changed.
    Scheduling {
        /// Device name.
        device: String,
        /// Before.
        old: crate::SchedulingConfig,
        /// After.
        new: crate::SchedulingConfig,
    },
    /// A device whose `overcommit` changed. A raise comes first in a diff (VMs added or grown
    /// by the same change may need it), a cut last (after the VMs it must fit shrank or left).
    Overcommit {
        /// Device name.
        device: String,
        /// Before.
        old: crate::memory::Overcommit,
        /// After.
        new: crate::memory::Overcommit,
    },
    /// A change that needs a restart of vgpud (devices added, removed or
    /// rebuilt; `[admin]` settings); the message says what.
    NeedsRestart(String),
}

/// Whether two entries of the same VM differ only in what can change live.
fn live_updatable(a: &VmConfig, b: &VmConfig) -> bool {
    let strip = |v: &VmConfig| VmConfig {
        memory: 0,
        weight: 0,
        priority: Default::default(),
        schedule: Vec::new(),
        profile: None,
        tuning: Default::default(),
        limits: Default::default(),
        memory_policy: Default::default(),
        ..v.clone()
    };
    strip(a) == strip(b)
}

/// What changed from `old` to `new`, in an order that can be applied one
/// by one: raised overcommits, removals (freeing names, CIDs and sockets),
/// replacements, updates, additions, scheduling, then lowered overcommits.
pub fn diff(old: &Config, new: &Config) -> Vec<Change> {
    let mut out = Vec::new();
    let shared = |c: &Config| -> Vec<VmConfig> {
        c.vms
            .iter()
            .filter(|v| v.mode == VmMode::Shared)
            .cloned()
            .collect()
    };
    let (olds, news) = (shared(old), shared(new));
    let find = |list: &[VmConfig], name: &str| list.iter().find(|v| v.name == name).cloned();
    let (mut raised, mut lowered) = (Vec::new(), Vec::new());
    for o in &olds {
        if find(&news, &o.name).is_none() {
            out.push(Change::RemoveVm(o.name.clone()));
        }
    }
    let mut updates = Vec::new();
    for n in &news {
        match find(&olds, &n.name) {
            None => {}
            Some(o) if &o == n => {}
            Some(o) if live_updatable(&o, n) => updates.push(Change::UpdateVm {
                old: o,
                new: n.clone(),
            }),
            Some(o) => out.push(Change::ReplaceVm {
                old: o,
                new: n.clone(),
            }),
        }
    }
    out.extend(updates);
    for n in &news {
        if find(&olds, &n.name).is_none() {
            out.push(Change::AddVm(n.clone()));
        }
    }
    for nd in &new.devices {
        match old.devices.iter().find(|d| d.name == nd.name) {
            None => out.push(Change::NeedsRestart(format!(
                "device `{}` is new: devices are created at start-up; restart vgpud to add it",
                nd.name
            ))),
            Some(od) => {
                let same_but_live = DeviceConfig {
                    scheduling: nd.scheduling,
                    overcommit: nd.overcommit,
                    ..od.clone()
                };
                if &same_but_live != nd {
                    out.push(Change::NeedsRestart(format!(
                        "device `{}` changed its kind, memory, workers or watchdog: restart vgpud to rebuild it",
                        nd.name
                    )));
                }
                if od.overcommit != nd.overcommit {
                    let change = Change::Overcommit {
                        device: nd.name.clone(),
                        old: od.overcommit,
                        new: nd.overcommit,
                    };
                    if nd.overcommit > od.overcommit {
                        raised.push(change);
                    } else {
                        lowered.push(change);
                    }
                }
                if od.scheduling != nd.scheduling {
                    out.push(Change::Scheduling {
                        device: nd.name.clone(),
                        old: od.scheduling,
                        new: nd.scheduling,
                    });
                }
            }
        }
    }
    for od in &old.devices {
        if !new.devices.iter().any(|d| d.name == od.name) {
            out.push(Change::NeedsRestart(format!(
                "device `{}` was removed from the file: restart vgpud to remove it",
                od.name
            )));
        }
    }
    if old.admin != new.admin {
        out.push(Change::NeedsRestart(
            "the [admin] settings changed: restart vgpud to apply them".into(),
        ));
    }
    let passthrough = |c: &Config| -> Vec<VmConfig> {
        c.vms
            .iter()
            .filter(|v| v.mode != VmMode::Shared)
            .cloned()
            .collect()
    };
    if passthrough(old) != passthrough(new) {
        out.push(Change::NeedsRestart(
            "passthrough VMs changed: vgpud only records them; use `vgpuctl passthrough` to prepare their devices".into(),
        ));
    }
    raised.append(&mut out);
    raised.append(&mut lowered);
    raised
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::Policy;
    use serde_json::json;

    use super::*;

    const FULL: &str = r#"
[admin]
socket = "/run/vgpu/admin.sock"
metrics_listen = "127.0.0.1:9400"
audit_log = "/var/log/vgpu/audit.jsonl"

[[device]]
name = "gpu0"
kind = "sim"
memory = "8GiB"
workers = 3
watchdog_ms = 1000
policy = "fixed"
slice_ms = 7
batch_min_share = 11

[[device]]
name = "gpu1"
kind = "cuda"
uuid = "GPU-1234"

[[profile]]
name = "q4"
memory = "1/4"
weight = 2
priority = "realtime"

[[profile]]
name = "small"
memory = "512MiB"

[[vm]]
name = "vm1"
device = "gpu0"
memory = "2GiB"
weight = 3
priority = "batch"
unix_socket = "/run/vgpu/vm1.sock"
vhost_user_socket = "/run/vgpu/vm1.vhost.sock"
guest_cid = 5
socket_owner = "libvirt-qemu:kvm"
[[vm.schedule]]
from = "22:00"
to = "06:00"
weight = 9

[[vm]]
name = "p"
mode = "passthrough"
pci = "0000:3b:00.0"
"#;

    fn parse(s: &str) -> Config {
        Config::parse(Path::new("f.toml"), s).unwrap()
    }

    #[test]
    fn rendering_round_trips_every_field() {
        let c = parse(FULL);
        let back = Config::parse(Path::new("f.toml"), &render(&c)).unwrap();
        assert_eq!(back, c);
        let minimal = parse("[[vm]]\nname = \"a\"\nmemory = 1\n");
        let back = Config::parse(Path::new("f.toml"), &render(&minimal)).unwrap();
        assert_eq!(back, minimal);
    }

    #[test]
    fn adding_a_vm_follows_the_config_rules() {
        let c = parse(FULL);
        let add = |v: Value| with_vm_added(&c, json_to_table(&v).unwrap());
        let (c2, vm) =
            add(json!({"name": "vm2", "device": "gpu0", "memory": "1GiB", "weight": 2})).unwrap();
        assert_eq!((vm.memory, vm.weight), (1 << 30, 2));
        assert_eq!(c2.vms.len(), 3);
        let (_, vm) = add(json!({"name": "k1", "device": "gpu0", "profile": "q4"})).unwrap();
        assert_eq!(
            (
                vm.memory,
                vm.weight,
                vm.priority.as_str(),
                vm.profile.as_deref()
            ),
            (2 << 30, 2, "realtime", Some("q4")),
            "a VM from a profile gets its slice and share"
        );
        for (body, want) in [
            (
                json!({"name": "vm1", "device": "gpu0", "memory": 1}),
                "already defined",
            ),
            (
                json!({"name": "x", "device": "gpu0", "memory": "1GB"}),
                "is not a size",
            ),
            (
                json!({"name": "x", "device": "nope", "memory": 1}),
                "defined devices: gpu0, gpu1",
            ),
            (json!({"name": "x", "memory": 1}), "needs `device"),
            (json!({"name": "x", "device": "gpu0"}), "needs `memory"),
            (
                json!({"name": "x", "device": "gpu0", "memory": 1, "weight": 0}),
                "weight must be",
            ),
            (
                json!({"name": "x", "device": "gpu0", "memory": 1, "colour": "red"}),
                "unknown field `colour`",
            ),
            (
                json!({"name": "x", "device": "gpu0", "memory": 1, "unix_socket": "/run/vgpu/vm1.sock"}),
                "used twice",
            ),
            (
                json!({"name": "x", "device": "gpu0", "memory": 1, "vhost_user_socket": "/x", "guest_cid": 5}),
                "guest_cid 5 is already used by VM `vm1`",
            ),
            (
                json!({"name": "a b", "device": "gpu0", "memory": 1}),
                "invalid",
            ),
            (
                json!({"name": "x", "device": "gpu0", "memory": 1, "priority": "urgent"}),
                "realtime",
            ),
        ] {
            let e = add(body.clone()).unwrap_err().to_string();
            assert!(e.contains(want), "{body}: {e}");
            assert!(
                !e.contains(REQUEST_SOURCE),
                "no synthetic file position: {e}"
            );
        }
        assert!(matches!(
            add(json!({"memory": 1})),
            Err(ChangeError::BadRequest(_))
        ));
        assert!(
            add(json!({"name": "q", "mode": "passthrough", "pci": "0000:3c:00.0"}))
                .unwrap_err()
                .to_string()
                .contains("vgpuctl passthrough")
        );
        assert!(json_to_table(&json!([1])).is_err());
    }

    #[test]
    fn validate_refuses_what_the_file_would_refuse() {
        let mut c = parse(FULL);
        c.devices[0].scheduling.slice = Duration::from_millis(500);
        assert!(
            validate(&c)
                .unwrap_err()
                .to_string()
                .contains("slice_ms must be between 1 and 100")
        );
        let mut c = parse(FULL);
        c.devices[0].scheduling.policy = Policy::Fair;
        assert_eq!(
            validate(&c).unwrap().devices[0].scheduling.policy,
            Policy::Fair
        );
    }

    #[test]
    fn diffs_say_what_to_apply() {
        let old = parse(FULL);
        let edited = FULL
            .replace("weight = 3", "weight = 4")
            .replace("slice_ms = 7", "slice_ms = 9")
            + "\n[[vm]]\nname = \"new\"\ndevice = \"gpu0\"\nmemory = 1\n";
        let d = diff(&old, &parse(&edited));
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(matches!(&d[0], Change::UpdateVm { new, .. } if new.weight == 4));
        assert!(matches!(&d[1], Change::AddVm(v) if v.name == "new"));
        assert!(
            matches!(&d[2], Change::Scheduling { device, new, .. } if device == "gpu0" && new.slice == Duration::from_millis(9))
        );

        let moved = FULL.replace("/run/vgpu/vm1.sock", "/run/vgpu/other.sock");
        assert!(matches!(
            &diff(&old, &parse(&moved))[..],
            [Change::ReplaceVm { .. }]
        ));

        let removed = FULL.replace("name = \"vm1\"", "name = \"vm9\"");
        let d = diff(&old, &parse(&removed));
        assert!(
            matches!(&d[..], [Change::RemoveVm(n), Change::AddVm(v)] if n == "vm1" && v.name == "vm9"),
            "{d:?}"
        );

        let grown = FULL.replace("memory = \"8GiB\"", "memory = \"16GiB\"");
        assert!(
            matches!(&diff(&old, &parse(&grown))[..], [Change::NeedsRestart(m)] if m.contains("gpu0"))
        );
        // Overcommit changes live: a raise before the VMs that need it, a cut after.
        let oc = |c: &str, v: &str| {
            c.replace(
                "name = \"gpu0\"",
                &format!("name = \"gpu0\"\novercommit = {v}"),
            )
        };
        let grows = oc(FULL, "2.0") + "\n[[vm]]\nname = \"new\"\ndevice = \"gpu0\"\nmemory = 1\n";
        let d = diff(&old, &parse(&grows));
        assert!(
            matches!(&d[..], [Change::Overcommit { device, new, .. }, Change::AddVm(_)] if device == "gpu0" && new.as_f64() == 2.0),
            "{d:?}"
        );
        let d = diff(&parse(&grows), &old);
        assert!(
            matches!(&d[..], [Change::RemoveVm(_), Change::Overcommit { new, .. }] if new.as_f64() == 1.0),
            "{d:?}"
        );
        let admin = FULL.replace("9400", "9401");
        assert!(
            matches!(&diff(&old, &parse(&admin))[..], [Change::NeedsRestart(m)] if m.contains("[admin]"))
        );
        assert!(diff(&old, &old).is_empty());
    }
}
