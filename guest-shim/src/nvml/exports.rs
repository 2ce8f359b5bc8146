//! The C ABI of NVML (`libnvidia-ml.so.1`, nvml.h): a thin layer over [`super`].
//!
//! Every function returns an `nvmlReturn_t`; out-pointers that are NULL are
//! `NVML_ERROR_INVALID_ARGUMENT`, strings that do not fit the caller's buffer
//! `NVML_ERROR_INSUFFICIENT_SIZE`, a device handle that is not the VM's GPU
//! `NVML_ERROR_INVALID_ARGUMENT`, and what a VM's GPU has no figure for (temperature,
//! power, fans, ECC, MIG) `NVML_ERROR_NOT_SUPPORTED`, as NVIDIA's library answers in a
//! vGPU guest.

#![allow(non_snake_case, non_camel_case_types, clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulong, c_ulonglong, c_void};

use super::{NvmlRes, NvmlReturn, PciAddress, Process, ret};

/// What an `nvmlDevice_t` points to: the VM's one GPU.
#[repr(C)]
pub struct NvmlDevice {
    _private: u8,
}

/// The handle of the VM's GPU (its address is the handle).
static DEVICE: NvmlDevice = NvmlDevice { _private: 0 };

/// `nvmlDevice_t`.
pub type nvmlDevice_t = *const NvmlDevice;

/// `nvmlMemory_t`.
#[repr(C)]
pub struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `NVML_STRUCT_VERSION(Memory, 2)`: the structure's size and its version in the top byte.
pub const NVML_MEMORY_V2: c_uint = std::mem::size_of::<nvmlMemory_v2_t>() as c_uint | (2 << 24);

