//! Per-session handle tables. A handle is what the guest holds as a
//! `CUcontext`, `CUstream`, `CUevent`, `CUmodule` or `CUfunction`:
//!
//! ```text
//! bits 63..47  zero: a handle looks like a user-space pointer, as real
//!              CUDA handles are (positive as a signed 64-bit value, which
//!              bindings such as cuda-python require)
//! bits 46..40  kind tag (never 0, so no handle is NULL or a small integer)
//! bits 39..16  generation of the slot (a stale handle never matches a reused slot)
//! bits 15..0   slot index
//! ```
//!
//! Handles are only meaningful within their session: a guest cannot name
//! another session's (or tenant's) objects, and a forged or stale value is
//! refused.
//!
//! A table may count its live handles against one of its VM's budgets
//! ([`HandleTable::budgeted`]): a handle is charged when inserted and returned
//! when removed, and whatever is still live when the table goes (the session
//! ends) is returned then, so nothing leaks from the VM's budget.

use crate::error::CuError;
use crate::limits::HandleBudget;

/// What a handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum HandleKind {
    /// `CUcontext`.
    Context = 0x4C,
    /// `CUstream`.
    Stream = 0x51,
    /// `CUevent`.
    Event = 0x6E,
    /// `CUmodule`.
    Module = 0x3D,
    /// `CUfunction`.
    Function = 0x7F,
    /// `CUmemoryPool`.
    MemPool = 0x2A,
    /// `CUmemGenericAllocationHandle`.
    MemHandle = 0x35,
    /// `CUgraphExec` (the host's part of one; the shim holds the rest).
    GraphExec = 0x67,
    /// A shared region of page-locked host memory (`HostShare`).
    HostShare = 0x48,
    /// An allocation exported or opened by `cuIpcGetMemHandle`/`cuIpcOpenMemHandle`.
    IpcMem = 0x49,
    /// An event exported or opened by `cuIpcGetEventHandle`/`cuIpcOpenEventHandle`.
    IpcEvent = 0x4a,
    /// A memory pool or pool block exported or imported (`cuMemPoolExport*`/`cuMemPoolImport*`).
    PoolShare = 0x4b,
}

impl HandleKind {
    /// What the handles name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            HandleKind::Context => "contexts",
            HandleKind::Stream => "streams",
            HandleKind::Event => "events",
            HandleKind::Module => "modules",
            HandleKind::Function => "functions",
            HandleKind::MemPool => "memory pools",
            HandleKind::MemHandle => "allocation handles",
            HandleKind::GraphExec => "executable graphs",
            HandleKind::HostShare => "shared host regions",
            HandleKind::IpcMem => "interprocess memory handles",
            HandleKind::IpcEvent => "interprocess event handles",
            HandleKind::PoolShare => "shared memory pool handles",
        }
    }
}

const INDEX_BITS: u32 = 16;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const GEN_MASK: u64 = 0x00FF_FFFF;
const KIND_SHIFT: u32 = 40;

/// Largest number of live entries in one table; a flood of creations past it
/// gets `CUDA_ERROR_OUT_OF_MEMORY` instead of growing the daemon. Every slot
/// index fits the handle's index bits.
pub const MAX_ENTRIES: usize = 1 << INDEX_BITS;

struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// A table of objects of one kind, addressed by handles.
pub struct HandleTable<T> {
    kind: HandleKind,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
    budget: Option<HandleBudget>,
}

impl<T> std::fmt::Debug for HandleTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleTable")
            .field("kind", &self.kind)
            .field("live", &self.live)
            .field("budget", &self.budget.as_ref().map(|b| b.budget))
            .finish()
    }
}

impl<T> HandleTable<T> {
    /// An empty table for `kind` handles.
    pub fn new(kind: HandleKind) -> Self {
        Self {
            kind,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            budget: None,
        }
    }

    /// An empty table for `kind` handles, each charged to `budget` while live.
    pub fn budgeted(kind: HandleKind, budget: HandleBudget) -> Self {
        let mut t = Self::new(kind);
        t.budget = Some(budget);
        t
    }

    /// Counts the table's handles against `budget` from now on (the live ones
    /// are charged at once, even past the budget: they exist already).
    pub fn set_budget(&mut self, budget: HandleBudget) {
        self.return_budget();
        budget.use_.force_charge(budget.budget, self.live as u64);
        self.budget = Some(budget);
    }

    fn return_budget(&mut self) {
        if let Some(b) = &self.budget {
            b.use_.refund(b.budget, self.live as u64);
        }
    }

    /// Removes every entry (returning them to the budget).
    pub fn clear(&mut self) {
        self.return_budget();
        self.slots.clear();
        self.free.clear();
        self.live = 0;
    }

    fn encode(&self, index: u32, generation: u32) -> u64 {
        ((self.kind as u64) << KIND_SHIFT)
            | ((u64::from(generation) & GEN_MASK) << INDEX_BITS)
            | u64::from(index)
    }

    fn decode(&self, handle: u64) -> Option<(usize, u32)> {
        if handle >> KIND_SHIFT != self.kind as u64 {
            return None;
        }
        let generation = ((handle >> INDEX_BITS) & GEN_MASK) as u32;
        let index = (handle & INDEX_MASK) as usize;
        let slot = self.slots.get(index)?;
        (slot.generation == generation && slot.value.is_some()).then_some((index, generation))
    }

