# Two commands on a fresh machine:  `make demo` (the main job end to end)  and  `make test`.
# Both bootstrap a virtualenv in .venv with everything they need (6.2 GB, mostly torch;
# the install needs ~9 GB free at its peak).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Free disk the install needs: measured peak 9.1 GB during pip install (venv 6.2 GB after),
# then ~1.5 GB of test models under /tmp; see scripts/check_disk.sh.
NEED_GB ?= 9

PERF_ANALYZER := $(VENV)/tools/perf_analyzer/perf_analyzer

.PHONY: install demo test test-fast lint clean perf-analyzer

# --no-cache-dir: the torch wheels would otherwise be kept twice (cache + venv), ~3 GB more.
PIP := $(BIN)/python -m pip install -q --no-cache-dir

$(STAMP): pyproject.toml Makefile
	@bash scripts/check_disk.sh $(dir $(abspath $(VENV))) $(NEED_GB)
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel
	$(PIP) -e ".[export,serve,bench,dev]"
	# sam2 is an sdist whose build imports torch: build it against the torch just installed,
	# without its optional CUDA extension (only used for post-processing hole filling).
	SAM2_BUILD_CUDA=0 $(PIP) --no-build-isolation "sam2==1.1.0"
	touch $@

install: $(STAMP)

# Triton's perf_analyzer (C++), from the tritonclient wheel of the server's release.
$(PERF_ANALYZER): $(STAMP) scripts/install_perf_analyzer.sh
	PYTHON=$(BIN)/python bash scripts/install_perf_analyzer.sh $(VENV)/tools/perf_analyzer

perf-analyzer: $(PERF_ANALYZER)

# Triton's onnxruntime backend (CPU) for the embedded tritonserver, built from Triton's sources
# (r24.10, cloned from github.com: needs network, cmake, g++, rapidjson-dev) against this
# venv's onnxruntime; `triton-sam serve` and the tests look here first, then for
# ../shared/triton-onnxruntime-backend/onnxruntime beside the checkout. See the script's header.
ORT_BACKEND := $(VENV)/tools/triton-onnxruntime-backend/onnxruntime
.PHONY: onnxruntime-backend
$(ORT_BACKEND)/libtriton_onnxruntime.so: $(STAMP) scripts/build_onnxruntime_backend.sh
	PYTHON=$(BIN)/python bash scripts/build_onnxruntime_backend.sh $(ORT_BACKEND)

onnxruntime-backend: $(ORT_BACKEND)/libtriton_onnxruntime.so

demo: $(STAMP)
	$(BIN)/triton-sam demo

test: $(STAMP) $(PERF_ANALYZER)
	$(BIN)/ruff check triton_sam tests
	$(BIN)/pytest

test-fast: $(STAMP)
	$(BIN)/pytest -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check triton_sam tests
	$(BIN)/ruff format --check triton_sam tests

clean:
	rm -rf .demo outputs .pytest_cache
