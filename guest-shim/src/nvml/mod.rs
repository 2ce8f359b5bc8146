//! NVML (`libnvidia-ml.so.1`) for vgpu guests: what the management library tells a program
//! about the GPU, from the VM's side of it.
//!
//! Tools and Python packages ask NVML, not CUDA, what GPU they have and how much of it is in
//! use (pynvml, PyTorch's device count and `torch.cuda.list_gpu_processes`, vLLM's and Ray's
//! GPU discovery, gpustat, nvitop). The shim implements NVML, and the guest's
//! `libnvidia-ml.so.1` (guest-shim/nvml) is an ELF filter whose every symbol the dynamic loader
//! resolves here, so a process that uses both has one copy of the shim and one session to
//! vgpud. NVML's answers are the VM's: the memory slice as the device's memory, the VM's
//! processes (those with a CUDA context) and the share of time the VM's kernels held the
//! device.
//!
//! Layers: [`exports`] is the C ABI, a thin wrapper over the safe functions here, which ask
//! [`crate::driver`].

pub mod events;
pub mod exports;
pub mod rest;

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Deserialize;
use vgpu_proto::cuda::{self, CuResult, attr};

use crate::driver;

/// `nvmlReturn_t`.
pub type NvmlReturn = u32;
/// A result carrying an `nvmlReturn_t` error.
pub type NvmlRes<T> = Result<T, NvmlReturn>;

/// `nvmlReturn_t` values (nvml.h).
pub mod ret {
    use super::NvmlReturn;
    pub const SUCCESS: NvmlReturn = 0;
    pub const UNINITIALIZED: NvmlReturn = 1;
    pub const INVALID_ARGUMENT: NvmlReturn = 2;
    pub const NOT_SUPPORTED: NvmlReturn = 3;
    pub const NOT_FOUND: NvmlReturn = 6;
    pub const INSUFFICIENT_SIZE: NvmlReturn = 7;
    pub const DRIVER_NOT_LOADED: NvmlReturn = 9;
    pub const TIMEOUT: NvmlReturn = 10;
    pub const GPU_IS_LOST: NvmlReturn = 15;
    pub const MEMORY: NvmlReturn = 20;
    pub const ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
    pub const UNKNOWN: NvmlReturn = 999;
}

/// `nvmlErrorString` texts, one per `nvmlReturn_t` of nvml.h.
const ERROR_STRINGS: &[(NvmlReturn, &CStr)] = &[
    (0, c"Success"),
    (1, c"Uninitialized"),
    (2, c"Invalid Argument"),
    (3, c"Not Supported"),
    (4, c"Insufficient Permissions"),
    (5, c"Already Initialized"),
    (6, c"Not Found"),
    (7, c"Insufficient Size"),
    (8, c"Insufficient External Power"),
    (9, c"Driver Not Loaded"),
    (10, c"Timeout"),
    (11, c"Interrupt Request Issue"),
    (12, c"NVML Shared Library Not Found"),
    (13, c"Function Not Found"),
    (14, c"Corrupted infoROM"),
    (15, c"GPU is lost"),
    (16, c"GPU requires restart"),
    (17, c"The operating system has blocked the request."),
    (18, c"RM has detected an NVML/RM version mismatch."),
    (19, c"In use by another client"),
    (20, c"Insufficient Memory"),
    (21, c"No data"),
    (
        22,
        c"Requested vgpu operation is not available on target device because ECC is enabled",
    ),
    (23, c"Insufficient Resources"),
    (24, c"Frequency not supported"),
    (25, c"Argument version mismatch"),
    (26, c"Deprecated"),
    (27, c"Not Ready"),
    (28, c"GPU not found"),
    (29, c"Invalid state"),
    (999, c"Unknown Error"),
];

/// `nvmlErrorString`: the text of a return code (NVIDIA's for codes it does not know).
pub fn error_string(code: NvmlReturn) -> &'static CStr {
    ERROR_STRINGS
        .iter()
        .find(|(c, _)| *c == code)
        .map_or(c"Unknown Error", |(_, s)| s)
}

/// The NVIDIA driver release whose CUDA version the shim reports
/// ([`vgpu_proto::CUDA_DRIVER_VERSION`], 13.0: the R580 branch), as NVML's
/// `nvmlSystemGetDriverVersion` gives it: programs compare it with the driver a CUDA version
/// needs.
pub const DRIVER_VERSION: &str = "580.65.06";

