//! Compute usage of VMs and devices as the admin API, `vgpuctl top` and the
//! metrics endpoint show it, from the broker's scheduler: configured share,
//! busy time, measured shares over 1 s / 10 s / 1 min / 10 min, queueing,
//! contention between VMs and device time wasted, and the memory slices'
//! use (current, peak, 24-hour high-water mark).

pub use vgpu_api::{ContentionUsage, DeviceUsage, VmUsage};
use vgpu_broker::Broker;
use vgpu_broker::tenant::Tenant;

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
