//! `vgpuctl passthrough list`: what a host's GPUs are and who uses them.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;

use serde_json::{Value, json};
use vgpu_host_tools::passthrough::testutils::{A100, A100_UUID, FakeHost, L4, RTX, RTX_AUDIO};

fn host() -> (tempfile::TempDir, FakeHost) {
    let d = tempfile::tempdir().unwrap();
    let h = FakeHost::datacenter(d.path());
    (d, h)
}

fn gpu<'a>(list: &'a Value, pci: &str) -> &'a Value {
    list["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["pci"] == pci)
        .unwrap_or_else(|| panic!("{pci} not listed: {list:#}"))
}

#[test]
fn lists_nvidia_gpus_with_groups_drivers_sriov_and_group_peers() {
    let (_d, h) = host();
    let r = h.run(&["list"]).unwrap();
    let j = &r.json;
    assert_eq!(j["iommu"], true);
    let pcis: Vec<&str> = j["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["pci"].as_str().unwrap())
        .collect();
    // GPUs only: not the audio function, the NIC or the root port.
    assert_eq!(pcis, vec![A100, RTX, L4]);
    let a = gpu(j, A100);
    assert_eq!(a["kind"], "pf");
    assert_eq!(a["driver"], "nvidia");
    assert_eq!(a["iommu_group"], 42);
    assert_eq!(a["sriov"], json!({ "total": 16, "enabled": 0 }));
    assert_eq!(a["model"], "NVIDIA A100-PCIE-40GB");
    assert_eq!(a["usage"], json!({ "state": "free" }));
    assert_eq!(a["group_peers"], json!([]));
    let rtx = gpu(j, RTX);
    assert_eq!(
        rtx["group_peers"],
        json!([{ "pci": RTX_AUDIO, "class": "audio", "driver": "snd_hda_intel" }])
    );
    assert_eq!(rtx["sriov"], Value::Null);
    assert_eq!(gpu(j, L4)["driver"], Value::Null);
    // Nothing answers on the admin socket: the notes say so.
    assert!(
        j["notes"][0]
            .as_str()
            .unwrap()
            .contains("vgpud is not reachable"),
        "{j:#}"
    );
    let line = r.text.lines().find(|l| l.starts_with(RTX)).unwrap();
    assert!(
        line.contains("0000:65:00.1 (audio, bound to snd_hda_intel)"),
        "{line}"
    );
    assert!(
        r.text
            .lines()
            .any(|l| l.starts_with(A100) && l.contains("0/16") && l.contains("free")),
        "{}",
        r.text
    );
}

#[test]
fn virtual_functions_are_listed_under_their_gpu() {
    let (_d, h) = host();
    h.run(&["enable-vfs", A100, "2"]).unwrap();
    let r = h.run(&["list"]).unwrap();
    let pcis: Vec<&str> = r.json["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["pci"].as_str().unwrap())
        .collect();
    assert_eq!(pcis, vec![A100, "0000:3b:00.4", "0000:3b:00.5", RTX, L4]);
    let vf = gpu(&r.json, "0000:3b:00.5");
    assert_eq!(vf["kind"], "vf");
    assert_eq!(vf["physfn"], A100);
    assert_eq!(vf["driver"], Value::Null);
    assert_eq!(vf["usage"]["state"], "free");
    // Each VF has an IOMMU group of its own.
    assert_ne!(
        vf["iommu_group"],
        gpu(&r.json, "0000:3b:00.4")["iommu_group"]
    );
    assert_eq!(gpu(&r.json, A100)["sriov"]["enabled"], 2);
    assert_eq!(
        gpu(&r.json, A100)["virtfns"],
        json!(["0000:3b:00.4", "0000:3b:00.5"])
    );
    assert!(r.text.contains("\n  0000:3b:00.4"), "{}", r.text);
}

#[test]
fn the_config_decides_assigned_and_shared_and_flags_conflicts() {
    let (d, h) = host();
    let cfg = d.path().join("vgpud.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[device]]\nname = \"gpu0\"\nkind = \"cuda\"\nuuid = \"{A100_UUID}\"\n\
             [[device]]\nname = \"gpu1\"\nkind = \"cuda\"\nindex = 1\n\
             [[vm]]\nname = \"train\"\nmode = \"passthrough\"\npci = \"{RTX}\"\n"
        ),
    )
    .unwrap();
    let cfg_s = cfg.to_str().unwrap();
    let r = h.run(&["--config", cfg_s, "list"]).unwrap();
    let a = &gpu(&r.json, A100)["usage"];
    assert_eq!(a["state"], "shared");
    assert!(
        a["by"][0].as_str().unwrap().contains("device `gpu0`"),
        "{a}"
    );
    assert_eq!(
        gpu(&r.json, RTX)["usage"],
        json!({ "state": "assigned", "vm": "train", "bound_to_vfio": false })
    );
    assert_eq!(gpu(&r.json, L4)["usage"]["state"], "free");
    let notes = r.json["notes"].to_string();
    assert!(
        notes.contains("`gpu1` (CUDA index 1) cannot be tied to a PCI address"),
        "{notes}"
    );

    // A shared GPU the config also passes through is a conflict.
    std::fs::write(
        &cfg,
        format!(
            "[[device]]\nname = \"gpu0\"\nkind = \"cuda\"\nuuid = \"{A100_UUID}\"\n\
             [[vm]]\nname = \"train\"\nmode = \"passthrough\"\npci = \"{A100}\"\n"
        ),
    )
    .unwrap();
    let r = h.run(&["--config", cfg_s, "list"]).unwrap();
    assert_eq!(gpu(&r.json, A100)["usage"]["state"], "conflict");
    assert!(r.text.contains("CONFLICT:train"), "{}", r.text);

    // A config that does not load is an error with file:line.
    std::fs::write(
        &cfg,
        "[[vm]]\nname = \"x\"\nmode = \"passthrough\"\npci = \"3b:0\"\n",
    )
    .unwrap();
    let e = h.run(&["--config", cfg_s, "list"]).unwrap_err().to_string();
    assert!(e.contains("vgpud.toml:4"), "{e}");
}

#[test]
fn open_device_nodes_show_vgpud_and_other_users() {
    let (_d, h) = host();
    h.open_by(4242, "vgpud", "/dev/nvidia0");
    h.open_by(777, "python3", "/dev/nvidia1");
    let r = h.run(&["list"]).unwrap();
    let a = &gpu(&r.json, A100)["usage"];
    assert_eq!(a["state"], "shared");
    assert!(a["by"][0].as_str().unwrap().contains("pid 4242"), "{a}");
    assert_eq!(
        gpu(&r.json, RTX)["usage"],
        json!({ "state": "in-use", "by": [{ "pid": 777, "comm": "python3" }] })
    );
}

#[test]
fn bound_devices_show_as_assigned_with_the_driver_they_had() {
    let (_d, h) = host();
    h.run(&["bind", A100]).unwrap();
    let r = h.run(&["list"]).unwrap();
    let a = gpu(&r.json, A100);
    assert_eq!(a["driver"], "vfio-pci");
    assert_eq!(a["driver_override"], "vfio-pci");
    assert_eq!(
        a["usage"],
        json!({ "state": "assigned", "vm": null, "bound_to_vfio": true })
    );
    assert_eq!(a["bound_by_vgpuctl"]["original_driver"], "nvidia");
}

#[test]
fn a_host_without_iommu_is_called_out() {
    let d = tempfile::tempdir().unwrap();
    let h = FakeHost::no_iommu(d.path());
    let r = h.run(&["list"]).unwrap();
    assert_eq!(r.json["iommu"], false);
    assert_eq!(gpu(&r.json, A100)["iommu_group"], Value::Null);
    assert!(r.text.contains("no active IOMMU"), "{}", r.text);
}

/// Serves one `GET /v1/devices` on the admin socket, as vgpud would.
fn fake_vgpud(h: &FakeHost, devices: Value) -> std::thread::JoinHandle<String> {
    let l = UnixListener::bind(h.socket()).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut req = Vec::new();
        let mut buf = [0u8; 1024];
        while !req.ends_with(b"\r\n\r\n") {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            req.extend_from_slice(&buf[..n]);
        }
        let body = devices.to_string();
        write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        String::from_utf8_lossy(&req).into_owned()
    })
}

