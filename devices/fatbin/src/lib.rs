//! CUDA fat binaries, parsed from untrusted bytes.
//!
//! nvcc embeds one fat binary per translation unit and registers it with the
//! runtime; a fat binary holds entries, each a PTX text or a cubin (ELF) for
//! one architecture, optionally LZ4-compressed:
//!
//! ```text
//! header   u32 magic 0xBA55ED50, u16 version 1, u16 header size, u64 size of the entries
//! entry    u16 kind (1 PTX, 2 ELF), u16 version, u32 header size, u32 payload size,
//!          u32 -, u32 compressed size, u32 -, u32 -, u32 architecture (52 = sm_52),
//!          u32 address bits, u32 -, u64 flags (0x2000 LZ4, 0x8000 zstd), u64 -,
//!          u64 uncompressed size; the payload follows the entry header
//! ```
//!
//! Everything is bounds-checked: a guest hands these bytes to vgpud, so a
//! malformed or hostile fat binary gets an error, never a panic, and
//! decompression is capped.

use std::fmt::Write as _;

pub mod archive;
pub mod cubin;
pub mod testutils;

/// Fat binary magic.
pub const MAGIC: u32 = 0xBA55_ED50;
/// The fat binary header's size.
pub const HEADER_LEN: usize = 16;
/// An entry header's fixed fields.
const ENTRY_FIELDS_LEN: usize = 64;
/// Entry kind: PTX text.
pub const KIND_PTX: u16 = 1;
/// Entry kind: cubin (ELF).
pub const KIND_ELF: u16 = 2;
/// Entry flag: the payload is LZ4-compressed (block format).
const FLAG_LZ4: u64 = 0x2000;
/// Entry flag: the payload is zstd-compressed.
pub const FLAG_ZSTD: u64 = 0x8000;
/// Most entries read from one fat binary.
pub const MAX_ENTRIES: usize = 4096;
/// Largest payload decompressed (a module's PTX; larger is refused).
pub const MAX_DECOMPRESSED: usize = 64 << 20;

/// Why a fat binary could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FatbinError {
    /// Not a fat binary, or its header is cut short.
    #[error("not a fat binary (bad magic or a header shorter than {HEADER_LEN} bytes)")]
    NotFatbin,
    /// The header declares more bytes than there are.
    #[error("the fat binary declares {declared} bytes of entries but holds {got}")]
    Truncated {
        /// Declared.
        declared: u64,
        /// Present.
        got: usize,
    },
    /// An entry header is malformed.
    #[error("entry {index} of the fat binary is malformed: {what}")]
    BadEntry {
        /// The entry's position.
        index: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// More entries than [`MAX_ENTRIES`].
    #[error("the fat binary has more than {MAX_ENTRIES} entries")]
    TooManyEntries,
    /// A compressed payload does not decompress.
    #[error("entry {index} of the fat binary does not decompress: {what}")]
    Decompress {
        /// The entry's position.
        index: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// No entry the device can run.
    #[error(
        "the fat binary holds no image this device can run (it holds {held}); the simulated GPU runs PTX: build with -gencode arch=compute_XX,code=compute_XX"
    )]
    NoUsableImage {
        /// What it holds, e.g. "sm_80 cubin, sm_86 cubin".
        held: String,
    },
}

/// How an entry's payload is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// As is.
    None,
    /// LZ4 block format.
    Lz4,
    /// zstd.
    Zstd,
}

/// One entry of a fat binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// [`KIND_PTX`], [`KIND_ELF`] or another kind.
    pub kind: u16,
    /// Architecture, e.g. 52 for sm_52 / compute_52.
    pub arch: u32,
    /// How the payload is stored.
    pub compression: Compression,
    /// The stored payload (compressed if [`Entry::compression`] says so).
    pub payload: &'a [u8],
    /// Declared size once decompressed.
    pub uncompressed_len: u64,
    /// The entry as stored: its header, payload and padding.
    raw: &'a [u8],
    index: usize,
}