/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE` and `NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE`.
const BUS_ID_LEGACY_LEN: usize = 16;
const BUS_ID_LEN: usize = 32;

/// `nvmlPciInfo_t`.
#[repr(C)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; BUS_ID_LEGACY_LEN],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; BUS_ID_LEN],
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
}

/// `nvmlProcessInfo_v2_t` (also `nvmlProcessInfo_t` of the `_v3` calls).
#[repr(C)]
pub struct nvmlProcessInfo_v2_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// `NVML_VALUE_NOT_AVAILABLE` as an unsigned int: the MIG instance ids of a process on a GPU
/// without MIG.
pub(super) const NOT_AVAILABLE_U32: c_uint = c_uint::MAX;
/// `NVML_COMPUTEMODE_DEFAULT`.
const COMPUTEMODE_DEFAULT: c_uint = 0;
/// `NVML_GPU_VIRTUALIZATION_MODE_VGPU`: the GPU of a virtual machine that shares one.
const VIRTUALIZATION_MODE_VGPU: c_uint = 2;
/// `NVML_P2P_STATUS_NOT_SUPPORTED`: the VM has one GPU, with no peer.
const P2P_STATUS_NOT_SUPPORTED: c_uint = 5;
/// `NVML_P2P_CAPS_INDEX_*` values run below this.
const P2P_CAPS_INDEX_COUNT: c_uint = 6;
/// `NVML_BRAND_NVIDIA_VCS`: NVIDIA Virtual Compute Server, what NVIDIA's compute vGPU profiles
/// report in their guests.
const BRAND_NVIDIA_VCS: c_uint = 9;
/// `nvmlClockId_t` values run below this (current, application target, application default,
/// customer boost maximum).
const CLOCK_ID_COUNT: c_uint = 4;
/// Bits of one `unsigned long` of a CPU set (`nvmlDeviceGetCpuAffinity`).
const CPU_SET_WORD_BITS: usize = c_ulong::BITS as usize;
/// Where Linux lists the online CPUs (`0-3,6`).
const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// Runs an entry point: its result as an `nvmlReturn_t`, a panic as `NVML_ERROR_UNKNOWN`.
pub(super) fn nvml(name: &str, f: impl FnOnce() -> NvmlRes<()>) -> NvmlReturn {
    let codes = (ret::SUCCESS, ret::UNKNOWN, "NVML_ERROR_UNKNOWN");
    let r = crate::ffi::guarded(name, codes, f);
    crate::debug!("{name} -> {r}");
    r
}

/// The VM's GPU, or `NVML_ERROR_INVALID_ARGUMENT` for any other handle.
pub(super) fn device(d: nvmlDevice_t) -> NvmlRes<()> {
    super::ensure_init()?;
    if std::ptr::eq(d, &DEVICE) {
        Ok(())
    } else {
        Err(ret::INVALID_ARGUMENT)
    }
}

/// Writes through an out-pointer; NULL is `NVML_ERROR_INVALID_ARGUMENT`.
///
/// # Safety
/// `p` must be NULL or valid for a write of `T` (NVML's contract for out-parameters).
pub(super) unsafe fn write<T>(p: *mut T, v: T) -> NvmlRes<()> {
    if p.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    // SAFETY: `p` is non-NULL and valid for a write of `T` (this function's contract).
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Writes `s` and a NUL into the caller's `len`-byte buffer: NULL is
/// `NVML_ERROR_INVALID_ARGUMENT`, a buffer too small `NVML_ERROR_INSUFFICIENT_SIZE`.
///
/// # Safety
/// `p` must be NULL or valid for writes of `len` bytes.
unsafe fn write_text(p: *mut c_char, len: c_uint, s: &str) -> NvmlRes<()> {
    if p.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    let len = usize::try_from(len).map_err(|_| ret::INVALID_ARGUMENT)?;
    if s.len() >= len {
        return Err(ret::INSUFFICIENT_SIZE);
    }
    // SAFETY: `p` is valid for `len` bytes (this function's contract) and `s.len() < len`.
    let dst = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), s.len() + 1) };
    dst[..s.len()].copy_from_slice(s.as_bytes());
    dst[s.len()] = 0;
    Ok(())
}

/// `s` into a fixed array, NUL-terminated (cut to fit).
fn fill_text<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N.saturating_sub(1))) {
        *o = b as c_char;
    }
    out
}

/// Reads a caller's C string; NULL or not UTF-8 is `NVML_ERROR_INVALID_ARGUMENT`.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string.
unsafe fn read_text<'a>(p: *const c_char) -> NvmlRes<&'a str> {
    if p.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    // SAFETY: `p` is a non-NULL NUL-terminated string (this function's contract).
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| ret::INVALID_ARGUMENT)
}

/// Fills a process list NVML's way: `*count` in is the room in `infos`, out the number of
/// processes; too little room is `NVML_ERROR_INSUFFICIENT_SIZE` (with the number needed).
///
/// # Safety
/// `count` must be NULL or valid for reads and writes; `infos` NULL or valid for writes of
/// `*count` entries.
unsafe fn write_processes<T>(count: *mut c_uint, infos: *mut T, entries: Vec<T>) -> NvmlRes<()> {
    if count.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    // SAFETY: `count` is non-NULL and valid for reads and writes (this function's contract).
    let room = unsafe { count.read_unaligned() } as usize;
    let n = c_uint::try_from(entries.len()).map_err(|_| ret::UNKNOWN)?;
    // SAFETY: as above.
    unsafe { count.write_unaligned(n) };
    if entries.len() > room {
        return Err(ret::INSUFFICIENT_SIZE);
    }
    if entries.is_empty() {
        return Ok(());
    }
    if infos.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    for (i, e) in entries.into_iter().enumerate() {
        // SAFETY: `infos` has room for `room >= entries.len()` entries (this function's contract).
        unsafe { infos.wrapping_add(i).write_unaligned(e) };
    }
    Ok(())
}

fn process_v1(p: &Process) -> nvmlProcessInfo_v1_t {
    nvmlProcessInfo_v1_t {
        pid: p.pid,
        usedGpuMemory: p.memory,
    }
}

fn process_v2(p: &Process) -> nvmlProcessInfo_v2_t {
    nvmlProcessInfo_v2_t {
        pid: p.pid,
        usedGpuMemory: p.memory,
        gpuInstanceId: NOT_AVAILABLE_U32,
        computeInstanceId: NOT_AVAILABLE_U32,
    }
}

// ---- initialization, errors, system --------------------------------------------

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    nvml("nvmlInit_v2", || super::init(0))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    nvml("nvmlInit", || super::init(0))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(flags: c_uint) -> NvmlReturn {
    nvml("nvmlInitWithFlags", || super::init(flags))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    nvml("nvmlShutdown", super::shutdown)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    super::error_string(result).as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    nvml("nvmlSystemGetDriverVersion", || {
        super::ensure_init()?;
        // SAFETY: `version` is the caller's buffer of `length` bytes (NVML contract).
        unsafe { write_text(version, length, super::DRIVER_VERSION) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    nvml("nvmlSystemGetNVMLVersion", || {
        super::ensure_init()?;
        // SAFETY: `version` is the caller's buffer of `length` bytes (NVML contract).
        unsafe { write_text(version, length, &super::nvml_version()) }
    })
}

fn cuda_driver_version(out: *mut c_int) -> NvmlRes<()> {
    super::ensure_init()?;
    // SAFETY: `out` is an out-parameter of an NVML entry point: NULL or valid for a write.
    unsafe { write(out, vgpu_proto::CUDA_DRIVER_VERSION) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> NvmlReturn {
    nvml("nvmlSystemGetCudaDriverVersion", || {
        cuda_driver_version(version)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> NvmlReturn {
    nvml("nvmlSystemGetCudaDriverVersion_v2", || {
        cuda_driver_version(version)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    nvml("nvmlSystemGetProcessName", || {
        let n = super::process_name(pid)?;
        // SAFETY: `name` is the caller's buffer of `length` bytes (NVML contract).
        unsafe { write_text(name, length, &n) }
    })
}

// ---- finding the device ----------------------------------------------------------

fn device_count(out: *mut c_uint) -> NvmlRes<()> {
    let n = super::device_count()?;
    // SAFETY: `out` is an out-parameter of an NVML entry point: NULL or valid for a write.
    unsafe { write(out, n) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    nvml("nvmlDeviceGetCount_v2", || device_count(count))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> NvmlReturn {
    nvml("nvmlDeviceGetCount", || device_count(count))
}

fn handle_by_index(index: c_uint, out: *mut nvmlDevice_t) -> NvmlRes<()> {
    super::check_index(index)?;
    // SAFETY: `out` is an out-parameter of an NVML entry point: NULL or valid for a write.
    unsafe { write(out, &raw const DEVICE) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetHandleByIndex_v2", || {
        handle_by_index(index, device)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetHandleByIndex", || {
        handle_by_index(index, device)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetHandleByUUID", || {
        // SAFETY: `uuid` is the caller's NUL-terminated string (NVML contract).
        let wanted = unsafe { read_text(uuid) }?;
        if !wanted.eq_ignore_ascii_case(&super::uuid()?) {
            return Err(ret::NOT_FOUND);
        }
        // SAFETY: `device` is an out-parameter: NULL or valid for a write.
        unsafe { write(device, &raw const DEVICE) }
    })
}

fn handle_by_bus_id(bus_id: *const c_char, out: *mut nvmlDevice_t) -> NvmlRes<()> {
    // SAFETY: `bus_id` is the caller's NUL-terminated string (NVML contract).
    let text = unsafe { read_text(bus_id) }?;
    let wanted = PciAddress::parse(text).ok_or(ret::INVALID_ARGUMENT)?;
    if wanted != super::pci()? {
        return Err(ret::NOT_FOUND);
    }
    // SAFETY: `out` is an out-parameter of an NVML entry point: NULL or valid for a write.
    unsafe { write(out, &raw const DEVICE) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetHandleByPciBusId_v2", || {
        handle_by_bus_id(bus_id, device)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetHandleByPciBusId", || {
        handle_by_bus_id(bus_id, device)
    })
}

/// `nvmlDeviceGetIndex` and `nvmlDeviceGetMinorNumber`: both 0 for the VM's one GPU.
fn index_of(d: nvmlDevice_t, out: *mut c_uint) -> NvmlRes<()> {
    device(d)?;
    // SAFETY: `out` is an out-parameter of an NVML entry point: NULL or valid for a write.
    unsafe { write(out, 0) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> NvmlReturn {
    nvml("nvmlDeviceGetIndex", || index_of(device, index))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> NvmlReturn {
    nvml("nvmlDeviceGetMinorNumber", || index_of(device, minor))
}

// ---- identity --------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    d: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    nvml("nvmlDeviceGetName", || {
        device(d)?;
        let n = super::name()?;
        // SAFETY: `name` is the caller's buffer of `length` bytes (NVML contract).
        unsafe { write_text(name, length, &n) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    d: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    nvml("nvmlDeviceGetUUID", || {
        device(d)?;
        let u = super::uuid()?;
        // SAFETY: `uuid` is the caller's buffer of `length` bytes (NVML contract).
        unsafe { write_text(uuid, length, &u) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    d: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetPciInfo_v3", || {
        device(d)?;
        let a = super::pci()?;
        let info = nvmlPciInfo_t {
            busIdLegacy: fill_text(&a.bus_id_legacy()),
            domain: a.domain,
            bus: a.bus,
            device: a.device,
            // vgpu's GPU is not a PCI function of its own: no vendor or device id.
            pciDeviceId: 0,
            pciSubSystemId: 0,
            busId: fill_text(&a.bus_id()),
        };
        // SAFETY: `pci` is an out-parameter: NULL or valid for a write.
        unsafe { write(pci, info) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    d: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> NvmlReturn {
    nvml("nvmlDeviceGetCudaComputeCapability", || {
        device(d)?;
        if major.is_null() || minor.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let (ma, mi) = super::compute_capability()?;
        // SAFETY: a non-NULL out-parameter, valid for a write (NVML contract).
        unsafe { write(major, ma) }?;
        // SAFETY: as above.
        unsafe { write(minor, mi) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    d: nvmlDevice_t,
    arch: *mut c_uint,
) -> NvmlReturn {
    nvml("nvmlDeviceGetArchitecture", || {
        device(d)?;
        let a = super::architecture()?;
        // SAFETY: `arch` is an out-parameter: NULL or valid for a write.
        unsafe { write(arch, a) }
    })
}

fn clock(d: nvmlDevice_t, kind: c_uint, out: *mut c_uint) -> NvmlRes<()> {
    device(d)?;
    let mhz = super::clock_mhz(kind)?;
    // SAFETY: `out` is an out-parameter of an NVML entry point: NULL or valid for a write.
    unsafe { write(out, mhz) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    d: nvmlDevice_t,
    kind: c_uint,
    mhz: *mut c_uint,
) -> NvmlReturn {
    nvml("nvmlDeviceGetClockInfo", || clock(d, kind, mhz))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    d: nvmlDevice_t,
    kind: c_uint,
    mhz: *mut c_uint,
) -> NvmlReturn {
    nvml("nvmlDeviceGetMaxClockInfo", || clock(d, kind, mhz))
}

/// `nvmlDeviceGetClock`: any of CUDA's clock ids reads the device's clock (the VM's GPU has no
/// application clocks or boost settings of its own).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClock(
    d: nvmlDevice_t,
    kind: c_uint,
    id: c_uint,
    mhz: *mut c_uint,
) -> NvmlReturn {
    nvml("nvmlDeviceGetClock", || {
        device(d)?;
        if id >= CLOCK_ID_COUNT {
            return Err(ret::INVALID_ARGUMENT);
        }
        clock(d, kind, mhz)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetP2PStatus(
    d1: nvmlDevice_t,
    d2: nvmlDevice_t,
    index: c_uint,
    status: *mut c_uint,
) -> NvmlReturn {
    nvml("nvmlDeviceGetP2PStatus", || {
        device(d1)?;
        device(d2)?;
        if index >= P2P_CAPS_INDEX_COUNT {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: `status` is an out-parameter: NULL or valid for a write.
        unsafe { write(status, P2P_STATUS_NOT_SUPPORTED) }
    })
}

// ---- memory, utilization, processes ------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    d: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetMemoryInfo", || {
        device(d)?;
        let m = super::memory()?;
        let v = nvmlMemory_t {
            total: m.total,
            free: m.free(),
            used: m.used,
        };
        // SAFETY: `memory` is an out-parameter: NULL or valid for a write.
        unsafe { write(memory, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    d: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetMemoryInfo_v2", || {
        device(d)?;
        if memory.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: `memory` is non-NULL and valid for a read and a write of the structure
        // (NVML contract: the caller sets its version), whose first field is `version`.
        let version = unsafe { memory.cast::<c_uint>().read_unaligned() };
        if version != NVML_MEMORY_V2 {
            return Err(ret::ARGUMENT_VERSION_MISMATCH);
        }
        let m = super::memory()?;
        let v = nvmlMemory_v2_t {
            version,
            total: m.total,
            // vgpu keeps nothing of the slice for itself.
            reserved: 0,
            free: m.free(),
            used: m.used,
        };
        // SAFETY: as above.
        unsafe { write(memory, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    d: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetUtilizationRates", || {
        device(d)?;
        if utilization.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let v = nvmlUtilization_t {
            gpu: super::gpu_utilization()?,
            // vgpud does not see the device's memory controller.
            memory: 0,
        };
        // SAFETY: `utilization` is a non-NULL out-parameter, valid for a write.
        unsafe { write(utilization, v) }
    })
}

pub(super) fn compute_processes<T>(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    entry: fn(&Process) -> T,
) -> NvmlRes<()> {
    device(d)?;
    let entries = super::compute_processes()?.iter().map(entry).collect();
    // SAFETY: `count` and `infos` are the caller's count and array (NVML contract).
    unsafe { write_processes(count, infos, entries) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetComputeRunningProcesses_v3", || {
        compute_processes(d, count, infos, process_v2)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetComputeRunningProcesses_v2", || {
        compute_processes(d, count, infos, process_v2)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetComputeRunningProcesses", || {
        compute_processes(d, count, infos, process_v1)
    })
}

/// Graphics and MPS processes: a vgpu GPU has none.
fn no_processes<T>(d: nvmlDevice_t, count: *mut c_uint, infos: *mut T) -> NvmlRes<()> {
    device(d)?;
    // SAFETY: `count` and `infos` are the caller's count and array (NVML contract).
    unsafe { write_processes(count, infos, Vec::new()) }
}

/// Defines process-list entry points that answer with an empty list.
macro_rules! no_process_lists {
    ($($name:ident: $info:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            d: nvmlDevice_t,
            count: *mut c_uint,
            infos: *mut $info,
        ) -> NvmlReturn {
            nvml(stringify!($name), || no_processes(d, count, infos))
        }
    )*};
}

no_process_lists! {
    nvmlDeviceGetGraphicsRunningProcesses_v3: nvmlProcessInfo_v2_t;
    nvmlDeviceGetGraphicsRunningProcesses_v2: nvmlProcessInfo_v2_t;
    nvmlDeviceGetGraphicsRunningProcesses: nvmlProcessInfo_v1_t;
    nvmlDeviceGetMPSComputeRunningProcesses_v3: nvmlProcessInfo_v2_t;
    nvmlDeviceGetMPSComputeRunningProcesses_v2: nvmlProcessInfo_v2_t;
    nvmlDeviceGetMPSComputeRunningProcesses: nvmlProcessInfo_v1_t;
}

// ---- device events ------------------------------------------------------------------

/// `nvmlEventSet_t`: a handle from [`super::events`], never dereferenced.
pub type nvmlEventSet_t = *const c_void;

/// `nvmlEventData_t` (also the `nvmlEventSetWait` of NVML before 11, which fills the first
/// three fields).
#[repr(C)]
pub struct nvmlEventData_t {
    pub device: nvmlDevice_t,
    pub eventType: c_ulonglong,
    pub eventData: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// `nvmlEventSetCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> NvmlReturn {
    nvml("nvmlEventSetCreate", || {
        if set.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let h = super::events::create()?;
        // SAFETY: `set` is non-NULL and, per NVML's contract, valid for a write of a handle.
        unsafe { write(set, h as nvmlEventSet_t) }
    })
}

