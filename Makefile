VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export HF_HUB_OFFLINE := 1

.PHONY: install install-dev demo lint test test-fast bench docs clean

# install: what `make demo` runs (extraction with PyTorch, the DVC pipeline); install-dev adds Dask and pytest.
# `pip install -e .` alone (in a clone) is the light install: learn, sweep, predict, evaluate, summary, info.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[extract,pipeline]'
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install -q -e '.[extract,pipeline,dist,dev]'
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

# The DVC pipeline on params.yaml's datasets (offline default: digits), then the table of results.
demo: install
	PATH="$(abspath $(VENV))/bin:$$PATH" dvc repro
	@echo "Plots and summary.md per run: runs/<name>/eval/ (or: dvc plots show; dvc metrics show)"
	@PATH="$(abspath $(VENV))/bin:$$PATH" foal-pipe summary runs

# mypy checks the whole package (pyproject.toml [tool.mypy]).
lint: install-dev
	$(VENV)/bin/ruff check foal_pipe tests stages benchmarks
	$(VENV)/bin/mypy

test: install-dev
	$(PY) -m pytest -q

# The suite without the tests marked slow (Dask clusters, SIGKILL loops, dvc repro, real timm ViTs, concurrent
# processes): a quick check while editing; `make test` runs everything.
test-fast: install-dev
	$(PY) -m pytest -q -m "not slow"

# The documentation site: docs/*.md and the docstrings (mkdocs.yml), built offline into site/; warnings fail it.
$(VENV)/.installed-docs: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q -e '.[docs]'
	touch $@

docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site

bench: install-dev
	$(PY) benchmarks/learn_bench.py
	$(PY) benchmarks/extract_bench.py

clean:
	rm -rf runs .pytest_cache
