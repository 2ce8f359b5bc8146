//! PTX tokenizer.

use crate::error::{LoadError, LoadErrorKind};
use crate::watch::Ticker;

/// One token, with the 1-based line it starts on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    pub kind: Tok,
    pub line: usize,
}

/// Token kinds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// Identifier, register (`%r1`), label (`$L__BB0_2`) or opcode word (`ld`).
    Ident(String),
    /// `.name`: a directive or an instruction modifier (without the dot).
    Dot(String),
    /// Integer literal (two's complement bits; a leading `-` is a separate token).
    Int(u64),
    /// `0fXXXXXXXX` single-precision literal (raw bits).
    F32(u32),
    /// `0dXXXXXXXXXXXXXXXX` or decimal floating-point literal (double bits).
    F64(u64),
    /// String literal, without quotes.
    Str(String),
    /// Punctuation: one of `{}()[],;:+-@!<>=|_`.
    Punct(char),
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b'$' || c == b'%'
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
}

fn err(line: usize, message: String) -> LoadError {
    LoadError {
        kind: LoadErrorKind::InvalidPtx,
        line,
        message,
    }
}

/// Splits PTX text into tokens, dropping comments.
#[cfg(test)]
pub(crate) fn tokenize(src: &str) -> Result<Vec<Token>, LoadError> {
    tokenize_watched(src, &mut Ticker::none())
}

