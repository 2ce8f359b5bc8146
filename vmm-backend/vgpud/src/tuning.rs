//! Analysis and auto-tuning of the compute scheduler (`vgpuctl analyze`,
//! `GET /v1/analyze`, `[tuning]`).
//!
//! [`analyze`] reads what the scheduler and the memory slices measured and
//! names the hotspots (the pairs of VMs that contend most, and when), the
//! bottlenecks (a VM pinned at its `fixed` cap while the device idles, a
//! slice far larger than its peak use, free memory that a new VM cannot get,
//! compute idle while memory is full) and concrete recommendations with
//! numbers.
//!
//! The [`Tuner`] is the controller: every `tune_interval` it compares each
//! VM's launch-to-start p99 over the interval with its `target_wait_p99` and
//! its share with its `min_share`, and moves weights within
//! `weight_min`..`weight_max` to meet them: a VM that misses gets a step up
//! (a quarter, at least 1); at its bound, the VM of the lowest class that
//! holds it back most gives a step down. Realtime VMs are served before
//! normal ones, normal before batch, and donors are taken from batch first.
//! Hysteresis: a raised VM steps back only after [`RELAX_AFTER`] intervals
//! with its p99 under half its target, donors are restored only after as many
//! intervals without a miss on their device. The time-of-day schedule stays
//! the baseline: the controller sets an adjustment (weight − baseline) that
//! moves with it. In `advise` mode the changes are computed and shown but
//! not applied; in `auto` they are applied and audited (`vm.tune`).

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tracing::{info, warn};
use vgpu_broker::Broker;
use vgpu_config::size::Human;
use vgpu_config::{Config, MAX_WEIGHT, Policy, Priority, TuneMode, VmConfig, VmMode};

use crate::audit::Actor;
use crate::usage::{device_usage, vm_usage};

pub use vgpu_api::{Analysis, Bottleneck, Hotspot, Recommendation, TuningReport, WeightChange};

/// What the controller reads and changes of the running daemon. The daemon's `Runtime`
/// implements it, so the controller does not depend on the daemon that owns it.
pub trait TuningHost: Send + Sync {
    /// The broker whose VMs are tuned.
    fn broker(&self) -> &Arc<Broker>;
    /// The running configuration (`[tuning]` and the VMs' targets).
    fn running_config(&self) -> Config;
    /// The controller itself (its state and counters).
    fn tuner(&self) -> &Arc<Tuner>;
    /// Records a weight change in the audit log.
    fn record_tuning(&self, actor: Actor, detail: Value);
}

/// Intervals a VM must be comfortably within its targets before a raise is
/// undone (and a device free of misses before its donors get their weight
/// back).
pub const RELAX_AFTER: u32 = 3;
/// The controller aims the p99 wait at this part of the target, so that the
/// variation from one interval to the next stays under the target.
pub const AIM: f64 = 0.8;
/// Fewest kernels in an interval for its p99 to count.
const MIN_SAMPLES: usize = 20;
/// A slice is oversized when its 24-hour high-water mark is below this part of it.
const OVERSIZED: f64 = 0.6;
/// Headroom kept above the high-water mark when shrinking a slice.
const SLICE_HEADROOM: f64 = 1.15;

#[derive(Debug, Default, Clone)]
struct VmMarks {
    waits: u64,
    busy: Duration,
    waited: Duration,
    ok_streak: u32,
    /// Intervals within the targets needed before the next relax step:
    /// [`RELAX_AFTER`], doubled each time a relax step was followed by a
    /// miss (so the controller does not oscillate around a weight).
    relax_after: u32,
    /// Rounds since the last relax step of this VM (None: none recent).
    since_relax: Option<u32>,
}

#[derive(Debug, Default)]
struct TunerState {
    marks: BTreeMap<String, VmMarks>,
    /// Per device: intervals in a row without a miss.
    calm: BTreeMap<String, u32>,
    last_run: Option<Instant>,
    runs: u64,
    /// The newest change per VM.
    last: BTreeMap<String, WeightChange>,
    /// Changes of the newest run (advice in `advise` mode).
    pending: Vec<WeightChange>,
    /// Every change, newest last (bounded).
    history: Vec<WeightChange>,
    /// Per VM: changes up and down since vgpud started (applied or advised).
    counts: BTreeMap<String, (u64, u64)>,
}

