"""Log lines a machine can read: ``cluster-node start --log-format json``
makes every line of every process's log one JSON object (time, process,
member, level, event, fields); the plain form stays what it was."""

from __future__ import annotations

import io
import json
import re
import shutil
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from fulmar import log_lines
from support.node_start import STOP_S, Node, start_node  # noqa: F401 - start_node: a fixture

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

KEYS = {"time", "process", "member", "level", "event", "fields"}
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
KV = "fulmar.service.samples:KeyValueService"


def test_every_line_of_every_log_is_a_json_object_with_its_process_and_member(
    start_node: Callable[..., Node], tmp_path: Path
) -> None:
    base = tmp_path / f"json-{uuid.uuid4().hex[:6]}"
    node = start_node("--local", "1", "--dir", str(base), "--service", KV, "--log-format", "json")
    try:
        node.wait_ready()
        logs = base / "node0" / "logs"
        # The supervisor's own output stays text: its ready line names each process plainly.
        assert f"consensus module pid {node.children['consensus'].pid} member 0 serving" in node.stdout, node.stdout
        node.process.send_signal(signal.SIGTERM)
        assert node.wait(STOP_S) == 0, node.stdout + node.stderr
        expected = {
            "driver.log": "media driver",
            "archive.log": "archive",
            "consensus.log": "consensus module",
            "service0.log": "service 0",
        }
        assert sorted(path.name for path in logs.glob("*.log")) == sorted(expected)
        for name, process in expected.items():
            lines = (logs / name).read_text().splitlines()
            assert len(lines) >= 2, f"{name}: {lines}"  # the header, the ready line, ...
            records = [json.loads(line) for line in lines]  # every line parses
            for record in records:
                assert set(record) == KEYS, record
                assert TIME.match(record["time"]) and record["member"] == 0, record
                assert record["process"] == process and record["level"] in ("info", "error"), record
                assert isinstance(record["event"], str) and isinstance(record["fields"], dict), record
            header, ready = records[0], records[1]
            assert header["event"].startswith("started by cluster-node start (pid ") and header["fields"]["args"][
                :2
            ] == ["--log-format", "json"], header
            assert ready["fields"]["pid"] == node.children[name.removesuffix(".log")].pid, ready
        consensus = [json.loads(line)["event"] for line in (logs / "consensus.log").read_text().splitlines()]
        assert any(event.startswith("consensus module stopped: ") for event in consensus), consensus
        assert any(event.startswith("SIGTERM: stopping in order") for event in consensus), consensus
        assert 'log_format = "json"' in (base / "node0" / "node.toml").read_text()
    finally:
        if node.driver_dir != Path():
            shutil.rmtree(node.driver_dir, ignore_errors=True)


def test_the_plain_form_is_unchanged(start_node: Callable[..., Node], tmp_path: Path) -> None:
    """By default the logs are the text they were: a header, then the lines as printed."""
    base = tmp_path / f"plain-{uuid.uuid4().hex[:6]}"
    node = start_node("--local", "1", "--dir", str(base), "--service", KV)
    try:
        node.wait_ready()
        node.process.send_signal(signal.SIGTERM)
        assert node.wait(STOP_S) == 0, node.stdout + node.stderr
        lines = (base / "node0" / "logs" / "consensus.log").read_text().splitlines()
        assert re.match(
            r"^--- \d{4}-\d\d-\d\d \d\d:\d\d:\d\d cluster-node start \(pid \d+\): consensus --cluster-dir ", lines[0]
        ), lines[0]
        assert lines[1].startswith(f"consensus module pid {node.children['consensus'].pid} member 0 serving ")
        stamped = [line for line in lines if re.match(r"^\d\d:\d\d:\d\d\.\d{3} member 0: ", line)]
        assert any(": SIGTERM: stopping in order" in line for line in stamped), lines
        assert not any(line.startswith("{") for line in lines)
        assert "log_format" not in (base / "node0" / "node.toml").read_text()
    finally:
        if node.driver_dir != Path():
            shutil.rmtree(node.driver_dir, ignore_errors=True)


def test_the_writer_makes_one_object_per_line_whatever_the_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_lines._identity, "process", "archive")
    monkeypatch.setattr(log_lines._identity, "member", 2)
    target = io.StringIO()
    writer = log_lines.JsonLineWriter(target, "info", "stdout")
    writer.write("half a ")
    assert target.getvalue() == ""  # waits for the end of the line
    writer.write("line\nerror: a failure\nthe last")
    writer.finish()
    records = [json.loads(line) for line in target.getvalue().splitlines()]
    assert [(r["event"], r["level"], r["process"], r["member"]) for r in records] == [
        ("half a line", "info", "archive", 2),
        ("a failure", "error", "archive", 2),
        ("the last", "info", "archive", 2),
    ]
    errors = io.StringIO()
    log_lines.JsonLineWriter(errors, "error", "stderr").write("Traceback (most recent call last):\n")
    record = json.loads(errors.getvalue())
    assert record["level"] == "error" and record["fields"]["stream"] == "stderr" and "pid" in record["fields"]
    assert log_lines.event_text(target.getvalue().splitlines()[0]) == "half a line"
    assert log_lines.event_text("12:00:00.000 member 0: text") == "12:00:00.000 member 0: text"


def test_a_stamped_event_in_the_plain_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert log_lines.log_format() == log_lines.PLAIN
    log_lines.stamped("member 3", "election CANVASS -> NOMINATE: possible candidate")
    out = capsys.readouterr().out
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3} member 3: election CANVASS -> NOMINATE: possible candidate\n", out), out
