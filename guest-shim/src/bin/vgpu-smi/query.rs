//! nvidia-smi's query interface, as scripts and monitoring tools call it: `-L`,
//! `--query-gpu=FIELDS` and `--query-compute-apps=FIELDS` with `--format=csv[,noheader][,nounits]`,
//! and `-i ID`. The answers are the shim's NVML ones (the VM's GPU, slice, processes and
//! utilization); what a VM's GPU has no figure for prints `[N/A]`, as nvidia-smi does.

use cuda::nvml;

const MIB_SHIFT: u32 = 20;
/// What nvidia-smi prints for a value the GPU does not report.
pub const NOT_AVAILABLE: &str = "[N/A]";

/// `--format`: `csv`, with `noheader` and `nounits` in any order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    pub header: bool,
    pub units: bool,
}

impl Format {
    pub fn parse(s: &str) -> Result<Format, String> {
        let mut parts = s.split(',').map(str::trim);
        if parts.next() != Some("csv") {
            return Err(format!(
                "unsupported --format {s:?}: use csv, csv,noheader, csv,nounits"
            ));
        }
        let mut f = Format {
            header: true,
            units: true,
        };
        for p in parts {
            match p {
                "noheader" => f.header = false,
                "nounits" => f.units = false,
                other => return Err(format!("unknown --format option {other:?}")),
            }
        }
        Ok(f)
    }
}

/// The VM's GPU, read once per command.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    pub name: String,
    pub uuid: String,
    pub bus_id: String,
    pub pci: nvml::PciAddress,
    pub memory: nvml::Memory,
    pub utilization: u32,
    pub compute_capability: (i32, i32),
    pub sm_clock_mhz: u32,
    pub memory_clock_mhz: u32,
}

impl Gpu {
    /// Reads the GPU and the VM's processes through NVML (initialized by the caller), the
    /// VM's figures in one reading.
    pub fn read() -> nvml::NvmlRes<(Gpu, Vec<App>)> {
        let pci = nvml::pci()?;
        let usage = nvml::usage()?;
        let gpu = Gpu {
            name: nvml::name()?,
            uuid: nvml::uuid()?,
            bus_id: pci.bus_id(),
            pci,
            memory: usage.memory,
            utilization: usage.utilization,
            compute_capability: nvml::compute_capability()?,
            sm_clock_mhz: nvml::clock_mhz(nvml::clock::SM)?,
            memory_clock_mhz: nvml::clock_mhz(nvml::clock::MEM)?,
        };
        let apps = usage
            .processes
            .into_iter()
            .map(|(p, name)| App {
                pid: p.pid,
                name,
                memory: p.memory,
            })
            .collect();
        Ok((gpu, apps))
    }

    /// Whether `-i ID` names this GPU: its index (0), UUID or PCI bus id.
    pub fn is(&self, id: &str) -> bool {
        id.trim() == "0"
            || id.trim().eq_ignore_ascii_case(&self.uuid)
            || nvml::PciAddress::parse(id.trim()) == Some(self.pci)
    }
}

/// A process of the VM using the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct App {
    pub pid: u32,
    pub name: String,
    pub memory: u64,
}

/// One value of a row.
enum Value {
    Text(String),
    /// A number and its unit ("MiB", "%", "MHz").
    Quantity(u64, &'static str),
    NotAvailable,
}

impl Value {
    fn render(&self, f: Format) -> String {
        match self {
            Value::Text(t) => t.clone(),
            Value::Quantity(n, unit) if f.units => format!("{n} {unit}"),
            Value::Quantity(n, _) => n.to_string(),
            Value::NotAvailable => NOT_AVAILABLE.to_string(),
        }
    }
}

fn mib(bytes: u64) -> Value {
    Value::Quantity(bytes >> MIB_SHIFT, "MiB")
}

/// A field of `--query-gpu`: its names (the first is the header's), its unit for the header.
struct GpuField {
    names: &'static [&'static str],
    unit: Option<&'static str>,
    value: fn(&Gpu) -> Value,
}

