//! The headline figures of each benchmark, as `vgpu-bench all` collects them: each benchmark,
//! run with `--summary`, prints one marked JSON line per figure after its report; `all` runs
//! every benchmark in a process of its own (the guest shim reads its transport once per
//! process) and prints the figures as one table of ratios.

use serde_json::{Value, json};

use crate::stats::median;

/// What starts a summary line in a benchmark's output.
pub const MARKER: &str = "vgpu-bench-summary ";
const NS_PER_US: f64 = 1e3;
const BYTES_PER_GB: f64 = 1e9;

/// One figure and the baseline measured beside it in the same run.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// The benchmark (`remoting`, `vhost`, …).
    pub bench: String,
    /// What was measured.
    pub name: String,
    /// The figure.
    pub value: f64,
    /// Its baseline.
    pub baseline: f64,
    /// What the baseline is.
    pub baseline_name: String,
    /// Unit of both (`us`, `GB/s`, `s`).
    pub unit: String,
}

impl Figure {
    fn new(bench: &str, name: &str, value: f64, baseline: f64, base: &str, unit: &str) -> Self {
        Figure {
            bench: bench.into(),
            name: name.into(),
            value,
            baseline,
            baseline_name: base.into(),
            unit: unit.into(),
        }
    }

    /// `value` / `baseline`.
    pub fn ratio(&self) -> f64 {
        self.value / self.baseline
    }

    fn to_json(&self) -> Value {
        json!({
            "bench": self.bench, "name": self.name, "value": self.value,
            "baseline": self.baseline, "baseline_name": self.baseline_name,
            "unit": self.unit, "ratio": self.ratio(),
        })
    }

    fn from_json(v: &Value) -> Option<Figure> {
        let s = |k: &str| v.get(k)?.as_str().map(str::to_string);
        let f = |k: &str| v.get(k)?.as_f64();
        Some(Figure {
            bench: s("bench")?,
            name: s("name")?,
            value: f("value")?,
            baseline: f("baseline")?,
            baseline_name: s("baseline_name")?,
            unit: s("unit")?,
        })
    }
}

/// Prints `figures` as summary lines.
pub fn emit(figures: &[Figure]) {
    for f in figures {
        println!("{MARKER}{}", f.to_json());
    }
}

/// The figures among a benchmark's output lines; the other lines are returned as they were.
pub fn parse(output: &str) -> (Vec<Figure>, String) {
    let mut figures = Vec::new();
    let mut rest = String::new();
    for line in output.lines() {
        match line.strip_prefix(MARKER).map(serde_json::from_str::<Value>) {
            Some(Ok(v)) => figures.extend(Figure::from_json(&v)),
            _ => {
                rest.push_str(line);
                rest.push('\n');
            }
        }
    }
    (figures, rest)
}

/// The figures as one table: figure, baseline, ratio.
pub fn table(figures: &[Figure]) -> String {
    let mut out = format!(
        "{:<10} {:<44} {:>12} {:>12} {:<28} {:>9}\n",
        "bench", "figure", "value", "baseline", "(baseline is)", "ratio"
    );
    for f in figures {
        out += &format!(
            "{:<10} {:<44} {:>8.3} {:<3} {:>8.3} {:<3} {:<28} {:>8.3}x\n",
            f.bench,
            f.name,
            f.value,
            f.unit,
            f.baseline,
            f.unit,
            f.baseline_name,
            f.ratio()
        );
    }
    out
}

/// All figures as one JSON array.
pub fn to_json(figures: &[Figure]) -> String {
    Value::Array(figures.iter().map(Figure::to_json).collect()).to_string()
}

/// `remoting`: the shim over a unix socket against direct calls.
pub fn remoting(direct: &crate::remoting::Figures, shim: &crate::remoting::Figures) -> Vec<Figure> {
    let f = |name, v: f64, b: f64| {
        Figure::new(
            "remoting",
            name,
            v / NS_PER_US,
            b / NS_PER_US,
            "direct call",
            "us",
        )
    };
    vec![
        f(
            "sync round trip p50 (shim, unix)",
            shim.sync_p50,
            direct.sync_p50,
        ),
        f(
            "sync round trip p99 (shim, unix)",
            shim.sync_p99,
            direct.sync_p99,
        ),
        f(
            "async memset, amortized (shim, unix)",
            shim.async_ns,
            direct.async_ns,
        ),
    ]
}

