# Two commands on a fresh machine:  `make demo` (the main job end to end)  and  `make test`.
# Both bootstrap a virtualenv in .venv from the lock (requirements/lock*.txt: every package,
# pinned with its sha256), so a fresh machine gets exactly what the tests ran against.
# 6.2 GB, mostly torch; the install needs ~9 GB free at its peak.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Free disk the install needs: measured peak 9.1 GB during pip install (venv 6.2 GB after),
# then ~1.5 GB of test models under /tmp; see scripts/check_disk.sh.
NEED_GB ?= 9

LOCK        := requirements/lock.txt
LOCK_SAM2   := requirements/lock-sam2.txt
LOCK_TOOLS  := requirements/lock-tools.txt
LOCK_DOCS   := requirements/lock-docs.txt
LOCK_MICRO_SAM := requirements/lock-micro-sam.txt
LOCK_LABEL_STUDIO := requirements/lock-label-studio.txt
# The platform the lock is compiled for: CPython 3.11 on x86-64 Linux, glibc >= 2.35
# (nvidia-pytriton ships manylinux_2_35 wheels only).
LOCK_PYTHON   := 3.11
LOCK_PLATFORM := x86_64-manylinux_2_35
UV_VERSION    := 0.13.9

PERF_ANALYZER := $(VENV)/tools/perf_analyzer/perf_analyzer

.PHONY: install demo test test-fast lint clean perf-analyzer micro-sam lock check-latest proxy-tools browser-tools qt-tools docs docs-tools label-studio test-label-studio

# --no-cache-dir: the torch wheels would otherwise be kept twice (cache + venv), ~3 GB more.
PIP := $(BIN)/python -m pip install -q --no-cache-dir

$(STAMP): pyproject.toml $(LOCK) $(LOCK_SAM2) Makefile
	@bash scripts/check_python.sh $(PYTHON) $(LOCK_PYTHON)
	@bash scripts/check_disk.sh $(dir $(abspath $(VENV))) $(NEED_GB)
	$(PYTHON) -m venv $(VENV)
	# Everything, hash-checked, no resolution: the lock already holds every dependency.
	$(PIP) --require-hashes --no-deps -r $(LOCK)
	# The project itself (editable), built with the locked setuptools.
	$(PIP) --no-deps --no-build-isolation -e .
	# sam2 is an sdist whose build imports torch: built against the torch just installed,
	# without its optional CUDA extension (only used for post-processing hole filling).
	SAM2_BUILD_CUDA=0 $(PIP) --require-hashes --no-deps --no-build-isolation -r $(LOCK_SAM2)
	$(BIN)/python -m pip check
	touch $@

install: $(STAMP)

# Regenerate the lock (needs PyPI). Keeps every pin it can (uv prefers the existing lock);
# `make lock UPGRADE=1` moves everything to the newest releases within pyproject's ranges and
# requirements/constraints.txt. Then run `make test` (a fresh venv: `rm -rf .venv`) before
# committing the new lock.
# uv runs from its own small venv, so a broken project venv never blocks fixing the lock.
UV := .venv-uv/bin/uv
UV_FLAGS = --generate-hashes --python-version $(LOCK_PYTHON) \
    --python-platform $(LOCK_PLATFORM) $(if $(UPGRADE),--upgrade,)