/// `nvmlDeviceRegisterEvents`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    d: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> NvmlReturn {
    nvml("nvmlDeviceRegisterEvents", || {
        device(d)?;
        super::events::register(set as usize, types)
    })
}

/// `nvmlDeviceGetSupportedEventTypes`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    d: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> NvmlReturn {
    nvml("nvmlDeviceGetSupportedEventTypes", || {
        device(d)?;
        // SAFETY: NVML's contract: NULL or valid for a write.
        unsafe { write(types, super::events::EVENT_TYPES_SUPPORTED) }
    })
}

fn event_wait(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeout_ms: c_uint) -> NvmlRes<()> {
    if data.is_null() {
        super::ensure_init()?;
        return Err(ret::INVALID_ARGUMENT);
    }
    super::events::wait(set as usize, timeout_ms)
}

/// `nvmlEventSetWait_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> NvmlReturn {
    nvml("nvmlEventSetWait_v2", || event_wait(set, data, timeout_ms))
}

/// `nvmlEventSetWait` (NVML before 11).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> NvmlReturn {
    nvml("nvmlEventSetWait", || event_wait(set, data, timeout_ms))
}

/// `nvmlEventSetFree`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> NvmlReturn {
    nvml("nvmlEventSetFree", || super::events::free(set as usize))
}

