//! Memory settings of the config file (design.md §3, "Memory"): per device
//! `overcommit`, per VM `reserved`, `overflow` and `overflow_limit`, and the
//! host's overflow budget (`[memory] host_overflow_budget`).
//!
//! The rules (docs/memory.md): the slices of a device's VMs add up to at most
//! `overcommit` times its memory (default 1.0: they must fit); the
//! reservations add up to at most its memory; a VM's reservation and overflow
//! is at most its slice, and an overflow limit needs `overflow = "host"`.

use std::fmt;

use crate::size::Human;

/// Default `overcommit`: the slices must fit the device.
pub const DEFAULT_OVERCOMMIT: Overcommit = Overcommit(1000);
/// Largest `overcommit`.
pub const MAX_OVERCOMMIT: f64 = 16.0;
/// An overcommit no config can give: slices are not checked (a broker embedded without a
/// config), reservations still are.
pub const UNCHECKED_OVERCOMMIT: Overcommit = Overcommit(u32::MAX);

/// How far the slices of a device's VMs may add up past its memory: a
/// multiple from 1.0 to [`MAX_OVERCOMMIT`], kept in thousandths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Overcommit(u32);

impl Default for Overcommit {
    fn default() -> Self {
        DEFAULT_OVERCOMMIT
    }
}

impl Overcommit {
    /// The multiple `f`, refused outside 1.0..=[`MAX_OVERCOMMIT`] (to a thousandth).
    pub fn from_f64(f: f64) -> Option<Overcommit> {
        (f.is_finite() && (1.0..=MAX_OVERCOMMIT).contains(&f))
            .then(|| Overcommit((f * 1000.0).round() as u32))
    }

    /// [`Overcommit::from_f64`], saying what is allowed when `f` is not.
    pub fn checked(f: f64) -> Result<Overcommit, String> {
        Self::from_f64(f).ok_or_else(|| {
            format!("overcommit must be between 1.0 (slices fit the device) and {MAX_OVERCOMMIT}")
        })
    }

    /// The multiple.
    pub fn as_f64(self) -> f64 {
        f64::from(self.0) / 1000.0
    }

    /// The most the slices may add up to on a device of `total` bytes.
    pub fn limit(self, total: u64) -> u64 {
        let l = u128::from(total) * u128::from(self.0) / 1000;
        u64::try_from(l).unwrap_or(u64::MAX)
    }
}

impl fmt::Display for Overcommit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_f64())
    }
}

/// Where a VM's allocations go when the device has no room for them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Overflow {
    /// Nowhere: the allocation fails with `CUDA_ERROR_OUT_OF_MEMORY`.
    #[default]
    None,
    /// To host memory the kernels can still address, at the same device address.
    Host,
}

impl Overflow {
    /// Parses the config spelling.
    pub fn parse(s: &str) -> Option<Overflow> {
        match s {
            "none" => Some(Overflow::None),
            "host" => Some(Overflow::Host),
            _ => None,
        }
    }

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Overflow::None => "none",
            Overflow::Host => "host",
        }
    }
}

/// A VM's memory guarantees and overflow (its `[[vm]]` keys `reserved`,
/// `overflow`, `overflow_limit`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmMemory {
    /// Device memory guaranteed to the VM whatever the others do.
    pub reserved: u64,
    /// Where allocations go when the device is full.
    pub overflow: Overflow,
    /// Most host memory the VM's allocations may overflow to (0 with `overflow = "none"`).
    pub overflow_limit: u64,
}

impl VmMemory {
    /// Checks the VM's own rules against its slice `memory` (0: not known yet, a real
    /// GPU's profile fraction); the error names the key to fix.
    pub fn check(&self, memory: u64) -> Result<(), (&'static str, String)> {
        if memory > 0 && self.reserved > memory {
            return Err((
                "reserved",
                format!(
                    "reserved = {} is more than the VM's slice of {}: a VM cannot be guaranteed more than it may use; lower `reserved` or raise `memory`",
                    Human(self.reserved),
                    Human(memory)
                ),
            ));
        }
        if self.overflow == Overflow::None && self.overflow_limit > 0 {
            return Err((
                "overflow_limit",
                "overflow_limit applies with overflow = \"host\" only; add it or remove the limit"
                    .into(),
            ));
        }
        // An overflow limit past the slice is allowed (a slice may shrink live under it): no more
        // than the slice can ever overflow, since overflow is part of the slice.
        Ok(())
    }
}

/// The `[memory]` table: host-wide settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Most host memory all VMs' overflow may take together (`host_overflow_budget`);
    /// `None`: half of the host's RAM, read at start-up.
    pub host_overflow_budget: Option<u64>,
}

