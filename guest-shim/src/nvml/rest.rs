//! The rest of NVML's C ABI (nvml.h of CUDA 11.8, 12.9 and 13.5): every entry point a program built
//! against those headers may link, so that it loads and reads what a VM's GPU reports.
//!
//! What a VM's GPU has no figure for, or a guest may not change (the host GPU's sensors, clocks,
//! power, ECC, NVLink, MIG, accounting, encoder and frame capture sessions, and every setter), is
//! `NVML_ERROR_NOT_SUPPORTED` once the device handle is checked, as NVIDIA's library answers in a
//! vGPU guest; so are the host's vGPU management (vGPU types and instances), drain states,
//! confidential computing, system events and GPU performance monitoring samples. Handles of
//! things a VM does not have (S-class units, MIG GPU and compute instances, excluded devices) are
//! `NVML_ERROR_INVALID_ARGUMENT`. `nvmlDeviceGetFieldValues` answers each field
//! `NVML_ERROR_NOT_SUPPORTED` in the field's own result, as NVML does for fields a device lacks;
//! `nvmlDeviceGetRunningProcessDetailList` lists the VM's processes as
//! `nvmlDeviceGetComputeRunningProcesses` does.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void};

use super::exports::{
    NOT_AVAILABLE_U32, compute_processes, device, nvml, nvmlDevice_t, nvmlDeviceGetCpuAffinity,
    nvmlDeviceGetHandleByUUID, nvmlDeviceGetPciInfo_v3, nvmlPciInfo_t, write,
};
use super::{NvmlReturn, Process, ret};

/// `NVML_UUID_TYPE_ASCII` and `NVML_UUID_TYPE_BINARY`.
const UUID_TYPE_ASCII: c_uint = 1;
const UUID_TYPE_BINARY: c_uint = 2;
/// `NVML_DEVICE_UUID_ASCII_LEN`: an ASCII UUID with its NUL.
const UUID_ASCII_LEN: usize = 41;
/// `NVML_DEVICE_UUID_BINARY_LEN`.
const UUID_BINARY_LEN: usize = 16;
/// `NVML_AFFINITY_SCOPE_NODE` and `NVML_AFFINITY_SCOPE_SOCKET`.
const AFFINITY_SCOPES: [c_uint; 2] = [0, 1];
/// `nvmlGpmSupport_v1`: `NVML_STRUCT_VERSION(GpmSupport, 1)` is the version alone.
const GPM_SUPPORT_V1: c_uint = 1;
/// The bytes of `nvmlPciInfo_t` that every version of it shares (the bus id of 16 bytes, the
/// domain, bus, device, device id and subsystem id), all `nvmlDeviceGetPciInfo` and `_v2` write.
const PCI_INFO_COMMON_BYTES: usize = 36;

/// `nvmlFieldValue_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlFieldValue_t {
    pub fieldId: c_uint,
    pub scopeId: c_uint,
    pub timestamp: i64,
    pub latencyUsec: i64,
    pub valueType: c_uint,
    pub nvmlReturn: c_uint,
    pub value: u64,
}

/// `nvmlUUID_v1`: `NVML_STRUCT_VERSION(UUID, 1)`, the structure's size and 1 in the top byte.
const NVML_UUID_V1: c_uint = std::mem::size_of::<nvmlUUID_t>() as c_uint | (1 << 24);

/// `nvmlUUID_t`: a version, how the value is written, and the value (text or 16 bytes).
#[repr(C)]
pub struct nvmlUUID_t {
    pub version: c_uint,
    pub kind: c_uint,
    pub value: [u8; UUID_ASCII_LEN],
}

/// `nvmlGpmSupport_t`.
#[repr(C)]
pub struct nvmlGpmSupport_t {
    pub version: c_uint,
    pub isSupportedDevice: c_uint,
}

/// `nvmlProcessDetail_v1_t`.
#[repr(C)]
pub struct nvmlProcessDetail_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
    pub usedGpuCcProtectedMemory: u64,
}

/// `nvmlProcessDetailList_v1_t`.
#[repr(C)]
pub struct nvmlProcessDetailList_v1_t {
    pub version: c_uint,
    pub mode: c_uint,
    pub numProcArrayEntries: c_uint,
    pub procArray: *mut nvmlProcessDetail_v1_t,
}

