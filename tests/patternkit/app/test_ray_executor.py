"""``--executor ray``: a campaign's units on a Ray cluster give the local run's records.

One tiny campaign (two cheap rules at a budget of 3) runs here, once locally, once half
locally (shard 1 of 2) and resumed on a local Ray cluster the test starts; the records
must be the local run's, unit for unit, and merge into its report.  Ray's start on two
CPUs is most of this test's time.  The refusals (no Ray, an address where no cluster
answers) are one-line errors before a record folder is touched, checked without a
cluster.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from patternkit.app.cli import main
from patternkit.testing.campaign import Campaign, read_records
from patternkit.testing.ray_executor import RayExecutor, RayUnavailable

RULES = ["relu6.collapse", "batchnorm.collapse"]
BUDGET = 3
SEED = 5


def _verify(*extra: str) -> int:
    return main(["verify", *RULES, "--budget", str(BUDGET), "--seed", str(SEED), "--quiet",
                 *extra])


def _without_timings(records: list[dict]) -> list[dict]:
    return sorted(({k: v for k, v in r.items() if k != "seconds"} for r in records),
                  key=lambda r: (r["subject"], r["instance"]))


def _keys(path: Path) -> set[str]:
    return {f"{r['subject']}#{r['instance']}" for r in read_records(path)}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_units_resumed_on_a_ray_cluster_give_the_local_records(tmp_path, monkeypatch, capsys):
    ray = pytest.importorskip("ray")
    local, mixed = tmp_path / "local", tmp_path / "mixed"
    assert _verify("--out", str(local)) == 0
    assert _verify("--out", str(mixed), "--shard", "1/2") == 0
    first_half = _keys(mixed)
    campaign = Campaign("verify", tuple(RULES), BUDGET, SEED)
    assert 0 < len(first_half) < len(campaign.units())

    ran = []
    original = RayExecutor.__call__

    def counted(self, units, check):
        for record in original(self, units, check):
            ran.append(f"{record['subject']}#{record['instance']}")
            yield record

    monkeypatch.setattr(RayExecutor, "__call__", counted)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a throwaway cluster of this test
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="WARNING", object_store_memory=100 * 2**20)
    try:
        assert _verify("--resume", str(mixed), "--executor", "ray") == 0
        assert ray.is_initialized()  # a connection the caller made is left open
    finally:
        ray.shutdown()
    # Ray checked exactly the units the first half had not, each once
    assert sorted(ran) == sorted({u.key for u in campaign.units()} - first_half)
    assert _without_timings(read_records(mixed)) == _without_timings(read_records(local))
    capsys.readouterr()
    assert main(["merge", str(mixed), "--quiet"]) == 0
    merged = capsys.readouterr().out
    assert main(["merge", str(local), "--quiet"]) == 0
    assert merged == capsys.readouterr().out


def test_ray_not_installed_is_a_one_line_error_naming_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # ``import ray`` fails
    folder = tmp_path / "out"
    assert _verify("--out", str(folder), "--executor", "ray") != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "[ray]" in err and "--executor ray" in err
    assert not folder.exists()


def test_an_unreachable_ray_address_is_a_one_line_error_before_any_work(tmp_path, capsys):
    pytest.importorskip("ray")
    folder = tmp_path / "out"
    address = f"127.0.0.1:{_free_port()}"
    start = time.perf_counter()
    assert _verify("--out", str(folder), "--executor", "ray", "--ray-address", address) != 0
    assert time.perf_counter() - start < 10
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"--ray-address {address}: no Ray cluster answers" in err
    assert not folder.exists()


def test_a_listener_that_is_not_ray_is_refused_within_the_timeout():
    pytest.importorskip("ray")
    with socket.socket() as server:  # accepts connections, never answers
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        address = f"127.0.0.1:{server.getsockname()[1]}"
        start = time.perf_counter()
        with pytest.raises(RayUnavailable, match="not a Ray cluster"):
            RayExecutor(address, connect_timeout=1)
        assert time.perf_counter() - start < 5


@pytest.mark.parametrize("extra, message", [
    (["--ray-address", "127.0.0.1:1"], "--ray-address is for --executor ray"),
    (["--executor", "ray"], "give --out DIR"),
    (["--executor", "ray", "--out", "{out}", "--ray-address", "head:port"], "not host:port"),
])
def test_inconsistent_executor_options_are_one_line_errors(tmp_path, capsys, extra, message):
    if "not host:port" in message:
        pytest.importorskip("ray")
    extra = [e.replace("{out}", str(tmp_path / "out")) for e in extra]
    assert _verify(*extra) != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err
    assert not (tmp_path / "out").exists()


def test_fuzz_hands_its_units_to_the_ray_executor(tmp_path, monkeypatch, capsys):
    """The wiring of ``fuzz --executor ray`` (the executor itself runs locally here: the
    cluster run is the first test's)."""
    pytest.importorskip("ray")
    from patternkit.testing.campaign import local_executor

    handed = []

    def here(self, units, check):
        for record in local_executor(units, check):
            handed.append(record["instance"])
            yield record

    monkeypatch.setattr(RayExecutor, "__call__", here)
    folder = tmp_path / "fuzz"
    assert main(["fuzz", "roundtrip", "--budget", "2", "--out", str(folder), "--executor",
                 "ray", "--quiet"]) == 0
    assert sorted(handed) == [0, 1]
    assert sorted(r["instance"] for r in read_records(folder)) == [0, 1]
    capsys.readouterr()
    assert main(["fuzz", "roundtrip", "--budget", "2", "--executor", "ray"]) != 0
    assert "give --out DIR" in capsys.readouterr().err  # not a silent local run
