//! The vgpu broker: the one place every guest CUDA call passes through.
//!
//! It holds the tenants (one per VM) with their memory slices, runs one
//! [`session::Session`] per guest process with that process's handle tables
//! and allocations, validates every pointer and handle, charges every
//! allocation before it happens, and drives a [`device::Device`] — the
//! simulated GPU or a real one — through the transport-independent session
//! loop in [`server`].

pub mod config;
pub mod device;
pub mod engine;
pub mod error;
pub mod handles;
pub mod memory;
pub mod server;
pub mod session;
pub mod size;
pub mod tenant;
#[doc(hidden)]
pub mod testutils;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use thiserror::Error;

use crate::config::VmConfig;
use crate::device::Device;
use crate::tenant::Tenant;

pub use error::CuError;

/// Why a tenant could not be added.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BrokerError {
    /// A tenant with that name exists.
    #[error("a VM named `{0}` already exists")]
    DuplicateTenant(String),
    /// The VM names an unknown device.
    #[error("VM `{vm}` names device `{device}`, which does not exist")]
    UnknownDevice {
        /// VM name.
        vm: String,
        /// Device name.
        device: String,
    },
}

/// Devices and tenants.
pub struct Broker {
    devices: Vec<(String, Arc<dyn Device>)>,
    tenants: RwLock<BTreeMap<String, Arc<Tenant>>>,
    next_session: AtomicU64,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field(
                "devices",
                &self.devices.iter().map(|d| &d.0).collect::<Vec<_>>(),
            )
            .field("tenants", &self.tenant_names())
            .finish()
    }
}

impl Broker {
    /// A broker over named devices.
    pub fn new(devices: Vec<(String, Arc<dyn Device>)>) -> Self {
        Self {
            devices,
            tenants: RwLock::new(BTreeMap::new()),
            next_session: AtomicU64::new(1),
        }
    }

    /// The named device.
    pub fn device(&self, name: &str) -> Option<&Arc<dyn Device>> {
        self.devices.iter().find(|d| d.0 == name).map(|d| &d.1)
    }

    /// All devices with their names.
    pub fn devices(&self) -> &[(String, Arc<dyn Device>)] {
        &self.devices
    }

    /// Adds a tenant for a VM entry.
    pub fn add_tenant(&self, vm: &VmConfig) -> Result<Arc<Tenant>, BrokerError> {
        let device = self
            .device(&vm.device)
            .ok_or_else(|| BrokerError::UnknownDevice {
                vm: vm.name.clone(),
                device: vm.device.clone(),
            })?;
        let mut t = self.tenants.write().unwrap_or_else(|p| p.into_inner());
        if t.contains_key(&vm.name) {
            return Err(BrokerError::DuplicateTenant(vm.name.clone()));
        }
        let tenant = Arc::new(Tenant::new(vm, Arc::clone(device)));
        t.insert(vm.name.clone(), Arc::clone(&tenant));
        Ok(tenant)
    }

    /// Removes a tenant; it refuses new sessions, and its live sessions keep
    /// their resources until they end.
    pub fn remove_tenant(&self, name: &str) -> Option<Arc<Tenant>> {
        let t = self
            .tenants
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)?;
        t.close();
        Some(t)
    }

    /// The named tenant.
    pub fn tenant(&self, name: &str) -> Option<Arc<Tenant>> {
        self.tenants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// All tenants, by name.
    pub fn tenants(&self) -> Vec<Arc<Tenant>> {
        self.tenants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn tenant_names(&self) -> Vec<String> {
        self.tenants().iter().map(|t| t.name.clone()).collect()
    }

    /// A fresh session id.
    pub fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }
}
