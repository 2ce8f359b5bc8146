//! Module images as a guest sends them: PTX text, a cubin (ELF) or a fat
//! binary. [`prepare`] checks that an image is complete before the driver
//! sees it (the driver trusts the sizes inside a binary), and reads what the
//! broker needs from it: kernels with their parameter layouts, and module
//! variables. Cubins and fat binaries are read by `vgpu-fatbin` (the one
//! reader of those formats), PTX by [`ptx::scan`].

use tracing::debug;
use vgpu_fatbin::cubin::{self, ELF_MAGIC};

use crate::{printf, ptx};
/// Zero bytes appended to every image copy, so that a driver reading a
/// little past a declared end reads zeros, never daemon memory.
pub const GUARD_BYTES: usize = 4096;

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
    /// Whether the image was rewritten to return device `printf` text ([`printf::rewrite`]):
    /// it defines [`printf::HEAD_SYMBOL`] and [`printf::BUFFER_SYMBOL`].
    pub printf: bool,
    /// Whether its kernels may call the device heap ([`mentions_heap`]).
    pub heap: bool,
    /// Whether its kernels may launch kernels ([`mentions_device_launches`]).
    pub launches: bool,
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

/// A cubin's declarations in the form the executor uses.
fn cubin_declarations(image: &[u8]) -> Result<ptx::Declarations, ImageError> {
    let c = cubin::read(image).map_err(|e| match e {
        cubin::CubinError::Truncated { declared, got } => ImageError::Truncated {
            what: "ELF",
            declared,
            got,
        },
        cubin::CubinError::Malformed(why) => ImageError::Malformed { what: "ELF", why },
    })?;
    Ok(ptx::Declarations {
        entries: c
            .kernels
            .into_iter()
            .map(|k| ptx::Entry {
                name: k.name,
                params: k
                    .params
                    .into_iter()
                    .map(|p| ptx::Param {
                        offset: p.offset,
                        size: p.size,
                        align: 1,
                    })
                    .collect(),
            })
            .collect(),
        variables: c
            .variables
            .into_iter()
            .map(|v| ptx::Variable {
                name: v.name,
                space: match v.space {
                    cubin::Space::Global => ptx::Space::Global,
                    cubin::Space::Const => ptx::Space::Const,
                },
                size: v.size,
                // Whether a cubin's variable is managed is not read from the ELF.
                managed: false,
            })
            .collect(),
    })
}

