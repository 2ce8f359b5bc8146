//! Cubins (CUDA ELF images) read from untrusted bytes: the kernels they
//! define with their parameter layouts (from the `.nv.info.<kernel>`
//! attribute sections NVCC and NVRTC write) and their module variables.
//! Every offset is checked against the image before it is read; section
//! lookups by name go through a map built once.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};

/// ELF magic.
pub const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
/// `EI_CLASS` of 64-bit ELF.
pub const ELFCLASS64: u8 = 2;
/// `EI_DATA` of little-endian ELF.
pub const ELFDATA2LSB: u8 = 1;
/// Size of an ELF64 header.
pub const EHDR64: usize = 64;
/// Size of an ELF64 section header.
pub const SHDR64: usize = 64;
/// Size of an ELF64 symbol.
pub const SYM64: usize = 24;
/// `SHT_SYMTAB`.
pub const SHT_SYMTAB: u32 = 2;
/// `SHT_NOBITS` (no file content).
pub const SHT_NOBITS: u32 = 8;
/// `STT_OBJECT`.
pub const STT_OBJECT: u8 = 1;
/// `STT_FUNC`.
pub const STT_FUNC: u8 = 2;
/// `STO_CUDA_ENTRY` in `st_other`: the function is a kernel.
pub const STO_CUDA_ENTRY: u8 = 0x10;
/// `EIFMT_SVAL`: the record carries a 16-bit size and that many bytes.
pub const EIFMT_SVAL: u8 = 0x04;
/// `EIATTR_KPARAM_INFO`: one kernel parameter.
pub const EIATTR_KPARAM_INFO: u8 = 0x17;
/// Bytes of a `EIATTR_KPARAM_INFO` payload.
pub const KPARAM_INFO_BYTES: usize = 12;

/// Why a cubin could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CubinError {
    /// Headers that point past the end.
    #[error("the ELF image is truncated: it declares {declared} bytes, {got} were sent")]
    Truncated {
        /// Bytes its headers need.
        declared: u64,
        /// Bytes present.
        got: u64,
    },
    /// Headers that make no sense.
    #[error("the ELF image is malformed: {0}")]
    Malformed(&'static str),
}

/// A kernel parameter: its offset in the parameter buffer and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    /// Byte offset.
    pub offset: u32,
    /// Bytes.
    pub size: u32,
}

/// A kernel a cubin defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// Entry name.
    pub name: String,
    /// Parameters, in order.
    pub params: Vec<Param>,
}

/// The state space of a module variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// `__device__` (`.nv.global*`).
    Global,
    /// `__constant__` (`.nv.constant*`).
    Const,
}

/// A module variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variable {
    /// Name.
    pub name: String,
    /// Where it lives.
    pub space: Space,
    /// Bytes.
    pub size: u64,
}

/// What a cubin declares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cubin {
    /// The SM architecture its SASS is for (90 for sm_90), from `e_flags`
    /// of ELF ABI versions up to [`MAX_KNOWN_ABI`]; `None` for later ones.
    pub arch: Option<u32>,
    /// Kernels, in symbol table order.
    pub kernels: Vec<Kernel>,
    /// Module variables.
    pub variables: Vec<Variable>,
}

/// The newest CUDA ELF ABI version whose `e_flags` layout is known here
/// (the SM architecture in the low byte).
pub const MAX_KNOWN_ABI: u8 = 7;
/// Offset of `EI_ABIVERSION` in the ELF identification.
const EI_ABIVERSION: usize = 8;
/// Offset of `e_flags` in an ELF64 header.
const E_FLAGS: usize = 48;

