# The two commands of the README:
#   make demo   set up .venv with the library and its runtime dependencies only, then run the demo
#   make test   add the test stack to the same .venv, then run lint, type checks and every test
# Either works alone on a fresh clone; each set-up step is redone only when pyproject.toml changes.
#
# Prerequisites: Python >= 3.10 and make. Optional, for some tests only: Node.js >= 18 with npm
# (the Azure emulator, azurite; its tests skip without it) and Chromium (the HTML report's browser
# test uses one found on PATH or named by $CHROMIUM, and skips saying so otherwise).
# Nothing is installed outside this directory: packages go into .venv, azurite into .venv/node.

PYTHON ?= python3
NPM    ?= npm
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check
STAMP      := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
AZURITE    := azurite@3.37.0
PYTEST_ARGS ?=
# pytest workers (pytest-xdist): 2 fits the 2-core CI machine; `make test PYTEST_WORKERS=0` runs in one process
PYTEST_WORKERS ?= 2

.PHONY: setup setup-test demo test lint typecheck pytest bench clean

setup: $(STAMP)

# Runtime only: numpy, zstandard, crc32c, fsspec, ml_dtypes (no TensorStore, Orbax, JAX, emulators).
$(STAMP): pyproject.toml
	@echo "== make: setting up $(VENV) with ocdbt-py and its runtime dependencies"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --progress-bar on -e .
	@touch $(STAMP)

setup-test: $(TEST_STAMP)

# The test stack on top: TensorStore, Orbax, JAX, zarr, emulators, ruff, mypy (about 1.5 GB).
$(TEST_STAMP): $(STAMP) pyproject.toml
	@echo "== make: adding the test stack to $(VENV) (oracles, emulators, linters) with uv"
	@# uv puts the 1.9 GB stack in place from its cache in seconds where pip takes about two
	@# minutes (the same versions: both resolve pyproject.toml); pip does it if uv cannot be had.
	$(PIP) install -q uv && $(BIN)/uv pip install --python $(BIN)/python -e '.[test,dev,http,bench]' || \
	  $(PIP) install --progress-bar on -e '.[test,dev,http,bench]'
	@if command -v $(NPM) >/dev/null 2>&1; then \
	  echo "== make: installing Azure's storage emulator ($(AZURITE)) into $(VENV)/node with npm"; \
	  $(NPM) install --prefix $(VENV)/node --no-audit --no-fund --loglevel=error $(AZURITE); \
	else \
	  echo "== make: npm not found: the Azure (azurite) tests will be skipped (install Node.js >= 18 and npm to run them)"; \
	fi
	@if [ -z "$$CHROMIUM" ] && ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then \
	  echo "== make: no Chromium on PATH: the HTML report's browser test will be skipped (install Debian's chromium package, or set CHROMIUM=/path/to/chrome)"; \
	fi
	@touch $(TEST_STAMP)

demo: $(STAMP)
	$(BIN)/python -m ocdbt_py.demo

lint: $(TEST_STAMP)
	$(BIN)/ruff check ocdbt_py zarr3 tests conformance bench

typecheck: $(TEST_STAMP)
	$(BIN)/mypy

# pytest exits 5 when it collected nothing; that is not a failure of the project. Each test file
# runs on one worker (--dist loadfile), so tests of a file share its module fixtures and servers;
# --durations=30 says where the time goes.
pytest: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --durations=30 \
	  $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$rc

test: lint typecheck pytest

bench: $(TEST_STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info demo-output
