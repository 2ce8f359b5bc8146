//! The kubelet device plugin: one resource per vGPU profile
//! (`vgpu.io/<profile>`), each served on its own socket in the kubelet's
//! plugin directory and registered with the kubelet.
//!
//! - Devices are the profile's slots on every GPU ([`crate::slots`]);
//!   `ListAndWatch` sends a new list whenever vgpud's state changes.
//! - `Allocate` creates the slot's VM in vgpud (`POST /v1/vms` with the
//!   profile, a unix socket and a vhost-user socket in a directory of its
//!   own) and hands the container that directory, its environment and
//!   annotations.
//! - When the kubelet restarts it recreates `kubelet.sock` and removes the
//!   plugins' sockets: the plugin serves and registers again.
//! - VMs of slots no pod holds any more (the kubelet's pod-resources API)
//!   are removed from vgpud after a grace period.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{oneshot, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::{UnixListenerStream, WatchStream};
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Request, Response, Status};
use tracing::{info, warn};
use vgpu_api::VmEntry;

use crate::admin::{AdminClient, AdminError};
use crate::api::deviceplugin as dp;
use crate::api::podresources as pr;
use crate::slots::{Inventory, PASSTHROUGH, SlotId};

/// The device-plugin API version the plugin speaks.
pub const API_VERSION: &str = "v1beta1";
/// The kubelet's plugin directory.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The kubelet's pod-resources socket.
pub const DEFAULT_POD_RESOURCES: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// Where the VMs' socket directories are created on the host.
pub const DEFAULT_SOCKET_ROOT: &str = "/run/vgpu/k8s";
/// Where a container sees its vgpus: `<dir>/<n>/` for the n-th.
pub const CONTAINER_DIR: &str = "/var/run/vgpu";
/// The resource domain.
pub const DEFAULT_DOMAIN: &str = "vgpu.io";

/// Settings of the plugin.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// vgpud's admin socket.
    pub admin_socket: PathBuf,
    /// The kubelet's plugin directory (holds `kubelet.sock`).
    pub plugin_dir: PathBuf,
    /// The kubelet's pod-resources socket (no release of stale slots if absent).
    pub pod_resources: PathBuf,
    /// Host directory under which each VM gets `<vm>/` with its sockets.
    pub socket_root: PathBuf,
    /// Resource domain (`vgpu.io`).
    pub domain: String,
    /// How often vgpud and the kubelet are polled.
    pub poll: Duration,
    /// How long an allocated slot may be held by no pod before its VM is removed.
    pub release_grace: Duration,
    /// Lowest guest CID given to the VMs' vsock devices.
    pub cid_base: u64,
    /// `user[:group]` that gets the VMs' sockets (KubeVirt's QEMU runs as 107).
    pub socket_owner: Option<String>,
}

impl PluginConfig {
    /// Defaults with the given admin socket and plugin directory.
    pub fn new(admin_socket: &Path, plugin_dir: &Path) -> Self {
        Self {
            admin_socket: admin_socket.to_path_buf(),
            plugin_dir: plugin_dir.to_path_buf(),
            pod_resources: PathBuf::from(DEFAULT_POD_RESOURCES),
            socket_root: PathBuf::from(DEFAULT_SOCKET_ROOT),
            domain: DEFAULT_DOMAIN.into(),
            poll: Duration::from_secs(2),
            release_grace: Duration::from_secs(60),
            cid_base: 1000,
            socket_owner: None,
        }
    }

    /// The resource name of a profile.
    pub fn resource(&self, profile: &str) -> String {
        format!("{}/{profile}", self.domain)
    }

    /// The socket file name of a profile's plugin (relative to the plugin dir).
    pub fn endpoint(&self, profile: &str) -> String {
        format!("vgpu-{profile}.sock")
    }
}

/// State shared by the servers and the poller.
struct Shared {
    config: PluginConfig,
    admin: AdminClient,
    inventory: watch::Sender<Arc<Inventory>>,
    /// When each VM of ours was allocated or first seen (for the grace period).
    seen: Mutex<BTreeMap<SlotId, Instant>>,
    /// Serialises allocations (free slots are checked, then taken).
    allocating: tokio::sync::Mutex<()>,
}

