//! Device code in host objects and static libraries: nvcc puts a translation unit's fat
//! binary in its object's `.nv_fatbin` section (`__nv_relfatbin` for relocatable device code,
//! `-rdc`), and a static library (`ar`) holds such objects, as CUDA's `libcudadevrt.a` does.
//! [`device_ptx`] finds the PTX in them, for a linker that links PTX.
//!
//! Parsed from untrusted bytes: every header is bounds-checked.

use thiserror::Error;

use crate::FatbinError;
use crate::cubin::{CubinError, Elf};

/// An archive's signature.
const AR_MAGIC: &[u8] = b"!<arch>\n";
/// An archive member's header: name, date, ids, mode, size (decimal text), `` `\n ``.
const AR_HEADER: usize = 60;
/// Where the member size field starts and how long it is.
const AR_SIZE: std::ops::Range<usize> = 48..58;
/// The sections of a host object that hold fat binaries.
const FATBIN_SECTIONS: [&str; 2] = [".nv_fatbin", "__nv_relfatbin"];
/// An ELF image's signature.
const ELF_MAGIC: &[u8] = b"\x7fELF";

/// Why device code could not be read from an object or library.
#[derive(Debug, Error)]
pub enum ArchiveError {
    /// Neither an `ar` archive nor an ELF object.
    #[error("neither a static library (ar archive) nor an ELF object")]
    NotObject,
    /// A member header or size that points past the end.
    #[error("the archive is malformed: {0}")]
    Malformed(&'static str),
    /// An object's ELF headers.
    #[error("an object of the library: {0}")]
    Object(#[source] CubinError),
    /// A fat binary in an object.
    #[error("a fat binary of the library: {0}")]
    Fatbin(#[source] FatbinError),
}

/// The PTX of every fat binary in `data`, an `ar` archive of objects or one object
/// ([`crate::library_ptx`] of each). Objects without device code are skipped.
pub fn device_ptx(data: &[u8], max_arch: u32) -> Result<Vec<Vec<u8>>, ArchiveError> {
    let mut out = Vec::new();
    if let Some(mut rest) = data.strip_prefix(AR_MAGIC) {
        while !rest.is_empty() {
            let header = rest
                .get(..AR_HEADER)
                .ok_or(ArchiveError::Malformed("a member header is cut short"))?;
            let size: usize = std::str::from_utf8(&header[AR_SIZE])
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .ok_or(ArchiveError::Malformed("a member size is not a number"))?;
            let body = rest
                .get(AR_HEADER..)
                .and_then(|b| b.get(..size))
                .ok_or(ArchiveError::Malformed("a member runs past the end"))?;
            if body.starts_with(ELF_MAGIC) {
                object_ptx(body, max_arch, &mut out)?;
            }
            // Members start at even offsets.
            let next = (AR_HEADER + size).next_multiple_of(2).min(rest.len());
            rest = &rest[next..];
        }
    } else if data.starts_with(ELF_MAGIC) {
        object_ptx(data, max_arch, &mut out)?;
    } else {
        return Err(ArchiveError::NotObject);
    }
    Ok(out)
}

/// Appends the PTX of the fat binaries in one object's fat binary sections.
fn object_ptx(object: &[u8], max_arch: u32, out: &mut Vec<Vec<u8>>) -> Result<(), ArchiveError> {
    let elf = Elf::parse(object).map_err(ArchiveError::Object)?;
    for name in FATBIN_SECTIONS {
        let Some(mut section) = elf.section_bytes(name) else {
            continue;
        };
        // One fat binary after another, as nvcc lays them out.
        while crate::is_fatbin(section) {
            let len = crate::declared_len(section).map_err(ArchiveError::Fatbin)?;
            if let Some(text) =
                crate::library_ptx(section, max_arch).map_err(ArchiveError::Fatbin)?
            {
                out.push(text);
            }
            let next = usize::try_from(len)
                .ok()
                .map(|l| l.next_multiple_of(8))
                .filter(|&l| l > 0 && l <= section.len());
            match next {
                Some(l) => section = &section[l..],
                None => break,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutils::ElfBuilder;
    use crate::{KIND_ELF, KIND_PTX, NewEntry};

    fn object(section: &str, fatbins: &[Vec<u8>]) -> Vec<u8> {
        let mut b = ElfBuilder::new();
        b.section(section, 1, fatbins.concat());
        b.build()
    }

    fn archive(members: &[Vec<u8>]) -> Vec<u8> {
        let mut a = AR_MAGIC.to_vec();
        for (i, m) in members.iter().enumerate() {
            let mut h = format!("m{i}.o/").into_bytes();
            h.resize(48, b' ');
            h.extend(format!("{:<10}`\n", m.len()).into_bytes());
            a.extend(h);
            a.extend(m);
            if m.len() % 2 == 1 {
                a.push(b'\n');
            }
        }
        a
    }

    fn fatbin(entries: &[(u16, u32, &[u8])]) -> Vec<u8> {
        let e: Vec<NewEntry<'_>> = entries
            .iter()
            .map(|&(kind, arch, payload)| NewEntry {
                kind,
                arch,
                flags: 0,
                payload,
                uncompressed_len: payload.len() as u64,
            })
            .collect();
        crate::write(&e)
    }

    #[test]
    fn a_librarys_objects_give_their_ptx() {
        let a = fatbin(&[
            (KIND_ELF, 80, b"cubin"),
            (KIND_PTX, 70, b"// 70\0"),
            (KIND_PTX, 90, b"// 90"),
        ]);
        let b = fatbin(&[(KIND_PTX, 121, b"// 121")]);
        let lib = archive(&[
            object("__nv_relfatbin", std::slice::from_ref(&a)),
            b"not an object".to_vec(),
            object(".nv_fatbin", &[b]),
            object(".text", &[a]),
        ]);
        let ptx = device_ptx(&lib, 80).unwrap();
        assert_eq!(ptx, vec![b"// 70".to_vec(), b"// 121".to_vec()]);
        assert_eq!(device_ptx(&lib, 95).unwrap()[0], b"// 90");
        let one = object(".nv_fatbin", &[fatbin(&[(KIND_PTX, 52, b"// 52")])]);
        assert_eq!(device_ptx(&one, 80).unwrap(), vec![b"// 52".to_vec()]);
    }

    #[test]
    fn malformed_libraries_are_refused() {
        assert!(matches!(
            device_ptx(b"plain text", 80),
            Err(ArchiveError::NotObject)
        ));
        let mut lib = archive(&[object(".nv_fatbin", &[fatbin(&[(KIND_PTX, 52, b"x")])])]);
        lib.truncate(lib.len() - 10);
        assert!(matches!(
            device_ptx(&lib, 80),
            Err(ArchiveError::Malformed(_))
        ));
        let mut bad = AR_MAGIC.to_vec();
        bad.extend([b'x'; AR_HEADER]);
        assert!(matches!(
            device_ptx(&bad, 80),
            Err(ArchiveError::Malformed(_))
        ));
        assert!(device_ptx(AR_MAGIC, 80).unwrap().is_empty());
    }
}