/// `nvmlSystemGetNVMLVersion`: the CUDA major version and the driver release, as NVIDIA's
/// library writes it ("13.580.65.06").
pub fn nvml_version() -> String {
    format!(
        "{}.{DRIVER_VERSION}",
        vgpu_proto::CUDA_DRIVER_VERSION / CUDA_MAJOR_DIVISOR
    )
}

/// `CUDA_DRIVER_VERSION / 1000` is the CUDA major version.
const CUDA_MAJOR_DIVISOR: i32 = 1000;

/// `nvmlInitWithFlags` flags: `NVML_INIT_FLAG_NO_GPUS`, `NVML_INIT_FLAG_NO_ATTACH`.
pub const INIT_FLAGS_KNOWN: u32 = 0b11;

const PERCENT: f64 = 100.0;
/// kHz (CUDA's clock attributes) per MHz (NVML's clocks).
const KHZ_PER_MHZ: i32 = 1000;

/// What one process of the VM holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// The guest's process id.
    pub pid: u32,
    /// Bytes of the slice it holds.
    pub memory: u64,
}

/// The device's memory as NVML reports it: the VM's slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub total: u64,
    pub used: u64,
}

impl Memory {
    /// Free bytes of the slice.
    pub fn free(&self) -> u64 {
        self.total.saturating_sub(self.used)
    }
}

/// The device's PCI address as the guest sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
}