impl Shared {
    async fn admin<T: Send + 'static>(
        &self,
        f: impl FnOnce(&AdminClient) -> Result<T, AdminError> + Send + 'static,
    ) -> Result<T, AdminError> {
        let a = self.admin.clone();
        tokio::task::spawn_blocking(move || f(&a))
            .await
            .unwrap_or_else(|e| Err(AdminError::Reply(format!("admin request panicked: {e}"))))
    }

    /// Reads vgpud's state; on failure, the last one with every slot unhealthy.
    async fn refresh(&self) -> Arc<Inventory> {
        let r = self
            .admin(|a| {
                Ok(Inventory::from_api(&a.profiles()?, &a.vms()?)
                    .with_passthrough(&a.passthrough()?))
            })
            .await;
        let inv = match r {
            Ok(i) => i,
            Err(e) => {
                if self.inventory.borrow().reachable {
                    warn!(error = %e, "vgpud is unreachable: every slot is unhealthy until it answers");
                }
                self.inventory.borrow().unreachable()
            }
        };
        let inv = Arc::new(inv);
        self.inventory.send_if_modified(|cur| {
            if **cur == *inv {
                false
            } else {
                *cur = Arc::clone(&inv);
                true
            }
        });
        inv
    }

    /// Creates the VM of a slot (or finds it); returns its socket directory.
    async fn create_vm(&self, slot: &SlotId) -> Result<PathBuf, Status> {
        let inv = self.refresh().await;
        let vm = slot.vm_name();
        let dir = self.config.socket_root.join(&vm);
        if inv.allocated.contains(slot) {
            return Ok(dir);
        }
        let gpu = inv
            .profile(&slot.profile)
            .and_then(|p| p.gpus.iter().find(|g| g.device == slot.device))
            .ok_or_else(|| {
                Status::not_found(format!(
                    "vgpud has no device `{}` with profile `{}`",
                    slot.device, slot.profile
                ))
            })?;
        if gpu.free == 0 {
            return Err(Status::resource_exhausted(format!(
                "device `{}` has no memory left for a `{}` slice; the kubelet will see it in the next device list",
                slot.device, slot.profile
            )));
        }
        let cid = (self.config.cid_base..)
            .find(|c| !inv.cids.contains(c))
            .unwrap_or(self.config.cid_base);
        std::fs::create_dir_all(&dir)
            .map_err(|e| Status::internal(format!("cannot create {}: {e}", dir.display())))?;
        let utf8 = |p: PathBuf| {
            p.into_os_string().into_string().map_err(|p| {
                Status::invalid_argument(format!(
                    "the socket path {} is not UTF-8; choose a --socket-root that is",
                    Path::new(&p).display()
                ))
            })
        };
        let entry = VmEntry {
            name: vm.clone(),
            device: Some(slot.device.clone()),
            profile: Some(slot.profile.clone()),
            unix_socket: Some(utf8(dir.join("cuda.sock"))?),
            vhost_user_socket: Some(utf8(dir.join("vhost.sock"))?),
            vsock_uds_path: Some(utf8(dir.join("vsock"))?),
            guest_cid: Some(cid),
            socket_owner: self.config.socket_owner.clone(),
            ..VmEntry::default()
        };
        if self.config.socket_owner.is_some() {
            // The directory must let the owner reach its sockets.
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755));
        }
        self.admin(move |a| a.create_vm(&entry))
            .await
            .map_err(|e| {
                let _ = std::fs::remove_dir(&dir);
                Status::unavailable(format!("vgpud refused VM `{vm}`: {e}"))
            })?;
        info!(vm = %vm, cid, "allocated");
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(slot.clone(), Instant::now());
        self.refresh().await;
        Ok(dir)
    }

    /// Removes the VMs of slots no pod holds (after the grace period).
    async fn release_stale(&self, held: &BTreeSet<String>) {
        let inv = self.inventory.borrow().clone();
        if !inv.reachable {
            return;
        }
        let now = Instant::now();
        let mut stale = Vec::new();
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            seen.retain(|s, _| inv.allocated.contains(s));
            for s in &inv.allocated {
                let since = *seen.entry(s.clone()).or_insert(now);
                if !held.contains(&s.id()) && now.duration_since(since) >= self.config.release_grace
                {
                    stale.push(s.clone());
                }
            }
        }
        for s in stale {
            let vm = s.vm_name();
            let name = vm.clone();
            match self.admin(move |a| a.remove_vm(&name)).await {
                Ok(r) => {
                    info!(vm = %vm, memory_released = r.memory_released, "released: no pod holds the slot any more");
                    let _ = std::fs::remove_dir_all(self.config.socket_root.join(&vm));
                }
                Err(e) => warn!(vm = %vm, error = %e, "cannot release"),
            }
        }
        self.refresh().await;
    }
}

