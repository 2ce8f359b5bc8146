//! vgpu-smi: shows a guest its virtual GPU, its memory slice and the
//! processes using it, in the style of nvidia-smi.

use std::process::ExitCode;

use clap::Parser;
use cuda::driver;

/// Shows this VM's virtual GPU: device, memory slice (used/total) and the processes using it.
#[derive(Debug, Parser)]
#[command(name = "vgpu-smi", version)]
struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn human(bytes: u64) -> String {
    format!("{}MiB", bytes >> 20)
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(code) = driver::init(0) {
        eprintln!(
            "vgpu-smi: cannot reach the virtual GPU ({}); is vgpud serving this VM? See docs/guest.md",
            vgpu_proto::cuda::result_name(code).unwrap_or("unknown error")
        );
        return ExitCode::from(2);
    }
    let (d, info) = match driver::driver().and_then(|d| Ok((d, driver::tenant_info()?))) {
        Ok(x) => x,
        Err(code) => {
            eprintln!(
                "vgpu-smi: query failed: {}",
                vgpu_proto::cuda::result_name(code).unwrap_or("?")
            );
            return ExitCode::from(2);
        }
    };
    let v: serde_json::Value = serde_json::from_str(&info).unwrap_or_default();
    let me = v["this_session"].as_u64().unwrap_or(0);
    let uuid = uuid_string(&d.props.uuid);
    if args.json {
        let processes: Vec<_> = v["sessions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["session"].as_u64() != Some(me))
            .cloned()
            .collect();
        let out = serde_json::json!({
            "vm": v["vm"],
            "device": { "name": d.props.name, "uuid": uuid, "kind": v["device_kind"] },
            "memory": { "total": v["memory_total"], "used": v["memory_used"] },
            "kernels": v["kernels"],
            "processes": processes,
        });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    let total = v["memory_total"].as_u64().unwrap_or(0);
    let used = v["memory_used"].as_u64().unwrap_or(0);
    let line = "+-----------------------------------------------------------------------------+";
    println!("{line}");
    println!(
        "| vgpu-smi {:<20} Driver API {:<10} VM: {:<24}|",
        vgpu_proto::VERSION,
        format_version(driver::driver_version()),
        v["vm"].as_str().unwrap_or("?")
    );
    println!("{line}");
    println!("| GPU  Name                          UUID                                     |");
    println!("|   0  {:<30}{:<43}|", d.props.name, uuid);
    println!(
        "|      Memory-Usage: {:>10} / {:<10}  Kernels: {:<24}|",
        human(used),
        human(total),
        v["kernels"]
    );
    println!("{line}");
    println!("| Processes:                                                                  |");
    println!("|  PID     Process name                                  GPU Memory Usage     |");
    let mut any = false;
    for s in v["sessions"].as_array().into_iter().flatten() {
        if s["session"].as_u64() == Some(me) {
            continue;
        }
        any = true;
        println!(
            "|  {:<7} {:<45} {:>12}         |",
            s["pid"],
            s["process"].as_str().unwrap_or("?"),
            human(s["memory_used"].as_u64().unwrap_or(0))
        );
    }
    if !any {
        println!("|  No running processes found                                                 |");
    }
    println!("{line}");
    ExitCode::SUCCESS
}

fn format_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn uuid_string(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}