// ---- MIG, brand, CPU affinity, units -------------------------------------------------

/// `nvmlDeviceGetMaxMigDeviceCount`: 0, as NVML answers for a GPU without MIG.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    d: nvmlDevice_t,
    count: *mut c_uint,
) -> NvmlReturn {
    nvml("nvmlDeviceGetMaxMigDeviceCount", || {
        device(d)?;
        // SAFETY: `count` is an out-parameter: NULL or valid for a write.
        unsafe { write(count, 0) }
    })
}

/// `nvmlDeviceGetMigDeviceHandleByIndex`: the VM's GPU has no MIG devices
/// (`NVML_ERROR_NOT_SUPPORTED`, as `nvmlDeviceGetMigMode` says).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    d: nvmlDevice_t,
    _index: c_uint,
    mig: *mut nvmlDevice_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetMigDeviceHandleByIndex", || {
        device(d)?;
        if mig.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        Err(ret::NOT_SUPPORTED)
    })
}

/// `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`: the VM's GPU is not a MIG device, so it is
/// not a valid argument (as NVML answers for a GPU's handle); other handles neither.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig: nvmlDevice_t,
    _parent: *mut nvmlDevice_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", || {
        device(mig)?;
        Err(ret::INVALID_ARGUMENT)
    })
}

