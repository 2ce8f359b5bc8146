//! docs/admin-api.yaml against the types: every object schema's properties are exactly the
//! fields its type serializes, and every schema is checked, so the document and the code
//! cannot drift apart. (The document is read with a small reader of its block structure:
//! keys by indentation; flow maps, lists and text are leaves.)

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use vgpu_api::*;

const DOC: &str = include_str!("../../../docs/admin-api.yaml");

/// A block mapping: key → (the text after the colon, the nested mapping).
#[derive(Debug, Default)]
struct Node(BTreeMap<String, (String, Node)>);

fn parse(lines: &[(usize, &str, &str)], i: &mut usize, indent: usize) -> Node {
    let mut node = Node::default();
    while *i < lines.len() {
        let (ind, key, rest) = lines[*i];
        if ind < indent {
            break;
        }
        *i += 1;
        let child = if *i < lines.len() && lines[*i].0 > ind {
            let deeper = lines[*i].0;
            parse(lines, i, deeper)
        } else {
            Node::default()
        };
        if ind == indent {
            node.0.insert(key.to_string(), (rest.to_string(), child));
        }
    }
    node
}

fn document() -> Node {
    let lines: Vec<(usize, &str, &str)> = DOC
        .lines()
        .filter_map(|l| {
            let t = l.trim_start();
            let (key, rest) = t.split_once(':')?;
            let key = key.trim_matches('"');
            let is_key = !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-/{}$.".contains(c));
            is_key.then(|| (l.len() - t.len(), key, rest.trim()))
        })
        .collect();
    parse(&lines, &mut 0, 0)
}

impl Node {
    fn get(&self, key: &str) -> &Node {
        &self
            .0
            .get(key)
            .unwrap_or_else(|| panic!("no `{key}` in {:?}", self.0.keys().collect::<Vec<_>>()))
            .1
    }
}

/// The property names of `schema` (then nested properties or `items` along `path`).
fn properties(doc: &Node, schema: &str, path: &[&str]) -> BTreeSet<String> {
    let mut n = doc.get("components").get("schemas").get(schema);
    for p in path {
        n = if *p == "items" {
            n.get("items")
        } else {
            n.get("properties").get(p)
        };
    }
    n.get("properties").0.keys().cloned().collect()
}

/// The names of the fields `v` serializes.
fn fields<T: Serialize>(v: &T) -> BTreeSet<String> {
    match serde_json::to_value(v).unwrap() {
        serde_json::Value::Object(m) => m.keys().cloned().collect(),
        other => panic!("not an object: {other}"),
    }
}

fn size() -> Option<Size> {
    Some(Size::Text("1GiB".into()))
}

fn limits() -> Limits {
    Limits {
        sessions: Some(1),
        connections: Some(1),
        modules: Some(1),
        module_bytes: size(),
        streams: Some(1),
        events: Some(1),
        handles: Some(1),
        queued_bytes: size(),
        graph_bytes: size(),
        interpreter_bytes: size(),
    }
}