impl Entry<'_> {
    /// "sm_80 cubin", "compute_52 PTX".
    pub fn describe(&self) -> String {
        match self.kind {
            KIND_PTX => format!("compute_{} PTX", self.arch),
            KIND_ELF => format!("sm_{} cubin", self.arch),
            k => format!("kind-{k} image for sm_{}", self.arch),
        }
    }

    /// A PTX entry's text, decompressed, without its trailing NUL bytes.
    pub fn ptx_text(&self) -> Result<Vec<u8>, FatbinError> {
        let mut text = self.contents()?;
        let end = text.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        text.truncate(end);
        Ok(text)
    }

    /// The payload, decompressed.
    pub fn contents(&self) -> Result<Vec<u8>, FatbinError> {
        let decompress: fn(&[u8], usize) -> Result<Vec<u8>, &'static str> = match self.compression {
            Compression::None => return Ok(self.payload.to_vec()),
            Compression::Lz4 => lz4_block,
            Compression::Zstd => zstd_frame,
        };
        let error = |what| FatbinError::Decompress {
            index: self.index,
            what,
        };
        let len = usize::try_from(self.uncompressed_len)
            .ok()
            .filter(|&l| l <= MAX_DECOMPRESSED)
            .ok_or(error("the declared size is over the limit"))?;
        decompress(self.payload, len).map_err(error)
    }
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// Whether `image` starts like a fat binary.
pub fn is_fatbin(image: &[u8]) -> bool {
    u32_at(image, 0) == Some(MAGIC)
}

/// The whole fat binary's length from its header (header plus entries).
pub fn declared_len(image: &[u8]) -> Result<u64, FatbinError> {
    if !is_fatbin(image) {
        return Err(FatbinError::NotFatbin);
    }
    let header = u16_at(image, 6).ok_or(FatbinError::NotFatbin)?;
    let body = u64_at(image, 8).ok_or(FatbinError::NotFatbin)?;
    if usize::from(header) < HEADER_LEN {
        return Err(FatbinError::NotFatbin);
    }
    Ok(u64::from(header).saturating_add(body))
}

/// The entries of a fat binary.
pub fn entries(image: &[u8]) -> Result<Vec<Entry<'_>>, FatbinError> {
    let total = declared_len(image)?;
    let header = usize::from(u16_at(image, 6).ok_or(FatbinError::NotFatbin)?);
    let body = usize::try_from(total)
        .ok()
        .and_then(|t| image.get(header..t))
        .ok_or(FatbinError::Truncated {
            declared: total,
            got: image.len(),
        })?;
    let mut out = Vec::new();
    let mut rest = body;
    while rest.len() >= ENTRY_FIELDS_LEN {
        let index = out.len();
        if index == MAX_ENTRIES {
            return Err(FatbinError::TooManyEntries);
        }
        let bad = |what| FatbinError::BadEntry { index, what };
        let field32 = |o| u32_at(rest, o).ok_or(bad("header cut short"));
        let kind = u16_at(rest, 0).ok_or(bad("header cut short"))?;
        let header_len = field32(4)? as usize;
        let payload_len = field32(8)? as usize;
        let compressed_len = field32(16)? as usize;
        let arch = field32(28)?;
        let flags = u64_at(rest, 40).ok_or(bad("header cut short"))?;
        let uncompressed_len = u64_at(rest, 56).ok_or(bad("header cut short"))?;
        if header_len < ENTRY_FIELDS_LEN {
            return Err(bad("its header is shorter than its fixed fields"));
        }
        let compression = if flags & FLAG_LZ4 != 0 {
            Compression::Lz4
        } else if flags & FLAG_ZSTD != 0 {
            Compression::Zstd
        } else {
            Compression::None
        };
        let stored = if compression == Compression::None {
            payload_len
        } else {
            compressed_len
        };
        let payload = rest
            .get(header_len..header_len.saturating_add(stored))
            .ok_or(bad("its payload runs past the end"))?;
        let next = header_len.saturating_add(payload_len.max(compressed_len));
        let raw = rest.get(..next).unwrap_or(rest);
        rest = rest.get(next..).unwrap_or(&[]);
        out.push(Entry {
            kind,
            arch,
            compression,
            payload,
            uncompressed_len,
            raw,
            index,
        });
    }
    Ok(out)
}

/// Which PTX a device runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PtxRange {
    /// PTX for its own architecture or an older one: CUDA's rule (a driver compiles PTX for
    /// the GPU it runs on, never PTX written for a newer one).
    UpTo,
    /// PTX for any architecture, as an interpreter runs whatever instructions it knows: the
    /// newest PTX not above the device's architecture or, where every PTX entry is newer, the
    /// oldest. Libraries built for the newest GPUs only (CuPy's CUB and Thrust: cubins for
    /// ten architectures and PTX for compute 10.0 alone) then run.
    Any,
}

