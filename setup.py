"""The package's build: the `backend` and `ui` packages, the event-loop tracer's C parts, the
step recorder (backend/trace/step_recorder.c) and the live trace's digest
(backend/trace/trace_digest.c), and the embedded engine's linear layer for a few rows
(backend/engines/embedded/rows_linear.c), the int8-exact path's rotation and int8 products
(int8_rows.c), and the other ops of its decode step (decode_ops.c).
Metadata and dependencies are in pyproject.toml.

`make run` and `make test` build the C parts in place (`python setup.py build_ext --inplace`);
`pip install .` builds them into the installed package. Without a C compiler the build is skipped
(the extensions are optional) and the dashboard serves without its event-loop trace, saying why,
and the embedded engine multiplies with PyTorch alone.
"""

from setuptools import Extension, find_packages, setup

setup(
    packages=find_packages(include=["backend", "backend.*", "ui", "ui.*"]),
    ext_modules=[
        Extension(
            "backend.trace._step_recorder",
            ["backend/trace/step_recorder.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "backend.trace._trace_digest",
            ["backend/trace/trace_digest.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "backend.engines.embedded._rows_linear",
            ["backend/engines/embedded/rows_linear.c"],
            depends=["backend/engines/embedded/lane_sum.h"],
            # No contraction of a multiply and an add into one FMA: dequantized weights must be
            # the float32 values gguf-py computes (d * q rounded, then + m rounded).
            extra_compile_args=["-O3", "-ffp-contract=off"],
            optional=True,
        ),
        Extension(
            "backend.engines.embedded._int8_rows",
            ["backend/engines/embedded/int8_rows.c"],
            # The rotation's sums as written, no multiply and add fused.
            extra_compile_args=["-O3", "-ffp-contract=off"],
            optional=True,
        ),
        Extension(
            "backend.engines.embedded._decode_ops",
            ["backend/engines/embedded/decode_ops.c"],
            depends=["backend/engines/embedded/lane_sum.h"],
            # Rotary embedding as PyTorch rounds it: two rounded products, then a rounded sum.
            extra_compile_args=["-O3", "-ffp-contract=off"],
            optional=True,
        ),
    ],
)
