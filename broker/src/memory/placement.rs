//! Where a VM's memory lives: device memory within reservations and
//! over-committed slices, or host memory when the device is full
//! (docs/memory.md, "Reservations, overcommit and overflow").
//!
//! One [`DevicePlacement`] per device keeps a ledger of the device bytes and
//! the host-overflow bytes of each of its VMs ([`TenantMemory`]). Every byte a
//! slice charges passes [`TenantMemory::admit`] (through the slice's
//! [`Admission`] hook); plain allocations (`cuMemAlloc*`), which can move,
//! pass [`TenantMemory::place`] instead. The rules:
//!
//! - A charge within the VM's own reservation gets device memory: when
//!   borrowers hold it, their movable allocations are *demoted* to host
//!   memory first (at the same device addresses).
//! - Otherwise a charge gets device memory that is free and not reserved by
//!   another VM.
//! - A movable allocation of a VM with `overflow = "host"` may also *borrow*
//!   free memory another VM reserved (it can be demoted when the owner
//!   claims it), as long as everything it has on the device could move to
//!   host memory within its `overflow_limit`; otherwise it goes to host
//!   memory (within `overflow_limit` and the host budget), or fails with
//!   `CUDA_ERROR_OUT_OF_MEMORY`.
//! - A VM with `overflow = "none"` never borrows: it could not give the
//!   memory back.
//!
//! A background thread per device *promotes* host-resident allocations back
//! to device memory when room appears (memory freed, a reservation lowered),
//! under the rules an allocation would be placed by: into the VM's own
//! reservation, into free memory nobody reserved, or, borrowing, into another
//! VM's free reservation (then the owner's next claim demotes it again) once
//! that VM has not allocated within its reservation for [`RESERVATION_HOLD`].
//!
//! Moves happen through [`DeviceContext::migrate`], which waits for a safe
//! point of the owning VM (none of its kernels or copies running).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::device::{DeviceContext, Residence};
use crate::error::CuError;
use vgpu_config::size::Human;
use vgpu_config::{Overcommit, Overflow, VmMemory};

/// How often the promotion thread looks for room even without a wake-up.
pub const REBALANCE_INTERVAL: Duration = Duration::from_millis(200);
/// How long a VM's free reserved memory stays out of promotions' reach after the VM last
/// allocated within its reservation: an owner that allocates and frees in a loop would otherwise
/// have borrowers promoted into its reservation after every free and demoted again at its next
/// allocation, each move waiting for the borrower's kernels to yield.
pub const RESERVATION_HOLD: Duration = Duration::from_secs(2);
/// Rounds of demotion an allocation tries before it gives up (others may take
/// the memory freed meanwhile).
const DEMOTION_ROUNDS: usize = 4;
/// Allocations promoted per round of the promotion thread (it comes back at once while
/// there is more to do).
const PROMOTIONS_PER_ROUND: usize = 16;

/// Charges a slice passes through before device memory is used.
pub trait Admission: Send + Sync {
    /// Admits `bytes` of device memory (not movable), demoting borrowers when the bytes are
    /// within the VM's reservation; refuses with `CUDA_ERROR_OUT_OF_MEMORY`.
    fn admit(&self, bytes: u64) -> Result<(), CuError>;
    /// Returns `bytes` admitted by `admit`.
    fn release(&self, bytes: u64);
}

/// The host memory all VMs' overflow may take together.
#[derive(Debug, Default)]
pub struct HostBudget {
    limit: AtomicU64,
    used: AtomicU64,
}

impl HostBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            limit: AtomicU64::new(limit),
            used: AtomicU64::new(0),
        }
    }

    /// Changes the limit (what is in use stays).
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Bytes in use.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn free(&self) -> u64 {
        self.limit().saturating_sub(self.used())
    }

    fn take(&self, bytes: u64) -> bool {
        let limit = self.limit();
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|n| *n <= limit)
            })
            .is_ok()
    }

    fn give(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(bytes))
            });
    }
}

/// One movable allocation.
struct Movable {
    charged: u64,
    residence: Residence,
    moving: bool,
    ctx: Arc<dyn DeviceContext>,
}

struct TenantLedger {
    name: String,
    slice: u64,
    policy: VmMemory,
    device: u64,
    host: u64,
    movable: BTreeMap<u64, Movable>,
    /// Bytes of a charge within the reservation that wait for demotions to free them: the
    /// memory those demotions free is the claim's, not free for others (nor for promotions).
    claiming: u64,
    /// When the VM last allocated within its reservation ([`RESERVATION_HOLD`]).
    reservation_used_at: Option<Instant>,
    stats: Arc<MoveStats>,
}