/// The PTX entry of `all` a device of architecture `arch` runs.
fn pick_ptx<'a>(all: &[Entry<'a>], arch: u32, range: PtxRange) -> Option<Entry<'a>> {
    let ptx = all.iter().filter(|e| e.kind == KIND_PTX);
    let usable = ptx
        .clone()
        .filter(|e| e.arch <= arch)
        .max_by_key(|e| e.arch);
    match range {
        PtxRange::UpTo => usable,
        PtxRange::Any => usable.or_else(|| ptx.min_by_key(|e| e.arch)),
    }
    .copied()
}

/// The images of one fat binary a device of architecture `arch` runs: what [`select`] keeps and
/// the simulated GPU loads.
#[derive(Debug, Clone, Copy)]
pub struct Choice<'a> {
    /// The PTX of the device's [`PtxRange`].
    pub ptx: Option<Entry<'a>>,
    /// The newest cubin of the device's major architecture not above it (SASS runs on later
    /// minor versions). With [`PtxRange::Any`] only where the PTX is for a newer GPU or missing:
    /// PTX for the device makes it redundant.
    pub cubin: Option<Entry<'a>>,
}

/// The images of `all` (one fat binary's entries) a device of architecture `arch` runs.
pub fn choose<'a>(all: &[Entry<'a>], arch: u32, range: PtxRange) -> Choice<'a> {
    let ptx = pick_ptx(all, arch, range);
    let cubin = match (range, ptx) {
        (PtxRange::Any, Some(p)) if p.arch <= arch => None,
        _ => all
            .iter()
            .filter(|e| e.kind == KIND_ELF && e.arch / 10 == arch / 10 && e.arch <= arch)
            .max_by_key(|e| e.arch)
            .copied(),
    };
    Choice { ptx, cubin }
}

