//! Byte sizes as the config writes them: `512B`, `64KiB`, `2GiB`, `1TiB`, or a plain number of bytes.

use std::fmt;

use thiserror::Error;

const UNITS: [(&str, u64); 5] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("B", 1),
];

/// Why a size did not parse.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SizeError {
    /// Not a number followed by a known unit.
    #[error(
        "`{0}` is not a size: write a whole number followed by B, KiB, MiB, GiB or TiB, e.g. \"2GiB\""
    )]
    Syntax(String),
    /// Larger than 2^64 - 1 bytes.
    #[error("`{0}` is too large")]
    Overflow(String),
}

/// Parses a size such as `2GiB` into bytes.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let (num, mult) = UNITS
        .iter()
        .find_map(|(u, m)| t.strip_suffix(u).map(|n| (n.trim(), *m)))
        .unwrap_or((t, 1));
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit() || b == b'_') {
        return Err(SizeError::Syntax(s.to_string()));
    }
    let n: u64 = num
        .replace('_', "")
        .parse()
        .map_err(|_| SizeError::Overflow(s.to_string()))?;
    n.checked_mul(mult)
        .ok_or_else(|| SizeError::Overflow(s.to_string()))
}

/// Formats bytes with the largest unit that divides them exactly (`2GiB`, `1536MiB`, `100B`).
pub fn format_size(bytes: u64) -> String {
    for (u, m) in UNITS {
        if bytes >= m && bytes.is_multiple_of(m) {
            return format!("{}{u}", bytes / m);
        }
    }
    format!("{bytes}B")
}

/// Bytes displayed in a human unit with one decimal (`1.5 GiB`).
#[derive(Debug, Clone, Copy)]
pub struct Human(pub u64);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (u, m) in UNITS {
            if self.0 >= m && m > 1 {
                return write!(f, "{:.1} {u}", self.0 as f64 / m as f64);
            }
        }
        write!(f, "{} B", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size(" 3 MiB "), Ok(3 << 20));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1_000"), Ok(1000));
    }

    #[test]
    fn rejects_bad_sizes_with_a_hint() {
        for bad in ["", "GiB", "2GB", "1.5GiB", "-1MiB", "two"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.to_string().contains("KiB, MiB"), "{bad}: {e}");
        }
        assert!(matches!(
            parse_size("99999999999TiB"),
            Err(SizeError::Overflow(_))
        ));
    }

    #[test]
    fn formats_round_trip() {
        for b in [1u64, 512, 1 << 20, 3 << 30, (1 << 30) + 512] {
            assert_eq!(parse_size(&format_size(b)), Ok(b));
        }
        assert_eq!(format_size(2 << 30), "2GiB");
        assert_eq!(Human(1536 << 20).to_string(), "1.5 GiB");
    }
}
