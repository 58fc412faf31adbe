# mmvitswin: one-command environment, demo, tests and benchmark.
#   make install   .venv from nothing: torch ($(TORCH_SPEC)), mmcv $(MMCV_VERSION) compiled with ops, mmvitswin[openmmlab,tests,deploy]
#   make demo      train + evaluate Mask R-CNN Swin on the generated "shapes" data
#   make test      the whole pytest suite (what CI runs), one worker per core (TEST_JOBS)
#   make test-fast the edit loop, under a minute on 2 cores: pytest -m "not slow" (no
#                  subprocesses, training, benchmark tool or full-size reference parity;
#                  the tier is marked at each test: @pytest.mark.slow or a module pytestmark)
#   make bench     the standard speed/memory benchmark against mmdet's, timm's and HF's Swin
#   make test-compat  the suite on the oldest tested stack: $(COMPAT_VENV) with $(COMPAT_TORCH_SPEC),
#                  Python 3.8, numpy<2 and mmcv $(MMCV_VERSION) compiled against that torch
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
MMCV_VERSION ?= 2.1.0
# timm: a test oracle (its Swin V2 module) and a benchmark peer; 1.0.31 needs Python >= 3.10.
TIMM_SPEC ?= timm==1.0.31
# Built mmcv wheels are kept here, one folder per torch version, and reused by the next install.
WHEEL_DIR ?= $(HOME)/.cache/mmvitswin/wheels
FORCE_CUDA ?= 0
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
STAMP := $(VENV)/.stamps
# The compatibility floor (README "Tested versions"): a second venv built by the same rules.
COMPAT_VENV ?= .venv-compat
COMPAT_TORCH_SPEC ?= torch==2.1.2
COMPAT_TIMM_SPEC ?= timm==1.0.30
COMPAT_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.8*/bin/python) python3.8)
# Pins applied to every pip call of the compat build (numpy<2: torch 2.1 was built against 1.x).
COMPAT_CONSTRAINTS ?= $(CURDIR)/requirements/compat-constraints.txt

.PHONY: install test test-fast demo bench clean reinstall-mmcv install-compat test-compat

install: $(STAMP)/package
	@$(BIN)/python tools/check_mmcv_ops.py

$(STAMP)/venv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip "setuptools<70" wheel ninja
	@mkdir -p $(STAMP) && touch $@

# The torch stamp remembers the spec, so a different TORCH_SPEC reinstalls torch (and mmcv).
$(STAMP)/torch: $(STAMP)/venv
	@if [ "$$(cat $@ 2>/dev/null)" != "$(TORCH_SPEC)" ]; then \
		$(BIN)/pip install "$(TORCH_SPEC)" && echo "$(TORCH_SPEC)" > $@ && rm -f $(STAMP)/mmcv; \
	fi
	@test -f $@

# mmcv has no wheel for recent torch: compile it with ops against the torch in this venv.
# --no-build-isolation is essential: with isolation it builds silently WITHOUT ops.
$(STAMP)/mmcv: $(STAMP)/torch
	@# torch asks for setuptools>=77, which dropped pkg_resources; mmcv's setup.py needs it.
	@if ! $(BIN)/python -c 'import pkg_resources, numpy' 2>/dev/null; then \
		$(BIN)/pip install "setuptools<70" numpy; \
	fi
	@set -e; \
	tv=$$($(BIN)/python -c 'import torch; print(torch.__version__)'); \
	py=$$($(BIN)/python -c 'import sys; print("cp%d%d" % sys.version_info[:2])'); \
	dir="$(WHEEL_DIR)/torch-$$tv"; \
	whl=$$(ls "$$dir"/mmcv-$(MMCV_VERSION)-$$py-*.whl 2>/dev/null | head -n 1); \
	if [ -z "$$whl" ]; then \
		echo "Compiling mmcv $(MMCV_VERSION) with ops against torch $$tv (about 12 min on 2 cores)..."; \
		mkdir -p "$$dir"; \
		MMCV_WITH_OPS=1 FORCE_CUDA=$(FORCE_CUDA) MAX_JOBS=$(JOBS) \
			$(BIN)/pip wheel --no-build-isolation --no-deps --no-cache-dir \
			"mmcv==$(MMCV_VERSION)" -w "$$dir"; \
		whl=$$(ls "$$dir"/mmcv-$(MMCV_VERSION)-$$py-*.whl | head -n 1); \
	else \
		echo "Reusing compiled $$whl"; \
	fi; \
	$(BIN)/pip install --force-reinstall --no-deps "$$whl"; \
	$(BIN)/pip install "$$whl"
	$(BIN)/python tools/check_mmcv_ops.py
	@touch $@

$(STAMP)/package: $(STAMP)/mmcv setup.cfg pyproject.toml setup.py Makefile
	$(BIN)/pip install -e ".[openmmlab,tests,deploy]"
	# mmaction2's wheel pins deps we do not need; the Video Swin parity test only reads one file of it.
	$(BIN)/pip install --no-deps "mmaction2==1.2.0"
	# mmpretrain's likewise (its multimodal and evaluation code): the Swin V2 parity test imports
	# its backbone module alone, which needs importlib_metadata besides what is installed.
	$(BIN)/pip install --no-deps "mmpretrain==1.2.0"
	$(BIN)/pip install importlib_metadata
	# timm likewise: its torchvision requirement would replace our torch (tools/benchmark.py
	# imports it with a torchvision stub where torchvision is missing).
	$(BIN)/pip install --no-deps "$(TIMM_SPEC)"
	@touch $@

reinstall-mmcv:
	rm -f $(STAMP)/mmcv $(STAMP)/package
	$(MAKE) install

# One worker per core (pytest-xdist, at most TEST_JOBS), each with one intra-op thread: the slowest
# tests trace models for torch.compile / ONNX export, which is single-threaded Python.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
test: install
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist worksteal --durations=25 tests

# One worker per core, one intra-op thread each: the fast tier is many small ops
# (tests/conftest.py, MMVITSWIN_TEST_THREADS); under a minute on 2 cores.
test-fast: install
	MMVITSWIN_TEST_THREADS=1 $(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist worksteal \
		-m "not slow" tests

# Same rules as `install`, other venv/torch/python. PIP_CONSTRAINT replaces the machine-wide pip
# constraint file (if any) for these pip calls only.
install-compat:
	PIP_CONSTRAINT="$(COMPAT_CONSTRAINTS)" $(MAKE) install VENV="$(COMPAT_VENV)" \
		TORCH_SPEC="$(COMPAT_TORCH_SPEC)" PYTHON="$(COMPAT_PYTHON)" TIMM_SPEC="$(COMPAT_TIMM_SPEC)"

test-compat: install-compat
	$(COMPAT_VENV)/bin/python -m pytest -q -n $(TEST_JOBS) --dist worksteal --durations=25 tests

demo: install
	$(BIN)/python tools/demo.py

bench: install
	$(BIN)/python tools/benchmark.py --preset standard --out-dir bench_out

clean:
	rm -rf $(VENV) $(COMPAT_VENV) build *.egg-info
