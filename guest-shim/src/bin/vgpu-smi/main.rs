//! vgpu-smi: shows a guest its virtual GPU, its memory slice and the
//! processes using it, in the style of nvidia-smi, and answers nvidia-smi's
//! query options (`-L`, `--query-gpu`, `--query-compute-apps`; [`query`]) for
//! scripts and tools that call nvidia-smi (installed under that name where the
//! guest has none).

mod query;

use std::process::ExitCode;

use clap::Parser;
use cuda::{driver, nvml};
use serde_json::Value;

/// Shows this VM's virtual GPU: device, memory slice (used/total) and the processes using it.
#[derive(Debug, Parser)]
#[command(name = "vgpu-smi", version)]
struct Args {
    /// Print JSON instead of a table.
    #[arg(long, conflicts_with_all = ["list_gpus", "query_gpu", "query_compute_apps"])]
    json: bool,
    /// List the GPUs, one line each: `GPU 0: NAME (UUID: GPU-…)` (nvidia-smi -L).
    #[arg(short = 'L', long)]
    list_gpus: bool,
    /// Print these GPU fields (comma-separated, nvidia-smi's names: name, uuid, pci.bus_id,
    /// memory.total, memory.used, memory.free, utilization.gpu, compute_cap, driver_version, …);
    /// needs --format.
    #[arg(
        long,
        value_name = "FIELDS",
        requires = "format",
        conflicts_with = "list_gpus"
    )]
    query_gpu: Option<String>,
    /// Print these fields of each process of the VM that uses the GPU (pid, process_name,
    /// used_memory, gpu_uuid, gpu_bus_id, gpu_name); needs --format.
    #[arg(
        long,
        value_name = "FIELDS",
        requires = "format",
        conflicts_with_all = ["list_gpus", "query_gpu"]
    )]
    query_compute_apps: Option<String>,
    /// Output format of the queries: csv, with noheader and nounits (csv,noheader,nounits).
    #[arg(long, value_name = "FORMAT")]
    format: Option<String>,
    /// The GPU to show, by index, UUID or PCI bus id (the VM has one, index 0).
    #[arg(short = 'i', long = "id", value_name = "ID")]
    id: Option<String>,
}

/// Exit codes: an error (bad arguments or fields, as nvidia-smi's 2, and a vgpud that cannot be
/// reached), and a GPU that is not there (nvidia-smi's "No devices were found").
const EXIT_ERROR: u8 = 2;
const EXIT_NO_DEVICE: u8 = 6;

/// Characters between the table's outer `|` borders.
const INNER_WIDTH: usize = 77;
/// Column widths of the device row: GPU index, name (UUID takes the rest).
const GPU_COL: usize = 5;
const NAME_COL: usize = 30;
/// Column widths of the process rows: PID, name, memory (right-aligned).
const PID_COL: usize = 11;
const PROC_COL: usize = 44;
const PROC_MEM_COL: usize = 16;
const MIB_SHIFT: u32 = 20;
const PERCENT: u64 = 100;

fn human(bytes: u64) -> String {
    format!("{}MiB", bytes >> MIB_SHIFT)
}

/// Fits `s` into exactly `width` characters: padded on the right, or cut
/// with a trailing `~` when too long, so that columns never shift.
fn fit(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        format!("{s}{}", " ".repeat(width - n))
    } else if width == 0 {
        String::new()
    } else {
        let mut cut: String = s.chars().take(width - 1).collect();
        cut.push('~');
        cut
    }
}

/// [`fit`] into `width - 1` characters and a separating space.
fn col(s: &str, width: usize) -> String {
    format!("{} ", fit(s, width.saturating_sub(1)))
}

/// Like [`fit`], right-aligned.
fn fit_right(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        format!("{}{s}", " ".repeat(width - n))
    } else {
        fit(s, width)
    }
}

fn row(content: &str) -> String {
    format!("|{}|", fit(content, INNER_WIDTH))
}

fn rule() -> String {
    format!("+{}+", "-".repeat(INNER_WIDTH))
}