/// The tuning controller.
#[derive(Debug, Default)]
pub struct Tuner {
    state: Mutex<TunerState>,
    stop: Mutex<bool>,
    wake: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e3;
    if v >= 10.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn class_rank(p: Priority) -> u8 {
    match p {
        Priority::Realtime => 0,
        Priority::Normal => 1,
        Priority::Batch => 2,
    }
}

/// How a VM did over an interval.
#[derive(Debug, Clone)]
struct Observed {
    vm: VmConfig,
    sched_id: u64,
    weight: u32,
    baseline: u32,
    adjust: i32,
    p99: Option<Duration>,
    share: f64,
    waited: Duration,
    miss: Option<String>,
    comfortable: bool,
}

fn bounds(vm: &VmConfig) -> (u32, u32) {
    let lo = vm.tuning.weight_min.unwrap_or(1);
    let hi = vm
        .tuning
        .weight_max
        .unwrap_or_else(|| vm.weight.saturating_mul(4).min(MAX_WEIGHT));
    (lo, hi.max(lo))
}

fn step(w: u32) -> u32 {
    (w / 4).max(1)
}

impl Tuner {
    /// Starts the controller thread for `rt` (it reads `[tuning]` from the
    /// running config at every round, so reloads take effect).
    pub fn start<H: TuningHost + 'static>(rt: &Arc<H>) {
        let weak = Arc::downgrade(rt);
        let tuner = Arc::clone(rt.tuner());
        let t2 = Arc::clone(&tuner);
        let h = std::thread::Builder::new()
            .name("vgpu-tune".into())
            .spawn(move || {
                loop {
                    let interval = match weak.upgrade() {
                        Some(rt) => rt.running_config().tuning.interval,
                        None => return,
                    };
                    {
                        let stop = t2.stop.lock().unwrap_or_else(|p| p.into_inner());
                        let (stop, _) = t2
                            .wake
                            .wait_timeout_while(stop, interval, |s| !*s)
                            .unwrap_or_else(|p| p.into_inner());
                        if *stop {
                            return;
                        }
                    }
                    let Some(rt) = weak.upgrade() else { return };
                    let mode = rt.running_config().tuning.mode;
                    if mode != TuneMode::Off {
                        t2.run_once(rt.as_ref(), mode);
                    }
                }
            });
        match h {
            Ok(h) => *tuner.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(h),
            Err(e) => warn!(error = %e, "cannot start the tuning controller"),
        }
    }

