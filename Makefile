# Iris Desktop. Two commands matter: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
ifeq ($(OS),Windows_NT)
BIN := $(VENV)/Scripts
PY := $(BIN)/python.exe
else
BIN := $(VENV)/bin
PY := $(BIN)/python
endif
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run test install install-dev lint bench screenshots dist windows-check gpu-check clean distclean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(BIN)/python -m pip install -e .
	touch $@

$(DEV_STAMP): pyproject.toml | $(PY)
	$(BIN)/python -m pip install -e '.[dev]'
	touch $@ $(STAMP)

install: $(STAMP)
install-dev: $(DEV_STAMP)

## make run: create .venv, install, and start the desktop app on the bundled model
run: $(STAMP)
	$(BIN)/iris-desktop

## make test: create .venv, install with dev extras, build llama.cpp's llama-server for the
## server tests (once, cached in ~/.cache/iris-desktop-tests; minutes), run the whole suite
test: $(DEV_STAMP)
	$(BIN)/python tests/support/servers.py --build
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q
	$(BIN)/ruff check iris_desktop tests bench packaging tools

lint: $(DEV_STAMP)
	$(BIN)/ruff check iris_desktop tests bench packaging tools

## make bench: every benchmark (the model-based ones take minutes on two cores)
bench: $(DEV_STAMP)
	$(BIN)/python bench/context_build.py
	$(BIN)/python bench/recall_cost.py
	$(BIN)/python bench/prefix_reuse.py
	$(BIN)/python bench/resume.py
	$(BIN)/python bench/stop_latency.py
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/loops.py
	$(BIN)/python bench/sawtooth.py
	$(BIN)/python bench/retention.py
	$(BIN)/python bench/longmemeval.py
	$(BIN)/python bench/agent_summaries.py
	$(BIN)/python tests/support/servers.py --build
	$(BIN)/python bench/server_vs_local.py
	QT_QPA_PLATFORM=offscreen $(BIN)/python bench/ui_latency.py

## make screenshots: the real app under Xvfb with a prepared data dir -> docs/img/*.png
## (without xvfb-run, or with SHOTS_ARGS=--offscreen: Qt's offscreen platform, same size)
screenshots: $(DEV_STAMP)
	$(BIN)/python tools/screenshots.py --out docs/img $(SHOTS_ARGS)

## make dist: the one-folder app and this OS's installers, into dist/
## (packaging/build.py --help lists the options, e.g. make dist DIST_ARGS=--no-deb)
dist: $(STAMP)
	$(BIN)/python packaging/build.py $(DIST_ARGS)

## make windows-check: on Debian, the Windows installer built and tested under Wine: llama.cpp
## cross-compiled with mingw-w64 (the CPU variants and ggml-vulkan.dll, whose imports objdump must
## show to be vulkan-1.dll, never shipped, besides system and bundled DLLs), the app frozen by the
## spec and the installer written by ISCC (packaging/build.py under Wine), installed silently, its
## --self-test run offline (on the CPU: Wine has no GPU; again on lavapipe through Wine's vulkan-1.dll
## with GGML_VK_VISIBLE_DEVICES=0), uninstalled. --until PHASE stops early (--until llama: the cross-build).
## Installs Debian packages; caches in ~/.cache/iris-windows-check (first run long, then minutes)
windows-check:
	$(PYTHON) packaging/windows/check.py $(WINDOWS_CHECK_ARGS)

## make gpu-check: on Debian, the GPU path (model.gpu) on Mesa's lavapipe: installs the Debian Vulkan
## packages, compiles llama-cpp-python with packaging/build.py's Linux flags and -DGGML_VULKAN=on (2 jobs;
## cached in ~/.cache/iris-gpu-check: long the first time), and checks in a venv with that build: every
## layer offloaded, 'Paris', the same greedy tokens as the CPU, a partial split, model.gpu=off without a GPU
## buffer, the CPU with one sentence when there is no Vulkan driver, tests/test_gpu.py's GPU tests;
## then the frozen Linux app and .deb (packaging/build.py --llama-wheel on a copy of the checkout in the
## cache, never this dist/): libggml-vulkan.so in it, no libvulkan.so* in it or the .deb, Recommends:
## libvulkan1, its --self-test offline on lavapipe (every layer) and without a driver or loader (CPU);
## last, make windows-check (the Windows installer with ggml-vulkan.dll, its imports read with objdump -p;
## installed under Wine its self-test passes on the CPU, and on lavapipe where Wine lists it), its
## closing line's figures in gpu-check's. GPU_CHECK_ARGS=--no-windows leaves that out, --only-windows runs
## it alone. lavapipe proves the offload path, not speed. `make test` never compiles any of this
gpu-check: $(DEV_STAMP)
	$(PYTHON) packaging/gpu/check.py $(GPU_CHECK_ARGS)

## make clean keeps build/wheels (the compiled llama-cpp-python and numpy); distclean does not
clean:
	rm -rf dist build/pyinstaller build/deb .pytest_cache .ruff_cache

distclean: clean
	rm -rf build
