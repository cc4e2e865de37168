# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
PIP     = $(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt

.PHONY: demo test lint format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-all: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) torch==2.13.0
	$(PIP) -e '.[all]'
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev]'
	# timm, to test ViT attention against it: its hard torchvision dependency does not install
	# beside this torch, and its attention layer does not need it (the test stubs it out)
	$(PIP) --no-deps timm==1.0.31
	touch $@ $(VENV)/.installed-all

demo: $(VENV)/.installed-all
	$(BIN)/qkv demo $(DEMO_ARGS)

test: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

format: $(VENV)/.installed-dev
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

bench: $(VENV)/.installed-dev
	$(BIN)/python -m benchmarks.mha

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
