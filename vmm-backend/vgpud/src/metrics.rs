//! The Prometheus text endpoint (`[admin] metrics_listen`, `GET /metrics`;
//! the same text is at `GET /v1/metrics` on the admin socket).
//!
//! Device metrics use dcgm-exporter's names and units (`DCGM_FI_DEV_FB_USED`
//! in MiB, `DCGM_FI_DEV_GPU_UTIL` in percent, labels `gpu`, `UUID`,
//! `modelName`, plus `device`, vgpud's name for it), so dashboards written
//! for dcgm-exporter show vgpu devices. Per-VM metrics have no DCGM
//! counterpart: they are `vgpu_vm_*` in base units (bytes, seconds, ratios)
//! with labels `vm` and `device`. docs/admin.md lists them all.

use std::fmt::Write as _;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::daemon::Runtime;
use crate::http::{HttpRequest, HttpResponse};
use crate::server::{Handler, HttpServer, Limits, Listen, Peer};
use crate::session_hub::unix_seconds;
use crate::usage::{device_usage, vm_usage};

/// Content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Most scrapes served at once; more get 503.
const MAX_CONCURRENT: usize = 8;
/// The metrics endpoint's bounds: scrapers are few and a scrape is quick.
const LIMITS: Limits = Limits {
    connections: 4 * MAX_CONCURRENT,
    requests: MAX_CONCURRENT,
    deadline: CLIENT_TIMEOUT,
};
/// Longest time a scrape may take, from its body to its answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
const MIB: f64 = (1u64 << 20) as f64;

#[derive(Clone, Copy)]
enum Kind {
    Gauge,
    Counter,
}

struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

/// Builds a text exposition family by family.
#[derive(Default)]
struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    fn family(&mut self, name: &'static str, kind: Kind, help: &'static str) -> &mut Family {
        if let Some(i) = self.families.iter().position(|f| f.name == name) {
            return &mut self.families[i];
        }
        self.families.push(Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        });
        self.families.last_mut().expect("just pushed")
    }

    fn gauge(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        v: f64,
    ) {
        self.add(name, Kind::Gauge, help, labels, v);
    }

    fn counter(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        v: f64,
    ) {
        self.add(name, Kind::Counter, help, labels, v);
    }

    /// A counter with one sample per direction, `guest_to_host` and `host_to_guest`, besides
    /// the VM's labels `l`.
    fn counter_per_direction(
        &mut self,
        name: &'static str,
        help: &'static str,
        l: &[(&'static str, &str)],
        guest_to_host: u64,
        host_to_guest: u64,
    ) {
        for (dir, v) in [
            ("guest_to_host", guest_to_host),
            ("host_to_guest", host_to_guest),
        ] {
            let mut labels = l.to_vec();
            labels.push(("direction", dir));
            self.counter(name, help, &labels, v as f64);
        }
    }

    fn add(
        &mut self,
        name: &'static str,
        kind: Kind,
        help: &'static str,
        labels: &[(&'static str, &str)],
        v: f64,
    ) {
        let labels = labels.iter().map(|(k, v)| (*k, (*v).to_string())).collect();
        self.family(name, kind, help).samples.push((labels, v));
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let kind = match f.kind {
                Kind::Gauge => "gauge",
                Kind::Counter => "counter",
            };
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(out, "# TYPE {} {kind}", f.name);
            for (labels, v) in &f.samples {
                out.push_str(f.name);
                if !labels.is_empty() {
                    out.push('{');
                    for (i, (k, val)) in labels.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, "{k}=\"{}\"", escape_label(val));
                    }
                    out.push('}');
                }
                let _ = writeln!(out, " {}", format_value(*v));
            }
        }
        out
    }
}

