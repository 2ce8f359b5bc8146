/*
 * NVML on vgpu: a program built against NVIDIA's nvml.h and linked with -lnvidia-ml asks the
 * guest's libnvidia-ml.so.1 about its GPU and gets the VM's answers, the same as CUDA's: name,
 * UUID, PCI address, compute capability, the memory slice and what is used of it, the processes
 * of the VM with a context (this one and a child it starts), the share of time the VM's kernels
 * held the device, and NVML's errors for what it cannot answer.
 *
 *   nvml PTX ITERS     the checks (PTX: bench/kernels/spin.ptx, ITERS its first loop count)
 *   nvml nodaemon      nvmlInit without vgpud: NVML_ERROR_DRIVER_NOT_LOADED
 *
 * Prints "ok <what>" or "FAIL <what>"; the exit status is the number of failures.
 */
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

/* CUDA 12.2's name for nvmlDeviceGetCurrentClocksThrottleReasons (newer than this nvml.h). */
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t, unsigned long long *);
/* CUDA 12's handle by a versioned UUID structure (newer than this nvml.h). */
nvmlReturn_t nvmlDeviceGetHandleByUUIDV(const void *, nvmlDevice_t *);
/* CUDA 12's process detail list (newer than this nvml.h). */
nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t, void *);
/* CUDA 13.5's wait for operational events (newer than this nvml.h). */
nvmlReturn_t nvmlEventSetWait_v3(nvmlEventSet_t, void *);
/* The first nvmlDeviceGetPciInfo, which nvml.h's macro renames to the current one. */
nvmlReturn_t nvmlDeviceGetPciInfo_v1(nvmlDevice_t, void *) __asm__("nvmlDeviceGetPciInfo");

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;

CUresult cuInit(unsigned int);
CUresult cuDriverGetVersion(int *);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGetName(char *, int, int);
CUresult cuDeviceGetUuid(unsigned char *, int);
CUresult cuDeviceGetPCIBusId(char *, int, int);
CUresult cuDeviceGetAttribute(int *, int, int);
CUresult cuDeviceTotalMem_v2(size_t *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, int);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuStreamQuery(CUstream);

#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define CUDA_ERROR_NOT_READY 600
#define MIB (1ull << 20)
#define MINE (16 * MIB)
#define CHILDS (8 * MIB)
/* Utilization (the share of the last second): how long a kernel has run when it is measured,
 * how long after the last kernel the device counts as idle, the tries with longer kernels. */
#define RUNNING_MS 700
#define IDLE_MS 1200
#define KERNEL_TRIES 6
#define BUSY_PERCENT_MIN 50
#define EXIT_POLLS 100

static void check_nvml(const char *what, nvmlReturn_t got, nvmlReturn_t want) {
    if (got == want) {
        printf("ok %s\n", what);
    } else {
        printf("FAIL %s: got %d (%s), want %d (%s)\n", what, got, nvmlErrorString(got), want,
               nvmlErrorString(want));
        failures++;
    }
    fflush(stdout);
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n + 1);
    if (!b || fread(b, 1, n, f) != (size_t)n) { perror(path); exit(2); }
    b[n] = 0;
    fclose(f);
    return b;
}

/* The child: waits for `go`, takes a context and CHILDS bytes, says so on `ready`, and keeps
 * them until `go` closes. */
static void child(int go, int ready) {
    char c;
    if (read(go, &c, 1) != 1) _exit(3);
    CUcontext ctx;
    CUdeviceptr p;
    if (cuInit(0) || cuCtxCreate_v2(&ctx, 0, 0) || cuMemAlloc_v2(&p, CHILDS)) _exit(4);
    if (write(ready, "r", 1) != 1) _exit(5);
    while (read(go, &c, 1) > 0) {
    }
    _exit(0);
}

/* The VM's processes as NVML lists them (at most 8). */
static unsigned processes(nvmlDevice_t dev, nvmlProcessInfo_t *out) {
    unsigned n = 8;
    nvmlReturn_t r = nvmlDeviceGetComputeRunningProcesses(dev, &n, out);
    if (r != NVML_SUCCESS) {
        printf("FAIL listing processes: %s\n", nvmlErrorString(r));
        failures++;
        return 0;
    }
    return n;
}

