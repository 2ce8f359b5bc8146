//! Virtual memory management (`cuMemCreate`, `cuMemAddressReserve`, `cuMemMap`, …).
//!
//! Physical memory is charged to the slice when it is created, mapped or not, and given
//! back when the last reference goes: the handles of every process of the VM that holds
//! one (created, retained or imported) and every mapping of it. Reserved address space is
//! bounded per VM ([`va_limit`]). Physical memory is shared only within its VM: an export
//! is a random token that only sessions of the same VM can import.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use vgpu_proto::msg::{self, Request};

use super::super::{Session, reply};
use crate::device::{DeviceContext, VMM_GRANULARITY};
use crate::error::CuError;
use crate::handles::{HandleKind, HandleTable};
use crate::memory::{AllocKind, Allocation};
use crate::tenant::Tenant;
use crate::usage::UsageKind;

/// `CU_MEM_ACCESS_FLAGS_PROT_READ`.
pub const ACCESS_READ: u32 = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub const ACCESS_READWRITE: u32 = 3;

/// Most address space one VM may reserve: 16 times its slice, at least 64 GiB.
pub fn va_limit(slice: u64) -> u64 {
    slice.saturating_mul(16).max(64 << 30)
}

/// Physical memory of a VM, shared by the handles and mappings that refer to it.
pub(in crate::session) struct PhysMem {
    id: u64,
    size: u64,
    tenant: Arc<Tenant>,
    dev: Arc<dyn DeviceContext>,
    token: Mutex<Option<u128>>,
}

impl std::fmt::Debug for PhysMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhysMem")
            .field("id", &self.id)
            .field("size", &self.size)
            .finish()
    }
}

impl Drop for PhysMem {
    fn drop(&mut self) {
        if let Err(e) = self.dev.phys_release(self.id) {
            tracing::warn!(tenant = %self.tenant.name, error = %e, "device refused to release physical memory");
        }
        self.tenant.slice.refund(self.size);
        self.tenant.usage.sub(UsageKind::VmmPhysical, self.size);
        if let Some(t) = *self.token.lock().unwrap_or_else(|p| p.into_inner()) {
            exports().remove(&t);
        }
    }
}

/// Exported physical memory of every VM: token → (VM, memory).
type Exports = HashMap<u128, (String, Weak<PhysMem>)>;

fn exports() -> std::sync::MutexGuard<'static, Exports> {
    static E: OnceLock<Mutex<Exports>> = OnceLock::new();
    E.get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

pub(super) fn random_token() -> u128 {
    let mut b = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b = (t ^ (std::process::id() as u128) << 64).to_le_bytes();
    }
    u128::from_le_bytes(b)
}

#[derive(Debug)]
struct Mapping {
    size: u64,
    mem: Arc<PhysMem>,
    access: u32,
}

/// A session's handles, reservations and mappings.
#[derive(Debug)]
pub(in crate::session) struct VmmState {
    handles: HandleTable<(Arc<PhysMem>, u32)>,
    reserved: BTreeMap<u64, u64>,
    mappings: BTreeMap<u64, Mapping>,
}

impl VmmState {
    /// Counts the allocation handles against `budget`.
    pub(in crate::session) fn set_budget(&mut self, budget: crate::limits::HandleBudget) {
        self.handles.set_budget(budget);
    }
}

impl Default for VmmState {
    fn default() -> Self {
        Self {
            handles: HandleTable::new(HandleKind::MemHandle),
            reserved: BTreeMap::new(),
            mappings: BTreeMap::new(),
        }
    }
}

fn granular(size: u64, what: &str) -> Result<(), CuError> {
    if size == 0 || !size.is_multiple_of(VMM_GRANULARITY) {
        return Err(CuError::invalid_value(format!(
            "{what} of {size} bytes is not a non-zero multiple of the allocation granularity ({VMM_GRANULARITY})"
        )));
    }
    Ok(())
}

