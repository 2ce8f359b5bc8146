//! Integration tests of the Kubernetes and KubeVirt pieces: one test binary, one module per topic
//! (a new topic is a new file here plus a `mod` line below).

mod support;

mod device_plugin;
mod image;
mod manifests;
mod sidecar;
