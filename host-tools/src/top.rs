//! `vgpuctl top`: a live terminal view of devices and VMs (ratatui on
//! crossterm, so it works in any terminal and over SSH): memory bars,
//! compute share against the configured share, kernels per second and copy
//! bandwidth, refreshed every second. `q`, `Esc` or `Ctrl-C` quit and
//! restore the terminal (also after a panic). `--once` prints one frame as
//! plain text (scripts, tests, logs).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use clap::Args;
use ratatui::Frame;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use serde_json::{Value, json};

use vgpu_api as api;

use crate::api::{ApiError, Client, typed};
use crate::outcome::{CliError, print_json};
use crate::table::{bandwidth, bytes, duration, or_dash, percent, rate};

/// Width of the memory and share bars, in cells.
const BAR: usize = 10;
/// Width of the frame `--once` prints when stdout is not a terminal.
const ONCE_WIDTH: u16 = 132;
/// Lines of a frame besides one per device and VM (header, borders, table
/// headers, key line).
const FRAME_LINES: u16 = 8;
/// Memory use above which a bar turns yellow, then red.
const WARN_RATIO: f64 = 0.75;
const FULL_RATIO: f64 = 0.9;

/// Arguments of `top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Seconds between refreshes.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    pub interval: f64,
    /// Print one frame (two samples one interval apart, for the rates) and exit.
    #[arg(long)]
    pub once: bool,
    /// With --once: frame width in columns (default: the terminal's, or 132).
    #[arg(long, value_name = "COLUMNS")]
    pub width: Option<u16>,
}

/// One sample of the daemon's state.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When it was taken.
    pub at: Instant,
    /// `/v1/info`.
    pub info: api::Info,
    /// `/v1/devices`.
    pub devices: Vec<api::Device>,
    /// `/v1/vms`.
    pub vms: Vec<api::Vm>,
}

impl Snapshot {
    /// Takes a sample.
    pub fn take(c: &Client) -> Result<Snapshot, ApiError> {
        Ok(Snapshot {
            at: Instant::now(),
            info: typed(&c.get("/v1/info")?)?,
            devices: typed(&c.get("/v1/devices")?)?,
            vms: typed(&c.get("/v1/vms")?)?,
        })
    }
}

/// Rates of one VM between two samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    /// Kernels per second.
    pub kernels: f64,
    /// Bytes per second host to device.
    pub htod: f64,
    /// Bytes per second device to host.
    pub dtoh: f64,
}

/// What the view shows.
#[derive(Debug, Default)]
pub struct View {
    /// The latest sample.
    pub cur: Option<Snapshot>,
    /// The one before (for rates).
    pub prev: Option<Snapshot>,
    /// The last error talking to vgpud (shown, and retried).
    pub error: Option<String>,
}

impl View {
    /// Adds a sample.
    pub fn push(&mut self, s: Snapshot) {
        self.prev = self.cur.replace(s);
        self.error = None;
    }

    /// Rates of a VM (None before two samples of it exist).
    pub fn rates(&self, vm: &str) -> Option<Rates> {
        let (p, c) = (self.prev.as_ref()?, self.cur.as_ref()?);
        let dt = c.at.duration_since(p.at).as_secs_f64();
        if dt <= 0.0 {
            return None;
        }
        let find = |s: &Snapshot| s.vms.iter().find(|v| v.name == vm).map(|v| v.stats);
        let (a, b) = (find(p)?, find(c)?);
        let d = |x: u64, y: u64| y.saturating_sub(x) as f64 / dt;
        Some(Rates {
            kernels: d(a.kernels, b.kernels),
            htod: d(a.bytes_htod, b.bytes_htod),
            dtoh: d(a.bytes_dtoh, b.bytes_dtoh),
        })
    }
}

fn bar(ratio: f64) -> String {
    let r = ratio.clamp(0.0, 1.0);
    let filled = (r * BAR as f64).round() as usize;
    format!("{}{}", "█".repeat(filled), "░".repeat(BAR - filled))
}

fn level_color(ratio: f64) -> Color {
    match ratio {
        r if r >= FULL_RATIO => Color::Red,
        r if r >= WARN_RATIO => Color::Yellow,
        _ => Color::Green,
    }
}

fn ratio(used: u64, total: u64) -> f64 {
    if total > 0 {
        used as f64 / total as f64
    } else {
        0.0
    }
}

fn memory_cell<'a>(used: u64, total: u64) -> Cell<'a> {
    let r = ratio(used, total);
    let text = format!("{} {}/{}", bar(r), bytes(used), bytes(total));
    Cell::from(text).style(Style::default().fg(level_color(r)))
}

