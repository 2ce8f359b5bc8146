"""pynvml (nvidia-ml-py, NVIDIA's Python binding of NVML) on vgpu: the VM's GPU as NVML reports
it agrees with what CUDA reports (cuda-python's driver API in the same process), the memory slice
and this process's share of it, the errors NVML gives for what a VM's GPU cannot answer, and one
copy of the library (libcuda.so.1 and libnvidia-ml.so.1 are one file) in the process.
Usage: nvml_pynvml.py SLICE_BYTES. Prints PASS when every check holds.
"""
import ctypes
import os
import sys

import pynvml as nvml
from cuda.bindings import driver

MIB = 1 << 20
MINE = 32 * MIB


def check(what, got, want):
    if got != want:
        print(f"FAIL {what}: got {got!r}, want {want!r}")
        sys.exit(1)
    print(f"ok {what}")


def cu(result):
    err, *rest = result
    if err != driver.CUresult.CUDA_SUCCESS:
        print(f"FAIL a CUDA call: {err}")
        sys.exit(1)
    return rest[0] if len(rest) == 1 else rest


def raises(what, error, fn, *args):
    try:
        fn(*args)
    except error:
        print(f"ok {what}")
        return
    except nvml.NVMLError as e:
        print(f"FAIL {what}: {e!r}")
        sys.exit(1)
    print(f"FAIL {what}: no error")
    sys.exit(1)


def mappings_of(name):
    """Files mapped at offset 0 whose path ends with `name` (one per loaded copy)."""
    with open("/proc/self/maps") as f:
        rows = [line.split() for line in f]
    return [r[5] for r in rows if len(r) >= 6 and r[2] == "00000000" and r[5].endswith(name)]


def main():
    slice_bytes = int(sys.argv[1])
    raises("a call before nvmlInit", nvml.NVMLError_Uninitialized, nvml.nvmlDeviceGetCount)
    nvml.nvmlInit()
    cu(driver.cuInit(0))
    check("device count", nvml.nvmlDeviceGetCount(), cu(driver.cuDeviceGetCount()))
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    dev = cu(driver.cuDeviceGet(0))
    check("name", nvml.nvmlDeviceGetName(h), cu(driver.cuDeviceGetName(256, dev)).split(b"\0")[0].decode())
    uuid = cu(driver.cuDeviceGetUuid(dev)).bytes.hex()
    want = f"GPU-{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:]}"
    check("uuid", nvml.nvmlDeviceGetUUID(h), want)
    major = cu(driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = cu(driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    check("compute capability", nvml.nvmlDeviceGetCudaComputeCapability(h), (major, minor))
    check("CUDA driver version", nvml.nvmlSystemGetCudaDriverVersion(), cu(driver.cuDriverGetVersion()))
    check("driver version is major.minor.patch", len(nvml.nvmlSystemGetDriverVersion().split(".")), 3)
    bus = cu(driver.cuDeviceGetPCIBusId(13, dev)).split(b"\0")[0].decode()
    check("PCI bus id (legacy form)", nvml.nvmlDeviceGetPciInfo(h).busIdLegacy, bus)
    same = ctypes.cast(nvml.nvmlDeviceGetHandleByPciBusId(bus), ctypes.c_void_p).value
    check("the same handle by PCI bus id", same, ctypes.cast(h, ctypes.c_void_p).value)

    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    check("total memory is the slice", mem.total, slice_bytes)
    check("nothing used yet", (mem.used, mem.free), (0, slice_bytes))
    check("no processes before a context", nvml.nvmlDeviceGetComputeRunningProcesses(h), [])
    ctx = cu(driver.cuCtxCreate(0, dev))
    ptr = cu(driver.cuMemAlloc(MINE))
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
    check("this process is listed", [p.pid for p in procs], [os.getpid()])
    check("with its memory", procs[0].usedGpuMemory, MINE)
    mem = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
    check("used and free after cuMemAlloc", (mem.used, mem.free), (MINE, slice_bytes - MINE))
    free, total = cu(driver.cuMemGetInfo())
    check("NVML's free memory is CUDA's", (mem.free, mem.total), (free, total))
    check("utilization is a percentage", 0 <= nvml.nvmlDeviceGetUtilizationRates(h).gpu <= 100, True)

    raises("index past the count", nvml.NVMLError_InvalidArgument, nvml.nvmlDeviceGetHandleByIndex, 1)
    raises("temperature", nvml.NVMLError_NotSupported, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
    raises("power", nvml.NVMLError_NotSupported, nvml.nvmlDeviceGetPowerUsage, h)
    raises("MIG mode", nvml.NVMLError_NotSupported, nvml.nvmlDeviceGetMigMode, h)
    check("no MIG devices under the GPU", nvml.nvmlDeviceGetMaxMigDeviceCount(h), 0)
    raises("a MIG device handle", nvml.NVMLError_NotSupported, nvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 0)
    check("brand", nvml.nvmlDeviceGetBrand(h), nvml.NVML_BRAND_NVIDIA_VCS)
    cpus = sum(bin(word).count("1") for word in nvml.nvmlDeviceGetCpuAffinity(h, 4))
    check("every online CPU is near the GPU", cpus, os.cpu_count())
    check("units", nvml.nvmlUnitGetCount(), 0)
    # Device events, as a device plugin's health check asks for them: none on a VM's GPU.
    check("supported event types", nvml.nvmlDeviceGetSupportedEventTypes(h), 0)
    events = nvml.nvmlEventSetCreate()
    raises("registering Xid events", nvml.NVMLError_NotSupported, nvml.nvmlDeviceRegisterEvents,
           h, nvml.nvmlEventTypeXidCriticalError, events)
    raises("waiting for an event", nvml.NVMLError_Timeout, nvml.nvmlEventSetWait, events, 10)
    nvml.nvmlEventSetFree(events)

    check("one copy of the library in the process", len(mappings_of("libcuda.so")), 1)

    cu(driver.cuMemFree(ptr))
    cu(driver.cuCtxDestroy(ctx))
    check("no processes once the context is gone", nvml.nvmlDeviceGetComputeRunningProcesses(h), [])
    nvml.nvmlShutdown()
    raises("a call after nvmlShutdown", nvml.NVMLError_Uninitialized, nvml.nvmlDeviceGetCount)
    print("PASS")


if __name__ == "__main__":
    main()