    /// Stops the controller thread.
    pub fn stop(&self) {
        *self.stop.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.wake.notify_all();
        if let Some(h) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = h.join();
        }
    }

    /// The newest change of a VM.
    pub fn last_change(&self, vm: &str) -> Option<WeightChange> {
        self.lock().last.get(vm).cloned()
    }

    /// The changes of the newest round (in `advise` mode: the advice).
    pub fn pending(&self) -> Vec<WeightChange> {
        self.lock().pending.clone()
    }

    /// Weight changes of a VM since vgpud started (up, down), applied in
    /// `auto` mode or advised in `advise` mode.
    pub fn change_counts(&self, vm: &str) -> (u64, u64) {
        self.lock().counts.get(vm).copied().unwrap_or_default()
    }

    /// Rounds run so far.
    pub fn runs(&self) -> u64 {
        self.lock().runs
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TunerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One round of the controller: observe every VM over the interval since
    /// the last round, decide, and (in `auto` mode) apply.
    pub fn run_once(&self, rt: &dyn TuningHost, mode: TuneMode) -> Vec<WeightChange> {
        let mut st = self.lock();
        let now = Instant::now();
        let elapsed = st.last_run.map(|t| now - t);
        st.last_run = Some(now);
        st.runs += 1;
        let broker = rt.broker();
        let config = rt.running_config();
        // New changes and advice (history, counts, metrics) and everything
        // in force this round (`latest`, which repeats advice not taken).
        let mut changes = Vec::new();
        let mut current = Vec::new();
        for dev in &config.devices {
            let mut obs = Vec::new();
            for vm in config
                .vms
                .iter()
                .filter(|v| v.mode == VmMode::Shared && v.device == dev.name)
            {
                let Some(t) = broker.tenant(&vm.name) else {
                    continue;
                };
                let s = t.sched_stats();
                let u = vm_usage(broker, &t);
                let waited = device_usage(broker, &dev.name)
                    .map(|d| {
                        d.contention
                            .iter()
                            .filter(|c| c.waiting == vm.name)
                            .map(|c| Duration::from_secs_f64(c.total_s))
                            .sum::<Duration>()
                    })
                    .unwrap_or_default();
                let m = st.marks.entry(vm.name.clone()).or_default().clone();
                let new_waits = s.waits_recorded.saturating_sub(m.waits);
                let p99 = t
                    .scheduler()
                    .wait_quantile(t.sched_id(), new_waits, 0.99)
                    .filter(|(_, n)| *n >= MIN_SAMPLES)
                    .map(|(d, _)| d);
                let secs = elapsed.map_or(0.0, |e| e.as_secs_f64());
                let share = if secs > 0.0 {
                    (s.busy.saturating_sub(m.busy)).as_secs_f64() / secs
                } else {
                    u.share_10s
                };
                let waited_now = waited.saturating_sub(m.waited);
                let mut miss = None;
                let mut comfortable = true;
                if let (Some(target), Some(p)) = (vm.tuning.target_wait_p99, p99) {
                    if p > target {
                        miss = Some(format!("p99 wait {} vs target {}", ms(p), ms(target)));
                    } else if p.as_secs_f64() > AIM * target.as_secs_f64() {
                        miss = Some(format!(
                            "p99 wait {} above {:.0} % of its target {}",
                            ms(p),
                            AIM * 100.0,
                            ms(target)
                        ));
                    }
                    comfortable &= p * 2 <= target;
                }
                if let Some(min) = vm.tuning.min_share {
                    let want = f64::from(min) / 100.0;
                    // Only a VM that waited for the device (it had work and
                    // did not get it) misses its share.
                    let contended = secs > 0.0 && waited_now.as_secs_f64() > 0.05 * secs;
                    if contended && share + 0.01 < want && miss.is_none() {
                        miss = Some(format!(
                            "share {:.1} % vs min_share {min} % while it waited",
                            share * 100.0
                        ));
                    }
                    comfortable &= !contended || share >= want + 0.02;
                }
                let mut relax_after = m.relax_after.max(RELAX_AFTER);
                if miss.is_some() && m.since_relax.is_some_and(|r| r < 2) {
                    // The last relax step went too far: wait longer next time.
                    relax_after = (relax_after * 2).min(64);
                }
                st.marks.insert(
                    vm.name.clone(),
                    VmMarks {
                        waits: s.waits_recorded,
                        busy: s.busy,
                        waited,
                        ok_streak: if miss.is_none() && comfortable {
                            m.ok_streak + 1
                        } else {
                            0
                        },
                        relax_after,
                        since_relax: m.since_relax.map(|r| r + 1),
                    },
                );
                obs.push(Observed {
                    vm: vm.clone(),
                    sched_id: t.sched_id(),
                    weight: s.weight,
                    baseline: s.baseline_weight,
                    adjust: s.weight_adjust,
                    p99,
                    share,
                    waited: waited_now,
                    miss,
                    comfortable,
                });
            }
            let any_miss = obs.iter().any(|o| o.miss.is_some());
            let calm = {
                let c = st.calm.entry(dev.name.clone()).or_default();
                *c = if any_miss { 0 } else { *c + 1 };
                *c
            };
            let mut decided: BTreeMap<String, (u32, String)> = BTreeMap::new();
            // Misses first, realtime before normal before batch.
            let mut missing: Vec<&Observed> = obs.iter().filter(|o| o.miss.is_some()).collect();
            missing.sort_by_key(|o| (class_rank(o.vm.priority), o.vm.name.clone()));
            for o in missing {
                let (_, hi) = bounds(&o.vm);
                let why = o.miss.clone().unwrap_or_default();
                if o.weight < hi {
                    let to = (o.weight + step(o.weight)).min(hi);
                    decided.insert(o.vm.name.clone(), (to, why));
                    continue;
                }
                // At its bound: the VM of the lowest class that held it back
                // most gives a step, within its own bound.
                let behind = device_usage(broker, &dev.name)
                    .map(|d| d.contention)
                    .unwrap_or_default();
                let donor = obs
                    .iter()
                    .filter(|d| {
                        d.vm.name != o.vm.name
                            && d.miss.is_none()
                            && !decided.contains_key(&d.vm.name)
                            && class_rank(d.vm.priority) >= class_rank(o.vm.priority)
                            && d.weight > bounds(&d.vm).0
                    })
                    .max_by(|a, b| {
                        let held = |x: &Observed| {
                            behind
                                .iter()
                                .find(|c| c.waiting == o.vm.name && c.running == x.vm.name)
                                .map_or(0.0, |c| c.last_hour_s)
                        };
                        (class_rank(a.vm.priority), !a.vm.tuning.has_target())
                            .cmp(&(class_rank(b.vm.priority), !b.vm.tuning.has_target()))
                            .then(held(a).total_cmp(&held(b)))
                    });
                if let Some(d) = donor {
                    let to = d.weight.saturating_sub(step(d.weight)).max(bounds(&d.vm).0);
                    decided.insert(
                        d.vm.name.clone(),
                        (
                            to,
                            format!(
                                "gives way to `{}` ({why}; `{}` is at its weight_max {hi})",
                                o.vm.name, o.vm.name
                            ),
                        ),
                    );
                }
            }
            // Relax: raised VMs comfortably within their targets for a
            // while, and donors on a calm device, step back to the baseline.
            for o in &obs {
                if decided.contains_key(&o.vm.name) || o.miss.is_some() {
                    continue;
                }
                let (streak, need) = st
                    .marks
                    .get(&o.vm.name)
                    .map_or((0, RELAX_AFTER), |m| (m.ok_streak, m.relax_after));
                if o.adjust > 0 && streak >= need {
                    let to = o.weight.saturating_sub(step(o.weight)).max(o.baseline);
                    let p = o.p99.map_or("no kernels".into(), ms);
                    decided.insert(
                        o.vm.name.clone(),
                        (
                            to,
                            format!("within its targets for {streak} intervals (p99 {p}): back towards baseline {}", o.baseline),
                        ),
                    );
                } else if o.adjust < 0 && calm >= RELAX_AFTER {
                    let to = (o.weight + step(o.weight)).min(o.baseline);
                    decided.insert(
                        o.vm.name.clone(),
                        (
                            to,
                            format!("no VM on `{}` missed a target for {calm} intervals: back towards baseline {}", dev.name, o.baseline),
                        ),
                    );
                }
            }
            for (name, (to, reason)) in decided {
                let Some(o) = obs.iter().find(|o| o.vm.name == name) else {
                    continue;
                };
                if to == o.weight {
                    continue;
                }
                let ch = WeightChange {
                    vm: name.clone(),
                    device: dev.name.clone(),
                    from: o.weight,
                    to,
                    baseline: o.baseline,
                    reason,
                    time: unix_now(),
                    applied: mode == TuneMode::Auto,
                };
                if mode == TuneMode::Auto {
                    if let Some(t) = broker.tenant(&name) {
                        let adjust = i64::from(to) - i64::from(o.baseline);
                        t.scheduler().set_weight_adjust(
                            o.sched_id,
                            adjust.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32,
                        );
                    }
                    info!(vm = %name, from = ch.from, to = ch.to, reason = %ch.reason, "tuning: weight changed");
                    rt.record_tuning(
                        Actor::Tuner,
                        json!({
                            "vm": name, "device": dev.name, "before": { "weight": ch.from },
                            "after": { "weight": ch.to }, "baseline": ch.baseline,
                            "reason": ch.reason, "share": o.share,
                            "p99_wait_s": o.p99.map(|d| d.as_secs_f64()),
                            "waited_s": o.waited.as_secs_f64(),
                            "comfortable": o.comfortable,
                        }),
                    );
                }
                if let Some(m) = st.marks.get_mut(&name) {
                    m.ok_streak = 0;
                    m.since_relax = (to < o.weight && o.adjust > 0).then_some(0);
                }
                if repeats_advice(st.last.get(&name), &ch) {
                    // Advice not taken is still the advice, but not news: it
                    // stays in `latest` without growing the history or counts.
                    current.push(ch);
                    continue;
                }
                current.push(ch.clone());
                let c = st.counts.entry(name.clone()).or_default();
                if ch.to > ch.from {
                    c.0 += 1;
                } else {
                    c.1 += 1;
                }
                st.last.insert(name, ch.clone());
                changes.push(ch);
            }
        }
        st.pending = current;
        st.history.extend(changes.iter().cloned());
        let excess = st.history.len().saturating_sub(256);
        st.history.drain(..excess);
        changes
    }

    /// Every change made or advised (newest last, at most 256).
    pub fn history(&self) -> Vec<WeightChange> {
        self.lock().history.clone()
    }
}

