"""Builds the event-loop tracer's C parts next to their sources, in place: the step recorder
(backend/step_recorder.c) and the live trace's digest (backend/trace_digest.c).

`make run` and `make test` run `python setup.py build_ext --inplace`; without a C compiler the build
is skipped (the extensions are optional) and the tracer does the same work in Python instead.
"""

from setuptools import Extension, setup

setup(
    packages=[],
    ext_modules=[
        Extension(
            "backend._step_recorder",
            ["backend/step_recorder.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "backend._trace_digest",
            ["backend/trace_digest.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ],
)
