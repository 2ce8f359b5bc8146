//! Test helpers: a builder of small cubin-like ELF images.

use crate::cubin::{
    EHDR64, EIATTR_KPARAM_INFO, EIFMT_SVAL, ELF_MAGIC, ELFCLASS64, ELFDATA2LSB, KPARAM_INFO_BYTES,
    SHDR64, SHT_SYMTAB, SYM64,
};

/// Builds a minimal ELF64 cubin-like image: a symbol table with the
/// given (name, type, bind, other, section index, size) symbols, the
/// named extra sections, and `.nv.info.<k>` sections with KPARAM_INFO
/// records.
#[derive(Debug, Default)]
pub struct ElfBuilder {
    sections: Vec<(String, u32, Vec<u8>)>,
    symbols: Vec<(String, u8, u8, u8, u16, u64)>,
}

impl ElfBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a section; returns its index (1-based after the null section).
    pub fn section(&mut self, name: &str, kind: u32, data: Vec<u8>) -> u16 {
        self.sections.push((name.into(), kind, data));
        self.sections.len() as u16
    }

    pub fn symbol(&mut self, name: &str, kind: u8, bind: u8, other: u8, shndx: u16, size: u64) {
        self.symbols
            .push((name.into(), kind, bind, other, shndx, size));
    }

    /// An `.nv.info.<kernel>` payload from (ordinal, offset, size) triples,
    /// with an unrelated record of each other format around them.
    pub fn nv_info(params: &[(u16, u16, u32)]) -> Vec<u8> {
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

    pub fn build(mut self) -> Vec<u8> {
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