#[derive(Default)]
struct Ledger {
    /// `None`: slices are not checked (a broker nobody configured).
    overcommit: Option<Overcommit>,
    tenants: BTreeMap<u64, TenantLedger>,
    next_id: u64,
    dirty: bool,
    /// [`RESERVATION_HOLD`] (a test shortens or stretches it).
    hold: Duration,
}

impl Ledger {
    fn device_used(&self) -> u64 {
        self.tenants.values().map(|t| t.device).sum()
    }

    /// Device memory free for a charge or promotion of VM `id`: neither used nor freed for
    /// another VM's claim (`id`'s own claim counts as free for it; `None`: for nobody's).
    fn free_for(&self, total: u64, id: Option<u64>) -> u64 {
        let claims: u64 = self
            .tenants
            .iter()
            .filter(|(k, _)| Some(**k) != id)
            .map(|(_, t)| t.claiming)
            .sum();
        total
            .saturating_sub(self.device_used())
            .saturating_sub(claims)
    }

    /// Adds `bytes` to VM `id`'s claims.
    fn claim(&mut self, id: u64, bytes: u64) {
        if let Some(t) = self.tenants.get_mut(&id) {
            t.claiming = t.claiming.saturating_add(bytes);
        }
    }

    /// Takes `bytes` (0: none) off VM `id`'s claims: its charge is placed or refused.
    fn end_claim(&mut self, id: u64, bytes: u64) {
        if bytes == 0 {
            return;
        }
        if let Some(t) = self.tenants.get_mut(&id) {
            t.claiming = t.claiming.saturating_sub(bytes);
        }
    }

    /// Free reserved memory of VMs other than `id` that allocated within their reservation in
    /// the last [`RESERVATION_HOLD`]: promotions do not borrow it.
    fn held_reservations_except(&self, id: u64, now: Instant) -> u64 {
        self.tenants
            .iter()
            .filter(|(k, t)| {
                **k != id
                    && t.reservation_used_at
                        .is_some_and(|at| now.saturating_duration_since(at) < self.hold)
            })
            .map(|(_, t)| t.policy.reserved.saturating_sub(t.device))
            .sum()
    }

    /// Reserved device memory of VMs other than `id` that they do not use yet.
    fn unclaimed_reservations_except(&self, id: u64) -> u64 {
        self.tenants
            .iter()
            .filter(|(k, _)| **k != id)
            .map(|(_, t)| t.policy.reserved.saturating_sub(t.device))
            .sum()
    }

    fn check_fit(
        &self,
        device: &str,
        total: u64,
        overcommit: Option<Overcommit>,
        change: Option<(u64, u64, u64)>,
        extra: Option<(&str, u64, u64)>,
    ) -> Result<(), String> {
        let mut vms: Vec<vgpu_config::memory::SliceOf<'_>> = self
            .tenants
            .iter()
            .map(|(id, t)| {
                let (slice, reserved) = match change {
                    Some((cid, s, r)) if cid == *id => (s, r),
                    _ => (t.slice, t.policy.reserved),
                };
                vgpu_config::memory::SliceOf {
                    name: &t.name,
                    memory: slice,
                    reserved,
                }
            })
            .collect();
        if let Some((name, memory, reserved)) = extra {
            vms.push(vgpu_config::memory::SliceOf {
                name,
                memory,
                reserved,
            });
        }
        // Without an overcommit (a broker nobody configured) only reservations are checked.
        let oc = overcommit.unwrap_or(vgpu_config::memory::UNCHECKED_OVERCOMMIT);
        vgpu_config::memory::check_device_fit(device, total, oc, &vms).map_err(|e| e.message)
    }
}

/// The memory ledger of one device.
pub struct DevicePlacement {
    device: String,
    total: u64,
    ledger: Mutex<Ledger>,
    wake: Condvar,
    host: Arc<HostBudget>,
}

impl std::fmt::Debug for DevicePlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePlacement")
            .field("device", &self.device)
            .field("total", &self.total)
            .finish()
    }
}