/// [`FatbinError::NoUsableImage`] for a fat binary of entries `all`, naming what it holds.
pub fn no_usable_image(all: &[Entry<'_>]) -> FatbinError {
    FatbinError::NoUsableImage { held: held(all) }
}

/// The PTX text a device supporting up to `max_arch` should run: the entry
/// of the highest architecture not above it, decompressed, without its
/// trailing NUL bytes.
pub fn ptx_for(image: &[u8], max_arch: u32) -> Result<Vec<u8>, FatbinError> {
    ptx_in(image, max_arch, PtxRange::UpTo)
}

/// The PTX text of `range` ([`PtxRange`]) a device of architecture `arch` runs, decompressed,
/// without its trailing NUL bytes; [`FatbinError::NoUsableImage`] without one.
pub fn ptx_in(image: &[u8], arch: u32, range: PtxRange) -> Result<Vec<u8>, FatbinError> {
    let all = entries(image)?;
    match pick_ptx(&all, arch, range) {
        Some(e) => e.ptx_text(),
        None => Err(no_usable_image(&all)),
    }
}

/// The PTX a linker takes from a library's fat binary: the entry of the highest architecture not
/// above `max_arch`, or, where every PTX entry is newer, the oldest (the linker takes from it
/// only what a module calls, which the device then compiles); `None` without PTX entries.
/// Decompressed, without trailing NUL bytes.
pub fn library_ptx(image: &[u8], max_arch: u32) -> Result<Option<Vec<u8>>, FatbinError> {
    let all = entries(image)?;
    pick_ptx(&all, max_arch, PtxRange::Any)
        .map(|e| e.ptx_text())
        .transpose()
}

/// What a fat binary holds, for messages: "sm_80 cubin, compute_52 PTX".
fn held(all: &[Entry<'_>]) -> String {
    let mut held = String::new();
    for (i, e) in all.iter().enumerate() {
        let _ = write!(held, "{}{}", if i > 0 { ", " } else { "" }, e.describe());
    }
    if held.is_empty() {
        held.push_str("no entries");
    }
    held
}

/// Keeps, of each fat binary in `image` (one, or several laid end to end as
/// nvcc lays out `.nv_fatbin`), the entries a device of architecture `arch`
/// (80 for compute capability 8.0) can run: the newest cubin of the same major
/// version not above `arch` (SASS runs on later minor versions) and the PTX of
/// `range` ([`PtxRange`]). With [`PtxRange::Any`] (an interpreter) a fat binary
/// with PTX for `arch` or older keeps that PTX alone (the cubin would only
/// declare the kernels the PTX defines); with PTX for newer GPUs only, it keeps
/// the cubin too, which the interpreter declares where that PTX does not load.
/// Entries are copied as stored (compressed or not).
///
/// A library built for ten architectures shrinks to one or two images, which
/// is what the guest sends to vgpud. Fat binaries with nothing usable are
/// dropped; when none has anything, the error lists what they hold.
pub fn select(image: &[u8], arch: u32, range: PtxRange) -> Result<Vec<u8>, FatbinError> {
    let mut out = Vec::new();
    let mut all_held = Vec::new();
    let mut rest = image;
    while is_fatbin(rest) {
        let len = usize::try_from(declared_len(rest)?).map_err(|_| FatbinError::NotFatbin)?;
        let one = rest.get(..len).ok_or(FatbinError::Truncated {
            declared: len as u64,
            got: rest.len(),
        })?;
        let header = usize::from(u16_at(one, 6).ok_or(FatbinError::NotFatbin)?);
        let all = entries(one)?;
        let Choice { ptx, cubin } = choose(&all, arch, range);
        let kept: Vec<Entry<'_>> = cubin.into_iter().chain(ptx).collect();
        if !kept.is_empty() {
            let body: usize = kept.iter().map(|e| e.raw.len()).sum();
            out.extend_from_slice(&one[..header]);
            let at = out.len() - header;
            out[at + 8..at + 16].copy_from_slice(&(body as u64).to_le_bytes());
            for e in &kept {
                out.extend_from_slice(e.raw);
            }
        }
        all_held.extend(all);
        rest = &rest[len..];
        // Fat binaries in `.nv_fatbin` are 8-byte aligned: skip the padding.
        while let [0, tail @ ..] = rest {
            rest = tail;
        }
    }
    if out.is_empty() {
        return Err(FatbinError::NoUsableImage {
            held: held(&all_held),
        });
    }
    Ok(out)
}

/// An entry for [`write`].
#[derive(Debug, Clone, Copy)]
pub struct NewEntry<'a> {
    /// [`KIND_PTX`] or [`KIND_ELF`].
    pub kind: u16,
    /// Architecture, e.g. 52.
    pub arch: u32,
    /// Entry flags (0, or the LZ4 flag 0x2000 with a compressed payload).
    pub flags: u64,
    /// The stored payload.
    pub payload: &'a [u8],
    /// The size once decompressed (with a compressed payload).
    pub uncompressed_len: u64,
}

/// Entry header size [`write`] uses (nvcc's is 64 or 72).
const WRITTEN_ENTRY_HEADER: usize = 72;
/// The entry header version nvcc writes.
const ENTRY_VERSION: u16 = 0x0101;
/// Address bits written for 64-bit entries.
const ADDRESS_BITS: u32 = 64;
/// Payloads are padded to this alignment.
const PAYLOAD_ALIGN: usize = 8;

/// Writes a fat binary in nvcc's layout (for tests and tools that package PTX).
pub fn write(entries: &[NewEntry<'_>]) -> Vec<u8> {
    let mut body = Vec::new();
    for e in entries {
        let mut h = [0u8; WRITTEN_ENTRY_HEADER];
        let padded = e.payload.len().div_ceil(PAYLOAD_ALIGN) * PAYLOAD_ALIGN;
        h[0..2].copy_from_slice(&e.kind.to_le_bytes());
        h[2..4].copy_from_slice(&ENTRY_VERSION.to_le_bytes());
        h[4..8].copy_from_slice(&(WRITTEN_ENTRY_HEADER as u32).to_le_bytes());
        h[8..12].copy_from_slice(&(padded as u32).to_le_bytes());
        if e.flags & (FLAG_LZ4 | FLAG_ZSTD) != 0 {
            h[16..20].copy_from_slice(&(e.payload.len() as u32).to_le_bytes());
        }
        h[28..32].copy_from_slice(&e.arch.to_le_bytes());
        h[32..36].copy_from_slice(&ADDRESS_BITS.to_le_bytes());
        h[40..48].copy_from_slice(&e.flags.to_le_bytes());
        h[56..64].copy_from_slice(&e.uncompressed_len.to_le_bytes());
        body.extend_from_slice(&h);
        body.extend_from_slice(e.payload);
        body.resize(body.len() + padded - e.payload.len(), 0);
    }
    let mut f = Vec::with_capacity(HEADER_LEN + body.len());
    f.extend_from_slice(&MAGIC.to_le_bytes());
    f.extend_from_slice(&1u16.to_le_bytes());
    f.extend_from_slice(&(HEADER_LEN as u16).to_le_bytes());
    f.extend_from_slice(&(body.len() as u64).to_le_bytes());
    f.extend_from_slice(&body);
    f
}

/// Decompresses an LZ4 block (no frame) into exactly `len` bytes at most.
/// `0xFD2FB528`: a zstd frame's magic number, little-endian.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The window a zstd frame asks its decoder to keep (RFC 8878, 3.1.1.1), read before any
/// decoder allocates it: `None` for a header that is not a frame's.
fn zstd_window(input: &[u8]) -> Option<u64> {
    const SINGLE_SEGMENT: u8 = 1 << 5;
    const WINDOW_LOG_MIN: u32 = 10;
    if input.get(..4)? != ZSTD_MAGIC {
        return None;
    }
    let descriptor = *input.get(4)?;
    if descriptor & SINGLE_SEGMENT == 0 {
        // The window descriptor: exponent and eighths.
        let w = *input.get(5)?;
        let base = 1u64 << (WINDOW_LOG_MIN + u32::from(w >> 3));
        return Some(base + base / 8 * u64::from(w & 7));
    }
    // A single segment: the window is the content, whose size field follows (no window
    // descriptor; a dictionary ID may come first).
    let dict_id_len = [0, 1, 2, 4][usize::from(descriptor & 3)];
    let at = 5 + dict_id_len;
    let field = |n: usize| -> Option<u64> {
        let b = input.get(at..at + n)?;
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(b);
        Some(u64::from_le_bytes(v))
    };
    match descriptor >> 6 {
        0 => field(1),
        1 => field(2).map(|v| v + 256),
        2 => field(4),
        _ => field(8),
    }
}

/// Decompresses one zstd frame of at most `len` bytes (CUDA 12.8's `--compress-mode=size`,
/// what CUDA 13's libraries ship). The frame's window must fit [`MAX_DECOMPRESSED`]: a hostile
/// one cannot make vgpud allocate more.
fn zstd_frame(input: &[u8], len: usize) -> Result<Vec<u8>, &'static str> {
    use std::io::Read;
    let window = zstd_window(input).ok_or("the payload is not a zstd frame")?;
    if window > MAX_DECOMPRESSED as u64 {
        return Err("its window is over the limit");
    }
    let mut source = input;
    let decoder = ruzstd::decoding::StreamingDecoder::new(&mut source)
        .map_err(|_| "its frame header is invalid")?;
    // Room for one byte past the declared size, which says the frame is larger, so that reading
    // it does not double the buffer.
    let mut out = Vec::with_capacity(len + 1);
    decoder
        .take(len as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|_| "the frame is corrupt")?;
    if out.len() > len {
        return Err("the output is larger than declared");
    }
    Ok(out)
}

fn lz4_block(input: &[u8], len: usize) -> Result<Vec<u8>, &'static str> {
    const MIN_MATCH: usize = 4;
    const MORE: u8 = 15;
    let mut out = Vec::with_capacity(len);
    let mut i = 0;
    let byte = |i: &mut usize| -> Result<u8, &'static str> {
        let b = *input.get(*i).ok_or("the block ends inside a sequence")?;
        *i += 1;
        Ok(b)
    };
    let extended = |i: &mut usize, mut n: usize| -> Result<usize, &'static str> {
        loop {
            let b = byte(i)?;
            n = n.checked_add(usize::from(b)).ok_or("a length overflows")?;
            if b != u8::MAX {
                return Ok(n);
            }
        }
    };
    while i < input.len() {
        let token = byte(&mut i)?;
        let mut literals = usize::from(token >> 4);
        if literals == usize::from(MORE) {
            literals = extended(&mut i, literals)?;
        }
        let lit = input
            .get(i..i.saturating_add(literals))
            .ok_or("literals run past the block")?;
        if out.len() + literals > len {
            return Err("the output is larger than declared");
        }
        out.extend_from_slice(lit);
        i += literals;
        if i == input.len() {
            break;
        }
        let offset = usize::from(u16::from_le_bytes([byte(&mut i)?, byte(&mut i)?]));
        if offset == 0 || offset > out.len() {
            return Err("a match refers before the start of the output");
        }
        let mut matched = usize::from(token & MORE);
        if matched == usize::from(MORE) {
            matched = extended(&mut i, matched)?;
        }
        matched += MIN_MATCH;
        if out.len() + matched > len {
            return Err("the output is larger than declared");
        }
        let start = out.len() - offset;
        for k in 0..matched {
            let b = out[start + k];
            out.push(b);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the entries of `image` are ("sm_80 cubin", "compute_52 PTX").
    fn describe(image: &[u8]) -> Vec<String> {
        entries(image)
            .unwrap()
            .iter()
            .map(Entry::describe)
            .collect()
    }

    fn fatbin(entries: &[(u16, u32, u64, &[u8], u64)]) -> Vec<u8> {
        let e: Vec<_> = entries
            .iter()
            .map(|&(kind, arch, flags, payload, uncompressed_len)| NewEntry {
                kind,
                arch,
                flags,
                payload,
                uncompressed_len,
            })
            .collect();
        write(&e)
    }

    #[test]
    fn select_keeps_the_newest_usable_cubin_and_ptx_of_each_fat_binary() {
        let a = fatbin(&[
            (KIND_ELF, 50, 0, b"\x7fELF-50", 0),
            (KIND_ELF, 75, 0, b"\x7fELF-75", 0),
            (KIND_ELF, 80, 0, b"\x7fELF-80", 0),
            (KIND_ELF, 86, 0, b"\x7fELF-86", 0),
            (KIND_ELF, 90, 0, b"\x7fELF-90", 0),
            (KIND_PTX, 52, 0, b"// 52\0", 0),
            (KIND_PTX, 90, 0, b"// 90\0", 0),
        ]);
        let b = fatbin(&[(KIND_ELF, 90, 0, b"\x7fELF-90", 0)]);
        let c = fatbin(&[(KIND_PTX, 70, 0, b"// 70\0", 0)]);
        let mut image = a.clone();
        image.extend_from_slice(&b);
        image.extend_from_slice(&[0; 8]);
        image.extend_from_slice(&c);

        // Compute capability 8.6: the sm_86 cubin and the compute_52 PTX of
        // `a`, nothing of `b`, the PTX of `c`.
        let kept = select(&image, 86, PtxRange::UpTo).unwrap();
        let first = entries(&kept).unwrap();
        assert_eq!(describe(&kept), ["sm_86 cubin", "compute_52 PTX"]);
        assert!(first[0].payload.starts_with(b"\x7fELF-86"));
        let len = declared_len(&kept).unwrap() as usize;
        assert_eq!(ptx_for(&kept[len..], 86).unwrap(), b"// 70");
        assert_eq!(
            kept.len(),
            len + declared_len(&kept[len..]).unwrap() as usize
        );

        // 8.0 takes sm_80 (sm_75 is another major, sm_86 too new).
        let kept = select(&a, 80, PtxRange::UpTo).unwrap();
        assert!(
            entries(&kept).unwrap()[0]
                .payload
                .starts_with(b"\x7fELF-80")
        );
        // 8.9 runs sm_86 SASS; 7.0 has no cubin of its major, only the PTX.
        let kept = select(&a, 89, PtxRange::UpTo).unwrap();
        assert!(
            entries(&kept).unwrap()[0]
                .payload
                .starts_with(b"\x7fELF-86")
        );
        let kept = select(&a, 70, PtxRange::UpTo).unwrap();
        assert_eq!(entries(&kept).unwrap().len(), 1);
    }

    #[test]
    fn an_interpreter_keeps_ptx_alone_and_takes_the_oldest_newer_ptx_when_none_is_older() {
        // CuPy's CUB and Thrust: cubins for many architectures, PTX for compute 10.0 only.
        let newest_only = fatbin(&[
            (KIND_ELF, 80, 0, b"\x7fELF-80", 0),
            (KIND_ELF, 90, 0, b"\x7fELF-90", 0),
            (KIND_PTX, 120, 0, b"// 120\0", 0),
            (KIND_PTX, 100, 0, b"// 100\0", 0),
        ]);
        let kept = select(&newest_only, 80, PtxRange::Any).unwrap();
        // The cubin too: declared where the newer PTX does not load.
        assert_eq!(describe(&kept), ["sm_80 cubin", "compute_100 PTX"]);
        // With PTX for this device, that PTX alone.
        let with_older = fatbin(&[
            (KIND_ELF, 80, 0, b"\x7fELF-80", 0),
            (KIND_PTX, 70, 0, b"// 70\0", 0),
            (KIND_PTX, 100, 0, b"// 100\0", 0),
        ]);
        let kept = select(&with_older, 80, PtxRange::Any).unwrap();
        assert_eq!(describe(&kept), ["compute_70 PTX"]);
        assert_eq!(ptx_in(&newest_only, 80, PtxRange::Any).unwrap(), b"// 100");
        // CUDA's rule keeps the cubin, and no PTX is for this device.
        let kept = select(&newest_only, 80, PtxRange::UpTo).unwrap();
        assert_eq!(describe(&kept), ["sm_80 cubin"]);
        assert!(matches!(
            ptx_in(&newest_only, 80, PtxRange::UpTo),
            Err(FatbinError::NoUsableImage { .. })
        ));
        // PTX not above the device's architecture still wins over newer PTX.
        let both = fatbin(&[
            (KIND_PTX, 52, 0, b"// 52\0", 0),
            (KIND_PTX, 90, 0, b"// 90\0", 0),
        ]);
        assert_eq!(ptx_in(&both, 80, PtxRange::Any).unwrap(), b"// 52");
        // Cubins alone: the interpreter keeps the cubin too (it declares the kernels).
        let sass = fatbin(&[(KIND_ELF, 80, 0, b"\x7fELF-80", 0)]);
        assert_eq!(select(&sass, 80, PtxRange::Any).unwrap(), sass);
    }

    #[test]
    fn select_names_what_a_fat_binary_holds_when_nothing_runs() {
        let b = fatbin(&[
            (KIND_ELF, 90, 0, b"\x7fELF-90", 0),
            (KIND_PTX, 90, 0, b"// 90\0", 0),
        ]);
        let e = select(&b, 80, PtxRange::UpTo).unwrap_err();
        assert_eq!(
            e,
            FatbinError::NoUsableImage {
                held: "sm_90 cubin, compute_90 PTX".into()
            }
        );
        assert_eq!(
            select(b"not a fat binary", 80, PtxRange::UpTo).unwrap_err(),
            FatbinError::NoUsableImage {
                held: "no entries".into()
            }
        );
    }

    #[test]
    fn the_best_ptx_not_above_the_device_is_chosen() {
        let f = fatbin(&[
            (KIND_ELF, 80, 0, b"\x7fELF....", 0),
            (KIND_PTX, 52, 0, b".version 7.0\n// 52\0", 0),
            (KIND_PTX, 70, 0, b".version 7.0\n// 70\0", 0),
            (KIND_PTX, 90, 0, b".version 8.0\n// 90\0", 0),
        ]);
        assert_eq!(entries(&f).unwrap().len(), 4);
        assert_eq!(ptx_for(&f, 80).unwrap(), b".version 7.0\n// 70");
        assert_eq!(ptx_for(&f, 90).unwrap(), b".version 8.0\n// 90");
        assert_eq!(declared_len(&f).unwrap(), f.len() as u64);
    }

    #[test]
    fn a_fatbin_of_cubins_only_names_what_it_holds() {
        let f = fatbin(&[
            (KIND_ELF, 80, 0, b"\x7fELF", 0),
            (KIND_ELF, 86, 0, b"\x7fELF", 0),
        ]);
        let e = ptx_for(&f, 90).unwrap_err();
        assert_eq!(
            e,
            FatbinError::NoUsableImage {
                held: "sm_80 cubin, sm_86 cubin".into()
            }
        );
        assert!(e.to_string().contains("code=compute_XX"));
    }

    #[test]
    fn lz4_payloads_are_decompressed() {
        // "abc" as literals, then a 9-byte overlapping match at offset 3,
        // then 16 literals (extended literal length) and a 20-byte match.
        let mut block = vec![0x35, b'a', b'b', b'c', 3, 0];
        block.push(0xF0);
        block.push(1);
        block.extend_from_slice(b"0123456789ABCDEF");
        block[6] = 0xF0 | 15;
        block.extend_from_slice(&[16, 0, 1]); // offset 16, match 15 + 1 + 4 = 20
        let mut want = b"abcabcabcabc0123456789ABCDEF".to_vec();
        want.extend_from_slice(b"0123456789ABCDEF0123");
        assert_eq!(lz4_block(&block, want.len()).unwrap(), want);
        let f = fatbin(&[(KIND_PTX, 52, FLAG_LZ4, &block, want.len() as u64)]);
        assert_eq!(ptx_for(&f, 90).unwrap(), want);
    }

    #[test]
    fn hostile_input_gets_errors_not_panics() {
        assert_eq!(entries(b"short").unwrap_err(), FatbinError::NotFatbin);
        let good = fatbin(&[(KIND_PTX, 52, 0, b"x", 0)]);
        let cut = &good[..good.len() - 3];
        assert!(matches!(
            entries(cut).unwrap_err(),
            FatbinError::Truncated { .. }
        ));
        // Every truncation and every single-byte corruption of the header fields.
        for n in 0..good.len() {
            let _ = ptx_for(&good[..n], 90);
            for v in [0u8, 0x7f, 0xff] {
                let mut bad = good.clone();
                bad[n] = v;
                let _ = ptx_for(&bad, 90);
            }
        }
        // Decompression: offsets before the start, overlong output, cut sequences.
        assert!(lz4_block(&[0x10, b'a', 5, 0], 100).is_err());
        assert!(lz4_block(&[0x10, b'a', 1, 0], 3).is_err());
        assert!(lz4_block(&[0xF0, 255, 255], 100).is_err());
        assert!(lz4_block(&[0x50, b'a'], 100).is_err());
        let huge = fatbin(&[(KIND_PTX, 52, FLAG_LZ4, &[0x10, b'a'], u64::MAX)]);
        assert!(matches!(
            ptx_for(&huge, 90).unwrap_err(),
            FatbinError::Decompress { .. }
        ));
        let zstd = fatbin(&[(KIND_PTX, 52, FLAG_ZSTD, b"zz", 2)]);
        assert!(matches!(
            ptx_for(&zstd, 90).unwrap_err(),
            FatbinError::Decompress { index: 0, .. }
        ));
    }

    /// A zstd frame of `data`, as CUDA 12.8's `--compress-mode=size` stores an entry.
    fn zstd(data: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
    }

    #[test]
    fn zstd_payloads_are_decompressed() {
        let ptx = ".version 8.0\n.target sm_80\n// ".repeat(50);
        let f = fatbin(&[(
            KIND_PTX,
            80,
            FLAG_ZSTD,
            &zstd(ptx.as_bytes()),
            ptx.len() as u64,
        )]);
        assert_eq!(ptx_for(&f, 90).unwrap(), ptx.as_bytes());
        // The entry is kept as stored (compressed) for a device that reads it itself.
        assert_eq!(select(&f, 80, PtxRange::UpTo).unwrap(), f);
    }

    #[test]
    fn hostile_zstd_frames_get_errors() {
        let ptx = b".version 8.0\n".repeat(100);
        let good = zstd(&ptx);
        let entry = |payload: &[u8], len: u64| fatbin(&[(KIND_PTX, 80, FLAG_ZSTD, payload, len)]);
        let decompress_error = |f: Vec<u8>| {
            assert!(
                matches!(ptx_for(&f, 90).unwrap_err(), FatbinError::Decompress { .. }),
                "{f:x?}"
            );
        };
        // Declared smaller than it is; truncated; a bit flipped in every position.
        decompress_error(entry(&good, ptx.len() as u64 - 1));
        decompress_error(entry(&good[..good.len() / 2], ptx.len() as u64));
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x5a;
            let _ = ptx_for(&entry(&bad, ptx.len() as u64), 90);
        }
        // A window of 2 GiB (exponent 21) is refused before anything is allocated.
        let mut huge_window = ZSTD_MAGIC.to_vec();
        huge_window.extend_from_slice(&[0x00, 21 << 3, 0, 0, 0]);
        assert_eq!(zstd_window(&huge_window), Some(1 << 31));
        decompress_error(entry(&huge_window, 100));
        // A single segment of 4 GiB content.
        let mut huge_content = ZSTD_MAGIC.to_vec();
        huge_content.extend_from_slice(&[0x20 | 0x80, 0, 0, 0, 1]);
        assert_eq!(zstd_window(&huge_content), Some(1 << 24));
        let mut huge_content = ZSTD_MAGIC.to_vec();
        huge_content.extend_from_slice(&[0x20 | 0xc0, 0, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(zstd_window(&huge_content), Some(1 << 32));
        decompress_error(entry(&huge_content, 100));
        decompress_error(entry(b"not zstd at all", 100));
    }
}
