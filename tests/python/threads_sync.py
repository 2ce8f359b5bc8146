"""Threads of a Python program on vgpu (cuda-python): while one thread waits in
cuStreamSynchronize for a stream held by cuStreamWaitValue32, another thread's calls complete,
and its cuStreamWriteValue32 releases the first, as on CUDA (cuda-python releases the GIL in
driver calls). Prints PASS when every check holds.
"""
import sys
import threading
import time

from cuda.bindings import driver

ROUNDS = 50


def cu(result):
    err, *rest = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else rest


def main():
    cu(driver.cuInit(0))
    dev = cu(driver.cuDeviceGet(0))
    ctx = cu(driver.cuDevicePrimaryCtxRetain(dev))
    cu(driver.cuCtxSetCurrent(ctx))
    held = cu(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
    own = cu(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
    flag = cu(driver.cuMemAlloc(4))
    buf = cu(driver.cuMemAlloc(4096))
    cu(driver.cuMemsetD32(flag, 0, 1))
    cu(driver.cuStreamWaitValue32(held, flag, 1, driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ))
    result = {}

    def waiter():
        cu(driver.cuCtxSetCurrent(ctx))
        result["sync"] = driver.cuStreamSynchronize(held)[0]
        result["at"] = time.monotonic()

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)
    host = bytearray(4096)
    for i in range(ROUNDS):
        cu(driver.cuMemsetD32Async(buf, i + 1, 1024, own))
        cu(driver.cuStreamSynchronize(own))
        cu(driver.cuMemcpyDtoH(host, buf, 4096))
        if int.from_bytes(host[:4], "little") != i + 1:
            print(f"FAIL round {i}: read {host[:4].hex()}")
            return 1
    print(f"ok {ROUNDS} rounds of another thread complete while it waits")
    if "sync" in result:
        print("FAIL the waiter returned before the flag was written")
        return 1
    released = time.monotonic()
    cu(driver.cuStreamWriteValue32(own, flag, 1, driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT))
    t.join(30)
    if t.is_alive():
        print("FAIL the waiter never returned")
        return 1
    if result["sync"] != driver.CUresult.CUDA_SUCCESS:
        print(f"FAIL the waiter's synchronization returned {result['sync']}")
        return 1
    print(f"ok the write released the waiter after {(result['at'] - released) * 1e3:.1f} ms")
    cu(driver.cuDevicePrimaryCtxRelease(dev))
    print("PASS")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - any failure is the test's
        print(f"FAIL {e}")
        sys.exit(1)