/// The fields vgpu-smi answers, as nvidia-smi names them (`nvidia-smi --help-query-gpu`).
const GPU_FIELDS: &[GpuField] = &[
    GpuField {
        names: &["index"],
        unit: None,
        value: |_| Value::Text("0".into()),
    },
    GpuField {
        names: &["count"],
        unit: None,
        value: |_| Value::Text("1".into()),
    },
    GpuField {
        names: &["name", "gpu_name"],
        unit: None,
        value: |g| Value::Text(g.name.clone()),
    },
    GpuField {
        names: &["uuid", "gpu_uuid"],
        unit: None,
        value: |g| Value::Text(g.uuid.clone()),
    },
    GpuField {
        names: &["pci.bus_id", "gpu_bus_id"],
        unit: None,
        value: |g| Value::Text(g.bus_id.clone()),
    },
    GpuField {
        names: &["pci.domain"],
        unit: None,
        value: |g| Value::Text(format!("0x{:04X}", g.pci.domain)),
    },
    GpuField {
        names: &["pci.bus"],
        unit: None,
        value: |g| Value::Text(format!("0x{:02X}", g.pci.bus)),
    },
    GpuField {
        names: &["pci.device"],
        unit: None,
        value: |g| Value::Text(format!("0x{:02X}", g.pci.device)),
    },
    GpuField {
        names: &["driver_version"],
        unit: None,
        value: |_| Value::Text(nvml::DRIVER_VERSION.into()),
    },
    GpuField {
        names: &["memory.total"],
        unit: Some("MiB"),
        value: |g| mib(g.memory.total),
    },
    GpuField {
        names: &["memory.used"],
        unit: Some("MiB"),
        value: |g| mib(g.memory.used),
    },
    GpuField {
        names: &["memory.free"],
        unit: Some("MiB"),
        value: |g| mib(g.memory.free()),
    },
    GpuField {
        names: &["memory.reserved"],
        unit: Some("MiB"),
        value: |_| mib(0),
    },
    GpuField {
        names: &["utilization.gpu"],
        unit: Some("%"),
        value: |g| Value::Quantity(u64::from(g.utilization), "%"),
    },
    GpuField {
        names: &["utilization.memory"],
        unit: Some("%"),
        value: |_| Value::NotAvailable,
    },
    GpuField {
        names: &["compute_cap"],
        unit: None,
        value: |g| {
            Value::Text(format!(
                "{}.{}",
                g.compute_capability.0, g.compute_capability.1
            ))
        },
    },
    GpuField {
        names: &[
            "clocks.current.sm",
            "clocks.sm",
            "clocks.current.graphics",
            "clocks.gr",
        ],
        unit: Some("MHz"),
        value: |g| Value::Quantity(u64::from(g.sm_clock_mhz), "MHz"),
    },
    GpuField {
        names: &["clocks.max.sm", "clocks.max.graphics", "clocks.max.gr"],
        unit: Some("MHz"),
        value: |g| Value::Quantity(u64::from(g.sm_clock_mhz), "MHz"),
    },
    GpuField {
        names: &[
            "clocks.current.memory",
            "clocks.mem",
            "clocks.max.memory",
            "clocks.max.mem",
        ],
        unit: Some("MHz"),
        value: |g| Value::Quantity(u64::from(g.memory_clock_mhz), "MHz"),
    },
    GpuField {
        names: &["compute_mode"],
        unit: None,
        value: |_| Value::Text("Default".into()),
    },
    GpuField {
        names: &["virtualization_mode"],
        unit: None,
        value: |_| Value::Text("VGPU".into()),
    },
    // The host GPU's sensors and settings, not the VM's to see.
    GpuField {
        names: &["temperature.gpu", "temperature.memory"],
        unit: None,
        value: |_| Value::NotAvailable,
    },
    GpuField {
        names: &["power.draw", "power.limit", "enforced.power.limit"],
        unit: Some("W"),
        value: |_| Value::NotAvailable,
    },
    GpuField {
        names: &["fan.speed"],
        unit: Some("%"),
        value: |_| Value::NotAvailable,
    },
    GpuField {
        names: &[
            "pstate",
            "persistence_mode",
            "serial",
            "vbios_version",
            "mig.mode.current",
            "ecc.mode.current",
        ],
        unit: None,
        value: |_| Value::NotAvailable,
    },
];