/// `nvmlProcessDetailList_v1`: the structure's size and 1 in the top byte.
const PROCESS_DETAIL_LIST_V1: c_uint =
    std::mem::size_of::<nvmlProcessDetailList_v1_t>() as c_uint | (1 << 24);
/// `NVML_PROCESS_MODE_COMPUTE`, `_GRAPHICS` and `_MPS`.
const PROCESS_MODE_COMPUTE: c_uint = 0;
const PROCESS_MODES: c_uint = 3;

/// `nvmlDeviceGetRunningProcessDetailList`: the VM's processes with a CUDA context and the
/// slice each holds (as `nvmlDeviceGetComputeRunningProcesses`); there are no graphics or MPS
/// processes. `numProcArrayEntries` in is the room in `procArray`, out the number of processes
/// (with `NVML_ERROR_INSUFFICIENT_SIZE` when they do not fit).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRunningProcessDetailList(
    d: nvmlDevice_t,
    list: *mut nvmlProcessDetailList_v1_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetRunningProcessDetailList", || {
        device(d)?;
        // SAFETY: the caller's list when non-NULL (NVML contract); `as_mut` handles NULL.
        let l = unsafe { list.as_mut() }.ok_or(ret::INVALID_ARGUMENT)?;
        if l.version != PROCESS_DETAIL_LIST_V1 || l.mode >= PROCESS_MODES {
            return Err(ret::INVALID_ARGUMENT);
        }
        if l.mode != PROCESS_MODE_COMPUTE {
            l.numProcArrayEntries = 0;
            return Ok(());
        }
        compute_processes(
            d,
            &raw mut l.numProcArrayEntries,
            l.procArray,
            |p: &Process| nvmlProcessDetail_v1_t {
                pid: p.pid,
                usedGpuMemory: p.memory,
                gpuInstanceId: NOT_AVAILABLE_U32,
                computeInstanceId: NOT_AVAILABLE_U32,
                usedGpuCcProtectedMemory: 0,
            },
        )
    })
}

/// Answers each of `count` fields `NVML_ERROR_NOT_SUPPORTED` in its own result.
///
/// # Safety
/// `values` must be NULL or valid for reads and writes of `count` entries.
unsafe fn no_fields(
    d: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> super::NvmlRes<()> {
    device(d)?;
    let n = usize::try_from(count).map_err(|_| ret::INVALID_ARGUMENT)?;
    if n == 0 || values.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    // SAFETY: `values` has `count` entries (NVML's contract), checked non-NULL above.
    let fields = unsafe { std::slice::from_raw_parts_mut(values, n) };
    for f in fields {
        f.nvmlReturn = ret::NOT_SUPPORTED;
        f.latencyUsec = 0;
        f.timestamp = 0;
    }
    Ok(())
}

/// `nvmlDeviceGetFieldValues`: a VM's GPU reports none of NVML's fields (counters, clocks,
/// NVLink, power of the host GPU); the call succeeds with each field's own result
/// `NVML_ERROR_NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    d: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> NvmlReturn {
    // SAFETY: the caller's array of `count` fields (NVML contract).
    nvml("nvmlDeviceGetFieldValues", || unsafe {
        no_fields(d, count, values)
    })
}

/// `nvmlDeviceClearFieldValues`: as [`nvmlDeviceGetFieldValues`], nothing to clear.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceClearFieldValues(
    d: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> NvmlReturn {
    // SAFETY: the caller's array of `count` fields (NVML contract).
    nvml("nvmlDeviceClearFieldValues", || unsafe {
        no_fields(d, count, values)
    })
}

/// The PCI information of the first versions: the part every version of `nvmlPciInfo_t` shares.
///
/// # Safety
/// `pci` must be NULL or valid for writes of that part.
unsafe fn pci_info_common(d: nvmlDevice_t, pci: *mut c_void) -> NvmlReturn {
    let mut full = std::mem::MaybeUninit::<nvmlPciInfo_t>::zeroed();
    // SAFETY: `full` is valid for a write of the whole structure.
    let r = unsafe { nvmlDeviceGetPciInfo_v3(d, full.as_mut_ptr()) };
    if r != ret::SUCCESS {
        return r;
    }
    if pci.is_null() {
        return ret::INVALID_ARGUMENT;
    }
    // SAFETY: `pci` has room for the shared part (NVML's contract for the older versions), and
    // `full` holds at least as many initialized bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            full.as_ptr().cast::<u8>(),
            pci.cast::<u8>(),
            PCI_INFO_COMMON_BYTES,
        )
    };
    ret::SUCCESS
}

