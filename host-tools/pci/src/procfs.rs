//! What procfs tells about GPUs: the NVIDIA driver's per-GPU information
//! (UUID and device minor, so `/dev/nvidiaN` and a `GPU-…` UUID can be tied
//! to a PCI address without CUDA) and which processes hold a device node open.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::PciAddress;

/// Where the NVIDIA kernel driver describes each GPU, relative to procfs.
pub const NVIDIA_GPUS: &str = "driver/nvidia/gpus";
/// Device nodes of NVIDIA GPUs are `/dev/nvidia<minor>`.
pub const NVIDIA_DEV_PREFIX: &str = "/dev/nvidia";
/// VFIO group nodes are `/dev/vfio/<group>`.
pub const VFIO_DEV_DIR: &str = "/dev/vfio";

/// The NVIDIA driver's description of a GPU it drives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvidiaGpu {
    /// PCI address.
    pub address: PciAddress,
    /// `GPU-…` UUID.
    pub uuid: Option<String>,
    /// Minor number of its `/dev/nvidiaN` node.
    pub minor: Option<u32>,
    /// Model name.
    pub model: Option<String>,
}

impl NvidiaGpu {
    /// Its device node.
    pub fn dev_node(&self) -> Option<PathBuf> {
        self.minor
            .map(|m| PathBuf::from(format!("{NVIDIA_DEV_PREFIX}{m}")))
    }
}

/// A process holding a device node open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// Process ID.
    pub pid: u32,
    /// Its command name (`comm`).
    pub comm: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} ({})", self.pid, self.comm)
    }
}

/// procfs (normally `/proc`).
#[derive(Debug, Clone)]
pub struct Procfs {
    root: PathBuf,
}

fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

impl Procfs {
    /// procfs rooted at `root`.
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    /// The NVIDIA driver's description of the GPU at `address`; `None` when
    /// the driver does not drive it (or is not loaded).
    pub fn nvidia_gpu(&self, address: PciAddress) -> Option<NvidiaGpu> {
        let text = std::fs::read_to_string(
            self.root
                .join(NVIDIA_GPUS)
                .join(address.to_string())
                .join("information"),
        )
        .ok()?;
        Some(NvidiaGpu {
            address,
            uuid: field(&text, "GPU UUID").map(str::to_string),
            minor: field(&text, "Device Minor").and_then(|m| m.parse().ok()),
            model: field(&text, "Model").map(str::to_string),
        })
    }

    /// Every GPU the NVIDIA driver drives.
    pub fn nvidia_gpus(&self) -> Vec<NvidiaGpu> {
        let Ok(rd) = std::fs::read_dir(self.root.join(NVIDIA_GPUS)) else {
            return Vec::new();
        };
        let mut out: Vec<NvidiaGpu> = rd
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter_map(|a| self.nvidia_gpu(a))
            .collect();
        out.sort_by_key(|g| g.address);
        out
    }

    /// The PCI address of the GPU with a `GPU-…` UUID, when the NVIDIA
    /// driver drives it.
    pub fn address_of_uuid(&self, uuid: &str) -> Option<PciAddress> {
        self.nvidia_gpus()
            .into_iter()
            .find(|g| {
                g.uuid
                    .as_deref()
                    .is_some_and(|u| u.eq_ignore_ascii_case(uuid))
            })
            .map(|g| g.address)
    }

    /// Processes with `node` open. Processes whose descriptors cannot be
    /// read (other users' when not root) are not seen.
    pub fn holders(&self, node: &Path) -> Vec<Holder> {
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in rd.filter_map(Result::ok) {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
                continue;
            };
            let holds = fds
                .filter_map(Result::ok)
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == node));
            if holds {
                let comm = std::fs::read_to_string(e.path().join("comm"))
                    .map(|c| c.trim_end().to_string())
                    .unwrap_or_else(|_| "?".into());
                out.push(Holder { pid, comm });
            }
        }
        out.sort_by_key(|h| h.pid);
        out
    }

    /// Processes holding the VFIO group node of `group`.
    pub fn vfio_group_holders(&self, group: u32) -> Vec<Holder> {
        self.holders(&Path::new(VFIO_DEV_DIR).join(group.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_nvidia_information_file_and_finds_holders() {
        let d = tempfile::tempdir().unwrap();
        let gpu = d.path().join("driver/nvidia/gpus/0000:3b:00.0");
        std::fs::create_dir_all(&gpu).unwrap();
        std::fs::write(
            gpu.join("information"),
            "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 183\nGPU UUID: \t GPU-6e3f0b3c-0d6b-4d8e-9f3a-0c1d2e3f4a5b\nVideo BIOS: \t 96.00.30.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t 0000:3b:00.0\nDevice Minor: \t 2\nGPU Excluded:\t No\n",
        )
        .unwrap();
        let p = Procfs::new(d.path());
        let a: PciAddress = "0000:3b:00.0".parse().unwrap();
        let g = p.nvidia_gpu(a).unwrap();
        assert_eq!(g.minor, Some(2));
        assert_eq!(g.model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(g.dev_node().unwrap(), Path::new("/dev/nvidia2"));
        assert_eq!(
            p.address_of_uuid("gpu-6E3F0B3C-0d6b-4d8e-9f3a-0c1d2e3f4a5b"),
            Some(a)
        );
        assert_eq!(
            p.address_of_uuid("GPU-00000000-0000-0000-0000-000000000000"),
            None
        );

        let fd = d.path().join("4242/fd");
        std::fs::create_dir_all(&fd).unwrap();
        std::fs::write(d.path().join("4242/comm"), "vgpud\n").unwrap();
        std::os::unix::fs::symlink("/dev/nvidiactl", fd.join("3")).unwrap();
        std::os::unix::fs::symlink("/dev/nvidia2", fd.join("4")).unwrap();
        assert_eq!(
            p.holders(Path::new("/dev/nvidia2")),
            vec![Holder {
                pid: 4242,
                comm: "vgpud".into()
            }]
        );
        assert!(p.holders(Path::new("/dev/nvidia0")).is_empty());
        assert!(p.vfio_group_holders(42).is_empty());
    }
}
