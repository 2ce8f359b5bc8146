//! Changes to sysfs as plans of idempotent steps that undo themselves.
//!
//! Every [`Action`] *ensures* a state (driver bound, VF count, …): it writes
//! only when the state differs and checks the result by reading sysfs back,
//! because the kernel may accept a write without doing it (`drivers_probe`
//! with no matching driver, for example). A [`Step`] pairs an action with the
//! actions that restore what it changed. [`execute`] runs the steps in order;
//! when one fails, the undo actions of that step and of every earlier step
//! run in reverse order. Undo actions are idempotent too, so undoing a step
//! that changed nothing is harmless.

use std::path::Path;

use super::error::{PassthroughError, write_hint};
use vgpu_pci::sysfs::{NO_OVERRIDE, PCI_DRIVERS_PROBE, Sysfs, attr, driver_dir};
use vgpu_pci::{PciAddress, PciDevice};

/// One idempotent change to sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `driver_override` holds `driver` (None: no override).
    Override {
        /// The device.
        address: PciAddress,
        /// The override.
        driver: Option<String>,
    },
    /// The device is not bound to `driver`.
    Unbound {
        /// The device.
        address: PciAddress,
        /// The driver.
        driver: String,
    },
    /// The device is bound to no driver at all.
    NoDriver {
        /// The device.
        address: PciAddress,
    },
    /// The device is bound to `driver`, through the driver's `bind` file.
    Bound {
        /// The device.
        address: PciAddress,
        /// The driver.
        driver: String,
    },
    /// The kernel has probed drivers for the device (`drivers_probe`) and
    /// bound `expect` (None: whatever it chose, possibly nothing).
    Probed {
        /// The device.
        address: PciAddress,
        /// The driver that must end up bound.
        expect: Option<String>,
    },
    /// `sriov_numvfs` of a physical function is `count`.
    NumVfs {
        /// The physical function.
        pf: PciAddress,
        /// VFs.
        count: u32,
    },
    /// `sriov_drivers_autoprobe` of a physical function is `on`.
    Autoprobe {
        /// The physical function.
        pf: PciAddress,
        /// Whether new VFs are probed by host drivers.
        on: bool,
    },
}

fn current_driver(s: &dyn Sysfs, a: PciAddress) -> Result<Option<String>, PassthroughError> {
    Ok(PciDevice::read(s, a)?.driver)
}

fn write(s: &dyn Sysfs, rel: &Path, value: &str) -> Result<(), PassthroughError> {
    s.write(rel, value).map_err(|source| {
        let attribute = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        PassthroughError::Write {
            path: s.path(rel),
            hint: write_hint(&attribute, &source),
            value: value.to_string(),
            source,
        }
    })
}

fn no_effect(what: String, observed: String, hint: &str) -> PassthroughError {
    PassthroughError::NoEffect {
        what,
        observed,
        hint: hint.to_string(),
    }
}

fn driver_text(d: &Option<String>) -> String {
    d.as_deref().map_or("it is bound to no driver".into(), |d| {
        format!("it is bound to {d}")
    })
}

/// `sriov_numvfs` of a PF, and the number of `virtfn` links it has.
fn vf_state(s: &dyn Sysfs, pf: PciAddress) -> Result<(u32, usize), PassthroughError> {
    let d = PciDevice::read(s, pf)?;
    Ok((d.sriov.map_or(0, |v| v.enabled), d.virtfns.len()))
}

impl Action {
    /// What the action does, for messages.
    pub fn describe(&self) -> String {
        match self {
            Action::Override {
                address,
                driver: Some(d),
            } => format!("set driver_override of {address} to {d}"),
            Action::Override {
                address,
                driver: None,
            } => format!("clear driver_override of {address}"),
            Action::Unbound { address, driver } => format!("unbind {address} from {driver}"),
            Action::NoDriver { address } => format!("unbind {address} from its driver"),
            Action::Bound { address, driver } => format!("bind {address} to {driver}"),
            Action::Probed {
                address,
                expect: Some(d),
            } => format!("probe drivers for {address} (expecting {d})"),
            Action::Probed {
                address,
                expect: None,
            } => format!("let the kernel choose a driver for {address}"),
            Action::NumVfs { pf, count } => format!("set sriov_numvfs of {pf} to {count}"),
            Action::Autoprobe { pf, on } => {
                format!("set sriov_drivers_autoprobe of {pf} to {}", u8::from(*on))
            }
        }
    }