/// A device's memory as the admin plane sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemorySnapshot {
    /// Device memory.
    pub total: u64,
    /// The overcommit in force (`None`: not checked).
    pub overcommit: Option<Overcommit>,
    /// Device bytes the VMs hold.
    pub device_used: u64,
    /// Host-overflow bytes the VMs hold.
    pub host_used: u64,
    /// Reservations added up.
    pub reserved: u64,
}

impl DevicePlacement {
    /// The ledger of device `device` with `total` bytes; overflow counts against `host`.
    /// Starts the device's promotion thread.
    pub fn new(device: &str, total: u64, host: Arc<HostBudget>) -> Arc<Self> {
        let p = Arc::new(Self {
            device: device.to_string(),
            total,
            ledger: Mutex::new(Ledger {
                hold: RESERVATION_HOLD,
                ..Ledger::default()
            }),
            wake: Condvar::new(),
            host,
        });
        let weak = Arc::downgrade(&p);
        let spawned = std::thread::Builder::new()
            .name(format!("vgpu-mem-{device}"))
            .spawn(move || promotion_loop(weak));
        if let Err(e) = spawned {
            tracing::warn!(device, error = %e, "cannot start the memory promotion thread; overflowed allocations stay in host memory");
        }
        p
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The device name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Changes [`RESERVATION_HOLD`] for this device (tests).
    #[cfg(test)]
    fn set_reservation_hold(&self, hold: Duration) {
        self.lock().hold = hold;
    }

    /// Sets the overcommit; refused (naming `overcommit`) when the VMs' slices do not fit it.
    pub fn set_overcommit(&self, oc: Overcommit) -> Result<(), String> {
        let mut l = self.lock();
        l.check_fit(&self.device, self.total, Some(oc), None, None)?;
        l.overcommit = Some(oc);
        Ok(())
    }

    /// The device's totals.
    pub fn snapshot(&self) -> DeviceMemorySnapshot {
        let l = self.lock();
        DeviceMemorySnapshot {
            total: self.total,
            overcommit: l.overcommit,
            device_used: l.device_used(),
            host_used: l.tenants.values().map(|t| t.host).sum(),
            reserved: l.tenants.values().map(|t| t.policy.reserved).sum(),
        }
    }

    /// Registers VM `name` with slice `slice`; refused when it does not fit the overcommit or
    /// the reservations, or breaks its own rules.
    pub fn register(
        self: &Arc<Self>,
        name: &str,
        slice: u64,
        policy: VmMemory,
    ) -> Result<Arc<TenantMemory>, String> {
        policy.check(slice).map_err(|(_, m)| m)?;
        let mut l = self.lock();
        l.check_fit(
            &self.device,
            self.total,
            l.overcommit,
            None,
            Some((name, slice, policy.reserved)),
        )?;
        l.next_id += 1;
        let id = l.next_id;
        let stats = Arc::new(MoveStats::default());
        l.tenants.insert(
            id,
            TenantLedger {
                name: name.to_string(),
                slice,
                policy,
                device: 0,
                host: 0,
                movable: BTreeMap::new(),
                claiming: 0,
                reservation_used_at: None,
                stats: Arc::clone(&stats),
            },
        );
        Ok(Arc::new(TenantMemory {
            id,
            placement: Arc::clone(self),
            stats,
        }))
    }

    fn notify(&self, l: &mut Ledger) {
        l.dirty = true;
        self.wake.notify_all();
    }

    /// Moves allocations of other VMs than `id` from device to host memory until `need` bytes
    /// are free; returns the bytes freed.
    fn demote_for(&self, id: u64, need: u64) -> u64 {
        let mut plan: Vec<(u64, u64, u64, Arc<dyn DeviceContext>)> = Vec::new();
        {
            let mut l = self.lock();
            let mut victims: Vec<(u64, u64)> = l
                .tenants
                .iter()
                .filter(|(k, t)| {
                    **k != id && t.policy.overflow == Overflow::Host && t.device > t.policy.reserved
                })
                .map(|(k, t)| (*k, t.device - t.policy.reserved))
                .collect();
            victims.sort_by_key(|v| std::cmp::Reverse(v.1));
            let mut planned = 0u64;
            for (vid, _) in victims {
                if planned >= need {
                    break;
                }
                let Some(t) = l.tenants.get_mut(&vid) else {
                    continue;
                };
                let mut cands: Vec<(u64, u64)> = t
                    .movable
                    .iter()
                    .filter(|(_, m)| m.residence == Residence::Device && !m.moving)
                    .map(|(p, m)| (*p, m.charged))
                    .collect();
                cands.sort_by_key(|c| std::cmp::Reverse(c.1));
                let mut host_planned = 0u64;
                for (ptr, c) in cands {
                    if planned >= need {
                        break;
                    }
                    if t.host + host_planned + c > t.policy.overflow_limit || !self.host.take(c) {
                        continue;
                    }
                    host_planned += c;
                    planned += c;
                    let m = t.movable.get_mut(&ptr).expect("candidate exists");
                    m.moving = true;
                    plan.push((vid, ptr, c, Arc::clone(&m.ctx)));
                }
            }
        }
        let mut freed = 0;
        for (vid, ptr, c, ctx) in plan {
            let r = ctx.migrate(ptr, Residence::Host);
            let mut l = self.lock();
            let Some(t) = l.tenants.get_mut(&vid) else {
                self.host.give(c);
                continue;
            };
            match (t.movable.get_mut(&ptr), r) {
                (Some(m), Ok(())) => {
                    m.moving = false;
                    m.residence = Residence::Host;
                    t.device = t.device.saturating_sub(c);
                    t.host += c;
                    freed += c;
                    t.stats.demotions.fetch_add(1, Ordering::Relaxed);
                    t.stats.demoted_bytes.fetch_add(c, Ordering::Relaxed);
                    tracing::info!(
                        device = %self.device, vm = %t.name, ptr = format_args!("{ptr:#x}"),
                        bytes = c, "allocation demoted to host memory"
                    );
                }
                (Some(m), Err(e)) => {
                    m.moving = false;
                    self.host.give(c);
                    tracing::warn!(device = %self.device, error = %e, "demotion failed");
                }
                // Freed while it moved: the free counted it as device memory.
                (None, _) => self.host.give(c),
            }
        }
        freed
    }

    /// One round of promotions; returns whether anything moved.
    fn promote_round(&self) -> bool {
        let mut plan: Vec<(u64, u64, u64, Arc<dyn DeviceContext>)> = Vec::new();
        {
            let mut l = self.lock();
            l.dirty = false;
            let now = Instant::now();
            // Memory a claim is freeing is not room: promoting into it would only be demoted
            // again (or, racing the claim round after round, fail it). Less what this round
            // plans as it goes.
            let mut free = l.free_for(self.total, None);
            let ids: Vec<u64> = l
                .tenants
                .iter()
                .filter(|(_, t)| t.host > 0)
                .map(|(k, _)| *k)
                .collect();
            for id in ids {
                let others = l.unclaimed_reservations_except(id);
                let held = l.held_reservations_except(id, now);
                let cands: Vec<(u64, u64)> = l.tenants[&id]
                    .movable
                    .iter()
                    .filter(|(_, m)| m.residence == Residence::Host && !m.moving)
                    .map(|(p, m)| (*p, m.charged))
                    .collect();
                for (ptr, c) in cands {
                    if plan.len() >= PROMOTIONS_PER_ROUND {
                        break;
                    }
                    let t = &l.tenants[&id];
                    let own = t.device + c <= t.policy.reserved && free >= c;
                    // Back into borrowed memory under the rule an allocation borrows by, but not
                    // into the reservation of a VM that uses it now.
                    let past = (t.device + c).saturating_sub(t.policy.reserved);
                    let borrow = free.saturating_sub(held) >= c
                        && t.host - c + past <= t.policy.overflow_limit;
                    if free.saturating_sub(others) < c && !own && !borrow {
                        continue;
                    }
                    let t = l.tenants.get_mut(&id).expect("listed");
                    // Count the device bytes now so nobody else takes them meanwhile.
                    t.device += c;
                    free -= c;
                    let m = t.movable.get_mut(&ptr).expect("listed");
                    m.moving = true;
                    plan.push((id, ptr, c, Arc::clone(&m.ctx)));
                }
            }
        }
        let moved = !plan.is_empty();
        for (id, ptr, c, ctx) in plan {
            let r = ctx.migrate(ptr, Residence::Device);
            let mut l = self.lock();
            let Some(t) = l.tenants.get_mut(&id) else {
                continue;
            };
            let name = t.name.clone();
            match (t.movable.get_mut(&ptr), r) {
                (Some(m), Ok(())) => {
                    m.moving = false;
                    m.residence = Residence::Device;
                    t.host = t.host.saturating_sub(c);
                    self.host.give(c);
                    t.stats.promotions.fetch_add(1, Ordering::Relaxed);
                    t.stats.promoted_bytes.fetch_add(c, Ordering::Relaxed);
                    tracing::info!(device = %self.device, vm = %name, ptr = format_args!("{ptr:#x}"), bytes = c, "allocation promoted to device memory");
                }
                (Some(m), Err(e)) => {
                    m.moving = false;
                    t.device = t.device.saturating_sub(c);
                    tracing::debug!(device = %self.device, error = %e, "promotion failed; the allocation stays in host memory");
                }
                // Freed while it moved: the free counted it as host memory.
                (None, _) => t.device = t.device.saturating_sub(c),
            }
        }
        moved
    }
}

fn promotion_loop(weak: Weak<DevicePlacement>) {
    loop {
        let Some(p) = weak.upgrade() else { return };
        {
            let l = p.lock();
            if !l.dirty {
                let _ = p
                    .wake
                    .wait_timeout(l, REBALANCE_INTERVAL)
                    .unwrap_or_else(|e| e.into_inner());
            }
        }
        while p.promote_round() {}
    }
}

/// Moves between device and host memory of one VM.
#[derive(Debug, Default)]
pub struct MoveStats {
    /// Allocations demoted to host memory.
    pub demotions: AtomicU64,
    /// Bytes demoted.
    pub demoted_bytes: AtomicU64,
    /// Allocations promoted back to device memory.
    pub promotions: AtomicU64,
    /// Bytes promoted.
    pub promoted_bytes: AtomicU64,
}

/// A VM's memory as the admin plane sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantMemorySnapshot {
    /// The VM's reservation and overflow settings.
    pub policy: VmMemory,
    /// Bytes in device memory.
    pub device: u64,
    /// Bytes overflowed to host memory.
    pub host: u64,
    /// Device bytes beyond the VM's reservation (not guaranteed; movable ones may be demoted).
    pub borrowed: u64,
    /// Allocations demoted to host memory.
    pub demotions: u64,
    /// Bytes demoted.
    pub demoted_bytes: u64,
    /// Allocations promoted back.
    pub promotions: u64,
    /// Bytes promoted.
    pub promoted_bytes: u64,
}

