"""codecs/generated/ must be exactly what the generator produces from codecs/schemas/."""

from __future__ import annotations

import difflib
from pathlib import Path

from fulmar.codecs import generate

GENERATED = Path(generate.__file__).resolve().parent / "generated"


def test_generated_codecs_are_fresh(tmp_path: Path) -> None:
    written = generate.write_all(tmp_path)
    assert written, "the generator wrote nothing"
    stale = []
    for fresh in written:
        committed = GENERATED / fresh.name
        want = fresh.read_text(encoding="utf-8")
        have = committed.read_text(encoding="utf-8") if committed.exists() else ""
        if want != have:
            diff = "".join(
                list(
                    difflib.unified_diff(
                        have.splitlines(keepends=True), want.splitlines(keepends=True), str(committed), "regenerated"
                    )
                )[:40]
            )
            stale.append(f"{committed} is stale:\n{diff}")
    assert not stale, "run `make codecs` (python -m fulmar.codecs.generate)\n" + "\n".join(stale)


def test_no_leftover_generated_modules(tmp_path: Path) -> None:
    expected = {p.name for p in generate.write_all(tmp_path)}
    present = {p.name for p in GENERATED.glob("*.py")}
    assert present == expected, f"unexpected files in {GENERATED}: {sorted(present - expected)}"


def test_check_mode_reports_fresh() -> None:
    assert generate.main(["--check"]) == 0