/// A field of `--query-compute-apps`.
struct AppField {
    names: &'static [&'static str],
    unit: Option<&'static str>,
    value: fn(&Gpu, &App) -> Value,
}

const APP_FIELDS: &[AppField] = &[
    AppField {
        names: &["pid"],
        unit: None,
        value: |_, a| Value::Text(a.pid.to_string()),
    },
    AppField {
        names: &["process_name", "name"],
        unit: None,
        value: |_, a| Value::Text(a.name.clone()),
    },
    AppField {
        names: &["gpu_name"],
        unit: None,
        value: |g, _| Value::Text(g.name.clone()),
    },
    AppField {
        names: &["gpu_uuid"],
        unit: None,
        value: |g, _| Value::Text(g.uuid.clone()),
    },
    AppField {
        names: &["gpu_bus_id"],
        unit: None,
        value: |g, _| Value::Text(g.bus_id.clone()),
    },
    AppField {
        names: &["gpu_serial"],
        unit: None,
        value: |_, _| Value::NotAvailable,
    },
    AppField {
        names: &["used_gpu_memory", "used_memory"],
        unit: Some("MiB"),
        value: |_, a| mib(a.memory),
    },
];

/// Finds each of the comma-separated `fields` among `names_of`'s entries, in nvidia-smi's words
/// for a field it does not know.
fn pick<'a, T>(
    fields: &str,
    table: &'a [T],
    names_of: fn(&T) -> &'static [&'static str],
) -> Result<Vec<&'a T>, String> {
    fields
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            table
                .iter()
                .find(|t| names_of(t).contains(&f))
                .ok_or_else(|| format!("Field \"{f}\" is not a valid field to query."))
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|v| {
            if v.is_empty() {
                Err("no fields to query".to_string())
            } else {
                Ok(v)
            }
        })
}