static const nvmlProcessInfo_t *find(const nvmlProcessInfo_t *p, unsigned n, unsigned pid) {
    for (unsigned i = 0; i < n; i++)
        if (p[i].pid == pid) return &p[i];
    return NULL;
}

static unsigned gpu_percent(nvmlDevice_t dev) {
    nvmlUtilization_t u = {.gpu = 101, .memory = 101};
    check_nvml("nvmlDeviceGetUtilizationRates", nvmlDeviceGetUtilizationRates(dev, &u),
               NVML_SUCCESS);
    return u.gpu;
}

/* While a long kernel runs, the VM's kernels held the device most of the last second; a second
 * after it is done, none of it. */
static void utilization(nvmlDevice_t dev, const char *ptx_path, unsigned iters) {
    CUmodule mod;
    CUfunction spin;
    CUdeviceptr out;
    check("load the spin kernel", cuModuleLoadData(&mod, read_file(ptx_path)), 0);
    check("cuModuleGetFunction", cuModuleGetFunction(&spin, mod, "spin"), 0);
    check("cuMemAlloc for the kernel", cuMemAlloc_v2(&out, 4096), 0);
    sleep_ms(IDLE_MS);
    unsigned idle = gpu_percent(dev);
    printf("idle before: %u%%\n", idle);
    expect("no kernel in the last second is 0%", idle == 0);
    int measured = 0;
    for (int t = 0; t < KERNEL_TRIES && !measured; t++, iters *= 4) {
        void *args[] = {&out, &iters};
        check("launch a long kernel", cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, 0, args, 0), 0);
        sleep_ms(RUNNING_MS);
        unsigned busy = gpu_percent(dev);
        if (cuStreamQuery(0) == CUDA_ERROR_NOT_READY) {
            printf("busy: %u%% (kernel of %u iterations still running)\n", busy, iters);
            expect("a kernel running most of the last second is most of it",
                   busy >= BUSY_PERCENT_MIN);
            measured = 1;
        }
        check("cuCtxSynchronize", cuCtxSynchronize(), 0);
    }
    expect("a kernel ran long enough to be measured", measured);
    sleep_ms(IDLE_MS);
    idle = gpu_percent(dev);
    printf("idle after: %u%%\n", idle);
    expect("a second after the kernel, 0%", idle == 0);
    check("cuMemFree", cuMemFree_v2(out), 0);
}

