//! Time-sliced compute: which VM's kernel runs on a device, and for how long.
//!
//! One [`Scheduler`] per device. The unit of scheduling is the tenant (VM):
//! the kernels of all its sessions compete as one. The device runs one
//! tenant's kernel at a time (the simulated GPU gives that kernel all its
//! worker threads); a kernel runs only while its tenant holds the device.
//!
//! A tenant is granted the device for a *slice* (`slice_ms`, 1–100 ms). It
//! keeps the device while its slice lasts and it has kernels to run (its next
//! kernel gets a short grace period, [`ANTICIPATION`], to arrive from its
//! session, so a saturating tenant is not robbed of its slice between two
//! kernels). When the slice ends and another tenant should run, the running
//! kernel is asked to yield ([`RunControl::request_yield`]): the simulated GPU
//! stops it between thread blocks and it resumes later from the next block;
//! a real GPU stops at the kernel's end (launches are gated at kernel
//! boundaries).
//!
//! Policies (per device, [`Policy`]):
//! - `fair`: weighted fair share, work-conserving. Each tenant has a virtual
//!   time that advances by `device time used / weight`; the tenant with the
//!   least virtual time among those with queued kernels runs next. A tenant
//!   that becomes active again starts at the smallest virtual time of the
//!   active tenants of its class, so idling earns no credit.
//! - `fixed`: hard caps. A tenant's share is `weight / sum of the weights of
//!   all the device's tenants`, enforced by a token bucket of one slice that
//!   refills at that share of real time: over any window of length `T` a
//!   tenant runs at most `share × T + slice`, even on an idle device.
//!
//! Synchronous clients (a tenant whose queue drains between batches because
//! its program waits for its results) keep their share through three sync
//! rules (docs/scheduling.md): what the others ran during a sync gap of at
//! most [`SYNC_GAP`] is not held against the tenant (with a bounded lag), the
//! device is kept for a drained tenant that is behind for its observed think
//! time (at most [`SYNC_ANTICIPATION_MAX`]), and a tenant back from a gap and
//! behind the holder takes the device at the next preemption point.
//!
//! The core also accounts contention (who waited while whom ran) and waste
//! (idle with work queued, which stays zero; idle at `fixed` caps;
//! anticipation; hand-overs), see [`DeviceSchedStats`].
//!
//! Priority classes (`realtime` > `normal` > `batch`) come first: a queued
//! kernel of a higher class preempts a lower class at the next preemption
//! point. `batch` keeps `batch_min_share` percent of the device time while it
//! has queued work: it earns credit while other classes run and, once it has
//! a slice's worth, runs ahead of them until the credit is spent.
//!
//! Weights follow the VM's `[[vm.schedule]]` time-of-day windows (local time,
//! re-read at least every [`TIME_OF_DAY_REFRESH`]); weight, priority, policy
//! and slice length change live.
//!
//! The policy logic is a deterministic state machine ([`Core`], driven with
//! explicit times and unit-tested with a simulated clock); [`Scheduler`] wraps
//! it with locking, waiting and a timer thread.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{debug, info};

use crate::device::{RunControl, Signal};
use vgpu_config::{Policy, Priority, SchedulingConfig, TimeOfDay, VmConfig, WeightWindow};

/// A tenant's id in its device's scheduler.
pub type TenantId = u64;
/// Nanoseconds since the scheduler started (the core's clock).
pub type Nanos = u64;
/// One request for the device: a kernel's first run or a resumption.
pub type WaiterId = u64;

/// How long the holder of the device may keep it idle while its next kernel
/// travels from its session's queue to the scheduler (capped at half a slice).
pub const ANTICIPATION: Duration = Duration::from_micros(250);
/// Longest a drained tenant's device is held for its next batch (the sync
/// anticipation window, see [`Core::sync_window`]); also capped at half a
/// slice.
pub const SYNC_ANTICIPATION_MAX: Duration = Duration::from_millis(1);
/// A tenant whose queue drained and that queues work again within this
/// time is a synchronous client between two batches, not
/// an idle one: what the others ran during the gap is not held against it,
/// and it keeps up to [`SYNC_CREDIT_SLICES`] of the lag it had when it
/// drained.
pub const SYNC_GAP: Duration = Duration::from_millis(20);
/// Most lag (in slices of the lightest tenant's device time) a tenant keeps
/// from before a sync gap.
pub const SYNC_CREDIT_SLICES: f64 = 1.0;
/// Most lag (in the same unit) a tenant may have on the others when it
/// comes back from a sync gap, gap included: the burst it may take.
pub const SYNC_LAG_MAX_SLICES: f64 = 4.0;
/// Sync gaps (drained → queued again) kept per tenant for its think time.
const RECENT_GAPS: usize = 16;
/// How often the local time of day is re-read for weight schedules.
pub const TIME_OF_DAY_REFRESH: Duration = Duration::from_secs(1);
/// Queue waits kept per tenant for the percentiles in [`SchedStats`].
pub const RECENT_WAITS: usize = 1024;
/// Granularity of the usage history behind the 1 s / 10 s / 60 s shares.
const USAGE_BUCKET: Nanos = 100_000_000;
/// Buckets kept: 60 s.
const USAGE_BUCKETS: usize = 600;
/// Granularity of the 10-minute usage history.
const LONG_BUCKET: Nanos = 1_000_000_000;
/// Buckets kept of the 10-minute usage history.
const LONG_BUCKETS: usize = 600;
/// Granularity of the contention history (per pair of tenants).
const CONTENTION_BUCKET: Nanos = 60_000_000_000;
/// Buckets kept of the contention history: an hour.
const CONTENTION_BUCKETS: usize = 60;
/// Slack for comparisons of token and credit balances (nanoseconds).
const BALANCE_EPS: f64 = 1.0;
/// Most batch minimum-share credit kept, in slices. A batch tenant with a
/// slice of credit runs ahead of the other classes until the credit is spent;
/// the headroom above one slice keeps credit earned between two checks
/// (which come at slice ends) from being lost.
const BATCH_CREDIT_SLICES: f64 = 2.0;
/// Shortest sleep of the timer thread when a deadline is already due.
const MIN_TIMER_STEP: Duration = Duration::from_micros(50);

/// Scheduling statistics of one tenant (VM).
#[derive(Debug, Clone, PartialEq)]
pub struct SchedStats {
    /// The weight in force now (the baseline plus the tuning controller's
    /// adjustment).
    pub weight: u32,
    /// The baseline weight: the `[[vm.schedule]]` window's, or the base weight.
    pub baseline_weight: u32,
    /// The tuning controller's adjustment (weight − baseline, before the
    /// floor of 1).
    pub weight_adjust: i32,
    /// Launch-to-start waits recorded since the VM was created (for waits
    /// over an interval, see [`Scheduler::wait_quantile`]).
    pub waits_recorded: u64,
    /// Scheduling class.
    pub priority: Priority,
    /// Device time the tenant's kernels held the device, since it was created.
    pub busy: Duration,
    /// Kernels that ran to completion.
    pub kernels: u64,
    /// Times a running kernel of the tenant was stopped at a preemption
    /// point so that another tenant could run (or because it hit its cap).
    pub preemptions: u64,
    /// Kernels submitted and not yet finished (queued or running).
    pub queued: u32,
    /// Sum over started kernels of the wait from the launch reaching the
    /// broker to the kernel's first block starting (this includes waiting
    /// behind earlier work of the same session).
    pub queue_wait: Duration,
    /// Median launch-to-start wait of the last [`RECENT_WAITS`] kernels.
    pub queue_wait_p50: Duration,
    /// 90th percentile launch-to-start wait of the last [`RECENT_WAITS`] kernels.
    pub queue_wait_p90: Duration,
    /// 99th percentile launch-to-start wait of the last [`RECENT_WAITS`] kernels.
    pub queue_wait_p99: Duration,
    /// The VM's launch-to-start target (`target_wait_p99`), if it has one.
    pub target_wait: Option<Duration>,
    /// Realtime kernels that waited longer than their deadline (the VM's
    /// `target_wait_p99`, or two slices) from launch to start.
    pub deadline_misses: u64,
    /// Time the VM had a kernel waiting while the device idled because the
    /// VM had spent its `fixed` cap.
    pub capped_wait: Duration,
    /// The VM's think time between two batches (75th percentile of its
    /// recent sync gaps, at most [`SYNC_GAP`]); zero if it never drained
    /// and came back within a sync gap.
    pub think_time: Duration,
    /// Fraction (0.0–1.0) of wall-clock time the tenant held the device
    /// over the last second.
    pub share_1s: f64,
    /// The same over the last 10 seconds.
    pub share_10s: f64,
    /// The same over the last 60 seconds.
    pub share_60s: f64,
    /// The same over the last 10 minutes.
    pub share_10m: f64,
}

/// Time one VM had a kernel waiting for the device while another VM's
/// kernel ran on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Contention {
    /// The VM that waited.
    pub waiting: String,
    /// The VM that ran.
    pub running: String,
    /// Since both VMs were created.
    pub total: Duration,
    /// Over the last hour.
    pub last_hour: Duration,
    /// The minute of the last hour with the most contention: how long ago
    /// it started, and the contention in it.
    pub peak_minute_ago: Option<Duration>,
    /// Contention in that minute.
    pub peak_minute: Duration,
}

/// Scheduling statistics of a device.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSchedStats {
    /// Device time used by all tenants.
    pub busy: Duration,
    /// Fraction of wall-clock time the device ran kernels over the last second.
    pub utilization_1s: f64,
    /// The same over the last 10 seconds.
    pub utilization_10s: f64,
    /// The same over the last 60 seconds.
    pub utilization_60s: f64,
    /// The same over the last 10 minutes.
    pub utilization_10m: f64,
    /// Time no VM held the device while a kernel that could run waited for
    /// it. The scheduler is work-conserving: this must stay zero.
    pub idle_with_work: Duration,
    /// Time the device idled while kernels waited only because their VMs
    /// had spent their `fixed` caps (by design of `fixed`).
    pub idle_capped: Duration,
    /// Time the device was kept idle for the holder's next kernel (the
    /// anticipation between two kernels and the sync anticipation) while
    /// another VM's kernel waited.
    pub anticipation: Duration,
    /// Time from a grant to the granted kernel's start (thread wake-up)
    /// while another VM's kernel waited.
    pub handover: Duration,
    /// Contention between every pair of VMs that contended.
    pub contention: Vec<Contention>,
    /// Times the device passed from one tenant to another.
    pub switches: u64,
    /// Kernels stopped at a preemption point, all tenants together.
    pub preemptions: u64,
}

/// How a granted run of a kernel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every block ran.
    Completed,
    /// It stopped at a preemption point and will ask for the device again.
    Yielded,
    /// It faulted or was cancelled; it will not run again.
    Failed,
}

/// Where the scheduler reads the local time of day (for weight schedules).
/// Injectable so tests can move the time of day.
pub trait Clock: Send + Sync {
    /// The local time of day.
    fn time_of_day(&self) -> TimeOfDay;
}

/// The host's local time (`localtime_r`, honouring `TZ`).
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalClock;

impl Clock for LocalClock {
    fn time_of_day(&self) -> TimeOfDay {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let t = libc::time_t::try_from(secs).unwrap_or(0);
        // SAFETY: `tm` is plain old data (integers and a nullable pointer), for which all zeroes are valid.
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers refer to live, properly aligned locals for the duration of the call.
        let r = unsafe { libc::localtime_r(&t, &mut tm) };
        if r.is_null() {
            // No local time zone information: UTC.
            return TimeOfDay(((secs % 86_400) / 60) as u16);
        }
        TimeOfDay((tm.tm_hour.clamp(0, 23) * 60 + tm.tm_min.clamp(0, 59)) as u16)
    }
}

/// A clock whose time of day is set by hand (tests, demos).
#[derive(Debug)]
pub struct ManualClock {
    minutes: std::sync::atomic::AtomicU16,
}

impl ManualClock {
    /// A clock showing `t`.
    pub fn new(t: TimeOfDay) -> Self {
        Self {
            minutes: std::sync::atomic::AtomicU16::new(t.0),
        }
    }

