//! Per-VM budgets for what a guest can make vgpud hold besides device memory:
//! sessions, connections, loaded modules and their image bytes.
//!
//! Each has a safe default; a config's `[limits]` table changes the default
//! for every VM, and a VM's `[vm.limits]` table overrides it for that VM
//! (docs/admin.md). Past a budget the guest gets the CUDA error a real driver
//! gives for running out of that resource, and no other VM notices.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_proto::cuda;

use crate::error::CuError;

/// Default sessions (guest processes) a VM may have at once.
pub const DEFAULT_SESSIONS: u32 = 1024;
/// Default connections a VM may hold at once, greeted or not.
pub const DEFAULT_CONNECTIONS: u32 = 1024;
/// Default modules a VM's sessions may have loaded at once.
pub const DEFAULT_MODULES: u32 = 4096;
/// Default bytes of module images a VM's sessions may have loaded at once.
pub const DEFAULT_MODULE_BYTES: u64 = 1 << 30;
/// Largest `sessions` or `connections` a config may set: each costs vgpud a thread.
pub const MAX_SESSIONS: u32 = 4096;
/// Largest `modules` a config may set.
pub const MAX_MODULES: u32 = 1 << 20;
/// Largest `module_bytes` a config may set.
pub const MAX_MODULE_BYTES: u64 = 64 << 30;

/// A VM's budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmLimits {
    /// Sessions at once (`sessions`).
    pub sessions: u32,
    /// Connections at once, greeted or not (`connections`).
    pub connections: u32,
    /// Modules loaded at once across the VM's sessions (`modules`).
    pub modules: u32,
    /// Bytes of module images loaded at once across the VM's sessions (`module_bytes`).
    pub module_bytes: u64,
}

impl Default for VmLimits {
    fn default() -> Self {
        VmLimits {
            sessions: DEFAULT_SESSIONS,
            connections: DEFAULT_CONNECTIONS,
            modules: DEFAULT_MODULES,
            module_bytes: DEFAULT_MODULE_BYTES,
        }
    }
}

/// What a VM's sessions hold against [`VmLimits`], and the limits themselves
/// (changed live by the admin API and reloads).
#[derive(Debug, Default)]
pub struct LimitUse {
    inner: Mutex<(VmLimits, ModuleUse)>,
    /// Refusals so far, by [`Budget`].
    refused: [AtomicU64; Budget::ALL.len()],
}

/// One of a VM's budgets besides memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// `limits.sessions`.
    Sessions,
    /// `limits.connections`.
    Connections,
    /// `limits.modules`.
    Modules,
    /// `limits.module_bytes`.
    ModuleBytes,
}

impl Budget {
    /// Every budget, in the order the API and metrics list them.
    pub const ALL: [Budget; 4] = [
        Budget::Sessions,
        Budget::Connections,
        Budget::Modules,
        Budget::ModuleBytes,
    ];

    /// The budget's config key (under `[limits]`).
    pub fn key(self) -> &'static str {
        match self {
            Budget::Sessions => "sessions",
            Budget::Connections => "connections",
            Budget::Modules => "modules",
            Budget::ModuleBytes => "module_bytes",
        }
    }
}

/// Modules loaded by a VM's sessions.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ModuleUse {
    /// Modules loaded.
    pub count: u32,
    /// Bytes of their images.
    pub bytes: u64,
}

impl LimitUse {
    /// Budgets `limits`, nothing held.
    pub fn new(limits: VmLimits) -> Self {
        LimitUse {
            inner: Mutex::new((limits, ModuleUse::default())),
            refused: Default::default(),
        }
    }

    /// Counts a request refused for passing `budget`.
    pub fn note_refused(&self, budget: Budget) {
        self.refused[budget as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests refused so far for passing `budget`.
    pub fn refused(&self, budget: Budget) -> u64 {
        self.refused[budget as usize].load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (VmLimits, ModuleUse)> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The budgets.
    pub fn limits(&self) -> VmLimits {
        self.lock().0
    }

    /// Replaces the budgets; what is already held stays (new loads are refused
    /// until use falls below a lowered budget).
    pub fn set_limits(&self, limits: VmLimits) {
        self.lock().0 = limits;
    }

    /// Modules held now.
    pub fn modules(&self) -> ModuleUse {
        self.lock().1
    }

    /// Charges a module of `bytes` image bytes, or says which budget it passes
    /// (`CUDA_ERROR_OUT_OF_MEMORY`, as a driver out of room for a module says).
    pub fn charge_module(&self, vm: &str, bytes: u64) -> Result<(), CuError> {
        let mut g = self.lock();
        let (limits, held) = *g;
        if held.count >= limits.modules {
            self.note_refused(Budget::Modules);
            return Err(CuError::new(
                cuda::CUDA_ERROR_OUT_OF_MEMORY,
                format!(
                    "VM `{vm}` already has {} modules loaded, its limit (limits.modules); unload one first",
                    held.count
                ),
            ));
        }
        let total = held.bytes.saturating_add(bytes);
        if total > limits.module_bytes {
            self.note_refused(Budget::ModuleBytes);
            return Err(CuError::new(
                cuda::CUDA_ERROR_OUT_OF_MEMORY,
                format!(
                    "a module of {bytes} bytes would bring VM `{vm}`'s loaded module images to \
                     {total} bytes, past its limit of {} (limits.module_bytes)",
                    limits.module_bytes
                ),
            ));
        }
        g.1 = ModuleUse {
            count: held.count + 1,
            bytes: total,
        };
        Ok(())
    }

    /// Returns a module charged by [`charge_module`](Self::charge_module).
    pub fn refund_module(&self, bytes: u64) {
        let mut g = self.lock();
        g.1.count = g.1.count.saturating_sub(1);
        g.1.bytes = g.1.bytes.saturating_sub(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_are_charged_by_count_and_bytes_and_refunded() {
        let use_ = LimitUse::new(VmLimits {
            modules: 2,
            module_bytes: 100,
            ..VmLimits::default()
        });
        use_.charge_module("vm1", 60).unwrap();
        let e = use_.charge_module("vm1", 41).unwrap_err();
        assert_eq!(e.code, cuda::CUDA_ERROR_OUT_OF_MEMORY);
        assert!(e.message.contains("limits.module_bytes"), "{}", e.message);
        use_.charge_module("vm1", 40).unwrap();
        let e = use_.charge_module("vm1", 0).unwrap_err();
        assert!(e.message.contains("limits.modules"), "{}", e.message);
        use_.refund_module(60);
        assert_eq!(
            use_.modules(),
            ModuleUse {
                count: 1,
                bytes: 40
            }
        );
        use_.charge_module("vm1", 60).unwrap();
        // A lowered budget refuses new loads but keeps what is held.
        use_.set_limits(VmLimits {
            modules: 1,
            ..use_.limits()
        });
        assert!(use_.charge_module("vm1", 1).is_err());
        assert_eq!(use_.modules().count, 2);
    }
}
