# The two commands of the README: `make demo` (main job) and `make test` (the test suite, run by CI).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
export HF_HUB_OFFLINE ?= 1

.PHONY: demo test lint format install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Re-install whenever the project metadata changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Until the training loop lands, the main job is what runs end to end today: the presets, the resolved
# quickstart config, and the advantage estimator on a paper-sized batch against the reference loop.
demo: install
	$(BIN)/sao presets
	$(BIN)/sao config configs/quickstart.yaml
	$(BIN)/python benchmarks/gae.py

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

format: install
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

test: lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache .hypothesis