    /// Inserts a value; `CUDA_ERROR_OUT_OF_MEMORY` when the table is full or
    /// the VM's budget for the kind is spent (the refusal is counted).
    pub fn insert(&mut self, value: T) -> Result<u64, CuError> {
        if self.live >= MAX_ENTRIES {
            return Err(CuError::out_of_memory(format!(
                "too many {} in this process (at most {MAX_ENTRIES})",
                self.kind.name()
            )));
        }
        if let Some(b) = &self.budget {
            b.use_.charge(b.budget, 1)?;
        }
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    value: None,
                });
                // Below MAX_ENTRIES (checked above), so it fits the index bits.
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = (slot.generation + 1) & GEN_MASK as u32;
        slot.value = Some(value);
        let generation = slot.generation;
        self.live += 1;
        Ok(self.encode(index, generation))
    }

    /// The value a handle names.
    pub fn get(&self, handle: u64) -> Option<&T> {
        let (i, _) = self.decode(handle)?;
        self.slots[i].value.as_ref()
    }

    /// The value a handle names, mutably.
    pub fn get_mut(&mut self, handle: u64) -> Option<&mut T> {
        let (i, _) = self.decode(handle)?;
        self.slots[i].value.as_mut()
    }

    /// Removes and returns the value a handle names.
    pub fn remove(&mut self, handle: u64) -> Option<T> {
        let (i, _) = self.decode(handle)?;
        let v = self.slots[i].value.take();
        self.free.push(i as u32);
        self.live -= 1;
        if let Some(b) = &self.budget {
            b.use_.refund(b.budget, 1);
        }
        v
    }

    /// Number of live entries.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Live entries with their handles.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            s.value
                .as_ref()
                .map(|v| (self.encode(i as u32, s.generation), v))
        })
    }

    /// Handles of the live entries for which `f` holds.
    pub fn handles_where(&self, mut f: impl FnMut(&T) -> bool) -> Vec<u64> {
        self.iter().filter(|(_, v)| f(v)).map(|(h, _)| h).collect()
    }
}

impl<T> Drop for HandleTable<T> {
    fn drop(&mut self) {
        self.return_budget();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_tagged_and_never_null() {
        let mut t = HandleTable::new(HandleKind::Stream);
        let h = t.insert("a").unwrap();
        assert_ne!(h, 0);
        assert_eq!(h >> 40, 0x51);
        // Like a user-space pointer: positive as i64, below 2^47.
        assert!(h < 1 << 47 && (h as i64) > 0);
        assert_eq!(t.get(h), Some(&"a"));
    }

    #[test]
    fn stale_handles_do_not_match_a_reused_slot() {
        let mut t = HandleTable::new(HandleKind::Event);
        let h1 = t.insert(1).unwrap();
        assert_eq!(t.remove(h1), Some(1));
        let h2 = t.insert(2).unwrap();
        assert_ne!(h1, h2);
        assert_eq!(t.get(h1), None);
        assert_eq!(t.remove(h1), None);
        assert_eq!(t.get(h2), Some(&2));
    }

    #[test]
    fn forged_handles_are_refused() {
        let mut t = HandleTable::new(HandleKind::Context);
        let h = t.insert(()).unwrap();
        for forged in [
            0,
            1,
            h + 1,
            h ^ (1 << 40),
            h | (1 << 63),
            (HandleKind::Stream as u64) << 40,
            u64::MAX,
        ] {
            assert!(t.get(forged).is_none(), "{forged:#x}");
        }
        // Same index and generation, other kind: still refused.
        let other = HandleTable::<()>::new(HandleKind::Module);
        assert!(other.get(h).is_none());
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = HandleTable::new(HandleKind::Event);
        for _ in 0..MAX_ENTRIES {
            t.insert(()).unwrap();
        }
        assert!(t.insert(()).is_err());
        assert_eq!(t.len(), MAX_ENTRIES);
    }

    #[test]
    fn a_budgeted_table_charges_live_handles_and_returns_them() {
        use std::sync::Arc;

        use crate::limits::LimitUse;
        use vgpu_config::limits::{Budget, VmLimits};

        let vm = Arc::new(LimitUse::new(VmLimits {
            streams: 3,
            ..VmLimits::default()
        }));
        let budget = || HandleBudget {
            use_: Arc::clone(&vm),
            budget: Budget::Streams,
        };
        let mut a = HandleTable::budgeted(HandleKind::Stream, budget());
        let mut b = HandleTable::budgeted(HandleKind::Stream, budget());
        let h = a.insert(1).unwrap();
        a.insert(2).unwrap();
        b.insert(3).unwrap();
        // The budget is the VM's: the two tables share it.
        let e = b.insert(4).unwrap_err();
        assert_eq!(e.code, vgpu_proto::cuda::CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(vm.refused(Budget::Streams), 1);
        // A removal makes room; a forged removal returns nothing.
        assert!(a.remove(h ^ (1 << INDEX_BITS)).is_none());
        a.remove(h).unwrap();
        assert_eq!(vm.used(Budget::Streams), 2);
        b.insert(4).unwrap();
        // Far past the budget in create/destroy pairs: nothing leaks.
        for _ in 0..10_000 {
            b.clear();
            b.insert(5).unwrap();
            let h = b.insert(6).unwrap();
            b.remove(h).unwrap();
        }
        assert_eq!(vm.used(Budget::Streams), 2);
        // A dropped table (an ended session) returns what it held.
        drop(a);
        assert_eq!(vm.used(Budget::Streams), 1);
        drop(b);
        assert_eq!(vm.used(Budget::Streams), 0);
        // A table counted late charges its live handles at once.
        let mut c = HandleTable::new(HandleKind::Stream);
        c.insert(()).unwrap();
        c.set_budget(budget());
        assert_eq!(vm.used(Budget::Streams), 1);
        drop(c);
        assert_eq!(vm.used(Budget::Streams), 0);
    }
}
