//! gRPC messages and services generated from `proto/` at build time.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// The kubelet device-plugin API, v1beta1.
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");
}

/// The kubelet pod-resources API, v1.
pub mod podresources {
    tonic::include_proto!("v1");
}

/// KubeVirt's hook sidecar info API.
pub mod hooks_info {
    tonic::include_proto!("kubevirt.hooks.info");
}

/// KubeVirt's hook sidecar callbacks, v1alpha2.
pub mod hooks_v1alpha2 {
    tonic::include_proto!("kubevirt.hooks.v1alpha2");
}