fn header(names: &[&'static str], unit: Option<&str>) -> String {
    match unit {
        Some(u) => format!("{} [{u}]", names[0]),
        None => names[0].to_string(),
    }
}

/// `--query-gpu=FIELDS`: the CSV lines.
pub fn gpu_csv(fields: &str, f: Format, gpu: &Gpu) -> Result<Vec<String>, String> {
    let picked = pick(fields, GPU_FIELDS, |t| t.names)?;
    let mut out = Vec::new();
    if f.header {
        let h: Vec<String> = picked.iter().map(|t| header(t.names, t.unit)).collect();
        out.push(h.join(", "));
    }
    let row: Vec<String> = picked.iter().map(|t| (t.value)(gpu).render(f)).collect();
    out.push(row.join(", "));
    Ok(out)
}

/// `--query-compute-apps=FIELDS`: the CSV lines, one row per process.
pub fn apps_csv(fields: &str, f: Format, gpu: &Gpu, apps: &[App]) -> Result<Vec<String>, String> {
    let picked = pick(fields, APP_FIELDS, |t| t.names)?;
    let mut out = Vec::new();
    if f.header {
        let h: Vec<String> = picked.iter().map(|t| header(t.names, t.unit)).collect();
        out.push(h.join(", "));
    }
    for a in apps {
        let row: Vec<String> = picked.iter().map(|t| (t.value)(gpu, a).render(f)).collect();
        out.push(row.join(", "));
    }
    Ok(out)
}

/// `-L`: "GPU 0: NAME (UUID: GPU-…)".
pub fn list_line(gpu: &Gpu) -> String {
    format!("GPU 0: {} (UUID: {})", gpu.name, gpu.uuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn gpu() -> Gpu {
        let pci = nvml::PciAddress {
            domain: 0,
            bus: 0,
            device: 5,
        };
        Gpu {
            name: "vgpu Simulated GPU".into(),
            uuid: "GPU-185b03cc-73f1-8509-b127-55540bfe430b".into(),
            bus_id: pci.bus_id(),
            pci,
            memory: nvml::Memory {
                total: 64 * MIB,
                used: 8 * MIB + 5,
            },
            utilization: 37,
            compute_capability: (8, 0),
            sm_clock_mhz: 1410,
            memory_clock_mhz: 1215,
        }
    }

    #[test]
    fn formats_parse_in_any_order_and_refuse_others() {
        assert_eq!(
            Format::parse("csv"),
            Ok(Format {
                header: true,
                units: true
            })
        );
        assert_eq!(
            Format::parse("csv,nounits,noheader"),
            Ok(Format {
                header: false,
                units: false
            })
        );
        assert_eq!(
            Format::parse("csv, noheader"),
            Ok(Format {
                header: false,
                units: true
            })
        );
        assert!(Format::parse("json").is_err());
        assert!(Format::parse("csv,bold").is_err());
    }

    #[test]
    fn gpu_queries_print_nvidia_smi_csv() {
        let g = gpu();
        let f = Format::parse("csv").unwrap();
        assert_eq!(
            gpu_csv(
                "name,memory.total,memory.used,memory.free,utilization.gpu",
                f,
                &g
            )
            .unwrap(),
            [
                "name, memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%]",
                "vgpu Simulated GPU, 64 MiB, 8 MiB, 55 MiB, 37 %",
            ]
        );
        let f = Format::parse("csv,noheader,nounits").unwrap();
        assert_eq!(
            gpu_csv(
                "index, uuid,pci.bus_id,compute_cap,driver_version,clocks.sm,temperature.gpu",
                f,
                &g
            )
            .unwrap(),
            [format!(
                "0, {}, 00000000:00:05.0, 8.0, {}, 1410, [N/A]",
                g.uuid,
                nvml::DRIVER_VERSION
            )]
        );
        assert_eq!(gpu_csv("gpu_name", f, &g).unwrap(), ["vgpu Simulated GPU"]);
    }

    #[test]
    fn unknown_fields_are_refused_in_nvidia_smis_words() {
        let f = Format::parse("csv").unwrap();
        assert_eq!(
            gpu_csv("name,memory.bogus", f, &gpu()),
            Err("Field \"memory.bogus\" is not a valid field to query.".to_string())
        );
        assert!(gpu_csv(" , ", f, &gpu()).is_err());
        assert!(apps_csv("pid,color", f, &gpu(), &[]).is_err());
    }

    #[test]
    fn compute_apps_get_one_row_each() {
        let apps = [
            App {
                pid: 41,
                name: "train".into(),
                memory: 24 * MIB,
            },
            App {
                pid: 42,
                name: "serve".into(),
                memory: MIB,
            },
        ];
        let f = Format::parse("csv").unwrap();
        assert_eq!(
            apps_csv("pid,process_name,used_memory", f, &gpu(), &apps).unwrap(),
            [
                "pid, process_name, used_gpu_memory [MiB]",
                "41, train, 24 MiB",
                "42, serve, 1 MiB"
            ]
        );
        let f = Format::parse("csv,noheader").unwrap();
        assert!(apps_csv("pid", f, &gpu(), &[]).unwrap().is_empty());
    }

    #[test]
    fn ids_name_the_gpu_by_index_uuid_or_bus_id() {
        let g = gpu();
        for id in [
            "0",
            " 0 ",
            "GPU-185B03CC-73F1-8509-B127-55540BFE430B",
            "00000000:00:05.0",
            "0000:00:05.0",
        ] {
            assert!(g.is(id), "{id}");
        }
        for id in [
            "1",
            "GPU-00000000-0000-0000-0000-000000000000",
            "0000:00:06.0",
            "",
        ] {
            assert!(!g.is(id), "{id}");
        }
        assert_eq!(
            list_line(&g),
            format!("GPU 0: vgpu Simulated GPU (UUID: {})", g.uuid)
        );
    }
}