    /// Moves the clock to `t`.
    pub fn set(&self, t: TimeOfDay) {
        self.minutes
            .store(t.0, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn time_of_day(&self) -> TimeOfDay {
        TimeOfDay(self.minutes.load(std::sync::atomic::Ordering::Relaxed))
    }
}

// ---------------------------------------------------------------------------
// Usage history

/// Device time used per bucket ([`USAGE_BUCKET`] over the last minute, or
/// coarser buckets over longer spans).
#[derive(Debug, Clone)]
struct UsageRing {
    buckets: Vec<Nanos>,
    /// Length of a bucket.
    bucket: Nanos,
    /// Index of the newest bucket written.
    head: u64,
}

impl UsageRing {
    fn new() -> Self {
        Self::with(USAGE_BUCKET, USAGE_BUCKETS)
    }

    /// `count` buckets of `bucket` nanoseconds each.
    fn with(bucket: Nanos, count: usize) -> Self {
        Self {
            buckets: vec![0; count.max(1)],
            bucket: bucket.max(1),
            head: 0,
        }
    }

    fn n(&self) -> u64 {
        self.buckets.len() as u64
    }

    fn slot(&self, k: u64) -> usize {
        (k % self.n()) as usize
    }

    fn advance(&mut self, k: u64) {
        if k <= self.head {
            return;
        }
        if k - self.head >= self.n() {
            self.buckets.iter_mut().for_each(|b| *b = 0);
        } else {
            for i in self.head + 1..=k {
                let s = self.slot(i);
                self.buckets[s] = 0;
            }
        }
        self.head = k;
    }

    /// Records use of the device during `[a, b)`.
    fn add(&mut self, a: Nanos, b: Nanos) {
        let mut t = a;
        while t < b {
            let k = t / self.bucket;
            let end = ((k + 1) * self.bucket).min(b);
            self.advance(k);
            if k + self.n() > self.head {
                let s = self.slot(k);
                self.buckets[s] += end - t;
            }
            t = end;
        }
    }

    /// The bucket with the most use still kept: (its start, its use).
    fn peak(&self) -> Option<(Nanos, Nanos)> {
        let first = (self.head + 1).saturating_sub(self.n());
        (first..=self.head)
            .map(|k| (k * self.bucket, self.buckets[self.slot(k)]))
            .filter(|b| b.1 > 0)
            .max_by_key(|b| b.1)
    }

    /// Use recorded during `[from, now)`; a bucket only partly inside the
    /// window counts pro rata.
    fn used(&self, from: Nanos, now: Nanos) -> f64 {
        if now <= from {
            return 0.0;
        }
        let mut total = 0.0;
        for k in from / self.bucket..=(now - 1) / self.bucket {
            if k > self.head || k + self.n() <= self.head {
                continue;
            }
            let v = self.buckets[self.slot(k)] as f64;
            if v == 0.0 {
                continue;
            }
            let start = k * self.bucket;
            let elapsed_end = (start + self.bucket).min(now);
            let lo = from.max(start);
            let covered = (elapsed_end - lo) as f64 / (elapsed_end - start) as f64;
            total += v * covered;
        }
        total
    }

    /// Fraction of `[now - window, now)` used, plus `extra_since` (a running
    /// segment not recorded yet, from that instant to `now`).
    fn share(&self, window: Duration, now: Nanos, extra_since: Option<Nanos>) -> f64 {
        let w = (window.as_nanos() as u64).min(now);
        if w == 0 {
            return 0.0;
        }
        let from = now - w;
        let extra = extra_since.map_or(0, |s| now - s.max(from).min(now));
        ((self.used(from, now) + extra as f64) / w as f64).clamp(0.0, 1.0)
    }
}

// ---------------------------------------------------------------------------
// The policy core

fn class(p: Priority) -> usize {
    match p {
        Priority::Realtime => 0,
        Priority::Normal => 1,
        Priority::Batch => 2,
    }
}
const BATCH: usize = 2;

/// The 75th percentile of recent sync gaps (0: none).
fn think_p75(gaps: &VecDeque<Nanos>) -> Nanos {
    if gaps.is_empty() {
        return 0;
    }
    let mut g: Vec<Nanos> = gaps.iter().copied().collect();
    g.sort_unstable();
    g[(g.len() * 3).div_ceil(4) - 1]
}

/// A baseline weight moved by the tuning controller's adjustment.
fn adjusted(baseline: u32, adjust: i32) -> u32 {
    (i64::from(baseline) + i64::from(adjust)).clamp(1, i64::from(u32::MAX)) as u32
}

fn effective_weight(base: u32, schedule: &[WeightWindow], tod: TimeOfDay) -> u32 {
    schedule
        .iter()
        .find(|w| w.contains(tod))
        .map_or(base, |w| w.weight)
        .max(1)
}

#[derive(Debug)]
struct Entity {
    name: String,
    base_weight: u32,
    schedule: Vec<WeightWindow>,
    priority: Priority,
    /// Weight in force (schedule applied).
    weight: u32,
    /// Device time used / weight, in nanoseconds.
    vtime: f64,
    /// Kernels waiting for the device, oldest first.
    waiting: VecDeque<WaiterId>,
    /// Kernels submitted and not finished (queued in sessions or here, or running).
    pending: u32,
    /// Fixed-share token balance (nanoseconds of device time) as of `tokens_at`.
    tokens: f64,
    tokens_at: Nanos,
    usage: UsageRing,
    busy: Nanos,
    kernels: u64,
    preemptions: u64,
    queue_wait: Nanos,
    recent_waits: VecDeque<Nanos>,
    /// When the tenant's queue last drained (pending went to 0), and the
    /// virtual time of the others then (the least of the active tenants of
    /// its class, or the class clock).
    drained_at: Option<(Nanos, f64)>,
    /// Recent sync gaps (drained → queued again), each at most [`SYNC_GAP`].
    recent_gaps: VecDeque<Nanos>,
    /// The tenant came back from a sync gap with credit and has not run
    /// since: it may preempt a same-class holder that is ahead of it.
    returned: bool,
    /// Usage over the last 10 minutes (1 s buckets).
    usage_long: UsageRing,
    /// Per running tenant: time this tenant had a kernel waiting while it
    /// ran (total, and the last hour by minute).
    contended_by: BTreeMap<TenantId, (Nanos, UsageRing)>,
    /// Launch-to-start target (realtime deadline), if configured.
    target_wait: Option<Nanos>,
    deadline_misses: u64,
    capped_wait: Nanos,
    /// The tuning controller's adjustment of the baseline weight.
    adjust: i32,
    /// Launch-to-start waits recorded since the tenant was created.
    waits_recorded: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GrantKind {
    /// By class and fair share.
    Share,
    /// A batch tenant's guaranteed minimum share.
    BatchCredit,
}

#[derive(Debug, Clone, Copy)]
struct Running {
    tenant: TenantId,
    /// The kernel running; `None` while waiting for the tenant's next kernel.
    waiter: Option<WaiterId>,
    /// Start of the part of the run not charged yet.
    seg_start: Nanos,
    /// The granted kernel has started running (see [`Core::started`]).
    started: bool,
    /// Launch time of the granted kernel on its first run (for its queue wait).
    queued_at: Option<Nanos>,
    slice_end: Nanos,
    anticipate_until: Nanos,
    /// The holder's queue drained; the device is kept for its next batch
    /// until `anticipate_until` (sync anticipation).
    drained: bool,
    kind: GrantKind,
    /// A yield was requested; the grant ends when the kernel stops.
    preempting: bool,
}

#[derive(Debug, Clone, Copy)]
struct Waiter {
    tenant: TenantId,
    /// When the kernel was launched, for its first run (not for resumptions).
    queued_at: Option<Nanos>,
}

/// What the caller of the core must do after a state change.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Effects {
    /// This waiter now holds the device: wake it.
    pub grant: Option<WaiterId>,
    /// Ask this (running) waiter's kernel to yield.
    pub preempt: Option<WaiterId>,
}

impl Effects {
    fn merge(&mut self, o: Effects) {
        if o.grant.is_some() {
            self.grant = o.grant;
        }
        if o.preempt.is_some() {
            self.preempt = o.preempt;
        }
    }
}

/// The scheduling policy as a deterministic state machine: every input comes
/// with the current time, and the outputs say whom to wake or preempt and
/// when to call [`Core::tick`] next.
#[derive(Debug)]
pub struct Core {
    cfg: SchedulingConfig,
    entities: BTreeMap<TenantId, Entity>,
    waiters: HashMap<WaiterId, Waiter>,
    running: Option<Running>,
    /// Per class: the virtual time a tenant becoming active starts from (at least).
    class_clock: [f64; 3],
    /// Batch class minimum-share credit (nanoseconds).
    batch_credit: f64,
    tod: TimeOfDay,
    usage: UsageRing,
    busy: Nanos,
    switches: u64,
    last_tenant: Option<TenantId>,
    next_id: TenantId,
    /// The sync rules (credit across sync gaps, sync anticipation, wakeup
    /// preemption by a returning tenant) are on.
    sync_rules: bool,
    usage_long: UsageRing,
    /// Waste accounting up to `observed_at` (see [`Core::observe`]).
    observed_at: Nanos,
    idle_with_work: Nanos,
    idle_capped: Nanos,
    anticipating: Nanos,
    handover: Nanos,
}

impl Core {
    /// An empty core.
    pub fn new(cfg: SchedulingConfig, tod: TimeOfDay) -> Self {
        Self {
            cfg,
            entities: BTreeMap::new(),
            waiters: HashMap::new(),
            running: None,
            class_clock: [0.0; 3],
            batch_credit: 0.0,
            tod,
            usage: UsageRing::new(),
            busy: 0,
            switches: 0,
            last_tenant: None,
            next_id: 1,
            sync_rules: true,
            usage_long: UsageRing::with(LONG_BUCKET, LONG_BUCKETS),
            observed_at: 0,
            idle_with_work: 0,
            idle_capped: 0,
            anticipating: 0,
            handover: 0,
        }
    }

    /// The settings in force.
    pub fn config(&self) -> SchedulingConfig {
        self.cfg
    }

    /// Turns the sync rules off (`false`: a tenant whose queue drained is
    /// treated like an idle one, as before they existed) or on (the
    /// default). The baseline of the share benchmark's synchronous cases.
    pub fn set_sync_rules(&mut self, on: bool) {
        self.sync_rules = on;
    }

    /// Sets a tenant's launch-to-start target (`target_wait_p99`): a
    /// realtime kernel that waits longer counts as a deadline miss.
    pub fn set_target_wait(&mut self, id: TenantId, target: Option<Duration>) {
        if let Some(e) = self.entities.get_mut(&id) {
            e.target_wait = target.map(|t| t.as_nanos() as Nanos);
        }
    }

    /// Sets the tuning controller's adjustment of a tenant's weight: the
    /// weight in force becomes the baseline (the schedule window's or the
    /// base weight) plus `adjust`, at least 1.
    pub fn set_weight_adjust(&mut self, id: TenantId, adjust: i32, now: Nanos) -> Effects {
        self.observe(now);
        self.charge(now);
        let tod = self.tod;
        let Some(e) = self.entities.get_mut(&id) else {
            return Effects::default();
        };
        e.adjust = adjust;
        e.weight = adjusted(effective_weight(e.base_weight, &e.schedule, tod), adjust);
        self.dispatch(now)
    }

    /// The `q` quantile (0–1) of the launch-to-start waits of the newest
    /// `newest` kernels of a tenant (at most [`RECENT_WAITS`]), and how many
    /// there were.
    pub fn wait_quantile(&self, id: TenantId, newest: u64, q: f64) -> Option<(Duration, usize)> {
        let e = self.entities.get(&id)?;
        let n = (newest.min(e.recent_waits.len() as u64)) as usize;
        if n == 0 {
            return None;
        }
        let mut w: Vec<Nanos> = e.recent_waits.iter().rev().take(n).copied().collect();
        w.sort_unstable();
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        Some((Duration::from_nanos(w[rank - 1]), n))
    }

    /// Accounts the time since the last event to the waste counters: the
    /// state (who holds the device, who waits) only changes in the core's
    /// methods, each of which calls this first.
    fn observe(&mut self, now: Nanos) {
        let dt = now.saturating_sub(self.observed_at);
        self.observed_at = self.observed_at.max(now);
        if dt == 0 {
            return;
        }
        let holder = self.running.map(|r| r.tenant);
        let mut waiting = self
            .entities
            .iter()
            .filter(|(id, e)| !e.waiting.is_empty() && Some(**id) != holder);
        if waiting.next().is_none() {
            return;
        }
        match self.running {
            None => {
                let t = self.observed_at - dt;
                let runnable = self
                    .entities
                    .iter()
                    .any(|(&id, e)| !e.waiting.is_empty() && self.eligible(id, e, t, false));
                if runnable {
                    self.idle_with_work += dt;
                } else {
                    self.idle_capped += dt;
                    for e in self.entities.values_mut() {
                        if !e.waiting.is_empty() {
                            e.capped_wait += dt;
                        }
                    }
                }
            }
            Some(r) if r.waiter.is_none() => self.anticipating += dt,
            Some(r) if !r.started => self.handover += dt,
            Some(_) => {}
        }
    }

    fn slice(&self) -> Nanos {
        (self.cfg.slice.as_nanos() as u64).max(1)
    }

    fn anticipation(&self) -> Nanos {
        (ANTICIPATION.as_nanos() as u64).min(self.slice() / 2)
    }

    /// Fixed-share token bucket capacity.
    fn token_cap(&self) -> f64 {
        self.slice() as f64
    }

    /// Registers a tenant.
    pub fn add_tenant(
        &mut self,
        name: &str,
        weight: u32,
        schedule: &[WeightWindow],
        priority: Priority,
        now: Nanos,
    ) -> TenantId {
        self.observe(now);
        let id = self.next_id;
        self.next_id += 1;
        self.charge(now);
        let cap = self.token_cap();
        self.entities.insert(
            id,
            Entity {
                name: name.to_string(),
                base_weight: weight,
                schedule: schedule.to_vec(),
                priority,
                weight: effective_weight(weight, schedule, self.tod),
                vtime: self.class_clock[class(priority)],
                waiting: VecDeque::new(),
                pending: 0,
                tokens: cap,
                tokens_at: now,
                usage: UsageRing::new(),
                busy: 0,
                kernels: 0,
                preemptions: 0,
                queue_wait: 0,
                recent_waits: VecDeque::new(),
                drained_at: None,
                recent_gaps: VecDeque::new(),
                returned: false,
                usage_long: UsageRing::with(LONG_BUCKET, LONG_BUCKETS),
                contended_by: BTreeMap::new(),
                target_wait: None,
                deadline_misses: 0,
                capped_wait: 0,
                adjust: 0,
                waits_recorded: 0,
            },
        );
        id
    }

    /// Forgets a tenant (it has no kernels left).
    pub fn remove_tenant(&mut self, id: TenantId, now: Nanos) -> Effects {
        self.observe(now);
        self.charge(now);
        if let Some(e) = self.entities.remove(&id) {
            for w in e.waiting {
                self.waiters.remove(&w);
            }
        }
        for e in self.entities.values_mut() {
            e.contended_by.remove(&id);
        }
        if self.running.is_some_and(|r| r.tenant == id) {
            self.running = None;
        }
        self.dispatch(now)
    }

    /// Changes a tenant's base weight and class.
    pub fn set_settings(
        &mut self,
        id: TenantId,
        weight: u32,
        priority: Priority,
        now: Nanos,
    ) -> Effects {
        self.observe(now);
        self.charge(now);
        let tod = self.tod;
        let Some(e) = self.entities.get_mut(&id) else {
            return Effects::default();
        };
        let moved = e.priority != priority;
        e.base_weight = weight;
        e.priority = priority;
        e.weight = adjusted(effective_weight(weight, &e.schedule, tod), e.adjust);
        if moved && e.pending > 0 {
            self.activate(id, now, false);
        }
        self.dispatch(now)
    }

    /// Changes the device's policy, slice and batch share.
    pub fn set_config(&mut self, cfg: SchedulingConfig, now: Nanos) -> Effects {
        self.observe(now);
        self.charge(now);
        let to_fixed = cfg.policy == Policy::Fixed && self.cfg.policy != Policy::Fixed;
        self.cfg = cfg;
        let cap = self.token_cap();
        if to_fixed {
            for e in self.entities.values_mut() {
                e.tokens = cap;
                e.tokens_at = now;
            }
        }
        let slice = self.slice();
        self.batch_credit = self
            .batch_credit
            .min(BATCH_CREDIT_SLICES * self.slice() as f64);
        if let Some(r) = self.running.as_mut() {
            r.slice_end = r.slice_end.min(now + slice);
        }
        self.dispatch(now)
    }

    /// Sets the local time of day (weights follow the tenants' schedules).
    pub fn set_time_of_day(&mut self, tod: TimeOfDay, now: Nanos) -> Effects {
        self.observe(now);
        if tod == self.tod {
            return Effects::default();
        }
        self.charge(now);
        self.tod = tod;
        let mut changed = false;
        for e in self.entities.values_mut() {
            let w = adjusted(effective_weight(e.base_weight, &e.schedule, tod), e.adjust);
            if w != e.weight {
                debug!(tenant = %e.name, from = e.weight, to = w, "time-of-day weight");
                e.weight = w;
                changed = true;
            }
        }
        if changed {
            self.dispatch(now)
        } else {
            Effects::default()
        }
    }

    /// A kernel of `id` was submitted (it may wait in its session's queue first).
    pub fn queued(&mut self, id: TenantId, now: Nanos) {
        self.observe(now);
        let Some(e) = self.entities.get_mut(&id) else {
            return;
        };
        e.pending += 1;
        if e.pending == 1 {
            // Bring the running tenant's virtual time up to date first, so
            // the newcomer starts level with it and not behind.
            self.charge(now);
            self.activate(id, now, true);
        }
    }

    /// A submitted kernel of `id` was dropped without finishing through
    /// [`Core::release`] (its session ended or its context was poisoned).
    pub fn unqueued(&mut self, id: TenantId, now: Nanos) -> Effects {
        self.observe(now);
        if let Some(e) = self.entities.get_mut(&id) {
            e.pending = e.pending.saturating_sub(1);
            if e.pending == 0 {
                self.note_drained(id, now);
            }
        }
        self.dispatch(now)
    }

    /// Notes that `id`'s queue drained now.
    fn note_drained(&mut self, id: TenantId, now: Nanos) {
        let floor = self.floor_of(id);
        if let Some(e) = self.entities.get_mut(&id) {
            e.drained_at = Some((now, floor));
        }
    }

    /// The least virtual time of the other active tenants of `id`'s class
    /// (the class clock if there are none).
    fn floor_of(&self, id: TenantId) -> f64 {
        let Some(c) = self.entities.get(&id).map(|e| class(e.priority)) else {
            return 0.0;
        };
        self.entities
            .iter()
            .filter(|(i, e)| **i != id && e.pending > 0 && class(e.priority) == c)
            .map(|(_, e)| e.vtime)
            .min_by(f64::total_cmp)
            .unwrap_or(self.class_clock[c])
    }

    /// A tenant with queued work again starts no earlier than the active
    /// tenants of its class: idle time earns no credit. A synchronous client
    /// back from a short gap (`sync`, at most [`SYNC_GAP`] since its queue
    /// drained) keeps up to [`SYNC_CREDIT_SLICES`] of the lag it had.
    fn activate(&mut self, id: TenantId, now: Nanos, sync: bool) {
        let slice = self.slice() as f64;
        let Some(c) = self.entities.get(&id).map(|e| class(e.priority)) else {
            return;
        };
        let gap = self
            .entities
            .get(&id)
            .and_then(|e| e.drained_at)
            .map(|(d, f)| (now.saturating_sub(d), f))
            .filter(|&(g, _)| sync && self.sync_rules && g <= self.sync_gap());
        let floor = self.floor_of(id);
        // One slice of the lightest active tenant of the class: the lag a
        // single slice of any of them may leave.
        let min_weight = self
            .entities
            .iter()
            .filter(|(i, e)| **i != id && e.pending > 0 && class(e.priority) == c)
            .map(|(_, e)| e.weight)
            .min()
            .unwrap_or(u32::MAX)
            .max(1);
        if let Some(e) = self.entities.get_mut(&id) {
            e.drained_at = None;
            match gap {
                Some((g, drain_floor)) => {
                    if e.recent_gaps.len() == RECENT_GAPS {
                        e.recent_gaps.pop_front();
                    }
                    e.recent_gaps.push_back(g);
                    // What the others ran during the gap is not held
                    // against the tenant; the lag it had when it drained
                    // counts up to a bound.
                    let unit = slice / f64::from(e.weight.min(min_weight));
                    e.vtime = e
                        .vtime
                        .max(drain_floor.min(floor) - SYNC_CREDIT_SLICES * unit)
                        .max(floor - SYNC_LAG_MAX_SLICES * unit);
                    e.returned = e.vtime < floor;
                }
                None => {
                    e.vtime = e.vtime.max(floor);
                    e.returned = false;
                }
            }
        }
    }

    /// Longest sync gap: [`SYNC_GAP`].
    fn sync_gap(&self) -> Nanos {
        SYNC_GAP.as_nanos() as Nanos
    }

    /// How long the device is kept for tenant `e` after its queue drained:
    /// its think time (the 75th percentile of its recent sync gaps, with
    /// half again as margin), at most [`SYNC_ANTICIPATION_MAX`] and half a
    /// slice; zero for a tenant with no history of sync gaps.
    fn sync_window(&self, e: &Entity) -> Nanos {
        if e.recent_gaps.len() < 2 {
            return 0;
        }
        let p75 = think_p75(&e.recent_gaps);
        let cap = (SYNC_ANTICIPATION_MAX.as_nanos() as Nanos).min(self.slice() / 2);
        if p75 > cap {
            // Think times longer than the window: holding the device
            // would idle it and still miss.
            return 0;
        }
        (p75 + p75 / 2 + 20_000).min(cap)
    }

    /// Kernel `waiter` of `id` asks for the device (`queued_at`: its launch
    /// time, on its first run).
    pub fn arrive(
        &mut self,
        id: TenantId,
        waiter: WaiterId,
        queued_at: Option<Nanos>,
        now: Nanos,
    ) -> Effects {
        self.observe(now);
        // Charge the running kernel first: contention is counted from here.
        self.charge(now);
        let Some(e) = self.entities.get_mut(&id) else {
            return Effects::default();
        };
        e.waiting.push_back(waiter);
        self.waiters.insert(
            waiter,
            Waiter {
                tenant: id,
                queued_at,
            },
        );
        self.dispatch(now)
    }

    /// A waiter gave up before it was granted the device (its session ended).
    pub fn cancel(&mut self, waiter: WaiterId, now: Nanos) -> Effects {
        self.observe(now);
        self.charge(now);
        if let Some(w) = self.waiters.remove(&waiter)
            && let Some(e) = self.entities.get_mut(&w.tenant)
        {
            e.waiting.retain(|x| *x != waiter);
        }
        self.dispatch(now)
    }

    /// The granted kernel `waiter` starts running on the device now. Its
    /// launch-to-start wait ends here, and so does the hand-over: the time
    /// from the grant to the start (the kernel's thread waking up) is
    /// charged to nobody.
    pub fn started(&mut self, waiter: WaiterId, now: Nanos) {
        self.observe(now);
        let cap = self.token_cap();
        let slice = self.slice();
        let Some(r) = self.running.as_mut() else {
            return;
        };
        if r.waiter != Some(waiter) || r.started {
            return;
        }
        r.started = true;
        r.seg_start = r.seg_start.max(now);
        let (id, start, queued_at) = (r.tenant, r.seg_start, r.queued_at.take());
        let Some(s) = self.entities.get(&id).map(|e| self.share_of(e)) else {
            return;
        };
        let Some(e) = self.entities.get_mut(&id) else {
            return;
        };
        e.tokens = (e.tokens + s * start.saturating_sub(e.tokens_at) as f64).min(cap);
        e.tokens_at = start;
        if let Some(q) = queued_at {
            let wait = start.saturating_sub(q);
            e.queue_wait += wait;
            let deadline = e.target_wait.unwrap_or(2 * slice);
            if e.priority == Priority::Realtime && wait > deadline {
                e.deadline_misses += 1;
            }
            if e.recent_waits.len() == RECENT_WAITS {
                e.recent_waits.pop_front();
            }
            e.recent_waits.push_back(wait);
            e.waits_recorded += 1;
        }
    }

    /// The running kernel `waiter` stopped.
    pub fn release(&mut self, waiter: WaiterId, outcome: Outcome, now: Nanos) -> Effects {
        self.observe(now);
        let Some(r) = self.running else {
            return Effects::default();
        };
        if r.waiter != Some(waiter) {
            return Effects::default();
        }
        self.charge(now);
        let anticipation = self.anticipation();
        let Some(e) = self.entities.get_mut(&r.tenant) else {
            self.running = None;
            return self.dispatch(now);
        };
        match outcome {
            Outcome::Completed => {
                e.kernels += 1;
                e.pending = e.pending.saturating_sub(1);
            }
            Outcome::Failed => e.pending = e.pending.saturating_sub(1),
            Outcome::Yielded => {
                if r.preempting {
                    e.preemptions += 1;
                }
            }
        }
        let more = e.pending > 0;
        let queued = !e.waiting.is_empty();
        if !more && !queued {
            self.note_drained(r.tenant, now);
        }
        if r.preempting {
            self.running = None;
        } else if more || queued {
            if let Some(run) = self.running.as_mut() {
                run.waiter = None;
                run.drained = false;
                run.anticipate_until = now + anticipation;
            }
        } else {
            // Drained. Keep the device for the tenant's next batch if it is
            // a synchronous client that would be picked next anyway.
            let window = self
                .entities
                .get(&r.tenant)
                .map_or(0, |e| self.sync_window(e));
            let behind = window > 0
                && self.sync_rules
                && r.kind == GrantKind::Share
                && self.pick(now, Some(r.tenant)).map(|p| p.0) == Some(r.tenant);
            if behind && let Some(run) = self.running.as_mut() {
                run.waiter = None;
                run.drained = true;
                run.anticipate_until = now + window;
            } else {
                self.running = None;
            }
        }
        self.dispatch(now)
    }

    /// Time-driven re-evaluation (slice ends, caps, credits, anticipation).
    pub fn tick(&mut self, now: Nanos) -> Effects {
        self.observe(now);
        self.charge(now);
        self.dispatch(now)
    }

    /// The waiter holding the device with a kernel running, if any.
    pub fn running_waiter(&self) -> Option<WaiterId> {
        self.running.and_then(|r| r.waiter)
    }

    /// Ends a sync anticipation whose tenant has nothing queued (the device
    /// is free; used before switching scheduling off).
    pub fn end_idle_anticipation(&mut self, now: Nanos) {
        self.observe(now);
        if let Some(r) = self.running
            && r.drained
            && r.waiter.is_none()
            && self.entities.get(&r.tenant).is_none_or(|e| e.pending == 0)
        {
            self.running = None;
        }
    }

    /// Whether anything is queued, waiting or running.
    pub fn busy(&self) -> bool {
        self.running.is_some()
            || !self.waiters.is_empty()
            || self.entities.values().any(|e| e.pending > 0)
    }

    fn share_of(&self, e: &Entity) -> f64 {
        let total: u64 = self.entities.values().map(|e| u64::from(e.weight)).sum();
        if total == 0 {
            1.0
        } else {
            f64::from(e.weight) / total as f64
        }
    }

    /// Token balance of `id` at `now`.
    fn tokens_now(&self, id: TenantId, e: &Entity, now: Nanos) -> f64 {
        let s = self.share_of(e);
        let dt = now.saturating_sub(e.tokens_at) as f64;
        match self.running {
            Some(r) if r.tenant == id && r.waiter.is_some() && r.started => {
                e.tokens + (s - 1.0) * dt
            }
            _ => (e.tokens + s * dt).min(self.token_cap()),
        }
    }

    /// Whether `id` may run under the fixed policy: a holder while it has
    /// tokens, another tenant only with a full bucket (one slice).
    fn eligible(&self, id: TenantId, e: &Entity, now: Nanos, holder: bool) -> bool {
        if self.cfg.policy != Policy::Fixed {
            return true;
        }
        let t = self.tokens_now(id, e, now);
        if holder {
            t > BALANCE_EPS
        } else {
            t >= self.token_cap() - BALANCE_EPS
        }
    }

    /// Charges the running kernel's use of the device up to `now`.
    fn charge(&mut self, now: Nanos) {
        let Some(r) = self.running.as_mut() else {
            return;
        };
        if r.waiter.is_none() || !r.started || now <= r.seg_start {
            return;
        }
        let (a, id) = (r.seg_start, r.tenant);
        r.seg_start = now;
        let d = now - a;
        let df = d as f64;
        let Some(e) = self.entities.get(&id) else {
            return;
        };
        let s = self.share_of(e);
        let c = class(e.priority);
        let batch_active = self
            .entities
            .values()
            .any(|x| class(x.priority) == BATCH && x.pending > 0);
        let Some(e) = self.entities.get_mut(&id) else {
            return;
        };
        e.vtime += df / f64::from(e.weight.max(1));
        e.busy += d;
        e.usage.add(a, now);
        e.usage_long.add(a, now);
        e.tokens += (s - 1.0) * now.saturating_sub(e.tokens_at) as f64;
        e.tokens_at = now;
        self.busy += d;
        self.usage.add(a, now);
        self.usage_long.add(a, now);
        for (&x, o) in self.entities.iter_mut() {
            if x != id && !o.waiting.is_empty() {
                let c = o
                    .contended_by
                    .entry(id)
                    .or_insert_with(|| (0, UsageRing::with(CONTENTION_BUCKET, CONTENTION_BUCKETS)));
                c.0 += d;
                c.1.add(a, now);
            }
        }
        let slice = self.slice() as f64;
        if c == BATCH {
            // A little debt (the block run after the credit ran out) is
            // paid back from the next credit.
            self.batch_credit = (self.batch_credit - df).max(-slice);
        } else if batch_active && self.cfg.batch_min_share > 0 {
            let p = f64::from(self.cfg.batch_min_share.min(99));
            self.batch_credit =
                (self.batch_credit + df * p / (100.0 - p)).min(BATCH_CREDIT_SLICES * slice);
        }
        if let Some(min) = self
            .entities
            .values()
            .filter(|x| x.pending > 0 && class(x.priority) == c)
            .map(|x| x.vtime)
            .min_by(f64::total_cmp)
        {
            self.class_clock[c] = self.class_clock[c].max(min);
        }
    }

    /// The tenant that should hold the device now: eligible tenants with a
    /// waiting kernel (and `holder`, which holds it), by class, then least
    /// virtual time; a batch tenant with a slice of credit goes first.
    fn pick(&self, now: Nanos, holder: Option<TenantId>) -> Option<(TenantId, GrantKind)> {
        let mut best: [Option<(f64, bool, TenantId)>; 3] = [None; 3];
        for (&id, e) in &self.entities {
            let is_holder = holder == Some(id);
            if !is_holder && e.waiting.is_empty() {
                continue;
            }
            if !self.eligible(id, e, now, is_holder) {
                continue;
            }
            // Ties go to a waiting tenant: at the end of a slice the holder
            // gives way to an equal (round robin).
            let key = (e.vtime, is_holder, id);
            let slot = &mut best[class(e.priority)];
            let better = match slot {
                None => true,
                Some(b) => {
                    key.0
                        .total_cmp(&b.0)
                        .then(key.1.cmp(&b.1))
                        .then(key.2.cmp(&b.2))
                        == std::cmp::Ordering::Less
                }
            };
            if better {
                *slot = Some(key);
            }
        }
        if let Some(b) = best[BATCH]
            && self.cfg.batch_min_share > 0
            && self.batch_credit >= self.slice() as f64 - BALANCE_EPS
        {
            return Some((b.2, GrantKind::BatchCredit));
        }
        best.iter()
            .flatten()
            .next()
            .map(|b| (b.2, GrantKind::Share))
    }

    /// Whether an eligible tenant of a class above `c` has a kernel waiting.
    fn higher_class_waiting(&self, c: usize, now: Nanos) -> bool {
        self.entities.iter().any(|(&id, e)| {
            class(e.priority) < c && !e.waiting.is_empty() && self.eligible(id, e, now, false)
        })
    }

    /// Whether a tenant of the holder's class, back from a sync gap with
    /// credit, waits behind the holder in virtual time: it takes the device
    /// at the next preemption point instead of at the end of the slice
    /// (the sync gap let the holder run ahead of its share).
    fn returned_behind(&self, holder: TenantId, now: Nanos) -> bool {
        let Some(h) = self.entities.get(&holder) else {
            return false;
        };
        if self.cfg.policy != Policy::Fair {
            return false;
        }
        self.entities.iter().any(|(&id, e)| {
            id != holder
                && e.returned
                && !e.waiting.is_empty()
                && class(e.priority) == class(h.priority)
                && e.vtime < h.vtime
                && self.eligible(id, e, now, false)
        })
    }

    fn begin_grant(&mut self, id: TenantId, kind: GrantKind, now: Nanos) -> Effects {
        if self.last_tenant != Some(id) {
            self.switches += 1;
            self.last_tenant = Some(id);
        }
        self.running = Some(Running {
            tenant: id,
            waiter: None,
            seg_start: now,
            started: false,
            queued_at: None,
            slice_end: now + self.slice(),
            anticipate_until: now,
            drained: false,
            kind,
            preempting: false,
        });
        self.begin_segment(now)
    }

    /// The holder's next waiting kernel starts.
    fn begin_segment(&mut self, now: Nanos) -> Effects {
        let Some(id) = self.running.map(|r| r.tenant) else {
            return Effects::default();
        };
        let cap = self.token_cap();
        let Some(e) = self.entities.get(&id) else {
            return Effects::default();
        };
        let s = self.share_of(e);
        let Some(e) = self.entities.get_mut(&id) else {
            return Effects::default();
        };
        let Some(w) = e.waiting.pop_front() else {
            return Effects::default();
        };
        e.returned = false;
        e.tokens = (e.tokens + s * now.saturating_sub(e.tokens_at) as f64).min(cap);
        e.tokens_at = now;
        let queued_at = self.waiters.remove(&w).and_then(|x| x.queued_at);
        if let Some(r) = self.running.as_mut() {
            r.waiter = Some(w);
            r.seg_start = now;
            r.started = false;
            r.queued_at = queued_at;
            r.preempting = false;
            r.drained = false;
        }
        Effects {
            grant: Some(w),
            preempt: None,
        }
    }

    /// Re-evaluates who holds the device.
    fn dispatch(&mut self, now: Nanos) -> Effects {
        let mut fx = Effects::default();
        // Each pass either settles or ends the current grant; two suffice.
        for _ in 0..3 {
            let Some(r) = self.running else {
                if let Some((id, kind)) = self.pick(now, None) {
                    fx.merge(self.begin_grant(id, kind, now));
                }
                return fx;
            };
            let Some(e) = self.entities.get(&r.tenant) else {
                self.running = None;
                continue;
            };
            let c = class(e.priority);
            match r.waiter {
                None => {
                    // Between two kernels of the holder (or, `drained`,
                    // between two batches of a synchronous holder).
                    let mut end = (e.pending == 0 && !r.drained)
                        || (r.kind == GrantKind::Share && self.higher_class_waiting(c, now))
                        || !self.eligible(r.tenant, e, now, true);
                    if !end && r.drained && e.waiting.is_empty() {
                        // Kept for a synchronous holder only while it would
                        // be picked anyway.
                        end = self.pick(now, Some(r.tenant)).map(|p| p.0) != Some(r.tenant);
                    }
                    if !end && now >= r.slice_end {
                        // The slice ended: the holder competes as if its
                        // next kernel were already here.
                        match self.pick(now, Some(r.tenant)) {
                            Some((id, _)) if id != r.tenant => end = true,
                            _ => {
                                let slice = self.slice();
                                if let Some(run) = self.running.as_mut() {
                                    run.slice_end = now + slice;
                                    run.kind = GrantKind::Share;
                                }
                            }
                        }
                    }
                    if !end && !e.waiting.is_empty() {
                        fx.merge(self.begin_segment(now));
                        return fx;
                    }
                    if end || now >= r.anticipate_until {
                        if !end
                            && self.sync_rules
                            && e.pending > 0
                            && self.cfg.policy == Policy::Fair
                        {
                            // Its next kernel is late (a loaded host): it
                            // may take the device back at the next
                            // preemption point if it is behind, as after a
                            // sync gap.
                            if let Some(e) = self.entities.get_mut(&r.tenant) {
                                e.returned = true;
                            }
                        }
                        self.running = None;
                        continue;
                    }
                    return fx;
                }
                Some(w) => {
                    if r.preempting {
                        return fx;
                    }
                    let mut kind = r.kind;
                    if kind == GrantKind::BatchCredit {
                        let used = now.saturating_sub(r.seg_start) as f64;
                        if self.batch_credit - used <= BALANCE_EPS {
                            kind = GrantKind::Share;
                            if let Some(run) = self.running.as_mut() {
                                run.kind = kind;
                            }
                        }
                    }
                    let outranked = kind == GrantKind::Share
                        && (self.higher_class_waiting(c, now)
                            || self.returned_behind(r.tenant, now));
                    let preempt = if outranked || !self.eligible(r.tenant, e, now, true) {
                        true
                    } else if now >= r.slice_end {
                        match self.pick(now, Some(r.tenant)) {
                            Some((id, _)) if id != r.tenant => true,
                            _ => {
                                let slice = self.slice();
                                if let Some(run) = self.running.as_mut() {
                                    run.slice_end = now + slice;
                                }
                                false
                            }
                        }
                    } else {
                        false
                    };
                    if preempt {
                        if let Some(run) = self.running.as_mut() {
                            run.preempting = true;
                        }
                        fx.preempt = Some(w);
                    }
                    return fx;
                }
            }
        }
        fx
    }

    /// When [`Core::tick`] must run next (None: only on other events).
    pub fn next_wake(&self, now: Nanos) -> Option<Nanos> {
        let fixed = self.cfg.policy == Policy::Fixed;
        match self.running {
            Some(r) => {
                let e = self.entities.get(&r.tenant)?;
                let others = self
                    .entities
                    .iter()
                    .any(|(&id, x)| id != r.tenant && !x.waiting.is_empty());
                if r.waiter.is_none() {
                    let mut t = r.anticipate_until;
                    if others {
                        t = t.min(r.slice_end.max(now));
                    }
                    return Some(t);
                }
                if r.preempting {
                    return None;
                }
                let mut t: Option<Nanos> = None;
                let mut at = |x: Nanos| t = Some(t.map_or(x, |y| y.min(x)));
                if others {
                    at(r.slice_end);
                }
                let s = self.share_of(e);
                if fixed && s < 1.0 {
                    let left = self.tokens_now(r.tenant, e, now).max(0.0);
                    at(now + (left / (1.0 - s)).ceil() as Nanos);
                }
                if r.kind == GrantKind::BatchCredit {
                    let used = now.saturating_sub(r.seg_start) as f64;
                    at(now + (self.batch_credit - used).max(0.0).ceil() as Nanos);
                }
                t
            }
            None if fixed => self
                .entities
                .iter()
                .filter(|(_, e)| !e.waiting.is_empty())
                .map(|(&id, e)| {
                    let s = self.share_of(e).max(f64::MIN_POSITIVE);
                    let missing = (self.token_cap() - self.tokens_now(id, e, now)).max(0.0);
                    now + (missing / s).ceil() as Nanos
                })
                .min(),
            None => None,
        }
    }

    /// Statistics of a tenant.
    pub fn stats(&self, id: TenantId, now: Nanos) -> Option<SchedStats> {
        let e = self.entities.get(&id)?;
        let running_since = self
            .running
            .filter(|r| r.tenant == id && r.waiter.is_some() && r.started)
            .map(|r| r.seg_start);
        let extra = running_since.map_or(0, |s| now.saturating_sub(s));
        let mut waits: Vec<Nanos> = e.recent_waits.iter().copied().collect();
        waits.sort_unstable();
        let pct = |p: f64| -> Duration {
            if waits.is_empty() {
                return Duration::ZERO;
            }
            let rank = ((p / 100.0) * waits.len() as f64).ceil() as usize;
            Duration::from_nanos(waits[rank.clamp(1, waits.len()) - 1])
        };
        Some(SchedStats {
            weight: e.weight,
            baseline_weight: effective_weight(e.base_weight, &e.schedule, self.tod),
            weight_adjust: e.adjust,
            waits_recorded: e.waits_recorded,
            priority: e.priority,
            busy: Duration::from_nanos(e.busy + extra),
            kernels: e.kernels,
            preemptions: e.preemptions,
            queued: e.pending,
            queue_wait: Duration::from_nanos(e.queue_wait),
            queue_wait_p50: pct(50.0),
            queue_wait_p90: pct(90.0),
            queue_wait_p99: pct(99.0),
            target_wait: e.target_wait.map(Duration::from_nanos),
            deadline_misses: e.deadline_misses,
            capped_wait: Duration::from_nanos(e.capped_wait),
            think_time: Duration::from_nanos(think_p75(&e.recent_gaps)),
            share_1s: e.usage.share(Duration::from_secs(1), now, running_since),
            share_10s: e.usage.share(Duration::from_secs(10), now, running_since),
            share_60s: e.usage.share(Duration::from_secs(60), now, running_since),
            share_10m: e
                .usage_long
                .share(Duration::from_secs(600), now, running_since),
        })
    }

    /// The contention between every pair of tenants that contended.
    fn contention(&self, now: Nanos) -> Vec<Contention> {
        let mut v = Vec::new();
        for e in self.entities.values() {
            for (r, (total, ring)) in &e.contended_by {
                let Some(running) = self.entities.get(r) else {
                    continue;
                };
                let hour = CONTENTION_BUCKET * CONTENTION_BUCKETS as Nanos;
                let last_hour = ring.used(now.saturating_sub(hour), now) as Nanos;
                let peak = ring.peak();
                v.push(Contention {
                    waiting: e.name.clone(),
                    running: running.name.clone(),
                    total: Duration::from_nanos(*total),
                    last_hour: Duration::from_nanos(last_hour),
                    peak_minute_ago: peak.map(|p| Duration::from_nanos(now.saturating_sub(p.0))),
                    peak_minute: Duration::from_nanos(peak.map_or(0, |p| p.1)),
                });
            }
        }
        v.sort_by_key(|c| std::cmp::Reverse(c.total));
        v
    }

    /// Statistics of the device.
    pub fn device_stats(&self, now: Nanos) -> DeviceSchedStats {
        let running_since = self
            .running
            .filter(|r| r.waiter.is_some() && r.started)
            .map(|r| r.seg_start);
        let extra = running_since.map_or(0, |s| now.saturating_sub(s));
        DeviceSchedStats {
            busy: Duration::from_nanos(self.busy + extra),
            utilization_1s: self.usage.share(Duration::from_secs(1), now, running_since),
            utilization_10s: self
                .usage
                .share(Duration::from_secs(10), now, running_since),
            utilization_60s: self
                .usage
                .share(Duration::from_secs(60), now, running_since),
            utilization_10m: self
                .usage_long
                .share(Duration::from_secs(600), now, running_since),
            idle_with_work: Duration::from_nanos(self.idle_with_work),
            idle_capped: Duration::from_nanos(self.idle_capped),
            anticipation: Duration::from_nanos(self.anticipating),
            handover: Duration::from_nanos(self.handover),
            contention: self.contention(now),
            switches: self.switches,
            preemptions: self.entities.values().map(|e| e.preemptions).sum(),
        }
    }
}

// ---------------------------------------------------------------------------
// The threaded scheduler

/// Why a kernel did not get the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the launch was cancelled while it waited for the device")]
pub struct Cancelled;

struct State {
    core: Core,
    controls: HashMap<WaiterId, Arc<RunControl>>,
    next_waiter: WaiterId,
    /// `false`: kernels take the device first come, first served, with no
    /// slices, caps, priorities or accounting (a baseline for benchmarks).
    enabled: bool,
    /// With scheduling off: the tenant whose kernels hold the device, and
    /// how many of them run.
    bypass: Option<(TenantId, usize)>,
    /// Kernels of one tenant running at once under one grant, by the core
    /// waiter that holds the device for them (see [`KernelTicket::acquire`]).
    holds: HashMap<WaiterId, Vec<WaiterId>>,
    /// The hold each running kernel belongs to.
    member_of: HashMap<WaiterId, WaiterId>,
    shutdown: bool,
    tod_read: Option<Nanos>,
    wake: Option<Nanos>,
}

struct Inner {
    device: String,
    state: Mutex<State>,
    /// Waiters wait here for their grant.
    granted: Condvar,
    /// The timer thread waits here for its next deadline.
    timer: Condvar,
    clock: Arc<dyn Clock>,
    epoch: Instant,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> Nanos {
        // Starts at 1 so that 0 never means "now".
        self.epoch.elapsed().as_nanos() as Nanos + 1
    }

    /// Re-reads the time of day when it is due.
    fn refresh_time_of_day(&self, st: &mut State, now: Nanos) {
        let due = st
            .tod_read
            .is_none_or(|t| now.saturating_sub(t) >= TIME_OF_DAY_REFRESH.as_nanos() as Nanos);
        if due {
            st.tod_read = Some(now);
            let fx = st.core.set_time_of_day(self.clock.time_of_day(), now);
            self.apply(st, fx, now);
        }
    }

    fn apply(&self, st: &mut State, fx: Effects, now: Nanos) {
        if let Some(w) = fx.grant {
            if let Some(c) = st.controls.get(&w) {
                // Cleared here, under the lock, so a preemption requested
                // right after the grant is not lost.
                c.clear_yield();
            }
            self.granted.notify_all();
        }
        if let Some(w) = fx.preempt {
            // Every kernel running under the grant yields.
            let members = st.holds.get(&w).cloned().unwrap_or_else(|| vec![w]);
            for m in members {
                if let Some(c) = st.controls.get(&m) {
                    c.request_yield();
                }
            }
        }
        let wake = st.core.next_wake(now);
        if wake != st.wake {
            st.wake = wake;
            self.timer.notify_one();
        }
    }
}

fn timer_loop(inner: &Inner) {
    let mut st = inner.lock();
    loop {
        if st.shutdown {
            return;
        }
        let now = inner.now();
        if st.core.busy() {
            inner.refresh_time_of_day(&mut st, now);
        }
        match st.wake {
            Some(w) if w <= now => {
                let fx = st.core.tick(now);
                inner.apply(&mut st, fx, now);
                // A tick that settles nothing (rounding at a balance's
                // threshold) retries shortly instead of spinning.
                if st.wake.is_some_and(|w| w <= now) {
                    st.wake = Some(now + MIN_TIMER_STEP.as_nanos() as Nanos);
                }
            }
            wake => {
                let mut sleep = wake.map_or(Duration::MAX, |w| Duration::from_nanos(w - now));
                if st.core.busy() {
                    sleep = sleep.min(TIME_OF_DAY_REFRESH);
                }
                st = if sleep == Duration::MAX {
                    inner.timer.wait(st).unwrap_or_else(|p| p.into_inner())
                } else {
                    inner
                        .timer
                        .wait_timeout(st, sleep)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                };
            }
        }
    }
}

/// The compute scheduler of one device.
pub struct Scheduler {
    inner: Arc<Inner>,
    timer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("device", &self.inner.device)
            .field("config", &self.config())
            .finish()
    }
}

impl Scheduler {
    /// A scheduler for device `device`, reading the time of day from `clock`.
    pub fn new(device: &str, cfg: SchedulingConfig, clock: Arc<dyn Clock>) -> Self {
        let tod = clock.time_of_day();
        Self {
            inner: Arc::new(Inner {
                device: device.to_string(),
                state: Mutex::new(State {
                    core: Core::new(cfg, tod),
                    controls: HashMap::new(),
                    next_waiter: 1,
                    enabled: true,
                    bypass: None,
                    holds: HashMap::new(),
                    member_of: HashMap::new(),
                    shutdown: false,
                    tod_read: None,
                    wake: None,
                }),
                granted: Condvar::new(),
                timer: Condvar::new(),
                clock,
                epoch: Instant::now(),
            }),
            timer: Mutex::new(None),
        }
    }