/// What the table shows besides the broker's tenant JSON.
struct Device<'a> {
    name: &'a str,
    uuid: &'a str,
    driver_version: i32,
    /// How this VM reaches vgpud, as `VGPU_TRANSPORT` would say it.
    transport: &'a str,
    /// With the virtio-vgpu device: its virtio device ID and vgpu-smi's session on it.
    device: Option<(u32, u32)>,
}

impl Device<'_> {
    /// The transport for people: `dev:/dev/vgpu0 (virtio-vgpu device, ID 63)`.
    fn transport_line(&self) -> String {
        match self.device {
            Some((id, _)) => format!("{} (virtio-vgpu device, ID {id})", self.transport),
            None if self.transport.starts_with("vsock:") => {
                format!("{} (virtio-vsock)", self.transport)
            }
            None => self.transport.to_string(),
        }
    }
}

/// The VM's sessions but vgpu-smi's own: every process that has the GPU open.
fn sessions(info: &Value) -> impl Iterator<Item = &Value> {
    let me = info["this_session"].as_u64();
    info["sessions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(move |s| me.is_none() || s["session"].as_u64() != me)
}

/// The sessions of processes that use the GPU, as nvidia-smi lists them: those with a CUDA
/// context (all of them from a vgpud that does not say), never vgpu-smi's own.
fn processes(info: &Value) -> impl Iterator<Item = &Value> {
    sessions(info).filter(|s| s["contexts"].as_u64().is_none_or(|c| c > 0))
}

/// Renders the nvidia-smi style table; every line is `INNER_WIDTH + 2` wide.
fn render_table(info: &Value, dev: &Device<'_>) -> Vec<String> {
    let total = info["memory_total"].as_u64().unwrap_or(0);
    let used = info["memory_used"].as_u64().unwrap_or(0);
    let kernels = info["kernels"].as_u64().unwrap_or(0);
    let percent = (used * PERCENT).checked_div(total).unwrap_or(0);
    let mut out = vec![rule()];
    let header = format!(
        " {} {}   Driver API {}   VM: ",
        "vgpu-smi",
        vgpu_proto::VERSION,
        format_version(dev.driver_version),
    );
    let vm = info["vm"].as_str().unwrap_or("?");
    out.push(row(&format!(
        "{header}{}",
        fit(vm, INNER_WIDTH.saturating_sub(header.len()))
    )));
    out.push(rule());
    out.push(row(&format!(
        " {}{}{}",
        fit("GPU", GPU_COL),
        fit("Name", NAME_COL),
        "UUID"
    )));
    let uuid_col = INNER_WIDTH - 1 - GPU_COL - NAME_COL;
    out.push(row(&format!(
        " {}{}{}",
        fit_right("0  ", GPU_COL),
        col(dev.name, NAME_COL),
        fit(dev.uuid, uuid_col)
    )));
    let util = (info["share_1s"].as_f64().unwrap_or(0.0).clamp(0.0, 1.0) * PERCENT as f64).round();
    out.push(row(&format!(
        " {}Memory-Usage: {} / {} ({percent}%)   GPU-Util: {util}%   Kernels: {kernels}",
        " ".repeat(GPU_COL),
        human(used),
        human(total),
    )));
    let k = &info["memory_by_kind"];
    if k.is_object() {
        // Plain memory always; the other kinds when the VM uses them.
        let n = |key: &str| k[key].as_u64().unwrap_or(0);
        let mut parts = vec![format!("plain {}", human(n("plain")))];
        if n("pool_reserved") > 0 {
            parts.push(format!(
                "pools {} ({} used)",
                human(n("pool_reserved")),
                human(n("pool_used"))
            ));
        }
        for (key, label) in [
            ("managed", "managed"),
            ("mapped_host", "mapped"),
            ("vmm_physical", "VMM"),
        ] {
            if n(key) > 0 {
                parts.push(format!("{label} {}", human(n(key))));
            }
        }
        let line = format!("By kind: {}", parts.join(", "));
        out.push(row(&format!(
            " {}{}",
            " ".repeat(GPU_COL),
            fit(&line, INNER_WIDTH - 1 - GPU_COL)
        )));
    }
    let mp = &info["memory_placement"];
    if mp.is_object() {
        // Where the slice's bytes are: device memory, or host memory when the device was full.
        let n = |key: &str| mp[key].as_u64().unwrap_or(0);
        let mut line = format!(
            "Placement: device {}, host overflow {}",
            human(n("device")),
            human(n("host_overflow"))
        );
        if n("reserved") > 0 {
            line += &format!(", reserved {}", human(n("reserved")));
        }
        out.push(row(&format!(
            " {}{}",
            " ".repeat(GPU_COL),
            fit(&line, INNER_WIDTH - 1 - GPU_COL)
        )));
    }
    out.push(row(&format!(
        " {}Transport: {}",
        " ".repeat(GPU_COL),
        dev.transport_line()
    )));
    out.push(rule());
    out.push(row(" Processes:"));
    out.push(row(&format!(
        "  {}{}{}",
        fit("PID", PID_COL),
        fit("Process name", PROC_COL),
        fit_right("GPU Memory Usage", PROC_MEM_COL)
    )));
    let mut any = false;
    for s in processes(info) {
        any = true;
        let pid = s["pid"]
            .as_u64()
            .map_or_else(|| "?".into(), |p| p.to_string());
        out.push(row(&format!(
            "  {}{}{}",
            col(&pid, PID_COL),
            col(s["process"].as_str().unwrap_or("?"), PROC_COL),
            fit_right(&human(s["memory_used"].as_u64().unwrap_or(0)), PROC_MEM_COL)
        )));
    }
    if !any {
        out.push(row("  No running processes found"));
    }
    out.push(rule());
    out
}

/// The `--json` document: this VM, its device, slice, kernels, the processes that use the GPU
/// and every session open on it (vgpu-smi's own left out).
fn render_json(info: &Value, dev: &Device<'_>) -> Value {
    let processes: Vec<Value> = processes(info).cloned().collect();
    let open: Vec<Value> = sessions(info).cloned().collect();
    let mut memory =
        serde_json::json!({ "total": info["memory_total"], "used": info["memory_used"] });
    if info["memory_by_kind"].is_object() {
        memory["by_kind"] = info["memory_by_kind"].clone();
    }
    if info["memory_placement"].is_object() {
        memory["placement"] = info["memory_placement"].clone();
    }
    serde_json::json!({
        "vm": info["vm"],
        "device": { "name": dev.name, "uuid": dev.uuid, "kind": info["device_kind"] },
        "memory": memory,
        "kernels": info["kernels"],
        "utilization_gpu": info["share_1s"],
        "transport": {
            "endpoint": dev.transport,
            "kind": match dev.device {
                Some(_) => "virtio-vgpu",
                None if dev.transport.starts_with("vsock:") => "vsock",
                None => "unix",
            },
            "device_id": dev.device.map(|(id, _)| id),
        },
        "processes": processes,
        "sessions": open,
    })
}

/// Says that vgpud could not be reached, and why.
fn cannot_reach(why: &str) -> ExitCode {
    eprintln!(
        "vgpu-smi: cannot reach the virtual GPU ({why}); is vgpud serving this VM? See docs/guest.md"
    );
    ExitCode::from(EXIT_ERROR)
}

/// The nvidia-smi style queries (`-L`, `--query-*`, `-i`), answered through NVML.
fn run_query(args: &Args) -> ExitCode {
    let format = match args.format.as_deref().map(query::Format::parse).transpose() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("vgpu-smi: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    if let Err(code) = nvml::init(0) {
        return cannot_reach(&nvml::error_string(code).to_string_lossy());
    }
    let (gpu, apps) = match query::Gpu::read() {
        Ok(g) => g,
        Err(code) => {
            eprintln!(
                "vgpu-smi: query failed: {}",
                nvml::error_string(code).to_string_lossy()
            );
            return ExitCode::from(EXIT_ERROR);
        }
    };
    if args.id.as_deref().is_some_and(|id| !gpu.is(id)) {
        println!("No devices were found");
        return ExitCode::from(EXIT_NO_DEVICE);
    }
    let lines = match (&args.query_gpu, &args.query_compute_apps, format) {
        (Some(fields), _, Some(f)) => query::gpu_csv(fields, f, &gpu),
        (_, Some(fields), Some(f)) => query::apps_csv(fields, f, &gpu, &apps),
        _ if args.list_gpus => Ok(vec![query::list_line(&gpu)]),
        // `-i` naming the VM's GPU: the table.
        _ => return show(false),
    };
    match lines {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vgpu-smi: {e}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.list_gpus
        || args.query_gpu.is_some()
        || args.query_compute_apps.is_some()
        || args.id.is_some()
    {
        return run_query(&args);
    }
    show(args.json)
}

/// The table, or with `json` the JSON document.
fn show(json: bool) -> ExitCode {
    if let Err(code) = driver::connect_session() {
        return cannot_reach(vgpu_proto::cuda::result_name(code).unwrap_or("unknown error"));
    }
    let (d, info) = match driver::session().and_then(|d| Ok((d, driver::tenant_info()?))) {
        Ok(x) => x,
        Err(code) => {
            eprintln!(
                "vgpu-smi: query failed: {}",
                vgpu_proto::cuda::result_name(code).unwrap_or("?")
            );
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let info: Value = serde_json::from_str(&info).unwrap_or_default();
    let uuid = vgpu_proto::cuda::gpu_uuid_text(&d.props.uuid);
    let dev = Device {
        name: &d.props.name,
        uuid: &uuid,
        driver_version: driver::driver_version(),
        transport: &d.transport,
        device: d.device,
    };
    if json {
        let doc = render_json(&info, &dev);
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        for line in render_table(&info, &dev) {
            println!("{line}");
        }
    }
    ExitCode::SUCCESS
}

fn format_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(vm: &str, used: u64, total: u64, sessions: Value) -> Value {
        serde_json::json!({
            "vm": vm, "device_kind": "sim", "memory_total": total, "memory_used": used,
            "kernels": 7, "share_1s": 0.354, "this_session": 1, "sessions": sessions,
        })
    }

    const UUID: &str = "GPU-185b03cc-73f1-8509-b127-55540bfe430b";

    fn dev<'a>(name: &'a str) -> Device<'a> {
        Device {
            name,
            uuid: UUID,
            driver_version: 12090,
            transport: "dev:/dev/vgpu0",
            device: Some((63, 4)),
        }
    }

    fn assert_aligned(lines: &[String]) {
        for l in lines {
            assert_eq!(
                l.chars().count(),
                INNER_WIDTH + 2,
                "misaligned: {l:?}\n{}",
                lines.join("\n")
            );
            assert!(
                l.starts_with(['|', '+']) && l.ends_with(['|', '+']),
                "{l:?}"
            );
        }
    }

    #[test]
    fn memory_by_kind_shows_the_kinds_in_use() {
        let mut i = info("a", 12 << 20, 64 << 20, serde_json::json!([]));
        i["memory_by_kind"] = serde_json::json!({
            "plain": 1u64 << 20, "pool_reserved": 4u64 << 20, "pool_used": 2u64 << 20,
            "managed": 3u64 << 20, "mapped_host": 0, "vmm_physical": 4u64 << 20,
        });
        let t = render_table(&i, &dev("g"));
        assert_aligned(&t);
        assert!(
            t.iter().any(|l| l
                .contains("By kind: plain 1MiB, pools 4MiB (2MiB used), managed 3MiB, VMM 4MiB")),
            "{}",
            t.join("\n")
        );
        let j = render_json(&i, &dev("g"));
        assert_eq!(j["memory"]["by_kind"]["managed"], 3u64 << 20);
        i["memory_by_kind"]["mapped_host"] = serde_json::json!(u64::MAX);
        assert_aligned(&render_table(&i, &dev("g")));
    }

    #[test]
    fn placement_shows_device_and_host_overflow() {
        let mut i = info("a", 12 << 20, 64 << 20, serde_json::json!([]));
        i["memory_placement"] = serde_json::json!({
            "device": 8u64 << 20, "host_overflow": 4u64 << 20, "reserved": 2u64 << 20,
            "overflow": "host", "overflow_limit": 32u64 << 20,
        });
        let t = render_table(&i, &dev("g"));
        assert_aligned(&t);
        assert!(
            t.iter()
                .any(|l| l.contains("Placement: device 8MiB, host overflow 4MiB, reserved 2MiB")),
            "{}",
            t.join("\n")
        );
        let j = render_json(&i, &dev("g"));
        assert_eq!(j["memory"]["placement"]["host_overflow"], 4u64 << 20);
    }

    #[test]
    fn every_line_has_the_same_width_with_short_and_long_values() {
        let short = render_table(&info("a", 0, 1 << 20, serde_json::json!([])), &dev("g"));
        assert_aligned(&short);
        assert!(
            short
                .iter()
                .any(|l| l.contains("No running processes found"))
        );
        let sessions = serde_json::json!([
            {"session": 1, "pid": 9, "process": "vgpu-smi", "memory_used": 0},
            {"session": 2, "pid": 4_294_967_295u64, "process": "p".repeat(200), "memory_used": 3u64 << 40},
            {"session": 3, "pid": 42, "process": "w", "memory_used": 1u64 << 20},
        ]);
        let long = render_table(
            &info(&"v".repeat(300), 5u64 << 40, 8u64 << 40, sessions),
            &dev(&"n".repeat(100)),
        );
        assert_aligned(&long);
        let text = long.join("\n");
        assert!(text.contains("5242880MiB / 8388608MiB (62%)"), "{text}");
        assert!(
            !text.contains("vgpu-smi                "),
            "own session listed:\n{text}"
        );
        assert!(text.contains("  42         w"), "{text}");
        assert!(text.contains("4294967295"), "{text}");
        assert!(text.contains(UUID), "{text}");
    }

    #[test]
    fn the_uuid_column_fits_a_full_uuid_and_the_slice_format_is_stable() {
        let t = render_table(
            &info("vm1", 4 << 20, 32 << 20, serde_json::json!([])),
            &dev("vgpu Simulated GPU"),
        );
        let text = t.join("\n");
        assert!(
            text.contains("4MiB / 32MiB (12%)   GPU-Util: 35%   Kernels: 7"),
            "{text}"
        );
        assert!(
            text.contains(&format!("vgpu Simulated GPU            {UUID}")),
            "{text}"
        );
        assert!(text.contains("VM: vm1"), "{text}");
        let zero = render_table(&info("vm1", 0, 0, serde_json::json!([])), &dev("g"));
        assert!(zero.join("\n").contains("0MiB / 0MiB (0%)"));
    }

    #[test]
    fn json_leaves_out_vgpu_smis_own_session_and_processes_without_a_context() {
        let sessions = serde_json::json!([
            {"session": 1, "pid": 9, "process": "vgpu-smi", "memory_used": 0, "contexts": 0},
            {"session": 2, "pid": 10, "process": "app", "memory_used": 5, "contexts": 1},
            {"session": 3, "pid": 11, "process": "gpustat", "memory_used": 0, "contexts": 0},
        ]);
        let j = render_json(&info("vm1", 5, 10, sessions), &dev("g"));
        assert_eq!(j["vm"], "vm1");
        assert_eq!(j["memory"]["total"], 10);
        assert_eq!(j["processes"].as_array().unwrap().len(), 1);
        assert_eq!(j["processes"][0]["process"], "app");
        let open: Vec<_> = j["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| &s["process"])
            .collect();
        assert_eq!(open, ["app", "gpustat"], "every session but vgpu-smi's own");
        assert_eq!(j["device"]["uuid"], UUID);
        assert_eq!(j["transport"]["kind"], "virtio-vgpu");
        assert_eq!(j["transport"]["endpoint"], "dev:/dev/vgpu0");
        assert_eq!(j["transport"]["device_id"], 63);
    }

    #[test]
    fn the_transport_row_names_the_device() {
        let t = render_table(&info("vm1", 0, 1 << 20, serde_json::json!([])), &dev("g"));
        assert_aligned(&t);
        let text = t.join("\n");
        assert!(
            text.contains("Transport: dev:/dev/vgpu0 (virtio-vgpu device, ID 63)"),
            "{text}"
        );
        let vsock = Device {
            transport: "vsock:2:22087",
            device: None,
            ..dev("g")
        };
        assert_eq!(vsock.transport_line(), "vsock:2:22087 (virtio-vsock)");
        let j = render_json(&info("vm1", 0, 1, serde_json::json!([])), &vsock);
        assert_eq!(j["transport"]["kind"], "vsock");
        assert!(j["transport"]["device_id"].is_null());
    }
}