/// `nvmlDeviceGetPciInfo` (the first version).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(d: nvmlDevice_t, pci: *mut c_void) -> NvmlReturn {
    // SAFETY: the caller's structure of that version (NVML contract).
    unsafe { pci_info_common(d, pci) }
}

/// `nvmlDeviceGetPciInfo_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(d: nvmlDevice_t, pci: *mut c_void) -> NvmlReturn {
    // SAFETY: the caller's structure of that version (NVML contract).
    unsafe { pci_info_common(d, pci) }
}

/// `nvmlDeviceGetHandleBySerial`: a VM's GPU has no serial number, so none names it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    out: *mut nvmlDevice_t,
) -> NvmlReturn {
    nvml("nvmlDeviceGetHandleBySerial", || {
        super::ensure_init()?;
        if serial.is_null() || out.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        Err(ret::NOT_FOUND)
    })
}

/// `nvmlDeviceGetHandleByUUIDV`: the UUID as text or as its 16 bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUIDV(
    uuid: *const nvmlUUID_t,
    out: *mut nvmlDevice_t,
) -> NvmlReturn {
    // SAFETY: the caller's UUID when non-NULL (NVML contract); `as_ref` handles NULL.
    let Some(u) = (unsafe { uuid.as_ref() }) else {
        return ret::INVALID_ARGUMENT;
    };
    if u.version != NVML_UUID_V1 {
        return ret::ARGUMENT_VERSION_MISMATCH;
    }
    let text = match u.kind {
        UUID_TYPE_ASCII => {
            let mut t = u.value;
            t[UUID_ASCII_LEN - 1] = 0;
            t.to_vec()
        }
        UUID_TYPE_BINARY => {
            let mut bytes = [0u8; UUID_BINARY_LEN];
            bytes.copy_from_slice(&u.value[..UUID_BINARY_LEN]);
            let mut text = vgpu_proto::cuda::gpu_uuid_text(&bytes).into_bytes();
            text.push(0);
            text
        }
        _ => return ret::INVALID_ARGUMENT,
    };
    // SAFETY: `text` is NUL-terminated and outlives the call.
    unsafe { nvmlDeviceGetHandleByUUID(text.as_ptr().cast(), out) }
}

/// `nvmlDeviceGetCpuAffinityWithinScope`: the CPUs near the GPU, by node or socket; a VM's GPU
/// is near all of the guest's CPUs, as `nvmlDeviceGetCpuAffinity` says.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinityWithinScope(
    d: nvmlDevice_t,
    size: c_uint,
    set: *mut c_ulong,
    scope: c_uint,
) -> NvmlReturn {
    if !AFFINITY_SCOPES.contains(&scope) {
        return nvml("nvmlDeviceGetCpuAffinityWithinScope", || {
            Err(ret::INVALID_ARGUMENT)
        });
    }
    // SAFETY: the same contract as nvmlDeviceGetCpuAffinity's.
    unsafe { nvmlDeviceGetCpuAffinity(d, size, set) }
}