/// Draws the view.
pub fn draw(f: &mut Frame, view: &View) {
    let [head, devices, vms, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(view.cur.as_ref().map_or(3, |s| s.devices.len() as u16 + 3)),
        Constraint::Min(4),
        Constraint::Length(1),
    ])
    .areas(f.area());
    draw_header(f, head, view);
    if let Some(s) = &view.cur {
        draw_devices(f, devices, s);
        draw_vms(f, vms, s, view);
    }
    let keys = Line::from(vec![
        Span::styled(" q ", Style::default().add_modifier(Modifier::REVERSED)),
        Span::raw(
            " quit   share = device time used over the last second; configured = weight / sum of weights",
        ),
    ]);
    f.render_widget(Paragraph::new(keys), foot);
}

fn draw_header(f: &mut Frame, area: Rect, view: &View) {
    let line = match (&view.cur, &view.error) {
        (_, Some(e)) => Line::from(Span::styled(
            format!("vgpuctl top: {e} (retrying)"),
            Style::default().fg(Color::Red),
        )),
        (Some(s), None) => Line::from(format!(
            "vgpud {} · pid {} · up {} · {} device(s) · {} VM(s)",
            s.info.version,
            s.info.pid,
            duration(s.info.uptime_s),
            s.devices.len(),
            s.vms.len()
        )),
        (None, None) => Line::from("connecting to vgpud…"),
    };
    f.render_widget(
        Paragraph::new(line).style(Style::default().add_modifier(Modifier::BOLD)),
        area,
    );
}

fn draw_devices(f: &mut Frame, area: Rect, s: &Snapshot) {
    let rows = s.devices.iter().map(|d| {
        let sched = d.scheduling.as_ref();
        Row::new(vec![
            Cell::from(d.name.clone()),
            Cell::from(format!("{} {}", d.kind, d.model)),
            memory_cell(d.memory_used, d.memory_total),
            Cell::from(bytes(d.memory_sliced)),
            Cell::from(d.utilization.map_or("-".into(), percent)),
            Cell::from(format!(
                "{} {} ms",
                sched.map_or("-", |s| s.policy.as_str()),
                or_dash(sched.map(|s| s.slice_ms))
            )),
            Cell::from(d.vms.len().to_string()),
        ])
    });
    let header = Row::new(["DEVICE", "KIND", "MEMORY", "SLICED", "UTIL", "SCHED", "VMS"])
        .style(Style::default().add_modifier(Modifier::BOLD));
    let t = Table::new(
        rows,
        [
            Constraint::Length(10),
            Constraint::Length(24),
            Constraint::Length(30),
            Constraint::Length(9),
            Constraint::Length(5),
            Constraint::Length(12),
            Constraint::Length(4),
        ],
    )
    .header(header)
    .block(Block::default().borders(Borders::ALL).title(" Devices "));
    f.render_widget(t, area);
}

/// The weight in force; with the tuning controller's adjustment on top of
/// the baseline as `4 (3+1)`, highlighted.
fn weight_cell(v: &api::Vm) -> Cell<'static> {
    let w = v.usage.weight_now;
    match &v.tuning {
        Some(t) if t.adjust != 0 => {
            Cell::from(format!("{w} ({}{:+})", t.baseline_weight, t.adjust))
                .style(Style::default().fg(Color::Cyan))
        }
        _ => Cell::from(w.to_string()),
    }
}

