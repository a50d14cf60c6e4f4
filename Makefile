# The two commands a new user runs on a fresh machine: `make run` and `make test`.
# Both create .venv when missing and (re)install the package, which compiles the
# cffi extension, whenever the sources of the build change.
# make test-native-asan runs the C's own tests under ASan and UBSan.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The C of the one extension: the shared primitives and each process's folder.
NATIVE_DIRS := fulmar/_native/src driver/native consensus/native archive/native analytics/native
NATIVE_SOURCES := $(foreach d,$(NATIVE_DIRS),$(wildcard $(d)/*.c $(d)/*.h)) fulmar/_native/build.py
PYTEST_ARGS ?=
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.py,%,$(wildcard tests/fuzz/fuzz_*.py))

.PHONY: install bytecode run test test-native-asan test-all soak test-slow chaos simulate lint format typecheck docs codecs bench bench-quick fuzz clean

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
	$(PY) -m fulmar.cli.demo

# Everything except the runs marked slow (make test-slow runs those).
# Each run gets its own temporary base directory (removed afterwards), so
# concurrent runs on one machine never clean up each other's files.
PYTEST = tmp=$$(mktemp -d /tmp/fulmar-test-XXXXXX); $(PY) -m pytest --basetemp=$$tmp
PYTEST_END = ; status=$$?; rm -rf $$tmp; exit $$status

# The C must compile without a warning (-Werror, the build's own flags and
# sources); the install itself stays without -Werror, so a newer compiler's
# new warning never fails a user's pip install.
test: $(STAMP) bytecode
	$(PY) fulmar/_native/build.py --check
	$(PY) -m mypy
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(DOCS_BUILD)
	$(PYTEST) -m 'not slow' $(PYTEST_ARGS) $(PYTEST_END)

# The tests that drive the C directly (no whole clusters), under AddressSanitizer
# and UndefinedBehaviorSanitizer: the extension is built with the sanitizers into
# its own venv (.venv-asan), so the normal build stays as it is.  The ASan runtime
# must be loaded before Python; Python's own allocations at exit are not leaks of ours.
ASAN_VENV := .venv-asan
ASAN_PY := $(ASAN_VENV)/bin/python
ASAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -O1 -g
NATIVE_TESTS := tests/core/test_log_frame_blocks.py tests/core/test_frame_scanner_fuzz.py tests/core/test_ring_buffer.py \
	tests/core/test_broadcast.py tests/core/test_counters.py tests/core/test_reader_doorbells.py \
	tests/consensus/test_member_auth_native.py tests/driver/test_native_flow_control.py tests/driver/test_native_image_state.py \
	tests/driver/test_native_loss.py tests/driver/test_native_loss_detector.py tests/driver/test_native_pack_datagrams.py \
	tests/driver/test_native_retransmit.py tests/driver/test_native_sender_timing.py tests/consensus/test_leader_commit.py \
	tests/consensus/test_leader_ingress.py tests/consensus/test_append_position_sender.py tests/archive/test_archive_native_recorder.py \
	tests/driver/test_data_plane.py tests/driver/test_driver_datagram_mac.py tests/analytics/test_analytics_decoder.py

$(ASAN_PY):
	$(PYTHON) -m venv $(ASAN_VENV)
	$(ASAN_PY) -m pip install --quiet --upgrade pip setuptools wheel

# python -P: the repository root must not be on sys.path, or its fulmar/ (with
# the normal build's extension in it) would shadow the sanitized install.
test-native-asan: $(ASAN_PY)
	FULMAR_NATIVE_CFLAGS='$(ASAN_FLAGS)' $(ASAN_PY) -m pip install --quiet '.[test]' pyarrow numpy
	FULMAR_NATIVE_CFLAGS='$(ASAN_FLAGS)' $(ASAN_PY) -m pip install --quiet --force-reinstall --no-deps .
	tmp=$$(mktemp -d /tmp/fulmar-asan-XXXXXX); \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	$(ASAN_PY) -P -m pytest --basetemp=$$tmp -p no:cacheprovider -m 'not slow' $(NATIVE_TESTS) $(PYTEST_ARGS); \
	status=$$?; rm -rf $$tmp; exit $$status

# The runs marked slow: a million messages over lossy UDP, 10,000 election
# simulation seeds and 10,000 of the simulator (tests/simulator), a round of
# every chaos fault on 3 members and on 5.
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

# The deterministic simulator (tests/simulator/): every member's production
# consensus module in one process over a simulated network, archive and clock.
# make simulate SEEDS=N runs seeds 1..N (MEMBERS=3 or 5); SEED=S replays seed S
# (or starts there with SEEDS); a failing seed prints the line that replays it
# and its trace.  SIM_SECONDS: simulated seconds per seed.
SEEDS ?=
SEED ?=
MEMBERS ?= 3
SIM_SECONDS ?= 60

simulate: $(STAMP) bytecode
	$(PY) tests/simulator/run_simulation.py --members $(MEMBERS) --duration $(SIM_SECONDS) \
		$(if $(SEED),--seed $(SEED)) $(if $(SEEDS),--seeds $(SEEDS))

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
	rm -rf $(VENV) $(ASAN_VENV) build *.egg-info src/*.egg-info fulmar/_native/_fulmar_native.* .mypy_cache .pytest_cache site