/// What one VM contributes to a device's totals.
#[derive(Debug, Clone, Copy)]
pub struct SliceOf<'a> {
    /// VM name.
    pub name: &'a str,
    /// Its slice in bytes.
    pub memory: u64,
    /// Its reservation in bytes.
    pub reserved: u64,
}

/// Checks that the slices on a device of `total` bytes add up to at most
/// `overcommit × total` and the reservations to at most `total`. The error
/// names the key to change (`overcommit` or `reserved`) and the VM that
/// went over (the last one counted).
pub fn check_device_fit(
    device: &str,
    total: u64,
    overcommit: Overcommit,
    vms: &[SliceOf<'_>],
) -> Result<(), FitError> {
    let limit = overcommit.limit(total);
    let mut slices = 0u64;
    let mut reserved = 0u64;
    for v in vms {
        slices = slices.saturating_add(v.memory);
        if slices > limit {
            return Err(FitError {
                vm: v.name.to_string(),
                message: format!(
                    "the slices of the VMs on device `{device}` add up to {} with VM `{}`, more than overcommit × memory = {overcommit} × {} = {}: raise `overcommit` on the device (allocations past its memory then overflow or fail) or make the slices smaller",
                    Human(slices),
                    v.name,
                    Human(total),
                    Human(limit)
                ),
            });
        }
        reserved = reserved.saturating_add(v.reserved);
        if reserved > total {
            return Err(FitError {
                vm: v.name.to_string(),
                message: format!(
                    "the reservations of the VMs on device `{device}` add up to {} with VM `{}`, more than its {} of memory: the device cannot guarantee them; lower `reserved`",
                    Human(reserved),
                    v.name,
                    Human(total)
                ),
            });
        }
    }
    Ok(())
}

/// Slices or reservations that do not fit a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FitError {
    /// The VM whose entry went over.
    pub vm: String,
    /// What is wrong and what to change.
    pub message: String,
}

impl fmt::Display for FitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FitError {}

/// Half of the host's RAM (`MemTotal` in /proc/meminfo), the default
/// host overflow budget; 0 when it cannot be read.
pub fn default_host_overflow_budget() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib.saturating_mul(1024) / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn overcommit_is_a_multiple_from_one_to_the_maximum() {
        assert_eq!(Overcommit::from_f64(1.5).unwrap().limit(4 * GIB), 6 * GIB);
        assert_eq!(Overcommit::default().limit(4 * GIB), 4 * GIB);
        assert!(Overcommit::from_f64(0.9).is_none());
        assert!(Overcommit::from_f64(f64::NAN).is_none());
        assert!(Overcommit::from_f64(MAX_OVERCOMMIT + 1.0).is_none());
        assert_eq!(Overcommit::from_f64(1.25).unwrap().to_string(), "1.25");
    }

    #[test]
    fn slices_past_overcommit_and_reservations_past_the_device_are_refused() {
        let vm = |name, memory, reserved| SliceOf {
            name,
            memory,
            reserved,
        };
        let one = Overcommit::default();
        let e = check_device_fit(
            "gpu0",
            4 * GIB,
            one,
            &[vm("vm1", 3 * GIB, 0), vm("vm2", 3 * GIB, 0)],
        )
        .unwrap_err();
        assert_eq!(e.vm, "vm2");
        assert!(e.message.contains("overcommit"), "{e}");
        let oc = Overcommit::from_f64(1.5).unwrap();
        check_device_fit(
            "gpu0",
            4 * GIB,
            oc,
            &[vm("vm1", 3 * GIB, 2 * GIB), vm("vm2", 3 * GIB, 2 * GIB)],
        )
        .unwrap();
        let e = check_device_fit(
            "gpu0",
            4 * GIB,
            oc,
            &[vm("vm1", 3 * GIB, 3 * GIB), vm("vm2", 3 * GIB, 2 * GIB)],
        )
        .unwrap_err();
        assert!(e.message.contains("`reserved`"), "{e}");
    }

    #[test]
    fn a_vm_cannot_reserve_past_its_slice_and_limits_need_overflow() {
        let m = VmMemory {
            reserved: 2 * GIB,
            ..VmMemory::default()
        };
        assert_eq!(m.check(GIB).unwrap_err().0, "reserved");
        assert!(m.check(0).is_ok(), "an unsized slice is checked later");
        let m = VmMemory {
            overflow_limit: GIB,
            ..VmMemory::default()
        };
        assert_eq!(m.check(4 * GIB).unwrap_err().0, "overflow_limit");
        let m = VmMemory {
            overflow: Overflow::Host,
            overflow_limit: 8 * GIB,
            ..VmMemory::default()
        };
        assert!(
            m.check(4 * GIB).is_ok(),
            "only the slice can overflow anyway"
        );
    }
}