fn draw_vms(f: &mut Frame, area: Rect, s: &Snapshot, view: &View) {
    let rows = s.vms.iter().map(|v| {
        let name = v.name.as_str();
        let (sh, configured) = (v.usage.share_1s, v.usage.configured_share);
        let share_cell = Cell::from(format!(
            "{} {}/{}",
            bar(sh),
            percent(sh),
            percent(configured)
        ))
        .style(Style::default().fg(if sh > configured + 0.05 {
            Color::Yellow
        } else {
            Color::Green
        }));
        let r = view.rates(name);
        let fmt = |g: fn(&Rates) -> String| r.as_ref().map_or_else(|| "-".to_string(), g);
        let state = v.state.clone();
        Row::new(vec![
            Cell::from(name.to_string()),
            Cell::from(v.device.clone()),
            memory_cell(v.memory_used, v.memory_limit),
            // Host-overflow bytes (docs/memory.md): yellow while any are overflowed.
            match v.memory_placement.as_ref().map(|p| p.host_bytes) {
                Some(h) if h > 0 => Cell::from(bytes(h)).style(Style::default().fg(Color::Yellow)),
                _ => Cell::from("-"),
            },
            share_cell,
            weight_cell(v),
            Cell::from(fmt(|r| rate(r.kernels))),
            Cell::from(fmt(|r| bandwidth(r.htod))),
            Cell::from(fmt(|r| bandwidth(r.dtoh))),
            Cell::from(v.sessions.len().to_string()),
            Cell::from(state.clone()).style(if state == "draining" {
                Style::default().fg(Color::Yellow)
            } else {
                Style::default()
            }),
        ])
    });
    let header = Row::new([
        "VM",
        "DEVICE",
        "MEMORY",
        "HOST",
        "SHARE / CONFIGURED",
        "WEIGHT",
        "KERNEL/S",
        "H→D",
        "D→H",
        "SESS",
        "STATE",
    ])
    .style(Style::default().add_modifier(Modifier::BOLD));
    let t = Table::new(
        rows,
        [
            Constraint::Length(10),
            Constraint::Length(7),
            Constraint::Length(30),
            Constraint::Length(9),
            Constraint::Length(20),
            Constraint::Length(6),
            Constraint::Length(8),
            Constraint::Length(11),
            Constraint::Length(11),
            Constraint::Length(4),
            Constraint::Length(8),
        ],
    )
    .header(header)
    .block(Block::default().borders(Borders::ALL).title(" VMs "));
    f.render_widget(t, area);
}

/// Renders one frame into text lines (trailing spaces trimmed).
pub fn render_text(view: &View, width: u16, height: u16) -> String {
    let mut term = ratatui::Terminal::new(TestBackend::new(width, height)).expect("test backend");
    let _ = term.draw(|f| draw(f, view));
    buffer_text(term.backend().buffer())
}

