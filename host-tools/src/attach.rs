//! `vgpuctl vm attach-args`: the exact VMM arguments that attach a VM to
//! vgpud, from the VM's running configuration.
//!
//! - QEMU: guest memory in a shared memfd (vhost-user needs vgpud to map it),
//!   a chardev on the VM's `vhost_user_socket` and a `vhost-user-vsock-pci`
//!   device on it.
//! - cloud-hypervisor ≥ v53: shared memory and `--generic-vhost-user` with
//!   `device_type=vsock` on the `vhost_user_socket`; or, without a vhost-user
//!   device, cloud-hypervisor's own hybrid vsock (`--vsock cid=N,socket=BASE`),
//!   which connects guest port P to `BASE_P`: the VM's `unix_socket` must be
//!   `BASE_<GPU port>`.
//! - A VM with `device_model = "vgpu"`: the virtio-vgpu device on the
//!   `vhost_user_socket`, through QEMU ≥ 10.2's generic
//!   `vhost-user-test-device-pci` (`virtio-id`, `num_vqs`, `vq_size`,
//!   `config_size`) or cloud-hypervisor's `--generic-vhost-user` with the
//!   numeric `device_type` and one queue size per queue.

use clap::{Args, ValueEnum};
use serde_json::json;

use vgpu_config::{
    QEMU_VGPU_DEVICE_ID, VGPU_CONFIG_SIZE, VGPU_QUEUE_SIZE, VGPU_QUEUES, qemu_presents_device_id,
};

use crate::api::{Client, typed};
use crate::outcome::{CliError, print_json};
pub use crate::vm_transport::VmTransport;

/// Guest memory when `--guest-memory` is not given.
pub const DEFAULT_GUEST_MEMORY: &str = "2G";
/// Queue sizes of the vsock device for cloud-hypervisor (rx, tx, event).
pub const CH_VSOCK_QUEUE_SIZES: &str = "[256,256,256]";
/// CID cloud-hypervisor's hybrid vsock gives the guest when `--cid` is not given.
pub const DEFAULT_HYBRID_CID: u64 = 3;

/// Which VMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Vmm {
    /// QEMU (`qemu-system-x86_64`).
    Qemu,
    /// cloud-hypervisor.
    CloudHypervisor,
    /// libvirt: the domain XML elements (`vgpuctl vm attach --domain` applies them).
    Libvirt,
}

/// Arguments of `vm attach-args`.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// VM name.
    pub name: String,
    /// The VMM the arguments are for.
    #[arg(long, value_enum)]
    pub vmm: Vmm,
    /// Guest RAM in the VMM's syntax (e.g. 4G); it becomes shared memory that vgpud maps.
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_GUEST_MEMORY)]
    pub guest_memory: String,
    /// Back guest RAM with 2 MiB huge pages (QEMU hugetlb=on, cloud-hypervisor hugepages=on): the host must have them reserved (sysctl vm.nr_hugepages); faster copies.
    #[arg(long)]
    pub huge_pages: bool,
    /// cloud-hypervisor: use its hybrid vsock (--vsock) on the VM's unix socket instead of --generic-vhost-user.
    #[arg(long)]
    pub hybrid: bool,
    /// cloud-hypervisor hybrid vsock: the guest's CID.
    #[arg(long, value_name = "CID", default_value_t = DEFAULT_HYBRID_CID)]
    pub cid: u64,
}

/// Guest RAM as the VMM should allocate it: shared (vgpud maps it), optionally in huge pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestMemory {
    /// Size in the VMM's syntax (e.g. 4G).
    pub size: String,
    /// In 2 MiB huge pages.
    pub huge_pages: bool,
}

impl GuestMemory {
    /// `size` in 4 KiB pages.
    pub fn new(size: &str) -> Self {
        Self {
            size: size.to_string(),
            huge_pages: false,
        }
    }

    /// QEMU's memory backend object with id `id`.
    fn qemu_backend(&self, id: &str) -> String {
        let huge = if self.huge_pages {
            ",hugetlb=on,hugetlbsize=2M"
        } else {
            ""
        };
        format!(
            "memory-backend-memfd,id={id},size={},share=on{huge}",
            self.size
        )
    }

    /// cloud-hypervisor's `--memory` value.
    fn ch_memory(&self) -> String {
        let huge = if self.huge_pages {
            ",hugepages=on,hugepage_size=2M"
        } else {
            ""
        };
        format!("size={},shared=on{huge}", self.size)
    }
}