    /// A shell command that performs the action by hand.
    pub fn manual(&self, s: &dyn Sysfs) -> String {
        let dev = |a: &PciAddress, f: &str| s.path(&a.sysfs_dir().join(f)).display().to_string();
        let drv = |d: &str, f: &str| s.path(&driver_dir(d).join(f)).display().to_string();
        match self {
            Action::Override { address, driver } => format!(
                "echo {} > {}",
                driver.as_deref().unwrap_or("\"\""),
                dev(address, "driver_override")
            ),
            Action::Unbound { address, driver } => {
                format!("echo {address} > {}", drv(driver, "unbind"))
            }
            Action::NoDriver { address } => {
                format!("echo {address} > {}", dev(address, "driver/unbind"))
            }
            Action::Bound { address, driver } => {
                format!("echo {address} > {}", drv(driver, "bind"))
            }
            Action::Probed { address, .. } => format!(
                "echo {address} > {}",
                s.path(Path::new(PCI_DRIVERS_PROBE)).display()
            ),
            Action::NumVfs { pf, count } => format!("echo {count} > {}", dev(pf, "sriov_numvfs")),
            Action::Autoprobe { pf, on } => format!(
                "echo {} > {}",
                u8::from(*on),
                dev(pf, "sriov_drivers_autoprobe")
            ),
        }
    }

    /// Brings sysfs to the action's state (nothing when it is there already)
    /// and checks that it got there; `true` when it changed something.
    pub fn apply(&self, s: &dyn Sysfs) -> Result<bool, PassthroughError> {
        match self {
            Action::Override { address, driver } => {
                let rel = address.sysfs_dir().join("driver_override");
                if PciDevice::read(s, *address)?.driver_override == *driver {
                    return Ok(false);
                }
                // An empty write clears the override.
                write(s, &rel, &format!("{}\n", driver.as_deref().unwrap_or("")))?;
                let now = PciDevice::read(s, *address)?.driver_override;
                if now != *driver {
                    return Err(no_effect(
                        self.describe(),
                        format!("it reads `{}`", now.as_deref().unwrap_or(NO_OVERRIDE)),
                        "check that the kernel supports driver_override (Linux 3.16 or later)",
                    ));
                }
                Ok(true)
            }
            Action::Unbound { address, driver } => {
                if current_driver(s, *address)?.as_deref() != Some(driver) {
                    return Ok(false);
                }
                write(s, &driver_dir(driver).join("unbind"), &address.to_string())?;
                let now = current_driver(s, *address)?;
                if now.is_some() {
                    return Err(no_effect(
                        self.describe(),
                        driver_text(&now),
                        "see `dmesg` for why the driver kept the device",
                    ));
                }
                Ok(true)
            }
            Action::NoDriver { address } => match current_driver(s, *address)? {
                None => Ok(false),
                Some(d) => Action::Unbound {
                    address: *address,
                    driver: d,
                }
                .apply(s),
            },
            Action::Bound { address, driver } => {
                let now = current_driver(s, *address)?;
                if now.as_deref() == Some(driver) {
                    return Ok(false);
                }
                if now.is_some() {
                    return Err(no_effect(
                        self.describe(),
                        driver_text(&now),
                        "unbind it from that driver first",
                    ));
                }
                if !s.exists(&driver_dir(driver)) {
                    return Err(PassthroughError::Refused(format!(
                        "cannot {}: the {driver} driver is not loaded; load it (`modprobe {}`) and retry",
                        self.describe(),
                        driver.replace('-', "_")
                    )));
                }
                write(s, &driver_dir(driver).join("bind"), &address.to_string())?;
                let now = current_driver(s, *address)?;
                if now.as_deref() != Some(driver) {
                    return Err(no_effect(
                        self.describe(),
                        driver_text(&now),
                        "see `dmesg` for the driver's reason",
                    ));
                }
                Ok(true)
            }
            Action::Probed { address, expect } => {
                let now = current_driver(s, *address)?;
                if now.is_some() && (expect.is_none() || now == *expect) {
                    return Ok(false);
                }
                write(s, Path::new(PCI_DRIVERS_PROBE), &address.to_string())?;
                let now = current_driver(s, *address)?;
                if expect.is_some() && now != *expect {
                    return Err(no_effect(
                        self.describe(),
                        driver_text(&now),
                        "check driver_override and that the driver is loaded; see `dmesg`",
                    ));
                }
                Ok(true)
            }
            Action::NumVfs { pf, count } => {
                let (enabled, _) = vf_state(s, *pf)?;
                if enabled == *count {
                    return Ok(false);
                }
                write(
                    s,
                    &pf.sysfs_dir().join("sriov_numvfs"),
                    &format!("{count}\n"),
                )?;
                let (enabled, links) = vf_state(s, *pf)?;
                if enabled != *count || links != *count as usize {
                    return Err(no_effect(
                        self.describe(),
                        format!("sriov_numvfs reads {enabled} and {links} VFs exist"),
                        "see `dmesg` for the driver's reason",
                    ));
                }
                Ok(true)
            }
            Action::Autoprobe { pf, on } => {
                let rel = pf.sysfs_dir().join("sriov_drivers_autoprobe");
                let read = |s: &dyn Sysfs| {
                    attr(s, &rel).map_err(|source| {
                        PassthroughError::Pci(vgpu_pci::PciError::Read {
                            path: s.path(&rel),
                            source,
                        })
                    })
                };
                let want = if *on { "1" } else { "0" };
                if read(s)?.as_deref() == Some(want) {
                    return Ok(false);
                }
                write(s, &rel, &format!("{want}\n"))?;
                let now = read(s)?;
                if now.as_deref() != Some(want) {
                    return Err(no_effect(
                        self.describe(),
                        format!("it reads `{}`", now.unwrap_or_default()),
                        "see `dmesg`",
                    ));
                }
                Ok(true)
            }
        }
    }
}