lock:
	[ -x $(UV) ] || ($(PYTHON) -m venv .venv-uv && .venv-uv/bin/pip install -q "uv==$(UV_VERSION)")
	$(UV) pip compile pyproject.toml requirements/lock.in --all-extras \
	    -c requirements/constraints.txt --no-emit-package sam2 $(UV_FLAGS) -o $(LOCK)
	$(UV) pip compile requirements/sam2.in --no-deps $(UV_FLAGS) -o $(LOCK_SAM2)
	$(UV) pip compile requirements/tools.in --no-deps $(UV_FLAGS) -o $(LOCK_TOOLS)
	# micro-sam beside the venv: lock.txt as a constraint, so a package both name has one pin.
	$(UV) pip compile requirements/micro-sam.in --no-deps -c $(LOCK) $(UV_FLAGS) -o $(LOCK_MICRO_SAM)
	# Label Studio in its own venv (it needs numpy 2): resolved alone, not against lock.txt.
	$(UV) pip compile requirements/label-studio.in $(UV_FLAGS) -o $(LOCK_LABEL_STUDIO)
	# The GPU container's stubs run its system Python 3.10 (Dockerfile): their own lock.
	$(UV) pip compile requirements/container.in $(subst $(LOCK_PYTHON),3.10,$(UV_FLAGS)) -o requirements/lock-container.txt
	# The docs tools go into the same venv on top of lock.txt: compiled with lock.txt as a
	# constraint, so a package both need (jinja2, click, pyyaml...) has lock.txt's pin in both.
	$(UV) pip compile requirements/docs.in -c $(LOCK) $(UV_FLAGS) -o $(LOCK_DOCS)

# Non-blocking check before raising the lock: the parity tests against the newest releases
# (torch, torchvision, onnxruntime, transformers...) in a separate venv. Needs PyPI, and
# downloads torch (~3 GB): the pip cap of this machine is lifted for this venv only.
LATEST := .venv-latest
check-latest:
	rm -rf $(LATEST) && $(PYTHON) -m venv $(LATEST)
	PIP_CONSTRAINT= $(LATEST)/bin/python -m pip install -q --no-cache-dir -e ".[export,serve,dev]"
	SAM2_BUILD_CUDA=0 $(LATEST)/bin/python -m pip install -q --no-cache-dir \
	    --no-build-isolation --no-deps -r $(LOCK_SAM2)
	$(LATEST)/bin/python -m pip list 2>/dev/null | grep -iE '^(torch|torchvision|onnx|onnxruntime|transformers|numpy) '
	$(LATEST)/bin/pytest -q -p no:cacheprovider tests/parity || \
	    echo "check-latest: parity FAILS against the newest releases (non-blocking; see above)"

# Triton's perf_analyzer (C++), from the tritonclient wheel of the server's release.
$(PERF_ANALYZER): $(STAMP) scripts/install_perf_analyzer.sh $(LOCK_TOOLS)
	PYTHON=$(BIN)/python bash scripts/install_perf_analyzer.sh $(VENV)/tools/perf_analyzer

perf-analyzer: $(PERF_ANALYZER)

# micro-sam 1.8.14, the tiled SAM labs use today: the reference of the large-image parity
# tests (tests/micro_sam_support.py), next to the venv and not in it (its metadata asks for
# napari and PyQt6, which its prompt and embedding paths never import: `pip check` would
# fail). Only what the venv lacks is in the lock; the tests append this folder to sys.path
# after site-packages. Measured: 4.6 s from a local index, 193 MB.
MICRO_SAM := $(VENV)/tools/micro-sam
$(MICRO_SAM)/.installed: $(STAMP) $(LOCK_MICRO_SAM)
	rm -rf $(MICRO_SAM)
	$(PIP) --no-deps --require-hashes --only-binary=:all: --target $(MICRO_SAM) -r $(LOCK_MICRO_SAM)
	touch $@

micro-sam: $(MICRO_SAM)/.installed

# Label Studio 1.23 in its own venv (it needs numpy 2, the project's venv numpy<2): the
# backend's test against a real Label Studio (tests/integration/test_label_studio.py, marker
# label_studio; `make test-label-studio`) and trying the backend by hand
# (docs/label-studio.md). Every package hash-checked, no resolution.
LABEL_STUDIO := $(VENV)/tools/label-studio
$(LABEL_STUDIO)/.installed: $(LOCK_LABEL_STUDIO)
	rm -rf $(LABEL_STUDIO)
	$(PYTHON) -m venv $(LABEL_STUDIO)
	$(LABEL_STUDIO)/bin/python -m pip install -q --no-cache-dir --require-hashes --no-deps \
	    -r $(LOCK_LABEL_STUDIO)
	touch $@

