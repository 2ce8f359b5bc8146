//! The KubeVirt hook sidecar: virt-launcher calls `OnDefineDomain` with the
//! VMI and the domain XML it generated; for a VMI that requests vgpu
//! resources (`vgpu.io/<profile>` in `spec.domain.resources`), the sidecar
//! adds one vgpu device per requested slot and shared guest memory
//! ([`vgpu_libvirt::attach`]).
//!
//! The device plugin mounts the n-th slot's socket directory at
//! `/var/run/vgpu/<n>/` in virt-launcher's compute container, where QEMU
//! runs, so the sidecar knows the paths without asking anyone.

use std::path::Path;

use serde_json::Value;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use vgpu_libvirt::{Attachment, Model, XmlError};

use crate::api::hooks_info as info;
use crate::api::hooks_v1alpha2 as v1alpha2;
use crate::plugin::CONTAINER_DIR;

/// Where virt-launcher looks for hook sockets.
pub const HOOKS_DIR: &str = "/var/run/kubevirt-hooks";
/// The sidecar's name (and socket file name).
pub const NAME: &str = "vgpu";
/// VMI annotation choosing the device: `vsock` (default) or `vgpu`.
pub const MODEL_ANNOTATION: &str = "vgpu.io/device-model";
/// VMI annotation with the virtio-vgpu device ID (default 21, what QEMU presents).
pub const DEVICE_ID_ANNOTATION: &str = "vgpu.io/device-id";

/// How many vgpu slots a VMI requests, by resource (`vgpu.io/q4` → 1);
/// `vgpu.io/passthrough` is KubeVirt's business (host devices).
pub fn requested(vmi: &Value, domain: &str) -> Vec<(String, u64)> {
    let prefix = format!("{domain}/");
    let mut out: Vec<(String, u64)> = Vec::new();
    for part in ["limits", "requests"] {
        let Some(m) = vmi["spec"]["domain"]["resources"][part].as_object() else {
            continue;
        };
        for (k, v) in m {
            if !k.starts_with(&prefix) || k.ends_with("/passthrough") {
                continue;
            }
            let n = v
                .as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .unwrap_or(0);
            match out.iter_mut().find(|(r, _)| r == k) {
                Some((_, c)) => *c = (*c).max(n),
                None => out.push((k.clone(), n)),
            }
        }
    }
    out.retain(|(_, n)| *n > 0);
    out
}

/// Why a VMI's domain cannot get its vgpus.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    /// The VMI is not JSON.
    #[error("the VMI is not JSON: {0}")]
    Vmi(String),
    /// The annotations are wrong.
    #[error("{0}")]
    Annotation(String),
    /// The domain XML cannot be changed.
    #[error(transparent)]
    Xml(#[from] XmlError),
}

/// The domain XML with the VMI's vgpus added (unchanged if it requests none).
pub fn on_define_domain(
    domain_xml: &str,
    vmi_json: &[u8],
    domain: &str,
) -> Result<String, SidecarError> {
    let vmi: Value =
        serde_json::from_slice(vmi_json).map_err(|e| SidecarError::Vmi(e.to_string()))?;
    let count: u64 = requested(&vmi, domain).iter().map(|(_, n)| n).sum();
    let ann = &vmi["metadata"]["annotations"];
    let model = match ann[MODEL_ANNOTATION].as_str() {
        None | Some("vsock") => Model::Vsock,
        Some("vgpu") => {
            let id = match ann[DEVICE_ID_ANNOTATION].as_str() {
                None => 21,
                Some(s) => s.parse().map_err(|_| {
                    SidecarError::Annotation(format!(
                        "{DEVICE_ID_ANNOTATION} `{s}` is not a number"
                    ))
                })?,
            };
            Model::Vgpu { device_id: id }
        }
        Some(other) => {
            return Err(SidecarError::Annotation(format!(
                "{MODEL_ANNOTATION} `{other}`: use \"vsock\" (stock guests) or \"vgpu\""
            )));
        }
    };
    let mut xml = domain_xml.to_string();
    for n in 0..count {
        let a = Attachment {
            vm: format!("slot{n}"),
            socket: Path::new(CONTAINER_DIR)
                .join(n.to_string())
                .join("vhost.sock")
                .to_string_lossy()
                .into_owned(),
            model,
        };
        xml = vgpu_libvirt::attach(&xml, &a)?;
    }
    Ok(xml)
}

/// The hook services.
#[derive(Debug, Clone)]
pub struct Hooks {
    /// Resource domain (`vgpu.io`).
    pub domain: String,
}

#[tonic::async_trait]
impl info::info_server::Info for Hooks {
    async fn info(
        &self,
        _: Request<info::InfoParams>,
    ) -> Result<Response<info::InfoResult>, Status> {
        Ok(Response::new(info::InfoResult {
            name: NAME.into(),
            versions: vec!["v1alpha2".into()],
            hook_points: vec![info::HookPoint {
                name: "OnDefineDomain".into(),
                priority: 0,
            }],
        }))
    }
}

#[tonic::async_trait]
impl v1alpha2::callbacks_server::Callbacks for Hooks {
    async fn on_define_domain(
        &self,
        req: Request<v1alpha2::OnDefineDomainParams>,
    ) -> Result<Response<v1alpha2::OnDefineDomainResult>, Status> {
        let r = req.into_inner();
        let xml = String::from_utf8(r.domain_xml)
            .map_err(|_| Status::invalid_argument("the domain XML is not UTF-8"))?;
        let out = on_define_domain(&xml, &r.vmi, &self.domain).map_err(|e| {
            tracing::error!(error = %e, "cannot add vgpu to the domain");
            Status::failed_precondition(e.to_string())
        })?;
        Ok(Response::new(v1alpha2::OnDefineDomainResult {
            domain_xml: out.into_bytes(),
        }))
    }
}

/// Serves the hooks on `socket` until `shutdown` resolves.
pub async fn serve(
    socket: &Path,
    hooks: Hooks,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let _ = std::fs::remove_file(socket);
    let l = UnixListener::bind(socket)
        .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
    Server::builder()
        .add_service(info::info_server::InfoServer::new(hooks.clone()))
        .add_service(v1alpha2::callbacks_server::CallbacksServer::new(hooks))
        .serve_with_incoming_shutdown(UnixListenerStream::new(l), shutdown)
        .await
        .map_err(|e| e.to_string())
}
