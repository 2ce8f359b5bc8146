//! The sysfs seam: every read and write of `/sys` made by `vgpuctl passthrough`
//! and every read vgpud makes of its passthrough devices goes through
//! [`Sysfs`], with paths relative to a configurable root.
//!
//! [`RealSysfs`] is the implementation for hosts (and for read-only use of a
//! tree built by tests). Writing to real sysfs has side effects that a plain
//! file cannot have (writing `sriov_numvfs` creates devices, writing a
//! driver's `bind` creates the `driver` link), so `vgpuctl`'s tests use its
//! `FakeSysfs` (`host-tools/src/passthrough/testutils.rs`), which reads through
//! [`RealSysfs`] and emulates the kernel's reaction to each write.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Where PCI devices are listed, relative to the sysfs root.
pub const PCI_DEVICES: &str = "bus/pci/devices";
/// Where PCI drivers are listed.
pub const PCI_DRIVERS: &str = "bus/pci/drivers";
/// Writing a device address here asks the kernel to probe drivers for it.
pub const PCI_DRIVERS_PROBE: &str = "bus/pci/drivers_probe";
/// IOMMU groups.
pub const IOMMU_GROUPS: &str = "kernel/iommu_groups";
/// IOMMU hardware units (`dmar0`, `ivhd0`, …).
pub const IOMMU_CLASS: &str = "class/iommu";
/// What `driver_override` reads when no override is set.
pub const NO_OVERRIDE: &str = "(null)";

/// Access to a sysfs tree.
pub trait Sysfs: Send + Sync + std::fmt::Debug {
    /// The root of the tree (`/sys` on a host).
    fn root(&self) -> &Path;
    /// Reads an attribute.
    fn read(&self, rel: &Path) -> io::Result<String>;
    /// Writes an attribute in one `write(2)`, as `echo value > attr` does.
    fn write(&self, rel: &Path, value: &str) -> io::Result<()>;
    /// The target of a symbolic link.
    fn read_link(&self, rel: &Path) -> io::Result<PathBuf>;
    /// The names in a directory, sorted.
    fn list(&self, rel: &Path) -> io::Result<Vec<String>>;
    /// Whether a path exists (following links).
    fn exists(&self, rel: &Path) -> bool;

    /// The absolute path of `rel`, for messages.
    fn path(&self, rel: &Path) -> PathBuf {
        self.root().join(rel)
    }
}

/// The host's sysfs (or any directory laid out like it).
#[derive(Debug, Clone)]
pub struct RealSysfs {
    root: PathBuf,
}

impl RealSysfs {
    /// Sysfs rooted at `root`.
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }
}

impl Sysfs for RealSysfs {
    fn root(&self) -> &Path {
        &self.root
    }

    fn read(&self, rel: &Path) -> io::Result<String> {
        std::fs::read_to_string(self.root.join(rel))
    }

    fn write(&self, rel: &Path, value: &str) -> io::Result<()> {
        // Sysfs attributes exist or the kernel does not offer the operation:
        // never create a file.
        let mut f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(self.root.join(rel))?;
        f.write_all(value.as_bytes())
    }

    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        std::fs::read_link(self.root.join(rel))
    }

    fn list(&self, rel: &Path) -> io::Result<Vec<String>> {
        let mut names = std::fs::read_dir(self.root.join(rel))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<io::Result<Vec<_>>>()?;
        names.sort();
        Ok(names)
    }

    fn exists(&self, rel: &Path) -> bool {
        self.root.join(rel).exists()
    }
}

/// Reads an attribute without its trailing newline; `None` when absent.
pub fn attr(s: &dyn Sysfs, rel: &Path) -> io::Result<Option<String>> {
    match s.read(rel) {
        Ok(v) => Ok(Some(v.trim_end().to_string())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The last component of a link's target (`driver` → `nvidia`); `None`
/// when the link is absent.
pub fn link_name(s: &dyn Sysfs, rel: &Path) -> io::Result<Option<String>> {
    match s.read_link(rel) {
        Ok(t) => Ok(t.file_name().map(|n| n.to_string_lossy().into_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The directory of a PCI driver.
pub fn driver_dir(driver: &str) -> PathBuf {
    Path::new(PCI_DRIVERS).join(driver)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_sysfs_reads_writes_and_links_under_its_root() {
        let d = tempfile::tempdir().unwrap();
        let s = RealSysfs::new(d.path());
        std::fs::create_dir_all(d.path().join("a")).unwrap();
        std::fs::write(d.path().join("a/x"), "0x10de\n").unwrap();
        std::os::unix::fs::symlink("../b/nvidia", d.path().join("a/driver")).unwrap();
        assert_eq!(
            attr(&s, Path::new("a/x")).unwrap().as_deref(),
            Some("0x10de")
        );
        assert_eq!(attr(&s, Path::new("a/none")).unwrap(), None);
        assert_eq!(
            link_name(&s, Path::new("a/driver")).unwrap().as_deref(),
            Some("nvidia")
        );
        assert_eq!(link_name(&s, Path::new("a/nolink")).unwrap(), None);
        s.write(Path::new("a/x"), "1").unwrap();
        assert_eq!(s.read(Path::new("a/x")).unwrap(), "1");
        // A write never creates an attribute the kernel does not offer.
        let e = s.write(Path::new("a/new"), "1").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(!d.path().join("a/new").exists());
        assert_eq!(s.list(Path::new("a")).unwrap(), vec!["driver", "x"]);
    }
}
