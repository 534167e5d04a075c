"""A stand-in for the CUDA-only `sgl_kernel`, so the real SGLang server imports on a CPU (see stand_in)."""

from stand_in import install

__version__ = "0.0.0+stand-in"

install(__name__)