#[test]
fn the_running_daemon_marks_the_devices_it_shares() {
    let (_d, h) = host();
    // What vgpud answers: `vgpu_api::Device`s, real GPUs named by UUID.
    let device = |name: &str, kind: &str, uuid: &str| vgpu_api::Device {
        name: name.into(),
        kind: kind.into(),
        uuid: uuid.into(),
        ..Default::default()
    };
    let server = fake_vgpud(
        &h,
        serde_json::to_value([
            device("gpu0", "cuda", A100_UUID),
            device("gpu1", "cuda", "GPU-00000000-0000-0000-0000-000000000000"),
            device("sim0", "sim", "sim-0"),
        ])
        .unwrap(),
    );
    let r = h.run(&["list"]).unwrap();
    let req = server.join().unwrap();
    assert!(req.starts_with("GET /v1/devices HTTP/1.1"), "{req}");
    let a100 = &gpu(&r.json, A100)["usage"];
    assert_eq!(a100["state"], "shared", "{a100}");
    assert!(
        a100["by"][0]
            .as_str()
            .unwrap()
            .contains("`gpu0` of the running vgpud"),
        "{a100}"
    );
    let notes = r.json["notes"].to_string();
    assert!(
        notes.contains("`gpu1`") && notes.contains("PCI address is unknown"),
        "{notes}"
    );
    assert!(!notes.contains("sim0"), "{notes}");
}