static int no_daemon(void) {
    check_nvml("nvmlInit without vgpud", nvmlInit_v2(), NVML_ERROR_DRIVER_NOT_LOADED);
    unsigned n;
    check_nvml("then the library is not initialized", nvmlDeviceGetCount_v2(&n),
               NVML_ERROR_UNINITIALIZED);
    return failures;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "nodaemon")) return no_daemon();
    if (argc != 3) {
        fprintf(stderr, "usage: nvml PTX ITERS | nvml nodaemon\n");
        return 2;
    }
    int go[2], ready[2];
    if (pipe(go) || pipe(ready)) return 2;
    pid_t kid = fork();
    if (kid == 0) {
        close(go[1]);
        close(ready[0]);
        child(go[0], ready[1]);
    }
    close(go[0]);
    close(ready[1]);

    unsigned count = 0;
    nvmlDevice_t dev = NULL, other = NULL;
    char text[NVML_DEVICE_NAME_V2_BUFFER_SIZE], want[NVML_DEVICE_NAME_V2_BUFFER_SIZE];

    check_nvml("before nvmlInit", nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
    expect("nvmlErrorString", !strcmp(nvmlErrorString(NVML_ERROR_UNINITIALIZED), "Uninitialized"));
    check_nvml("nvmlInit", nvmlInit_v2(), NVML_SUCCESS);
    check_nvml("nvmlInitWithFlags (counted)", nvmlInitWithFlags(NVML_INIT_FLAG_NO_ATTACH),
               NVML_SUCCESS);
    check_nvml("nvmlInitWithFlags with unknown flags", nvmlInitWithFlags(0x100),
               NVML_ERROR_INVALID_ARGUMENT);

    /* Versions. */
    check_nvml("nvmlSystemGetDriverVersion",
               nvmlSystemGetDriverVersion(text, NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE),
               NVML_SUCCESS);
    printf("driver version %s\n", text);
    expect("the driver version is major.minor.patch", strchr(text, '.') && atoi(text) >= 500);
    check_nvml("a version buffer too small", nvmlSystemGetDriverVersion(text, 3),
               NVML_ERROR_INSUFFICIENT_SIZE);
    check_nvml("nvmlSystemGetNVMLVersion",
               nvmlSystemGetNVMLVersion(text, NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE), NVML_SUCCESS);
    int nv_cuda = 0, cu_version = 0;
    check_nvml("nvmlSystemGetCudaDriverVersion", nvmlSystemGetCudaDriverVersion(&nv_cuda),
               NVML_SUCCESS);
    check("cuInit", cuInit(0), 0);
    check("cuDriverGetVersion", cuDriverGetVersion(&cu_version), 0);
    expect("NVML's CUDA version is the driver API's", nv_cuda == cu_version);
    snprintf(want, sizeof want, "%d.", cu_version / 1000);
    expect("the NVML version starts with the CUDA major", !strncmp(text, want, strlen(want)));

    /* The device, found three ways. */
    int cu_count = 0;
    check("cuDeviceGetCount", cuDeviceGetCount(&cu_count), 0);
    check_nvml("nvmlDeviceGetCount", nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
    expect("one device, as CUDA says", count == 1 && cu_count == 1);
    check_nvml("nvmlDeviceGetHandleByIndex", nvmlDeviceGetHandleByIndex_v2(0, &dev), NVML_SUCCESS);
    check_nvml("index past the count", nvmlDeviceGetHandleByIndex_v2(1, &other),
               NVML_ERROR_INVALID_ARGUMENT);
    check_nvml("NULL handle pointer", nvmlDeviceGetHandleByIndex_v2(0, NULL),
               NVML_ERROR_INVALID_ARGUMENT);
    check_nvml("nvmlDeviceGetName", nvmlDeviceGetName(dev, text, sizeof text), NVML_SUCCESS);
    check("cuDeviceGetName", cuDeviceGetName(want, sizeof want, 0), 0);
    printf("name %s\n", text);
    expect("NVML's name is CUDA's", !strcmp(text, want));
    check_nvml("a name buffer too small", nvmlDeviceGetName(dev, text, 4),
               NVML_ERROR_INSUFFICIENT_SIZE);
    unsigned char uuid[16];
    check("cuDeviceGetUuid", cuDeviceGetUuid(uuid, 0), 0);
    snprintf(want, sizeof want,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", uuid[0],
             uuid[1], uuid[2], uuid[3], uuid[4], uuid[5], uuid[6], uuid[7], uuid[8], uuid[9],
             uuid[10], uuid[11], uuid[12], uuid[13], uuid[14], uuid[15]);
    check_nvml("nvmlDeviceGetUUID", nvmlDeviceGetUUID(dev, text, NVML_DEVICE_UUID_V2_BUFFER_SIZE),
               NVML_SUCCESS);
    printf("uuid %s\n", text);
    expect("NVML's UUID is CUDA's", !strcmp(text, want));
    check_nvml("nvmlDeviceGetHandleByUUID", nvmlDeviceGetHandleByUUID(text, &other), NVML_SUCCESS);
    expect("the same handle by UUID", other == dev);
    check_nvml("an unknown UUID",
               nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000", &other),
               NVML_ERROR_NOT_FOUND);
    nvmlPciInfo_t pci;
    check_nvml("nvmlDeviceGetPciInfo", nvmlDeviceGetPciInfo(dev, &pci), NVML_SUCCESS);
    check("cuDeviceGetPCIBusId", cuDeviceGetPCIBusId(want, 13, 0), 0);
    printf("pci %s / %s\n", pci.busId, pci.busIdLegacy);
    expect("the legacy bus id is CUDA's", !strcmp(pci.busIdLegacy, want));
    expect("the bus id has an eight-digit domain", strlen(pci.busId) == 16 &&
                                                       !strcmp(pci.busId + 4, want));
    check_nvml("nvmlDeviceGetHandleByPciBusId", nvmlDeviceGetHandleByPciBusId_v2(pci.busId, &other),
               NVML_SUCCESS);
    expect("the same handle by bus id", other == dev);
    check_nvml("a bus id that is not the GPU's",
               nvmlDeviceGetHandleByPciBusId_v2("0000:7f:1f.0", &other), NVML_ERROR_NOT_FOUND);
    check_nvml("a bus id that is not one", nvmlDeviceGetHandleByPciBusId_v2("gpu0", &other),
               NVML_ERROR_INVALID_ARGUMENT);
    int major = 0, minor = 0, cu_major = -1, cu_minor = -1;
    check_nvml("nvmlDeviceGetCudaComputeCapability",
               nvmlDeviceGetCudaComputeCapability(dev, &major, &minor), NVML_SUCCESS);
    cuDeviceGetAttribute(&cu_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0);
    cuDeviceGetAttribute(&cu_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0);
    expect("NVML's compute capability is CUDA's", major == cu_major && minor == cu_minor);
    nvmlGpuVirtualizationMode_t mode;
    check_nvml("nvmlDeviceGetVirtualizationMode", nvmlDeviceGetVirtualizationMode(dev, &mode),
               NVML_SUCCESS);
    expect("a GPU shared with other VMs", mode == NVML_GPU_VIRTUALIZATION_MODE_VGPU);

    /* Handles that are not the GPU, and what the VM's GPU does not report. */
    check_nvml("a forged handle", nvmlDeviceGetName((nvmlDevice_t)((char *)dev + 1), text, sizeof text),
               NVML_ERROR_INVALID_ARGUMENT);
    check_nvml("a NULL handle", nvmlDeviceGetName(NULL, text, sizeof text),
               NVML_ERROR_INVALID_ARGUMENT);
    unsigned value;
    check_nvml("temperature", nvmlDeviceGetTemperature(dev, NVML_TEMPERATURE_GPU, &value),
               NVML_ERROR_NOT_SUPPORTED);
    check_nvml("power", nvmlDeviceGetPowerUsage(dev, &value), NVML_ERROR_NOT_SUPPORTED);
    unsigned lo, hi;
    check_nvml("power limits", nvmlDeviceGetPowerManagementLimitConstraints(dev, &lo, &hi),
               NVML_ERROR_NOT_SUPPORTED);
    check_nvml("remapped rows", nvmlDeviceGetRemappedRows(dev, &lo, &hi, &value, &value),
               NVML_ERROR_NOT_SUPPORTED);
    /* NVLink's far end, as PyTorch asks for it when it reports running out of memory. */
    nvmlIntNvLinkDeviceType_t far_end;
    check_nvml("NVLink remote device type", nvmlDeviceGetNvLinkRemoteDeviceType(dev, 0, &far_end),
               NVML_ERROR_NOT_SUPPORTED);
    nvmlPciInfo_t far_pci;
    check_nvml("NVLink remote PCI info", nvmlDeviceGetNvLinkRemotePciInfo_v2(dev, 0, &far_pci),
               NVML_ERROR_NOT_SUPPORTED);
    check_nvml("a forged handle's NVLink remote device type",
               nvmlDeviceGetNvLinkRemoteDeviceType((nvmlDevice_t)&value, 0, &far_end),
               NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long reasons;
    check_nvml("clock event reasons", nvmlDeviceGetCurrentClocksEventReasons(dev, &reasons),
               NVML_ERROR_NOT_SUPPORTED);
    check_nvml("a forged handle's power limits",
               nvmlDeviceGetPowerManagementLimitConstraints((nvmlDevice_t)&value, &lo, &hi),
               NVML_ERROR_INVALID_ARGUMENT);

    /* MIG, as device plugins walk it: no MIG devices under the VM's GPU, which is not one. */
    unsigned mig_count = 99;
    check_nvml("nvmlDeviceGetMaxMigDeviceCount", nvmlDeviceGetMaxMigDeviceCount(dev, &mig_count),
               NVML_SUCCESS);
    expect("no MIG devices", mig_count == 0);
    nvmlDevice_t mig;
    check_nvml("nvmlDeviceGetMigDeviceHandleByIndex",
               nvmlDeviceGetMigDeviceHandleByIndex(dev, 0, &mig), NVML_ERROR_NOT_SUPPORTED);
    nvmlDevice_t parent;
    check_nvml("the GPU is no MIG device's handle",
               nvmlDeviceGetDeviceHandleFromMigDeviceHandle(dev, &parent),
               NVML_ERROR_INVALID_ARGUMENT);
    unsigned mig_current, mig_pending;
    check_nvml("nvmlDeviceGetMigMode", nvmlDeviceGetMigMode(dev, &mig_current, &mig_pending),
               NVML_ERROR_NOT_SUPPORTED);

    /* Brand, clocks by id, CPU affinity, units. */
    nvmlBrandType_t brand;
    check_nvml("nvmlDeviceGetBrand", nvmlDeviceGetBrand(dev, &brand), NVML_SUCCESS);
    expect("a Virtual Compute Server GPU", brand == NVML_BRAND_NVIDIA_VCS);
    unsigned sm_now = 0, sm_info = 0;
    check_nvml("nvmlDeviceGetClock", nvmlDeviceGetClock(dev, NVML_CLOCK_SM, NVML_CLOCK_ID_CURRENT,
                                                        &sm_now), NVML_SUCCESS);
    check_nvml("nvmlDeviceGetClockInfo", nvmlDeviceGetClockInfo(dev, NVML_CLOCK_SM, &sm_info),
               NVML_SUCCESS);
    expect("the SM clock is the same either way", sm_now == sm_info && sm_now > 0);
    check_nvml("a clock id nvml.h does not define",
               nvmlDeviceGetClock(dev, NVML_CLOCK_SM, (nvmlClockId_t)77, &sm_now),
               NVML_ERROR_INVALID_ARGUMENT);
    unsigned long cpus[2] = {0, 0};
    check_nvml("nvmlDeviceGetCpuAffinity", nvmlDeviceGetCpuAffinity(dev, 2, cpus), NVML_SUCCESS);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int set_bits = __builtin_popcountl(cpus[0]) + __builtin_popcountl(cpus[1]);
    printf("# cpu affinity %#lx %#lx, %ld online\n", cpus[0], cpus[1], online);
    expect("every online CPU is near the GPU", online > 128 || set_bits == online);
    check_nvml("an empty CPU set", nvmlDeviceGetCpuAffinity(dev, 0, cpus),
               NVML_ERROR_INVALID_ARGUMENT);
    unsigned units = 99;
    check_nvml("nvmlUnitGetCount", nvmlUnitGetCount(&units), NVML_SUCCESS);
    expect("no units", units == 0);

    /* The rest of nvml.h: field values (each answered in its own result), handles by UUID in
     * CUDA 12's versioned form, the first PCI info layout, topology, units, GPM, setters. */
    nvmlFieldValue_t fields[2];
    memset(fields, 0, sizeof fields);
    fields[0].fieldId = NVML_FI_DEV_MEMORY_TEMP;
    fields[1].fieldId = NVML_FI_DEV_NVLINK_GET_VERSION;
    check_nvml("nvmlDeviceGetFieldValues", nvmlDeviceGetFieldValues(dev, 2, fields), NVML_SUCCESS);
    expect("each field is not supported",
           fields[0].nvmlReturn == NVML_ERROR_NOT_SUPPORTED &&
               fields[1].nvmlReturn == NVML_ERROR_NOT_SUPPORTED);
    check_nvml("no fields", nvmlDeviceGetFieldValues(dev, 0, fields), NVML_ERROR_INVALID_ARGUMENT);
    struct {
        unsigned version, type;
        union {
            char str[41];
            unsigned char bytes[16];
        } value;
    } by_uuid;
    memset(&by_uuid, 0, sizeof by_uuid);
    by_uuid.version = (unsigned)sizeof by_uuid | 1u << 24;
    by_uuid.type = 1; /* NVML_UUID_TYPE_ASCII */
    check_nvml("nvmlDeviceGetUUID", nvmlDeviceGetUUID(dev, by_uuid.value.str, 41), NVML_SUCCESS);
    other = NULL;
    check_nvml("nvmlDeviceGetHandleByUUIDV (text)",
               nvmlDeviceGetHandleByUUIDV((const void *)&by_uuid, &other), NVML_SUCCESS);
    expect("the same handle by UUID text", other == dev);
    by_uuid.type = 2; /* NVML_UUID_TYPE_BINARY */
    memcpy(by_uuid.value.bytes, uuid, 16);
    other = NULL;
    check_nvml("nvmlDeviceGetHandleByUUIDV (bytes)",
               nvmlDeviceGetHandleByUUIDV((const void *)&by_uuid, &other), NVML_SUCCESS);
    expect("the same handle by UUID bytes", other == dev);
    by_uuid.value.bytes[0] ^= 0xff;
    check_nvml("another UUID's bytes", nvmlDeviceGetHandleByUUIDV((const void *)&by_uuid, &other),
               NVML_ERROR_NOT_FOUND);
    by_uuid.version = 0;
    check_nvml("a UUID structure version NVML does not know",
               nvmlDeviceGetHandleByUUIDV((const void *)&by_uuid, &other),
               NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    check_nvml("nvmlDeviceGetHandleBySerial", nvmlDeviceGetHandleBySerial("0", &other),
               NVML_ERROR_NOT_FOUND);
    unsigned char old_pci[64];
    memset(old_pci, 0xee, sizeof old_pci);
    check_nvml("nvmlDeviceGetPciInfo (the first layout)",
               nvmlDeviceGetPciInfo_v1((nvmlDevice_t)dev, (void *)old_pci), NVML_SUCCESS);
    expect("the first layout's bus id", !strcmp((const char *)old_pci, pci.busIdLegacy));
    expect("nothing past the first layout's shared part", old_pci[36] == 0xee);
    nvmlDriverModel_t current_model, pending_model;
    check_nvml("nvmlDeviceGetDriverModel (Windows only)",
               nvmlDeviceGetDriverModel(dev, &current_model, &pending_model),
               NVML_ERROR_NOT_SUPPORTED);
    nvmlGpuTopologyLevel_t level;
    check_nvml("nvmlDeviceGetTopologyCommonAncestor",
               nvmlDeviceGetTopologyCommonAncestor(dev, dev, &level), NVML_ERROR_NOT_SUPPORTED);
    check_nvml("a forged handle's common ancestor",
               nvmlDeviceGetTopologyCommonAncestor(dev, (nvmlDevice_t)&value, &level),
               NVML_ERROR_INVALID_ARGUMENT);
    nvmlUnit_t unit;
    check_nvml("nvmlUnitGetHandleByIndex", nvmlUnitGetHandleByIndex(0, &unit),
               NVML_ERROR_INVALID_ARGUMENT);
    nvmlGpmSupport_t gpm = {.version = NVML_GPM_SUPPORT_VERSION, .isSupportedDevice = 7};
    check_nvml("nvmlGpmQueryDeviceSupport", nvmlGpmQueryDeviceSupport(dev, &gpm), NVML_SUCCESS);
    expect("no GPM samples", gpm.isSupportedDevice == 0);
    check_nvml("nvmlDeviceSetPowerManagementLimit", nvmlDeviceSetPowerManagementLimit(dev, 100000),
               NVML_ERROR_NOT_SUPPORTED);
    check_nvml("nvmlDeviceSetApplicationsClocks", nvmlDeviceSetApplicationsClocks(dev, 1, 1),
               NVML_ERROR_NOT_SUPPORTED);
    check_nvml("nvmlVgpuTypeGetName (host vGPU management)",
               nvmlVgpuTypeGetName(1, text, &(unsigned){sizeof text}), NVML_ERROR_NOT_SUPPORTED);
    unsigned excluded = 99;
    check_nvml("nvmlGetExcludedDeviceCount", nvmlGetExcludedDeviceCount(&excluded), NVML_SUCCESS);
    expect("no excluded devices", excluded == 0);
    unsigned long node_cpus[2] = {0, 0};
    check_nvml("nvmlDeviceGetCpuAffinityWithinScope",
               nvmlDeviceGetCpuAffinityWithinScope(dev, 2, node_cpus, NVML_AFFINITY_SCOPE_NODE),
               NVML_SUCCESS);
    expect("the same CPUs by node", node_cpus[0] == cpus[0] && node_cpus[1] == cpus[1]);

    /* Device events, as health checks use them: the VM's GPU reports none; a set is usable, a
     * wait times out after its timeout, a freed set is gone. */
    unsigned long long supported = ~0ull;
    check_nvml("nvmlDeviceGetSupportedEventTypes",
               nvmlDeviceGetSupportedEventTypes(dev, &supported), NVML_SUCCESS);
    expect("the VM's GPU reports no events", supported == 0);
    nvmlEventSet_t set = NULL;
    check_nvml("nvmlEventSetCreate", nvmlEventSetCreate(&set), NVML_SUCCESS);
    check_nvml("nvmlEventSetCreate into NULL", nvmlEventSetCreate(NULL),
               NVML_ERROR_INVALID_ARGUMENT);
    check_nvml("registering Xid errors",
               nvmlDeviceRegisterEvents(dev, nvmlEventTypeXidCriticalError, set),
               NVML_ERROR_NOT_SUPPORTED);
    check_nvml("registering every type", nvmlDeviceRegisterEvents(dev, nvmlEventTypeAll, set),
               NVML_ERROR_NOT_SUPPORTED);
    check_nvml("registering no type", nvmlDeviceRegisterEvents(dev, nvmlEventTypeNone, set),
               NVML_SUCCESS);
    check_nvml("registering a type nvml.h does not define",
               nvmlDeviceRegisterEvents(dev, 1ull << 40, set), NVML_ERROR_INVALID_ARGUMENT);
    nvmlEventData_t event;
    struct timespec w0, w1;
    clock_gettime(CLOCK_MONOTONIC, &w0);
    check_nvml("a wait finds no event", nvmlEventSetWait_v2(set, &event, 50), NVML_ERROR_TIMEOUT);
    clock_gettime(CLOCK_MONOTONIC, &w1);
    double waited_ms = (w1.tv_sec - w0.tv_sec) * 1e3 + (w1.tv_nsec - w0.tv_nsec) / 1e6;
    expect("the wait lasts its timeout", waited_ms >= 45);
    check_nvml("a wait into NULL", nvmlEventSetWait_v2(set, NULL, 0), NVML_ERROR_INVALID_ARGUMENT);
    unsigned char wait_v3[256] = {0};
    check_nvml("CUDA 13.5's operational events on a set", nvmlEventSetWait_v3(set, wait_v3),
               NVML_ERROR_NOT_SUPPORTED);
    check_nvml("nvmlEventSetFree", nvmlEventSetFree(set), NVML_SUCCESS);
    check_nvml("CUDA 13.5's operational events on a freed set", nvmlEventSetWait_v3(set, wait_v3),
               NVML_ERROR_INVALID_ARGUMENT);
    check_nvml("a freed set", nvmlEventSetWait_v2(set, &event, 0), NVML_ERROR_INVALID_ARGUMENT);
    check_nvml("a freed set again", nvmlEventSetFree(set), NVML_ERROR_INVALID_ARGUMENT);
    check_nvml("a forged set", nvmlDeviceRegisterEvents(dev, 0, (nvmlEventSet_t)&supported),
               NVML_ERROR_INVALID_ARGUMENT);

    /* Memory: the slice, and what the VM's processes hold of it. */
    size_t cu_total = 0, cu_free = 0;
    nvmlMemory_t m0, m1;
    check("cuDeviceTotalMem", cuDeviceTotalMem_v2(&cu_total, 0), 0);
    check_nvml("nvmlDeviceGetMemoryInfo", nvmlDeviceGetMemoryInfo(dev, &m0), NVML_SUCCESS);
    printf("memory %llu used of %llu\n", m0.used, m0.total);
    expect("the device's memory is the slice", m0.total == cu_total);
    expect("nothing used before anyone allocates", m0.used == 0 && m0.free == m0.total);
    nvmlProcessInfo_t procs[8];
    check_nvml("no processes before a context",
               nvmlDeviceGetComputeRunningProcesses(dev, &(unsigned){0}, NULL), NVML_SUCCESS);
    CUcontext ctx;
    CUdeviceptr mine;
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, 0), 0);
    check("cuMemAlloc", cuMemAlloc_v2(&mine, MINE), 0);
    check("cuMemGetInfo", cuMemGetInfo_v2(&cu_free, &cu_total), 0);
    check_nvml("nvmlDeviceGetMemoryInfo after cuMemAlloc", nvmlDeviceGetMemoryInfo(dev, &m1),
               NVML_SUCCESS);
    expect("the allocation is used", m1.used == m0.used + MINE);
    expect("NVML's free memory is CUDA's", m1.free == cu_free && m1.total == cu_total);
    nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
    check_nvml("nvmlDeviceGetMemoryInfo_v2", nvmlDeviceGetMemoryInfo_v2(dev, &m2), NVML_SUCCESS);
    expect("the same figures in version 2", m2.used == m1.used && m2.free == m1.free &&
                                                m2.total == m1.total && m2.reserved == 0);
    m2.version = 0;
    check_nvml("a structure version NVML does not know", nvmlDeviceGetMemoryInfo_v2(dev, &m2),
               NVML_ERROR_ARGUMENT_VERSION_MISMATCH);

    /* Processes: this one, then the child too. */
    count = 0;
    check_nvml("a process list with no room",
               nvmlDeviceGetComputeRunningProcesses(dev, &count, procs),
               NVML_ERROR_INSUFFICIENT_SIZE);
    expect("says one process", count == 1);
    count = processes(dev, procs);
    const nvmlProcessInfo_t *me = find(procs, count, (unsigned)getpid());
    expect("this process is listed with its memory", count == 1 && me && me->usedGpuMemory == MINE);
    /* CUDA 12's process detail list (its structures are newer than this nvml.h). */
    struct {
        unsigned pid;
        unsigned long long used;
        unsigned gi, ci;
        unsigned long long cc_protected;
    } details[2];
    struct {
        unsigned version, mode, entries;
        void *array;
    } detail_list = {(unsigned)sizeof detail_list | 1u << 24, 0, 0, NULL};
    check_nvml("a process detail list with no room",
               nvmlDeviceGetRunningProcessDetailList(dev, (void *)&detail_list),
               NVML_ERROR_INSUFFICIENT_SIZE);
    expect("says one process in detail", detail_list.entries == 1);
    detail_list.entries = 2;
    detail_list.array = details;
    check_nvml("nvmlDeviceGetRunningProcessDetailList",
               nvmlDeviceGetRunningProcessDetailList(dev, (void *)&detail_list), NVML_SUCCESS);
    expect("this process in detail, with its memory and no MIG instance",
           detail_list.entries == 1 && details[0].pid == (unsigned)getpid() &&
               details[0].used == MINE && details[0].gi == 0xffffffffu);
    detail_list.mode = 1; /* NVML_PROCESS_MODE_GRAPHICS */
    check_nvml("no graphics processes",
               nvmlDeviceGetRunningProcessDetailList(dev, (void *)&detail_list), NVML_SUCCESS);
    expect("none listed", detail_list.entries == 0);
    detail_list.version = 0;
    check_nvml("a detail list of a version NVML does not know",
               nvmlDeviceGetRunningProcessDetailList(dev, (void *)&detail_list),
               NVML_ERROR_INVALID_ARGUMENT);
    char comm[64] = "", name[64] = "";
    FILE *f = fopen("/proc/self/comm", "r");
    if (f) {
        if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = 0;
        fclose(f);
    }
    check_nvml("nvmlSystemGetProcessName", nvmlSystemGetProcessName(getpid(), name, sizeof name),
               NVML_SUCCESS);
    expect("the process name is the guest's", !strcmp(name, comm));
    check_nvml("a process that does not use the GPU",
               nvmlSystemGetProcessName(getppid(), name, sizeof name), NVML_ERROR_NOT_FOUND);
    if (write(go[1], "g", 1) != 1) return 2;
    char c;
    expect("the child took its memory", read(ready[0], &c, 1) == 1);
    count = processes(dev, procs);
    const nvmlProcessInfo_t *kids = find(procs, count, (unsigned)kid);
    expect("two processes", count == 2);
    expect("the child is listed with its memory", kids && kids->usedGpuMemory == CHILDS);
    check_nvml("nvmlDeviceGetMemoryInfo with the child", nvmlDeviceGetMemoryInfo(dev, &m1),
               NVML_SUCCESS);
    expect("the VM's use is both processes'", m1.used == MINE + CHILDS);
    close(go[1]);
    waitpid(kid, NULL, 0);
    for (int i = 0; i < EXIT_POLLS && processes(dev, procs) != 1; i++) sleep_ms(50);
    expect("the child is gone from the list once it exits", processes(dev, procs) == 1);

    /* Utilization. */
    utilization(dev, argv[1], (unsigned)strtoul(argv[2], NULL, 10));

    check("cuMemFree", cuMemFree_v2(mine), 0);
    check("cuCtxDestroy", cuCtxDestroy_v2(ctx), 0);
    count = 8;
    check_nvml("no processes once the context is gone",
               nvmlDeviceGetComputeRunningProcesses(dev, &count, procs), NVML_SUCCESS);
    expect("an empty list", count == 0);
    check_nvml("nvmlShutdown", nvmlShutdown(), NVML_SUCCESS);
    check_nvml("nvmlShutdown of the second init", nvmlShutdown(), NVML_SUCCESS);
    check_nvml("nvmlShutdown once too often", nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    check_nvml("after nvmlShutdown", nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
    printf("%s\n", failures ? "FAILED" : "PASS");
    return failures;
}