/// The device IDs of our resources that pods hold, from the kubelet's
/// pod-resources API; None if it cannot be asked.
async fn held_devices(config: &PluginConfig) -> Option<BTreeSet<String>> {
    let ch = unix_channel(&config.pod_resources).await.ok()?;
    let mut c = pr::pod_resources_lister_client::PodResourcesListerClient::new(ch);
    let r = c
        .list(pr::ListPodResourcesRequest {})
        .await
        .map_err(|e| warn!(error = %e, "the kubelet's pod-resources API failed"))
        .ok()?;
    let prefix = format!("{}/", config.domain);
    Some(
        r.into_inner()
            .pod_resources
            .into_iter()
            .flat_map(|p| p.containers)
            .flat_map(|c| c.devices)
            .filter(|d| d.resource_name.starts_with(&prefix))
            .flat_map(|d| d.device_ids)
            .collect(),
    )
}

/// A gRPC channel over a unix socket.
pub async fn unix_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::try_from("http://[::]:0")?
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(UnixStream::connect(p).await?))
            }
        }))
        .await
}

/// The `DevicePlugin` service of one profile.
struct ProfilePlugin {
    profile: String,
    shared: Arc<Shared>,
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for ProfilePlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let profile = self.profile.clone();
        let rx = self.shared.inventory.subscribe();
        let mut last: Option<Vec<dp::Device>> = None;
        let stream = tokio_stream::StreamExt::filter_map(WatchStream::new(rx), move |inv| {
            let devices: Vec<dp::Device> = inv
                .devices(&profile)
                .into_iter()
                .map(|(id, health)| dp::Device {
                    id,
                    health: health.into(),
                    topology: None,
                })
                .collect();
            if last.as_ref() == Some(&devices) {
                return None;
            }
            last = Some(devices.clone());
            Some(Ok(dp::ListAndWatchResponse { devices }))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        let inv = self.shared.refresh().await;
        let container_responses = req
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| dp::ContainerPreferredAllocationResponse {
                device_i_ds: inv.preferred(
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(dp::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let _g = self.shared.allocating.lock().await;
        if self.profile == PASSTHROUGH
            && self
                .shared
                .inventory
                .borrow()
                .profile(PASSTHROUGH)
                .is_none()
        {
            return self.allocate_passthrough(req.into_inner()).await;
        }
        let mut container_responses = Vec::new();
        for c in req.into_inner().container_requests {
            let mut resp = dp::ContainerAllocateResponse::default();
            let mut vms = Vec::new();
            for (n, id) in c.devices_ids.iter().enumerate() {
                let slot = SlotId::parse(id)
                    .filter(|s| s.profile == self.profile)
                    .ok_or_else(|| {
                        Status::invalid_argument(format!(
                            "`{id}` is not a slot of profile `{}`",
                            self.profile
                        ))
                    })?;
                let dir = self.shared.create_vm(&slot).await?;
                let inside = format!("{CONTAINER_DIR}/{n}");
                resp.mounts.push(dp::Mount {
                    container_path: inside.clone(),
                    host_path: dir.to_string_lossy().into_owned(),
                    read_only: false,
                });
                if n == 0 {
                    resp.envs
                        .insert("VGPU_TRANSPORT".into(), format!("unix:{inside}/cuda.sock"));
                }
                vms.push(slot.vm_name());
            }
            resp.envs.insert("VGPU_VMS".into(), vms.join(","));
            resp.envs
                .insert("VGPU_PROFILE".into(), self.profile.clone());
            resp.envs
                .insert("VGPU_DEVICE_DIR".into(), CONTAINER_DIR.into());
            resp.annotations
                .insert(format!("{}/vms", self.shared.config.domain), vms.join(","));
            resp.annotations.insert(
                format!("{}/profile", self.shared.config.domain),
                self.profile.clone(),
            );
            container_responses.push(resp);
        }
        Ok(Response::new(dp::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

/// The environment variable KubeVirt reads the PCI addresses of an
/// external resource provider's devices from: `PCI_RESOURCE_<resource>`,
/// upper case, `.` and `/` as `_`.
pub fn pci_resource_env(resource: &str) -> String {
    format!(
        "PCI_RESOURCE_{}",
        resource.to_ascii_uppercase().replace(['.', '/', '-'], "_")
    )
}

impl ProfilePlugin {
    /// Passthrough: the devices are VFIO devices vgpuctl prepared; the
    /// container (virt-launcher) gets their VFIO group nodes and, for
    /// KubeVirt, `PCI_RESOURCE_<NAME>` with their addresses.
    async fn allocate_passthrough(
        &self,
        req: dp::AllocateRequest,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let inv = self.shared.refresh().await;
        let resource = self.shared.config.resource(PASSTHROUGH);
        let mut container_responses = Vec::new();
        for c in req.container_requests {
            let mut resp = dp::ContainerAllocateResponse::default();
            resp.devices.push(dp::DeviceSpec {
                container_path: "/dev/vfio/vfio".into(),
                host_path: "/dev/vfio/vfio".into(),
                permissions: "rw".into(),
            });
            for id in &c.devices_ids {
                let Some((_, ready, group)) = inv.passthrough.iter().find(|(p, ..)| p == id) else {
                    return Err(Status::not_found(format!(
                        "{id} is not assigned for passthrough in vgpud"
                    )));
                };
                let Some(group) = group.filter(|_| *ready) else {
                    return Err(Status::failed_precondition(format!(
                        "{id} is not bound to vfio-pci: run `vgpuctl passthrough bind {id}`"
                    )));
                };
                let node = format!("/dev/vfio/{group}");
                resp.devices.push(dp::DeviceSpec {
                    container_path: node.clone(),
                    host_path: node,
                    permissions: "rw".into(),
                });
            }
            resp.envs
                .insert(pci_resource_env(&resource), c.devices_ids.join(","));
            container_responses.push(resp);
        }
        Ok(Response::new(dp::AllocateResponse {
            container_responses,
        }))
    }
}

fn options() -> dp::DevicePluginOptions {
    dp::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// Identity of a socket file (device, inode): a recreated socket differs.
fn file_id(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// A profile's running server.
struct Served {
    stop: oneshot::Sender<()>,
    socket: PathBuf,
    socket_id: Option<(u64, u64)>,
    task: tokio::task::JoinHandle<()>,
}

async fn serve_profile(shared: &Arc<Shared>, profile: &str) -> std::io::Result<Served> {
    let socket = shared
        .config
        .plugin_dir
        .join(shared.config.endpoint(profile));
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)?;
    let socket_id = file_id(&socket);
    let (stop, stopped) = oneshot::channel::<()>();
    let svc = dp::device_plugin_server::DevicePluginServer::new(ProfilePlugin {
        profile: profile.to_string(),
        shared: Arc::clone(shared),
    });
    let task = tokio::spawn(async move {
        let r = Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await;
        if let Err(e) = r {
            warn!(error = %e, "device plugin server ended");
        }
    });
    Ok(Served {
        stop,
        socket,
        socket_id,
        task,
    })
}

async fn register(config: &PluginConfig, profile: &str) -> Result<(), String> {
    let kubelet = config.plugin_dir.join("kubelet.sock");
    let ch = unix_channel(&kubelet)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", kubelet.display()))?;
    let mut c = dp::registration_client::RegistrationClient::new(ch);
    c.register(dp::RegisterRequest {
        version: API_VERSION.into(),
        endpoint: config.endpoint(profile),
        resource_name: config.resource(profile),
        options: Some(options()),
    })
    .await
    .map_err(|e| {
        format!(
            "the kubelet refused {}: {}",
            config.resource(profile),
            e.message()
        )
    })?;
    Ok(())
}

async fn stop_all(served: &mut BTreeMap<String, Served>) {
    for (_, s) in std::mem::take(served) {
        let _ = s.stop.send(());
        s.task.abort();
        let _ = s.task.await;
        let _ = std::fs::remove_file(&s.socket);
    }
}

/// Runs the plugin until `shutdown` resolves.
pub async fn run(
    config: PluginConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    std::fs::create_dir_all(&config.socket_root)
        .map_err(|e| format!("cannot create {}: {e}", config.socket_root.display()))?;
    let (tx, _) = watch::channel(Arc::new(Inventory::default()));
    let shared = Arc::new(Shared {
        admin: AdminClient::new(&config.admin_socket),
        config,
        inventory: tx,
        seen: Mutex::new(BTreeMap::new()),
        allocating: tokio::sync::Mutex::new(()),
    });
    let kubelet_sock = shared.config.plugin_dir.join("kubelet.sock");
    let mut served: BTreeMap<String, Served> = BTreeMap::new();
    let mut kubelet_id = None;
    let mut stale_warned: BTreeSet<String> = BTreeSet::new();
    tokio::pin!(shutdown);
    loop {
        let inv = shared.refresh().await;
        let profiles: BTreeSet<String> = inv.resources();
        for p in &inv.profiles {
            for g in &p.gpus {
                let id = SlotId {
                    device: g.device.clone(),
                    profile: p.name.clone(),
                    index: g.slots,
                };
                if stale_warned.insert(id.id()) && id.id().len() > crate::slots::MAX_ID_LEN {
                    warn!(device = %g.device, profile = %p.name, "device and profile names are too long for kubelet device IDs (60 characters with the slot number): this GPU is not offered for this profile");
                }
            }
        }
        let now_id = file_id(&kubelet_sock);
        // Serve and register again when the kubelet restarted (its socket is
        // new), one of our sockets vanished, or the profiles changed.
        let stale = now_id != kubelet_id
            || served.values().any(|s| file_id(&s.socket) != s.socket_id)
            || (inv.reachable && served.keys().cloned().collect::<BTreeSet<_>>() != profiles);
        if stale && now_id.is_some() && inv.reachable {
            stop_all(&mut served).await;
            let mut ok = true;
            for p in &profiles {
                match serve_profile(&shared, p).await {
                    Ok(s) => {
                        served.insert(p.clone(), s);
                    }
                    Err(e) => {
                        warn!(profile = %p, error = %e, "cannot serve");
                        ok = false;
                    }
                }
            }
            for p in &profiles {
                match register(&shared.config, p).await {
                    Ok(()) => {
                        info!(resource = %shared.config.resource(p), "registered with the kubelet")
                    }
                    Err(e) => {
                        warn!(error = %e, "registration failed; retrying");
                        ok = false;
                    }
                }
            }
            if ok {
                kubelet_id = now_id;
            }
        } else if now_id.is_none() && kubelet_id.is_some() {
            info!("the kubelet's socket is gone; waiting for it to come back");
            stop_all(&mut served).await;
            kubelet_id = None;
        }
        if let Some(held) = held_devices(&shared.config).await {
            shared.release_stale(&held).await;
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(shared.config.poll) => {}
        }
    }
    stop_all(&mut served).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubevirt_reads_the_addresses_from_pci_resource_variables() {
        assert_eq!(
            pci_resource_env("vgpu.io/passthrough"),
            "PCI_RESOURCE_VGPU_IO_PASSTHROUGH"
        );
    }
}
