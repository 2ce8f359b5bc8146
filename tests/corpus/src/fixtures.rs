//! The committed PTX fixtures, embedded at compile time.

use crate::Arch;

macro_rules! fixtures {
    ($($file:literal),* $(,)?) => {
        /// Every `.cu` file stem in `tests/kernels` (a unit test keeps this list complete).
        pub const FILES: &[&str] = &[$($file),*];

        fn lookup(file: &str, arch: Arch) -> Option<&'static str> {
            match file {
                $($file => Some(match arch {
                    Arch::Sm52 => include_str!(concat!("../../kernels/ptx/", $file, ".sm_52.ptx")),
                    Arch::Sm80 => include_str!(concat!("../../kernels/ptx/", $file, ".sm_80.ptx")),
                    Arch::Sm90 => include_str!(concat!("../../kernels/ptx/", $file, ".sm_90.ptx")),
                }),)*
                _ => None,
            }
        }
    };
}

fixtures! {
    "atomics",
    "bitonic",
    "bitops",
    "constant",
    "device_funcs",
    "dynamic_shared",
    "float_special",
    "fp_rounding",
    "grid3d",
    "grid_stride",
    "half",
    "histogram",
    "int64",
    "intdiv",
    "ldg",
    "mandelbrot",
    "matmul",
    "nbody",
    "oob",
    "params",
    "reduce",
    "saxpy",
    "scan",
    "shuffle",
    "softmax",
    "stencil",
    "transpose",
    "vector_add",
    "warp_vote",
}

/// The PTX text of `tests/kernels/ptx/<file>.<arch>.ptx`.
///
/// # Panics
/// If `file` is not one of [`FILES`]: that is a bug in the caller, not a runtime condition.
pub fn ptx(file: &str, arch: Arch) -> &'static str {
    lookup(file, arch).unwrap_or_else(|| panic!("no PTX fixture for {file:?}; known: {FILES:?}"))
}

/// Like [`ptx`], without the panic.
pub(crate) fn try_ptx(file: &str, arch: Arch) -> Option<&'static str> {
    lookup(file, arch)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::*;
    use crate::cases;

    /// Exit code gen-ptx.py uses when NVRTC or the CUDA headers are missing.
    const GEN_PTX_UNAVAILABLE: i32 = 2;

    fn kernels_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels")
    }

    fn cu_stems() -> BTreeSet<String> {
        std::fs::read_dir(kernels_dir())
            .expect("tests/kernels exists")
            .filter_map(|e| {
                let name = e
                    .expect("readable dir entry")
                    .file_name()
                    .into_string()
                    .expect("utf-8 name");
                name.strip_suffix(".cu").map(str::to_string)
            })
            .collect()
    }

    /// Names declared with `.entry` in a PTX module.
    fn entries(ptx: &str) -> BTreeSet<&str> {
        ptx.lines()
            .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
            .map(|rest| rest.split('(').next().unwrap_or(rest).trim())
            .collect()
    }

    #[test]
    fn every_cu_file_has_fixtures_for_every_arch() {
        let stems = cu_stems();
        let listed: BTreeSet<String> = FILES.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            stems, listed,
            "FILES in fixtures.rs must list exactly the .cu files"
        );
        assert!(
            stems.len() >= 25,
            "the corpus needs at least 25 kernel files, has {}",
            stems.len()
        );
        for stem in &stems {
            for arch in Arch::ALL {
                let path = kernels_dir()
                    .join("ptx")
                    .join(format!("{stem}.{}.ptx", arch.suffix()));
                let on_disk = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                assert_eq!(
                    ptx(stem, arch),
                    on_disk,
                    "{} is stale in the build",
                    path.display()
                );
                assert!(
                    on_disk.contains(&format!(".target {}", arch.suffix())),
                    "{} does not target {}",
                    path.display(),
                    arch.suffix()
                );
            }
        }
    }

    #[test]
    fn every_case_kernel_is_an_entry_of_its_fixture() {
        let all = cases();
        let mut names = BTreeSet::new();
        let mut used_files = BTreeSet::new();
        let mut kernel_count = 0;
        for case in &all {
            assert!(names.insert(case.name), "duplicate case name {}", case.name);
            used_files.insert(case.file);
            assert!(!case.kernels.is_empty(), "{} names no kernel", case.name);
            for arch in Arch::ALL {
                let found = entries(ptx(case.file, arch));
                for k in case.kernels {
                    assert!(
                        found.contains(k),
                        "{}: no .entry {k} in {}.{arch}.ptx",
                        case.name,
                        case.file
                    );
                }
            }
            kernel_count += case.kernels.len();
        }
        assert!(
            kernel_count >= 25,
            "only {kernel_count} kernels are exercised"
        );
        let unused: Vec<_> = FILES.iter().filter(|f| !used_files.contains(*f)).collect();
        assert!(unused.is_empty(), "kernel files no case runs: {unused:?}");
        assert_eq!(
            all.last().map(|c| c.name),
            Some("oob_write"),
            "the context-poisoning case must run last"
        );
    }

    #[test]
    fn every_entry_in_the_fixtures_is_exercised() {
        let exercised: BTreeSet<&str> = cases()
            .iter()
            .flat_map(|c| c.kernels.iter().copied())
            .collect();
        for file in FILES {
            for k in entries(ptx(file, Arch::Sm80)) {
                assert!(exercised.contains(k), "kernel {k} in {file}.cu has no case");
            }
        }
    }

    #[test]
    fn gen_ptx_check_passes() {
        let script = kernels_dir().join("gen-ptx.py");
        let out = match Command::new("python3").arg(&script).arg("--check").output() {
            Ok(out) => out,
            Err(e) => {
                println!("SKIP gen-ptx.py --check: cannot run python3 ({e})");
                return;
            }
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() == Some(GEN_PTX_UNAVAILABLE) {
            println!(
                "SKIP gen-ptx.py --check: NVRTC not importable: {}",
                stderr.trim()
            );
            return;
        }
        assert!(
            out.status.success(),
            "gen-ptx.py --check failed ({}):\n{stdout}\n{stderr}",
            out.status
        );
    }
}
