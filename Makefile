# The two commands a new user runs on a fresh machine: `make run` and `make test`.
# Both create .venv when missing and (re)install the package, which compiles the
# cffi extension, whenever the sources of the build change.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NATIVE_SOURCES := $(wildcard fulmar/_native/src/*.c fulmar/_native/src/*.h) fulmar/_native/build.py
PYTEST_ARGS ?=

.PHONY: install bytecode run test test-all soak lint typecheck codecs bench bench-quick clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel

$(STAMP): $(PY) pyproject.toml setup.py $(NATIVE_SOURCES)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP) bytecode

# Each node process imports the package; without cached bytecode (e.g. under
# PYTHONDONTWRITEBYTECODE) every start compiles the generated codecs again,
# which is slow and leaves each process ~15 MiB larger.  compileall writes
# the caches whatever that variable says and skips files already compiled.
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 fulmar/ codecs driver archive consensus service cli > /dev/null

run: $(STAMP) bytecode
	$(PY) -m fulmar.demo

# Everything except the runs marked slow (make soak runs those).
# Each run gets its own temporary base directory (removed afterwards), so
# concurrent runs on one machine never clean up each other's files.
PYTEST = tmp=$$(mktemp -d /tmp/fulmar-test-XXXXXX); $(PY) -m pytest --basetemp=$$tmp
PYTEST_END = ; status=$$?; rm -rf $$tmp; exit $$status

test: $(STAMP) bytecode
	$(PY) -m mypy
	$(PYTEST) -m 'not slow' $(PYTEST_ARGS) $(PYTEST_END)

soak: $(STAMP) bytecode
	$(PYTEST) -m slow $(PYTEST_ARGS) $(PYTEST_END)

typecheck: $(STAMP)
	$(PY) -m mypy

codecs: $(STAMP)
	$(PY) -m fulmar.codecs.generate

bench: $(STAMP) bytecode
	$(PY) -m bench $(BENCH_ARGS)

bench-quick: $(STAMP) bytecode
	$(PY) -m bench --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info fulmar/_native/_fulmar_native.* .mypy_cache .pytest_cache
