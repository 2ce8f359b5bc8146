#!/usr/bin/env python3
"""Compile every tests/kernels/*.cu to PTX with NVRTC, for each fixture architecture.

Output: tests/kernels/ptx/<stem>.<arch>.ptx with <arch> in sm_52, sm_80, sm_90
(the `.target` NVRTC writes for --gpu-architecture=compute_XX).

Usage:
    python3 tests/kernels/gen-ptx.py            # regenerate the committed fixtures
    python3 tests/kernels/gen-ptx.py --check    # regenerate into a temp dir, diff, exit 1 on drift
    python3 tests/kernels/gen-ptx.py --install  # pip-install the pinned NVIDIA packages first

Requirements (pinned so the output is reproducible byte for byte):
    pip install nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79
The runtime package only supplies headers (cuda_fp16.h); nothing is linked.

Exit codes: 0 ok, 1 drift or compile error, 2 NVRTC or headers unavailable.
"""

import argparse
import ctypes
import difflib
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PTX_DIR = os.path.join(HERE, "ptx")
ARCHS = ("52", "80", "90")
PINNED = ("nvidia-cuda-nvrtc-cu12==12.9.86", "nvidia-cuda-runtime-cu12==12.9.79")
EXPECTED_NVRTC = (12, 9)
# Options beyond the architecture. NVRTC defaults already mean -fmad=true,
# -ftz=false, -prec-div=true, -prec-sqrt=true; they are spelled out so a change
# of defaults cannot silently change the fixtures. No -lineinfo: it would embed paths.
OPTIONS = (
    "--std=c++17",
    "-fmad=true",
    "-ftz=false",
    "-prec-div=true",
    "-prec-sqrt=true",
)
# The one warning tolerated: NVRTC 12.9 flags compute_52 as deprecated.
IGNORED_LOG_LINES = ("nvrtc: warning: Architectures prior to '<compute/sm>_75' are deprecated",)
EXIT_DRIFT = 1
EXIT_UNAVAILABLE = 2


class Unavailable(Exception):
    """NVRTC or the CUDA headers cannot be found."""


def package_dir(module):
    try:
        mod = __import__(module, fromlist=["__path__"])
    except ImportError as e:
        raise Unavailable(f"cannot import {module} ({e}); run: pip install {' '.join(PINNED)}")
    return list(mod.__path__)[0]


def load_nvrtc():
    lib_path = os.path.join(package_dir("nvidia.cuda_nvrtc"), "lib", "libnvrtc.so.12")
    try:
        lib = ctypes.CDLL(lib_path)
    except OSError as e:
        raise Unavailable(f"cannot load {lib_path}: {e}")
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def include_dir():
    inc = os.path.join(package_dir("nvidia.cuda_runtime"), "include")
    if not os.path.isfile(os.path.join(inc, "cuda_fp16.h")):
        raise Unavailable(f"{inc} has no cuda_fp16.h; run: pip install {PINNED[1]}")
    return inc


def nvrtc_version(lib):
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def compile_ptx(lib, inc, name, source, arch):
    """Returns the PTX text, or raises RuntimeError with the NVRTC log."""
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source, name.encode(), 0, None, None)
    if rc != 0:
        raise RuntimeError(f"{name}: nvrtcCreateProgram: {lib.nvrtcGetErrorString(rc).decode()}")
    try:
        opts = [f"--gpu-architecture=compute_{arch}".encode(), f"-I{inc}".encode()]
        opts += [o.encode() for o in OPTIONS]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        log = "\n".join(line for line in log.value.decode(errors="replace").splitlines()
                        if line.strip() and not line.startswith(IGNORED_LOG_LINES))
        if rc != 0:
            raise RuntimeError(f"{name} (compute_{arch}): {lib.nvrtcGetErrorString(rc).decode()}\n{log}")
        if log:
            # Warnings are errors for fixtures: they usually mean undefined behaviour.
            raise RuntimeError(f"{name} (compute_{arch}) compiled with warnings:\n{log}")
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, ptx)
        return ptx.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def sources():
    return sorted(f for f in os.listdir(HERE) if f.endswith(".cu"))


def fixture_name(cu, arch):
    return f"{cu[:-3]}.sm_{arch}.ptx"


def generate(out_dir):
    """Compiles everything into out_dir; returns the list of file names written."""
    lib = load_nvrtc()
    inc = include_dir()
    version = nvrtc_version(lib)
    if version != EXPECTED_NVRTC:
        print(f"warning: NVRTC {version[0]}.{version[1]} differs from the pinned "
              f"{EXPECTED_NVRTC[0]}.{EXPECTED_NVRTC[1]}; output will not match the fixtures "
              f"(pip install {' '.join(PINNED)})", file=sys.stderr)
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for cu in sources():
        with open(os.path.join(HERE, cu), "rb") as f:
            src = f.read()
        for arch in ARCHS:
            ptx = compile_ptx(lib, inc, cu, src, arch)
            name = fixture_name(cu, arch)
            with open(os.path.join(out_dir, name), "w", newline="\n") as f:
                f.write(ptx)
            written.append(name)
    return written


def check():
    with tempfile.TemporaryDirectory(prefix="vgpu-ptx-check-") as tmp:
        fresh = set(generate(tmp))
        committed = set(f for f in os.listdir(PTX_DIR) if f.endswith(".ptx")) if os.path.isdir(PTX_DIR) else set()
        drift = False
        for name in sorted(fresh - committed):
            print(f"missing fixture: ptx/{name}")
            drift = True
        for name in sorted(committed - fresh):
            print(f"stale fixture (no matching .cu): ptx/{name}")
            drift = True
        for name in sorted(fresh & committed):
            with open(os.path.join(tmp, name)) as f:
                new = f.read()
            with open(os.path.join(PTX_DIR, name)) as f:
                old = f.read()
            if new != old:
                drift = True
                diff = difflib.unified_diff(old.splitlines(), new.splitlines(),
                                            f"ptx/{name}", f"regenerated/{name}", lineterm="", n=1)
                print("\n".join(list(diff)[:40]))
        if drift:
            print("PTX fixtures are out of date: run python3 tests/kernels/gen-ptx.py")
            return EXIT_DRIFT
        print(f"{len(fresh)} PTX fixtures up to date")
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="diff regenerated PTX against the fixtures")
    ap.add_argument("--install", action="store_true", help="pip install the pinned NVIDIA packages first")
    args = ap.parse_args()
    if args.install:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", *PINNED])
    try:
        if args.check:
            return check()
        written = generate(PTX_DIR)
        for stale in sorted(set(f for f in os.listdir(PTX_DIR) if f.endswith(".ptx")) - set(written)):
            os.remove(os.path.join(PTX_DIR, stale))
            print(f"removed stale ptx/{stale}")
        print(f"wrote {len(written)} PTX fixtures to {os.path.relpath(PTX_DIR)}")
        return 0
    except Unavailable as e:
        print(f"NVRTC unavailable: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except RuntimeError as e:
        print(f"compile error: {e}", file=sys.stderr)
        return EXIT_DRIFT


if __name__ == "__main__":
    sys.exit(main())