/// Checks two device handles, then answers `NVML_ERROR_NOT_SUPPORTED`: a VM has one GPU and
/// no topology to report between GPUs.
fn two_devices(a: nvmlDevice_t, b: nvmlDevice_t) -> super::NvmlRes<()> {
    device(a)?;
    device(b)?;
    Err(ret::NOT_SUPPORTED)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceOnSameBoard(
    a: nvmlDevice_t,
    b: nvmlDevice_t,
    _same: *mut c_int,
) -> NvmlReturn {
    nvml("nvmlDeviceOnSameBoard", || two_devices(a, b))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    a: nvmlDevice_t,
    b: nvmlDevice_t,
    _path: *mut c_uint,
) -> NvmlReturn {
    nvml("nvmlDeviceGetTopologyCommonAncestor", || two_devices(a, b))
}

/// `nvmlGpmQueryDeviceSupport`: a VM's GPU has no performance monitoring samples.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    d: nvmlDevice_t,
    support: *mut nvmlGpmSupport_t,
) -> NvmlReturn {
    nvml("nvmlGpmQueryDeviceSupport", || {
        device(d)?;
        // SAFETY: the caller's structure when non-NULL (NVML contract); `as_mut` handles NULL.
        let s = unsafe { support.as_mut() }.ok_or(ret::INVALID_ARGUMENT)?;
        if s.version != GPM_SUPPORT_V1 {
            return Err(ret::ARGUMENT_VERSION_MISMATCH);
        }
        s.isSupportedDevice = 0;
        Ok(())
    })
}

/// `nvmlGetExcludedDeviceCount`: no GPU is excluded from a VM's NVML.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGetExcludedDeviceCount(count: *mut c_uint) -> NvmlReturn {
    nvml("nvmlGetExcludedDeviceCount", || {
        super::ensure_init()?;
        // SAFETY: `count` is an out-parameter: NULL or valid for a write.
        unsafe { write(count, 0) }
    })
}

/// `nvmlSystemGetHicVersion`: a VM has no host interface cards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetHicVersion(
    count: *mut c_uint,
    _entries: *mut c_void,
) -> NvmlReturn {
    nvml("nvmlSystemGetHicVersion", || {
        super::ensure_init()?;
        // SAFETY: `count` is an out-parameter: NULL or valid for a write.
        unsafe { write(count, 0) }
    })
}

/// Defines entry points that check the device handle and answer `NVML_ERROR_NOT_SUPPORTED`
/// (their other arguments are not read).
macro_rules! device_not_supported {
    ($($name:ident)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: not reported for a VM's GPU.")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(d: nvmlDevice_t) -> NvmlReturn {
            nvml(stringify!($name), || {
                device(d)?;
                Err(ret::NOT_SUPPORTED)
            })
        }
    )*};
}

/// Defines entry points that need an initialized NVML and then answer `$code`.
macro_rules! answer {
    ($code:expr, $why:literal: $($name:ident)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: ", $why)]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> NvmlReturn {
            nvml(stringify!($name), || {
                super::ensure_init()?;
                Err($code)
            })
        }
    )*};
}