    fn ensure_timer(&self) {
        let mut t = self.timer.lock().unwrap_or_else(|p| p.into_inner());
        if t.is_some() {
            return;
        }
        let inner = Arc::clone(&self.inner);
        match std::thread::Builder::new()
            .name(format!("vgpu-sched-{}", self.inner.device))
            .spawn(move || timer_loop(&inner))
        {
            Ok(h) => *t = Some(h),
            Err(e) => {
                tracing::error!(device = %self.inner.device, error = %e, "cannot start the scheduler timer; slices end only when kernels do")
            }
        }
    }

    /// The settings in force.
    pub fn config(&self) -> SchedulingConfig {
        self.inner.lock().core.config()
    }

    /// Changes policy, slice length and batch share; takes effect at once.
    pub fn set_config(&self, cfg: SchedulingConfig) {
        let now = self.inner.now();
        let mut st = self.inner.lock();
        let fx = st.core.set_config(cfg, now);
        self.inner.apply(&mut st, fx, now);
        info!(device = %self.inner.device, policy = cfg.policy.as_str(), slice_ms = cfg.slice.as_secs_f64() * 1e3, batch_min_share = cfg.batch_min_share, "scheduling settings");
    }

    /// Whether the scheduler is enabled (see [`Scheduler::set_enabled`]).
    pub fn enabled(&self) -> bool {
        self.inner.lock().enabled
    }

