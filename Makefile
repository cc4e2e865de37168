# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
PIP     = $(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt
# Where PyTorch comes from: empty, pip's own configuration (here, the CPU wheel on this disk);
# e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu for PyTorch's CPU wheels anywhere.
TORCH_INDEX ?=
TORCH   = torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
# The headless browser the viewer's tests drive (tests/viz): `make test` installs Debian's
# chromium when it is missing (as root, with apt-get); the tests themselves never install it.
QKV_CHROMIUM ?= /usr/bin/chromium
export QKV_CHROMIUM

# pytest's processes (pytest-xdist; each test runs on one torch thread, see tests/conftest.py):
# one per CPU, at most 4, each test file in one process (its fixtures built once), the longest
# files handed out first (tests/conftest.py's LONGEST_FIRST), the others in the order collected;
# PYTEST_WORKERS=0 runs them all in this one
PYTEST_WORKERS ?= auto
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,-n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadfile --no-loadscope-reorder)

# pytest runs with bytecode written (into __pycache__/, which git ignores) even where the
# environment sets PYTHONDONTWRITEBYTECODE: else each of the suite's many `qkv` subprocesses
# compiles qkv's sources again, and pytest rewrites every test module again on every run
PYTEST  = env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest

.PHONY: demo test test-quick docs docs-check browser fonts lint format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-all: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) $(TORCH)
	$(PIP) -e '.[all]'
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) $(TORCH)
	$(PIP) -e '.[dev]'
	# timm, to test ViT attention against it: its hard torchvision dependency does not install
	# beside this torch, and its attention layer does not need it (the test stubs it out)
	$(PIP) --no-deps timm==1.0.31
	touch $@ $(VENV)/.installed-all

demo: $(VENV)/.installed-all fonts
	$(BIN)/qkv demo $(DEMO_ARGS)

test: $(VENV)/.installed-dev browser fonts
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools
	$(BIN)/python -m tools.docs_site check
	$(PYTEST) $(XDIST) $(PYTEST_ARGS)

# the same without the tests marked slow (a few minutes less; see pyproject's pytest markers)
test-quick: $(VENV)/.installed-dev browser fonts
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools
	$(PYTEST) -m "not slow" $(XDIST) $(PYTEST_ARGS)

# The documentation site (MkDocs Material) in site/: English, and Chinese in site/zh/. Every
# notebook is executed and shown with its outputs; the executed copies are kept in
# .cache/notebooks/ and reused while a notebook's cells are unchanged. Open site/index.html.
docs: $(VENV)/.installed-dev fonts
	$(BIN)/python -m tools.docs_site build

# the same build in strict mode (a broken link or anchor fails it), executing nothing: notebooks
# not in the cache show their code only (a few seconds; `make test` runs it)
docs-check: $(VENV)/.installed-dev
	$(BIN)/python -m tools.docs_site check

browser:
	@if [ -x "$(QKV_CHROMIUM)" ] || command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" != 0 ]; then \
	    echo "make: no Chromium at $(QKV_CHROMIUM) and not root to install it (sudo sh tools/ensure_chromium.sh): the browser tests will be skipped"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	    echo "make: no Chromium at $(QKV_CHROMIUM) and no apt-get to install it (install Chromium, or set QKV_CHROMIUM=/path/to/it): the browser tests will be skipped"; \
	elif ! sh tools/ensure_chromium.sh; then \
	    echo "make: installing Chromium failed (above): the browser tests will be skipped"; \
	fi

# CJK glyphs for the figures (fonts-noto-cjk), as root like the browser; without it the figures
# draw CJK tokens as boxes and qkv warns once, naming the package
fonts:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    sh tools/ensure_fonts.sh || echo "make: installing fonts-noto-cjk failed (above): CJK tokens draw as boxes"; \
	fi

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools

format: $(VENV)/.installed-dev
	$(BIN)/ruff format src tests benchmarks tools
	$(BIN)/ruff check --fix src tests benchmarks tools

bench: $(VENV)/.installed-dev
	$(BIN)/python -m benchmarks.mha

clean:
	rm -rf $(VENV) build site .cache src/*.egg-info .pytest_cache .ruff_cache