impl Session {
    /// The VMM requests; `None` for other requests.
    pub(in crate::session) fn dispatch_vmm(
        &mut self,
        req: &Request,
        out: &mut Vec<u8>,
    ) -> Option<Result<(), CuError>> {
        use Request as R;
        Some(match req {
            R::MemCreate(m) => self
                .mem_create(m.ctx, m.size)
                .and_then(|handle| reply(out, msg::Handle { handle })),
            R::MemRelease(m) => self
                .mem_release(m.handle)
                .and_then(|()| reply(out, msg::Empty {})),
            R::MemAddressReserve(m) => self
                .va_reserve(m.ctx, m.size, m.align)
                .and_then(|ptr| reply(out, msg::Ptr { ptr })),
            R::MemAddressFree(m) => self
                .va_free(m.ptr, m.size)
                .and_then(|()| reply(out, msg::Empty {})),
            R::MemMap(m) => self
                .mem_map(m.ptr, m.size, m.offset, m.handle)
                .and_then(|()| reply(out, msg::Empty {})),
            R::MemUnmap(m) => self
                .mem_unmap(m.ptr, m.size)
                .and_then(|()| reply(out, msg::Empty {})),
            R::MemSetAccess(m) => self
                .mem_set_access(m.ptr, m.size, m.flags)
                .and_then(|()| reply(out, msg::Empty {})),
            R::MemGetAccess(m) => self.mapping_at(m.ptr).and_then(|(_, mp)| {
                let value = mp.access as i32;
                reply(out, msg::Value { value })
            }),
            R::MemRetainAllocationHandle(m) => self
                .mem_retain(m.ptr)
                .and_then(|handle| reply(out, msg::Handle { handle })),
            R::MemGetAllocationSize(m) => self.phys(m.handle).and_then(|p| {
                let bytes = p.size;
                reply(out, msg::Bytes { bytes })
            }),
            R::MemExport(m) => self.mem_export(m.handle).and_then(|t| {
                reply(
                    out,
                    msg::Token {
                        hi: (t >> 64) as u64,
                        lo: t as u64,
                    },
                )
            }),
            R::MemImport(m) => self
                .mem_import((u128::from(m.hi) << 64) | u128::from(m.lo))
                .and_then(|handle| reply(out, msg::Handle { handle })),
            _ => return None,
        })
    }

    fn phys(&self, h: u64) -> Result<&Arc<PhysMem>, CuError> {
        self.ext.vmm.handles.get(h).map(|(p, _)| p).ok_or_else(|| {
            CuError::invalid_value(format!(
                "{h:#x} is not a memory allocation handle of this process"
            ))
        })
    }

    fn add_handle(&mut self, mem: Arc<PhysMem>) -> Result<u64, CuError> {
        let existing = self
            .ext
            .vmm
            .handles
            .iter()
            .find(|(_, (p, _))| Arc::ptr_eq(p, &mem))
            .map(|(h, _)| h);
        if let Some(h) = existing {
            if let Some(e) = self.ext.vmm.handles.get_mut(h) {
                e.1 = e.1.saturating_add(1);
            }
            return Ok(h);
        }
        self.ext.vmm.handles.insert((mem, 1))
    }

    fn mem_create(&mut self, ctx: u64, size: u64) -> Result<u64, CuError> {
        self.ctx(ctx)?;
        granular(size, "cuMemCreate")?;
        self.tenant.slice.charge(size)?;
        let id = match self.dev.phys_create(size) {
            Ok(id) => id,
            Err(e) => {
                self.tenant.slice.refund(size);
                return Err(e.into());
            }
        };
        self.tenant.usage.add(UsageKind::VmmPhysical, size);
        let mem = Arc::new(PhysMem {
            id,
            size,
            tenant: Arc::clone(&self.tenant),
            dev: Arc::clone(&self.dev),
            token: Mutex::new(None),
        });
        // Held by the session for its memory figure; the charge is the PhysMem's.
        let h = self.add_handle(mem)?;
        self.vmm_note_memory();
        Ok(h)
    }

    fn mem_release(&mut self, h: u64) -> Result<(), CuError> {
        self.phys(h)?;
        let last = {
            let e = self
                .ext
                .vmm
                .handles
                .get_mut(h)
                .expect("handle just checked");
            e.1 -= 1;
            e.1 == 0
        };
        if last {
            // Mapped memory stays alive through its mappings.
            self.ext.vmm.handles.remove(h);
        }
        self.vmm_note_memory();
        Ok(())
    }

