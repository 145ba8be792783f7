# The two commands of the README's contract:
#   make demo   set up .venv, then run the demo on local disk
#   make test   set up .venv, then run lint, type checks and every test
# Either works alone on a fresh clone; set-up is redone only when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup demo test lint typecheck pytest bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test,dev,http]'
	# Azure's storage emulator for the object-store tests (Node >= 18), kept inside .venv
	npm install --prefix $(VENV)/node --no-audit --no-fund --loglevel=error azurite@3.37.0
	@touch $(STAMP)

demo: setup
	$(BIN)/python -m ocdbt_py.demo

lint: setup
	$(BIN)/ruff check ocdbt_py zarr3 tests conformance bench

typecheck: setup
	$(BIN)/mypy

# pytest exits 5 when it collected nothing; that is not a failure of the project.
pytest: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$rc

test: lint typecheck pytest

bench: setup
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