/// `nvmlDeviceGetBrand`: `NVML_BRAND_NVIDIA_VCS`, as in the guests of NVIDIA's compute vGPUs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(d: nvmlDevice_t, brand: *mut c_uint) -> NvmlReturn {
    nvml("nvmlDeviceGetBrand", || {
        device(d)?;
        // SAFETY: `brand` is an out-parameter: NULL or valid for a write.
        unsafe { write(brand, BRAND_NVIDIA_VCS) }
    })
}

/// `nvmlDeviceGetCpuAffinity`: the VM has no NUMA placement for its GPU, so every online CPU is
/// as close as any; the first `size` words of 64 CPUs each are written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    d: nvmlDevice_t,
    size: c_uint,
    set: *mut c_ulong,
) -> NvmlReturn {
    nvml("nvmlDeviceGetCpuAffinity", || {
        device(d)?;
        if size == 0 || set.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: `set` is non-NULL and has room for `size` words (NVML's contract).
        let out = unsafe { std::slice::from_raw_parts_mut(set, size as usize) };
        cpu_set(&online_cpus(), out);
        Ok(())
    })
}

/// The online CPUs' numbers, from [`ONLINE_CPUS`] (`0-3,6`), or the count `sysconf` gives
/// (numbered from 0) where that cannot be read.
fn online_cpus() -> Vec<usize> {
    let listed = std::fs::read_to_string(ONLINE_CPUS)
        .ok()
        .and_then(|l| parse_cpu_list(l.trim()));
    listed.unwrap_or_else(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        (0..usize::try_from(n).unwrap_or(1).max(1)).collect()
    })
}

