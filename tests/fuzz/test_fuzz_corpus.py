"""Replay the checked-in fuzz corpus (tests/fuzz/corpus/<target>/) through each
atheris harness's ``test_one_input``, without atheris.

A harness swallows only its target's documented errors (CodecError,
CorruptFrameError, InvalidChannelError, RecordingLogError, CatalogError), so
anything raised here is a finding.  Inputs that crashed a fuzzer and are not
fixed yet live in tests/fuzz/crashes/<target>/ and are expected to fail.
Fuzz for longer with ``make fuzz``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

FUZZ_DIR = Path(__file__).resolve().parent
CORPUS = FUZZ_DIR / "corpus"
CRASHES = FUZZ_DIR / "crashes"
TARGETS = sorted(p.name[len("fuzz_") : -len(".py")] for p in FUZZ_DIR.glob("fuzz_*.py"))

# Known crashes: target -> {file name: reason (the exact exception)}.  Each runs
# as a strict xfail, so fixing the product turns it into a failure that says
# "move this input into the corpus".
KNOWN_CRASHES: dict[str, dict[str, str]] = {}


def _harness(target: str) -> Callable[[bytes], None]:
    name = f"fuzz_{target}"
    module: ModuleType | None = sys.modules.get(name)
    if module is None:
        if str(FUZZ_DIR) not in sys.path:
            sys.path.insert(0, str(FUZZ_DIR))
        spec = importlib.util.spec_from_file_location(name, FUZZ_DIR / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    test_one_input: Callable[[bytes], None] = module.test_one_input
    return test_one_input


def test_every_target_has_a_harness() -> None:
    assert len(TARGETS) >= 10, TARGETS


@pytest.mark.parametrize("target", TARGETS)
def test_corpus(target: str) -> None:
    files = sorted(p for p in (CORPUS / target).glob("*") if p.is_file())
    assert files, f"the corpus of {target} is empty or missing: regenerate it with tests/fuzz/make_seed_corpus.py"
    test_one_input = _harness(target)
    for path in files:
        try:
            test_one_input(path.read_bytes())
        except Exception as ex:  # pragma: no cover - the failure path
            pytest.fail(f"{target}: corpus file {path.name}: {type(ex).__name__}: {ex}")


CRASH_CASES = [
    pytest.param(
        target,
        name,
        marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason),
        id=f"{target}/{name}",
    )
    for target, crashes in sorted(KNOWN_CRASHES.items())
    for name, reason in sorted(crashes.items())
]


@pytest.mark.skipif(not CRASH_CASES, reason="no known crash is open")
@pytest.mark.parametrize("target, name", CRASH_CASES)
def test_known_crash(target: str, name: str) -> None:
    _harness(target)((CRASHES / target / name).read_bytes())


def test_every_saved_crash_is_listed() -> None:
    """A crash input left in tests/fuzz/crashes must be listed above (or fixed and moved to the corpus)."""
    on_disk = {(p.parent.name, p.name) for p in CRASHES.glob("*/*") if p.is_file()} if CRASHES.exists() else set()
    listed = {(target, name) for target, crashes in KNOWN_CRASHES.items() for name in crashes}
    assert on_disk == listed