fn valid_size(s: &str) -> bool {
    let digits = s.trim_end_matches(['K', 'M', 'G', 'T', 'k', 'm', 'g', 't']);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && s.len() - digits.len() <= 1
}

/// Escapes a QEMU option value (commas are doubled).
pub fn qemu_escape(s: &str) -> String {
    s.replace(',', ",,")
}

/// Quotes a cloud-hypervisor option value when it holds a comma, bracket or quote.
pub fn ch_quote(s: &str) -> String {
    if s.contains([',', '"', '[', ']', '=']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// QEMU arguments for `vm`.
pub fn qemu_args(vm: &VmTransport, guest_memory: &GuestMemory) -> Result<Vec<String>, String> {
    let Some(sock) = &vm.vhost_user_socket else {
        return Err(format!(
            "VM {} has no vhost-user device: add vhost_user_socket and guest_cid (vsock) or device_model = \"vgpu\" (virtio-vgpu) to its [[vm]] entry (or `vgpuctl vm add … --vhost-user-socket PATH --guest-cid N`); QEMU attaches to vgpud through it",
            vm.name
        ));
    };
    let mem = format!("vgpu-mem-{}", vm.name);
    if let Some(id) = vm.vgpu_device_id {
        if !qemu_presents_device_id(id) {
            return Err(format!(
                "VM {} uses virtio device ID {id}, which QEMU's vhost-user-test-device-pci cannot present (it knows only IDs 1-13, 16-41 and 45, all assigned by the VIRTIO spec): set vgpu_device_id = {QEMU_VGPU_DEVICE_ID} in its [[vm]] entry (the vgpu guest module binds {QEMU_VGPU_DEVICE_ID} too)",
                vm.name
            ));
        }
        let chr = format!("vgpu-dev-{}", vm.name);
        return Ok(vec![
            "-m".into(),
            guest_memory.size.clone(),
            "-object".into(),
            guest_memory.qemu_backend(&mem),
            "-numa".into(),
            format!("node,memdev={mem}"),
            "-chardev".into(),
            format!("socket,id={chr},path={}", qemu_escape(sock)),
            "-device".into(),
            format!(
                "vhost-user-test-device-pci,chardev={chr},virtio-id={id},num_vqs={VGPU_QUEUES},vq_size={VGPU_QUEUE_SIZE},config_size={VGPU_CONFIG_SIZE}"
            ),
        ]);
    }
    let chr = format!("vgpu-vsock-{}", vm.name);
    Ok(vec![
        "-m".into(),
        guest_memory.size.clone(),
        "-object".into(),
        guest_memory.qemu_backend(&mem),
        "-numa".into(),
        format!("node,memdev={mem}"),
        "-chardev".into(),
        format!("socket,id={chr},path={}", qemu_escape(sock)),
        "-device".into(),
        format!("vhost-user-vsock-pci,chardev={chr}"),
    ])
}

/// cloud-hypervisor arguments for `vm`.
pub fn ch_args(
    vm: &VmTransport,
    guest_memory: &GuestMemory,
    hybrid: bool,
    cid: u64,
) -> Result<Vec<String>, String> {
    let suffix = format!("_{}", vgpu_proto::GPU_VSOCK_PORT);
    if !hybrid && let (Some(sock), Some(id)) = (&vm.vhost_user_socket, vm.vgpu_device_id) {
        let sizes = vec![VGPU_QUEUE_SIZE.to_string(); VGPU_QUEUES].join(",");
        return Ok(vec![
            "--memory".into(),
            guest_memory.ch_memory(),
            "--generic-vhost-user".into(),
            format!(
                "socket={},device_type={id},queue_sizes=[{sizes}]",
                ch_quote(sock)
            ),
        ]);
    }
    if !hybrid && let Some(sock) = &vm.vhost_user_socket {
        return Ok(vec![
            "--memory".into(),
            guest_memory.ch_memory(),
            "--generic-vhost-user".into(),
            format!(
                "socket={},device_type=vsock,queue_sizes={CH_VSOCK_QUEUE_SIZES}",
                ch_quote(sock)
            ),
        ]);
    }
    match vm
        .unix_socket
        .as_deref()
        .and_then(|u| u.strip_suffix(&suffix))
    {
        Some(base) if !base.is_empty() => Ok(vec![
            "--vsock".into(),
            format!("cid={cid},socket={}", ch_quote(base)),
        ]),
        _ => Err(format!(
            "VM {name} cannot be attached to cloud-hypervisor {how}: give it vhost_user_socket and guest_cid (cloud-hypervisor v53 or later, --generic-vhost-user), or a unix_socket named BASE{suffix} for cloud-hypervisor's hybrid vsock (--vsock cid=N,socket=BASE)",
            name = vm.name,
            how = if hybrid { "with hybrid vsock" } else { "yet" },
        )),
    }
}

/// Quotes an argument for a POSIX shell when needed.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=,:@+[]".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Runs `vm attach-args`.
pub fn run(a: &AttachArgs, c: &Client, json_out: bool) -> Result<(), CliError> {
    if !valid_size(&a.guest_memory) {
        return Err(CliError::Failed(format!(
            "--guest-memory {} is not a size the VMM understands: write e.g. 4G or 2048M",
            a.guest_memory
        )));
    }
    let vm = VmTransport::from_vm(&typed(&c.get(&format!("/v1/vms/{}", a.name))?)?);
    let mem = GuestMemory {
        size: a.guest_memory.clone(),
        huge_pages: a.huge_pages,
    };
    let args = match a.vmm {
        Vmm::Qemu => qemu_args(&vm, &mem),
        Vmm::CloudHypervisor => ch_args(&vm, &mem, a.hybrid, a.cid),
        Vmm::Libvirt => {
            let att = crate::libvirt::attachment(&vm).map_err(CliError::Failed)?;
            let xml = vgpu_libvirt::snippet(&att);
            if json_out {
                print_json(&json!({ "vm": a.name, "vmm": "libvirt", "domain_xml": xml }));
            } else {
                print!("{xml}");
            }
            return Ok(());
        }
    }
    .map_err(CliError::Failed)?;
    if json_out {
        let vmm = match a.vmm {
            Vmm::Qemu => "qemu",
            Vmm::CloudHypervisor => "cloud-hypervisor",
            Vmm::Libvirt => "libvirt",
        };
        print_json(&json!({ "vm": a.name, "vmm": vmm, "args": args }));
    } else {
        let line: Vec<String> = args.iter().map(|s| shell_quote(s)).collect();
        println!("{}", line.join(" "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm() -> VmTransport {
        VmTransport {
            name: "vm1".into(),
            vhost_user_socket: Some("/run/vgpu/vm1.vhost.sock".into()),
            guest_cid: Some(3),
            unix_socket: Some(format!(
                "/run/vgpu/vm1.vsock_{}",
                vgpu_proto::GPU_VSOCK_PORT
            )),
            vgpu_device_id: None,
        }
    }

    fn vgpu_vm(id: u16) -> VmTransport {
        VmTransport {
            name: "g1".into(),
            vhost_user_socket: Some("/run/vgpu/g1.vgpu.sock".into()),
            vgpu_device_id: Some(id),
            ..Default::default()
        }
    }

    #[test]
    fn huge_pages_back_guest_ram_in_both_vmms() {
        let mem = GuestMemory {
            size: "8G".into(),
            huge_pages: true,
        };
        let q = qemu_args(&vgpu_vm(21), &mem).unwrap();
        assert!(
            q.contains(
                &"memory-backend-memfd,id=vgpu-mem-g1,size=8G,share=on,hugetlb=on,hugetlbsize=2M"
                    .to_string()
            ),
            "{q:?}"
        );
        let c = ch_args(&vm(), &mem, false, 3).unwrap();
        assert_eq!(
            c[..2],
            [
                "--memory".to_string(),
                "size=8G,shared=on,hugepages=on,hugepage_size=2M".to_string()
            ]
        );
    }

    #[test]
    fn the_vgpu_device_attaches_through_the_generic_vhost_user_devices() {
        let q = qemu_args(&vgpu_vm(21), &GuestMemory::new("4G"))
            .unwrap()
            .join(" ");
        assert_eq!(
            q,
            "-m 4G -object memory-backend-memfd,id=vgpu-mem-g1,size=4G,share=on -numa node,memdev=vgpu-mem-g1 \
             -chardev socket,id=vgpu-dev-g1,path=/run/vgpu/g1.vgpu.sock \
             -device vhost-user-test-device-pci,chardev=vgpu-dev-g1,virtio-id=21,num_vqs=2,vq_size=1024,config_size=96"
        );
        // The default ID is outside QEMU's table: a clear error with the fix.
        let e = qemu_args(&vgpu_vm(63), &GuestMemory::new("4G")).unwrap_err();
        assert!(e.contains("set vgpu_device_id = 21"), "{e}");
        let c = ch_args(&vgpu_vm(63), &GuestMemory::new("2G"), false, 3)
            .unwrap()
            .join(" ");
        assert_eq!(
            c,
            "--memory size=2G,shared=on --generic-vhost-user socket=/run/vgpu/g1.vgpu.sock,device_type=63,queue_sizes=[1024,1024]"
        );
        // The VM's JSON (its running config) says which device it has.
        let v = vgpu_api::Vm {
            name: "g1".into(),
            config: Some(serde_json::json!(
                {"vhost_user_socket": "/s", "device_model": "vgpu", "vgpu_device_id": 21}
            )),
            ..Default::default()
        };
        assert_eq!(VmTransport::from_vm(&v).vgpu_device_id, Some(21));
        let v = vgpu_api::Vm {
            name: "v".into(),
            config: Some(serde_json::json!({"vhost_user_socket": "/s", "guest_cid": 3})),
            ..Default::default()
        };
        assert_eq!(VmTransport::from_vm(&v).vgpu_device_id, None);
    }

    #[test]
    fn qemu_gets_shared_memory_and_the_vhost_user_vsock_device() {
        let a = qemu_args(&vm(), &GuestMemory::new("4G")).unwrap().join(" ");
        assert_eq!(
            a,
            "-m 4G -object memory-backend-memfd,id=vgpu-mem-vm1,size=4G,share=on -numa node,memdev=vgpu-mem-vm1 \
             -chardev socket,id=vgpu-vsock-vm1,path=/run/vgpu/vm1.vhost.sock -device vhost-user-vsock-pci,chardev=vgpu-vsock-vm1"
        );
        let mut odd = vm();
        odd.vhost_user_socket = Some("/run/a,b.sock".into());
        assert!(
            qemu_args(&odd, &GuestMemory::new("1G"))
                .unwrap()
                .join(" ")
                .contains("path=/run/a,,b.sock")
        );
        let none = VmTransport {
            name: "x".into(),
            ..Default::default()
        };
        assert!(
            qemu_args(&none, &GuestMemory::new("1G"))
                .unwrap_err()
                .contains("add vhost_user_socket and guest_cid (vsock) or device_model")
        );
    }

    #[test]
    fn cloud_hypervisor_gets_generic_vhost_user_or_hybrid_vsock() {
        let a = ch_args(&vm(), &GuestMemory::new("2G"), false, 3)
            .unwrap()
            .join(" ");
        assert_eq!(
            a,
            "--memory size=2G,shared=on --generic-vhost-user socket=/run/vgpu/vm1.vhost.sock,device_type=vsock,queue_sizes=[256,256,256]"
        );
        let h = ch_args(&vm(), &GuestMemory::new("2G"), true, 7)
            .unwrap()
            .join(" ");
        assert_eq!(h, "--vsock cid=7,socket=/run/vgpu/vm1.vsock");
        let mut only_unix = vm();
        only_unix.vhost_user_socket = None;
        assert!(ch_args(&only_unix, &GuestMemory::new("2G"), false, 3).unwrap()[0] == "--vsock");
        only_unix.unix_socket = Some("/run/vgpu/vm1.sock".into());
        let e = ch_args(&only_unix, &GuestMemory::new("2G"), false, 3).unwrap_err();
        assert!(
            e.contains(&format!("BASE_{}", vgpu_proto::GPU_VSOCK_PORT)),
            "{e}"
        );
    }

    #[test]
    fn sizes_and_quoting() {
        assert!(valid_size("4G") && valid_size("2048M") && valid_size("1073741824"));
        assert!(!valid_size("4GiB") && !valid_size("") && !valid_size("G"));
        assert_eq!(shell_quote("/run/vgpu/a.sock"), "/run/vgpu/a.sock");
        assert_eq!(shell_quote("path=/my dir/x"), "'path=/my dir/x'");
        assert_eq!(ch_quote("/a,b"), "\"/a,b\"");
    }
}
