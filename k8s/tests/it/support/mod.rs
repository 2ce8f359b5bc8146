//! A test kubelet: the kubelet's side of the device-plugin API (its
//! `Registration` service on `<plugin dir>/kubelet.sock`, a client of the
//! plugins' `DevicePlugin` services) and its pod-resources API, over the
//! same generated gRPC code a real kubelet's protobufs describe.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use vgpu_k8s::api::deviceplugin as dp;
use vgpu_k8s::api::podresources as pr;
use vgpu_k8s::plugin::unix_channel;

struct Registration {
    tx: mpsc::UnboundedSender<dp::RegisterRequest>,
}

#[tonic::async_trait]
impl dp::registration_server::Registration for Registration {
    async fn register(
        &self,
        r: Request<dp::RegisterRequest>,
    ) -> Result<Response<dp::Empty>, Status> {
        let r = r.into_inner();
        if r.version != "v1beta1" {
            return Err(Status::invalid_argument(format!(
                "unsupported version {}",
                r.version
            )));
        }
        let _ = self.tx.send(r);
        Ok(Response::new(dp::Empty {}))
    }
}

/// Pods and the devices their containers hold: `(pod, resource, device IDs)`.
pub type Pods = Arc<Mutex<Vec<(String, String, Vec<String>)>>>;

struct PodResources {
    pods: Pods,
}

#[tonic::async_trait]
impl pr::pod_resources_lister_server::PodResourcesLister for PodResources {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        let pods = self.pods.lock().unwrap().clone();
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources: pods
                .into_iter()
                .map(|(name, resource, ids)| pr::PodResources {
                    name,
                    namespace: "default".into(),
                    containers: vec![pr::ContainerResources {
                        name: "main".into(),
                        devices: vec![pr::ContainerDevices {
                            resource_name: resource,
                            device_ids: ids,
                        }],
                    }],
                })
                .collect(),
        }))
    }
}

/// A running test kubelet.
pub struct Kubelet {
    pub plugin_dir: PathBuf,
    pub registrations: mpsc::UnboundedReceiver<dp::RegisterRequest>,
    pub pods: Pods,
    stop: Vec<oneshot::Sender<()>>,
}

fn serve<S>(svc: S, path: &Path) -> oneshot::Sender<()>
where
    S: tonic::server::NamedService
        + tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(UnixListenerStream::new(l), async {
                let _ = rx.await;
            })
            .await
            .unwrap();
    });
    tx
}

impl Kubelet {
    /// Starts serving `<plugin_dir>/kubelet.sock` and `pod_resources`.
    pub fn start(plugin_dir: &Path, pod_resources: &Path) -> Kubelet {
        let (tx, rx) = mpsc::unbounded_channel();
        let pods: Pods = Arc::default();
        let a = serve(
            dp::registration_server::RegistrationServer::new(Registration { tx }),
            &plugin_dir.join("kubelet.sock"),
        );
        let b = serve(
            pr::pod_resources_lister_server::PodResourcesListerServer::new(PodResources {
                pods: Arc::clone(&pods),
            }),
            pod_resources,
        );
        Kubelet {
            plugin_dir: plugin_dir.to_path_buf(),
            registrations: rx,
            pods,
            stop: vec![a, b],
        }
    }

    /// Stops serving; like a real kubelet at start, the plugin sockets of
    /// the directory are removed.
    pub fn stop(mut self) {
        for s in self.stop.drain(..) {
            let _ = s.send(());
        }
        for e in std::fs::read_dir(&self.plugin_dir).unwrap().flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }

    /// The next registration (within `timeout`).
    pub async fn next_registration(&mut self, timeout: Duration) -> Option<dp::RegisterRequest> {
        tokio::time::timeout(timeout, self.registrations.recv())
            .await
            .ok()
            .flatten()
    }

    /// A client of a registered plugin.
    pub async fn plugin(
        &self,
        endpoint: &str,
    ) -> dp::device_plugin_client::DevicePluginClient<tonic::transport::Channel> {
        let ch = unix_channel(&self.plugin_dir.join(endpoint)).await.unwrap();
        dp::device_plugin_client::DevicePluginClient::new(ch)
    }
}
