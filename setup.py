"""Builds the event-loop tracer's C step recorder next to its source, in place.

`make run` and `make test` run `python setup.py build_ext --inplace`; without a C compiler the build
is skipped (the extension is optional) and the tracer records steps in Python instead.
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
        )
    ],
)