    fn va_reserve(&mut self, ctx: u64, size: u64, align: u64) -> Result<u64, CuError> {
        self.ctx(ctx)?;
        granular(size, "cuMemAddressReserve")?;
        let align = if align == 0 { VMM_GRANULARITY } else { align };
        if !align.is_power_of_two() || align > 1 << 40 {
            return Err(CuError::invalid_value(format!(
                "alignment {align} is not a power of two"
            )));
        }
        let limit = va_limit(self.tenant.slice.limit());
        if !self.tenant.usage.reserve_va(size, limit) {
            return Err(CuError::out_of_memory(format!(
                "this VM may reserve at most {limit} bytes of address space"
            )));
        }
        let addr = match self.dev.va_reserve(size, align.max(VMM_GRANULARITY)) {
            Ok(a) => a,
            Err(e) => {
                self.tenant.usage.release_va(size);
                return Err(e.into());
            }
        };
        self.ext.vmm.reserved.insert(addr, size);
        Ok(addr)
    }

    fn va_free(&mut self, ptr: u64, size: u64) -> Result<(), CuError> {
        if self.ext.vmm.reserved.get(&ptr) != Some(&size) {
            return Err(CuError::invalid_value(format!(
                "{ptr:#x}+{size} is not an address reservation of this process"
            )));
        }
        if self
            .ext
            .vmm
            .mappings
            .range(ptr..ptr.saturating_add(size))
            .next()
            .is_some()
        {
            return Err(CuError::invalid_value(
                "the reservation still has mappings: unmap them first",
            ));
        }
        self.dev.va_free(ptr, size).map_err(CuError::from)?;
        self.ext.vmm.reserved.remove(&ptr);
        self.tenant.usage.release_va(size);
        Ok(())
    }

