//! `libnvidia-ml.so.1` for vgpu guests: an ELF filter (`DT_FILTER`) of `libcuda.so.1`.
//!
//! vgpu's guest shim implements NVML next to the CUDA driver API (guest-shim/src/nvml), so that
//! NVML's answers come over the process's one session to vgpud. Programs and Python packages
//! look for NVML under its own name, though: linked with `-lnvidia-ml` (`DT_NEEDED
//! libnvidia-ml.so.1`) or opened with `dlopen("libnvidia-ml.so.1")` (pynvml, PyTorch). This
//! library carries that name and soname and, as a filter, makes the dynamic loader resolve each
//! of its symbols in `libcuda.so.1` instead: the functions below give the linker the symbol
//! table and are never called when the shim is there (the loader refuses to load a filter
//! whose filtee is missing).

/// What a definition returns if it ever ran: `NVML_ERROR_LIBRARY_NOT_FOUND`.
const UNRESOLVED: u32 = 12;
/// `nvmlErrorString`'s text if it ever ran.
const UNRESOLVED_TEXT: &[u8] = b"NVML Shared Library Not Found\0";

/// Identifies this file as vgpu's (guest-shim/install.sh looks for it).
#[used]
static SIGNATURE: [u8; 37] = *b"vgpu NVML filter library of the shim\0";

include!(concat!(env!("OUT_DIR"), "/entry_points.rs"));