label-studio: $(LABEL_STUDIO)/.installed

# The backend against a real Label Studio (starts it with SQLite in a tmp folder; ~60 s with
# the shared model export and Label Studio's start, measured on the 2-core dev machine).
test-label-studio: $(STAMP) $(LABEL_STUDIO)/.installed
	$(BIN)/pytest -m label_studio --durations=0

# Triton's onnxruntime backend (CPU) for the embedded tritonserver, built from Triton's sources
# (r24.10, cloned from github.com: needs network, cmake, g++, rapidjson-dev) against this
# venv's onnxruntime; `triton-sam serve` and the tests look here first, then for
# ../shared/triton-onnxruntime-backend/onnxruntime beside the checkout. See the script's header.
ORT_BACKEND := $(VENV)/tools/triton-onnxruntime-backend/onnxruntime
.PHONY: onnxruntime-backend
$(ORT_BACKEND)/libtriton_onnxruntime.so: $(STAMP) scripts/build_onnxruntime_backend.sh
	PYTHON=$(BIN)/python bash scripts/build_onnxruntime_backend.sh $(ORT_BACKEND)

onnxruntime-backend: $(ORT_BACKEND)/libtriton_onnxruntime.so

# nginx (Debian's nginx-light) for the image-affine proxy tests and `triton-sam
# bench replicas`; installs only when nginx is missing (apt-get, needs root or sudo).
proxy-tools:
	@bash scripts/install_nginx.sh

# Debian's Xvfb and the X libraries of PyQt5's xcb plugin for the napari plugin's tests
# (a real viewer on a virtual screen); installs only what is missing (apt-get, root or sudo).
qt-tools:
	@bash scripts/install_qt_tools.sh

# Debian's chromium + chromium-driver for the web annotator's browser test (headless, driven
# by selenium from the lock); installs only when either is missing (apt-get, root or sudo).
browser-tools:
	@bash scripts/install_chromium.sh

demo: $(STAMP)
	$(BIN)/triton-sam demo

# The documentation site (mkdocs.yml) into site/: the pages in docs/, the API reference from
# the docstrings, the CLI reference from the typer app. --strict: a broken link or anchor, or
# a page (docs/, README.md...) naming a command, pixi task or make target that does not
# exist, fails it (scripts/check_docs.py). `$(BIN)/mkdocs serve` previews it.
# NO_MKDOCS_2_WARNING: Material for MkDocs prints its notice at every build (maintained with
# fixes until May 2027; its successor, Zensical, reads this mkdocs.yml).
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP) $(LOCK_DOCS)
	# On top of lock.txt, hash-checked, no resolution: what both lock files name has one pin.
	$(PIP) --require-hashes --no-deps -r $(LOCK_DOCS)
	$(BIN)/python -m pip check
	touch $@

docs-tools: $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --clean --site-dir site

# Every tier, each one's time printed at the end (.ci/tiers): lint, the import contracts,
# the docs build and the unit tier beside the export, integration and parity tiers (one
# pytest run: their exports and servers are shared). docs/development.md: one tier alone.
test: $(STAMP) $(PERF_ANALYZER) $(MICRO_SAM)/.installed $(LABEL_STUDIO)/.installed proxy-tools browser-tools qt-tools $(DOCS_STAMP)
	BIN=$(BIN) bash .ci/tiers

test-fast: $(STAMP) $(MICRO_SAM)/.installed
	$(BIN)/pytest -m "not slow"

# lint-imports: the layers contract of pyproject.toml's [tool.importlinter] (docs/architecture.md).
lint: $(STAMP)
	$(BIN)/ruff check triton_sam tests
	$(BIN)/ruff format --check triton_sam tests
	$(BIN)/lint-imports --no-cache --no-logo

clean:
	rm -rf .demo outputs .pytest_cache site