#[test]
fn every_schema_has_the_fields_of_its_type() {
    let doc = document();
    let budget = Budget {
        used: Some(1),
        ..Default::default()
    };
    let entry = VmEntry {
        name: "vm1".into(),
        device: Some("gpu0".into()),
        memory: size(),
        profile: Some("q4".into()),
        socket_owner: Some("qemu".into()),
        weight: Some(1),
        priority: Some("normal".into()),
        unix_socket: Some("/s".into()),
        vhost_user_socket: Some("/v".into()),
        guest_cid: Some(3),
        vsock_uds_path: Some("/u".into()),
        schedule: Some(vec![]),
        limits: Some(limits()),
    };
    let update = VmUpdate {
        memory: size(),
        reserved: size(),
        overflow: Some("host".into()),
        overflow_limit: size(),
        weight: Some(1),
        priority: Some("batch".into()),
        target_wait_p99: Some("5ms".into()),
        min_share: Some(10),
        weight_min: Some(1),
        weight_max: Some(4),
        limits: Some(limits()),
    };
    let scheduling_update = SchedulingUpdate {
        policy: Some("fair".into()),
        slice_ms: Some(2),
        batch_min_share: Some(5),
    };
    let change = ReloadChange {
        error: Some("x".into()),
        ..Default::default()
    };
    let cases: Vec<(&str, &[&str], BTreeSet<String>)> = vec![
        ("Error", &[], fields(&ApiErrorBody::default())),
        ("Info", &[], fields(&Info::default())),
        ("Scheduling", &[], fields(&Scheduling::default())),
        ("Scheduling", &[], fields(&scheduling_update)),
        (
            "DeviceUpdate",
            &[],
            fields(&DeviceUpdate {
                overcommit: Some(1.5),
            }),
        ),
        ("DeviceUsage", &[], fields(&DeviceUsage::default())),
        ("Contention", &[], fields(&ContentionUsage::default())),
        ("Device", &[], fields(&Device::default())),
        (
            "Device",
            &["memory_placement"],
            fields(&DevicePlacement::default()),
        ),
        (
            "Device",
            &["execution_units"],
            fields(&ExecutionUnits::default()),
        ),
        ("MigInstance", &[], fields(&MigInstance::default())),
        ("Gpu", &[], fields(&Gpu::default())),
        ("Inventory", &[], fields(&Inventory::default())),
        ("Window", &[], fields(&Window::default())),
        ("VmEntry", &[], fields(&entry)),
        ("Limits", &[], fields(&limits())),
        ("VmUpdate", &[], fields(&update)),
        ("VmPlacement", &[], fields(&VmPlacement::default())),
        ("VmUsage", &[], fields(&VmUsage::default())),
        ("Session", &[], fields(&Session::default())),
        (
            "PassthroughAssignment",
            &[],
            fields(&PassthroughAssignment::default()),
        ),
        ("Profile", &[], fields(&Profile::default())),
        (
            "Profile",
            &["devices", "items"],
            fields(&ProfileDevice::default()),
        ),
        ("MemoryByKind", &[], fields(&MemoryByKind::default())),
        ("Budget", &[], fields(&budget)),
        ("Vm", &[], fields(&Vm::default())),
        ("Vm", &["limits"], fields(&VmLimits::default())),
        ("Vm", &["stats"], fields(&VmStats::default())),
        ("Vm", &["vsock"], fields(&VmVsock::default())),
        ("VmVgpuDevice", &[], fields(&VmVgpuDevice::default())),
        ("VmTuning", &[], fields(&VmTuning::default())),
        ("WeightChange", &[], fields(&WeightChange::default())),
        ("Removal", &[], fields(&Removal::default())),
        ("ReloadReport", &[], fields(&ReloadReport::default())),
        ("ReloadReport", &["changes", "items"], fields(&change)),
        ("Analysis", &[], fields(&Analysis::default())),
        ("Hotspot", &[], fields(&Hotspot::default())),
        ("Bottleneck", &[], fields(&Bottleneck::default())),
        ("Recommendation", &[], fields(&Recommendation::default())),
        ("TuningReport", &[], fields(&TuningReport::default())),
    ];
    let mut failures = Vec::new();
    for (schema, path, want) in &cases {
        let have = properties(&doc, schema, path);
        if &have != want {
            failures.push(format!(
                "{schema}{}: only in the document {:?}, only in the type {:?}",
                path.iter().map(|p| format!(".{p}")).collect::<String>(),
                have.difference(want).collect::<Vec<_>>(),
                want.difference(&have).collect::<Vec<_>>(),
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "docs/admin-api.yaml and vgpu-api differ:\n{}",
        failures.join("\n")
    );
    // Every schema of the document is one of the above (Size is a scalar: bytes or text).
    let checked: BTreeSet<&str> = cases.iter().map(|c| c.0).chain(["Size"]).collect();
    let all: BTreeSet<&str> = doc
        .get("components")
        .get("schemas")
        .0
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        all, checked,
        "a schema without a type, or a type without a schema"
    );
}

#[test]
fn sizes_are_bytes_or_text_and_empty_updates_send_nothing() {
    assert_eq!(serde_json::to_string(&Size::Bytes(5)).unwrap(), "5");
    assert_eq!(
        serde_json::from_str::<Size>("\"2GiB\"").unwrap(),
        Size::Text("2GiB".into())
    );
    assert_eq!(serde_json::to_string(&VmUpdate::default()).unwrap(), "{}");
    assert_eq!(
        serde_json::to_string(&VmUpdate {
            weight: Some(4),
            ..Default::default()
        })
        .unwrap(),
        r#"{"weight":4}"#
    );
    assert!(SchedulingUpdate::default().is_empty());
}