/// A Linux CPU list (`0-3,6`); `None` if it is not one.
fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    /// More CPUs than any machine has: a list past it is not believed.
    const MAX_CPUS: usize = 1 << 16;
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
            None => {
                let c: usize = part.parse().ok()?;
                (c, c)
            }
        };
        if lo > hi || hi >= MAX_CPUS {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    Some(cpus)
}

/// Writes `cpus` into `set`, words of [`CPU_SET_WORD_BITS`] CPUs each (CPUs past it left out).
fn cpu_set(cpus: &[usize], set: &mut [c_ulong]) {
    set.fill(0);
    for &c in cpus {
        if let Some(w) = set.get_mut(c / CPU_SET_WORD_BITS) {
            *w |= 1 << (c % CPU_SET_WORD_BITS);
        }
    }
}

/// `nvmlUnitGetCount`: no S-class units (the VM's GPU is not in one).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlUnitGetCount(count: *mut c_uint) -> NvmlReturn {
    nvml("nvmlUnitGetCount", || {
        super::ensure_init()?;
        // SAFETY: `count` is an out-parameter: NULL or valid for a write.
        unsafe { write(count, 0) }
    })
}

/// `nvmlDeviceGetCurrentClocksEventReasons` (CUDA 12's name for the throttle reasons): the host's
/// GPU's clocks are not the VM's to see.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    d: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: the same contract as the older name's.
    unsafe { nvmlDeviceGetCurrentClocksThrottleReasons(d, reasons) }
}

// ---- what a VM's GPU does not report -----------------------------------------------

/// Defines entry points that check the device handle and answer `NVML_ERROR_NOT_SUPPORTED`:
/// the host's GPU's sensors, power, fans, ECC, BAR1, MIG, NVLink and serial number are not the
/// VM's to see.
macro_rules! not_supported {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(d: nvmlDevice_t, $($arg: $ty),*) -> NvmlReturn {
            nvml(stringify!($name), || {
                device(d)?;
                let _ = ($($arg,)*);
                Err(ret::NOT_SUPPORTED)
            })
        }
    )*};
}

