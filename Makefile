# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# what `make test` and `make venv` install: the project with its dev tools (ruff, mypy,
# pytest, transformers, mkdocs...); `make demo` installs only what the demo runs on
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# The package index to take torch's CPU build from. Empty: pip's own configuration (on a
# machine with the CPU wheel on disk, as this project's CI has). On an ordinary Linux
# machine an unpinned index gives the multi-GB CUDA build: make demo
# TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
TORCH_PIN := torch==2.13.0
TORCH_FROM := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)

.PHONY: venv demo test lint typecheck format bench docs clean

venv: $(STAMP)

$(VENV)/bin/python:
	@echo "== creating the virtual environment $(VENV) ($(PYTHON) -m venv)"
	$(PYTHON) -m venv $(VENV)

$(VENV)/.torch: constraints.txt | $(VENV)/bin/python
	@echo "== installing $(TORCH_PIN), CPU build$(if $(TORCH_INDEX), from $(TORCH_INDEX),) (a 190 MB wheel, 750 MB installed; pip says what it fetches)"
	$(PIP) install --progress-bar on -c constraints.txt $(TORCH_FROM) $(TORCH_PIN)
	touch $@

$(DEMO_STAMP): pyproject.toml constraints.txt $(VENV)/.torch
	@echo "== installing the project (editable) and the demo's one extra: scikit-learn (its digits data set)"
	$(PIP) install --progress-bar on -c constraints.txt -e '.[demo]'
	touch $@

$(STAMP): pyproject.toml constraints.txt $(VENV)/.torch
	@echo "== installing the project (editable) with its dev tools: pytest, hypothesis, ruff, mypy, transformers, scikit-learn, matplotlib, mkdocs"
	$(PIP) install --progress-bar on -c constraints.txt -e '.[dev]'
	touch $@ $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m mpc.examples.demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy pointers mpc benchmarks
	$(PY) -m pytest -q -x -p no:cacheprovider tests $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy on both packages and the benchmarks (also part of `test`, at zero errors: issue 11)
typecheck: $(STAMP)
	$(VENV)/bin/mypy pointers mpc benchmarks

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	$(PY) -m pytest benchmarks -q -p no:cacheprovider --benchmark-only $(PYTEST_ARGS)

# The documentation site (mkdocs + mkdocstrings API reference) in site/; warnings are errors.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache site