/// The length a fat binary's header declares (header plus entries),
/// checked against what was sent.
fn fatbin_len(image: &[u8]) -> Result<u64, ImageError> {
    const WHAT: &str = "fat binary";
    let declared = vgpu_fatbin::declared_len(image).map_err(|_| ImageError::Malformed {
        what: WHAT,
        why: "short or malformed header",
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

/// Declarations of a fat binary's entries (decompressed when stored
/// compressed): the kernels and variables of its cubins and, when it has no
/// cubin, of its PTX.
fn fatbin_declarations(image: &[u8]) -> ptx::Declarations {
    let mut d = ptx::Declarations::default();
    let Ok(entries) = vgpu_fatbin::entries(image) else {
        return d;
    };
    let mut kernels = std::collections::HashSet::new();
    let mut variables = std::collections::HashSet::new();
    let mut add = |more: ptx::Declarations, d: &mut ptx::Declarations| {
        for e in more.entries {
            if kernels.insert(e.name.clone()) {
                d.entries.push(e);
            }
        }
        for v in more.variables {
            if variables.insert(v.name.clone()) {
                d.variables.push(v);
            }
        }
    };
    for e in entries.iter().filter(|e| e.kind == vgpu_fatbin::KIND_ELF) {
        if let Ok(more) = e
            .contents()
            .map_err(drop)
            .and_then(|c| cubin_declarations(&c).map_err(drop))
        {
            add(more, &mut d);
        }
    }
    if d.entries.is_empty() {
        for e in entries.iter().filter(|e| e.kind == vgpu_fatbin::KIND_PTX) {
            if let Ok(text) = e.contents() {
                let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
                if let Ok(text) = std::str::from_utf8(&text[..end]) {
                    add(ptx::scan(text), &mut d);
                }
            }
        }
    }
    d
}

/// The PTX a device of architecture `arch` (80 for compute capability 8.0) would JIT-compile
/// from fat binary `image`, when it calls `vprintf`: loading that PTX, rewritten, instead of
/// the fat binary returns its `printf` text. `None` when the fat binary has no such PTX (its
/// cubins' `printf` text goes where NVIDIA's driver prints it).
fn fatbin_printf_ptx(image: &[u8], arch: u32) -> Option<String> {
    let text = vgpu_fatbin::ptx_for(image, arch).ok()?;
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    let text = std::str::from_utf8(&text[..end]).ok()?;
    printf::rewrite(text)
}

/// Checks an image, copies it with a NUL (PTX) and guard bytes, and reads
/// its declarations. PTX that declares `vprintf` is rewritten to return its
/// `printf` text ([`printf`]); so is the PTX of a fat binary a device of
/// architecture `arch` would use, which is then loaded instead of the fat
/// binary (`arch` `None`: fat binaries are loaded as they are).
pub fn prepare_for(image: &[u8], arch: Option<u32>) -> Result<Prepared, ImageError> {
    let rewritten;
    let (kind, body, decls, printf) = if image.starts_with(ELF_MAGIC) {
        (Kind::Elf, image, cubin_declarations(image)?, false)
    } else if vgpu_fatbin::is_fatbin(image) {
        let len = fatbin_len(image)? as usize;
        let body = &image[..len];
        match arch.and_then(|a| fatbin_printf_ptx(body, a)) {
            Some(text) => {
                debug!("loading a fat binary's PTX, rewritten to return its printf text");
                rewritten = text;
                let decls = ptx::scan(&rewritten);
                (Kind::Ptx, rewritten.as_bytes(), decls, true)
            }
            None => (Kind::Fatbin, body, fatbin_declarations(body), false),
        }
    } else {
        // PTX: text up to the first NUL.
        let end = image.iter().position(|&b| b == 0).unwrap_or(image.len());
        let text = std::str::from_utf8(&image[..end]).map_err(|_| ImageError::Unknown)?;
        if !text.contains(".entry") && !text.contains(".version") {
            return Err(ImageError::Unknown);
        }
        match printf::rewrite(text) {
            Some(t) => {
                rewritten = t;
                let decls = ptx::scan(&rewritten);
                (Kind::Ptx, rewritten.as_bytes(), decls, true)
            }
            None => (Kind::Ptx, &image[..end], ptx::scan(text), false),
        }
    };
    let mut bytes = Vec::with_capacity(body.len() + GUARD_BYTES);
    bytes.extend_from_slice(body);
    bytes.resize(body.len() + GUARD_BYTES, 0);
    Ok(Prepared {
        kind,
        heap: mentions_heap(body),
        launches: mentions_device_launches(body),
        bytes,
        decls,
        printf,
    })
}

/// Whether an image may call the device heap: its text or its symbols name `malloc` (PTX's
/// `.extern .func malloc`, NVRTC's `__cuda_syscall_aligned_malloc`, a cubin's symbol). A
/// compressed image cannot be read here: the driver's own heap serves it, uncharged.
fn mentions_heap(body: &[u8]) -> bool {
    memchr::memmem::find(body, b"malloc").is_some()
}

/// Whether an image's kernels may launch kernels (dynamic parallelism): its text or symbols
/// name the device runtime's launch (`cudaLaunchDeviceV2`, `cnpLaunchDeviceV2`,
/// `__cudaCDP2LaunchDeviceV2`, …).
fn mentions_device_launches(body: &[u8]) -> bool {
    memchr::memmem::find(body, b"LaunchDevice").is_some()
}

/// [`prepare_for`] without an architecture: fat binaries are loaded as they are.
pub fn prepare(image: &[u8]) -> Result<Prepared, ImageError> {
    prepare_for(image, None)
}

#[cfg(test)]
pub(crate) mod tests {
    use vgpu_fatbin::cubin::{EHDR64, SHDR64, SHT_NOBITS, STO_CUDA_ENTRY, STT_FUNC, STT_OBJECT};
    use vgpu_fatbin::testutils::ElfBuilder;

    use super::*;

    fn u64_at(b: &[u8], at: usize) -> Option<u64> {
        Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
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
        let p = prepare(&img).unwrap();
        assert_eq!(p.kind, Kind::Elf);
        assert_eq!(p.bytes.len(), img.len() + GUARD_BYTES);
        let d = p.decls;
        assert_eq!(d.entries.len(), 1, "helper is not a kernel: {d:?}");
        let params: Vec<(u32, u32)> = d.entries[0]
            .params
            .iter()
            .map(|p| (p.offset, p.size))
            .collect();
        assert_eq!(params, [(0, 4), (8, 8), (16, 8)], "sorted by ordinal");
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
        let mut fat = vgpu_fatbin::write(&[vgpu_fatbin::NewEntry {
            kind: vgpu_fatbin::KIND_ELF,
            arch: 80,
            flags: 0,
            payload: &cubin,
            uncompressed_len: 0,
        }]);
        let declared = fat.len();
        fat.extend_from_slice(&[0xee; 100]); // trailing bytes beyond the declared size
        let p = prepare(&fat).unwrap();
        assert_eq!(p.kind, Kind::Fatbin);
        assert_eq!(p.bytes.len(), declared + GUARD_BYTES);
        assert_eq!(p.decls.entries[0].name, "saxpy");
        assert_eq!(p.decls.variables.len(), 3);
        let e = prepare(&fat[..vgpu_fatbin::HEADER_LEN + 10]).unwrap_err();
        assert!(
            matches!(e, ImageError::Truncated { declared: d, got: 26, .. } if d == declared as u64),
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

    const PRINTING: &str = ".version 7.0\n.target sm_52\n.address_size 64\n\
        .extern .func (.param .b32 func_retval0) vprintf\n(\n.param .b64 p0,\n.param .b64 p1\n)\n;\n\
        .visible .entry k() { ret; }\n";

    #[test]
    fn images_that_name_malloc_use_the_device_heap() {
        let with = b".version 8.0\n.target sm_80\n.extern .func (.param .b64 r) malloc(.param .b64 n);\n.entry k() { ret; }";
        assert!(prepare(with).unwrap().heap);
        let without = b".version 8.0\n.target sm_80\n.entry k() { ret; }";
        assert!(!prepare(without).unwrap().heap);
        assert!(!prepare(without).unwrap().launches);
    }

    #[test]
    fn ptx_without_vprintf_is_loaded_byte_for_byte() {
        let text = b".version 8.0\n.target sm_80\n// vprintf\n.entry k() { ret; }";
        let p = prepare(text).unwrap();
        assert!(!p.printf);
        assert_eq!(&p.bytes[..text.len()], text);
        assert!(p.bytes[text.len()..].iter().all(|&b| b == 0));
    }

    #[test]
    fn ptx_calling_vprintf_gets_a_printf_buffer_charged_as_globals() {
        let p = prepare(PRINTING.as_bytes()).unwrap();
        assert!(p.printf);
        assert_eq!(p.kind, Kind::Ptx);
        let text = std::str::from_utf8(&p.bytes[..p.bytes.len() - GUARD_BYTES]).unwrap();
        assert!(!text.contains(".extern .func"), "{text}");
        assert_eq!(p.decls.entries[0].name, "k");
        let v: Vec<(&str, u64)> = p
            .decls
            .variables
            .iter()
            .map(|v| (v.name.as_str(), v.size))
            .collect();
        assert_eq!(
            v,
            [
                (printf::HEAD_SYMBOL, printf::HEAD_SIZE as u64),
                (printf::BUFFER_SYMBOL, printf::BUFFER_SIZE as u64)
            ]
        );
    }

    #[test]
    fn a_fat_binary_whose_ptx_calls_vprintf_is_loaded_as_that_ptx_rewritten() {
        let cubin = sample();
        let fat = vgpu_fatbin::write(&[
            vgpu_fatbin::NewEntry {
                kind: vgpu_fatbin::KIND_ELF,
                arch: 80,
                flags: 0,
                payload: &cubin,
                uncompressed_len: 0,
            },
            vgpu_fatbin::NewEntry {
                kind: vgpu_fatbin::KIND_PTX,
                arch: 52,
                flags: 0,
                payload: PRINTING.as_bytes(),
                uncompressed_len: 0,
            },
        ]);
        // Without an architecture, or with none the PTX runs on: the fat binary as it is.
        for arch in [None, Some(50)] {
            let p = prepare_for(&fat, arch).unwrap();
            assert_eq!((p.kind, p.printf), (Kind::Fatbin, false), "{arch:?}");
        }
        let p = prepare_for(&fat, Some(80)).unwrap();
        assert_eq!((p.kind, p.printf), (Kind::Ptx, true));
        assert_eq!(
            p.decls.entries[0].name, "k",
            "the declarations of what is loaded"
        );
        assert_eq!(p.bytes[p.bytes.len() - GUARD_BYTES], 0, "NUL-terminated");
        // A fat binary whose PTX does not call vprintf stays as it is.
        let quiet = vgpu_fatbin::write(&[vgpu_fatbin::NewEntry {
            kind: vgpu_fatbin::KIND_PTX,
            arch: 52,
            flags: 0,
            payload: b".version 7.0\n.target sm_52\n.entry k() { ret; }",
            uncompressed_len: 0,
        }]);
        let p = prepare_for(&quiet, Some(80)).unwrap();
        assert_eq!((p.kind, p.printf), (Kind::Fatbin, false));
    }
}
