//! Why a passthrough command failed, with what to do about it.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use super::state::StateError;
use super::vfio::VfioCheckError;
use vgpu_pci::{PciAddress, PciError};

/// Exit code of a refusal or a failure that left the host as it was.
pub const EXIT_FAILED: u8 = 1;
/// Exit code of a failure whose rollback failed too: the host is left
/// changed and the message says how to fix it by hand.
pub const EXIT_HOST_CHANGED: u8 = 6;

/// Why a passthrough command failed.
#[derive(Debug, Error)]
pub enum PassthroughError {
    /// A device could not be found or read.
    #[error(transparent)]
    Pci(#[from] PciError),
    /// The device is not NVIDIA's.
    #[error(
        "{address} is not an NVIDIA device (vendor {vendor:#06x}): vgpu passes through NVIDIA GPUs and their virtual functions only; `vgpuctl passthrough list` shows them"
    )]
    NotNvidia {
        /// The device.
        address: PciAddress,
        /// Its vendor ID.
        vendor: u16,
    },
    /// An NVIDIA function that is not a GPU (the HDMI audio function, …).
    #[error(
        "{address} is an NVIDIA {class} function, not a GPU: name the GPU (usually function .0) and add --group to bind the functions of its IOMMU group with it"
    )]
    NotGpu {
        /// The device.
        address: PciAddress,
        /// Its class.
        class: &'static str,
    },
    /// The IOMMU is off (or does not cover the device).
    #[error(
        "{address} is in no IOMMU group{}: without an IOMMU a VM's device could reach all host memory. Enable VT-d (Intel) or AMD-Vi (AMD) in the firmware, boot with `intel_iommu=on iommu=pt` or `amd_iommu=on iommu=pt`, reboot, and check that /sys/kernel/iommu_groups is not empty",
        if *host_has_iommu { "" } else { " and the host has no active IOMMU" }
    )]
    NoIommu {
        /// The device.
        address: PciAddress,
        /// Whether other devices have groups (the IOMMU is on elsewhere).
        host_has_iommu: bool,
    },
    /// A device of the group is bound to a host driver.
    #[error(
        "IOMMU group {group} of {address} is not viable: {}. VFIO hands a whole group to one VM, so every device in it must be bound to vfio-pci or to no driver: {hint}",
        blockers.join(", ")
    )]
    GroupNotViable {
        /// The device.
        address: PciAddress,
        /// Its group.
        group: u32,
        /// The devices in the way, described.
        blockers: Vec<String>,
        /// What to do.
        hint: String,
    },
    /// The device (or one of its VFs) is in use.
    #[error("{address} is in use: {why}; {hint}")]
    InUse {
        /// The device.
        address: PciAddress,
        /// What uses it.
        why: String,
        /// What to do.
        hint: String,
    },
    /// The request cannot be carried out as asked.
    #[error("{0}")]
    Refused(String),
    /// The kernel refused a sysfs write.
    #[error("writing `{}` to {} failed: {source}; {hint}", value.trim_end(), path.display())]
    Write {
        /// The attribute.
        path: PathBuf,
        /// What was written.
        value: String,
        /// The kernel's answer.
        #[source]
        source: io::Error,
        /// What it likely means.
        hint: String,
    },
    /// The kernel accepted a write but the device did not change as asked.
    #[error("{what}, but {observed}; {hint}")]
    NoEffect {
        /// The step.
        what: String,
        /// What sysfs shows instead.
        observed: String,
        /// What to do.
        hint: String,
    },
    /// A step failed and every earlier step was undone.
    #[error("{cause}. The host is as it was{}", undone_text(undone))]
    RolledBack {
        /// The failure.
        cause: Box<PassthroughError>,
        /// The undo steps that ran.
        undone: Vec<String>,
    },
    /// A step failed and undoing the earlier steps failed too.
    #[error(
        "{cause}. Undoing the earlier steps failed too ({}), so the host is left changed; fix it by hand:\n  {}",
        failed.join("; "),
        manual.join("\n  ")
    )]
    RollbackFailed {
        /// The failure.
        cause: Box<PassthroughError>,
        /// The undo steps that failed, with why.
        failed: Vec<String>,
        /// Shell commands that finish the undo.
        manual: Vec<String>,
    },
    /// The state file could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// The vgpud config could not be loaded.
    #[error(transparent)]
    Config(#[from] vgpu_config::ConfigError),
    /// The VFIO check failed.
    #[error(transparent)]
    Vfio(#[from] VfioCheckError),
    /// The output could not be written.
    #[error("cannot write the output: {0}")]
    Output(#[source] io::Error),
}

fn undone_text(undone: &[String]) -> String {
    if undone.is_empty() {
        " (nothing had been changed)".into()
    } else {
        format!(" (undone: {})", undone.join("; "))
    }
}

impl PassthroughError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            PassthroughError::RollbackFailed { .. } => EXIT_HOST_CHANGED,
            _ => EXIT_FAILED,
        }
    }
}

/// What a failed sysfs write most likely means.
pub fn write_hint(attribute: &str, e: &io::Error) -> String {
    match (e.raw_os_error(), e.kind()) {
        (Some(libc::EACCES | libc::EPERM), _) | (_, io::ErrorKind::PermissionDenied) => {
            "run vgpuctl as root".into()
        }
        (Some(libc::EBUSY), _) if attribute == "sriov_numvfs" => {
            "the kernel changes the VF count only from 0: disable the VFs first".into()
        }
        (Some(libc::EBUSY), _) => {
            "the device is busy: a process or VM still uses it".into()
        }
        (Some(libc::ENODEV), _) => {
            "the driver does not accept the device (check driver_override and `dmesg`)".into()
        }
        (Some(libc::ENOENT), _) if attribute == "sriov_numvfs" => {
            "the physical function's driver cannot configure SR-IOV: bind the GPU to the NVIDIA driver first".into()
        }
        (Some(libc::ERANGE), _) => "the device supports fewer VFs (see sriov_totalvfs)".into(),
        (_, io::ErrorKind::NotFound) => {
            "the kernel does not offer this attribute: is the driver loaded and the device still present?".into()
        }
        _ => "see `dmesg` for the kernel's reason".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_follow_the_kernels_errno() {
        let e = |n| io::Error::from_raw_os_error(n);
        assert!(write_hint("bind", &e(libc::EACCES)).contains("root"));
        assert!(write_hint("sriov_numvfs", &e(libc::EBUSY)).contains("from 0"));
        assert!(write_hint("unbind", &e(libc::EBUSY)).contains("busy"));
        assert!(write_hint("sriov_numvfs", &e(libc::ENOENT)).contains("NVIDIA driver"));
        assert!(write_hint("bind", &e(libc::ENODEV)).contains("driver_override"));
    }

    #[test]
    fn only_a_failed_rollback_gets_the_host_changed_exit_code() {
        let cause = || Box::new(PassthroughError::Refused("x".into()));
        assert_eq!(
            PassthroughError::RollbackFailed {
                cause: cause(),
                failed: vec![],
                manual: vec![]
            }
            .exit_code(),
            EXIT_HOST_CHANGED
        );
        assert_eq!(
            PassthroughError::RolledBack {
                cause: cause(),
                undone: vec![]
            }
            .exit_code(),
            EXIT_FAILED
        );
    }
}