/// What a charge does next.
enum Decision {
    /// Placed (or refused).
    Done(Result<Residence, CuError>),
    /// Within the VM's reservation, which borrowers hold: this many bytes must be demoted.
    Demote(u64),
}

/// One VM's entry in its device's ledger.
pub struct TenantMemory {
    id: u64,
    placement: Arc<DevicePlacement>,
    stats: Arc<MoveStats>,
}

impl std::fmt::Debug for TenantMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantMemory")
            .field("device", &self.placement.device)
            .field("id", &self.id)
            .finish()
    }
}

impl TenantMemory {
    /// The device's ledger.
    pub fn placement(&self) -> &Arc<DevicePlacement> {
        &self.placement
    }

    /// The VM's settings, bytes and moves.
    pub fn snapshot(&self) -> TenantMemorySnapshot {
        let l = self.placement.lock();
        let (policy, device, host) = l
            .tenants
            .get(&self.id)
            .map_or((VmMemory::default(), 0, 0), |t| {
                (t.policy, t.device, t.host)
            });
        TenantMemorySnapshot {
            policy,
            device,
            host,
            borrowed: device.saturating_sub(policy.reserved),
            demotions: self.stats.demotions.load(Ordering::Relaxed),
            demoted_bytes: self.stats.demoted_bytes.load(Ordering::Relaxed),
            promotions: self.stats.promotions.load(Ordering::Relaxed),
            promoted_bytes: self.stats.promoted_bytes.load(Ordering::Relaxed),
        }
    }

