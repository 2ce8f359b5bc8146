//! Module images as a guest sends them: PTX text, a cubin (ELF) or a fat
//! binary. [`prepare`] checks that an image is complete before the driver
//! sees it (the driver trusts the sizes inside a binary), and reads what the
//! broker needs from it: kernels with their parameter layouts, and module
//! variables. Cubins are read through their ELF symbol table and the
//! `.nv.info.<kernel>` attribute sections NVCC and NVRTC write.

use crate::ptx;

/// ELF magic.
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
/// Fat binary magic (0xBA55ED50, little-endian).
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Bytes of a fat binary header: magic, version, header size, payload size.
const FATBIN_HEADER: usize = 16;
/// Zero bytes appended to every image copy, so that a driver reading a
/// little past a declared end reads zeros, never daemon memory.
pub const GUARD_BYTES: usize = 4096;

/// `EI_CLASS` of 64-bit ELF.
const ELFCLASS64: u8 = 2;
/// `EI_DATA` of little-endian ELF.
const ELFDATA2LSB: u8 = 1;
/// Size of an ELF64 header.
const EHDR64: usize = 64;
/// Size of an ELF64 section header.
const SHDR64: usize = 64;
/// Size of an ELF64 symbol.
const SYM64: usize = 24;
/// `SHT_SYMTAB`.
const SHT_SYMTAB: u32 = 2;
/// `SHT_NOBITS` (no file content).
const SHT_NOBITS: u32 = 8;
/// `STT_OBJECT`.
const STT_OBJECT: u8 = 1;
/// `STT_FUNC`.
const STT_FUNC: u8 = 2;
/// `STO_CUDA_ENTRY` in `st_other`: the function is a kernel.
const STO_CUDA_ENTRY: u8 = 0x10;
/// `EIFMT_SVAL`: the record carries a 16-bit size and that many bytes.
const EIFMT_SVAL: u8 = 0x04;
/// `EIATTR_KPARAM_INFO`: one kernel parameter.
const EIATTR_KPARAM_INFO: u8 = 0x17;
/// Bytes of a `EIATTR_KPARAM_INFO` payload.
const KPARAM_INFO_BYTES: usize = 12;

/// What kind of image it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// PTX text.
    Ptx,
    /// A cubin.
    Elf,
    /// A fat binary (cubins and PTX for several architectures).
    Fatbin,
}

/// An image ready for `cuModuleLoadDataEx`.
#[derive(Debug)]
pub struct Prepared {
    /// Its kind.
    pub kind: Kind,
    /// The bytes to pass: the image (NUL-terminated when PTX) followed by
    /// [`GUARD_BYTES`] zero bytes.
    pub bytes: Vec<u8>,
    /// What the image declares, as far as it can be read here.
    pub decls: ptx::Declarations,
}

/// Why an image was refused before the driver saw it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// A binary whose headers point past its end.
    #[error("the {what} image is truncated: it declares {declared} bytes, {got} were sent")]
    Truncated {
        /// `ELF` or `fat binary`.
        what: &'static str,
        /// Bytes its headers need.
        declared: u64,
        /// Bytes received.
        got: u64,
    },
    /// A binary whose headers make no sense.
    #[error("the {what} image is malformed: {why}")]
    Malformed {
        /// `ELF` or `fat binary`.
        what: &'static str,
        /// What is wrong.
        why: &'static str,
    },
    /// Neither PTX text nor a known binary.
    #[error("the module image is neither PTX text nor a cubin or fat binary")]
    Unknown,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A section header (the fields used here).
#[derive(Debug, Clone, Copy)]
struct Section {
    name: u32,
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
}

/// A parsed ELF64 little-endian image.
#[derive(Debug)]
pub struct Elf<'a> {
    data: &'a [u8],
    sections: Vec<Section>,
    shstrndx: usize,
}

/// A symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    /// Name.
    pub name: String,
    /// `STT_*`.
    pub kind: u8,
    /// `STB_*`.
    pub bind: u8,
    /// `st_other`.
    pub other: u8,
    /// Name of its section.
    pub section: String,
    /// Size.
    pub size: u64,
}