/// A change and how to take it back.
#[derive(Debug, Clone)]
pub struct Step {
    /// The change.
    pub action: Action,
    /// What restores the state before it, in order.
    pub undo: Vec<Action>,
}

impl Step {
    /// A step.
    pub fn new(action: Action, undo: Vec<Action>) -> Self {
        Self { action, undo }
    }
}

/// Steps that have been carried out; they can still be undone (when a
/// later, non-sysfs step such as saving the state file fails).
#[derive(Debug)]
pub struct Applied<'a> {
    sysfs: &'a dyn Sysfs,
    /// Each step with whether it changed something.
    steps: Vec<(Step, bool)>,
}

impl Applied<'_> {
    /// The steps that changed something, for messages.
    pub fn done(&self) -> Vec<String> {
        self.steps
            .iter()
            .filter(|(_, changed)| *changed)
            .map(|(s, _)| s.action.describe())
            .collect()
    }

    /// Undoes every step (last first) and turns `cause` into the error that
    /// says whether the host is back as it was.
    pub fn roll_back(self, cause: PassthroughError) -> PassthroughError {
        let mut undone = Vec::new();
        let mut failed = Vec::new();
        let mut manual = Vec::new();
        for (step, _) in self.steps.iter().rev() {
            for a in &step.undo {
                if !failed.is_empty() {
                    // After a failed undo, later undo actions may depend on
                    // it: leave them to the user, in order.
                    manual.push(a.manual(self.sysfs));
                    continue;
                }
                match a.apply(self.sysfs) {
                    Ok(true) => undone.push(a.describe()),
                    Ok(false) => {}
                    Err(e) => {
                        failed.push(format!("{}: {e}", a.describe()));
                        manual.push(a.manual(self.sysfs));
                    }
                }
            }
        }
        if failed.is_empty() {
            PassthroughError::RolledBack {
                cause: Box::new(cause),
                undone,
            }
        } else {
            PassthroughError::RollbackFailed {
                cause: Box::new(cause),
                failed,
                manual,
            }
        }
    }
}

/// Runs `steps` in order. When one fails, it and every earlier step are
/// undone and the error says so.
pub fn execute(s: &dyn Sysfs, steps: Vec<Step>) -> Result<Applied<'_>, PassthroughError> {
    let mut applied = Applied {
        sysfs: s,
        steps: Vec::with_capacity(steps.len()),
    };
    for step in steps {
        match step.action.apply(s) {
            Ok(changed) => applied.steps.push((step, changed)),
            Err(e) => {
                // The failed step may have half happened (a write accepted,
                // a check failed): undo it too; undo actions change nothing
                // when there is nothing to undo.
                applied.steps.push((step, true));
                return Err(applied.roll_back(e));
            }
        }
    }
    Ok(applied)
}
