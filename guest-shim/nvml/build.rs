//! Makes the cdylib NVIDIA's NVML library by name (`libnvidia-ml.so.1`) and an ELF filter of
//! `libcuda.so.1`: the dynamic loader resolves every symbol of this library in the shim, which
//! implements NVML (guest-shim/src/nvml). The entry point names come from
//! guest-shim/src/nvml/entry_points.txt, the list the shim exports.

use std::fmt::Write as _;
use std::path::Path;

const ENTRY_POINTS: &str = "../src/nvml/entry_points.txt";

fn main() {
    println!("cargo:rerun-if-changed={ENTRY_POINTS}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--filter=libcuda.so.1");
    let list = std::fs::read_to_string(ENTRY_POINTS).expect("reading the NVML entry point list");
    let mut out = String::new();
    for name in list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        assert!(
            name.starts_with("nvml") && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{name:?} is not an NVML entry point name"
        );
        let body = if name == "nvmlErrorString" {
            "-> *const u8 { UNRESOLVED_TEXT.as_ptr() }"
        } else {
            "-> u32 { UNRESOLVED }"
        };
        writeln!(
            out,
            "#[unsafe(no_mangle)]\npub extern \"C\" fn {name}() {body}"
        )
        .expect("writing to a String");
    }
    let dest = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("entry_points.rs");
    std::fs::write(dest, out).expect("writing the entry points");
}