const ELF: &str = "ELF";

fn malformed(why: &'static str) -> ImageError {
    ImageError::Malformed { what: ELF, why }
}

impl<'a> Elf<'a> {
    /// Parses the headers, checking that every section lies inside `data`.
    pub fn parse(data: &'a [u8]) -> Result<Elf<'a>, ImageError> {
        if data.len() < EHDR64 || &data[..4] != ELF_MAGIC {
            return Err(malformed("no ELF header"));
        }
        if data[4] != ELFCLASS64 || data[5] != ELFDATA2LSB {
            return Err(malformed("not a 64-bit little-endian ELF"));
        }
        let short = || malformed("short header");
        let phoff = u64_at(data, 32).ok_or_else(short)?;
        let shoff = u64_at(data, 40).ok_or_else(short)?;
        let phentsize = u16_at(data, 54).ok_or_else(short)?;
        let phnum = u16_at(data, 56).ok_or_else(short)?;
        let shentsize = u16_at(data, 58).ok_or_else(short)?;
        let shnum = u16_at(data, 60).ok_or_else(short)?;
        let shstrndx = u16_at(data, 62).ok_or_else(short)? as usize;
        if shnum > 0 && usize::from(shentsize) != SHDR64 {
            return Err(malformed("unexpected section header size"));
        }
        let got = data.len() as u64;
        let need = |end: Option<u64>| -> Result<(), ImageError> {
            match end {
                Some(e) if e <= got => Ok(()),
                Some(e) => Err(ImageError::Truncated {
                    what: ELF,
                    declared: e,
                    got,
                }),
                None => Err(malformed("a size overflows")),
            }
        };
        need(phoff.checked_add(u64::from(phentsize) * u64::from(phnum)))?;
        need(shoff.checked_add(SHDR64 as u64 * u64::from(shnum)))?;
        let mut sections = Vec::with_capacity(usize::from(shnum));
        for i in 0..usize::from(shnum) {
            let h = shoff as usize + i * SHDR64;
            let s = Section {
                name: u32_at(data, h).ok_or_else(short)?,
                kind: u32_at(data, h + 4).ok_or_else(short)?,
                offset: u64_at(data, h + 24).ok_or_else(short)?,
                size: u64_at(data, h + 32).ok_or_else(short)?,
                link: u32_at(data, h + 40).ok_or_else(short)?,
            };
            if s.kind != SHT_NOBITS {
                need(s.offset.checked_add(s.size))?;
            }
            sections.push(s);
        }
        // Program headers: each segment's file range must be inside too.
        for i in 0..usize::from(phnum) {
            let h = phoff as usize + i * usize::from(phentsize);
            let off = u64_at(data, h + 8).ok_or_else(short)?;
            let filesz = u64_at(data, h + 32).ok_or_else(short)?;
            need(off.checked_add(filesz))?;
        }
        if shnum > 0 && shstrndx >= sections.len() {
            return Err(malformed("bad section name table index"));
        }
        Ok(Elf {
            data,
            sections,
            shstrndx,
        })
    }

    fn bytes(&self, s: &Section) -> &'a [u8] {
        if s.kind == SHT_NOBITS {
            return &[];
        }
        // In range: checked in `parse`.
        &self.data[s.offset as usize..(s.offset + s.size) as usize]
    }

    fn string(&self, table: usize, at: u32) -> String {
        let Some(t) = self.sections.get(table) else {
            return String::new();
        };
        let b = self.bytes(t);
        let start = (at as usize).min(b.len());
        let end = b[start..]
            .iter()
            .position(|&c| c == 0)
            .map_or(b.len(), |i| start + i);
        String::from_utf8_lossy(&b[start..end]).into_owned()
    }

    fn section_name(&self, i: usize) -> String {
        self.sections
            .get(i)
            .map(|s| self.string(self.shstrndx, s.name))
            .unwrap_or_default()
    }

    fn section_by_name(&self, name: &str) -> Option<&Section> {
        (0..self.sections.len())
            .find(|&i| self.section_name(i) == name)
            .map(|i| &self.sections[i])
    }

