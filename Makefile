# The two commands a new user runs on a fresh machine: `make run` and `make test`.
# Both create .venv when missing and (re)install the package, which compiles the
# cffi extension, whenever the sources of the build change.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NATIVE_SOURCES := $(wildcard fulmar/_native/src/*.c fulmar/_native/src/*.h) fulmar/_native/build.py
PYTEST_ARGS ?=
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.py,%,$(wildcard tests/fuzz/fuzz_*.py))

.PHONY: install bytecode run test test-all soak test-slow chaos lint format typecheck docs codecs bench bench-quick fuzz clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel

$(STAMP): $(PY) pyproject.toml setup.py $(NATIVE_SOURCES)
	$(PY) -m pip install --quiet -e '.[test,bench,spark,docs]'
	touch $(STAMP)

install: $(STAMP) bytecode

# Each node process imports the package; without cached bytecode (e.g. under
# PYTHONDONTWRITEBYTECODE) every start compiles the generated codecs again,
# which is slow and leaves each process ~15 MiB larger.  compileall writes
# the caches whatever that variable says and skips files already compiled.
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 fulmar/ codecs driver archive consensus service cli analytics > /dev/null

run: $(STAMP) bytecode
	$(PY) -m fulmar.demo

# Everything except the runs marked slow (make test-slow runs those).
# Each run gets its own temporary base directory (removed afterwards), so
# concurrent runs on one machine never clean up each other's files.
PYTEST = tmp=$$(mktemp -d /tmp/fulmar-test-XXXXXX); $(PY) -m pytest --basetemp=$$tmp
PYTEST_END = ; status=$$?; rm -rf $$tmp; exit $$status

test: $(STAMP) bytecode
	$(PY) -m mypy
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(DOCS_BUILD)
	$(PYTEST) -m 'not slow' $(PYTEST_ARGS) $(PYTEST_END)

# The runs marked slow: a million messages over lossy UDP, 10,000 election
# simulation seeds, a round of every chaos fault on 3 members and on 5.
test-slow: $(STAMP) bytecode
	$(PYTEST) -m slow $(PYTEST_ARGS) $(PYTEST_END)

# Chaos (tests/support/chaos.py): a 3-member and a 5-member cluster under a seeded
# schedule of faults while clients record a history, then every check.
# make chaos is a campaign (tests/support/chaos_campaign.py): CHAOS_SEEDS runs per
# member count in CHAOS_MEMBERS, one after another, each in its own process,
# one line per run and the totals; it fails if any run had an anomaly or did
# not converge.  CHAOS_SEED is the first seed (then +1 each run), so a
# campaign, or one run, replays; a failure leaves its history, schedule and
# logs in chaos-artifacts/.  CHAOS_SECRET runs every cluster with that secret
# (clients authenticate, members sign and MAC what they send each other).
CHAOS_SECONDS ?= 120
CHAOS_SEED ?=
CHAOS_SEEDS ?= 1
CHAOS_MEMBERS ?= 3 5
CHAOS = $(PY) tests/support/chaos.py $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

chaos: $(STAMP) bytecode
	$(PY) tests/support/chaos_campaign.py --seeds $(CHAOS_SEEDS) --seconds $(CHAOS_SECONDS) \
		$(foreach m,$(CHAOS_MEMBERS),--members $(m)) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) \
		$(if $(CHAOS_SECRET),--secret $(CHAOS_SECRET))

# The chaos workload for a long time (SOAK_SECONDS, 10 minutes by default).
SOAK_SECONDS ?= 600
SOAK_MEMBERS ?= 3

soak: $(STAMP) bytecode
	$(CHAOS) --members $(SOAK_MEMBERS) --seconds $(SOAK_SECONDS)

# ruff (pyproject.toml [tool.ruff]): the lint rules, then the formatter;
# make format rewrites what the formatter would change.
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format .

# The documentation site (mkdocs.yml, the docs extra) into site/.  --strict
# turns every warning into a failure: a broken link or anchor, an API
# reference that does not resolve, the configuration reference that
# docs/hooks.py generates from the click commands failing to build.
# (NO_MKDOCS_2_WARNING silences mkdocs-material's banner about its successor.)
DOCS_BUILD = NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir site

docs: $(STAMP)
	$(DOCS_BUILD)

typecheck: $(STAMP)
	$(PY) -m mypy

codecs: $(STAMP)
	$(PY) -m fulmar.codecs.generate

# Coverage-guided fuzzing (atheris, the optional 'fuzz' extra) of every decoder,
# the frame scanner, the channel-URI parser, the recording log and the catalog:
# FUZZ_SECONDS per target.  New inputs go to a temporary directory; those that
# reach new code are merged into tests/fuzz/corpus/<target>, which make test
# replays (tests/fuzz/test_fuzz_corpus.py).  A crash leaves its input in
# tests/fuzz/crashes/<target>/ and fails the run after the other targets.
# libFuzzer re-executes a harness by its path (for -merge), hence the PATH.
FUZZ_RUN = PATH=$(abspath $(VENV))/bin:$$PATH $(PY) tests/fuzz/fuzz_$$target.py

fuzz: $(STAMP) bytecode
	$(PY) -m pip install --quiet 'atheris>=2.3'
	@status=0; for target in $(FUZZ_TARGETS); do \
		echo "== fuzz $$target ($(FUZZ_SECONDS)s)"; \
		out=$$(mktemp -d /tmp/fulmar-fuzz-XXXXXX); \
		mkdir -p tests/fuzz/crashes/$$target; \
		$(FUZZ_RUN) $$out tests/fuzz/corpus/$$target -max_total_time=$(FUZZ_SECONDS) \
			-timeout=10 -rss_limit_mb=2048 -artifact_prefix=tests/fuzz/crashes/$$target/ \
			-print_final_stats=1 2>&1 | grep -aE '^(#[0-9]+.*(INITED|DONE)|stat::|Done)' || true; \
		if [ -n "$$(find tests/fuzz/crashes/$$target -newer $$out -type f)" ]; then \
			echo "fuzz $$target: FOUND a crash, input saved in tests/fuzz/crashes/$$target/"; status=1; \
		fi; \
		$(FUZZ_RUN) -merge=1 -use_counters=0 -set_cover_merge=1 tests/fuzz/corpus/$$target $$out > /dev/null 2>&1 || true; \
		rm -rf $$out; \
		rmdir tests/fuzz/crashes/$$target tests/fuzz/crashes 2>/dev/null || true; \
	done; exit $$status

bench: $(STAMP) bytecode
	$(PY) -m bench $(BENCH_ARGS)

bench-quick: $(STAMP) bytecode
	$(PY) -m bench --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info fulmar/_native/_fulmar_native.* .mypy_cache .pytest_cache site
