//! [`VmTransport`]: a VM's transports as its running config declares them, what `vm attach-args`
//! (`attach.rs`) and `vm attach` of a libvirt domain (`libvirt.rs`) build from.

use serde_json::Value;

/// What the arguments are built from (the VM's running config).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmTransport {
    /// VM name.
    pub name: String,
    /// `vhost_user_socket`.
    pub vhost_user_socket: Option<String>,
    /// `guest_cid`.
    pub guest_cid: Option<u64>,
    /// `unix_socket`.
    pub unix_socket: Option<String>,
    /// The virtio device ID, when the VM's `vhost_user_socket` serves the virtio-vgpu device
    /// (`device_model = "vgpu"`).
    pub vgpu_device_id: Option<u16>,
}

impl VmTransport {
    /// From the admin API's VM. Its transports are read from `config`, the VM's `[[vm]]`
    /// entry, whose keys are the config file's (vgpu-config renders it).
    pub fn from_vm(v: &vgpu_api::Vm) -> Self {
        let c = v.config.as_ref().unwrap_or(&Value::Null);
        let s = |k: &str| c[k].as_str().map(str::to_string);
        Self {
            name: v.name.clone(),
            vhost_user_socket: s("vhost_user_socket"),
            guest_cid: c["guest_cid"].as_u64(),
            unix_socket: s("unix_socket"),
            vgpu_device_id: (c["device_model"] == "vgpu").then(|| {
                c["vgpu_device_id"]
                    .as_u64()
                    .and_then(|v| u16::try_from(v).ok())
                    .unwrap_or(vgpu_config::DEFAULT_VGPU_DEVICE_ID)
            }),
        }
    }
}
