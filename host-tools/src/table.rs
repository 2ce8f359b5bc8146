//! Plain-text tables and human-readable numbers for vgpuctl's output.

use std::fmt::Write as _;

use serde_json::Value;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// A column's alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// A table printed with aligned columns.
#[derive(Debug, Default)]
pub struct Table {
    headers: Vec<(String, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns.
    pub fn new(headers: &[(&str, Align)]) -> Self {
        Self {
            headers: headers
                .iter()
                .map(|(h, a)| ((*h).to_string(), *a))
                .collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Renders the table, one line per row, without trailing spaces.
    pub fn render(&self) -> String {
        let n = self.headers.len();
        let mut width: Vec<usize> = self
            .headers
            .iter()
            .map(|(h, _)| h.chars().count())
            .collect();
        for r in &self.rows {
            for (i, c) in r.iter().take(n).enumerate() {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.headers.iter().map(|(h, _)| h.clone()).collect();
        for cells in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, (_, align)) in self.headers.iter().enumerate() {
                let c = cells.get(i).map_or("", String::as_str);
                let pad = width[i].saturating_sub(c.chars().count());
                if i > 0 {
                    line.push_str("  ");
                }
                match align {
                    Align::Left => {
                        line.push_str(c);
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                    Align::Right => {
                        line.extend(std::iter::repeat_n(' ', pad));
                        line.push_str(c);
                    }
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

/// Bytes as people read them: `512 B`, `64 KiB`, `16 MiB`, `2.5 GiB`.
pub fn bytes(b: u64) -> String {
    let unit = |d: u64, u: &str| {
        if b.is_multiple_of(d) {
            format!("{} {u}", b / d)
        } else {
            format!("{:.1} {u}", b as f64 / d as f64)
        }
    };
    match b {
        _ if b >= TIB => unit(TIB, "TiB"),
        _ if b >= GIB => unit(GIB, "GiB"),
        _ if b >= MIB => unit(MIB, "MiB"),
        _ if b >= KIB => unit(KIB, "KiB"),
        _ => format!("{b} B"),
    }
}

/// A ratio (0–1) as a percentage.
pub fn percent(r: f64) -> String {
    format!("{:.0}%", r * 100.0)
}

/// A value as text, `-` when absent (what the tables show for a value vgpud did not give).
pub fn or_dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// A JSON byte count as people read it (`-` when absent).
pub fn json_bytes(v: &Value) -> String {
    v.as_u64().map_or_else(|| "-".into(), bytes)
}

/// A JSON ratio (0–1) as a percentage (`-` when absent).
pub fn json_percent(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "-".into(), |r| format!("{:.0}%", r * 100.0))
}

/// A JSON string (`-` when absent).
pub fn json_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// A rate per second as people read it (`1.2k`, `3.4M`).
pub fn rate(r: f64) -> String {
    match r {
        _ if r >= 1e9 => format!("{:.1}G", r / 1e9),
        _ if r >= 1e6 => format!("{:.1}M", r / 1e6),
        _ if r >= 1e3 => format!("{:.1}k", r / 1e3),
        _ => format!("{r:.0}"),
    }
}

/// Bytes per second as people read them.
pub fn bandwidth(bps: f64) -> String {
    format!("{}/s", bytes(bps.max(0.0) as u64))
}

/// Seconds as `1d02h`, `3h04m`, `5m06s`, `7s`.
pub fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match () {
        _ if d > 0 => format!("{d}d{h:02}h"),
        _ if h > 0 => format!("{h}h{m:02}m"),
        _ if m > 0 => format!("{m}m{s:02}s"),
        _ => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_trim() {
        let mut t = Table::new(&[
            ("NAME", Align::Left),
            ("SIZE", Align::Right),
            ("NOTE", Align::Left),
        ]);
        t.row(vec!["a".into(), "1 MiB".into(), String::new()]);
        t.row(vec!["longer".into(), "512 B".into(), "x".into()]);
        assert_eq!(
            t.render(),
            "NAME     SIZE  NOTE\na       1 MiB\nlonger  512 B  x\n"
        );
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(bytes(16 << 20), "16 MiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
        assert_eq!(bytes(100), "100 B");
        assert_eq!(rate(1234.0), "1.2k");
        assert_eq!(duration(3725), "1h02m");
        assert_eq!(duration(7), "7s");
        assert_eq!(json_percent(&serde_json::json!(0.25)), "25%");
        assert_eq!(json_percent(&Value::Null), "-");
    }
}
