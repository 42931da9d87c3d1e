# `make setup` installs everything the zoo needs (idempotent: a stamp skips it when nothing changed);
# `make test` runs the whole test suite; `make quickstart` trains, exports, fetches and evaluates a model, then
# classifies texts with a published BERT entry.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.zoo-setup-done
# The text datasets (zoo/data/langid/sources.py): Debian packages downloaded as .deb files and unpacked (never installed),
# each with its VERSION: fortunes databases, LibreOffice help and the GNOME user guide in eight languages, and the
# message catalogs of coreutils, the GNU C library and tar (a held-out domain of benchmarks/baselines.py).
TEXTS := $(VENV)/share/zoo-data/text
TEXT_PACKAGES := fortunes fortunes-de fortunes-es fortunes-it fortunes-pl fortunes-ru fortunes-cs fortunes-br \
  libreoffice-help-en-us libreoffice-help-de libreoffice-help-es libreoffice-help-it libreoffice-help-pl \
  libreoffice-help-ru libreoffice-help-cs libreoffice-help-pt-br gnome-user-docs coreutils libc-l10n tar
# Renamed whenever TEXT_PACKAGES changes, so a checkout set up before unpacks the new list.
TEXTS_DONE := $(TEXTS)/.done-2
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Runs of the test suite and benchmarks use this many threads per process (2-core machines).
export OMP_NUM_THREADS ?= 1

# Stores: the repository's own store (store/), then the mirrors: ZOO_LFS_URL, git's lfs.url, the clone's remote
# (zoo/config.py). CI's validation fetches every entry from store/.

.PHONY: setup test validate validate-full validation-report quickstart benchmarks manifest docs docs-serve

setup: $(STAMP) $(TEXTS_DONE)

$(TEXTS_DONE):
	rm -rf $(TEXTS).tmp && mkdir -p $(TEXTS).tmp/debs
	cd $(TEXTS).tmp/debs && (apt-get download $(TEXT_PACKAGES) || \
	  ($(SUDO) apt-get update -q && apt-get download $(TEXT_PACKAGES)))
	for deb in $(TEXTS).tmp/debs/*.deb; do p=$$(dpkg-deb -f $$deb Package); \
	  dpkg -x $$deb $(TEXTS).tmp/$$p && dpkg-deb -f $$deb Version > $(TEXTS).tmp/$$p/VERSION || exit 1; done
	rm -rf $(TEXTS).tmp/debs $(TEXTS) && mv $(TEXTS).tmp $(TEXTS) && touch $(TEXTS_DONE)

$(STAMP): pyproject.toml Makefile tools/cxx17
	@git lfs version >/dev/null 2>&1 || $(SUDO) apt-get install -y -q git-lfs || \
	  ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q git-lfs)
	@command -v chromium >/dev/null || $(SUDO) apt-get install -y -q chromium || \
	  ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium)
	@# jemalloc: `zoo train` starts training workers on it (zoo/train/memory.py: allocator_env).
	@ldconfig -p 2>/dev/null | grep -q libjemalloc.so.2 || $(SUDO) apt-get install -y -q libjemalloc2 || \
	  ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q libjemalloc2)
	@# `ip` makes the two network namespaces of the multi-node test.
	@command -v ip >/dev/null || $(SUDO) apt-get install -y -q iproute2 || \
	  ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q iproute2)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip wheel setuptools
	# torch first and pinned: anything else may pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# DeepSpeed's build must see the installed torch (isolation would fetch another one).
	$(BIN)/pip install -q --no-build-isolation deepspeed==0.19.8
	# Horovod builds from source; its CMake forces C++14, torch needs C++17 (tools/cxx17).
	@$(BIN)/python -c "import horovod.torch" 2>/dev/null || \
	  CXX=$(CURDIR)/tools/cxx17 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	  HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo MAKEFLAGS=-j2 \
	  $(BIN)/pip install -q --no-build-isolation --no-cache-dir horovod==0.28.1
	# DeepSpeed's CPU communication op, built once here (~1-2 min) rather than JIT in every job's first step;
	# launchers/deepspeed.py points TORCH_EXTENSIONS_DIR at this folder.
	TORCH_EXTENSIONS_DIR=$(CURDIR)/$(VENV)/torch-extensions DS_ACCELERATOR=cpu $(BIN)/python -c \
	  "from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('ShareMemCommBuilder').load()"
	# Every installed package's requirements hold, pyproject's pins included (a later install may have moved one).
	$(BIN)/pip check
	touch $(STAMP)

# The main job on an embedded default: train digits-cnn quantization-aware under torchrun (2 processes,
# gloo on CPU), then get the catalog entry (fetched from the configured LFS stores, or built from its recipe at the
# card's commit when no store has it, verified like a download) and measure it with onnxruntime; then a published
# BERT entry (bert-tiny, from store/) classifies texts in four languages.
quickstart: setup
	$(BIN)/torchrun --standalone --nproc_per_node 2 launchers/ddp.py --recipe qat-int8 --output-dir runs/quickstart
	$(BIN)/zoo fetch digits-cnn --variant int8-qat --build
	$(BIN)/zoo evaluate digits-cnn --variant fp32 --variant int8-qat
	$(BIN)/zoo predict bert-tiny --variant int8-qat "Der Hund schläft im Garten." "El perro duerme en el jardín." \
	  "Кошка спит на диване." "The dog sleeps in the garden."

# The tests and, beside them, CI's re-measurement of every model (ci/validate.sh: every entry, variant and opset).
# Running the tests never modifies the checkout (builds record its commit): checked after the run.
test: setup
	@mkdir -p build && git status --porcelain --untracked-files=all > build/checkout-before-tests.txt
	@# pytest in two parts, validation beside them at idle priority: ci/test.sh
	@bash ci/test.sh
	@git status --porcelain --untracked-files=all | diff build/checkout-before-tests.txt - || \
	  (echo "make test changed the checkout (lines above): tests must write to ignored or temporary folders"; exit 1)

validate: setup
	bash ci/validate.sh

validate-full: setup
	ZOO_REBUILD_BUDGET=none bash ci/validate.sh

# The committed report (benchmarks/results/validation.*, shown on the docs site): refreshed on purpose, never by
# `make test`, whose report stays in build/ (tests must not modify tracked files).
validation-report: setup
	ZOO_VALIDATION_REPORT=benchmarks/results/validation.md bash ci/validate.sh

manifest: setup
	$(BIN)/zoo manifest

benchmarks: setup
	$(BIN)/python benchmarks/baselines.py
	$(BIN)/python benchmarks/tokenization.py
	$(BIN)/python benchmarks/fetch_throughput.py
	$(BIN)/python benchmarks/training.py
	$(BIN)/python benchmarks/length_grouping.py
	$(BIN)/python benchmarks/eval_batch.py
	$(BIN)/python benchmarks/latency.py
	$(BIN)/python benchmarks/parallel.py

docs: setup
	$(BIN)/zoo docs
	$(BIN)/mkdocs build --strict --site-dir site

docs-serve: docs
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000