device_not_supported! {
    nvmlDeviceClearAccountingPids
    nvmlDeviceClearCpuAffinity
    nvmlDeviceClearEccErrorCounts
    nvmlDeviceCreateGpuInstance
    nvmlDeviceCreateGpuInstanceWithPlacement
    nvmlDeviceFreezeNvLinkUtilizationCounter
    nvmlDeviceGetAPIRestriction
    nvmlDeviceGetAccountingBufferSize
    nvmlDeviceGetAccountingPids
    nvmlDeviceGetAccountingStats
    nvmlDeviceGetActiveVgpus
    nvmlDeviceGetAdaptiveClockInfoStatus
    nvmlDeviceGetAttributes
    nvmlDeviceGetAttributes_v2
    nvmlDeviceGetAutoBoostedClocksEnabled
    nvmlDeviceGetBoardId
    nvmlDeviceGetBoardPartNumber
    nvmlDeviceGetBridgeChipInfo
    nvmlDeviceGetBusType
    nvmlDeviceGetC2cModeInfoV
    nvmlDeviceGetCapabilities
    nvmlDeviceGetClkMonStatus
    nvmlDeviceGetClockOffsets
    nvmlDeviceGetConfComputeGpuAttestationReport
    nvmlDeviceGetConfComputeGpuCertificate
    nvmlDeviceGetConfComputeMemSizeInfo
    nvmlDeviceGetConfComputeProtectedMemoryUsage
    nvmlDeviceGetCoolerInfo
    nvmlDeviceGetCreatableVgpus
    nvmlDeviceGetCurrentClockFreqs
    nvmlDeviceGetDefaultEccMode
    nvmlDeviceGetDetailedEccErrors
    nvmlDeviceGetDramEncryptionMode
    nvmlDeviceGetDriverModel
    nvmlDeviceGetDriverModel_v2
    nvmlDeviceGetDynamicPstatesInfo
    nvmlDeviceGetEncoderCapacity
    nvmlDeviceGetEncoderSessions
    nvmlDeviceGetEncoderStats
    nvmlDeviceGetFBCSessions
    nvmlDeviceGetFBCStats
    nvmlDeviceGetFanControlPolicy_v2
    nvmlDeviceGetFanSpeedRPM
    nvmlDeviceGetGpcClkMinMaxVfOffset
    nvmlDeviceGetGpcClkVfOffset
    nvmlDeviceGetGpuInstanceById
    nvmlDeviceGetGpuInstancePossiblePlacements
    nvmlDeviceGetGpuInstancePossiblePlacements_v2
    nvmlDeviceGetGpuInstanceProfileInfo
    nvmlDeviceGetGpuInstanceProfileInfoV
    nvmlDeviceGetGpuInstanceRemainingCapacity
    nvmlDeviceGetGpuInstances
    nvmlDeviceGetGpuMaxPcieLinkGeneration
    nvmlDeviceGetGpuOperationMode
    nvmlDeviceGetGridLicensableFeatures
    nvmlDeviceGetGridLicensableFeatures_v2
    nvmlDeviceGetGridLicensableFeatures_v3
    nvmlDeviceGetGridLicensableFeatures_v4
    nvmlDeviceGetGspFirmwareMode
    nvmlDeviceGetGspFirmwareVersion
    nvmlDeviceGetHostVgpuMode
    nvmlDeviceGetInforomConfigurationChecksum
    nvmlDeviceGetInforomVersion
    nvmlDeviceGetIrqNum
    nvmlDeviceGetJpgUtilization
    nvmlDeviceGetLastBBXFlushTime
    nvmlDeviceGetMarginTemperature
    nvmlDeviceGetMaxCustomerBoostClock
    nvmlDeviceGetMemClkMinMaxVfOffset
    nvmlDeviceGetMemClkVfOffset
    nvmlDeviceGetMemoryAffinity
    nvmlDeviceGetMemoryErrorCounter
    nvmlDeviceGetMinMaxClockOfPState
    nvmlDeviceGetMinMaxFanSpeed
    nvmlDeviceGetModuleId
    nvmlDeviceGetNumGpuCores
    nvmlDeviceGetNumaNodeId
    nvmlDeviceGetNvLinkCapability
    nvmlDeviceGetNvLinkErrorCounter
    nvmlDeviceGetNvLinkUtilizationControl
    nvmlDeviceGetNvLinkUtilizationCounter
    nvmlDeviceGetNvLinkVersion
    nvmlDeviceGetNvlinkBwMode
    nvmlDeviceGetNvlinkSupportedBwModes
    nvmlDeviceGetOfaUtilization
    nvmlDeviceGetPciInfoExt
    nvmlDeviceGetPcieLinkMaxSpeed
    nvmlDeviceGetPcieReplayCounter
    nvmlDeviceGetPcieSpeed
    nvmlDeviceGetPerformanceModes
    nvmlDeviceGetPgpuMetadataString
    nvmlDeviceGetPlatformInfo
    nvmlDeviceGetPowerManagementMode
    nvmlDeviceGetPowerMode
    nvmlDeviceGetPowerSource
    nvmlDeviceGetProcessesUtilizationInfo
    nvmlDeviceGetRetiredPagesPendingStatus
    nvmlDeviceGetRetiredPages_v2
    nvmlDeviceGetRowRemapperHistogram
    nvmlDeviceGetSamples
    nvmlDeviceGetSramEccErrorStatus
    nvmlDeviceGetSupportedClocksEventReasons
    nvmlDeviceGetSupportedClocksThrottleReasons
    nvmlDeviceGetSupportedGraphicsClocks
    nvmlDeviceGetSupportedMemoryClocks
    nvmlDeviceGetSupportedPerformanceStates
    nvmlDeviceGetSupportedPowerModes
    nvmlDeviceGetSupportedVgpus
    nvmlDeviceGetTargetFanSpeed
    nvmlDeviceGetTemperatureV
    nvmlDeviceGetThermalSettings
    nvmlDeviceGetTopologyNearestGpus
    nvmlDeviceGetVgpuCapabilities
    nvmlDeviceGetVgpuHeterogeneousMode
    nvmlDeviceGetVgpuInstancesUtilizationInfo
    nvmlDeviceGetVgpuMetadata
    nvmlDeviceGetVgpuProcessUtilization
    nvmlDeviceGetVgpuProcessesUtilizationInfo
    nvmlDeviceGetVgpuSchedulerCapabilities
    nvmlDeviceGetVgpuSchedulerLog
    nvmlDeviceGetVgpuSchedulerState
    nvmlDeviceGetVgpuTypeCreatablePlacements
    nvmlDeviceGetVgpuTypeSupportedPlacements
    nvmlDeviceGetVgpuUtilization
    nvmlDeviceGetViolationStatus
    nvmlDevicePowerSmoothingActivatePresetProfile
    nvmlDevicePowerSmoothingUpdatePresetProfileParam
    nvmlDeviceResetApplicationsClocks
    nvmlDeviceResetGpuLockedClocks
    nvmlDeviceResetMemoryLockedClocks
    nvmlDeviceResetNvLinkErrorCounters
    nvmlDeviceResetNvLinkUtilizationCounter
    nvmlDeviceSetAPIRestriction
    nvmlDeviceSetAccountingMode
    nvmlDeviceSetApplicationsClocks
    nvmlDeviceSetAutoBoostedClocksEnabled
    nvmlDeviceSetClockOffsets
    nvmlDeviceSetComputeMode
    nvmlDeviceSetConfComputeUnprotectedMemSize
    nvmlDeviceSetCpuAffinity
    nvmlDeviceSetDefaultAutoBoostedClocksEnabled
    nvmlDeviceSetDefaultFanSpeed_v2
    nvmlDeviceSetDramEncryptionMode
    nvmlDeviceSetDriverModel
    nvmlDeviceSetEccMode
    nvmlDeviceSetFanControlPolicy
    nvmlDeviceSetFanSpeed_v2
    nvmlDeviceSetGpcClkVfOffset
    nvmlDeviceSetGpuLockedClocks
    nvmlDeviceSetGpuOperationMode
    nvmlDeviceSetMemClkVfOffset
    nvmlDeviceSetMemoryLockedClocks
    nvmlDeviceSetMigMode
    nvmlDeviceSetNvLinkDeviceLowPowerThreshold
    nvmlDeviceSetNvLinkUtilizationControl
    nvmlDeviceSetNvlinkBwMode
    nvmlDeviceSetPersistenceMode
    nvmlDeviceSetPowerManagementLimit
    nvmlDeviceSetPowerManagementLimit_v2
    nvmlDeviceSetPowerMode
    nvmlDeviceSetTemperatureThreshold
    nvmlDeviceSetVgpuCapabilities
    nvmlDeviceSetVgpuHeterogeneousMode
    nvmlDeviceSetVgpuSchedulerState
    nvmlDeviceSetVirtualizationMode
    nvmlDeviceValidateInforom
    nvmlDeviceWorkloadPowerProfileClearRequestedProfiles
    nvmlDeviceWorkloadPowerProfileGetCurrentProfiles
    nvmlDeviceWorkloadPowerProfileGetProfilesInfo
    nvmlDeviceWorkloadPowerProfileSetRequestedProfiles
    nvmlGpmMigSampleGet
    nvmlGpmQueryIfStreamingEnabled
    nvmlGpmSampleGet
    nvmlGpmSetStreamingEnabled
    nvmlVgpuTypeGetMaxInstances
    // CUDA 13's nvml.h (13.5), and one pynvml 13.580 resolves that no header declares.
    nvmlDevicePowerSmoothingSetState
    nvmlDeviceGetAccountingStats_v2
    nvmlDeviceGetAdaptiveTgpModeInfo_v1
    nvmlDeviceGetAddressingMode
    nvmlDeviceGetBBXTimeData_v1
    nvmlDeviceGetBankRemapperStatus_v1
    nvmlDeviceGetGpuFabricInfo_v4
    nvmlDeviceGetGpuInstanceProfileInfoByIdV
    nvmlDeviceGetGpuUptime_v1
    nvmlDeviceGetHostname_v1
    nvmlDeviceGetMemoryLimits_v1
    nvmlDeviceGetNvLinkInfo
    nvmlDeviceGetNvLinkInfo_v3
    nvmlDeviceGetNvLinkTelemetrySamples_v1
    nvmlDeviceGetNvlinkNvlePrivateInfo_v1
    nvmlDeviceGetNvlinkRemapTableInfo_v1
    nvmlDeviceGetPdi
    nvmlDeviceGetPowerMizerMode_v1
    nvmlDeviceGetRemappedRows_v2
    nvmlDeviceGetRepairStatus
    nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts
    nvmlDeviceGetUnrepairableMemoryFlag_v1
    nvmlDeviceGetVgpuSchedulerLog_v2
    nvmlDeviceGetVgpuSchedulerState_v2
    nvmlDeviceLockNvlinkRemapTable_v1
    nvmlDevicePerfMetricsGetSamples_v1
    nvmlDeviceReadPRMCounters_v1
    nvmlDeviceReadWritePRM_v1
    nvmlDeviceSetAdaptiveTgpMode_v1
    nvmlDeviceSetHostname_v1
    nvmlDeviceSetMemoryLimits_v1
    nvmlDeviceSetNvlinkBwModeAsync_v1
    nvmlDeviceSetNvlinkNvleReady_v1
    nvmlDeviceSetPowerMizerMode_v1
    nvmlDeviceSetRusdSettings_v1
    nvmlDeviceSetVgpuSchedulerState_v2
    nvmlDeviceSetupNvlinkNvleEncryptionKey_v1
    nvmlDeviceVgpuForceGspUnload
    nvmlDeviceWorkloadPowerProfileUpdateProfiles_v1
}