    /// Turns scheduling off (`false`: kernels take the device first come,
    /// first served, with no slices, caps, priorities or accounting) or back
    /// on. A baseline for benchmarks and a diagnostic; refused while kernels
    /// are queued or running, so the two modes never share the device.
    pub fn set_enabled(&self, enabled: bool) -> Result<(), String> {
        let now = self.inner.now();
        let mut st = self.inner.lock();
        if st.enabled == enabled {
            return Ok(());
        }
        st.core.end_idle_anticipation(now);
        if st.core.busy() || st.bypass.is_some() {
            return Err(format!(
                "device `{}` has kernels queued or running; switch scheduling on or off when it is idle",
                self.inner.device
            ));
        }
        st.enabled = enabled;
        Ok(())
    }

    /// Registers the tenant of a VM entry.
    pub fn add_tenant(&self, vm: &VmConfig) -> TenantId {
        let now = self.inner.now();
        let mut st = self.inner.lock();
        let id = st
            .core
            .add_tenant(&vm.name, vm.weight, &vm.schedule, vm.priority, now);
        st.core.set_target_wait(id, vm.tuning.target_wait_p99);
        id
    }

    /// Forgets a tenant.
    pub fn remove_tenant(&self, id: TenantId) {
        let now = self.inner.now();
        let mut st = self.inner.lock();
        let fx = st.core.remove_tenant(id, now);
        self.inner.apply(&mut st, fx, now);
    }

