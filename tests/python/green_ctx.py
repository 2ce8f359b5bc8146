"""Green contexts through cuda-python (cuda.bindings resolves each call with cuGetProcAddress and
lays out CUdevResource itself): the device's SMs split one by one, a green context of one
piece, a kernel compiled with NVRTC on the green context's stream that reads %nsmid (the units
it may run on) and %smid, and the same kernel in the primary context. Prints PASS when every
check holds.
"""
import sys

import numpy as np
from cuda.bindings import driver, nvrtc

KERNEL = r"""
extern "C" __global__ void units(unsigned *out) {
    unsigned n, id;
    asm("mov.u32 %0, %%nsmid;" : "=r"(n));
    asm("mov.u32 %0, %%smid;" : "=r"(id));
    out[2 * blockIdx.x] = id;
    out[2 * blockIdx.x + 1] = n;
}
"""
BLOCKS = 32


def cu(result):
    err, *rest = result
    if err not in (driver.CUresult.CUDA_SUCCESS, nvrtc.nvrtcResult.NVRTC_SUCCESS):
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else rest


def ptx():
    prog = cu(nvrtc.nvrtcCreateProgram(KERNEL.encode(), b"units.cu", 0, [], []))
    cu(nvrtc.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=compute_80"]))
    size = cu(nvrtc.nvrtcGetPTXSize(prog))
    buf = b" " * size
    cu(nvrtc.nvrtcGetPTX(prog, buf))
    return buf


def run(stream, out, code):
    """Loads the kernel in the current context, runs it on `stream`; (smids, nsmids)."""
    module = cu(driver.cuModuleLoadData(code))
    fn = cu(driver.cuModuleGetFunction(module, b"units"))
    cu(driver.cuMemsetD32(out, 0xFFFFFFFF, BLOCKS * 2))
    arg = np.array([int(out)], dtype=np.uint64)
    args = np.array([arg.ctypes.data], dtype=np.uint64)
    cu(driver.cuLaunchKernel(fn, BLOCKS, 1, 1, 32, 1, 1, 0, stream, args.ctypes.data, 0))
    cu(driver.cuStreamSynchronize(stream))
    host = np.zeros(BLOCKS * 2, dtype=np.uint32)
    cu(driver.cuMemcpyDtoH(host.ctypes.data, out, host.nbytes))
    return set(host[0::2].tolist()), set(host[1::2].tolist())


def with_cuda_core(expect):
    """cuda.core's green contexts: `SMResource.split`, `Device.create_context` with the piece,
    a stream of the green context, and a kernel (loaded through the library API) on it."""
    from cuda.core import (ContextOptions, Device, LaunchConfig, Program, ProgramOptions,
                           SMResourceOptions, launch)

    dev = Device(0)
    dev.set_current()
    sm = dev.resources.sm
    groups, rest = sm.split(SMResourceOptions(count=4))
    expect(f"cuda.core: split {sm.sm_count} SMs into {[g.sm_count for g in groups]} + {rest.sm_count}",
           len(groups) >= 1 and groups[0].sm_count == 4)
    ctx = dev.create_context(ContextOptions(resources=[groups[0]]))
    expect("cuda.core: a green context of 4 SMs", ctx.is_green and ctx.resources.sm.sm_count == 4)
    stream = ctx.create_stream()
    mod = Program(KERNEL, code_type="c++",
                  options=ProgramOptions(arch=f"compute_{dev.arch}")).compile("ptx")
    kernel = mod.get_kernel("units")
    buf = dev.allocate(BLOCKS * 8, stream=stream)
    launch(stream, LaunchConfig(grid=BLOCKS, block=32), kernel, buf)
    stream.sync()
    host = np.zeros(BLOCKS * 2, dtype=np.uint32)
    cu(driver.cuMemcpyDtoH(host.ctypes.data, int(buf.handle), host.nbytes))
    smids, nsmids = set(host[0::2].tolist()), set(host[1::2].tolist())
    expect(f"cuda.core: the kernel ran on the green context's 4 units (%smid {smids}, %nsmid {nsmids})",
           nsmids == {4} and max(smids) < 4)
    buf.close(stream)
    stream.close()
    ctx.close()


def main():
    failures = []

    def expect(what, cond):
        print(("ok " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    cu(driver.cuInit(0))
    dev = cu(driver.cuDeviceGet(0))
    primary = cu(driver.cuDevicePrimaryCtxRetain(dev))
    cu(driver.cuCtxSetCurrent(primary))
    sms = cu(driver.cuDeviceGetAttribute(
        driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    whole = cu(driver.cuDeviceGetDevResource(dev, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
    expect(f"the device resource has the device's {sms} SMs", whole.sm.smCount == sms)
    flags = driver.CUdevSmResourceSplit_flags.CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING
    groups, n, rest = cu(driver.cuDevSmResourceSplitByCount(sms, whole, flags, 1))
    expect(f"split into {sms} groups of one SM", n == sms and all(g.sm.smCount == 1 for g in groups[:n]))
    desc = cu(driver.cuDevResourceGenerateDesc([groups[0]], 1))
    green = cu(driver.cuGreenCtxCreate(
        desc, dev, driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
    ctx = cu(driver.cuCtxFromGreenCtx(green))
    stream = cu(driver.cuGreenCtxStreamCreate(
        green, driver.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
    owner = cu(driver.cuStreamGetGreenCtx(stream))
    expect("the stream's green context", int(owner) == int(green))
    res = cu(driver.cuGreenCtxGetDevResource(green, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
    expect("the green context has one SM", res.sm.smCount == 1)

    code = ptx()
    out = cu(driver.cuMemAlloc(BLOCKS * 8))
    cu(driver.cuCtxSetCurrent(ctx))
    smids, nsmids = run(stream, out, code)
    expect(f"the green context's kernel ran on one unit (%smid {smids}, %nsmid {nsmids})",
           smids == {0} and nsmids == {1})
    cu(driver.cuCtxSetCurrent(primary))
    smids, nsmids = run(driver.CUstream(0), out, code)
    expect(f"the primary context's kernel may use all {sms} (%nsmid {nsmids})", nsmids == {sms})
    cu(driver.cuStreamDestroy(stream))
    cu(driver.cuGreenCtxDestroy(green))
    cu(driver.cuMemFree(out))
    with_cuda_core(expect)
    cu(driver.cuDevicePrimaryCtxRelease(dev))
    if failures:
        print(f"{len(failures)} failures")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
