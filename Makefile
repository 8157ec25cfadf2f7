# decodelab — the two commands of the README, and the GPU-machine targets.
#   make report    set up .venv, run every notebook (profile from the hardware), export the HTML
#   make test      set up .venv, run the test suite (GPU tests skip without CUDA)
#   make test-fast the suite without the slow tests (notebook runs, the report, browsers)
#   make lab       set up .venv, start JupyterLab on notebooks/ (the URL is printed)
#   make test-gpu  GPU-marked tests with the machine's own python3 (installs nothing)
#   make bench-gpu reference measurements with the machine's own python3 (installs nothing)
#   make report-gpu the report (profile gpu) with the machine's own python3 (installs nothing)
#   make bench-gpu-tp  tensor-parallel reference measurements on every GPU of the machine

PYTHON     ?= python3
VENV       := .venv
VPY        := $(VENV)/bin/python
STAMP      := $(VENV)/.decodelab-installed
# CPU machines take the CPU build of torch first; the pyproject's range then installs nothing
# more. Elsewhere set TORCH_INDEX=https://download.pytorch.org/whl/cpu to get the CPU build.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
PROFILE    ?=
PIP        := $(VPY) -m pip install --quiet --disable-pip-version-check
HAS_CUDA   := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: setup browser report test test-fast lab test-gpu bench-gpu bench-gpu-tp report-gpu lint \
  notebooks-sync clean-local

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
ifeq ($(HAS_CUDA),1)
	$(PIP) "torch>=2.11,<2.14"
else
	$(PIP) "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
endif
	$(PIP) -e ".[notebooks,reference,dev]"
	$(VPY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

report: setup
	$(VPY) -m decodelab report $(if $(PROFILE),--profile $(PROFILE))

test: setup browser
	$(VPY) -m pytest -q

test-fast: setup
	$(VPY) -m pytest -q -m "not slow"

# JupyterLab on notebooks/. It prints the URL with its token; without a display it opens no
# browser (open the URL from your machine, e.g. through `ssh -L 8888:127.0.0.1:8888`).
# decodelab.lab's contents manager pairs each .ipynb with its .py (notebooks/jupytext.toml) and
# saves the .ipynb without outputs: a save changes the tracked files only where a source did.
LAB_PORT ?= 8888
# Root (a container, CI) needs --allow-root; the server listens on loopback only all the same.
LAB_ARGS ?= $(if $(DISPLAY),,--no-browser) $(if $(filter 0,$(shell id -u)),--allow-root)
lab: setup
	@echo "JupyterLab on notebooks/, port $(LAB_PORT): open the URL with the token it prints below"
	$(VPY) -m jupyterlab --ServerApp.root_dir=notebooks --ServerApp.ip=127.0.0.1 \
	  --ServerApp.port=$(LAB_PORT) --ServerApp.port_retries=0 \
	  --ServerApp.contents_manager_class=decodelab.lab.PairedContentsManager $(LAB_ARGS)

# Headless Chromium renders the exported report and drives JupyterLab in tests: Debian's
# chromium is installed when missing, apt-get exists and we are root; otherwise those tests
# skip and say why.
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 \
	  && [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo "chromium not installed: the report rendering and JupyterLab tests will skip"

test-gpu:
	NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=lib $(PYTHON) -m pytest -q -m gpu -p no:cacheprovider tests

bench-gpu:
	PYTHONPATH=lib $(PYTHON) -m decodelab bench all --profile gpu \
	  --out data/reference/$$(PYTHONPATH=lib $(PYTHON) -c 'from decodelab.core.device import collect_info; print(collect_info().label)')

# For a GPU machine without internet (setup cannot install): papermill, nbconvert and ipykernel
# must already be importable, e.g. from wheels installed with `pip install --target DIR` and
# DIR on PYTHONPATH (set JUPYTER_PATH=DIR/share/jupyter too, or nbconvert finds no templates).
report-gpu:
	PYTHONPATH=$(CURDIR)/lib$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) -m decodelab report --profile gpu

# One process per GPU (torchrun); NVLink multicast stays off in every process.
TP_GPUS ?= $(shell nvidia-smi -L 2>/dev/null | wc -l)
bench-gpu-tp:
	NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=lib \
	  $(PYTHON) -m torch.distributed.run --standalone --nproc-per-node $(TP_GPUS) -m decodelab bench tp \
	  --profile gpu --out data/reference/$$(PYTHONPATH=lib $(PYTHON) -c 'from decodelab.core.device \
	  import collect_info; print(collect_info().label)')x$(TP_GPUS)

lint: setup
	$(VPY) -m ruff check lib tests notebooks

notebooks-sync: setup
	$(VPY) -m jupytext --quiet --to ipynb --update notebooks/[0-9][0-9]_*.py

clean-local:
	rm -rf data/local/* && touch data/local/.gitkeep
