//! The device plugin against a test kubelet (tests/support) that speaks the
//! same generated kubelet gRPC API, and a real vgpud (in process) with two
//! simulated GPUs and two profiles.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::Kubelet;
use tokio_stream::StreamExt;
use vgpu_config::Config;
use vgpu_k8s::admin::AdminClient;
use vgpu_k8s::api::deviceplugin as dp;
use vgpu_k8s::plugin::{self, PluginConfig};
use vgpud::Daemon;

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(20);

fn vgpud(dir: &Path) -> Daemon {
    let text = format!(
        "[admin]\nsocket = \"{}\"\n\n\
         [[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\nworkers = 1\n\n\
         [[device]]\nname = \"gpu1\"\nkind = \"sim\"\nmemory = \"1GiB\"\nworkers = 1\n\n\
         [[profile]]\nname = \"q4\"\nmemory = \"1/4\"\nweight = 2\n\n\
         [[profile]]\nname = \"q2\"\nmemory = \"1/2\"\nweight = 4\npriority = \"batch\"\n",
        dir.join("admin.sock").display()
    );
    Daemon::start(&Config::parse(Path::new("vgpud.toml"), &text).unwrap()).unwrap()
}

async fn admin(
    a: &Arc<AdminClient>,
    method: &'static str,
    path: String,
    body: Option<Value>,
) -> Result<Value, String> {
    let a = Arc::clone(a);
    tokio::task::spawn_blocking(move || {
        a.request(method, &path, body.as_ref())
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap()
}

fn health(r: &dp::ListAndWatchResponse) -> BTreeMap<String, String> {
    r.devices
        .iter()
        .map(|d| (d.id.clone(), d.health.clone()))
        .collect()
}

fn healthy(r: &dp::ListAndWatchResponse) -> Vec<String> {
    r.devices
        .iter()
        .filter(|d| d.health == "Healthy")
        .map(|d| d.id.clone())
        .collect()
}

/// Reads device lists until one satisfies `f`.
async fn until(
    s: &mut tonic::Streaming<dp::ListAndWatchResponse>,
    what: &str,
    f: impl Fn(&dp::ListAndWatchResponse) -> bool,
) -> dp::ListAndWatchResponse {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = tokio::time::timeout(left, s.next())
            .await
            .unwrap_or_else(|_| panic!("no device list where {what} within {WAIT:?}"))
            .expect("the stream ended")
            .expect("ListAndWatch failed");
        if f(&r) {
            return r;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_registers_reports_allocates_releases_and_survives_a_kubelet_restart() {
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let pod_resources = dir.path().join("pod-resources.sock");
    let daemon = vgpud(dir.path());
    let api = Arc::new(AdminClient::new(&dir.path().join("admin.sock")));
    let mut kubelet = Kubelet::start(&plugin_dir, &pod_resources);

    let mut config = PluginConfig::new(&dir.path().join("admin.sock"), &plugin_dir);
    config.pod_resources = pod_resources.clone();
    config.socket_root = dir.path().join("vms");
    config.poll = Duration::from_millis(100);
    config.release_grace = Duration::from_millis(500);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let plugin = tokio::spawn(plugin::run(config, async {
        let _ = stopped.await;
    }));

    // Registration: one resource per profile, v1beta1, with its own socket.
    let mut regs = BTreeMap::new();
    for _ in 0..2 {
        let r = kubelet
            .next_registration(WAIT)
            .await
            .expect("the plugin registers");
        assert_eq!(r.version, "v1beta1");
        assert!(r.options.unwrap().get_preferred_allocation_available);
        assert!(
            plugin_dir.join(&r.endpoint).exists(),
            "{} exists",
            r.endpoint
        );
        regs.insert(r.resource_name, r.endpoint);
    }
    assert_eq!(
        regs.keys().collect::<Vec<_>>(),
        ["vgpu.io/q2", "vgpu.io/q4"]
    );

    // ListAndWatch: a quarter-GPU profile has 4 slots on each 1 GiB GPU.
    let mut q4 = kubelet.plugin(&regs["vgpu.io/q4"]).await;
    let mut watch = q4.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
    let first = until(&mut watch, "8 slots", |r| r.devices.len() == 8).await;
    assert_eq!(healthy(&first).len(), 8, "{:?}", health(&first));

    // vgpud's state changes (a 600 MiB VM on gpu0): gpu0 has room for one
    // more quarter only, and the kubelet is told.
    admin(
        &api,
        "POST",
        "/v1/vms".into(),
        Some(json!({"name": "big", "device": "gpu0", "memory": "600MiB"})),
    )
    .await
    .unwrap();
    let r = until(&mut watch, "gpu0 has 1 free quarter", |r| {
        healthy(r).iter().filter(|i| i.starts_with("gpu0_")).count() == 1
    })
    .await;
    assert_eq!(
        healthy(&r)
            .iter()
            .filter(|i| i.starts_with("gpu1_"))
            .count(),
        4
    );

    // GetPreferredAllocation packs onto the least loaded GPU.
    let pref = q4
        .get_preferred_allocation(dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest {
                available_device_i_ds: healthy(&r),
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let chosen = &pref.container_responses[0].device_i_ds;
    assert_eq!(chosen.len(), 2);
    assert!(chosen.iter().all(|i| i.starts_with("gpu1_")), "{chosen:?}");

    // Allocate creates the VM in vgpud with the profile's slice and share,
    // and hands the container its socket directory and environment.
    let id = chosen[0].clone();
    let alloc = q4
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: vec![id.clone()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let c = &alloc.container_responses[0];
    let vm_name = format!("k8s-{id}");
    let vm = admin(&api, "GET", format!("/v1/vms/{vm_name}"), None)
        .await
        .unwrap();
    assert_eq!(vm["device"], "gpu1");
    assert_eq!(vm["memory_limit"], 256 * MIB, "a quarter of the 1 GiB GPU");
    assert_eq!(
        (vm["weight"].as_u64(), vm["priority"].as_str()),
        (Some(2), Some("normal"))
    );
    assert_eq!(vm["config"]["profile"], "q4");
    let m = &c.mounts[0];
    assert_eq!(m.container_path, "/var/run/vgpu/0");
    for sock in ["cuda.sock", "vhost.sock"] {
        assert!(
            Path::new(&m.host_path).join(sock).exists(),
            "{sock} in {}",
            m.host_path
        );
    }
    assert_eq!(c.envs["VGPU_TRANSPORT"], "unix:/var/run/vgpu/0/cuda.sock");
    assert_eq!(c.annotations["vgpu.io/vms"], vm_name);
    // The container's transport reaches the VM: a client on its socket is
    // vgpud's session of that VM (the handshake names the tenant).
    {
        let s = std::os::unix::net::UnixStream::connect(Path::new(&m.host_path).join("cuda.sock"))
            .unwrap();
        let mut client = vgpu_broker::testutils::TestClient::new(s);
        let hello = client.hello().expect("the handshake succeeds");
        assert_eq!(hello.tenant, vm_name);
    }
    // The slot stays healthy (a held slot counts as allocatable), and the
    // other profiles see the memory it took: a half-GPU slot of gpu1 is gone.
    assert!(daemon.broker().tenant(&vm_name).is_some());
    assert_eq!(health(&r)[&id], "Healthy");
    let mut q2 = kubelet.plugin(&regs["vgpu.io/q2"]).await;
    let mut w2 = q2.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
    let r2 = until(&mut w2, "one half of gpu1 is left", |r| {
        healthy(r).iter().filter(|i| i.starts_with("gpu1_")).count() == 1
    })
    .await;
    assert!(
        healthy(&r2).iter().all(|i| !i.starts_with("gpu0_")),
        "{:?}",
        health(&r2)
    );
    drop(w2);

    // While a pod holds the slot its VM stays.
    kubelet
        .pods
        .lock()
        .unwrap()
        .push(("pod-a".into(), "vgpu.io/q4".into(), vec![id.clone()]));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        daemon.broker().tenant(&vm_name).is_some(),
        "a held slot is kept"
    );

    // The pod is gone: the VM is removed from vgpud and its slice is free again.
    kubelet.pods.lock().unwrap().clear();
    let deadline = Instant::now() + WAIT;
    while daemon.broker().tenant(&vm_name).is_some() {
        assert!(
            Instant::now() < deadline,
            "the VM of a pod that is gone is released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gone = admin(&api, "GET", format!("/v1/vms/{vm_name}"), None).await;
    assert!(gone.unwrap_err().contains("404"));
    let devs = admin(&api, "GET", "/v1/devices/gpu1".into(), None)
        .await
        .unwrap();
    assert_eq!(devs["memory_sliced"], 0);

    // The kubelet restarts: its socket is recreated and the plugin sockets
    // removed; the plugin serves and registers again.
    drop(watch);
    let plugin_dir2 = kubelet.plugin_dir.clone();
    kubelet.stop();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut kubelet = Kubelet::start(&plugin_dir2, &pod_resources);
    let mut again = Vec::new();
    for _ in 0..2 {
        let r = kubelet
            .next_registration(WAIT)
            .await
            .expect("the plugin registers again");
        again.push(r.resource_name);
    }
    again.sort();
    assert_eq!(again, ["vgpu.io/q2", "vgpu.io/q4"]);
    let mut q2 = kubelet.plugin(&regs["vgpu.io/q2"]).await;
    let mut w2 = q2.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
    // A half-GPU profile: 2 slots per GPU; gpu0 (600 MiB sliced) has none free.
    let r = until(&mut w2, "q2 slots", |r| r.devices.len() == 4).await;
    assert_eq!(healthy(&r), ["gpu1_q2_0", "gpu1_q2_1"]);

    let _ = stop.send(());
    plugin.await.unwrap().unwrap();
    drop(daemon);
}

/// A PCI address no host has (segment `ffff`), so the device is `missing` in vgpud's
/// `GET /v1/passthrough` whatever the machine.
const ABSENT_PCI: &str = "ffff:ff:1f.7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passthrough_assignment_is_offered_and_refused_until_bound_to_vfio() {
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let pod_resources = dir.path().join("pod-resources.sock");
    let text = format!(
        "[admin]\nsocket = \"{}\"\n\n\
         [[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\nworkers = 1\n\n\
         [[vm]]\nname = \"train\"\nmode = \"passthrough\"\npci = \"{ABSENT_PCI}\"\n",
        dir.path().join("admin.sock").display()
    );
    let daemon = Daemon::start(&Config::parse(Path::new("vgpud.toml"), &text).unwrap()).unwrap();
    let mut kubelet = Kubelet::start(&plugin_dir, &pod_resources);
    let mut config = PluginConfig::new(&dir.path().join("admin.sock"), &plugin_dir);
    config.pod_resources = pod_resources;
    config.socket_root = dir.path().join("vms");
    config.poll = Duration::from_millis(100);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let plugin = tokio::spawn(plugin::run(config, async {
        let _ = stopped.await;
    }));

    // The only resource: vgpud's passthrough device, read from GET /v1/passthrough.
    let r = kubelet
        .next_registration(WAIT)
        .await
        .expect("the plugin registers the passthrough resource");
    assert_eq!(r.resource_name, "vgpu.io/passthrough");
    let mut p = kubelet.plugin(&r.endpoint).await;
    let mut watch = p.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
    let list = until(&mut watch, "the passthrough device", |r| {
        !r.devices.is_empty()
    })
    .await;
    assert_eq!(
        health(&list),
        BTreeMap::from([(ABSENT_PCI.to_string(), "Unhealthy".to_string())]),
        "a device not bound to vfio-pci is not offered as healthy"
    );
    let refused = p
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: vec![ABSENT_PCI.into()],
            }],
        })
        .await
        .expect_err("an unbound device is not handed to a pod");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused}");
    assert!(
        refused.message().contains("vgpuctl passthrough bind"),
        "{refused}"
    );

    let _ = stop.send(());
    plugin.await.unwrap().unwrap();
    drop(daemon);
}

/// The whole passthrough path on a host (a fake sysfs tree that changes as the kernel's does):
/// vgpud reads the assigned A100 there, the plugin offers it as unhealthy while the nvidia
/// driver has it, `vgpuctl passthrough bind` hands it to vfio-pci, and the plugin then offers it
/// as healthy and allocates it with the VFIO group's node and `PCI_RESOURCE_VGPU_IO_PASSTHROUGH`
/// (what KubeVirt's `permittedHostDevices` reads). Unbinding takes it away again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passthrough_gpu_bound_with_vgpuctl_is_allocated_to_a_pod() {
    use vgpu_host_tools::passthrough::testutils::{A100, A100_GROUP, FakeHost};

    let dir = tempfile::tempdir().unwrap();
    let host = Arc::new(FakeHost::datacenter(dir.path()));
    let plugin_dir = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let pod_resources = dir.path().join("pod-resources.sock");
    let text = format!(
        "[admin]\nsocket = \"{}\"\n\n\
         [[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\nworkers = 1\n\n\
         [[vm]]\nname = \"train\"\nmode = \"passthrough\"\npci = \"{A100}\"\n",
        host.socket().display()
    );
    let roots = vgpud::passthrough::HostRoots {
        sysfs: host.sys(),
        procfs: host.proc(),
    };
    let daemon = Daemon::start_with(
        &Config::parse(Path::new("vgpud.toml"), &text).unwrap(),
        roots,
    )
    .unwrap();
    let mut kubelet = Kubelet::start(&plugin_dir, &pod_resources);
    let mut config = PluginConfig::new(&host.socket(), &plugin_dir);
    config.pod_resources = pod_resources;
    config.socket_root = dir.path().join("vms");
    config.poll = Duration::from_millis(100);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let plugin = tokio::spawn(plugin::run(config, async {
        let _ = stopped.await;
    }));

    let r = kubelet
        .next_registration(WAIT)
        .await
        .expect("the plugin registers the passthrough resource");
    assert_eq!(r.resource_name, "vgpu.io/passthrough");
    let mut p = kubelet.plugin(&r.endpoint).await;
    let mut watch = p.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
    let list = until(&mut watch, "the A100", |r| !r.devices.is_empty()).await;
    assert_eq!(
        health(&list),
        BTreeMap::from([(A100.to_string(), "Unhealthy".to_string())]),
        "the nvidia driver still has the GPU"
    );
    let request = || dp::AllocateRequest {
        container_requests: vec![dp::ContainerAllocateRequest {
            devices_ids: vec![A100.into()],
        }],
    };
    let refused = p.allocate(request()).await.expect_err("not bound yet");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused}");

    // The operator binds it, as docs/kubernetes.md says; vgpud sees the new driver.
    vgpuctl_passthrough(&host, "bind").await;
    until(&mut watch, "the bound A100 offered as healthy", |r| {
        health(r).get(A100).map(String::as_str) == Some("Healthy")
    })
    .await;
    let granted = p
        .allocate(request())
        .await
        .expect("a bound GPU is allocated")
        .into_inner();
    let c = &granted.container_responses[0];
    assert_eq!(
        c.envs.get(&plugin::pci_resource_env("vgpu.io/passthrough")),
        Some(&A100.to_string()),
        "KubeVirt finds the address in PCI_RESOURCE_<resource>"
    );
    let nodes: Vec<&str> = c.devices.iter().map(|d| d.host_path.as_str()).collect();
    let group_node = format!("/dev/vfio/{A100_GROUP}");
    assert_eq!(nodes, ["/dev/vfio/vfio", group_node.as_str()]);

    // Handed back to the host driver, it is no longer offered.
    vgpuctl_passthrough(&host, "unbind").await;
    until(&mut watch, "the unbound A100 offered as unhealthy", |r| {
        health(r).get(A100).map(String::as_str) == Some("Unhealthy")
    })
    .await;

    let _ = stop.send(());
    plugin.await.unwrap().unwrap();
    drop(daemon);
}

/// `vgpuctl passthrough COMMAND <the A100>` on the fake host (off the async runtime: it talks to
/// vgpud's admin API with blocking calls).
async fn vgpuctl_passthrough(
    host: &Arc<vgpu_host_tools::passthrough::testutils::FakeHost>,
    command: &'static str,
) {
    let host = Arc::clone(host);
    tokio::task::spawn_blocking(move || {
        host.run(&[command, vgpu_host_tools::passthrough::testutils::A100])
            .unwrap_or_else(|e| panic!("vgpuctl passthrough {command}: {e}"))
    })
    .await
    .unwrap();
}