/// Whether `ch` is advice the VM already got and did not take: in `advise`
/// mode the weight never moves, so every round would advise it again.
fn repeats_advice(last: Option<&WeightChange>, ch: &WeightChange) -> bool {
    !ch.applied
        && last.is_some_and(|l| {
            !l.applied && l.device == ch.device && l.from == ch.from && l.to == ch.to
        })
}

// ---------------------------------------------------------------------------
// Analysis

/// Every kind of [`Bottleneck`].
pub const BOTTLENECK_KINDS: [&str; 5] = [
    "capped_while_idle",
    "oversized_slice",
    "fragmentation",
    "memory_full_compute_idle",
    "target_missed_at_bound",
];

/// The slice size to recommend for a high-water mark: 15 % headroom,
/// rounded up to 1 GiB (slices of 4 GiB or more), 256 MiB (1 GiB or more)
/// or 16 MiB.
pub fn recommended_slice(high_water: u64, slice: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let unit = if slice >= 4 << 30 {
        1 << 30
    } else if slice >= 1 << 30 {
        256 * MIB
    } else {
        16 * MIB
    };
    let want = (high_water as f64 * SLICE_HEADROOM).ceil() as u64;
    want.div_ceil(unit).max(1) * unit
}

/// Analyses the running daemon.
pub fn analyze(rt: &dyn TuningHost) -> Analysis {
    let broker = rt.broker();
    let config = rt.running_config();
    let mut hotspots = Vec::new();
    let mut bottlenecks = Vec::new();
    let mut recs = Vec::new();
    for dev in &config.devices {
        let Some(du) = device_usage(broker, &dev.name) else {
            continue;
        };
        for c in du.contention.iter().filter(|c| c.last_hour_s > 0.0) {
            hotspots.push(Hotspot {
                device: dev.name.clone(),
                waiting: c.waiting.clone(),
                running: c.running.clone(),
                last_hour_s: c.last_hour_s,
                total_s: c.total_s,
                peak_minute_start: c.peak_minute_start,
                peak_minute_s: c.peak_minute_s,
            });
        }
        let vms: Vec<&VmConfig> = config
            .vms
            .iter()
            .filter(|v| v.mode == VmMode::Shared && v.device == dev.name)
            .collect();
        let policy = broker.scheduling(&dev.name).map(|s| s.policy);
        let mut slices = Vec::new();
        for vm in &vms {
            let Some(t) = broker.tenant(&vm.name) else {
                continue;
            };
            let u = vm_usage(broker, &t);
            slices.push(u.memory_limit);
            if policy == Some(Policy::Fixed) && u.capped_wait_s > 0.0 && du.utilization_60s < 0.9 {
                bottlenecks.push(Bottleneck {
                    kind: "capped_while_idle".into(),
                    device: dev.name.clone(),
                    vm: Some(vm.name.clone()),
                    detail: format!(
                        "`{}` waited {:.1} s at its fixed cap of {:.0} % while `{}` was busy only {:.0} % of the last minute",
                        vm.name,
                        u.capped_wait_s,
                        u.configured_share * 100.0,
                        dev.name,
                        du.utilization_60s * 100.0
                    ),
                });
                let (_, hi) = bounds(vm);
                let to = (u.weight_now + step(u.weight_now)).min(hi.max(u.weight_now + 1));
                recs.push(Recommendation {
                    vm: vm.name.clone(),
                    setting: "weight".into(),
                    from: u64::from(u.weight_now),
                    to: u64::from(to),
                    text: format!(
                        "{}: pinned at its fixed cap ({:.0} %) while the device idles: weight {} → {} (or policy fair on `{}`)",
                        vm.name,
                        u.configured_share * 100.0,
                        u.weight_now,
                        to,
                        dev.name
                    ),
                });
            }
            let hw = u.memory_high_water_24h;
            if u.memory_peak > 0 && (hw as f64) < OVERSIZED * u.memory_limit as f64 {
                let to = recommended_slice(hw, u.memory_limit);
                if to < u.memory_limit {
                    bottlenecks.push(Bottleneck {
                        kind: "oversized_slice".into(),
                        device: dev.name.clone(),
                        vm: Some(vm.name.clone()),
                        detail: format!(
                            "`{}` has a {} slice and used at most {} in 24 h",
                            vm.name,
                            size(u.memory_limit),
                            gib(hw)
                        ),
                    });
                    recs.push(Recommendation {
                        vm: vm.name.clone(),
                        setting: "memory".into(),
                        from: u.memory_limit,
                        to,
                        text: format!(
                            "{}: slice {}, peak {} in 24 h: shrink to {}",
                            vm.name,
                            size(u.memory_limit),
                            gib(hw),
                            size(to)
                        ),
                    });
                }
            }
            if let (Some(target), true) = (vm.tuning.target_wait_p99, u.queue_wait_p99_s > 0.0) {
                let p = Duration::from_secs_f64(u.queue_wait_p99_s);
                if p > target {
                    let (_, hi) = bounds(vm);
                    let to = (u.weight_now + step(u.weight_now)).min(hi);
                    if to > u.weight_now {
                        recs.push(Recommendation {
                            vm: vm.name.clone(),
                            setting: "weight".into(),
                            from: u64::from(u.weight_now),
                            to: u64::from(to),
                            text: format!(
                                "{}: p99 wait {} vs target {}: weight {} → {}",
                                vm.name,
                                ms(p),
                                ms(target),
                                u.weight_now,
                                to
                            ),
                        });
                    } else {
                        bottlenecks.push(Bottleneck {
                            kind: "target_missed_at_bound".into(),
                            device: dev.name.clone(),
                            vm: Some(vm.name.clone()),
                            detail: format!(
                                "`{}`: p99 wait {} vs target {} at its weight_max {hi}: raise weight_max, lower the others' weights or move a VM to another device",
                                vm.name,
                                ms(p),
                                ms(target)
                            ),
                        });
                    }
                }
            }
        }
        // A new VM with the device's typical slice would be refused
        // although that much memory is free.
        slices.sort_unstable();
        if let Some(&typical) = slices.get(slices.len() / 2)
            && du.memory_unsliced < typical
            && du.memory_free >= typical
        {
            bottlenecks.push(Bottleneck {
                kind: "fragmentation".into(),
                device: dev.name.clone(),
                vm: None,
                detail: format!(
                    "{} of `{}` is free but only {} is in no slice: a new VM with a {} slice would be refused ({:.0} % of the free memory lies in other VMs' slices); shrink oversized slices",
                    Human(du.memory_free),
                    dev.name,
                    Human(du.memory_unsliced),
                    Human(typical),
                    du.fragmentation * 100.0
                ),
            });
        }
        let total = broker
            .device(&dev.name)
            .map_or(0, |d| d.info().total_memory);
        if total > 0 && (du.memory_free as f64) < 0.05 * total as f64 && du.utilization_60s < 0.5 {
            bottlenecks.push(Bottleneck {
                kind: "memory_full_compute_idle".into(),
                device: dev.name.clone(),
                vm: None,
                detail: format!(
                    "`{}` has {} of {} memory free while its compute was busy only {:.0} % of the last minute: memory, not compute, limits how many VMs it holds",
                    dev.name,
                    Human(du.memory_free),
                    Human(total),
                    du.utilization_60s * 100.0
                ),
            });
        }
    }
    hotspots.sort_by(|a, b| b.last_hour_s.total_cmp(&a.last_hour_s));
    hotspots.truncate(10);
    let tuner = rt.tuner();
    Analysis {
        hotspots,
        bottlenecks,
        recommendations: recs,
        tuning: TuningReport {
            mode: config.tuning.mode.as_str().into(),
            interval_s: config.tuning.interval.as_secs_f64(),
            runs: tuner.runs(),
            latest: tuner.pending(),
            history: tuner.history(),
        },
    }
}