answer! {
    ret::NOT_SUPPORTED,
    "the host's vGPU management, drain states, confidential computing, system events and \
     performance monitoring samples are not a guest's.":
    nvmlGetVgpuCompatibility
    nvmlGetVgpuDriverCapabilities
    nvmlGetVgpuVersion
    nvmlGpmMetricsGet
    nvmlGpmSampleAlloc
    nvmlGpmSampleFree
    nvmlSetVgpuVersion
    nvmlSystemEventSetCreate
    nvmlSystemEventSetFree
    nvmlSystemEventSetWait
    nvmlSystemGetConfComputeCapabilities
    nvmlSystemGetConfComputeGpusReadyState
    nvmlSystemGetConfComputeKeyRotationThresholdInfo
    nvmlSystemGetConfComputeSettings
    nvmlSystemGetConfComputeState
    nvmlSystemGetDriverBranch
    nvmlSystemGetNvlinkBwMode
    nvmlSystemGetTopologyGpuSet
    nvmlSystemRegisterEvents
    nvmlSystemSetConfComputeGpusReadyState
    nvmlSystemSetConfComputeKeyRotationThresholdInfo
    nvmlSystemSetNvlinkBwMode
    nvmlVgpuInstanceClearAccountingPids
    nvmlVgpuInstanceGetAccountingMode
    nvmlVgpuInstanceGetAccountingPids
    nvmlVgpuInstanceGetAccountingStats
    nvmlVgpuInstanceGetEccMode
    nvmlVgpuInstanceGetEncoderCapacity
    nvmlVgpuInstanceGetEncoderSessions
    nvmlVgpuInstanceGetEncoderStats
    nvmlVgpuInstanceGetFBCSessions
    nvmlVgpuInstanceGetFBCStats
    nvmlVgpuInstanceGetFbUsage
    nvmlVgpuInstanceGetFrameRateLimit
    nvmlVgpuInstanceGetGpuInstanceId
    nvmlVgpuInstanceGetGpuPciId
    nvmlVgpuInstanceGetLicenseInfo
    nvmlVgpuInstanceGetLicenseInfo_v2
    nvmlVgpuInstanceGetLicenseStatus
    nvmlVgpuInstanceGetMdevUUID
    nvmlVgpuInstanceGetMetadata
    nvmlVgpuInstanceGetPlacementId
    nvmlVgpuInstanceGetRuntimeStateSize
    nvmlVgpuInstanceGetType
    nvmlVgpuInstanceGetUUID
    nvmlVgpuInstanceGetVmDriverVersion
    nvmlVgpuInstanceGetVmID
    nvmlVgpuInstanceSetEncoderCapacity
    nvmlVgpuTypeGetBAR1Info
    nvmlVgpuTypeGetCapabilities
    nvmlVgpuTypeGetClass
    nvmlVgpuTypeGetDeviceID
    nvmlVgpuTypeGetFbReservation
    nvmlVgpuTypeGetFrameRateLimit
    nvmlVgpuTypeGetFramebufferSize
    nvmlVgpuTypeGetGpuInstanceProfileId
    nvmlVgpuTypeGetGspHeapSize
    nvmlVgpuTypeGetLicense
    nvmlVgpuTypeGetMaxInstancesPerGpuInstance
    nvmlVgpuTypeGetMaxInstancesPerVm
    nvmlVgpuTypeGetName
    nvmlVgpuTypeGetNumDisplayHeads
    nvmlVgpuTypeGetResolution
    nvmlDeviceDiscoverGpus
    nvmlDeviceModifyDrainState
    nvmlDeviceQueryDrainState
    nvmlDeviceRemoveGpu
    nvmlDeviceRemoveGpu_v2
    nvmlSystemGetCPER_v1
    nvmlSystemGetConfComputeSettings_v2
}