/// `vhost`: each transport against direct calls.
pub fn vhost(r: &crate::vhost::Report) -> Vec<Figure> {
    let mut out = Vec::new();
    for (path, t) in [
        ("unix", &r.unix),
        ("vsock", &r.vhost),
        ("virtio-vgpu", &r.dev),
        ("in-process hand-off", &r.handoff),
    ] {
        for (what, v, b) in [
            ("sync round trip p50", t.sync_p50, r.direct.sync_p50),
            ("sync round trip p99", t.sync_p99, r.direct.sync_p99),
            ("async memset, amortized", t.async_ns, r.direct.async_ns),
        ] {
            out.push(Figure::new(
                "vhost",
                &format!("{what} ({path})"),
                v / NS_PER_US,
                b / NS_PER_US,
                "direct call",
                "us",
            ));
        }
    }
    out
}

/// `vgpu-dev`: each device's copies against the floor (memcpy between the same guest pages and
/// host memory).
pub fn vgpu_dev(r: &crate::vgpu_dev::Results) -> Vec<Figure> {
    let mut out = Vec::new();
    for (layout, rows) in &r.tables {
        let pages = if layout.run >= 2 << 20 {
            "2 MiB pages"
        } else {
            "4 KiB pages"
        };
        for row in rows {
            let mib = row.bytes >> 20;
            for (what, v, floor) in [
                ("virtio-vgpu HtoD", row.dev_htod.rate, row.floor_htod.rate),
                ("virtio-vgpu DtoH", row.dev_dtoh.rate, row.floor_dtoh.rate),
                ("vsock HtoD", row.vsock_htod.rate, row.floor_htod.rate),
                ("vsock DtoH", row.vsock_dtoh.rate, row.floor_dtoh.rate),
            ] {
                out.push(Figure::new(
                    "vgpu-dev",
                    &format!("{what} {mib} MiB, {pages}"),
                    v / BYTES_PER_GB,
                    floor / BYTES_PER_GB,
                    "memcpy floor",
                    "GB/s",
                ));
            }
        }
    }
    out
}

/// `pinned`: copies from and to pinned, registered and pageable memory over the unix socket,
/// against the memcpy floor of the same pinned pages.
pub fn pinned(rows: &[crate::pinned::Row]) -> Vec<Figure> {
    let mut out = Vec::new();
    for r in rows {
        let mib = r.bytes >> 20;
        for (what, v, floor) in [
            ("pinned HtoD", r.pinned_htod, r.floor_htod),
            ("pinned DtoH", r.pinned_dtoh, r.floor_dtoh),
            ("registered HtoD", r.registered_htod, r.floor_htod),
            ("registered DtoH", r.registered_dtoh, r.floor_dtoh),
            ("pageable HtoD", r.pageable_htod, r.floor_htod),
            ("pageable DtoH", r.pageable_dtoh, r.floor_dtoh),
        ] {
            out.push(Figure::new(
                "pinned",
                &format!("{what} {mib} MiB, unix socket"),
                v.median / BYTES_PER_GB,
                floor.median / BYTES_PER_GB,
                "memcpy floor",
                "GB/s",
            ));
        }
    }
    out
}

/// `memcpy`: the host's copy in the simulated GPU's pieces against one `memcpy` of the size.
pub fn memcpy(rows: &[crate::memcpy::Row]) -> Vec<Figure> {
    rows.iter()
        .map(|r| {
            Figure::new(
                "memcpy",
                &format!("host copy {} MiB in pieces", r.bytes >> 20),
                r.pieces.median / BYTES_PER_GB,
                r.whole.median / BYTES_PER_GB,
                "one memcpy",
                "GB/s",
            )
        })
        .collect()
}