    /// Changes a tenant's base weight and class (live).
    pub fn set_settings(&self, id: TenantId, weight: u32, priority: Priority) {
        let now = self.inner.now();
        let mut st = self.inner.lock();
        let fx = st.core.set_settings(id, weight, priority, now);
        self.inner.apply(&mut st, fx, now);
    }

    /// Notes a kernel launch of tenant `id`; the ticket asks for the device
    /// when the kernel reaches the head of its session's queue.
    pub fn queue_kernel(&self, id: TenantId) -> KernelTicket {
        self.ensure_timer();
        let now = self.inner.now();
        let mut st = self.inner.lock();
        st.core.queued(id, now);
        KernelTicket {
            inner: Arc::clone(&self.inner),
            tenant: id,
            queued_at: now,
            started: false,
            finished: false,
        }
    }

    /// Sets the tuning controller's weight adjustment of a tenant (see
    /// [`Core::set_weight_adjust`]).
    pub fn set_weight_adjust(&self, id: TenantId, adjust: i32) {
        let now = self.inner.now();
        let mut st = self.inner.lock();
        let fx = st.core.set_weight_adjust(id, adjust, now);
        self.inner.apply(&mut st, fx, now);
    }

    /// See [`Core::wait_quantile`].
    pub fn wait_quantile(&self, id: TenantId, newest: u64, q: f64) -> Option<(Duration, usize)> {
        self.inner.lock().core.wait_quantile(id, newest, q)
    }

    /// Sets a tenant's launch-to-start target (see [`Core::set_target_wait`]).
    pub fn set_target_wait(&self, id: TenantId, target: Option<Duration>) {
        self.inner.lock().core.set_target_wait(id, target);
    }

    /// Turns the sync rules on or off (see [`Core::set_sync_rules`]).
    pub fn set_sync_rules(&self, on: bool) {
        self.inner.lock().core.set_sync_rules(on);
    }

    /// Statistics of a tenant.
    pub fn stats(&self, id: TenantId) -> Option<SchedStats> {
        let now = self.inner.now();
        self.inner.lock().core.stats(id, now)
    }

    /// Statistics of the device.
    pub fn device_stats(&self) -> DeviceSchedStats {
        let now = self.inner.now();
        self.inner.lock().core.device_stats(now)
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.inner.lock().shutdown = true;
        self.inner.timer.notify_all();
        if let Some(t) = self.timer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// A launched kernel's place with the scheduler, from launch to completion.
/// Dropping it unfinished (the session ended, the context was poisoned)
/// tells the scheduler the kernel will not come.
pub struct KernelTicket {
    inner: Arc<Inner>,
    tenant: TenantId,
    queued_at: Nanos,
    started: bool,
    finished: bool,
}

impl std::fmt::Debug for KernelTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelTicket")
            .field("tenant", &self.tenant)
            .field("started", &self.started)
            .finish()
    }
}

impl KernelTicket {
    /// Waits until the kernel may run on the device. Fails when `control`
    /// is cancelled meanwhile.
    pub fn acquire(&mut self, control: &Arc<RunControl>) -> Result<Grant<'_>, Cancelled> {
        let inner = Arc::clone(&self.inner);
        // Wake the wait below when the session cancels the launch.
        let hook_inner = Arc::clone(&inner);
        control.attach(Arc::new(move |s| {
            if s == Signal::Cancel {
                let _st = hook_inner.lock();
                hook_inner.granted.notify_all();
            }
        }));
        let r = self.wait_for_grant(&inner, control);
        control.detach();
        let waiter = r?;
        self.started = true;
        Ok(Grant {
            ticket: self,
            waiter,
            done: false,
        })
    }

    fn wait_for_grant(
        &self,
        inner: &Inner,
        control: &Arc<RunControl>,
    ) -> Result<Option<WaiterId>, Cancelled> {
        let mut st = inner.lock();
        if !st.enabled {
            // First come, first served; kernels of the tenant holding the
            // device run alongside each other.
            while st.bypass.is_some_and(|(t, _)| t != self.tenant) {
                if control.cancelled() {
                    return Err(Cancelled);
                }
                st = inner.granted.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if control.cancelled() {
                return Err(Cancelled);
            }
            let n = st.bypass.map_or(0, |(_, n)| n);
            st.bypass = Some((self.tenant, n + 1));
            control.clear_yield();
            return Ok(None);
        }
        let now = inner.now();
        inner.refresh_time_of_day(&mut st, now);
        let id = st.next_waiter;
        st.next_waiter += 1;
        st.controls.insert(id, Arc::clone(control));
        let queued_at = (!self.started).then_some(self.queued_at);
        if self.join(&mut st, id, queued_at, now) {
            return Ok(Some(id));
        }
        let fx = st.core.arrive(self.tenant, id, queued_at, now);
        inner.apply(&mut st, fx, now);
        loop {
            if st.core.running_waiter() == Some(id) {
                let now = inner.now();
                st.core.started(id, now);
                st.holds.insert(id, vec![id]);
                st.member_of.insert(id, id);
                // Kernels of the tenant waiting behind this one may join it now.
                inner.granted.notify_all();
                return Ok(Some(id));
            }
            if control.cancelled() {
                st.controls.remove(&id);
                let now = inner.now();
                let fx = st.core.cancel(id, now);
                inner.apply(&mut st, fx, now);
                return Err(Cancelled);
            }
            // Another kernel of this tenant got the device meanwhile: run
            // alongside it instead of waiting for it.
            let now = inner.now();
            if st.core.joinable(self.tenant).is_some() {
                let fx = st.core.cancel(id, now);
                inner.apply(&mut st, fx, now);
                if self.join(&mut st, id, queued_at, now) {
                    return Ok(Some(id));
                }
                let fx = st.core.arrive(self.tenant, id, queued_at, now);
                inner.apply(&mut st, fx, now);
            }
            st = inner.granted.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Runs kernel `id` under the grant of a kernel of the same tenant that
    /// holds the device and is not being preempted: the tenant's kernels of
    /// different streams share the device as they would share a GPU. The
    /// tenant's device time is the time it holds the device, however many
    /// of its kernels run; a preemption stops them all.
    fn join(&self, st: &mut State, id: WaiterId, queued_at: Option<Nanos>, now: Nanos) -> bool {
        let Some(hold) = st.core.joinable(self.tenant) else {
            return false;
        };
        let Some(members) = st.holds.get_mut(&hold) else {
            return false;
        };
        members.push(id);
        st.member_of.insert(id, hold);
        st.core.joined(self.tenant, queued_at, now);
        if let Some(c) = st.controls.get(&id) {
            c.clear_yield();
        }
        true
    }

    /// When the kernel was launched, on the scheduler's clock.
    pub fn queued_at(&self) -> Nanos {
        self.queued_at
    }
}

impl Drop for KernelTicket {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let now = self.inner.now();
        let mut st = self.inner.lock();
        let fx = st.core.unqueued(self.tenant, now);
        self.inner.apply(&mut st, fx, now);
    }
}

/// The device, held by one kernel until [`Grant::finish`] (or drop, which
/// counts as [`Outcome::Failed`]).
pub struct Grant<'a> {
    ticket: &'a mut KernelTicket,
    /// `None` when the scheduler is disabled.
    waiter: Option<WaiterId>,
    done: bool,
}

impl std::fmt::Debug for Grant<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("waiter", &self.waiter)
            .finish()
    }
}

impl Grant<'_> {
    /// Gives the device back, saying how the run ended.
    pub fn finish(mut self, outcome: Outcome) {
        self.release(outcome);
    }

    fn release(&mut self, outcome: Outcome) {
        if self.done {
            return;
        }
        self.done = true;
        let inner = Arc::clone(&self.ticket.inner);
        let now = inner.now();
        let mut st = inner.lock();
        if outcome != Outcome::Yielded {
            self.ticket.finished = true;
        }
        match self.waiter {
            None => {
                st.bypass = match st.bypass {
                    Some((t, n)) if n > 1 => Some((t, n - 1)),
                    _ => None,
                };
                if outcome != Outcome::Yielded {
                    st.core.unqueued_quiet(self.ticket.tenant);
                }
                inner.granted.notify_all();
            }
            Some(w) => {
                st.controls.remove(&w);
                inner.refresh_time_of_day(&mut st, now);
                let hold = st.member_of.remove(&w).unwrap_or(w);
                let last = match st.holds.get_mut(&hold) {
                    Some(m) => {
                        m.retain(|x| *x != w);
                        m.is_empty()
                    }
                    None => true,
                };
                if last {
                    // The tenant's last running kernel gives the device back.
                    st.holds.remove(&hold);
                    let fx = st.core.release(hold, outcome, now);
                    inner.apply(&mut st, fx, now);
                } else {
                    st.core.member_finished(self.ticket.tenant, outcome);
                }
            }
        }
    }
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        self.release(Outcome::Failed);
    }
}

impl Core {
    /// The waiter holding the device for tenant `id` if another kernel of
    /// `id` may run alongside it: it has started and is not being preempted.
    pub fn joinable(&self, id: TenantId) -> Option<WaiterId> {
        let r = self.running?;
        if r.tenant != id || !r.started || r.preempting {
            return None;
        }
        r.waiter
    }

    /// A kernel of `id` joined the running grant of its tenant: its
    /// launch-to-start wait ends now.
    pub fn joined(&mut self, id: TenantId, queued_at: Option<Nanos>, now: Nanos) {
        let slice = self.slice();
        let Some(e) = self.entities.get_mut(&id) else {
            return;
        };
        if let Some(q) = queued_at {
            let wait = now.saturating_sub(q);
            e.queue_wait += wait;
            let deadline = e.target_wait.unwrap_or(2 * slice);
            if e.priority == Priority::Realtime && wait > deadline {
                e.deadline_misses += 1;
            }
            if e.recent_waits.len() == RECENT_WAITS {
                e.recent_waits.pop_front();
            }
            e.recent_waits.push_back(wait);
            e.waits_recorded += 1;
        }
    }