    /// Changes the VM's slice and memory settings live. Refused when the slices or
    /// reservations would not fit the device, or the VM's host-overflow use exceeds the new
    /// settings; nothing changes then.
    pub fn set_policy(&self, slice: u64, policy: VmMemory) -> Result<(), String> {
        policy.check(slice).map_err(|(_, m)| m)?;
        let p = &self.placement;
        let mut l = p.lock();
        l.check_fit(
            &p.device,
            p.total,
            l.overcommit,
            Some((self.id, slice, policy.reserved)),
            None,
        )?;
        let Some(t) = l.tenants.get_mut(&self.id) else {
            return Ok(());
        };
        if t.host > policy.overflow_limit {
            return Err(format!(
                "{} of the VM's memory is overflowed to host memory, more than overflow_limit = {} allows: free memory in the VM first",
                Human(t.host),
                Human(policy.overflow_limit)
            ));
        }
        t.slice = slice;
        t.policy = policy;
        p.notify(&mut l);
        Ok(())
    }

    /// Decides where `bytes` of a movable allocation go, and counts them there; the caller
    /// allocates accordingly, then calls [`TenantMemory::track`] (or
    /// [`TenantMemory::unplace`] when the allocation failed).
    pub fn place(&self, bytes: u64) -> Result<Residence, CuError> {
        self.admit_as(bytes, true)
    }