    /// The symbol table.
    pub fn symbols(&self) -> Vec<Symbol> {
        let mut out = Vec::new();
        for s in self.sections.iter().filter(|s| s.kind == SHT_SYMTAB) {
            let table = self.bytes(s);
            for sym in table.chunks_exact(SYM64).skip(1) {
                let (Some(name), Some(shndx), Some(size)) =
                    (u32_at(sym, 0), u16_at(sym, 6), u64_at(sym, 16))
                else {
                    continue;
                };
                out.push(Symbol {
                    name: self.string(s.link as usize, name),
                    kind: sym[4] & 0xf,
                    bind: sym[4] >> 4,
                    other: sym[5],
                    section: self.section_name(usize::from(shndx)),
                    size,
                });
            }
        }
        out
    }

    /// Parameters of kernel `name` from its `.nv.info.<name>` section:
    /// (ordinal, offset, size), sorted by ordinal.
    pub fn kernel_params(&self, name: &str) -> Option<Vec<(u16, u16, u32)>> {
        let info = self.bytes(self.section_by_name(&format!(".nv.info.{name}"))?);
        let mut params = Vec::new();
        let mut at = 0;
        while at + 4 <= info.len() {
            let (fmt, attr) = (info[at], info[at + 1]);
            let value = u16_at(info, at + 2)?;
            at += 4;
            if fmt != EIFMT_SVAL {
                continue;
            }
            let len = usize::from(value);
            let payload = info.get(at..at + len)?;
            at += len;
            if attr == EIATTR_KPARAM_INFO && len == KPARAM_INFO_BYTES {
                let ordinal = u16_at(payload, 4)?;
                let offset = u16_at(payload, 6)?;
                let flags = u32_at(payload, 8)?;
                params.push((ordinal, offset, (flags >> 18) & 0x3fff));
            }
        }
        params.sort_unstable();
        params.dedup_by_key(|p| p.0);
        Some(params)
    }

    /// Kernels with parameter layouts, and module variables.
    pub fn declarations(&self) -> ptx::Declarations {
        let syms = self.symbols();
        let mut d = ptx::Declarations::default();
        for s in &syms {
            let kernel_section = format!(".nv.constant0.{}", s.name);
            let is_entry = s.kind == STT_FUNC
                && (s.other & STO_CUDA_ENTRY != 0
                    || self.section_by_name(&kernel_section).is_some());
            if is_entry {
                let params = self
                    .kernel_params(&s.name)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(_, offset, size)| ptx::Param {
                        offset: u32::from(offset),
                        size,
                        align: 1,
                    })
                    .collect();
                d.entries.push(ptx::Entry {
                    name: s.name.clone(),
                    params,
                });
            } else if s.kind == STT_OBJECT && !s.name.is_empty() {
                // Module variables are local symbols unless compiled for
                // separate linking; the driver finds them by name either way.
                let space = if s.section.starts_with(".nv.constant") {
                    ptx::Space::Const
                } else if s.section.starts_with(".nv.global") {
                    ptx::Space::Global
                } else {
                    continue;
                };
                d.variables.push(ptx::Variable {
                    name: s.name.clone(),
                    space,
                    size: s.size,
                });
            }
        }
        d
    }
}

/// The length a fat binary's header declares (header plus payload).
fn fatbin_len(image: &[u8]) -> Result<u64, ImageError> {
    const WHAT: &str = "fat binary";
    let short = ImageError::Malformed {
        what: WHAT,
        why: "short header",
    };
    let header = u16_at(image, 6).ok_or(short.clone())?;
    let payload = u64_at(image, 8).ok_or(short)?;
    if usize::from(header) < FATBIN_HEADER {
        return Err(ImageError::Malformed {
            what: WHAT,
            why: "header size below 16 bytes",
        });
    }
    let declared = u64::from(header)
        .checked_add(payload)
        .ok_or(ImageError::Malformed {
            what: WHAT,
            why: "size overflows",
        })?;
    if declared > image.len() as u64 {
        return Err(ImageError::Truncated {
            what: WHAT,
            declared,
            got: image.len() as u64,
        });
    }
    Ok(declared)
}