/// Escapes a label value (backslash, double quote, newline).
pub fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Renders the metrics of the daemon.
pub fn render(rt: &Runtime) -> String {
    let mut e = Exposition::default();
    let broker = rt.broker();
    e.gauge(
        "vgpu_build_info",
        "vgpud version and protocol version (always 1).",
        &[
            ("version", env!("CARGO_PKG_VERSION")),
            ("protocol", &vgpu_proto::PROTOCOL_VERSION.to_string()),
        ],
        1.0,
    );
    e.gauge(
        "vgpu_start_time_seconds",
        "When vgpud started, in seconds since the Unix epoch.",
        &[],
        unix_seconds(rt.started()) as f64,
    );
    if let Some(bytes) = vgpu_broker::heap_in_use() {
        e.gauge(
            "vgpu_heap_in_use_bytes",
            "Heap bytes vgpud has allocated and not freed (a leak makes it grow with the work).",
            &[],
            bytes as f64,
        );
    }
    let tenants = broker.tenants();
    let analysis = crate::tuning::analyze(rt);
    for setting in ["memory", "weight"] {
        e.gauge(
            "vgpu_recommendations",
            "Recommendations vgpuctl analyze makes now, by setting.",
            &[("setting", setting)],
            analysis
                .recommendations
                .iter()
                .filter(|r| r.setting == setting)
                .count() as f64,
        );
    }
    for kind in crate::tuning::BOTTLENECK_KINDS {
        e.gauge(
            "vgpu_bottlenecks",
            "Bottlenecks vgpuctl analyze finds now, by kind.",
            &[("kind", kind)],
            analysis
                .bottlenecks
                .iter()
                .filter(|b| b.kind == kind)
                .count() as f64,
        );
    }
    for (i, (name, d)) in broker.devices().iter().enumerate() {
        let info = d.info();
        let gpu = i.to_string();
        let uuid = vgpu_proto::cuda::gpu_uuid_text(&info.uuid);
        let l: [(&'static str, &str); 4] = [
            ("gpu", &gpu),
            ("UUID", &uuid),
            ("device", name),
            ("modelName", &info.name),
        ];
        let used = d.memory_used();
        e.gauge(
            "DCGM_FI_DEV_FB_TOTAL",
            "Device memory in MiB (dcgm-exporter's name and unit).",
            &l,
            info.total_memory as f64 / MIB,
        );
        e.gauge(
            "DCGM_FI_DEV_FB_USED",
            "Device memory in use in MiB (dcgm-exporter's name and unit).",
            &l,
            used as f64 / MIB,
        );
        e.gauge(
            "DCGM_FI_DEV_FB_FREE",
            "Device memory free in MiB (dcgm-exporter's name and unit).",
            &l,
            info.total_memory.saturating_sub(used) as f64 / MIB,
        );
        if let Some(u) = device_usage(broker, name) {
            e.gauge(
                "DCGM_FI_DEV_GPU_UTIL",
                "Device busy over the last second, in percent (dcgm-exporter's name and unit).",
                &l,
                (u.utilization_1s * 100.0).round(),
            );
            for (window, v) in [
                ("1s", u.utilization_1s),
                ("10s", u.utilization_10s),
                ("60s", u.utilization_60s),
                ("10m", u.utilization_10m),
            ] {
                e.gauge(
                    "vgpu_device_utilization",
                    "Fraction of time the device ran kernels over the window (0-1).",
                    &[("device", name), ("window", window)],
                    v,
                );
            }
            e.counter(
                "vgpu_device_busy_seconds_total",
                "Device time used by all VMs.",
                &[("device", name)],
                u.busy_s,
            );
            e.counter(
                "vgpu_device_switches_total",
                "Times the device passed from one VM to another.",
                &[("device", name)],
                u.switches as f64,
            );
            e.counter(
                "vgpu_device_preemptions_total",
                "Kernels stopped at a preemption point, all VMs together.",
                &[("device", name)],
                u.preemptions as f64,
            );
            e.counter(
                "vgpu_device_idle_with_work_seconds_total",
                "Time no VM held the device while a kernel that could run waited (work conservation: stays 0).",
                &[("device", name)],
                u.idle_with_work_s,
            );
            e.counter(
                "vgpu_device_idle_capped_seconds_total",
                "Time the device idled while kernels waited only because their VMs had spent their fixed caps.",
                &[("device", name)],
                u.idle_capped_s,
            );
            e.counter(
                "vgpu_device_anticipation_seconds_total",
                "Time the device was kept for the holder's next kernel while another VM's kernel waited.",
                &[("device", name)],
                u.anticipation_s,
            );
            e.counter(
                "vgpu_device_handover_seconds_total",
                "Time from grants to the granted kernels' start while another VM's kernel waited.",
                &[("device", name)],
                u.handover_s,
            );
            // The whole matrix, zeros included, so every pair has a series.
            let vms: Vec<&str> = tenants
                .iter()
                .filter(|t| &t.device_name == name)
                .map(|t| t.name.as_str())
                .collect();
            for a in &vms {
                for b in vms.iter().filter(|b| *b != a) {
                    let v = u
                        .contention
                        .iter()
                        .find(|c| c.waiting == *a && c.running == *b)
                        .map_or(0.0, |c| c.total_s);
                    e.counter(
                        "vgpu_device_contention_seconds_total",
                        "Time VM `vm` had a kernel waiting while VM `running` ran (the contention matrix).",
                        &[("device", name), ("vm", a), ("running", b)],
                        v,
                    );
                }
            }
            e.gauge(
                "vgpu_device_memory_unsliced_bytes",
                "Device memory in no VM's slice: the largest slice a new VM can get without over-commit.",
                &[("device", name)],
                u.memory_unsliced as f64,
            );
            e.gauge(
                "vgpu_device_memory_fragmentation",
                "Part of the free device memory a new VM cannot get because it lies in other VMs' slices (0-1).",
                &[("device", name)],
                u.fragmentation,
            );
        }
        let on_dev: Vec<_> = tenants.iter().filter(|t| &t.device_name == name).collect();
        let dl: [(&'static str, &str); 2] = [("device", name), ("kind", info.kind)];
        e.gauge(
            "vgpu_device_slices_bytes",
            "Sum of the memory slices of the device's VMs (above the device memory: over-committed).",
            &dl[..1],
            on_dev.iter().map(|t| t.slice.limit()).sum::<u64>() as f64,
        );
        e.gauge(
            "vgpu_device_vms",
            "VMs on the device.",
            &dl[..1],
            on_dev.len() as f64,
        );
        if let Some(units) = d.execution_units() {
            for (state, n) in [("busy", units.busy), ("waiting", units.waiting)] {
                e.gauge(
                    "vgpu_device_execution_units",
                    "Simulated GPU: execution units running a block (busy) and kernel workers waiting for one (waiting).",
                    &[("device", name), ("state", state)],
                    f64::from(n),
                );
            }
        }
        if let Some(p) = broker.placement(name).map(|p| p.snapshot()) {
            e.gauge(
                "vgpu_device_overcommit",
                "How far the slices of the device's VMs may add up past its memory (`overcommit`).",
                &dl[..1],
                p.overcommit.map_or(0.0, |o| o.as_f64()),
            );
            e.gauge(
                "vgpu_device_memory_reserved_bytes",
                "Reservations of the device's VMs added up.",
                &dl[..1],
                p.reserved as f64,
            );
            e.gauge(
                "vgpu_device_memory_host_overflow_bytes",
                "Memory of the device's VMs overflowed to host memory.",
                &dl[..1],
                p.host_used as f64,
            );
        }
        if let Some(s) = broker.scheduling(name) {
            e.gauge(
                "vgpu_device_info",
                "Device kind and scheduling policy (always 1).",
                &[
                    ("device", name),
                    ("kind", info.kind),
                    ("model", &info.name),
                    ("policy", s.policy.as_str()),
                ],
                1.0,
            );
            e.gauge(
                "vgpu_device_slice_seconds",
                "Scheduling time slice of the device.",
                &dl[..1],
                s.slice.as_secs_f64(),
            );
        }
    }
    for t in &tenants {
        let s = t.settings();
        let l: [(&'static str, &str); 2] = [("vm", &t.name), ("device", &t.device_name)];
        e.gauge(
            "vgpu_vm_info",
            "The VM's priority class (always 1).",
            &[
                ("vm", &t.name),
                ("device", &t.device_name),
                ("priority", s.priority.as_str()),
            ],
            1.0,
        );
        e.gauge(
            "vgpu_vm_fb_used_bytes",
            "Device memory the VM's processes hold (charged to its slice).",
            &l,
            t.slice.used() as f64,
        );
        let k = t.usage.breakdown(t.slice.used());
        for (kind, bytes) in [
            ("plain", k.plain),
            ("pool_reserved", k.pool_reserved),
            ("pool_used", k.pool_used),
            ("managed", k.managed),
            ("mapped_host", k.mapped_host),
            ("vmm_physical", k.vmm_physical),
        ] {
            e.gauge(
                "vgpu_vm_memory_bytes",
                "The VM's charged memory by kind of allocation (pool_used is part of pool_reserved).",
                &[("vm", &t.name), ("device", &t.device_name), ("kind", kind)],
                bytes as f64,
            );
        }
        {
            use vgpu_config::limits::Budget;
            let lim = t.limits.limits();
            for b in Budget::ALL {
                let labels = [("vm", t.name.as_str()), ("budget", b.key())];
                let used = match b {
                    Budget::Sessions => Some(t.sessions().len() as u64),
                    Budget::Connections => None,
                    _ => Some(t.limits.used(b)),
                };
                let limit = lim.get(b);
                e.gauge(
                    "vgpu_vm_limit",
                    "The VM's budgets besides memory (`[limits]`, `[vm.limits]`).",
                    &labels,
                    limit as f64,
                );
                if let Some(used) = used {
                    e.gauge(
                        "vgpu_vm_limit_used",
                        "What the VM's sessions hold against each budget.",
                        &labels,
                        used as f64,
                    );
                }
                e.counter(
                    "vgpu_vm_limit_refused_total",
                    "Requests refused because the VM held a budget (sessions at cuInit, connections at connect, modules at load, streams, events and handles at creation, graph bytes at instantiation, interpreter state at launch and call (interpreter_bytes; a launch cut to fewer workers counts); queued_bytes: submissions that waited for room).",
                    &labels,
                    t.limits.refused(b) as f64,
                );
            }
        }
        e.gauge(
            "vgpu_vm_fb_limit_bytes",
            "The VM's memory slice (hard limit).",
            &l,
            t.slice.limit() as f64,
        );
        if let Some(m) = t.placement().map(|m| m.snapshot()) {
            for (name, help, v) in [
                (
                    "vgpu_vm_memory_reserved_bytes",
                    "Device memory guaranteed to the VM (`reserved`).",
                    m.policy.reserved,
                ),
                (
                    "vgpu_vm_memory_device_bytes",
                    "The VM's charged memory that lives in device memory.",
                    m.device,
                ),
                (
                    "vgpu_vm_memory_host_overflow_bytes",
                    "The VM's charged memory overflowed to host memory (same device addresses).",
                    m.host,
                ),
                (
                    "vgpu_vm_memory_borrowed_bytes",
                    "Device memory the VM holds past its reservation (not guaranteed).",
                    m.borrowed,
                ),
                (
                    "vgpu_vm_memory_overflow_limit_bytes",
                    "Most host memory the VM may overflow to (`overflow_limit`).",
                    m.policy.overflow_limit,
                ),
            ] {
                e.gauge(name, help, &l, v as f64);
            }
            for (name, help, v) in [
                (
                    "vgpu_vm_memory_demotions_total",
                    "Allocations of the VM moved from device to host memory (another VM claimed its reservation).",
                    m.demotions,
                ),
                (
                    "vgpu_vm_memory_demoted_bytes_total",
                    "Bytes of the VM moved from device to host memory.",
                    m.demoted_bytes,
                ),
                (
                    "vgpu_vm_memory_promotions_total",
                    "Allocations of the VM moved back from host to device memory.",
                    m.promotions,
                ),
                (
                    "vgpu_vm_memory_promoted_bytes_total",
                    "Bytes of the VM moved back from host to device memory.",
                    m.promoted_bytes,
                ),
            ] {
                e.counter(name, help, &l, v as f64);
            }
        }
        e.gauge(
            "vgpu_vm_weight",
            "The VM's base compute weight.",
            &l,
            f64::from(s.weight),
        );
        let u = vm_usage(broker, t);
        e.gauge(
            "vgpu_vm_weight_now",
            "The VM's weight in force now (a schedule window's or the base weight).",
            &l,
            f64::from(u.weight_now),
        );
        e.gauge(
            "vgpu_vm_configured_share",
            "The VM's weight in force over the sum of the weights in force on its device (0-1).",
            &l,
            u.configured_share,
        );
        for (window, v) in [
            ("1s", u.share_1s),
            ("10s", u.share_10s),
            ("60s", u.share_60s),
            ("10m", u.share_10m),
        ] {
            e.gauge(
                "vgpu_vm_compute_share",
                "Share of the device's time the VM used over the window (0-1).",
                &[
                    ("vm", &t.name),
                    ("device", &t.device_name),
                    ("window", window),
                ],
                v,
            );
        }
        e.counter(
            "vgpu_vm_busy_seconds_total",
            "Device time the VM's kernels held the device.",
            &l,
            u.busy_s,
        );
        e.counter(
            "vgpu_vm_queue_wait_seconds_total",
            "Time the VM's kernels waited from launch to start, summed.",
            &l,
            u.queue_wait_s,
        );
        e.gauge(
            "vgpu_vm_queue_wait_p99_seconds",
            "99th percentile launch-to-start wait of the VM's recent kernels.",
            &l,
            u.queue_wait_p99_s,
        );
        for (q, v) in [
            ("0.5", u.queue_wait_p50_s),
            ("0.9", u.queue_wait_p90_s),
            ("0.99", u.queue_wait_p99_s),
        ] {
            e.gauge(
                "vgpu_vm_queue_wait_seconds",
                "Launch-to-start wait of the VM's recent kernels at the quantile.",
                &[("vm", &t.name), ("device", &t.device_name), ("quantile", q)],
                v,
            );
        }
        if let Some(target) = u.target_wait_p99_s {
            e.gauge(
                "vgpu_vm_target_wait_p99_seconds",
                "The VM's p99 launch-to-start target (target_wait_p99).",
                &l,
                target,
            );
        }
        e.counter(
            "vgpu_vm_deadline_misses_total",
            "Realtime kernels that waited past their deadline (target_wait_p99, or two slices).",
            &l,
            u.deadline_misses as f64,
        );
        e.counter(
            "vgpu_vm_capped_wait_seconds_total",
            "Time the VM had a kernel waiting while the device idled because the VM had spent its fixed cap.",
            &l,
            u.capped_wait_s,
        );
        e.gauge(
            "vgpu_vm_think_time_seconds",
            "The VM's think time between two batches of kernels (synchronous clients).",
            &l,
            u.think_time_s,
        );
        let tune = t.sched_stats();
        e.gauge(
            "vgpu_vm_weight_adjust",
            "The tuning controller's adjustment of the VM's weight (weight in force - baseline).",
            &l,
            f64::from(tune.weight_adjust),
        );
        let (up, down) = rt.tuner().change_counts(&t.name);
        for (direction, n) in [("up", up), ("down", down)] {
            e.counter(
                "vgpu_vm_tune_changes_total",
                "Weight changes by the tuning controller (applied in auto mode, advised in advise mode).",
                &[
                    ("vm", &t.name),
                    ("device", &t.device_name),
                    ("direction", direction),
                ],
                n as f64,
            );
        }
        e.gauge(
            "vgpu_vm_fb_peak_bytes",
            "Most device memory the VM ever held at once.",
            &l,
            u.memory_peak as f64,
        );
        e.gauge(
            "vgpu_vm_fb_high_water_24h_bytes",
            "Most device memory the VM held at once over the last 24 hours.",
            &l,
            u.memory_high_water_24h as f64,
        );
        e.gauge(
            "vgpu_vm_kernels_queued",
            "Kernels of the VM submitted and not finished.",
            &l,
            f64::from(u.queued),
        );
        e.counter(
            "vgpu_vm_preemptions_total",
            "Times a running kernel of the VM was stopped so another VM could run (or at its cap).",
            &l,
            u.preemptions as f64,
        );
        let st = &t.stats;
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed) as f64;
        e.counter(
            "vgpu_vm_kernels_total",
            "Kernels the VM launched.",
            &l,
            get(&st.kernels),
        );
        for (dir, c) in [("htod", &st.bytes_htod), ("dtoh", &st.bytes_dtoh)] {
            e.counter(
                "vgpu_vm_copy_bytes_total",
                "Bytes the VM copied between host and device (direction htod or dtoh).",
                &[
                    ("vm", &t.name),
                    ("device", &t.device_name),
                    ("direction", dir),
                ],
                get(c),
            );
        }
        e.counter(
            "vgpu_vm_errors_total",
            "CUDA calls of the VM that failed.",
            &l,
            get(&st.errors),
        );
        e.counter(
            "vgpu_vm_module_loads_stopped_total",
            "Module loads of the VM stopped at the device's watchdog deadline.",
            &l,
            get(&st.module_loads_stopped),
        );
        e.gauge(
            "vgpu_vm_sessions",
            "Live sessions (guest processes) of the VM.",
            &l,
            t.sessions().len() as f64,
        );
        e.counter(
            "vgpu_vm_sessions_opened_total",
            "Sessions the VM has opened.",
            &l,
            get(&st.sessions_total),
        );
        e.gauge(
            "vgpu_vm_accepting_sessions",
            "1 when the VM accepts new sessions, 0 while it drains.",
            &l,
            if t.is_open() { 1.0 } else { 0.0 },
        );
        if let Some((_, vs)) = rt.vsock_of(&t.name) {
            e.gauge(
                "vgpu_vm_vsock_connections",
                "Open connections of the VM's vsock device.",
                &l,
                vs.connections_open as f64,
            );
            e.counter_per_direction(
                "vgpu_vm_vsock_bytes_total",
                "Payload bytes through the VM's vsock device.",
                &l,
                vs.bytes_guest_to_host,
                vs.bytes_host_to_guest,
            );
            e.counter(
                "vgpu_vm_vsock_device_resets_total",
                "Resets of the VM's vsock device (VMM disconnects, guest reboots).",
                &l,
                vs.device_resets as f64,
            );
            e.counter(
                "vgpu_vm_vsock_lost_wakeups_total",
                "Wake-ups between the VM's vsock device and its in-process sessions that the device's audit found lost and made up for (0 when healthy; each is logged).",
                &l,
                vs.lost_wakeups as f64,
            );
        }
        if let Some((_, vd)) = rt.vgpu_dev_of(&t.name) {
            e.gauge(
                "vgpu_vm_vgpu_device_sessions",
                "Open sessions (guest file descriptors) of the VM's virtio-vgpu device.",
                &l,
                vd.sessions_open as f64,
            );
            e.counter_per_direction(
                "vgpu_vm_vgpu_device_bytes_total",
                "Bulk bytes the VM's virtio-vgpu device moved in place between guest pages and the GPU.",
                &l,
                vd.bytes_from_guest,
                vd.bytes_to_guest,
            );
            e.counter_per_direction(
                "vgpu_vm_vgpu_device_segments_total",
                "Guest-physical ranges the VM's virtio-vgpu bulk bytes came in or went to; bytes_total / segments_total is the average physically contiguous run of the guest's buffers.",
                &l,
                vd.segments_from_guest,
                vd.segments_to_guest,
            );
            e.counter(
                "vgpu_vm_vgpu_device_refused_total",
                "Descriptor chains and requests the VM's virtio-vgpu device refused (malformed or hostile).",
                &l,
                (vd.dropped_chains + vd.refused_requests) as f64,
            );
            e.counter(
                "vgpu_vm_vgpu_device_resets_total",
                "Resets of the VM's virtio-vgpu device (VMM disconnects, guest driver restarts).",
                &l,
                vd.device_resets as f64,
            );
            e.counter(
                "vgpu_vm_vgpu_device_pauses_total",
                "Times the VMM stopped the VM's virtio-vgpu queues with sessions open (VM paused).",
                &l,
                vd.pauses as f64,
            );
            e.counter(
                "vgpu_vm_vgpu_device_batches_total",
                "BATCH requests (several asynchronous frames in one chain) the VM's virtio-vgpu device took.",
                &l,
                vd.batches as f64,
            );
        }
    }
    e.render()
}

/// The running metrics endpoint.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    _server: HttpServer,
}

impl MetricsServer {
    /// Serves `GET /metrics` on `addr` (port 0: any free port; see
    /// [`MetricsServer::local_addr`]).
    pub fn start(rt: Arc<Runtime>, addr: SocketAddr) -> io::Result<MetricsServer> {
        let l = TcpListener::bind(addr)?;
        let addr = l.local_addr()?;
        let handler: Handler = Arc::new(move |_: &Peer, req: HttpRequest| respond(&rt, &req));
        let server = HttpServer::start("metrics", Listen::Tcp(l), LIMITS, handler)?;
        Ok(MetricsServer {
            addr,
            _server: server,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// What the metrics endpoint answers `req`.
fn respond(rt: &Runtime, req: &HttpRequest) -> HttpResponse {
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/metrics") => HttpResponse::text(200, CONTENT_TYPE, render(rt)),
        (_, "/metrics") => HttpResponse::error(405, "only GET /metrics is served here"),
        _ => HttpResponse::error(404, "not found: metrics are at /metrics"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_grouped_and_labels_escaped() {
        let mut e = Exposition::default();
        e.gauge("a", "help a", &[("vm", "x\"y\\z\nw")], 1.5);
        e.counter("b_total", "help b", &[], 3.0);
        e.gauge("a", "help a", &[("vm", "q")], 2.0);
        let text = e.render();
        assert_eq!(
            text,
            "# HELP a help a\n# TYPE a gauge\na{vm=\"x\\\"y\\\\z\\nw\"} 1.5\na{vm=\"q\"} 2\n\
             # HELP b_total help b\n# TYPE b_total counter\nb_total 3\n"
        );
    }
}