    /// Undoes [`TenantMemory::place`] for an allocation that was not made.
    pub fn unplace(&self, bytes: u64, r: Residence) {
        let p = &self.placement;
        let mut l = p.lock();
        if let Some(t) = l.tenants.get_mut(&self.id) {
            match r {
                Residence::Device => t.device = t.device.saturating_sub(bytes),
                Residence::Host => {
                    t.host = t.host.saturating_sub(bytes);
                    p.host.give(bytes);
                }
            }
        }
        p.notify(&mut l);
    }

    /// Moves the count of `bytes` placed on the device to host memory (the device refused
    /// the allocation although the ledger had room): true when the VM may overflow them.
    pub fn fall_back_to_host(&self, bytes: u64) -> bool {
        let p = &self.placement;
        let mut l = p.lock();
        let Some(t) = l.tenants.get_mut(&self.id) else {
            return false;
        };
        if t.policy.overflow != Overflow::Host
            || t.host + bytes > t.policy.overflow_limit
            || !p.host.take(bytes)
        {
            return false;
        }
        t.device = t.device.saturating_sub(bytes);
        t.host += bytes;
        true
    }

    /// Records a movable allocation at `ptr` of `charged` bytes, made in `ctx`.
    pub fn track(&self, ptr: u64, charged: u64, residence: Residence, ctx: Arc<dyn DeviceContext>) {
        let mut l = self.placement.lock();
        if let Some(t) = l.tenants.get_mut(&self.id) {
            t.movable.insert(
                ptr,
                Movable {
                    charged,
                    residence,
                    moving: false,
                    ctx,
                },
            );
        }
    }

    /// Forgets the movable allocation at `ptr` (freed) and returns its bytes to the device or
    /// the host budget.
    pub fn untrack(&self, ptr: u64) {
        let p = &self.placement;
        let mut l = p.lock();
        let Some(t) = l.tenants.get_mut(&self.id) else {
            return;
        };
        let Some(m) = t.movable.remove(&ptr) else {
            return;
        };
        match m.residence {
            Residence::Device => t.device = t.device.saturating_sub(m.charged),
            Residence::Host => {
                t.host = t.host.saturating_sub(m.charged);
                p.host.give(m.charged);
            }
        }
        p.notify(&mut l);
    }

    fn admit_as(&self, bytes: u64, movable: bool) -> Result<Residence, CuError> {
        let p = &self.placement;
        // Bytes of this call counted in the VM's claims (its other calls may claim too).
        let mut claimed = 0;
        for _ in 0..DEMOTION_ROUNDS {
            let need = {
                let mut l = p.lock();
                match self.decide(&mut l, bytes, movable) {
                    Decision::Done(r) => {
                        l.end_claim(self.id, claimed);
                        return r;
                    }
                    Decision::Demote(need) => {
                        // Until this charge is placed, what the demotions free is its own.
                        if claimed == 0 {
                            claimed = bytes;
                            l.claim(self.id, claimed);
                        }
                        need
                    }
                }
            };
            if p.demote_for(self.id, need) == 0 {
                break;
            }
        }
        let mut l = p.lock();
        l.end_claim(self.id, claimed);
        p.notify(&mut l);
        Err(CuError::out_of_memory(format!(
            "device `{}` could not free this VM's reserved memory: the VMs borrowing it cannot overflow further",
            p.device
        )))
    }