/// Declarations readable from a fat binary without decompressing it: any
/// cubin or PTX stored uncompressed inside it.
fn fatbin_declarations(image: &[u8]) -> ptx::Declarations {
    let mut d = ptx::Declarations::default();
    let mut at = 0;
    while let Some(i) = image[at..].windows(4).position(|w| w == ELF_MAGIC) {
        let start = at + i;
        if let Ok(elf) = Elf::parse(&image[start..]) {
            let more = elf.declarations();
            for e in more.entries {
                if !d.entries.iter().any(|x| x.name == e.name) {
                    d.entries.push(e);
                }
            }
            for v in more.variables {
                if !d.variables.iter().any(|x| x.name == v.name) {
                    d.variables.push(v);
                }
            }
        }
        at = start + 4;
    }
    if d.entries.is_empty()
        && let Some(i) = image.windows(8).position(|w| w == b".version")
    {
        let end = image[i..]
            .iter()
            .position(|&b| b == 0)
            .map_or(image.len(), |e| i + e);
        if let Ok(text) = std::str::from_utf8(&image[i..end]) {
            d = ptx::scan(text);
        }
    }
    d
}

/// Checks an image, copies it with a NUL (PTX) and guard bytes, and reads
/// its declarations.
pub fn prepare(image: &[u8]) -> Result<Prepared, ImageError> {
    let (kind, body, decls) = if image.starts_with(ELF_MAGIC) {
        let elf = Elf::parse(image)?;
        (Kind::Elf, image, elf.declarations())
    } else if u32_at(image, 0) == Some(FATBIN_MAGIC) {
        let len = fatbin_len(image)? as usize;
        let body = &image[..len];
        (Kind::Fatbin, body, fatbin_declarations(body))
    } else {
        // PTX: text up to the first NUL.
        let end = image.iter().position(|&b| b == 0).unwrap_or(image.len());
        let text = std::str::from_utf8(&image[..end]).map_err(|_| ImageError::Unknown)?;
        if !text.contains(".entry") && !text.contains(".version") {
            return Err(ImageError::Unknown);
        }
        (Kind::Ptx, &image[..end], ptx::scan(text))
    };
    let mut bytes = Vec::with_capacity(body.len() + GUARD_BYTES);
    bytes.extend_from_slice(body);
    bytes.resize(body.len() + GUARD_BYTES, 0);
    Ok(Prepared { kind, bytes, decls })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a minimal ELF64 cubin-like image: a symbol table with the
    /// given (name, type, bind, other, section index, size) symbols, the
    /// named extra sections, and `.nv.info.<k>` sections with KPARAM_INFO
    /// records.
    pub(crate) struct ElfBuilder {
        sections: Vec<(String, u32, Vec<u8>)>,
        symbols: Vec<(String, u8, u8, u8, u16, u64)>,
    }

    impl ElfBuilder {
        pub(crate) fn new() -> Self {
            Self {
                sections: Vec::new(),
                symbols: Vec::new(),
            }
        }

        /// Adds a section; returns its index (1-based after the null section).
        pub(crate) fn section(&mut self, name: &str, kind: u32, data: Vec<u8>) -> u16 {
            self.sections.push((name.into(), kind, data));
            self.sections.len() as u16
        }

        pub(crate) fn symbol(
            &mut self,
            name: &str,
            kind: u8,
            bind: u8,
            other: u8,
            shndx: u16,
            size: u64,
        ) {
            self.symbols
                .push((name.into(), kind, bind, other, shndx, size));
        }

        /// An `.nv.info.<kernel>` payload from (ordinal, offset, size) triples,
        /// with an unrelated record of each other format around them.
        pub(crate) fn nv_info(params: &[(u16, u16, u32)]) -> Vec<u8> {
            let mut v = vec![0x01, 0x2a, 0, 0]; // EIFMT_NVAL record
            v.extend_from_slice(&[0x03, 0x19, 0x10, 0x00]); // EIFMT_HVAL record
            for &(ord, off, size) in params {
                v.extend_from_slice(&[EIFMT_SVAL, EIATTR_KPARAM_INFO]);
                v.extend_from_slice(&(KPARAM_INFO_BYTES as u16).to_le_bytes());
                v.extend_from_slice(&0u32.to_le_bytes());
                v.extend_from_slice(&ord.to_le_bytes());
                v.extend_from_slice(&off.to_le_bytes());
                v.extend_from_slice(&((size << 18) | (0x1f << 12)).to_le_bytes());
            }
            v.extend_from_slice(&[EIFMT_SVAL, 0x0a, 8, 0]); // EIATTR_PARAM_CBANK
            v.extend_from_slice(&[0; 8]);
            v
        }

        pub(crate) fn build(mut self) -> Vec<u8> {
            let mut strtab = vec![0u8];
            let mut symtab = vec![0u8; SYM64];
            for (name, kind, bind, other, shndx, size) in &self.symbols {
                let off = strtab.len() as u32;
                strtab.extend_from_slice(name.as_bytes());
                strtab.push(0);
                let mut s = [0u8; SYM64];
                s[0..4].copy_from_slice(&off.to_le_bytes());
                s[4] = (bind << 4) | kind;
                s[5] = *other;
                s[6..8].copy_from_slice(&shndx.to_le_bytes());
                s[16..24].copy_from_slice(&size.to_le_bytes());
                symtab.extend_from_slice(&s);
            }
            let strtab_index = self.sections.len() as u32 + 2;
            self.sections.push((".symtab".into(), SHT_SYMTAB, symtab));
            self.sections.push((".strtab".into(), 3, strtab));
            let mut shstr = vec![0u8];
            let mut names = Vec::new();
            for (n, _, _) in &self.sections {
                names.push(shstr.len() as u32);
                shstr.extend_from_slice(n.as_bytes());
                shstr.push(0);
            }
            names.push(shstr.len() as u32);
            shstr.extend_from_slice(b".shstrtab\0");
            self.sections.push((".shstrtab".into(), 3, shstr));
            let mut out = vec![0u8; EHDR64];
            let mut offsets = Vec::new();
            for (_, _, d) in &self.sections {
                offsets.push(out.len() as u64);
                out.extend_from_slice(d);
            }
            let shoff = out.len() as u64;
            out.extend_from_slice(&[0u8; SHDR64]);
            for (i, (_, kind, d)) in self.sections.iter().enumerate() {
                let mut h = [0u8; SHDR64];
                h[0..4].copy_from_slice(&names[i].to_le_bytes());
                h[4..8].copy_from_slice(&kind.to_le_bytes());
                h[24..32].copy_from_slice(&offsets[i].to_le_bytes());
                h[32..40].copy_from_slice(&(d.len() as u64).to_le_bytes());
                if *kind == SHT_SYMTAB {
                    h[40..44].copy_from_slice(&strtab_index.to_le_bytes());
                    h[56..64].copy_from_slice(&(SYM64 as u64).to_le_bytes());
                }
                out.extend_from_slice(&h);
            }
            out[..4].copy_from_slice(ELF_MAGIC);
            out[4] = ELFCLASS64;
            out[5] = ELFDATA2LSB;
            out[6] = 1;
            out[40..48].copy_from_slice(&shoff.to_le_bytes());
            out[58..60].copy_from_slice(&(SHDR64 as u16).to_le_bytes());
            let shnum = self.sections.len() as u16 + 1;
            out[60..62].copy_from_slice(&shnum.to_le_bytes());
            out[62..64].copy_from_slice(&(shnum - 1).to_le_bytes());
            out
        }
    }

    fn sample() -> Vec<u8> {
        let mut b = ElfBuilder::new();
        let text = b.section(".text.saxpy", 1, vec![0; 32]);
        let _c0 = b.section(".nv.constant0.saxpy", 1, vec![0; 0x160 + 24]);
        b.section(
            ".nv.info.saxpy",
            0x7000_0000,
            ElfBuilder::nv_info(&[(2, 16, 8), (0, 0, 4), (1, 8, 8)]),
        );
        let helper = b.section(".text.helper", 1, vec![0; 16]);
        let glob = b.section(".nv.global", SHT_NOBITS, vec![]);
        let cst = b.section(".nv.constant3", 1, vec![0; 64]);
        b.symbol("saxpy", STT_FUNC, 1, STO_CUDA_ENTRY, text, 32);
        b.symbol("helper", STT_FUNC, 1, 0, helper, 16);
        b.symbol("g_counter", STT_OBJECT, 1, 0, glob, 4);
        b.symbol("c_table", STT_OBJECT, 1, 0, cst, 64);
        b.symbol("local_tmp", STT_OBJECT, 0, 0, glob, 8);
        b.symbol("elsewhere", STT_OBJECT, 2, 0, 0, 8);
        b.build()
    }

    #[test]
    fn a_hand_made_cubin_yields_kernels_params_and_variables() {
        let img = sample();
        let elf = Elf::parse(&img).unwrap();
        let syms = elf.symbols();
        assert_eq!(syms.len(), 6);
        assert_eq!(syms[0].name, "saxpy");
        assert_eq!(syms[0].section, ".text.saxpy");
        let d = elf.declarations();
        assert_eq!(d.entries.len(), 1, "helper is not a kernel: {d:?}");
        let p: Vec<(u32, u32)> = d.entries[0]
            .params
            .iter()
            .map(|p| (p.offset, p.size))
            .collect();
        assert_eq!(p, [(0, 4), (8, 8), (16, 8)], "sorted by ordinal");
        let v: Vec<(&str, ptx::Space, u64)> = d
            .variables
            .iter()
            .map(|v| (v.name.as_str(), v.space, v.size))
            .collect();
        assert_eq!(
            v,
            [
                ("g_counter", ptx::Space::Global, 4),
                ("c_table", ptx::Space::Const, 64),
                ("local_tmp", ptx::Space::Global, 8)
            ],
            "an undefined symbol is no variable of this module"
        );
        let p = prepare(&img).unwrap();
        assert_eq!(p.kind, Kind::Elf);
        assert_eq!(p.bytes.len(), img.len() + GUARD_BYTES);
        assert_eq!(p.decls, d);
    }

    /// A real NVRTC cubin (testdata/layouts.cu for sm_90) declares the same
    /// kernels, parameter layouts and variables as NVRTC's PTX of the same source.
    #[test]
    fn an_nvrtc_cubin_matches_its_ptx() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
        let cubin = std::fs::read(dir.join("layouts.sm_90.cubin")).unwrap();
        let text = std::fs::read_to_string(dir.join("layouts.sm_90.ptx")).unwrap();
        let from_ptx = ptx::scan(&text);
        let p = prepare(&cubin).unwrap();
        assert_eq!(p.kind, Kind::Elf);
        let from_elf = p.decls;
        let layout = |d: &ptx::Declarations| {
            let mut v: Vec<(String, Vec<(u32, u32)>)> = d
                .entries
                .iter()
                .map(|e| {
                    (
                        e.name.clone(),
                        e.params.iter().map(|p| (p.offset, p.size)).collect(),
                    )
                })
                .collect();
            v.sort();
            v
        };
        assert_eq!(layout(&from_elf), layout(&from_ptx));
        let kernels = layout(&from_ptx);
        assert_eq!(kernels.len(), 3, "{kernels:?}");
        assert_eq!(
            kernels[1],
            (
                "params_mixed".to_string(),
                vec![(0, 1), (2, 2), (8, 8), (16, 8), (24, 16), (40, 4), (48, 8)]
            )
        );
        let vars = |d: &ptx::Declarations| {
            let mut v: Vec<(String, ptx::Space, u64)> = d
                .variables
                .iter()
                .map(|v| (v.name.clone(), v.space, v.size))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        assert_eq!(vars(&from_elf), vars(&from_ptx));
        assert_eq!(vars(&from_ptx).len(), 4);
    }

    /// Corrupting any byte of the headers, section table or symbol table of
    /// a real cubin, or cutting it anywhere, never panics.
    #[test]
    fn corrupted_cubins_never_panic() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
        let cubin = std::fs::read(dir.join("layouts.sm_90.cubin")).unwrap();
        for cut in (0..cubin.len()).step_by(61) {
            let _ = prepare(&cubin[..cut]);
        }
        // Every header byte, and every 5th byte elsewhere.
        let offsets = (0..EHDR64).chain((EHDR64..cubin.len()).step_by(5));
        for at in offsets {
            for v in [0x00, 0xff] {
                let mut b = cubin.clone();
                b[at] = v;
                let _ = prepare(&b);
            }
        }
    }

    #[test]
    fn a_kernel_is_recognised_by_its_parameter_bank_too() {
        let mut b = ElfBuilder::new();
        let text = b.section(".text.k", 1, vec![0; 8]);
        b.section(".nv.constant0.k", 1, vec![0; 8]);
        b.symbol("k", STT_FUNC, 1, 0, text, 8);
        let d = Elf::parse(&b.build()).unwrap().declarations();
        assert_eq!(d.entries.len(), 1);
        assert!(d.entries[0].params.is_empty(), "no .nv.info: no parameters");
    }

    #[test]
    fn truncated_and_malformed_binaries_are_refused() {
        let img = sample();
        for cut in [10, EHDR64, img.len() - 1] {
            let e = prepare(&img[..cut]).unwrap_err();
            assert!(
                matches!(
                    e,
                    ImageError::Truncated { .. } | ImageError::Malformed { .. }
                ),
                "{cut}: {e}"
            );
        }
        let mut bad = img.clone();
        bad[4] = 1; // 32-bit
        assert!(prepare(&bad).unwrap_err().to_string().contains("64-bit"));
        let mut bad = img.clone();
        bad[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(prepare(&bad).is_err());
        // A section pointing past the end.
        let mut bad = img.clone();
        let shoff = u64_at(&bad, 40).unwrap() as usize;
        let first = shoff + SHDR64 + 32;
        bad[first..first + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(prepare(&bad), Err(ImageError::Truncated { .. })));
    }

    #[test]
    fn fat_binaries_are_checked_against_their_header() {
        let cubin = sample();
        let mut fat = Vec::new();
        fat.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        fat.extend_from_slice(&1u16.to_le_bytes());
        fat.extend_from_slice(&(FATBIN_HEADER as u16).to_le_bytes());
        let payload = 64 + cubin.len();
        fat.extend_from_slice(&(payload as u64).to_le_bytes());
        fat.extend_from_slice(&[0u8; 64]); // an entry header, opaque here
        fat.extend_from_slice(&cubin);
        fat.extend_from_slice(&[0xee; 100]); // trailing bytes beyond the declared size
        let p = prepare(&fat).unwrap();
        assert_eq!(p.kind, Kind::Fatbin);
        assert_eq!(p.bytes.len(), FATBIN_HEADER + payload + GUARD_BYTES);
        assert_eq!(p.decls.entries[0].name, "saxpy");
        assert_eq!(p.decls.variables.len(), 3);
        let e = prepare(&fat[..FATBIN_HEADER + 10]).unwrap_err();
        assert!(
            matches!(e, ImageError::Truncated { declared, got: 26, .. } if declared == (FATBIN_HEADER + payload) as u64),
            "{e}"
        );
        assert!(prepare(&fat[..6]).is_err());
    }

    #[test]
    fn ptx_is_cut_at_its_nul_and_terminated() {
        let p = prepare(b".version 8.0\n.target sm_80\n.entry k() { ret; }\0garbage").unwrap();
        assert_eq!(p.kind, Kind::Ptx);
        let text_len = p.bytes.iter().position(|&b| b == 0).unwrap();
        assert_eq!(
            &p.bytes[..text_len],
            b".version 8.0\n.target sm_80\n.entry k() { ret; }"
        );
        assert_eq!(p.decls.entries[0].name, "k");
        assert_eq!(prepare(b"hello").unwrap_err(), ImageError::Unknown);
        assert_eq!(
            prepare(&[0xff, 0xfe, 0x00]).unwrap_err(),
            ImageError::Unknown
        );
        assert_eq!(prepare(b"").unwrap_err(), ImageError::Unknown);
    }
}