    /// A kernel that ran alongside others of its tenant stopped while they
    /// still run (the grant stays with them).
    pub fn member_finished(&mut self, id: TenantId, outcome: Outcome) {
        let Some(e) = self.entities.get_mut(&id) else {
            return;
        };
        match outcome {
            Outcome::Completed => {
                e.kernels += 1;
                e.pending = e.pending.saturating_sub(1);
            }
            Outcome::Failed => e.pending = e.pending.saturating_sub(1),
            Outcome::Yielded => {}
        }
    }

    /// Pending count bookkeeping for kernels that ran with scheduling disabled.
    fn unqueued_quiet(&mut self, id: TenantId) {
        if let Some(e) = self.entities.get_mut(&id) {
            e.pending = e.pending.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_config::DEFAULT_SLICE;

    const US: Nanos = 1_000;
    const MS: Nanos = 1_000_000;
    const S: Nanos = 1_000_000_000;

    fn tod(s: &str) -> TimeOfDay {
        TimeOfDay::parse(s).unwrap()
    }

    fn cfg(policy: Policy, slice_ms: u64, batch: u32) -> SchedulingConfig {
        SchedulingConfig {
            policy,
            slice: Duration::from_millis(slice_ms),
            batch_min_share: batch,
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum St {
        Off,
        /// Arrives at the scheduler at this time.
        Gap(Nanos),
        Waiting(WaiterId),
        Running {
            w: WaiterId,
            since: Nanos,
            stop_at: Option<Nanos>,
        },
    }

    /// A simulated tenant: a session that keeps `depth` kernels queued
    /// (saturating) or launches one kernel every `period` (periodic).
    #[derive(Debug, Clone)]
    struct SimT {
        id: TenantId,
        kernel: Nanos,
        /// Time from one kernel's end to the next kernel's arrival.
        handoff: Nanos,
        /// Preemption granularity (thread block length).
        block: Nanos,
        /// Periodic: a new kernel this long after the previous one ended.
        period: Option<Nanos>,
        depth: u32,
        /// Synchronous client: launches this many kernels, waits for all of
        /// them, thinks for the given time, and launches the next batch.
        sync: Option<(u32, Nanos)>,
        batch_left: u32,
        jitter: u64,
        windows: Vec<(Nanos, Nanos)>,
        st: St,
        left: Nanos,
        launched_at: Nanos,
        first_run: bool,
        extra_pending: u32,
        waits: Vec<Nanos>,
        runs: Vec<(Nanos, Nanos)>,
    }

    impl SimT {
        fn saturating(id: TenantId, kernel: Nanos) -> Self {
            SimT {
                id,
                kernel,
                handoff: 2 * US,
                block: 50 * US,
                period: None,
                depth: 3,
                sync: None,
                batch_left: 0,
                jitter: id,
                windows: vec![(0, Nanos::MAX)],
                st: St::Off,
                left: kernel,
                launched_at: 0,
                first_run: true,
                extra_pending: 0,
                waits: Vec::new(),
                runs: Vec::new(),
            }
        }

        fn periodic(id: TenantId, kernel: Nanos, period: Nanos) -> Self {
            SimT {
                period: Some(period),
                depth: 1,
                handoff: 0,
                ..SimT::saturating(id, kernel)
            }
        }

        /// A client that synchronizes after every `batch` launches and
        /// launches again `think` after the synchronize returned.
        fn synchronous(id: TenantId, kernel: Nanos, batch: u32, think: Nanos) -> Self {
            SimT {
                sync: Some((batch, think)),
                depth: batch,
                block: kernel / 64,
                ..SimT::saturating(id, kernel)
            }
        }

        fn active(&self, now: Nanos) -> bool {
            self.windows.iter().any(|&(a, b)| a <= now && now < b)
        }

        /// End of the window `now` is in (the window a periodic or
        /// synchronous client pauses in is replaced by a later one).
        fn current_window_end(&self, now: Nanos) -> Nanos {
            self.windows
                .iter()
                .find(|&&(a, b)| a <= now && now < b)
                .map_or(Nanos::MAX, |w| w.1)
        }

        fn next_window_start(&self, now: Nanos) -> Option<Nanos> {
            self.windows.iter().map(|w| w.0).filter(|&a| a > now).min()
        }

        /// Device time used within `[a, b)`.
        fn used(&self, a: Nanos, b: Nanos) -> Nanos {
            self.runs
                .iter()
                .map(|&(x, y)| y.min(b).saturating_sub(x.max(a)))
                .sum()
        }
    }

    struct Sim {
        core: Core,
        ts: Vec<SimT>,
        now: Nanos,
        next_waiter: WaiterId,
    }

    impl Sim {
        fn new(cfg: SchedulingConfig) -> Self {
            Sim {
                core: Core::new(cfg, tod("12:00")),
                ts: Vec::new(),
                now: 1,
                next_waiter: 1,
            }
        }

        fn add(&mut self, weight: u32, prio: Priority, mut t: SimT) -> usize {
            self.add_with_schedule(weight, &[], prio, &mut t);
            self.ts.push(t);
            self.ts.len() - 1
        }

        fn add_with_schedule(
            &mut self,
            weight: u32,
            schedule: &[WeightWindow],
            prio: Priority,
            t: &mut SimT,
        ) {
            let name = format!("t{}", self.core.entities.len());
            t.id = self
                .core
                .add_tenant(&name, weight, schedule, prio, self.now);
        }

        fn apply(&mut self, fx: Effects) {
            let now = self.now;
            if let Some(w) = fx.grant {
                self.core.started(w, now);
                let t = self
                    .ts
                    .iter_mut()
                    .find(|t| t.st == St::Waiting(w))
                    .expect("granted a waiting kernel");
                if t.first_run {
                    t.waits.push(now - t.launched_at);
                    t.first_run = false;
                }
                t.st = St::Running {
                    w,
                    since: now,
                    stop_at: None,
                };
            }
            if let Some(w) = fx.preempt {
                for t in &mut self.ts {
                    if let St::Running { w: rw, since, .. } = t.st
                        && rw == w
                    {
                        // Stops at the next block boundary.
                        let ran = now - since;
                        let stop = since + ran.div_ceil(t.block) * t.block;
                        t.st = St::Running {
                            w,
                            since,
                            stop_at: Some(stop.max(now)),
                        };
                    }
                }
            }
        }

        fn next_event(&self) -> Nanos {
            let mut n = Nanos::MAX;
            if let Some(w) = self.core.next_wake(self.now) {
                n = n.min(w);
            }
            for t in &self.ts {
                match t.st {
                    St::Off => {
                        if let Some(a) = t.next_window_start(self.now) {
                            n = n.min(a);
                        }
                        if t.active(self.now) {
                            n = n.min(self.now);
                        }
                    }
                    St::Gap(at) => n = n.min(at),
                    St::Waiting(_) => {}
                    St::Running { since, stop_at, .. } => {
                        let end = since + t.left;
                        n = n.min(stop_at.map_or(end, |s| s.min(end)));
                    }
                }
            }
            n
        }

        fn step(&mut self) {
            let now = self.now;
            for i in 0..self.ts.len() {
                let t = &self.ts[i];
                match t.st {
                    St::Off if t.active(now) => {
                        let id = t.id;
                        for _ in 0..t.depth {
                            self.core.queued(id, now);
                        }
                        let t = &mut self.ts[i];
                        t.extra_pending = t.depth - 1;
                        t.batch_left = t.depth;
                        t.launched_at = now;
                        t.first_run = true;
                        t.left = t.kernel;
                        t.st = St::Gap(now);
                    }
                    St::Gap(at) if at <= now => {
                        let id = self.ts[i].id;
                        let w = self.next_waiter;
                        self.next_waiter += 1;
                        let q = self.ts[i].first_run.then_some(self.ts[i].launched_at);
                        self.ts[i].st = St::Waiting(w);
                        let fx = self.core.arrive(id, w, q, now);
                        self.apply(fx);
                    }
                    St::Running { w, since, stop_at } => {
                        let end = since + t.left;
                        if let Some(s) = stop_at
                            && s < end
                            && s <= now
                        {
                            let t = &mut self.ts[i];
                            t.left -= s - since;
                            t.runs.push((since, s));
                            t.st = St::Gap(now + t.handoff);
                            let fx = self.core.release(w, Outcome::Yielded, now);
                            self.apply(fx);
                        } else if end <= now {
                            let id = t.id;
                            let active = t.active(now);
                            let periodic = t.period;
                            let sync = t.sync;
                            self.ts[i].runs.push((since, end));
                            if active && periodic.is_none() && sync.is_none() {
                                self.core.queued(id, now);
                            }
                            let fx = self.core.release(w, Outcome::Completed, now);
                            let t = &mut self.ts[i];
                            t.left = t.kernel;
                            t.first_run = true;
                            t.launched_at = now;
                            if !active {
                                let extra = std::mem::take(&mut t.extra_pending);
                                t.st = St::Off;
                                self.apply(fx);
                                for _ in 0..extra {
                                    let fx = self.core.unqueued(id, now);
                                    self.apply(fx);
                                }
                            } else if let Some((_, think)) = sync {
                                t.batch_left -= 1;
                                t.extra_pending = t.extra_pending.saturating_sub(1);
                                if t.batch_left > 0 {
                                    t.st = St::Gap(now + t.handoff);
                                } else {
                                    // All done: the synchronize returns,
                                    // the client thinks, launches again.
                                    t.st = St::Off;
                                    let until = t.current_window_end(now);
                                    t.windows.retain(|w| w.0 > now);
                                    // Think times vary by up to half
                                    // again (a fixed pseudo-random walk).
                                    t.jitter = t
                                        .jitter
                                        .wrapping_mul(6364136223846793005)
                                        .wrapping_add(1442695040888963407);
                                    let think = think + (t.jitter >> 33) % (think / 2 + 1);
                                    t.windows.insert(0, (now + think, until));
                                }
                                self.apply(fx);
                            } else if let Some(p) = periodic {
                                t.st = St::Off;
                                // Next launch after the period.
                                let until = t.current_window_end(now);
                                t.windows.retain(|w| w.0 > now);
                                t.windows.insert(0, (now + p, until));
                                self.apply(fx);
                            } else {
                                t.st = St::Gap(now + t.handoff);
                                self.apply(fx);
                            }
                        }
                    }
                    _ => {}
                }
            }
            if self.core.next_wake(now).is_some_and(|w| w <= now) {
                let fx = self.core.tick(now);
                self.apply(fx);
            }
        }

        fn run_until(&mut self, until: Nanos) {
            while self.now < until {
                self.step();
                let n = self.next_event();
                self.now = n.clamp(self.now + 1, until);
            }
        }

        fn share(&self, i: usize, a: Nanos, b: Nanos) -> f64 {
            self.ts[i].used(a, b) as f64 / (b - a) as f64
        }
    }

    fn assert_near(got: f64, want: f64, tol: f64, what: &str) {
        assert!(
            (got - want).abs() <= tol,
            "{what}: got {:.2} %, want {:.2} % ± {:.2}",
            got * 100.0,
            want * 100.0,
            tol * 100.0
        );
    }

    #[test]
    fn fair_shares_follow_the_weights() {
        let mut sim = Sim::new(cfg(Policy::Fair, 2, 5));
        let a = sim.add(30, Priority::Normal, SimT::saturating(0, 3 * MS));
        let b = sim.add(70, Priority::Normal, SimT::saturating(0, 3 * MS));
        sim.run_until(6 * S);
        assert_near(sim.share(a, S, 6 * S), 0.30, 0.005, "weight 30");
        assert_near(sim.share(b, S, 6 * S), 0.70, 0.005, "weight 70");
        // The core's own accounting agrees with what ran.
        let st = sim.core.stats(sim.ts[a].id, sim.now).unwrap();
        assert_near(st.share_1s, 0.30, 0.02, "share_1s of weight 30");
        assert_near(st.share_10s, sim.share(a, 1, 6 * S), 0.01, "share_10s");
        assert_eq!(st.weight, 30);
    }

    #[test]
    fn four_tenants_share_one_two_three_four() {
        let mut sim = Sim::new(cfg(Policy::Fair, 2, 5));
        let ids: Vec<usize> = (1..=4)
            .map(|w| sim.add(w, Priority::Normal, SimT::saturating(0, 5 * MS)))
            .collect();
        sim.run_until(6 * S);
        for (w, &i) in (1..=4).zip(&ids) {
            assert_near(
                sim.share(i, S, 6 * S),
                f64::from(w) / 10.0,
                0.005,
                &format!("weight {w}"),
            );
        }
    }

    #[test]
    fn short_kernels_keep_their_share_between_kernels() {
        // Kernels of a quarter slice with a gap between two kernels of the
        // same tenant: without anticipation the other tenant would take the
        // device at every gap and the shares would drift towards 50/50.
        let mut sim = Sim::new(cfg(Policy::Fair, 2, 5));
        let mut ta = SimT::saturating(0, 500 * US);
        ta.handoff = 30 * US;
        let a = sim.add(30, Priority::Normal, ta.clone());
        let b = sim.add(70, Priority::Normal, ta);
        sim.run_until(4 * S);
        // Shares of the device time used (the hand-offs leave it idle 6 %).
        let (sa, sb) = (sim.share(a, S, 4 * S), sim.share(b, S, 4 * S));
        assert!(sa + sb > 0.9, "{}", sa + sb);
        assert_near(sa / (sa + sb), 0.30, 0.005, "weight 30");
        // A slice spans several kernels: the device changed hands about
        // once per slice, not once per kernel.
        let dev = sim.core.device_stats(sim.now);
        assert!(dev.switches < 4 * 500 * 2, "{dev:?}");
    }

    /// Shares of synchronous clients (device time each got over `[1 s, 5 s)`,
    /// as fractions of the device time used).
    fn sync_shares(weights: &[u32], batch: u32, think: Nanos, kernel: Nanos) -> Vec<f64> {
        let mut sim = Sim::new(cfg(Policy::Fair, 2, 5));
        let ids: Vec<usize> = weights
            .iter()
            .enumerate()
            .map(|(k, &w)| {
                // Think times jitter differently per client, so the
                // clients drift against each other as real ones do.
                let mut t = SimT::synchronous(0, kernel, batch, think);
                t.jitter = k as u64;
                sim.add(w, Priority::Normal, t)
            })
            .collect();
        sim.run_until(5 * S);
        let used: Vec<f64> = ids.iter().map(|&i| sim.share(i, S, 5 * S)).collect();
        let total: f64 = used.iter().sum();
        used.iter().map(|u| u / total).collect()
    }

    #[test]
    fn synchronous_clients_keep_their_shares() {
        // Clients that synchronize after every 1, 4 or 16 launches and
        // think (the synchronize's return trip and the host code) between
        // batches. Without the sync rules 30/70 came out as 33/67 with 4 ms
        // kernels and 50/50 with 0.5 ms ones.
        for weights in [&[30, 70][..], &[1, 2, 3, 4][..]] {
            let sum: u32 = weights.iter().sum();
            for batch in [1, 4, 16] {
                for think in [50 * US, 300 * US, MS] {
                    for kernel in [4 * MS, 500 * US] {
                        // A client that cannot use its share even alone
                        // (thinking longer than the anticipation window
                        // and longer than its batch runs) takes what it
                        // asks for; not part of the claim.
                        let demand = (batch as Nanos * kernel) as f64
                            / (batch as Nanos * kernel + think * 3 / 2) as f64;
                        let share = f64::from(*weights.iter().max().unwrap()) / f64::from(sum);
                        if think > SYNC_ANTICIPATION_MAX.as_nanos() as Nanos / 2
                            && demand < share + 0.05
                        {
                            continue;
                        }
                        let got = sync_shares(weights, batch, think, kernel);
                        for (&w, g) in weights.iter().zip(&got) {
                            assert_near(
                                *g,
                                f64::from(w) / f64::from(sum),
                                0.005,
                                &format!(
                                    "weights {weights:?}, sync every {batch}, think {} us, kernel {} us, weight {w}",
                                    think / US,
                                    kernel / US
                                ),
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn kernels_that_arrive_after_the_anticipation_keep_their_share() {
        // A loaded host: each tenant's next kernel reaches the scheduler
        // 400 us after the previous one ended, past the 250 us grace. The
        // tenant behind takes the device back at the next block.
        let mut sim = Sim::new(cfg(Policy::Fair, 2, 5));
        let mut t = SimT::saturating(0, MS);
        t.handoff = 400 * US;
        t.depth = 4;
        let a = sim.add(30, Priority::Normal, t.clone());
        let b = sim.add(70, Priority::Normal, t);
        sim.run_until(4 * S);
        let (sa, sb) = (sim.share(a, S, 4 * S), sim.share(b, S, 4 * S));
        assert_near(sa / (sa + sb), 0.30, 0.01, "weight 30");
        assert_eq!(
            sim.core.device_stats(sim.now).idle_with_work,
            Duration::ZERO
        );
    }

    #[test]
    fn contention_and_waste_are_accounted() {
        let mut sim = Sim::new(cfg(Policy::Fair, 2, 5));
        let a = sim.add(1, Priority::Normal, SimT::saturating(0, 3 * MS));
        let b = sim.add(3, Priority::Normal, SimT::saturating(0, 3 * MS));
        let mut t = SimT::synchronous(0, MS, 4, 200 * US);
        t.windows = vec![(0, 2 * S)];
        let c = sim.add(2, Priority::Normal, t);
        sim.run_until(3 * S);
        let dev = sim.core.device_stats(sim.now);
        // Work-conserving: never idle while a kernel that could run waited.
        assert_eq!(dev.idle_with_work, Duration::ZERO, "{dev:?}");
        assert_eq!(dev.idle_capped, Duration::ZERO);
        // a and b always have a kernel waiting: each waited the whole time
        // the other ran (up to the hand-over between kernels).
        let name = |i: usize| sim.core.entities[&sim.ts[i].id].name.clone();
        let pair = |w: usize, r: usize| {
            dev.contention
                .iter()
                .find(|x| x.waiting == name(w) && x.running == name(r))
                .map_or(Duration::ZERO, |x| x.total)
        };
        let ran = |i: usize| Duration::from_nanos(sim.ts[i].used(0, sim.now));
        let ab = pair(a, b).as_secs_f64() / ran(b).as_secs_f64();
        assert!(ab > 0.97 && ab <= 1.0, "a waited {ab} of b's time");
        // c stopped at 2 s: it waited only while it was active.
        let cb = pair(c, b);
        assert!(cb > Duration::ZERO && cb < Duration::from_secs(2), "{cb:?}");
        // The hottest pair comes first, with its peak minute.
        assert!(dev.contention[0].total >= dev.contention[1].total);
        assert!(dev.contention[0].peak_minute_ago.is_some());
        assert!(dev.contention[0].last_hour > Duration::ZERO);
        let sc = sim.core.stats(sim.ts[c].id, sim.now).unwrap();
        assert!(
            sc.think_time >= Duration::from_micros(200)
                && sc.think_time <= Duration::from_micros(300),
            "{sc:?}"
        );
        let sa = sim.core.stats(sim.ts[a].id, sim.now).unwrap();
        assert!(sa.queue_wait_p50 <= sa.queue_wait_p90 && sa.queue_wait_p90 <= sa.queue_wait_p99);
        assert!((sa.share_10m - sa.share_60s).abs() < 0.01, "{sa:?}");
        assert_eq!(sa.deadline_misses, 0);
        assert!(dev.contention.iter().all(|x| x.waiting != x.running));
    }

    #[test]
    fn realtime_deadline_misses_are_counted() {
        let mut c = Core::new(cfg(Policy::Fair, 2, 5), tod("12:00"));
        let b = c.add_tenant("b", 1, &[], Priority::Normal, 1);
        let rt = c.add_tenant("rt", 1, &[], Priority::Realtime, 1);
        c.set_target_wait(rt, Some(Duration::from_micros(100)));
        c.queued(b, 1);
        assert_eq!(c.arrive(b, 1, Some(1), 1).grant, Some(1));
        c.started(1, 1);
        // A realtime kernel preempts b; b's block ends 300 us later.
        c.queued(rt, MS);
        assert_eq!(c.arrive(rt, 2, Some(MS), MS).preempt, Some(1));
        let fx = c.release(1, Outcome::Yielded, MS + 300 * US);
        assert_eq!(fx.grant, Some(2));
        c.started(2, MS + 300 * US);
        let st = c.stats(rt, 2 * MS).unwrap();
        assert_eq!(st.deadline_misses, 1);
        assert_eq!(st.target_wait, Some(Duration::from_micros(100)));
        // b waited for rt: contention of b behind rt.
        c.release(2, Outcome::Completed, 2 * MS);
        let dev = c.device_stats(3 * MS);
        assert_eq!(dev.idle_with_work, Duration::ZERO);
    }

    #[test]
    fn a_long_kernel_is_preempted_at_its_slice_end() {
        let mut sim = Sim::new(cfg(Policy::Fair, 2, 5));
        let a = sim.add(1, Priority::Normal, SimT::saturating(0, 2 * S));
        let b = sim.add(1, Priority::Normal, SimT::saturating(0, 2 * S));
        sim.run_until(S);
        // Each ran in pieces of about one slice, alternating.
        for i in [a, b] {
            let runs = &sim.ts[i].runs;
            assert!(runs.len() > 200, "{} runs", runs.len());
            // Runs last one slice (a tenant behind in virtual time by a
            // hair runs a second one to catch up).
            let long = runs.iter().filter(|r| r.1 - r.0 > 2 * MS + 50 * US).count();
            assert!(
                long * 20 <= runs.len(),
                "{long} of {} runs were long",
                runs.len()
            );
            assert!(runs.iter().all(|r| r.1 - r.0 <= 4 * MS + 50 * US));
            assert_near(sim.share(i, 0, S), 0.5, 0.01, "equal weights");
        }
        let st = sim.core.stats(sim.ts[a].id, sim.now).unwrap();
        assert!(st.preemptions > 200, "{} preemptions", st.preemptions);
        assert_eq!(st.kernels, 0);
    }

    #[test]
    fn the_slice_length_sets_the_switching_period() {
        for slice in [1, 2, 10, 30] {
            let mut sim = Sim::new(cfg(Policy::Fair, slice, 5));
            let a = sim.add(1, Priority::Normal, SimT::saturating(0, 10 * S));
            sim.add(1, Priority::Normal, SimT::saturating(0, 10 * S));
            sim.run_until(S);
            let runs = &sim.ts[a].runs;
            let mean = runs.iter().map(|r| r.1 - r.0).sum::<Nanos>() / runs.len() as Nanos;
            let want = slice * MS;
            assert!(
                mean >= want && mean <= want + 50 * US,
                "slice {slice} ms: mean run {mean} ns"
            );
        }
    }

    #[test]
    fn an_idle_tenants_share_goes_to_the_others() {
        let mut sim = Sim::new(cfg(Policy::Fair, 2, 5));
        let a = sim.add(1, Priority::Normal, SimT::saturating(0, 3 * MS));
        let mut t = SimT::saturating(0, 3 * MS);
        t.windows = vec![(0, 2 * S)];
        let b = sim.add(1, Priority::Normal, t);
        sim.run_until(4 * S);
        assert_near(sim.share(a, 0, 2 * S), 0.5, 0.01, "both busy");
        // b stopped at 2 s (its last kernel ends within a few ms).
        assert!(sim.share(a, 2 * S + 10 * MS, 3 * S) > 0.999);
        assert_eq!(sim.share(b, 2 * S + 10 * MS, 4 * S), 0.0);
        let dev = sim.core.device_stats(sim.now);
        assert!(dev.utilization_1s > 0.999, "{dev:?}");
    }

    #[test]
    fn a_returning_tenant_gets_no_burst_credit() {
        let mut sim = Sim::new(cfg(Policy::Fair, 2, 5));
        let a = sim.add(1, Priority::Normal, SimT::saturating(0, 3 * MS));
        let mut t = SimT::saturating(0, 3 * MS);
        t.windows = vec![(5 * S, Nanos::MAX)];
        let b = sim.add(1, Priority::Normal, t);
        sim.run_until(7 * S);
        assert!(sim.share(a, 0, 5 * S) > 0.999);
        // From the moment b returns the two share equally: b does not
        // reclaim the 5 s it was idle.
        for (x, y) in [(5 * S, 5 * S + 100 * MS), (5 * S, 7 * S)] {
            assert_near(sim.share(b, x, y), 0.5, 0.03, "returning tenant");
            assert_near(sim.share(a, x, y), 0.5, 0.03, "running tenant");
        }
    }

    #[test]
    fn fixed_caps_hold_on_an_idle_device() {
        let mut sim = Sim::new(cfg(Policy::Fixed, 2, 5));
        let a = sim.add(1, Priority::Normal, SimT::saturating(0, 10 * MS));
        // A second VM with three times the weight that never runs.
        let mut idle = SimT::saturating(0, MS);
        idle.windows.clear();
        sim.add(3, Priority::Normal, idle);
        sim.run_until(5 * S);
        let share = sim.share(a, 0, 5 * S);
        assert!(
            (0.24..=0.2501 + 2.0 * MS as f64 / (5 * S) as f64).contains(&share),
            "{share}"
        );
        // Over any window of 10 slices, at most 25 % plus one slice.
        let runs = &sim.ts[a].runs;
        let win = 20 * MS;
        for r in runs {
            let used = sim.ts[a].used(r.0, r.0 + win);
            assert!(
                used <= win / 4 + 2 * MS + 1,
                "{used} ns in a {win} ns window from {}",
                r.0
            );
        }
    }

    #[test]
    fn fixed_shares_among_busy_tenants() {
        let mut sim = Sim::new(cfg(Policy::Fixed, 2, 5));
        let a = sim.add(1, Priority::Normal, SimT::saturating(0, 3 * MS));
        let b = sim.add(1, Priority::Normal, SimT::saturating(0, 3 * MS));
        let mut idle = SimT::saturating(0, MS);
        idle.windows.clear();
        sim.add(2, Priority::Normal, idle);
        sim.run_until(4 * S);
        // Each is capped at 25 % although half the device is idle.
        for i in [a, b] {
            let s = sim.share(i, 0, 4 * S);
            assert!((0.235..=0.2505).contains(&s), "{s}");
        }
    }

    #[test]
    fn realtime_preempts_batch_at_the_next_block() {
        let mut sim = Sim::new(cfg(Policy::Fair, 2, 5));
        let rt = sim.add(
            1,
            Priority::Realtime,
            SimT::periodic(0, 200 * US, 5 * MS + 7 * US),
        );
        for _ in 0..3 {
            let mut t = SimT::saturating(0, 20 * MS);
            t.block = 100 * US;
            sim.add(1, Priority::Batch, t);
        }
        sim.run_until(2 * S);
        let waits = &sim.ts[rt].waits;
        assert!(waits.len() > 300, "{} realtime kernels", waits.len());
        // One block of the batch kernel at most.
        let worst = *waits.iter().max().unwrap();
        assert!(worst <= 100 * US, "worst realtime wait {worst} ns");
        let st = sim.core.stats(sim.ts[rt].id, sim.now).unwrap();
        assert!(st.queue_wait_p99 <= Duration::from_micros(100), "{st:?}");
        assert!(st.kernels as usize >= waits.len() - 1);
    }

    #[test]
    fn normal_preempts_batch_and_batch_keeps_its_minimum_share() {
        for min_share in [0, 5, 20] {
            let mut sim = Sim::new(cfg(Policy::Fair, 2, min_share));
            let n = sim.add(1, Priority::Normal, SimT::saturating(0, 3 * MS));
            let b = sim.add(100, Priority::Batch, SimT::saturating(0, 3 * MS));
            sim.run_until(4 * S);
            let want = f64::from(min_share) / 100.0;
            assert_near(sim.share(b, S, 4 * S), want, 0.005, "batch minimum share");
            assert_near(sim.share(n, S, 4 * S), 1.0 - want, 0.005, "normal");
        }
    }

    #[test]
    fn batch_takes_all_of_an_otherwise_idle_device() {
        let mut sim = Sim::new(cfg(Policy::Fair, 2, 5));
        let mut t = SimT::saturating(0, 3 * MS);
        t.windows = vec![(0, S)];
        let n = sim.add(1, Priority::Normal, t);
        let b = sim.add(1, Priority::Batch, SimT::saturating(0, 3 * MS));
        sim.run_until(2 * S);
        assert!(sim.share(n, 0, S) > 0.94);
        let sb = sim.share(b, S + 10 * MS, 2 * S);
        assert!(sb > 0.995, "{sb}");
    }

    #[test]
    fn weights_follow_the_time_of_day_schedule() {
        let mut sim = Sim::new(cfg(Policy::Fair, 2, 5));
        let day = [WeightWindow {
            from: tod("08:00"),
            to: tod("20:00"),
            weight: 70,
        }];
        let night = [WeightWindow {
            from: tod("20:00"),
            to: tod("08:00"),
            weight: 70,
        }];
        let mut ta = SimT::saturating(0, 3 * MS);
        let mut tb = SimT::saturating(0, 3 * MS);
        sim.add_with_schedule(30, &day, Priority::Normal, &mut ta);
        sim.add_with_schedule(30, &night, Priority::Normal, &mut tb);
        sim.ts.push(ta);
        sim.ts.push(tb);
        sim.run_until(2 * S);
        assert_near(sim.share(0, 0, 2 * S), 0.70, 0.005, "inference by day");
        let fx = sim.core.set_time_of_day(tod("21:30"), sim.now);
        sim.apply(fx);
        sim.run_until(4 * S);
        assert_near(
            sim.share(0, 2 * S, 4 * S),
            0.30,
            0.005,
            "inference by night",
        );
        assert_eq!(sim.core.stats(sim.ts[1].id, sim.now).unwrap().weight, 70);
    }

    #[test]
    fn the_tuning_adjustment_moves_with_the_schedule_baseline() {
        let mut c = Core::new(cfg(Policy::Fair, 2, 5), tod("12:00"));
        let day = [WeightWindow {
            from: tod("08:00"),
            to: tod("20:00"),
            weight: 7,
        }];
        let a = c.add_tenant("a", 3, &day, Priority::Normal, 1);
        c.set_weight_adjust(a, 2, 2);
        let st = c.stats(a, 3).unwrap();
        assert_eq!((st.weight, st.baseline_weight, st.weight_adjust), (9, 7, 2));
        // At night the base weight is the baseline; the adjustment stays.
        c.set_time_of_day(tod("22:00"), 4);
        let st = c.stats(a, 5).unwrap();
        assert_eq!((st.weight, st.baseline_weight), (5, 3));
        // A live base-weight change keeps it too; the weight is at least 1.
        c.set_settings(a, 1, Priority::Normal, 6);
        c.set_weight_adjust(a, -5, 7);
        assert_eq!(c.stats(a, 8).unwrap().weight, 1);
        // Quantiles over the newest kernels.
        assert_eq!(c.wait_quantile(a, 10, 0.99), None);
    }

    #[test]
    fn live_weight_priority_and_policy_changes() {
        let mut sim = Sim::new(cfg(Policy::Fair, 2, 5));
        let a = sim.add(1, Priority::Normal, SimT::saturating(0, 3 * MS));
        let b = sim.add(1, Priority::Normal, SimT::saturating(0, 3 * MS));
        sim.run_until(S);
        assert_near(sim.share(a, 0, S), 0.5, 0.01, "equal");
        let fx = sim
            .core
            .set_settings(sim.ts[a].id, 3, Priority::Normal, sim.now);
        sim.apply(fx);
        sim.run_until(2 * S);
        assert_near(sim.share(a, S + 10 * MS, 2 * S), 0.75, 0.01, "weight 3:1");
        // Batch now: the other takes all but the batch minimum.
        let fx = sim
            .core
            .set_settings(sim.ts[a].id, 3, Priority::Batch, sim.now);
        sim.apply(fx);
        sim.run_until(3 * S);
        assert_near(sim.share(a, 2 * S + 10 * MS, 3 * S), 0.05, 0.01, "batch");
        // Fixed caps with weights 1 (b) and 3 (a), back to normal class.
        let fx = sim
            .core
            .set_settings(sim.ts[a].id, 3, Priority::Normal, sim.now);
        sim.apply(fx);
        let fx = sim.core.set_config(cfg(Policy::Fixed, 5, 5), sim.now);
        sim.apply(fx);
        sim.run_until(4 * S);
        assert_near(
            sim.share(b, 3 * S + 10 * MS, 4 * S),
            0.25,
            0.01,
            "fixed 1/4",
        );
        assert_near(
            sim.share(a, 3 * S + 10 * MS, 4 * S),
            0.75,
            0.01,
            "fixed 3/4",
        );
        assert_eq!(sim.core.config().slice, Duration::from_millis(5));
    }

    #[test]
    fn queue_waits_and_counters_are_recorded() {
        let mut c = Core::new(SchedulingConfig::default(), tod("12:00"));
        let a = c.add_tenant("a", 1, &[], Priority::Normal, 1);
        let b = c.add_tenant("b", 1, &[], Priority::Normal, 1);
        c.queued(a, 10);
        c.queued(b, 10);
        assert_eq!(c.arrive(a, 1, Some(10), 100).grant, Some(1));
        c.started(1, 100);
        assert_eq!(c.arrive(b, 2, Some(10), 200), Effects::default());
        // a completes at 1 ms; b is granted then and starts 50 us later
        // (its thread wakes up): its wait is from its launch to its start.
        let fx = c.release(1, Outcome::Completed, MS);
        assert_eq!(fx.grant, Some(2));
        assert_eq!(c.stats(b, MS + 50 * US).unwrap().busy, Duration::ZERO);
        c.started(2, MS + 50 * US);
        let sa = c.stats(a, MS).unwrap();
        let sb = c.stats(b, MS).unwrap();
        assert_eq!(
            (sa.kernels, sa.busy, sa.queue_wait),
            (1, Duration::from_nanos(MS - 100), Duration::from_nanos(90))
        );
        assert_eq!(sb.queue_wait, Duration::from_nanos(MS + 50 * US - 10));
        assert_eq!(sb.queued, 1);
        // b's running time counts before it is charged.
        assert_eq!(
            c.stats(b, 2 * MS).unwrap().busy,
            Duration::from_nanos(MS - 50 * US)
        );
        // A kernel dropped before it ran frees its tenant.
        c.queued(a, 2 * MS);
        c.unqueued(a, 2 * MS);
        assert_eq!(c.stats(a, 2 * MS).unwrap().queued, 0);
        assert!(c.busy());
        c.release(2, Outcome::Failed, 3 * MS);
        assert!(!c.busy());
        assert_eq!(c.stats(b, 3 * MS).unwrap().kernels, 0);
    }

    #[test]
    fn a_cancelled_waiter_leaves_the_queue() {
        let mut c = Core::new(SchedulingConfig::default(), tod("12:00"));
        let a = c.add_tenant("a", 1, &[], Priority::Normal, 1);
        let b = c.add_tenant("b", 1, &[], Priority::Normal, 1);
        c.queued(a, 1);
        c.queued(b, 1);
        c.arrive(a, 1, None, 1);
        c.arrive(b, 2, None, 1);
        c.cancel(2, 2);
        c.unqueued(b, 2);
        // a's slice ends with nobody else waiting: it keeps the device.
        assert_eq!(c.tick(10 * MS), Effects::default());
        assert_eq!(c.running_waiter(), Some(1));
        assert_eq!(c.next_wake(10 * MS), None);
    }

    #[test]
    fn fixed_policy_idles_the_device_until_tokens_refill() {
        let mut c = Core::new(cfg(Policy::Fixed, 2, 5), tod("12:00"));
        let a = c.add_tenant("a", 1, &[], Priority::Normal, 1);
        c.add_tenant("b", 1, &[], Priority::Normal, 1);
        c.queued(a, 1);
        assert_eq!(c.arrive(a, 1, None, 1).grant, Some(1));
        c.started(1, 1);
        // Half share, one slice of tokens: the bucket empties after 4 ms.
        let wake = c.next_wake(1).unwrap();
        assert_eq!(wake, 1 + 4 * MS);
        assert_eq!(c.tick(wake).preempt, Some(1));
        c.release(1, Outcome::Yielded, wake);
        assert_eq!(c.arrive(a, 2, None, wake), Effects::default());
        // Refilled after 2 ms / 0.5 = 4 ms.
        let again = c.next_wake(wake).unwrap();
        assert_eq!(again, wake + 4 * MS);
        assert_eq!(c.tick(again).grant, Some(2));
    }

    #[test]
    fn usage_windows() {
        let mut u = UsageRing::new();
        u.add(0, 500 * MS);
        u.add(S, S + 250 * MS);
        assert_near(
            u.share(Duration::from_secs(1), 2 * S, None),
            0.25,
            1e-9,
            "1 s",
        );
        assert_near(
            u.share(Duration::from_secs(10), 2 * S, None),
            0.375,
            1e-9,
            "since start",
        );
        assert_near(
            u.share(Duration::from_secs(1), 2 * S, Some(2 * S - 100 * MS)),
            0.35,
            1e-9,
            "running",
        );
        // Old use expires after a minute.
        u.add(70 * S, 70 * S + MS);
        assert_near(
            u.share(Duration::from_secs(60), 71 * S, None),
            MS as f64 / 60e9,
            1e-9,
            "60 s",
        );
        assert_eq!(u.used(0, S), 0.0);
    }

    /// A thread that runs "kernels" of `kernel` (sleeping in 100 us steps,
    /// stopping early when asked to yield) on tenant `id` until `stop`.
    fn worker(
        sched: &Arc<Scheduler>,
        id: TenantId,
        kernel: Duration,
        stop: Instant,
    ) -> std::thread::JoinHandle<u64> {
        let sched = Arc::clone(sched);
        std::thread::spawn(move || {
            let mut done = 0;
            while Instant::now() < stop {
                let mut ticket = sched.queue_kernel(id);
                let control = Arc::new(RunControl::default());
                let mut left = kernel;
                loop {
                    let grant = ticket.acquire(&control).unwrap();
                    let t = Instant::now();
                    while t.elapsed() < left && !control.yield_requested() {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    let ran = t.elapsed();
                    if ran >= left {
                        grant.finish(Outcome::Completed);
                        done += 1;
                        break;
                    }
                    grant.finish(Outcome::Yielded);
                    left -= ran;
                }
            }
            done
        })
    }

    #[test]
    fn threads_share_the_device_by_weight_and_time_of_day() {
        let clock = Arc::new(ManualClock::new(tod("12:00")));
        let sched = Arc::new(Scheduler::new(
            "gpu0",
            cfg(Policy::Fair, 2, 5),
            Arc::clone(&clock) as Arc<dyn Clock>,
        ));
        let mut day = crate::testutils::vm("a", 1 << 20);
        day.schedule = vec![WeightWindow {
            from: tod("08:00"),
            to: tod("20:00"),
            weight: 3,
        }];
        let a = sched.add_tenant(&day);
        let b = sched.add_tenant(&crate::testutils::vm("b", 1 << 20));
        let measure = |secs: f64| {
            let stop = Instant::now() + Duration::from_secs_f64(secs);
            let (a0, b0) = (sched.stats(a).unwrap().busy, sched.stats(b).unwrap().busy);
            let h = [
                worker(&sched, a, Duration::from_millis(5), stop),
                worker(&sched, b, Duration::from_millis(5), stop),
            ];
            for t in h {
                t.join().unwrap();
            }
            let (a1, b1) = (sched.stats(a).unwrap().busy, sched.stats(b).unwrap().busy);
            let (da, db) = ((a1 - a0).as_secs_f64(), (b1 - b0).as_secs_f64());
            da / (da + db)
        };
        let by_day = measure(0.8);
        assert!((0.6..=0.9).contains(&by_day), "weight 3:1 by day: {by_day}");
        assert_eq!(sched.stats(a).unwrap().weight, 3);
        clock.set(tod("21:00"));
        std::thread::sleep(TIME_OF_DAY_REFRESH);
        let by_night = measure(0.8);
        assert!(
            (0.35..=0.65).contains(&by_night),
            "1:1 by night: {by_night}"
        );
        assert_eq!(sched.stats(a).unwrap().weight, 1);
        assert!(sched.device_stats().preemptions > 0);
    }

    #[test]
    fn a_launch_waiting_for_the_device_is_cancelled() {
        let sched = Arc::new(Scheduler::new(
            "gpu0",
            SchedulingConfig::default(),
            Arc::new(LocalClock),
        ));
        let a = sched.add_tenant(&crate::testutils::vm("a", 1 << 20));
        let b = sched.add_tenant(&crate::testutils::vm("b", 1 << 20));
        sched.set_settings(a, 1, Priority::Realtime);
        let mut ta = sched.queue_kernel(a);
        let ca = Arc::new(RunControl::default());
        let ga = ta.acquire(&ca).unwrap();
        let s2 = Arc::clone(&sched);
        let cb = Arc::new(RunControl::default());
        let cb2 = Arc::clone(&cb);
        let waiter = std::thread::spawn(move || {
            let mut tb = s2.queue_kernel(b);
            tb.acquire(&cb2).map(|g| g.finish(Outcome::Completed))
        });
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(sched.stats(b).unwrap().queued, 1);
        cb.cancel();
        assert_eq!(waiter.join().unwrap(), Err(Cancelled));
        assert_eq!(sched.stats(b).unwrap().queued, 0);
        // Scheduling cannot be switched off while a kernel runs.
        assert!(sched.set_enabled(false).is_err());
        ga.finish(Outcome::Completed);
        drop(ta);
        assert!(sched.set_enabled(false).is_ok());
        assert!(!sched.enabled());
        assert_eq!(sched.stats(a).unwrap().kernels, 1);
    }

    #[test]
    fn kernels_of_one_tenant_share_its_grant_and_yield_together() {
        let sched = Arc::new(Scheduler::new(
            "gpu0",
            SchedulingConfig::default(),
            Arc::new(LocalClock),
        ));
        let a = sched.add_tenant(&crate::testutils::vm("a", 1 << 20));
        let b = sched.add_tenant(&crate::testutils::vm("b", 1 << 20));
        let (mut t1, mut t2) = (sched.queue_kernel(a), sched.queue_kernel(a));
        let (c1, c2) = (
            Arc::new(RunControl::default()),
            Arc::new(RunControl::default()),
        );
        let g1 = t1.acquire(&c1).unwrap();
        // The second kernel of the same VM runs alongside the first.
        let g2 = t2.acquire(&c2).unwrap();
        let s2 = Arc::clone(&sched);
        let other = std::thread::spawn(move || {
            let mut tb = s2.queue_kernel(b);
            let cb = Arc::new(RunControl::default());
            tb.acquire(&cb).map(|g| g.finish(Outcome::Completed))
        });
        // Another VM waits: at the slice's end both kernels are asked to yield.
        let t = Instant::now();
        while !(c1.yield_requested() && c2.yield_requested()) {
            assert!(t.elapsed() < Duration::from_secs(10), "no preemption");
            std::thread::sleep(Duration::from_millis(1));
        }
        g1.finish(Outcome::Yielded);
        std::thread::sleep(Duration::from_millis(20));
        assert!(!other.is_finished(), "the device is held until both yield");
        g2.finish(Outcome::Yielded);
        other.join().unwrap().unwrap();
        // Both resume and complete; each counts once.
        let g1 = t1.acquire(&c1).unwrap();
        let g2 = t2.acquire(&c2).unwrap();
        g1.finish(Outcome::Completed);
        g2.finish(Outcome::Completed);
        let st = sched.stats(a).unwrap();
        assert_eq!((st.kernels, st.queued), (2, 0));
        assert_eq!(st.preemptions, 1);
        assert_eq!(sched.stats(b).unwrap().kernels, 1);
    }

    #[test]
    fn the_local_clock_reads_a_time_of_day() {
        let t = LocalClock.time_of_day();
        assert!(t.0 < 24 * 60);
        let m = ManualClock::new(tod("08:00"));
        m.set(tod("20:30"));
        assert_eq!(m.time_of_day(), tod("20:30"));
        assert_eq!(DEFAULT_SLICE, Duration::from_millis(2));
    }
}