/// A buffer's text, one line per row, trailing spaces trimmed.
pub fn buffer_text(b: &Buffer) -> String {
    let mut out = String::new();
    for y in 0..b.area.height {
        let mut line = String::new();
        for x in 0..b.area.width {
            line.push_str(b[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn interval(a: &TopArgs) -> Result<Duration, CliError> {
    Duration::try_from_secs_f64(a.interval)
        .ok()
        .filter(|d| *d >= Duration::from_millis(100) || a.once)
        .ok_or_else(|| CliError::Failed("--interval must be at least 0.1 seconds".into()))
}

/// Runs `top`.
pub fn run(a: &TopArgs, c: &Client, json_out: bool) -> Result<(), CliError> {
    let every = interval(a)?;
    if a.once || json_out {
        let mut view = View::default();
        view.push(Snapshot::take(c)?);
        std::thread::sleep(every);
        view.push(Snapshot::take(c)?);
        if json_out {
            let s = view.cur.as_ref().expect("two samples");
            let vms: Vec<Value> = s
                .vms
                .iter()
                .map(|v| {
                    let r = view.rates(&v.name).unwrap_or_default();
                    json!({
                        "name": v.name, "device": v.device,
                        "memory_used": v.memory_used, "memory_limit": v.memory_limit,
                        "host_overflow_bytes": v.memory_placement.as_ref().map(|p| p.host_bytes),
                        "share_1s": v.usage.share_1s, "configured_share": v.usage.configured_share,
                        "kernels_per_s": r.kernels, "htod_bytes_per_s": r.htod, "dtoh_bytes_per_s": r.dtoh,
                        "sessions": v.sessions.len(), "state": v.state,
                    })
                })
                .collect();
            print_json(&json!({ "devices": s.devices, "vms": vms }));
            return Ok(());
        }
        let w = match (a.width, ratatui::crossterm::terminal::size()) {
            (Some(w), _) => w,
            (None, Ok((w, _))) if std::io::stdout().is_terminal() => w,
            _ => ONCE_WIDTH,
        };
        let rows = view
            .cur
            .as_ref()
            .map_or(0, |s| s.devices.len() + s.vms.len());
        let h = u16::try_from(rows).unwrap_or(u16::MAX - FRAME_LINES) + FRAME_LINES;
        print!("{}", render_text(&view, w, h));
        return Ok(());
    }
    if !std::io::stdout().is_terminal() {
        return Err(CliError::Failed(
            "`vgpuctl top` needs a terminal; use `vgpuctl top --once` (text) or `--json` in scripts".into(),
        ));
    }
    let mut view = View::default();
    match Snapshot::take(c) {
        Ok(s) => view.push(s),
        Err(e @ ApiError::Connect { .. }) => return Err(e.into()),
        Err(e) => view.error = Some(e.to_string()),
    }
    let mut terminal = ratatui::try_init()
        .map_err(|e| CliError::Failed(format!("cannot use the terminal: {e}")))?;
    let result = (|| -> std::io::Result<()> {
        let mut next = Instant::now() + every;
        loop {
            terminal.draw(|f| draw(f, &view))?;
            let wait = next.saturating_duration_since(Instant::now());
            if event::poll(wait)? {
                match event::read()? {
                    Event::Key(k) if k.kind == KeyEventKind::Press => {
                        let ctrl_c = k.code == KeyCode::Char('c')
                            && k.modifiers.contains(KeyModifiers::CONTROL);
                        if ctrl_c || matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) {
                            return Ok(());
                        }
                    }
                    _ => {} // a resize or another key: redraw
                }
                continue;
            }
            match Snapshot::take(c) {
                Ok(s) => view.push(s),
                Err(e) => view.error = Some(e.to_string()),
            }
            next = Instant::now() + every;
        }
    })();
    ratatui::restore();
    let _ = std::io::stdout().flush();
    result.map_err(|e| CliError::Failed(format!("terminal error: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(at: Instant, kernels: u64, htod: u64, share: f64) -> Snapshot {
        let vm = |name: &str, used: u64, limit: u64, weight: u32, state: &str, sessions: usize| {
            api::Vm {
                name: name.into(),
                device: "gpu0".into(),
                memory_used: used,
                memory_limit: limit,
                weight,
                state: state.into(),
                sessions: vec![api::Session::default(); sessions],
                usage: api::VmUsage {
                    weight_now: weight,
                    ..Default::default()
                },
                ..Default::default()
            }
        };
        let mut vm1 = vm("vm1", 1 << 30, 2 << 30, 3, "running", 2);
        vm1.usage.share_1s = share;
        vm1.usage.configured_share = 0.75;
        vm1.stats.kernels = kernels;
        vm1.stats.bytes_htod = htod;
        let mut vm2 = vm("vm2", 0, 4 << 30, 1, "draining", 0);
        vm2.usage.configured_share = 0.25;
        Snapshot {
            at,
            info: api::Info {
                version: "0.1.0".into(),
                pid: 42,
                uptime_s: 65,
                ..Default::default()
            },
            devices: vec![api::Device {
                name: "gpu0".into(),
                kind: "sim".into(),
                model: "vgpu simulated GPU".into(),
                memory_total: 8 << 30,
                memory_used: 3 << 30,
                memory_sliced: 6 << 30,
                utilization: Some(share),
                scheduling: Some(api::Scheduling {
                    policy: "fair".into(),
                    slice_ms: 2,
                    batch_min_share: 5,
                }),
                vms: vec!["vm1".into(), "vm2".into()],
                ..Default::default()
            }],
            vms: vec![vm1, vm2],
        }
    }

    #[test]
    fn a_frame_shows_bars_shares_and_rates() {
        let t0 = Instant::now();
        let mut view = View::default();
        view.push(snapshot(t0, 100, 0, 0.5));
        view.push(snapshot(t0 + Duration::from_secs(2), 300, 4 << 20, 0.5));
        let r = view.rates("vm1").unwrap();
        assert_eq!((r.kernels, r.htod), (100.0, f64::from(2u32 << 20)));
        let text = render_text(&view, 132, 16);
        assert!(
            text.contains("vgpud 0.1.0 · pid 42 · up 1m05s · 1 device(s) · 2 VM(s)"),
            "{text}"
        );
        // Memory bars: the device is 3/8 full, vm1 half full.
        assert!(text.contains("████░░░░░░ 3 GiB/8 GiB"), "{text}");
        assert!(text.contains("█████░░░░░ 1 GiB/2 GiB"), "{text}");
        // Share against the configured share, kernels/s and bandwidth.
        assert!(text.contains("█████░░░░░ 50%/75%"), "{text}");
        assert!(text.contains("100") && text.contains("2 MiB/s"), "{text}");
        assert!(text.contains("draining"), "{text}");
        assert!(text.contains(" q  quit"), "{text}");
    }

    #[test]
    fn errors_show_in_the_header_and_rates_need_two_samples() {
        let mut view = View::default();
        view.push(snapshot(Instant::now(), 1, 1, 0.0));
        assert!(view.rates("vm1").is_none());
        view.error = Some("cannot connect to vgpud".into());
        let text = render_text(&view, 132, 12);
        assert!(
            text.contains("cannot connect to vgpud (retrying)"),
            "{text}"
        );
        assert!(text.contains(" 0%/75%"), "{text}");
    }
}