not_supported! {
    nvmlDeviceGetTemperature(sensor: c_uint, temp: *mut c_uint);
    nvmlDeviceGetPowerUsage(milliwatts: *mut c_uint);
    nvmlDeviceGetTotalEnergyConsumption(millijoules: *mut c_ulonglong);
    nvmlDeviceGetPowerManagementLimit(milliwatts: *mut c_uint);
    nvmlDeviceGetEnforcedPowerLimit(milliwatts: *mut c_uint);
    nvmlDeviceGetFanSpeed(percent: *mut c_uint);
    nvmlDeviceGetPerformanceState(pstate: *mut c_uint);
    nvmlDeviceGetPersistenceMode(mode: *mut c_uint);
    nvmlDeviceGetEccMode(current: *mut c_uint, pending: *mut c_uint);
    nvmlDeviceGetBAR1MemoryInfo(bar1: *mut nvmlMemory_t);
    nvmlDeviceGetMigMode(current: *mut c_uint, pending: *mut c_uint);
    nvmlDeviceGetNvLinkState(link: c_uint, active: *mut c_uint);
    nvmlDeviceGetNvLinkRemoteDeviceType(link: c_uint, kind: *mut c_uint);
    nvmlDeviceGetNvLinkRemotePciInfo(link: c_uint, pci: *mut c_void);
    nvmlDeviceGetNvLinkRemotePciInfo_v2(link: c_uint, pci: *mut c_void);
    nvmlDeviceGetGpuFabricInfo(info: *mut c_void);
    nvmlDeviceGetGpuFabricInfoV(info: *mut c_void);
    nvmlDeviceGetSerial(serial: *mut c_char, length: c_uint);
    nvmlDeviceGetEncoderUtilization(percent: *mut c_uint, period_us: *mut c_uint);
    nvmlDeviceGetDecoderUtilization(percent: *mut c_uint, period_us: *mut c_uint);
    nvmlDeviceGetDisplayMode(display: *mut c_uint);
    nvmlDeviceGetDisplayActive(active: *mut c_uint);
    nvmlDeviceGetCurrPcieLinkGeneration(generation: *mut c_uint);
    nvmlDeviceGetCurrPcieLinkWidth(width: *mut c_uint);
    nvmlDeviceGetMaxPcieLinkGeneration(generation: *mut c_uint);
    nvmlDeviceGetMaxPcieLinkWidth(width: *mut c_uint);
    nvmlDeviceGetPcieThroughput(counter: c_uint, value: *mut c_uint);
    nvmlDeviceGetTotalEccErrors(error_type: c_uint, counter_type: c_uint, count: *mut c_ulonglong);
    nvmlDeviceGetCurrentClocksThrottleReasons(reasons: *mut c_ulonglong);
    nvmlDeviceGetNumFans(fans: *mut c_uint);
    nvmlDeviceGetPowerState(pstate: *mut c_uint);
    nvmlDeviceGetGpuInstanceId(id: *mut c_uint);
    nvmlDeviceGetComputeInstanceId(id: *mut c_uint);
    nvmlDeviceGetPowerManagementDefaultLimit(milliwatts: *mut c_uint);
    nvmlDeviceGetPowerManagementLimitConstraints(min: *mut c_uint, max: *mut c_uint);
    nvmlDeviceGetTemperatureThreshold(threshold: c_uint, temp: *mut c_uint);
    nvmlDeviceGetFanSpeed_v2(fan: c_uint, percent: *mut c_uint);
    nvmlDeviceGetApplicationsClock(kind: c_uint, mhz: *mut c_uint);
    nvmlDeviceGetDefaultApplicationsClock(kind: c_uint, mhz: *mut c_uint);
    nvmlDeviceGetVbiosVersion(version: *mut c_char, length: c_uint);
    nvmlDeviceGetInforomImageVersion(version: *mut c_char, length: c_uint);
    nvmlDeviceGetAccountingMode(mode: *mut c_uint);
    nvmlDeviceGetRetiredPages(cause: c_uint, count: *mut c_uint, addresses: *mut c_ulonglong);
    nvmlDeviceGetRemappedRows(
        corrected: *mut c_uint,
        uncorrected: *mut c_uint,
        pending: *mut c_uint,
        failed: *mut c_uint
    );
    nvmlDeviceGetProcessUtilization(samples: *mut c_void, count: *mut c_uint, since: c_ulonglong);
}

/// Defines entry points that check the device handle and write a fixed answer about the VM's
/// one GPU (not a MIG instance, not on a multi-GPU board).
macro_rules! fixed_answers {
    ($($name:ident: $value:expr;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(d: nvmlDevice_t, out: *mut c_uint) -> NvmlReturn {
            nvml(stringify!($name), || {
                device(d)?;
                // SAFETY: `out` is an out-parameter: NULL or valid for a write.
                unsafe { write(out, $value) }
            })
        }
    )*};
}

