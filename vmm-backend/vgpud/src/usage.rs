//! Compute usage of VMs and devices as the admin API, `vgpuctl top` and the
//! metrics endpoint show it, from the broker's scheduler: configured share,
//! busy time, measured shares over 1 s / 10 s / 1 min / 10 min, queueing,
//! contention between VMs and device time wasted, and the memory slices'
//! use (current, peak, 24-hour high-water mark).

use serde::Serialize;
use vgpu_broker::Broker;
use vgpu_broker::tenant::Tenant;

/// Compute usage of one VM.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct VmUsage {
    /// The weight in force now (a `[[vm.schedule]]` window's, or the base weight).
    pub weight_now: u32,
    /// The VM's weight in force over the sum of the weights in force of the
    /// VMs on its device: the share it gets when every VM is busy (its cap
    /// under the `fixed` policy).
    pub configured_share: f64,
    /// Device time the VM's kernels held the device, in seconds.
    pub busy_s: f64,
    /// Kernels that ran to completion.
    pub kernels_completed: u64,
    /// Kernels submitted and not finished (queued or running).
    pub queued: u32,
    /// Times a running kernel was stopped so that another VM could run (or
    /// because the VM hit its cap).
    pub preemptions: u64,
    /// Total time kernels waited from launch to start, in seconds.
    pub queue_wait_s: f64,
    /// Median launch-to-start wait of recent kernels, in seconds.
    pub queue_wait_p50_s: f64,
    /// 90th percentile launch-to-start wait of recent kernels, in seconds.
    pub queue_wait_p90_s: f64,
    /// 99th percentile launch-to-start wait of recent kernels, in seconds.
    pub queue_wait_p99_s: f64,
    /// The VM's p99 launch-to-start target (`target_wait_p99`), in seconds.
    pub target_wait_p99_s: Option<f64>,
    /// Realtime kernels that waited past their deadline (the target, or two slices).
    pub deadline_misses: u64,
    /// Time the VM had a kernel waiting while the device idled because the
    /// VM had spent its `fixed` cap, in seconds.
    pub capped_wait_s: f64,
    /// The VM's think time between two batches of kernels (synchronous
    /// clients), in seconds.
    pub think_time_s: f64,
    /// Share of the device's time over the last second (0–1).
    pub share_1s: f64,
    /// … over the last 10 seconds.
    pub share_10s: f64,
    /// … over the last 60 seconds.
    pub share_60s: f64,
    /// … over the last 10 minutes.
    pub share_10m: f64,
    /// Bytes charged to the VM's memory slice now.
    pub memory_used: u64,
    /// Most bytes ever charged at once.
    pub memory_peak: u64,
    /// Most bytes charged at once over the last 24 hours.
    pub memory_high_water_24h: u64,
    /// The memory slice.
    pub memory_limit: u64,
}

/// The usage of `t`.
pub fn vm_usage(broker: &Broker, t: &Tenant) -> VmUsage {
    let s = t.sched_stats();
    let total: u64 = broker
        .tenants()
        .iter()
        .filter(|o| o.device_name == t.device_name)
        .map(|o| u64::from(o.sched_stats().weight))
        .sum();
    let configured_share = if total == 0 {
        0.0
    } else {
        f64::from(s.weight) / total as f64
    };
    VmUsage {
        weight_now: s.weight,
        configured_share,
        busy_s: s.busy.as_secs_f64(),
        kernels_completed: s.kernels,
        queued: s.queued,
        preemptions: s.preemptions,
        queue_wait_s: s.queue_wait.as_secs_f64(),
        queue_wait_p50_s: s.queue_wait_p50.as_secs_f64(),
        queue_wait_p90_s: s.queue_wait_p90.as_secs_f64(),
        queue_wait_p99_s: s.queue_wait_p99.as_secs_f64(),
        target_wait_p99_s: s.target_wait.map(|d| d.as_secs_f64()),
        deadline_misses: s.deadline_misses,
        capped_wait_s: s.capped_wait.as_secs_f64(),
        think_time_s: s.think_time.as_secs_f64(),
        share_1s: s.share_1s,
        share_10s: s.share_10s,
        share_60s: s.share_60s,
        share_10m: s.share_10m,
        memory_used: t.slice.used(),
        memory_peak: t.slice.peak(),
        memory_high_water_24h: t.slice.high_water_24h(),
        memory_limit: t.slice.limit(),
    }
}