impl PciAddress {
    /// NVML's bus id: an eight-digit domain ("00000000:00:05.0").
    pub fn bus_id(&self) -> String {
        format!("{:08X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }

    /// NVML's legacy bus id: a four-digit domain ("0000:00:05.0").
    pub fn bus_id_legacy(&self) -> String {
        format!("{:04X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }

    /// Reads "domain:bus:device.function" or "bus:device.function" (domain 0), hexadecimal in
    /// either case, as `nvmlDeviceGetHandleByPciBusId` accepts it.
    pub fn parse(s: &str) -> Option<PciAddress> {
        let (rest, function) = s.rsplit_once('.')?;
        let mut parts: Vec<&str> = rest.split(':').collect();
        if parts.len() == 2 {
            parts.insert(0, "0");
        }
        let [domain, bus, device] = parts[..] else {
            return None;
        };
        let hex = |t: &str| u32::from_str_radix(t, 16).ok();
        if hex(function)? != 0 {
            return None;
        }
        Some(PciAddress {
            domain: hex(domain)?,
            bus: hex(bus)?,
            device: hex(device)?,
        })
    }
}

/// `nvmlInit` calls not yet matched by `nvmlShutdown`.
static INITS: Mutex<u32> = Mutex::new(0);

fn inits() -> MutexGuard<'static, u32> {
    INITS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An NVML code for a CUDA error of the session under NVML.
fn from_cuda(code: CuResult) -> NvmlReturn {
    match code {
        cuda::CUDA_ERROR_NOT_INITIALIZED => ret::UNINITIALIZED,
        cuda::CUDA_ERROR_NO_DEVICE | cuda::CUDA_ERROR_DEVICE_UNAVAILABLE => ret::GPU_IS_LOST,
        cuda::CUDA_ERROR_OUT_OF_MEMORY => ret::MEMORY,
        _ => ret::UNKNOWN,
    }
}

/// `nvmlInitWithFlags`: connects to vgpud as `cuInit` does (once per process, one session with
/// CUDA; `CUDA_VISIBLE_DEVICES` is CUDA's business, not NVML's); counted, so that each
/// `nvmlInit` needs its `nvmlShutdown`. Without vgpud: `NVML_ERROR_DRIVER_NOT_LOADED`, as
/// NVIDIA's library answers without its driver.
pub fn init(flags: u32) -> NvmlRes<()> {
    if flags & !INIT_FLAGS_KNOWN != 0 {
        return Err(ret::INVALID_ARGUMENT);
    }
    driver::connect_session().map_err(|_| ret::DRIVER_NOT_LOADED)?;
    let mut n = inits();
    *n = n.saturating_add(1);
    Ok(())
}

/// `nvmlShutdown`: one `nvmlInit` less; the session stays for CUDA.
pub fn shutdown() -> NvmlRes<()> {
    let mut n = inits();
    if *n == 0 {
        return Err(ret::UNINITIALIZED);
    }
    *n -= 1;
    Ok(())
}

/// `NVML_ERROR_UNINITIALIZED` unless `nvmlInit` was called.
pub fn ensure_init() -> NvmlRes<()> {
    if *inits() == 0 {
        Err(ret::UNINITIALIZED)
    } else {
        Ok(())
    }
}

/// `nvmlDeviceGetCount`: the VM's one GPU.
pub fn device_count() -> NvmlRes<u32> {
    ensure_init()?;
    Ok(1)
}

/// The CUDA ordinal of NVML's device `index`: `NVML_ERROR_INVALID_ARGUMENT` past the count.
pub fn check_index(index: u32) -> NvmlRes<()> {
    if index >= device_count()? {
        return Err(ret::INVALID_ARGUMENT);
    }
    Ok(())
}

/// The session, once `nvmlInit` has run.
fn session() -> NvmlRes<&'static driver::Driver> {
    ensure_init()?;
    driver::session().map_err(from_cuda)
}

/// `nvmlDeviceGetName`: the name `cuDeviceGetName` gives.
pub fn name() -> NvmlRes<String> {
    Ok(session()?.props.name.clone())
}

/// `nvmlDeviceGetUUID`: "GPU-…", the same UUID `cuDeviceGetUuid` gives.
pub fn uuid() -> NvmlRes<String> {
    Ok(cuda::gpu_uuid_text(&session()?.props.uuid))
}

fn attribute(a: usize) -> NvmlRes<i32> {
    let a = i32::try_from(a).map_err(|_| ret::UNKNOWN)?;
    session()?.attribute(a).map_err(from_cuda)
}

fn unsigned_attribute(a: usize) -> NvmlRes<u32> {
    u32::try_from(attribute(a)?).map_err(|_| ret::UNKNOWN)
}

/// `nvmlDeviceGetPciInfo`: the address `cuDeviceGetPCIBusId` gives.
pub fn pci() -> NvmlRes<PciAddress> {
    Ok(PciAddress {
        domain: unsigned_attribute(attr::PCI_DOMAIN_ID)?,
        bus: unsigned_attribute(attr::PCI_BUS_ID)?,
        device: unsigned_attribute(attr::PCI_DEVICE_ID)?,
    })
}

/// `nvmlDeviceGetMemoryBusWidth`, in bits (`CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH`).
pub fn memory_bus_width() -> NvmlRes<u32> {
    unsigned_attribute(attr::GLOBAL_MEMORY_BUS_WIDTH)
}

/// `nvmlDeviceGetCudaComputeCapability`.
pub fn compute_capability() -> NvmlRes<(i32, i32)> {
    Ok((
        attribute(attr::COMPUTE_CAPABILITY_MAJOR)?,
        attribute(attr::COMPUTE_CAPABILITY_MINOR)?,
    ))
}

/// `nvmlDeviceArchitecture_t` values (nvml.h `NVML_DEVICE_ARCH_*`).
pub mod arch {
    pub const KEPLER: u32 = 2;
    pub const MAXWELL: u32 = 3;
    pub const PASCAL: u32 = 4;
    pub const VOLTA: u32 = 5;
    pub const TURING: u32 = 6;
    pub const AMPERE: u32 = 7;
    pub const ADA: u32 = 8;
    pub const HOPPER: u32 = 9;
    pub const UNKNOWN: u32 = 0xffff_ffff;
}

/// The NVML architecture of a compute capability.
pub fn architecture_of((major, minor): (i32, i32)) -> u32 {
    match (major, minor) {
        (3, _) => arch::KEPLER,
        (5, _) => arch::MAXWELL,
        (6, _) => arch::PASCAL,
        (7, 0..=4) => arch::VOLTA,
        (7, _) => arch::TURING,
        (8, 9) => arch::ADA,
        (8, _) => arch::AMPERE,
        (9, _) => arch::HOPPER,
        _ => arch::UNKNOWN,
    }
}

/// `nvmlDeviceGetArchitecture`.
pub fn architecture() -> NvmlRes<u32> {
    Ok(architecture_of(compute_capability()?))
}

/// `nvmlClockType_t` values.
pub mod clock {
    pub const GRAPHICS: u32 = 0;
    pub const SM: u32 = 1;
    pub const MEM: u32 = 2;
    pub const VIDEO: u32 = 3;
}

/// `nvmlDeviceGetClockInfo` and `nvmlDeviceGetMaxClockInfo`, in MHz: the clocks CUDA reports
/// (`CU_DEVICE_ATTRIBUTE_CLOCK_RATE`, `..._MEMORY_CLOCK_RATE`); the video clock is not
/// supported.
pub fn clock_mhz(kind: u32) -> NvmlRes<u32> {
    let khz = match kind {
        clock::GRAPHICS | clock::SM => attribute(attr::CLOCK_RATE)?,
        clock::MEM => attribute(attr::MEMORY_CLOCK_RATE)?,
        clock::VIDEO => return Err(ret::NOT_SUPPORTED),
        _ => return Err(ret::INVALID_ARGUMENT),
    };
    u32::try_from(khz / KHZ_PER_MHZ).map_err(|_| ret::UNKNOWN)
}

/// The VM as vgpud reports it (the tenant information `vgpu-smi` shows).
#[derive(Debug, Deserialize)]
struct TenantView {
    memory_total: u64,
    memory_used: u64,
    /// The fraction of the last second the VM's kernels held the device.
    share_1s: f64,
    sessions: Vec<SessionView>,
}

#[derive(Debug, Deserialize)]
struct SessionView {
    pid: u32,
    process: String,
    memory_used: u64,
    contexts: u64,
}

fn tenant() -> NvmlRes<TenantView> {
    ensure_init()?;
    let json = driver::tenant_info().map_err(from_cuda)?;
    serde_json::from_str(&json).map_err(|e| {
        crate::warn!("vgpud's tenant information is not what NVML expects: {e}");
        ret::UNKNOWN
    })
}

/// `nvmlDeviceGetMemoryInfo`: the VM's slice and what all its processes hold of it.
pub fn memory() -> NvmlRes<Memory> {
    let t = tenant()?;
    Ok(Memory {
        total: t.memory_total,
        used: t.memory_used,
    })
}

/// The processes of the VM that use the GPU, as NVIDIA's library lists them: those with a CUDA
/// context, one entry per process (sessions of one process added up), by process id.
fn processes_of(sessions: &[SessionView]) -> Vec<Process> {
    let mut by_pid: BTreeMap<u32, u64> = BTreeMap::new();
    for s in sessions.iter().filter(|s| s.contexts > 0) {
        let m = by_pid.entry(s.pid).or_default();
        *m = m.saturating_add(s.memory_used);
    }
    by_pid
        .into_iter()
        .map(|(pid, memory)| Process { pid, memory })
        .collect()
}

/// `nvmlDeviceGetComputeRunningProcesses`.
pub fn compute_processes() -> NvmlRes<Vec<Process>> {
    Ok(processes_of(&tenant()?.sessions))
}

/// The VM's figures from one reading: for callers that want several at once (vgpu-smi).
#[derive(Debug, Clone, PartialEq)]
pub struct Usage {
    pub memory: Memory,
    /// [`gpu_utilization`]'s figure.
    pub utilization: u32,
    /// [`compute_processes`], each with the name the process gave.
    pub processes: Vec<(Process, String)>,
}

/// [`memory`], [`gpu_utilization`] and [`compute_processes`] with their names, from one
/// `TenantInfo`.
pub fn usage() -> NvmlRes<Usage> {
    Ok(usage_of(&tenant()?))
}

fn usage_of(t: &TenantView) -> Usage {
    let processes = processes_of(&t.sessions)
        .into_iter()
        .map(|p| {
            let name = t.sessions.iter().find(|s| s.pid == p.pid);
            let name = name.map(|s| s.process.clone()).unwrap_or_default();
            (p, name)
        })
        .collect();
    Usage {
        memory: Memory {
            total: t.memory_total,
            used: t.memory_used,
        },
        utilization: percent_of(t.share_1s),
        processes,
    }
}

/// `nvmlSystemGetProcessName`: the name a process of the VM that uses vgpu gave
/// (`NVML_ERROR_NOT_FOUND` for others).
pub fn process_name(pid: u32) -> NvmlRes<String> {
    tenant()?
        .sessions
        .into_iter()
        .find(|s| s.pid == pid)
        .map(|s| s.process)
        .ok_or(ret::NOT_FOUND)
}

/// Percent of a second that a share of it is (rounded, 0 to 100).
fn percent_of(share: f64) -> u32 {
    if share.is_nan() {
        return 0;
    }
    (share.clamp(0.0, 1.0) * PERCENT).round() as u32
}

/// `nvmlDeviceGetUtilizationRates`' GPU figure: the percent of the last second that the VM's
/// kernels held the device (NVIDIA's sample period is 1/6 s to 1 s), as vgpud's scheduler
/// measures it.
pub fn gpu_utilization() -> NvmlRes<u32> {
    Ok(percent_of(tenant()?.share_1s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(pid: u32, memory_used: u64, contexts: u64) -> SessionView {
        SessionView {
            pid,
            process: format!("p{pid}"),
            memory_used,
            contexts,
        }
    }

    #[test]
    fn processes_are_those_with_a_context_one_entry_per_pid() {
        let s = [
            session(30, 5, 1),
            session(10, 7, 0),
            session(20, 1, 2),
            session(30, 6, 1),
        ];
        assert_eq!(
            processes_of(&s),
            vec![
                Process { pid: 20, memory: 1 },
                Process {
                    pid: 30,
                    memory: 11
                }
            ]
        );
        assert!(processes_of(&[session(1, 9, 0)]).is_empty());
    }

    #[test]
    fn one_reading_gives_memory_utilization_and_named_processes() {
        let t = TenantView {
            memory_total: 64,
            memory_used: 12,
            share_1s: 0.25,
            sessions: vec![session(8, 0, 0), session(7, 12, 1)],
        };
        let u = usage_of(&t);
        assert_eq!(
            u.memory,
            Memory {
                total: 64,
                used: 12
            }
        );
        assert_eq!(u.utilization, 25);
        assert_eq!(
            u.processes,
            vec![(Process { pid: 7, memory: 12 }, "p7".to_string())]
        );
    }

    #[test]
    fn utilization_is_the_share_in_whole_percent() {
        assert_eq!(percent_of(0.0), 0);
        assert_eq!(percent_of(0.254), 25);
        assert_eq!(percent_of(0.996), 100);
        assert_eq!(percent_of(1.5), 100);
        assert_eq!(percent_of(-0.1), 0);
        assert_eq!(percent_of(f64::NAN), 0);
    }

    #[test]
    fn pci_bus_ids_in_both_forms_and_parsed_back() {
        let a = PciAddress {
            domain: 0,
            bus: 0x3b,
            device: 5,
        };
        assert_eq!(a.bus_id(), "00000000:3B:05.0");
        assert_eq!(a.bus_id_legacy(), "0000:3B:05.0");
        for s in ["00000000:3B:05.0", "0000:3b:05.0", "3b:05.0"] {
            assert_eq!(PciAddress::parse(s), Some(a), "{s}");
        }
        for bad in [
            "",
            "3b:05",
            "0000:3b:05.1",
            "x:3b:05.0",
            "1:2:3:4.0",
            "0000:3b:05.0.0",
        ] {
            assert_eq!(PciAddress::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn architectures_follow_compute_capability() {
        assert_eq!(architecture_of((7, 0)), arch::VOLTA);
        assert_eq!(architecture_of((7, 5)), arch::TURING);
        assert_eq!(architecture_of((8, 0)), arch::AMPERE);
        assert_eq!(architecture_of((8, 6)), arch::AMPERE);
        assert_eq!(architecture_of((8, 9)), arch::ADA);
        assert_eq!(architecture_of((9, 0)), arch::HOPPER);
        assert_eq!(architecture_of((12, 0)), arch::UNKNOWN);
    }

    #[test]
    fn error_strings_cover_every_code_and_versions_read_like_nvidias() {
        assert_eq!(error_string(ret::SUCCESS), c"Success");
        assert_eq!(error_string(ret::NOT_SUPPORTED), c"Not Supported");
        assert_eq!(error_string(ret::DRIVER_NOT_LOADED), c"Driver Not Loaded");
        assert_eq!(error_string(12345), c"Unknown Error");
        assert_eq!(nvml_version(), format!("13.{DRIVER_VERSION}"));
        let parts: Vec<u32> = DRIVER_VERSION
            .split('.')
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(parts.len(), 3);
    }

    #[test]
    fn calls_before_init_are_uninitialized() {
        // Nothing in this test process calls nvmlInit.
        assert_eq!(device_count(), Err(ret::UNINITIALIZED));
        assert_eq!(name(), Err(ret::UNINITIALIZED));
        assert_eq!(memory(), Err(ret::UNINITIALIZED));
        assert_eq!(shutdown(), Err(ret::UNINITIALIZED));
        assert_eq!(init(0b100), Err(ret::INVALID_ARGUMENT));
    }
}