/// A slice size as the config writes it, with a space ("8 GiB", "1536 MiB").
fn size(b: u64) -> String {
    let s = vgpu_config::size::format_size(b);
    match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => format!("{} {}", &s[..i], &s[i..]),
        None => s,
    }
}

/// Bytes in GiB with one decimal ("4.2 GiB"), or the exact form when small.
fn gib(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30))
    } else {
        format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_shrink_to_the_high_water_mark_with_headroom() {
        const GIB: u64 = 1 << 30;
        // The example: 8 GiB slice, 4.2 GiB peak → 5 GiB.
        assert_eq!(recommended_slice(42 * GIB / 10, 8 * GIB), 5 * GIB);
        assert_eq!(recommended_slice(100 << 20, 2 * GIB), 256 << 20);
        assert_eq!(recommended_slice(10 << 20, 256 << 20), 16 << 20);
        assert_eq!(gib(42 * GIB / 10), "4.2 GiB");
        assert_eq!(
            (size(8 * GIB), size(1536 << 20)),
            ("8 GiB".into(), "1536 MiB".into())
        );
    }

    use std::sync::atomic::{AtomicBool, Ordering};
    use vgpu_broker::device::RunControl;
    use vgpu_broker::scheduler::Outcome;
    use vgpu_broker::tenant::Tenant;
    use vgpu_config::Config;

    /// Runs "kernels" of `kernel` on `t` (sleeping in 100 us steps, stopping
    /// early at a yield request): `burst` launched at once every `period`
    /// (back to back when `period` is zero), until `stop`.
    fn load(
        t: Arc<Tenant>,
        kernel: Duration,
        burst: usize,
        period: Duration,
        stop: Arc<AtomicBool>,
    ) -> JoinHandle<()> {
        std::thread::spawn(move || {
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let mut tickets: Vec<_> = (0..burst).map(|_| t.queue_kernel()).collect();
                for ticket in &mut tickets {
                    let control = Arc::new(RunControl::default());
                    let mut left = kernel;
                    loop {
                        let Ok(grant) = ticket.acquire(&control) else {
                            return;
                        };
                        let s = Instant::now();
                        while s.elapsed() < left && !control.yield_requested() {
                            std::thread::sleep(Duration::from_micros(100));
                        }
                        let ran = s.elapsed();
                        if ran >= left {
                            grant.finish(Outcome::Completed);
                            break;
                        }
                        grant.finish(Outcome::Yielded);
                        left -= ran;
                    }
                }
                drop(tickets);
                if !period.is_zero() {
                    next += period;
                    if let Some(d) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    } else {
                        next = Instant::now();
                    }
                }
            }
        })
    }

    /// An inference VM (bursts of short kernels, a p99 target) and a
    /// training VM (long kernels): the controller raises the inference VM's
    /// weight until its p99 wait is under the target, within a few
    /// intervals, and holds it there.
    #[test]
    fn the_controller_brings_an_inference_vm_under_its_target_and_holds_it() {
        const TARGET: Duration = Duration::from_millis(50);
        let dir = tempfile::tempdir().unwrap();
        let audit = dir.path().join("audit.log");
        let src = format!(
            "[admin]\naudit_log = \"{}\"\n\
             [tuning]\nmode = \"auto\"\ntune_interval = \"1s\"\n\
             [[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\nslice_ms = 10\n\
             [[vm]]\nname = \"inference\"\nmemory = \"64MiB\"\nweight = 1\nweight_max = 16\ntarget_wait_p99 = \"50ms\"\n\
             [[vm]]\nname = \"training\"\nmemory = \"64MiB\"\nweight = 4\n",
            audit.display()
        );
        let config = Config::parse(&dir.path().join("t.toml"), &src).unwrap();
        let d = crate::Daemon::start(&config).unwrap();
        let b = Arc::clone(d.broker());
        let (inf, tr) = (
            b.tenant("inference").unwrap(),
            b.tenant("training").unwrap(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        // Training saturates with 50 ms kernels; inference wants 25 % of the
        // device (3 x 2 ms every 24 ms) but has weight 1 of 5 (20 %): its
        // queue grows. Slices of 10 ms and a target of 50 ms leave room for
        // thread wake-ups on a loaded machine.
        let h1 = load(
            Arc::clone(&tr),
            Duration::from_millis(50),
            2,
            Duration::ZERO,
            Arc::clone(&stop),
        );
        let h2 = load(
            Arc::clone(&inf),
            Duration::from_millis(2),
            3,
            Duration::from_millis(24),
            Arc::clone(&stop),
        );
        let p99_over = |t: &Tenant, window: Duration| {
            let a = t.sched_stats().waits_recorded;
            std::thread::sleep(window);
            let n = t.sched_stats().waits_recorded - a;
            t.scheduler()
                .wait_quantile(t.sched_id(), n, 0.99)
                .map(|x| x.0)
        };
        // Within a few intervals the weight went up and the p99 is under 50 ms.
        let start = Instant::now();
        let mut met = None;
        let mut missed = false;
        while start.elapsed() < Duration::from_secs(20) {
            // At weight 1 its queue usually grows and the controller must act;
            // on some machines weight 1 already meets the target.
            let p = p99_over(&inf, Duration::from_secs(1));
            if p.is_some_and(|p| p < TARGET) {
                met = Some(start.elapsed());
                break;
            }
            missed |= p.is_some();
        }
        let st = inf.sched_stats();
        let converged = met.unwrap_or_else(|| panic!("inference p99 never met its target: {st:?}"));
        // Within the bounds; when the test saw it miss, the controller had to
        // raise the weight to meet the target.
        assert!(st.weight <= 16, "{st:?}");
        if missed {
            assert!(st.weight > 1, "{st:?}");
        }
        // And it holds: four more one-second windows under the target (one
        // may miss on a loaded machine).
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(p99_over(&inf, Duration::from_secs(1)));
        }
        stop.store(true, Ordering::Relaxed);
        h1.join().unwrap();
        h2.join().unwrap();
        let misses = held
            .iter()
            .filter(|p| p.is_none_or(|p| p >= TARGET))
            .count();
        let changes = d.runtime().tuner().history();
        assert!(
            misses <= 1,
            "converged after {converged:?}, then p99s {held:?}; changes {changes:#?}"
        );
        let raised = changes
            .iter()
            .any(|c| c.vm == "inference" && c.to > c.from && c.applied);
        if missed {
            // It had to act, and said why in the audit log.
            assert!(raised, "{changes:#?}");
            let log = std::fs::read_to_string(&audit).unwrap();
            let line = log
                .lines()
                .find(|l| l.contains("\"vm.tune\""))
                .expect("vm.tune in the audit log");
            assert!(
                line.contains("p99 wait") && line.contains("\"tuner\""),
                "{line}"
            );
        } else if !raised {
            // Weight 1 met the target on this machine: nothing to change, and nothing changed.
            assert_eq!(st.weight, st.baseline_weight, "{changes:#?}");
        }
        eprintln!(
            "controller: target met after {converged:?} ({} rounds), weight {} (baseline {}); then p99 {held:?}",
            d.runtime().tuner().runs(),
            st.weight,
            st.baseline_weight
        );
        d.shutdown();
    }

    /// `analyze` finds a planted oversized slice and a planted contention
    /// pair, and recommends a slice size with numbers.
    #[test]
    fn analyze_finds_a_planted_oversized_slice_and_contention_pair() {
        let dir = tempfile::tempdir().unwrap();
        let src = "[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\n\
             [[vm]]\nname = \"training\"\nmemory = \"512MiB\"\n\
             [[vm]]\nname = \"a\"\nmemory = \"64MiB\"\n\
             [[vm]]\nname = \"b\"\nmemory = \"64MiB\"\n\
             [[vm]]\nname = \"quiet\"\nmemory = \"64MiB\"\n";
        let config = Config::parse(&dir.path().join("t.toml"), src).unwrap();
        let d = crate::Daemon::start(&config).unwrap();
        let b = Arc::clone(d.broker());
        // training peaked at 100 MiB of its 512 MiB slice.
        let tr = b.tenant("training").unwrap();
        tr.slice.charge(100 << 20).unwrap();
        tr.slice.refund(60 << 20);
        // a and b contend for 400 ms.
        let stop = Arc::new(AtomicBool::new(false));
        let hs: Vec<_> = ["a", "b"]
            .iter()
            .map(|n| {
                load(
                    b.tenant(n).unwrap(),
                    Duration::from_millis(3),
                    2,
                    Duration::ZERO,
                    Arc::clone(&stop),
                )
            })
            .collect();
        std::thread::sleep(Duration::from_millis(400));
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
        let a = analyze(d.runtime().as_ref());
        let top = &a.hotspots[0];
        let pair = [top.waiting.as_str(), top.running.as_str()];
        assert!(pair == ["a", "b"] || pair == ["b", "a"], "{a:#?}");
        assert!(
            top.last_hour_s > 0.1 && top.peak_minute_start.is_some(),
            "{top:?}"
        );
        assert!(
            a.hotspots
                .iter()
                .all(|h| h.waiting != "quiet" && h.running != "quiet")
        );
        let rec = a
            .recommendations
            .iter()
            .find(|r| r.vm == "training" && r.setting == "memory")
            .unwrap_or_else(|| panic!("{a:#?}"));
        // 100 MiB peak + 15 % → 115 MiB, rounded up to 16 MiB: 128 MiB.
        assert_eq!((rec.from, rec.to), (512 << 20, 128 << 20));
        assert_eq!(
            rec.text,
            "training: slice 512 MiB, peak 100.0 MiB in 24 h: shrink to 128 MiB"
        );
        assert!(
            a.bottlenecks
                .iter()
                .any(|x| x.kind == "oversized_slice" && x.vm.as_deref() == Some("training"))
        );
        // VMs that never allocated get no advice.
        assert!(!a.recommendations.iter().any(|r| r.vm == "quiet"));
        d.shutdown();
    }

    #[test]
    fn advice_not_taken_is_recorded_once() {
        let advice = |from, to, applied| WeightChange {
            vm: "vm1".into(),
            device: "gpu0".into(),
            from,
            to,
            baseline: 1,
            reason: "p99 wait over target".into(),
            time: 0,
            applied,
        };
        let first = advice(1, 2, false);
        assert!(!repeats_advice(None, &first));
        assert!(repeats_advice(Some(&first), &advice(1, 2, false)));
        // Different advice, and changes made in auto mode, are news.
        assert!(!repeats_advice(Some(&first), &advice(1, 3, false)));
        assert!(!repeats_advice(Some(&first), &advice(1, 2, true)));
        assert!(!repeats_advice(
            Some(&advice(1, 2, true)),
            &advice(1, 2, true)
        ));
    }

    #[test]
    fn weight_steps_are_a_quarter_and_at_least_one() {
        assert_eq!(step(3), 1);
        assert_eq!(step(40), 10);
        assert_eq!(3 + step(3), 4);
    }
}