    /// Where `bytes` go under the ledger as it is, counting them there; or how many bytes
    /// borrowers must give back first.
    fn decide(&self, l: &mut Ledger, bytes: u64, movable: bool) -> Decision {
        let p = &self.placement;
        let free = l.free_for(p.total, Some(self.id));
        let others = l.unclaimed_reservations_except(self.id);
        let budget_free = p.host.free();
        let Some(t) = l.tenants.get_mut(&self.id) else {
            return Decision::Done(Err(CuError::out_of_memory("the VM was removed")));
        };
        let own = t.device.saturating_add(bytes) <= t.policy.reserved;
        if own {
            // The reservation is in use: borrowers are not promoted back into it for a while.
            t.reservation_used_at = Some(Instant::now());
        }
        let overflow = movable && t.policy.overflow == Overflow::Host;
        if free.saturating_sub(others) >= bytes || (own && free >= bytes) {
            t.device += bytes;
            return Decision::Done(Ok(Residence::Device));
        }
        // Borrow another VM's free reservation only if everything this VM holds past its own
        // reservation could move to host memory when the owner claims it.
        let past = (t.device + bytes).saturating_sub(t.policy.reserved);
        if overflow
            && free >= bytes
            && t.host + past <= t.policy.overflow_limit
            && past <= budget_free
        {
            t.device += bytes;
            return Decision::Done(Ok(Residence::Device));
        }
        if own {
            return Decision::Demote(bytes - free);
        }
        if overflow && t.host + bytes <= t.policy.overflow_limit {
            if p.host.take(bytes) {
                t.host += bytes;
                return Decision::Done(Ok(Residence::Host));
            }
            return Decision::Done(Err(CuError::out_of_memory(format!(
                "device `{}` is full and the host overflow budget ({}) is used up",
                p.device,
                Human(p.host.limit())
            ))));
        }
        Decision::Done(Err(CuError::out_of_memory(
            self.refusal(t, free, others, bytes),
        )))
    }

    fn refusal(&self, t: &TenantLedger, free: u64, others: u64, bytes: u64) -> String {
        let what =
            if t.policy.overflow == Overflow::Host && t.host + bytes > t.policy.overflow_limit {
                format!(
                    "and the VM's overflow_limit of {} is reached ({} overflowed)",
                    Human(t.policy.overflow_limit),
                    Human(t.host)
                )
            } else {
                "and the VM's overflow is \"none\"".to_string()
            };
        format!(
            "allocation of {} does not fit device `{}`: {} free, {} of it reserved for other VMs, {what}",
            Human(bytes),
            self.placement.device,
            Human(free),
            Human(others.min(free)),
        )
    }
}

impl Admission for TenantMemory {
    fn admit(&self, bytes: u64) -> Result<(), CuError> {
        self.admit_as(bytes, false).map(|_| ())
    }

    fn release(&self, bytes: u64) {
        let p = &self.placement;
        let mut l = p.lock();
        if let Some(t) = l.tenants.get_mut(&self.id) {
            t.device = t.device.saturating_sub(bytes);
        }
        p.notify(&mut l);
    }
}

