//! Little-endian field encoding shared by every message.
//!
//! Scalars are fixed-width little-endian. Variable-length fields carry a `u32`
//! length prefix: `str` (UTF-8), `bytes` (raw) and `i32[]`/`u32[]` arrays
//! (length = number of elements).

use thiserror::Error;

/// Why a payload could not be decoded.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The payload ended inside a field.
    #[error("payload truncated: field `{field}` needs {needed} more bytes, {left} left")]
    Truncated {
        /// Field being decoded.
        field: &'static str,
        /// Bytes needed.
        needed: usize,
        /// Bytes left in the payload.
        left: usize,
    },
    /// A string field held invalid UTF-8.
    #[error("field `{0}` is not valid UTF-8")]
    BadUtf8(&'static str),
    /// Bytes were left over after the last field of a message without a tail.
    #[error("{0} unexpected trailing bytes after the last field")]
    TrailingBytes(usize),
    /// The opcode names no message.
    #[error("unknown opcode {0:#06x}")]
    UnknownOpcode(u16),
}

/// Appends encoded fields to a buffer.
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> Writer<'a> {
    /// A writer appending to `buf`.
    pub fn new(buf: &'a mut Vec<u8>) -> Self {
        Self { buf }
    }

    /// Appends raw bytes.
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
}

/// Reads encoded fields from a payload.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    /// The bytes not yet consumed.
    rest: &'a [u8],
    /// Length of the whole buffer.
    len: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`, starting at its first byte.
    pub fn new(buf: &'a [u8]) -> Self {
        Self {
            rest: buf,
            len: buf.len(),
        }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.len - self.rest.len()
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    fn truncated(&self, field: &'static str, needed: usize) -> DecodeError {
        DecodeError::Truncated {
            field,
            needed,
            left: self.remaining(),
        }
    }

    /// Takes the next `n` bytes.
    pub fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let Some((s, rest)) = self.rest.split_at_checked(n) else {
            return Err(self.truncated(field, n));
        };
        self.rest = rest;
        Ok(s)
    }

    /// Takes the next `N` bytes (one length check, as a fixed-size field wants).
    #[inline]
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let Some((a, rest)) = self.rest.split_first_chunk::<N>() else {
            return Err(self.truncated(field, N));
        };
        self.rest = rest;
        Ok(*a)
    }
}

/// A type that has a wire encoding.
pub trait Wire: Sized {
    /// The type's name in docs/protocol.md.
    const TYPE: &'static str;
    /// Appends the encoding of `self`.
    fn put(&self, w: &mut Writer<'_>);
    /// Decodes one value.
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError>;
}

macro_rules! wire_scalar {
    ($($t:ty => $name:literal),* $(,)?) => {$(
        impl Wire for $t {
            const TYPE: &'static str = $name;
            fn put(&self, w: &mut Writer<'_>) {
                w.bytes(&self.to_le_bytes());
            }
            fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
                Ok(<$t>::from_le_bytes(r.array(field)?))
            }
        }
    )*};
}

wire_scalar!(u8 => "u8", u16 => "u16", u32 => "u32", u64 => "u64", i32 => "i32", i64 => "i64", f32 => "f32", f64 => "f64");

impl Wire for [u8; 16] {
    const TYPE: &'static str = "u8[16]";
    fn put(&self, w: &mut Writer<'_>) {
        w.bytes(self);
    }
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
        r.array(field)
    }
}

fn put_len(w: &mut Writer<'_>, len: usize) {
    // Payloads are bounded by MAX_PAYLOAD (far below 4 GiB), so lengths fit.
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    len.put(w);
}

fn get_len(r: &mut Reader<'_>, field: &'static str, elem: usize) -> Result<usize, DecodeError> {
    let n = u32::get(r, field)? as usize;
    // Reject before allocating: the elements must fit in what is left.
    let bytes = n.saturating_mul(elem);
    if bytes > r.remaining() {
        return Err(DecodeError::Truncated {
            field,
            needed: bytes,
            left: r.remaining(),
        });
    }
    Ok(n)
}

impl Wire for String {
    const TYPE: &'static str = "str";
    fn put(&self, w: &mut Writer<'_>) {
        put_len(w, self.len());
        w.bytes(self.as_bytes());
    }
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
        let n = get_len(r, field, 1)?;
        let b = r.take(n, field)?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError::BadUtf8(field))
    }
}

impl Wire for Vec<u8> {
    const TYPE: &'static str = "bytes";
    fn put(&self, w: &mut Writer<'_>) {
        put_len(w, self.len());
        w.bytes(self);
    }
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
        let n = get_len(r, field, 1)?;
        Ok(r.take(n, field)?.to_vec())
    }
}

macro_rules! wire_array {
    ($($t:ty => $name:literal),* $(,)?) => {$(
        impl Wire for Vec<$t> {
            const TYPE: &'static str = $name;
            fn put(&self, w: &mut Writer<'_>) {
                put_len(w, self.len());
                for v in self {
                    v.put(w);
                }
            }
            fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
                let n = get_len(r, field, std::mem::size_of::<$t>())?;
                (0..n).map(|_| <$t>::get(r, field)).collect()
            }
        }
    )*};
}

wire_array!(i32 => "i32[]", u32 => "u32[]", u64 => "u64[]");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_round_trip_little_endian() {
        let mut buf = Vec::new();
        let mut w = Writer::new(&mut buf);
        0x0102_0304u32.put(&mut w);
        (-2i64).put(&mut w);
        1.5f32.put(&mut w);
        assert_eq!(&buf[..4], &[4, 3, 2, 1]);
        let mut r = Reader::new(&buf);
        assert_eq!(u32::get(&mut r, "a").unwrap(), 0x0102_0304);
        assert_eq!(i64::get(&mut r, "b").unwrap(), -2);
        assert_eq!(f32::get(&mut r, "c").unwrap(), 1.5);
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn strings_and_arrays_round_trip() {
        let mut buf = Vec::new();
        let mut w = Writer::new(&mut buf);
        "héllo".to_string().put(&mut w);
        vec![1i32, -1, 7].put(&mut w);
        let mut r = Reader::new(&buf);
        assert_eq!(String::get(&mut r, "s").unwrap(), "héllo");
        assert_eq!(Vec::<i32>::get(&mut r, "a").unwrap(), vec![1, -1, 7]);
    }

    #[test]
    fn huge_length_prefix_is_rejected_without_allocating() {
        let mut buf = Vec::new();
        u32::MAX.put(&mut Writer::new(&mut buf));
        let err = Vec::<u64>::get(&mut Reader::new(&buf), "arr").unwrap_err();
        assert!(matches!(err, DecodeError::Truncated { field: "arr", .. }));
        let err = String::get(&mut Reader::new(&buf), "s").unwrap_err();
        assert!(matches!(err, DecodeError::Truncated { .. }));
    }

    #[test]
    fn truncated_scalar_names_the_field() {
        let err = u64::get(&mut Reader::new(&[1, 2, 3]), "size").unwrap_err();
        assert_eq!(
            err.to_string(),
            "payload truncated: field `size` needs 8 more bytes, 3 left"
        );
    }

    #[test]
    fn invalid_utf8_is_an_error() {
        let buf = [2, 0, 0, 0, 0xff, 0xfe];
        assert_eq!(
            String::get(&mut Reader::new(&buf), "name").unwrap_err(),
            DecodeError::BadUtf8("name")
        );
    }
}