/// [`tokenize`], asking `ticker` whether to go on as it goes.
pub(crate) fn tokenize_watched(
    src: &str,
    ticker: &mut Ticker<'_>,
) -> Result<Vec<Token>, LoadError> {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(src.len() / 4);
    let mut i = 0;
    let mut line = 1usize;
    while i < b.len() {
        ticker.tick(1, line)?;
        let c = b[i];
        match c {
            b'\n' => {
                line += 1;
                i += 1;
            }
            b' ' | b'\t' | b'\r' | 0x0b | 0x0c => i += 1,
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let start = line;
                i += 2;
                loop {
                    if i + 1 >= b.len() {
                        return Err(err(start, "unterminated block comment".into()));
                    }
                    if b[i] == b'*' && b[i + 1] == b'/' {
                        i += 2;
                        break;
                    }
                    if b[i] == b'\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\n' {
                        return Err(err(line, "unterminated string literal".into()));
                    }
                    i += 1;
                }
                if i >= b.len() {
                    return Err(err(line, "unterminated string literal".into()));
                }
                let s = String::from_utf8_lossy(&b[start..i]).into_owned();
                i += 1;
                out.push(Token {
                    kind: Tok::Str(s),
                    line,
                });
            }
            b'.' if b
                .get(i + 1)
                .is_some_and(|&n| is_ident_start(n) || n.is_ascii_digit()) =>
            {
                let start = i + 1;
                i += 1;
                // Modifiers like `.L2::evict_last` and `.shared::cta` contain `::`.
                while i < b.len()
                    && (is_ident_char(b[i])
                        || (b[i] == b':' && b.get(i + 1) == Some(&b':') && i + 2 < b.len()))
                {
                    if b[i] == b':' {
                        i += 2;
                    } else {
                        i += 1;
                    }
                }
                let s = String::from_utf8_lossy(&b[start..i]).into_owned();
                out.push(Token {
                    kind: Tok::Dot(s),
                    line,
                });
            }
            c if is_ident_start(c) => {
                let start = i;
                i += 1;
                while i < b.len() && is_ident_char(b[i]) {
                    i += 1;
                }
                let s = String::from_utf8_lossy(&b[start..i]).into_owned();
                if s == "_" {
                    out.push(Token {
                        kind: Tok::Punct('_'),
                        line,
                    });
                } else {
                    out.push(Token {
                        kind: Tok::Ident(s),
                        line,
                    });
                }
            }
            c if c.is_ascii_digit() => {
                let (tok, len) =
                    number(&b[i..]).ok_or_else(|| err(line, "malformed number".into()))?;
                i += len;
                out.push(Token { kind: tok, line });
            }
            b'{' | b'}' | b'(' | b')' | b'[' | b']' | b',' | b';' | b':' | b'+' | b'-' | b'@'
            | b'!' | b'<' | b'>' | b'=' | b'|' => {
                out.push(Token {
                    kind: Tok::Punct(c as char),
                    line,
                });
                i += 1;
            }
            _ => {
                return Err(err(
                    line,
                    format!(
                        "unexpected character `{}`",
                        String::from_utf8_lossy(&b[i..i + 1])
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// Parses a numeric literal at the start of `b`; returns the token and its length.
fn number(b: &[u8]) -> Option<(Tok, usize)> {
    let word_end = b
        .iter()
        .position(|&c| !(c.is_ascii_alphanumeric() || c == b'.' || c == b'_'))
        .unwrap_or(b.len());
    let mut word = &b[..word_end];
    // Exponent signs (1.5e-3) belong to the literal.
    let mut end = word_end;
    if (word.ends_with(b"e") || word.ends_with(b"E"))
        && !word.starts_with(b"0x")
        && !word.starts_with(b"0X")
        && matches!(b.get(end), Some(b'+') | Some(b'-'))
    {
        let rest = &b[end + 1..];
        let digits = rest.iter().take_while(|c| c.is_ascii_digit()).count();
        if digits > 0 {
            end += 1 + digits;
            word = &b[..end];
        }
    }
    let s = std::str::from_utf8(word).ok()?;
    let lower = s.to_ascii_lowercase();
    if let Some(hex) = lower.strip_prefix("0f")
        && hex.len() == 8
    {
        return Some((Tok::F32(u32::from_str_radix(hex, 16).ok()?), end));
    }
    if let Some(hex) = lower.strip_prefix("0d")
        && hex.len() == 16
    {
        return Some((Tok::F64(u64::from_str_radix(hex, 16).ok()?), end));
    }
    let digits = lower.strip_suffix('u').unwrap_or(&lower);
    if let Some(hex) = digits.strip_prefix("0x") {
        return Some((Tok::Int(u64::from_str_radix(hex, 16).ok()?), end));
    }
    if let Some(bin) = digits.strip_prefix("0b") {
        return Some((Tok::Int(u64::from_str_radix(bin, 2).ok()?), end));
    }
    if digits.contains('.') || digits.contains('e') {
        let v: f64 = digits.parse().ok()?;
        return Some((Tok::F64(v.to_bits()), end));
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return Some((Tok::Int(u64::from_str_radix(&digits[1..], 8).ok()?), end));
    }
    Some((Tok::Int(digits.parse().ok()?), end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(s: &str) -> Vec<Tok> {
        tokenize(s).unwrap().into_iter().map(|t| t.kind).collect()
    }

    #[test]
    fn literals_and_modifiers() {
        assert_eq!(
            kinds(
                "ld.global.L1::evict_last.v4.f32 {%f1,_}, [%rd1+-8]; // x\n0f3F800000 0d4004000000000000 0x1F 017 1.5 2e-3 7U"
            ),
            vec![
                Tok::Ident("ld".into()),
                Tok::Dot("global".into()),
                Tok::Dot("L1::evict_last".into()),
                Tok::Dot("v4".into()),
                Tok::Dot("f32".into()),
                Tok::Punct('{'),
                Tok::Ident("%f1".into()),
                Tok::Punct(','),
                Tok::Punct('_'),
                Tok::Punct('}'),
                Tok::Punct(','),
                Tok::Punct('['),
                Tok::Ident("%rd1".into()),
                Tok::Punct('+'),
                Tok::Punct('-'),
                Tok::Int(8),
                Tok::Punct(']'),
                Tok::Punct(';'),
                Tok::F32(0x3f80_0000),
                Tok::F64(0x4004_0000_0000_0000),
                Tok::Int(31),
                Tok::Int(15),
                Tok::F64(1.5f64.to_bits()),
                Tok::F64(2e-3f64.to_bits()),
                Tok::Int(7),
            ]
        );
    }

    #[test]
    fn errors_carry_lines() {
        let e = tokenize("\n\n  /* open").unwrap_err();
        assert_eq!(e.line, 3);
        let e = tokenize("a\n#b").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(tokenize("0x").is_err());
        assert!(tokenize("\"abc").is_err());
    }
}
