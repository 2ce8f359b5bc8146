//! Compute usage of VMs and devices as the admin API, `vgpuctl top` and the
//! metrics endpoint show it, from the broker's scheduler: configured share,
//! busy time, measured shares over 1 / 10 / 60 s, queueing.

use serde::Serialize;
use vgpu_broker::Broker;
use vgpu_broker::tenant::Tenant;

/// Compute usage of one VM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
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
    /// 99th percentile launch-to-start wait of recent kernels, in seconds.
    pub queue_wait_p99_s: f64,
    /// Share of the device's time over the last second (0–1).
    pub share_1s: f64,
    /// … over the last 10 seconds.
    pub share_10s: f64,
    /// … over the last 60 seconds.
    pub share_60s: f64,
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
        queue_wait_p99_s: s.queue_wait_p99.as_secs_f64(),
        share_1s: s.share_1s,
        share_10s: s.share_10s,
        share_60s: s.share_60s,
    }
}

/// Usage of a device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DeviceUsage {
    /// Device time used by all VMs, in seconds.
    pub busy_s: f64,
    /// Fraction of wall-clock time the device ran kernels over the last second.
    pub utilization_1s: f64,
    /// … over the last 10 seconds.
    pub utilization_10s: f64,
    /// … over the last 60 seconds.
    pub utilization_60s: f64,
    /// Times the device passed from one VM to another.
    pub switches: u64,
    /// Kernels stopped at a preemption point, all VMs together.
    pub preemptions: u64,
}

/// The usage of a device (None: no such device).
pub fn device_usage(broker: &Broker, device: &str) -> Option<DeviceUsage> {
    let s = broker.scheduler(device)?.device_stats();
    Some(DeviceUsage {
        busy_s: s.busy.as_secs_f64(),
        utilization_1s: s.utilization_1s,
        utilization_10s: s.utilization_10s,
        utilization_60s: s.utilization_60s,
        switches: s.switches,
        preemptions: s.preemptions,
    })
}
