"""A CUDA kernel compiled for this machine's GPU, run and checked: what SGLang's first start needs.

SGLang and FlashInfer compile kernels at first use with nvcc and a host C++ compiler, for the GPU's
own architecture. This builds a small kernel the same way, with torch's
`torch.utils.cpp_extension.load_inline` (ninja, nvcc, the C++ compiler), for exactly this GPU's
compute capability (`TORCH_CUDA_ARCH_LIST`), runs it on a million floats and compares it with
torch's own answer. Where ninja (load_inline's builder) is missing it says so and builds the same
kernel with nvcc alone into a shared library, called through ctypes. Only torch and the standard
library: it runs on a bare GPU machine with nothing installed (scripts/gpu-device-check.sh).

Usage: python -m scripts.gpu_kernel_check   (exit status 0 where the kernel built, ran and agreed)
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

ELEMENTS = 1 << 20

CUDA_SOURCE = r"""
#include <torch/extension.h>

__global__ void scaled_add_kernel(const float* x, const float* y, float* out, float a, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaf(a, x[i], y[i]);
}

torch::Tensor scaled_add(torch::Tensor x, torch::Tensor y, double a) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda(), "x and y must be on the GPU");
    TORCH_CHECK(x.scalar_type() == torch::kFloat && y.scalar_type() == torch::kFloat, "float32 only");
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    int threads = 256;
    int64_t blocks = (n + threads - 1) / threads;
    scaled_add_kernel<<<blocks, threads>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), (float)a, n);
    cudaError_t launched = cudaGetLastError();
    TORCH_CHECK(launched == cudaSuccess, "the kernel did not launch: ", cudaGetErrorString(launched));
    return out;
}
"""

CPP_SOURCE = "torch::Tensor scaled_add(torch::Tensor x, torch::Tensor y, double a);"

PLAIN_SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>

__global__ void scaled_add_kernel(const float* x, const float* y, float* out, float a, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaf(a, x[i], y[i]);
}

extern "C" int scaled_add(const float* x, const float* y, float* out, float a, int64_t n) {
    int threads = 256;
    scaled_add_kernel<<<(n + threads - 1) / threads, threads>>>(x, y, out, a, n);
    return (int)cudaGetLastError();
}
"""
"""The same kernel without torch's headers, for nvcc alone where ninja (load_inline's builder) is missing."""

Kernel = Callable[[Any, Any, float], Any]
"""out = a * x + y on the GPU, for float32 tensors x and y."""


def with_load_inline(build: str) -> Kernel:
    """The kernel built by torch's `load_inline` (ninja, nvcc and the C++ compiler) in `build`."""
    from torch.utils import cpp_extension

    module = cpp_extension.load_inline(
        name="dashboard_gpu_kernel_check",
        cpp_sources=[CPP_SOURCE],
        cuda_sources=[CUDA_SOURCE],
        functions=["scaled_add"],
        build_directory=build,
        extra_cuda_cflags=["-O2"],
        verbose=False,
    )
    return module.scaled_add


def with_nvcc(build: str, major: int, minor: int) -> Kernel:
    """The kernel built by nvcc alone into a shared library in `build`, called through ctypes."""
    import torch
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        raise FileNotFoundError("no nvcc: set CUDA_HOME or put nvcc on PATH")
    source, library = os.path.join(build, "kernel.cu"), os.path.join(build, "kernel.so")
    with open(source, "w") as out:
        out.write(PLAIN_SOURCE)
    arch = f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"
    command = [nvcc, "-O2", "-shared", "-Xcompiler", "-fPIC", arch, source, "-o", library]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed: {(done.stderr or done.stdout).strip()[-800:]}")
    scaled_add = ctypes.CDLL(library).scaled_add
    scaled_add.restype = ctypes.c_int
    scaled_add.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_float, ctypes.c_int64]

    def call(x: Any, y: Any, a: float) -> Any:
        out = torch.empty_like(x)
        status = scaled_add(x.data_ptr(), y.data_ptr(), out.data_ptr(), a, x.numel())
        if status != 0:
            raise RuntimeError(f"the kernel did not launch: CUDA error {status}")
        return out

    return call


def main() -> int:
    """Build, run and check the kernel; say each step in a line."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as exc:
        print(f"kernel check: torch cannot be imported ({exc})")
        return 1
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), Python {sys.version.split()[0]}")
    if not torch.cuda.is_available():
        print("kernel check: torch sees no CUDA device, so no kernel can run here")
        return 1
    major, minor = torch.cuda.get_device_capability(0)
    name = torch.cuda.get_device_name(0)
    arch = f"{major}.{minor}"
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch  # this GPU's architecture only, as SGLang's JIT builds
    print(f"GPU 0: {name}, compute capability {arch}; building for sm_{major}{minor}")
    ninja = cpp_extension.is_ninja_available()
    if not ninja:
        print("ninja is missing, so torch's load_inline cannot build here: building with nvcc alone")
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-kernel-check-") as build:
            kernel = with_load_inline(build) if ninja else with_nvcc(build, major, minor)
            print(f"built with {'load_inline' if ninja else 'nvcc'} in {time.monotonic() - started:.1f} s")
            x = torch.randn(ELEMENTS, device="cuda")
            y = torch.randn(ELEMENTS, device="cuda")
            a = 1.5
            ran = time.monotonic()
            out = kernel(x, y, a)
            torch.cuda.synchronize()
            took_ms = (time.monotonic() - ran) * 1000
            error = (out - torch.addcmul(y, x, torch.tensor(a, device="cuda"))).abs().max().item()
    except Exception as exc:  # noqa: BLE001 - a failed build surfaces as many kinds of error
        print(f"kernel check FAILED after {time.monotonic() - started:.1f} s: {type(exc).__name__}: {exc}")
        return 1
    agreed = error <= 1e-5
    print(
        f"ran on {ELEMENTS:,} floats in {took_ms:.2f} ms; largest difference from torch {error:.2e}: "
        + ("agrees" if agreed else "DISAGREES")
    )
    return 0 if agreed else 1


if __name__ == "__main__":
    sys.exit(main())