fixed_answers! {
    nvmlDeviceIsMigDeviceHandle: 0;
    nvmlDeviceGetMultiGpuBoard: 0;
    nvmlDeviceGetComputeMode: COMPUTEMODE_DEFAULT;
    nvmlDeviceGetVirtualizationMode: VIRTUALIZATION_MODE_VGPU;
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryBusWidth(
    d: nvmlDevice_t,
    bits: *mut c_uint,
) -> NvmlReturn {
    nvml("nvmlDeviceGetMemoryBusWidth", || {
        device(d)?;
        let w = super::memory_bus_width()?;
        // SAFETY: `bits` is an out-parameter: NULL or valid for a write.
        unsafe { write(bits, w) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structures_have_nvml_h_sizes() {
        assert_eq!(std::mem::size_of::<nvmlMemory_t>(), 24);
        assert_eq!(std::mem::size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(NVML_MEMORY_V2, 0x0200_0028);
        assert_eq!(std::mem::size_of::<nvmlPciInfo_t>(), 68);
        assert_eq!(std::mem::size_of::<nvmlProcessInfo_v1_t>(), 16);
        assert_eq!(std::mem::size_of::<nvmlProcessInfo_v2_t>(), 24);
    }

    #[test]
    fn process_lists_report_the_room_needed() {
        let procs = [Process { pid: 7, memory: 1 }, Process { pid: 9, memory: 2 }];
        let entries = || procs.iter().map(process_v2).collect::<Vec<_>>();
        let mut count: c_uint = 0;
        // SAFETY: `count` is a live local; no entries are written with no room.
        let r = unsafe { write_processes(&mut count, std::ptr::null_mut(), entries()) };
        assert_eq!((r, count), (Err(ret::INSUFFICIENT_SIZE), 2));
        let mut out: Vec<_> = (0..3)
            .map(|_| process_v1(&Process { pid: 0, memory: 0 }))
            .collect();
        let v1 = procs.iter().map(process_v1).collect();
        count = 3;
        // SAFETY: `out` has room for `count` entries.
        let r = unsafe { write_processes(&mut count, out.as_mut_ptr(), v1) };
        assert_eq!((r, count), (Ok(()), 2));
        assert_eq!((out[1].pid, out[1].usedGpuMemory), (9, 2));
        assert_eq!(out[2].pid, 0, "past the list, nothing is written");
        assert_eq!(entries()[1].gpuInstanceId, c_uint::MAX);
        count = 0;
        // SAFETY: no entries to write.
        let r = unsafe {
            write_processes::<nvmlProcessInfo_v2_t>(&mut count, std::ptr::null_mut(), Vec::new())
        };
        assert_eq!((r, count), (Ok(()), 0));
        // SAFETY: a NULL count is refused before any access.
        let r = unsafe { write_processes(std::ptr::null_mut(), std::ptr::null_mut(), entries()) };
        assert_eq!(r, Err(ret::INVALID_ARGUMENT));
    }

    #[test]
    fn text_that_does_not_fit_is_insufficient_size() {
        let mut buf = [0 as c_char; 6];
        // SAFETY: `buf` is 6 bytes.
        let r = unsafe { write_text(buf.as_mut_ptr(), 6, "hello!") };
        assert_eq!(r, Err(ret::INSUFFICIENT_SIZE));
        // SAFETY: as above.
        assert_eq!(unsafe { write_text(buf.as_mut_ptr(), 6, "hello") }, Ok(()));
        // SAFETY: `buf` was just NUL-terminated.
        assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }, c"hello");
        // SAFETY: NULL is refused before any access.
        let r = unsafe { write_text(std::ptr::null_mut(), 6, "x") };
        assert_eq!(r, Err(ret::INVALID_ARGUMENT));
        let f: [c_char; 4] = fill_text("abcdef");
        assert_eq!(f.map(|c| c as u8), *b"abc\0");
    }

    #[test]
    fn cpu_lists_become_nvml_cpu_sets() {
        assert_eq!(parse_cpu_list("0-3,6"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        for bad in ["3-1", "x", "0-", "0-99999999"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad}");
        }
        let set = |cpus: &[usize], words: usize| {
            let mut s = vec![c_ulong::MAX; words];
            cpu_set(cpus, &mut s);
            s
        };
        assert_eq!(set(&[0, 1, 64, 65], 2), vec![0b11, 0b11]);
        assert_eq!(
            set(&[0, 1, 64, 65], 1),
            vec![0b11],
            "CPUs past the set are left out"
        );
        assert_eq!(set(&[63], 1), vec![1 << 63]);
    }

    #[test]
    fn only_the_vms_handle_is_a_device() {
        // Not initialized in this test process: every handle is refused the same way.
        assert_eq!(device(&raw const DEVICE), Err(ret::UNINITIALIZED));
        // SAFETY: a NULL out-pointer is refused.
        let r = unsafe { nvmlDeviceGetCount_v2(std::ptr::null_mut()) };
        assert_eq!(r, ret::UNINITIALIZED);
    }
}