/// Time one VM had a kernel waiting while another VM's kernel ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ContentionUsage {
    /// The VM that waited.
    pub waiting: String,
    /// The VM that ran.
    pub running: String,
    /// Since both VMs were created, in seconds.
    pub total_s: f64,
    /// Over the last hour, in seconds.
    pub last_hour_s: f64,
    /// Unix time (seconds) of the start of the minute of the last hour with
    /// the most contention.
    pub peak_minute_start: Option<u64>,
    /// Contention in that minute, in seconds.
    pub peak_minute_s: f64,
}

/// Usage of a device.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DeviceUsage {
    /// Device time used by all VMs, in seconds.
    pub busy_s: f64,
    /// Fraction of wall-clock time the device ran kernels over the last second.
    pub utilization_1s: f64,
    /// … over the last 10 seconds.
    pub utilization_10s: f64,
    /// … over the last 60 seconds.
    pub utilization_60s: f64,
    /// … over the last 10 minutes.
    pub utilization_10m: f64,
    /// Times the device passed from one VM to another.
    pub switches: u64,
    /// Kernels stopped at a preemption point, all VMs together.
    pub preemptions: u64,
    /// Time no VM held the device while a kernel that could run waited, in
    /// seconds. The scheduler is work-conserving: this stays 0.
    pub idle_with_work_s: f64,
    /// Time the device idled while kernels waited only because their VMs
    /// had spent their `fixed` caps, in seconds.
    pub idle_capped_s: f64,
    /// Time the device was kept for the holder's next kernel while another
    /// VM's kernel waited (anticipation), in seconds.
    pub anticipation_s: f64,
    /// Time from grants to the granted kernels' start while another VM's
    /// kernel waited, in seconds.
    pub handover_s: f64,
    /// The VM × VM contention matrix, the most contended pair first.
    pub contention: Vec<ContentionUsage>,
    /// Device memory not charged to any VM.
    pub memory_free: u64,
    /// Device memory not in any VM's slice: the largest slice a new VM can
    /// get without over-commit.
    pub memory_unsliced: u64,
    /// The part of the free memory a new VM cannot get because it lies in
    /// other VMs' slices (0–1): `1 − min(unsliced, free) / free`.
    pub fragmentation: f64,
}

/// The usage of a device (None: no such device).
pub fn device_usage(broker: &Broker, device: &str) -> Option<DeviceUsage> {
    let s = broker.scheduler(device)?.device_stats();
    let d = broker.device(device)?;
    let total = d.info().total_memory;
    let free = total.saturating_sub(d.memory_used());
    let sliced: u64 = broker
        .tenants()
        .iter()
        .filter(|t| t.device_name == device)
        .map(|t| t.slice.limit())
        .sum();
    let unsliced = total.saturating_sub(sliced);
    let fragmentation = if free == 0 {
        0.0
    } else {
        1.0 - unsliced.min(free) as f64 / free as f64
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Some(DeviceUsage {
        busy_s: s.busy.as_secs_f64(),
        utilization_1s: s.utilization_1s,
        utilization_10s: s.utilization_10s,
        utilization_60s: s.utilization_60s,
        utilization_10m: s.utilization_10m,
        switches: s.switches,
        preemptions: s.preemptions,
        idle_with_work_s: s.idle_with_work.as_secs_f64(),
        idle_capped_s: s.idle_capped.as_secs_f64(),
        anticipation_s: s.anticipation.as_secs_f64(),
        handover_s: s.handover.as_secs_f64(),
        contention: s
            .contention
            .iter()
            .map(|c| ContentionUsage {
                waiting: c.waiting.clone(),
                running: c.running.clone(),
                total_s: c.total.as_secs_f64(),
                last_hour_s: c.last_hour.as_secs_f64(),
                peak_minute_start: c.peak_minute_ago.map(|a| now.saturating_sub(a.as_secs())),
                peak_minute_s: c.peak_minute.as_secs_f64(),
            })
            .collect(),
        memory_free: free,
        memory_unsliced: unsliced,
        fragmentation,
    })
}