/// Reads a cubin's architecture, kernels and variables.
pub fn read(image: &[u8]) -> Result<Cubin, CubinError> {
    let mut c = Elf::parse(image)?.declarations();
    if image[EI_ABIVERSION] <= MAX_KNOWN_ABI {
        c.arch = u32_at(image, E_FLAGS).map(|f| f & 0xff);
    }
    Ok(c)
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

/// Longest name read from a string table; a longer one is cut (names are C++-mangled kernel
/// and variable names, far shorter in practice).
pub const MAX_NAME_LEN: usize = 4096;
/// Bytes of string tables, symbol tables and `.nv.info` sections a reader may scan per byte of
/// the image, plus [`SCAN_BASE`]. Sections may overlap and names may share bytes, so without a
/// bound a hostile image of a few KiB makes the reader scan and copy the same bytes for every
/// section, symbol and kernel (quadratic or worse in its size). Past the budget names read as
/// empty, symbols are no longer read and parameter layouts are unknown: time and memory stay
/// linear in the image's size. Real cubins scan each byte about once.
const SCAN_PER_BYTE: usize = 8;
/// Scan budget every image gets besides [`SCAN_PER_BYTE`].
const SCAN_BASE: usize = 64 << 10;

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
    /// Section index by name (the first of a name), built once: lookups by
    /// name stay linear in the number of sections overall.
    names: HashMap<String, usize>,
    /// Bytes the reader may still scan ([`SCAN_PER_BYTE`]).
    scan_left: Cell<usize>,
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

fn malformed(why: &'static str) -> CubinError {
    CubinError::Malformed(why)
}

impl<'a> Elf<'a> {
    /// Parses the headers, checking that every section lies inside `data`.
    pub fn parse(data: &'a [u8]) -> Result<Elf<'a>, CubinError> {
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
        let need = |end: Option<u64>| -> Result<(), CubinError> {
            match end {
                Some(e) if e <= got => Ok(()),
                Some(e) => Err(CubinError::Truncated { declared: e, got }),
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
        let mut elf = Elf {
            data,
            sections,
            shstrndx,
            names: HashMap::new(),
            scan_left: Cell::new(
                data.len()
                    .saturating_mul(SCAN_PER_BYTE)
                    .saturating_add(SCAN_BASE),
            ),
        };
        for i in (0..elf.sections.len()).rev() {
            let name = elf.section_name(i);
            elf.names.insert(name, i);
        }
        Ok(elf)
    }

    fn bytes(&self, s: &Section) -> &'a [u8] {
        if s.kind == SHT_NOBITS {
            return &[];
        }
        // In range: checked in `parse`.
        &self.data[s.offset as usize..(s.offset + s.size) as usize]
    }

    /// Takes `bytes` from the scan budget; false (and nothing taken) when it is spent.
    fn scan(&self, bytes: usize) -> bool {
        let left = self.scan_left.get();
        if left < bytes {
            self.scan_left.set(0);
            return false;
        }
        self.scan_left.set(left - bytes);
        true
    }

    /// The NUL-terminated string at `at` of string table `table`, at most [`MAX_NAME_LEN`]
    /// bytes; empty once the scan budget is spent.
    fn string(&self, table: usize, at: u32) -> String {
        let Some(t) = self.sections.get(table) else {
            return String::new();
        };
        let b = self.bytes(t);
        let start = (at as usize).min(b.len());
        let window = &b[start..b.len().min(start.saturating_add(MAX_NAME_LEN))];
        let len = window.iter().position(|&c| c == 0).unwrap_or(window.len());
        if !self.scan(len + 1) {
            return String::new();
        }
        String::from_utf8_lossy(&window[..len]).into_owned()
    }

    fn section_name(&self, i: usize) -> String {
        self.sections
            .get(i)
            .map(|s| self.string(self.shstrndx, s.name))
            .unwrap_or_default()
    }

    /// The bytes of the first section called `name` (empty for a section without file bytes).
    pub fn section_bytes(&self, name: &str) -> Option<&'a [u8]> {
        self.section_by_name(name).map(|s| self.bytes(s))
    }

    fn section_by_name(&self, name: &str) -> Option<&Section> {
        self.names.get(name).map(|&i| &self.sections[i])
    }

    /// The symbol table.
    pub fn symbols(&self) -> Vec<Symbol> {
        let mut out = Vec::new();
        for s in self.sections.iter().filter(|s| s.kind == SHT_SYMTAB) {
            let table = self.bytes(s);
            for sym in table.chunks_exact(SYM64).skip(1) {
                if !self.scan(SYM64) {
                    return out;
                }
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
        if !self.scan(info.len()) {
            return None;
        }
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

    /// Kernels with parameter layouts, and module variables; a name declared again (a second
    /// symbol table, a repeated symbol) is read once, as the driver knows one kernel or
    /// variable of a name.
    pub fn declarations(&self) -> Cubin {
        let syms = self.symbols();
        let mut d = Cubin::default();
        let mut kernels_seen = HashSet::new();
        let mut variables_seen = HashSet::new();
        for s in &syms {
            let kernel_section = format!(".nv.constant0.{}", s.name);
            let is_entry = s.kind == STT_FUNC
                && (s.other & STO_CUDA_ENTRY != 0 || self.names.contains_key(&kernel_section));
            if is_entry {
                if !kernels_seen.insert(s.name.as_str()) {
                    continue;
                }
                let params = self
                    .kernel_params(&s.name)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(_, offset, size)| Param {
                        offset: u32::from(offset),
                        size,
                    })
                    .collect();
                d.kernels.push(Kernel {
                    name: s.name.clone(),
                    params,
                });
            } else if s.kind == STT_OBJECT && !s.name.is_empty() {
                // Module variables are local symbols unless compiled for
                // separate linking; the driver finds them by name either way.
                let space = if s.section.starts_with(".nv.constant") {
                    Space::Const
                } else if s.section.starts_with(".nv.global") {
                    Space::Global
                } else {
                    continue;
                };
                if !variables_seen.insert(s.name.as_str()) {
                    continue;
                }
                d.variables.push(Variable {
                    name: s.name.clone(),
                    space,
                    size: s.size,
                });
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutils::ElfBuilder;

    fn sample() -> Vec<u8> {
        let mut b = ElfBuilder::new();
        let text = b.section(".text.saxpy", 1, vec![0; 32]);
        b.section(".nv.constant0.saxpy", 1, vec![0; 0x160 + 24]);
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

    /// An ELF whose `sections` symbol tables all cover the same `symbols` zeroed entries (each
    /// named at offset 0 of a string table of `strtab` bytes without a NUL), with section names
    /// from that table too.
    fn overlapping_symtabs(sections: usize, symbols: usize, strtab: usize) -> Vec<u8> {
        /// `SHT_STRTAB`.
        const SHT_STRTAB: u32 = 3;
        let str_at = EHDR64;
        let sym_at = str_at + strtab;
        let sh_at = sym_at + symbols * SYM64;
        let shnum = sections + 2;
        let mut img = vec![0u8; sh_at + shnum * SHDR64];
        img[..4].copy_from_slice(ELF_MAGIC);
        img[4] = ELFCLASS64;
        img[5] = ELFDATA2LSB;
        img[40..48].copy_from_slice(&(sh_at as u64).to_le_bytes());
        img[58..60].copy_from_slice(&(SHDR64 as u16).to_le_bytes());
        img[60..62].copy_from_slice(&(shnum as u16).to_le_bytes());
        img[62..64].copy_from_slice(&1u16.to_le_bytes());
        img[str_at..sym_at].fill(b'A');
        let mut header = |i: usize, kind: u32, offset: usize, size: usize| {
            let h = sh_at + i * SHDR64;
            img[h + 4..h + 8].copy_from_slice(&kind.to_le_bytes());
            img[h + 24..h + 32].copy_from_slice(&(offset as u64).to_le_bytes());
            img[h + 32..h + 40].copy_from_slice(&(size as u64).to_le_bytes());
            img[h + 40..h + 44].copy_from_slice(&1u32.to_le_bytes());
        };
        header(1, SHT_STRTAB, str_at, strtab);
        for i in 0..sections {
            header(i + 2, SHT_SYMTAB, sym_at, symbols * SYM64);
        }
        img
    }

    /// Without the scan budget this image of 200 KiB made the reader copy 4 KiB names for
    /// 1000 × 2730 symbols (11 GiB); now what it reads is bounded by the budget.
    #[test]
    fn overlapping_tables_and_long_names_cost_linear_time_and_memory() {
        let img = overlapping_symtabs(1000, 2730, 64 << 10);
        let budget = img.len() * SCAN_PER_BYTE + SCAN_BASE;
        let elf = Elf::parse(&img).unwrap();
        let syms = elf.symbols();
        let name_bytes: usize = syms.iter().map(|s| s.name.len() + s.section.len()).sum();
        assert!(name_bytes <= budget, "{name_bytes} bytes of names");
        assert!(syms.len() * SYM64 <= budget, "{} symbols", syms.len());
        assert!(syms.len() < 1000 * 2730);
        let d = read(&img).unwrap();
        assert!(d.kernels.is_empty() && d.variables.is_empty());
        // Within the budget every symbol is read, its name cut to the longest allowed.
        let img = overlapping_symtabs(2, 10, 64 << 10);
        let syms = Elf::parse(&img).unwrap().symbols();
        assert_eq!(syms.len(), 2 * 9);
        assert!(syms.iter().all(|s| s.name.len() == MAX_NAME_LEN));
    }

    #[test]
    fn a_repeated_kernel_or_variable_is_declared_once() {
        let mut b = ElfBuilder::new();
        let text = b.section(".text.k", 1, vec![0; 8]);
        b.section(".nv.info.k", 0x7000_0000, ElfBuilder::nv_info(&[(0, 0, 8)]));
        let glob = b.section(".nv.global", SHT_NOBITS, vec![]);
        for _ in 0..3 {
            b.symbol("k", STT_FUNC, 1, STO_CUDA_ENTRY, text, 8);
            b.symbol("g", STT_OBJECT, 1, 0, glob, 4);
        }
        let d = read(&b.build()).unwrap();
        assert_eq!(d.kernels.len(), 1);
        assert_eq!(d.kernels[0].params.len(), 1);
        assert_eq!(d.variables.len(), 1);
    }

    #[test]
    fn kernels_parameters_and_variables_are_read() {
        let img = sample();
        let elf = Elf::parse(&img).unwrap();
        let syms = elf.symbols();
        assert_eq!(syms.len(), 6);
        assert_eq!(syms[0].section, ".text.saxpy");
        let c = read(&img).unwrap();
        assert_eq!(c.kernels.len(), 1, "helper is not a kernel: {c:?}");
        let p: Vec<(u32, u32)> = c.kernels[0]
            .params
            .iter()
            .map(|p| (p.offset, p.size))
            .collect();
        assert_eq!(p, [(0, 4), (8, 8), (16, 8)], "sorted by ordinal");
        let v: Vec<(&str, Space, u64)> = c
            .variables
            .iter()
            .map(|v| (v.name.as_str(), v.space, v.size))
            .collect();
        assert_eq!(
            v,
            [
                ("g_counter", Space::Global, 4),
                ("c_table", Space::Const, 64),
                ("local_tmp", Space::Global, 8)
            ],
            "an undefined symbol is no variable of this module"
        );
    }

    #[test]
    fn the_architecture_comes_from_the_header() {
        let mut img = sample();
        img[EI_ABIVERSION] = 7;
        img[E_FLAGS..E_FLAGS + 4].copy_from_slice(&0x5a_055a_u32.to_le_bytes());
        assert_eq!(read(&img).unwrap().arch, Some(90));
        img[EI_ABIVERSION] = 8;
        assert_eq!(read(&img).unwrap().arch, None, "a layout not known here");
    }

    #[test]
    fn a_kernel_is_recognised_by_its_parameter_bank_too() {
        let mut b = ElfBuilder::new();
        let text = b.section(".text.k", 1, vec![0; 8]);
        b.section(".nv.constant0.k", 1, vec![0; 8]);
        b.symbol("k", STT_FUNC, 1, 0, text, 8);
        let c = read(&b.build()).unwrap();
        assert_eq!(c.kernels.len(), 1);
        assert!(c.kernels[0].params.is_empty(), "no .nv.info: no parameters");
    }

    #[test]
    fn truncated_malformed_and_corrupted_images_are_errors_not_panics() {
        let img = sample();
        for cut in [0, 10, EHDR64, img.len() - 1] {
            assert!(read(&img[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = img.clone();
        bad[4] = 1; // 32-bit
        assert_eq!(
            read(&bad).unwrap_err(),
            CubinError::Malformed("not a 64-bit little-endian ELF")
        );
        for at in 0..img.len() {
            for v in [0x00, 0x7f, 0xff] {
                let mut b = img.clone();
                b[at] = v;
                let _ = read(&b);
            }
        }
    }
}