    fn mem_map(&mut self, ptr: u64, size: u64, offset: u64, h: u64) -> Result<(), CuError> {
        let mem = Arc::clone(self.phys(h)?);
        if offset != 0 || size != mem.size {
            return Err(CuError::not_supported(
                "cuMemMap maps whole physical allocations here (offset 0, the allocation's size)",
            ));
        }
        let inside = self
            .ext
            .vmm
            .reserved
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &l)| ptr.checked_add(size).is_some_and(|e| e <= b + l));
        if !inside {
            return Err(CuError::invalid_value(format!(
                "{ptr:#x}+{size} is not inside an address reservation of this process"
            )));
        }
        self.dev
            .map(ptr, size, mem.id)
            .map_err(|e| CuError::invalid_value(format!("cannot map at {ptr:#x}: {e}")))?;
        self.ext.vmm.mappings.insert(
            ptr,
            Mapping {
                size,
                mem,
                access: 0,
            },
        );
        Ok(())
    }

    fn mappings_in(&self, ptr: u64, size: u64) -> Result<Vec<u64>, CuError> {
        let end = ptr
            .checked_add(size)
            .ok_or_else(|| CuError::invalid_value("range overflows"))?;
        let mut at = ptr;
        let mut found = Vec::new();
        for (&b, m) in self.ext.vmm.mappings.range(ptr..end) {
            if b != at {
                break;
            }
            found.push(b);
            at = b + m.size;
        }
        if at != end || found.is_empty() {
            return Err(CuError::invalid_value(format!(
                "{ptr:#x}+{size} is not made of whole mappings of this process"
            )));
        }
        Ok(found)
    }

    fn mem_unmap(&mut self, ptr: u64, size: u64) -> Result<(), CuError> {
        let bases = self.mappings_in(ptr, size)?;
        // Queued work may still use the memory.
        self.engine.drain()?;
        for b in bases {
            self.allocs.remove(b);
            if let Some(m) = self.ext.vmm.mappings.remove(&b)
                && let Err(e) = self.dev.unmap(b, m.size)
            {
                tracing::warn!(session = self.info.id, error = %e, "device refused to unmap {b:#x}");
            }
        }
        self.vmm_note_memory();
        Ok(())
    }

    fn mem_set_access(&mut self, ptr: u64, size: u64, flags: u32) -> Result<(), CuError> {
        if !matches!(flags, 0 | ACCESS_READ | ACCESS_READWRITE) {
            return Err(CuError::invalid_value(format!(
                "unknown access flags {flags:#x}"
            )));
        }
        for b in self.mappings_in(ptr, size)? {
            let m = self
                .ext
                .vmm
                .mappings
                .get_mut(&b)
                .expect("mapping just found");
            m.access = flags;
            let msize = m.size;
            self.allocs.remove(b);
            if flags != 0 {
                self.allocs.insert(
                    b,
                    Allocation {
                        size: msize,
                        charged: 0,
                        ctx: crate::engine::NO_CONTEXT,
                        kind: AllocKind::VmmMapping,
                    },
                );
            }
        }
        Ok(())
    }

    /// Whether `[ptr, ptr + size)` lies in one address reservation of this process.
    pub(in crate::session) fn va_is_reserved(&self, ptr: u64, size: u64) -> bool {
        self.ext
            .vmm
            .reserved
            .range(..=ptr)
            .next_back()
            .is_some_and(|(b, s)| ptr.checked_add(size).is_some_and(|e| e <= b + s))
    }

    /// Whether memory is mapped at `ptr`.
    pub(in crate::session) fn va_is_mapped(&self, ptr: u64) -> bool {
        self.mapping_at(ptr).is_ok()
    }

    fn mapping_at(&self, ptr: u64) -> Result<(u64, &Mapping), CuError> {
        self.ext
            .vmm
            .mappings
            .range(..=ptr)
            .next_back()
            .filter(|(b, m)| ptr - **b < m.size)
            .map(|(b, m)| (*b, m))
            .ok_or_else(|| {
                CuError::invalid_value(format!("{ptr:#x} is not mapped by this process"))
            })
    }

    fn mem_retain(&mut self, ptr: u64) -> Result<u64, CuError> {
        let mem = Arc::clone(&self.mapping_at(ptr)?.1.mem);
        self.add_handle(mem)
    }

    fn mem_export(&mut self, h: u64) -> Result<u128, CuError> {
        let mem = Arc::clone(self.phys(h)?);
        let mut t = mem.token.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = *t {
            return Ok(t);
        }
        let token = random_token();
        exports().insert(token, (self.tenant.name.clone(), Arc::downgrade(&mem)));
        *t = Some(token);
        Ok(token)
    }

    fn mem_import(&mut self, token: u128) -> Result<u64, CuError> {
        let found = exports().get(&token).cloned();
        let mem = match found {
            Some((vm, _)) if vm != self.tenant.name => {
                return Err(CuError::invalid_value(
                    "this memory was exported by another VM: memory is never shared between VMs",
                ));
            }
            Some((_, w)) => w.upgrade(),
            None => None,
        };
        let mem = mem.ok_or_else(|| {
            CuError::invalid_value(
                "no memory of this VM was exported under this handle (or it was released)",
            )
        })?;
        let h = self.add_handle(mem)?;
        self.vmm_note_memory();
        Ok(h)
    }

    /// The session's memory figure counts physical memory it holds handles or mappings of.
    fn vmm_note_memory(&mut self) {
        let mut seen: Vec<*const PhysMem> = Vec::new();
        let mut held = 0;
        let mems = self
            .ext
            .vmm
            .handles
            .iter()
            .map(|(_, (p, _))| p)
            .chain(self.ext.vmm.mappings.values().map(|m| &m.mem));
        for p in mems {
            let k = Arc::as_ptr(p);
            if !seen.contains(&k) {
                seen.push(k);
                held += p.size;
            }
        }
        self.allocs.unhold(self.ext.vmm_held);
        self.allocs.hold(held);
        self.ext.vmm_held = held;
        self.store_memory();
    }

    /// Unmaps, unreserves and drops every handle (the session ended; its work was discarded).
    pub(in crate::session) fn release_vmm(&mut self) {
        let maps = std::mem::take(&mut self.ext.vmm.mappings);
        for (b, m) in maps {
            self.allocs.remove(b);
            if let Err(e) = self.dev.unmap(b, m.size) {
                tracing::warn!(session = self.info.id, error = %e, "device refused to unmap {b:#x}");
            }
        }
        for (addr, size) in std::mem::take(&mut self.ext.vmm.reserved) {
            if let Err(e) = self.dev.va_free(addr, size) {
                tracing::warn!(session = self.info.id, error = %e, "device refused to free a reservation");
            }
            self.tenant.usage.release_va(size);
        }
        self.ext.vmm.handles.clear();
        self.vmm_note_memory();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_space_bound_grows_with_the_slice() {
        assert_eq!(va_limit(1 << 30), 64 << 30);
        assert_eq!(va_limit(8 << 30), 128 << 30);
        assert_eq!(va_limit(u64::MAX), u64::MAX);
    }

    #[test]
    fn sizes_must_be_granular() {
        assert!(granular(VMM_GRANULARITY, "x").is_ok());
        assert!(granular(0, "x").is_err());
        assert!(granular(VMM_GRANULARITY + 1, "x").is_err());
    }
}