answer! {
    ret::INVALID_ARGUMENT,
    "a VM has no S-class units, MIG GPU or compute instances, or excluded devices, so no handle \
     or index names one.":
    nvmlComputeInstanceDestroy
    nvmlComputeInstanceGetInfo
    nvmlComputeInstanceGetInfo_v2
    nvmlGetExcludedDeviceInfoByIndex
    nvmlGpuInstanceCreateComputeInstance
    nvmlGpuInstanceCreateComputeInstanceWithPlacement
    nvmlGpuInstanceDestroy
    nvmlGpuInstanceGetActiveVgpus
    nvmlGpuInstanceGetComputeInstanceById
    nvmlGpuInstanceGetComputeInstancePossiblePlacements
    nvmlGpuInstanceGetComputeInstanceProfileInfo
    nvmlGpuInstanceGetComputeInstanceProfileInfoV
    nvmlGpuInstanceGetComputeInstanceRemainingCapacity
    nvmlGpuInstanceGetComputeInstances
    nvmlGpuInstanceGetCreatableVgpus
    nvmlGpuInstanceGetInfo
    nvmlGpuInstanceGetVgpuHeterogeneousMode
    nvmlGpuInstanceGetVgpuSchedulerLog
    nvmlGpuInstanceGetVgpuSchedulerState
    nvmlGpuInstanceGetVgpuTypeCreatablePlacements
    nvmlGpuInstanceSetVgpuHeterogeneousMode
    nvmlGpuInstanceSetVgpuSchedulerState
    nvmlUnitGetDevices
    nvmlUnitGetFanSpeedInfo
    nvmlUnitGetHandleByIndex
    nvmlUnitGetLedState
    nvmlUnitGetPsuInfo
    nvmlUnitGetTemperature
    nvmlUnitGetUnitInfo
    nvmlUnitSetLedState
    nvmlGpuInstanceGetVgpuSchedulerLog_v2
    nvmlGpuInstanceGetVgpuSchedulerState_v2
    nvmlGpuInstanceSetVgpuSchedulerState_v2
}

/// Defines entry points that check the event set and answer `NVML_ERROR_NOT_SUPPORTED`: CUDA
/// 13.5's GPU operational events (and their contexts, and the wait that returns them) are the
/// host GPU's; `nvmlEventSetWait_v2` waits on a VM's sets.
macro_rules! event_set_not_supported {
    ($($name:ident)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: the host GPU's operational events.")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(set: *mut c_void) -> NvmlReturn {
            nvml(stringify!($name), || {
                super::events::check(set as usize)?;
                Err(ret::NOT_SUPPORTED)
            })
        }
    )*};
}

event_set_not_supported! {
    nvmlEventSetGetContextCount_v1
    nvmlEventSetGetContextData_v1
    nvmlEventSetGetContextInfo_v1
    nvmlEventSetGetGpuOperationalEventContextLegacyXid_v1
    nvmlEventSetRegisterGpuOperationalEvents_v1
    nvmlEventSetWait_v3
}
