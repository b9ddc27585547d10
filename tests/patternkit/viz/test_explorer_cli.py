"""``patternkit explore MODEL`` and ``patternkit run --explore``: files, a server, Ctrl+C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from patternkit.app.cli import main

pytest.importorskip("model_explorer", reason="the [explorer] extra is absent")


def test_explore_writes_the_pipelines_graphs_and_overlays(tmp_path, capsys):
    assert main(["explore", "resnet18", "--no-serve", "--out", str(tmp_path)]) == 0
    assert f"Model Explorer graphs in {tmp_path}/" in capsys.readouterr().out
    index = json.loads((tmp_path / "explorer.json").read_text())
    assert [m["name"] for m in index["models"]] == ["before", "rewritten", "after"]
    assert {(o["name"], o["model"]) for o in index["overlays"]} == {
        ("rewrites", "before"), ("rewrites", "rewritten"), ("offload", "after")}
    (after,) = json.loads((tmp_path / "after.json").read_text())["graphs"]
    groups = after["groupNodeAttributes"]
    assert any(a.get("composite") == "ccompiler.conv2d_add_relu" for a in groups.values())
    assert sum(a.get("kind") == "codegen" for a in groups.values()) >= 1


def test_explore_of_a_missing_model_is_a_one_line_error(tmp_path, capsys):
    assert main(["explore", str(tmp_path / "nope.onnx"), "--no-serve"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"patternkit: error: model file not found: {tmp_path / 'nope.onnx'}"]


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("localhost", port)) != 0


def test_run_explore_writes_the_run_with_its_site_verdicts(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "seed-batchnorm", "--no-draw", "--out", str(out), "--explore",
                 "--no-serve"]) == 0
    assert f"Model Explorer graphs in {out}/explorer/" in capsys.readouterr().out
    verdicts = json.loads((out / "explorer" / "after.site_validation.nodedata.json")
                          .read_text())["after"]["results"]
    assert [r["value"] for r in verdicts.values()] == ["pass", "pass"]  # two batch norms
    assert (out / "report.md").is_file()  # the run's own files are still there


def _served(process: subprocess.Popen, prefix: str) -> str:
    """The ``http://host:port`` a process printed after ``prefix``."""
    deadline = time.monotonic() + 120
    for line in process.stdout:
        if line.startswith(prefix):
            return line.split(prefix, 1)[1].strip().split("/?", 1)[0]
        assert time.monotonic() < deadline
    raise AssertionError("the process ended without serving")


def _freed(base: str) -> bool:
    port = int(base.rsplit(":", 1)[1])
    deadline = time.monotonic() + 10
    while not _port_free(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _port_free(port)


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(  # noqa: S603 - this interpreter, our arguments
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _explore_then_ctrl_c(folder, *, check_health: bool) -> None:
    """Serve ``seed-batchnorm``, press Ctrl+C: exit code 0 and the port freed."""
    cli = _start(["-m", "patternkit.app.cli", "explore", "seed-batchnorm", "--no-browser",
                  "--out", str(folder)])
    try:
        base = _served(cli, "Model Explorer at ")
        if check_health:
            with urllib.request.urlopen(f"{base}/check_health", timeout=10) as reply:
                assert reply.read() == b"model_explorer_ok"
        cli.send_signal(signal.SIGINT)  # Ctrl+C
        assert cli.wait(timeout=60) == 0
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        cli.stdout.close()
    assert _freed(base)


def test_explore_serves_until_ctrl_c_and_leaves_no_server(tmp_path):
    _explore_then_ctrl_c(tmp_path, check_health=True)


def test_ctrl_c_the_moment_the_address_is_printed_still_exits_cleanly(tmp_path):
    """A user who presses Ctrl+C as soon as the address shows (before the wait begins)."""
    _explore_then_ctrl_c(tmp_path, check_health=False)


def test_a_server_whose_parent_is_killed_ends_too(tmp_path):
    (tmp_path / "explorer.json").write_text('{"models": [], "overlays": []}')
    parent = _start(["-c", "import sys, time; from pathlib import Path; "
                           "from patternkit.viz.explorer.server import ExplorerServer; "
                           f"s = ExplorerServer.start(Path({str(tmp_path)!r})); "
                           "print('serving', s.base, flush=True); time.sleep(600)"])
    try:
        base = _served(parent, "serving ")
        assert not _port_free(int(base.rsplit(":", 1)[1]))
        parent.kill()  # no atexit, no stop(): the server notices on its own
        parent.wait(timeout=10)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()
    assert _freed(base)


def test_explore_on_a_port_in_use_is_a_one_line_error(tmp_path, capsys):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("localhost", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["explore", "seed-batchnorm", "--no-browser", "--port", str(port),
                     "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"patternkit: error: cannot serve Model Explorer on localhost:{port}: the "
                   f"port is in use (leave --port out to take a free one)"]


def test_explore_without_the_extra_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "model_explorer", None)
    assert main(["explore", "seed-batchnorm", "--no-browser", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["patternkit: error: patternkit.explore needs Google's Model Explorer: pip "
                   "install 'patternkit[explorer]' (ai-edge-model-explorer)"]
