//! The manifests under deploy/: the Kubernetes resources validate against
//! Kubernetes' OpenAPI schemas (kubernetes-validate, strict, for the oldest
//! and newest Kubernetes versions docs/kubernetes.md names); the KubeVirt
//! resources (CRDs, which those schemas lack) are checked for what vgpu
//! relies on, and the sample VMI goes through the hook sidecar.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use vgpu_k8s::plugin::{self, PluginConfig};
use vgpu_k8s::sidecar;

const CORE: [&str; 5] = [
    "namespace.yaml",
    "rbac.yaml",
    "configmap.yaml",
    "daemonset.yaml",
    "pod.yaml",
];
const KUBERNETES_VERSIONS: [&str; 2] = ["1.29.0", "1.33.0"];

fn deploy(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(name)
}

/// The YAML documents of a file, as JSON (PyYAML, which kubernetes-validate needs anyway).
pub(crate) fn documents(name: &str) -> Vec<Value> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))",
        ])
        .arg(deploy(name))
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
}

#[test]
fn the_kubernetes_manifests_validate_against_the_openapi_schemas() {
    let Ok(probe) = Command::new("kubernetes-validate")
        .arg("--version")
        .output()
    else {
        panic!(
            "kubernetes-validate is not installed: run scripts/prereqs.sh (it installs it from PyPI)"
        );
    };
    assert!(probe.status.success());
    for v in KUBERNETES_VERSIONS {
        for f in CORE {
            let out = Command::new("kubernetes-validate")
                .args(["-k", v, "--strict"])
                .arg(deploy(f))
                .output()
                .unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                out.status.success() && !text.contains("WARN"),
                "{f} against {v}:\n{text}"
            );
            assert!(text.contains("passed"), "{f}: {text}");
        }
    }
}

#[test]
fn the_daemonset_runs_the_plugin_with_the_paths_the_kubelet_uses() {
    let ds = &documents("daemonset.yaml")[0];
    let containers = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    let plugin = containers
        .iter()
        .find(|c| c["name"] == "device-plugin")
        .unwrap();
    let cmd: Vec<&str> = plugin["command"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(cmd[0], "vgpu-device-plugin");
    let arg = |k: &str| cmd.iter().position(|a| *a == k).map(|i| cmd[i + 1]);
    assert_eq!(arg("--plugin-dir"), Some(plugin::DEFAULT_PLUGIN_DIR));
    assert_eq!(
        arg("--pod-resources-socket"),
        Some(plugin::DEFAULT_POD_RESOURCES)
    );
    // Every host path the plugin uses is mounted at the same path.
    let mounts: Vec<&str> = plugin["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    for p in [
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
        "/run/vgpu",
    ] {
        assert!(mounts.contains(&p), "{p} is mounted: {mounts:?}");
    }
    let vgpud = containers.iter().find(|c| c["name"] == "vgpud").unwrap();
    assert_eq!(vgpud["command"][2], "/etc/vgpu/vgpud.toml");
    // The admin socket the plugin asks for is the one vgpud's config opens.
    let cm = &documents("configmap.yaml")[0];
    let toml = cm["data"]["vgpud.toml"].as_str().unwrap();
    let config = vgpu_config::Config::parse(std::path::Path::new("vgpud.toml"), toml)
        .expect("the ConfigMap's vgpud.toml is valid");
    assert_eq!(
        config.admin.socket.as_deref().and_then(|p| p.to_str()),
        arg("--admin-socket")
    );
    let names: Vec<&str> = config.profiles.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["q8", "q4", "q2"]);
    // The sample pod asks for a resource the config offers.
    let pod = &documents("pod.yaml")[0];
    let limits = pod["spec"]["containers"][0]["resources"]["limits"]
        .as_object()
        .unwrap();
    let c = PluginConfig::new(std::path::Path::new("/a"), std::path::Path::new("/b"));
    assert!(
        limits
            .keys()
            .all(|k| names.iter().any(|n| c.resource(n) == *k)),
        "{limits:?}"
    );
}

#[test]
fn the_sample_vmis_and_kubevirt_settings_fit_the_sidecar_and_the_plugin() {
    let vmis = documents("vmi.yaml");
    assert_eq!(vmis.len(), 2);
    for v in &vmis {
        assert_eq!(
            (v["apiVersion"].as_str(), v["kind"].as_str()),
            (Some("kubevirt.io/v1"), Some("VirtualMachineInstance"))
        );
    }
    let shared = &vmis[0];
    let hooks: Value = serde_json::from_str(
        shared["metadata"]["annotations"]["hooks.kubevirt.io/hookSidecars"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        hooks[0]["args"],
        serde_json::json!(["--version", "v1alpha2"])
    );
    let xml = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/containerdisk.xml"),
    )
    .unwrap();
    let out = sidecar::on_define_domain(&xml, shared.to_string().as_bytes(), "vgpu.io").unwrap();
    assert!(out.contains("/var/run/vgpu/0/vhost.sock") && out.contains("memfd"));
    // The passthrough VMI is KubeVirt's: the sidecar leaves it alone.
    let pt = &vmis[1];
    assert_eq!(
        sidecar::on_define_domain(&xml, pt.to_string().as_bytes(), "vgpu.io").unwrap(),
        xml
    );
    assert_eq!(
        pt["spec"]["domain"]["devices"]["hostDevices"][0]["deviceName"],
        "vgpu.io/passthrough"
    );
    let kv = &documents("kubevirt.yaml")[0];
    let gates = &kv["spec"]["configuration"]["developerConfiguration"]["featureGates"];
    assert!(gates.as_array().unwrap().iter().any(|g| g == "Sidecar"));
    let dev = &kv["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"][0];
    assert_eq!(dev["resourceName"], "vgpu.io/passthrough");
    assert_eq!(dev["externalResourceProvider"], true);
    assert_eq!(
        plugin::pci_resource_env("vgpu.io/passthrough"),
        "PCI_RESOURCE_VGPU_IO_PASSTHROUGH"
    );
}