/// `graphs`: a graph launch against the same kernels launched one by one, per kernel.
pub fn graphs(r: &crate::graphs::Report) -> Vec<Figure> {
    let mut out = Vec::new();
    for (path, samples) in &r.paths {
        let med = |f: fn(&crate::graphs::Sample) -> f64| {
            median(&samples.iter().map(f).collect::<Vec<_>>()) / NS_PER_US
        };
        out.push(Figure::new(
            "graphs",
            &format!("submit per kernel ({path})"),
            med(|s| s.graph_submit),
            med(|s| s.launches_submit),
            "one launch per kernel",
            "us",
        ));
        out.push(Figure::new(
            "graphs",
            &format!("end to end per kernel ({path})"),
            med(|s| s.graph_total),
            med(|s| s.launches_total),
            "one launch per kernel",
            "us",
        ));
    }
    out.extend(graph_branches(r));
    for (path, runs) in &r.loops {
        if runs.is_empty() {
            continue;
        }
        let (device, _, _) = crate::stats::spread_of(runs, |l| l.device);
        let (host, _, _) = crate::stats::spread_of(runs, |l| l.host);
        out.push(Figure::new(
            "graphs",
            &format!("loop iteration on the device, a while node ({path})"),
            device / NS_PER_US,
            host / NS_PER_US,
            "driven by the host",
            "us",
        ));
    }
    out
}

/// `graphs`' fork/join case: two independent branches against the same kernels in one chain.
fn graph_branches(r: &crate::graphs::Report) -> Option<Figure> {
    if r.fork_join.is_empty() {
        return None;
    }
    let (chain, _, _) = crate::stats::spread_of(&r.fork_join, |f| f.chain);
    let (branches, _, _) = crate::stats::spread_of(&r.fork_join, |f| f.branches);
    Some(Figure::new(
        "graphs",
        "two independent branches, launch to completion",
        branches / 1e6,
        chain / 1e6,
        "the same kernels in one chain",
        "ms",
    ))
}

/// `streams`: two streams against one.
pub fn streams(runs: &[crate::streams::Figures]) -> Vec<Figure> {
    let med =
        |f: fn(&crate::streams::Figures) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    vec![
        Figure::new(
            "streams",
            "kernels on two streams",
            med(|f| f.two_streams),
            med(|f| f.serial),
            "the same on one stream",
            "s",
        ),
        Figure::new(
            "streams",
            "copy during a kernel",
            med(|f| f.copy_overlap),
            med(|f| f.copy_serial),
            "the copy after it",
            "s",
        ),
        Figure::new(
            "streams",
            "hand-offs by memory waits",
            med(|f| f.handoff_mem_ops),
            med(|f| f.handoff_events),
            "the same by events",
            "s",
        ),
        Figure::new(
            "streams",
            "hand-offs by waits sent first",
            med(|f| f.handoff_mem_ops_later),
            med(|f| f.handoff_events),
            "the same by events",
            "s",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_survive_the_summary_lines_and_other_output_is_kept() {
        let figs = vec![
            Figure::new(
                "remoting",
                "sync round trip p50 (shim, unix)",
                4.5,
                0.15,
                "direct call",
                "us",
            ),
            Figure::new(
                "vgpu-dev",
                "virtio-vgpu HtoD 16 MiB, 2 MiB pages",
                9.0,
                10.0,
                "memcpy floor",
                "GB/s",
            ),
        ];
        let mut out = String::from("remoting: a report line\n");
        for f in &figs {
            out += &format!("{MARKER}{}\n", f.to_json());
        }
        out += &format!("{MARKER}not json\n");
        let (parsed, rest) = parse(&out);
        assert_eq!(parsed, figs);
        assert_eq!(rest, format!("remoting: a report line\n{MARKER}not json\n"));
        let t = table(&parsed);
        assert!(t.contains("30.000x"), "{t}");
        assert!(t.contains("0.900x"), "{t}");
        let j: Value = serde_json::from_str(&to_json(&parsed)).unwrap();
        assert_eq!(j[1]["ratio"].as_f64(), Some(0.9));
    }
}