impl Drop for TenantMemory {
    fn drop(&mut self) {
        let p = &self.placement;
        let mut l = p.lock();
        if let Some(t) = l.tenants.remove(&self.id) {
            p.host.give(t.host);
        }
        p.notify(&mut l);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceError;

    const UNIT: u64 = 1 << 20;

    /// A context that only moves allocations; its second demotion waits until the test opens
    /// the gate, holding a claim half done.
    #[derive(Default)]
    struct Gated {
        state: Mutex<(u32, bool)>,
        changed: Condvar,
    }

    impl Gated {
        fn wait_for_demotions(&self, n: u32) {
            let mut s = self.state.lock().unwrap();
            while s.0 < n {
                s = self.changed.wait(s).unwrap();
            }
        }

        fn open(&self) {
            self.state.lock().unwrap().1 = true;
            self.changed.notify_all();
        }
    }

    impl DeviceContext for Gated {
        fn alloc(&self, _size: u64) -> Result<u64, DeviceError> {
            Err(DeviceError::NotSupported("test context".into()))
        }
        fn free(&self, _ptr: u64) -> Result<(), DeviceError> {
            Ok(())
        }
        fn write(&self, _dst: u64, _data: &[u8]) -> Result<(), DeviceError> {
            Err(DeviceError::NotSupported("test context".into()))
        }
        fn read(&self, _src: u64, _out: &mut [u8]) -> Result<(), DeviceError> {
            Err(DeviceError::NotSupported("test context".into()))
        }
        fn copy(&self, _dst: u64, _src: u64, _len: u64) -> Result<(), DeviceError> {
            Err(DeviceError::NotSupported("test context".into()))
        }
        fn memset(&self, _d: u64, _v: u32, _e: u32, _c: u64) -> Result<(), DeviceError> {
            Err(DeviceError::NotSupported("test context".into()))
        }
        fn migrate(&self, _ptr: u64, to: Residence) -> Result<(), DeviceError> {
            if to == Residence::Host {
                let mut s = self.state.lock().unwrap();
                s.0 += 1;
                self.changed.notify_all();
                while s.0 >= 2 && !s.1 {
                    s = self.changed.wait(s).unwrap();
                }
            }
            Ok(())
        }
    }

    /// An 8-unit device; a borrower that may overflow all of its 8-unit slice, and an owner
    /// that reserved 4 units and never overflows.
    fn two_vms() -> (Arc<DevicePlacement>, Arc<TenantMemory>, Arc<TenantMemory>) {
        let p = DevicePlacement::new("gpu0", 8 * UNIT, Arc::new(HostBudget::new(64 * UNIT)));
        let borrower = p
            .register(
                "borrower",
                8 * UNIT,
                VmMemory {
                    overflow: Overflow::Host,
                    overflow_limit: 8 * UNIT,
                    ..VmMemory::default()
                },
            )
            .unwrap();
        let owner = p
            .register(
                "owner",
                4 * UNIT,
                VmMemory {
                    reserved: 4 * UNIT,
                    ..VmMemory::default()
                },
            )
            .unwrap();
        (p, borrower, owner)
    }

    #[test]
    fn memory_a_claim_frees_is_neither_promoted_into_nor_borrowed_by_others() {
        let (p, borrower, owner) = two_vms();
        let ctx = Arc::new(Gated::default());
        // The borrower fills the device, half of it the owner's free reservation.
        for ptr in 1..=8 {
            assert_eq!(borrower.place(UNIT).unwrap(), Residence::Device);
            borrower.track(ptr, UNIT, Residence::Device, ctx.clone());
        }
        // The owner claims two units: the first demotion is done, the second waits.
        let claim = {
            let owner = Arc::clone(&owner);
            std::thread::spawn(move || owner.place(2 * UNIT))
        };
        ctx.wait_for_demotions(2);
        assert_eq!(borrower.snapshot().host, UNIT, "one unit demoted");
        // The unit the claim freed stays the claim's: no promotion takes it back, and the
        // borrower's next allocation overflows instead of borrowing it.
        assert!(!p.promote_round(), "promoted into the claim's memory");
        assert_eq!(borrower.place(UNIT).unwrap(), Residence::Host);
        borrower.track(9, UNIT, Residence::Host, ctx.clone());
        ctx.open();
        assert_eq!(claim.join().unwrap().unwrap(), Residence::Device);
        let (b, o) = (borrower.snapshot(), owner.snapshot());
        assert_eq!((o.device, b.device, b.host), (2 * UNIT, 6 * UNIT, 3 * UNIT));
        assert_eq!((b.demotions, b.promotions), (2, 0), "{b:?}");
        assert_eq!(p.snapshot().device_used, 8 * UNIT);
    }

    #[test]
    fn borrowers_are_not_promoted_into_a_reservation_its_owner_just_used() {
        let (p, borrower, owner) = two_vms();
        p.set_reservation_hold(Duration::from_secs(3600));
        let ctx = Arc::new(Gated::default());
        ctx.open();
        for ptr in 1..=8 {
            assert_eq!(borrower.place(UNIT).unwrap(), Residence::Device);
            borrower.track(ptr, UNIT, Residence::Device, ctx.clone());
        }
        // The owner claims two units (two of the borrower's are demoted), then frees them.
        assert_eq!(owner.place(2 * UNIT).unwrap(), Residence::Device);
        owner.track(100, 2 * UNIT, Residence::Device, ctx.clone());
        owner.untrack(100);
        assert_eq!(borrower.snapshot().host, 2 * UNIT);
        // The owner may allocate again any moment: its reservation stays free.
        assert!(!p.promote_round(), "promoted into a reservation in use");
        assert_eq!(p.snapshot().device_used, 6 * UNIT);
        // Once the owner has left it alone for the hold, the borrower's units come back.
        p.set_reservation_hold(Duration::ZERO);
        while p.promote_round() {}
        let b = borrower.snapshot();
        assert_eq!((b.device, b.host, b.promotions), (8 * UNIT, 0, 2), "{b:?}");
    }
}
