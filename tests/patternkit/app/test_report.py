"""The job's report: typed sections, written to report.json as the keys users read."""

from __future__ import annotations

import json

import pytest

from patternkit.app.report import (
    JobReport,
    NumericResult,
    RoundTripEntry,
    SiteValidation,
    report_markdown,
)
from patternkit.verification.sites import Site, SiteReport


def test_a_model_that_does_not_build_writes_only_what_happened():
    numeric = NumericResult.not_built_by("before", "the before module does not build", 7)
    assert numeric.to_dict() == {"ok": False, "not_built": "before",
                                 "build_error": "the before module does not build", "seed": 7}
    report = JobReport("m", "ccompiler", numeric=numeric)
    assert not report.ok
    assert report.evidence.startswith("whole-model comparison NOT RUN")
    assert "NOT RUN: the model as imported does not build" in report_markdown(report)
    # nothing was compared: the run neither passes nor fails
    assert report.verdict == "NOT RUN"
    assert report_markdown(report).startswith("# patternkit run: NOT RUN\n")
    assert report.to_dict()["verdict"] == "NOT RUN"


def test_a_failure_elsewhere_fails_a_run_whose_model_does_not_build():
    numeric = NumericResult.not_built_by("before", "the before module does not build", 7)
    site = Site("demo.rule", "main", "lv1", "fail", "max abs error 1 > 0.1", tolerance="1e-4")
    report = JobReport("m", "ccompiler", numeric=numeric,
                       sites=SiteValidation(SiteReport([site], builds=2)))
    assert report.verdict == "FAIL"
    broken = JobReport("m", "ccompiler", numeric=NumericResult.not_built_by(
        "after", "the after module does not build", 7))
    assert broken.verdict == "FAIL"  # the rewrite broke the build: a failure
    assert JobReport("m", "ccompiler", numeric=NumericResult(ok=True, status="pass")
                     ).verdict == "PASS"


def test_outputs_that_are_no_evidence_with_no_site_in_their_place_are_not_run():
    # all-zero outputs and no rewrite site to validate instead: nothing failed, nothing
    # was judged
    numeric = NumericResult(ok=False, status="inconclusive", reason="all zero")
    assert JobReport("m", "ccompiler", numeric=numeric).verdict == "NOT RUN"
    site = Site("demo.rule", "main", "lv1", "fail", "max abs error 1 > 0.1", tolerance="1e-4")
    assert JobReport("m", "ccompiler", numeric=numeric, sites=SiteValidation(
        SiteReport([site], builds=2))).verdict == "FAIL"
    passed = Site("demo.rule", "main", "lv1", "pass", "", tolerance="1e-4")
    assert JobReport("m", "ccompiler", numeric=numeric, sites=SiteValidation(
        SiteReport([passed], builds=2))).verdict == "PASS"  # the sites decide
    wrong = NumericResult(ok=False, status="fail", reason="max abs error 1")
    assert JobReport("m", "ccompiler", numeric=wrong).verdict == "FAIL"


def test_report_json_keeps_the_flat_offload_keys_and_the_verdict():
    report = JobReport("m", "ccompiler", numeric=NumericResult(ok=True, status="pass"),
                       roundtrip={"FuseOps": RoundTripEntry(True)})
    saved = json.loads(json.dumps(report.to_dict()))
    assert list(saved)[5:9] == ["rewrites", "composites", "offloaded_ops", "host_ops"]
    assert saved["ok"] is True and saved["sites"] == {}
    assert saved["roundtrip"] == {"FuseOps": {"ok": True, "difference": None,
                                              "fusion_ill_formed": None, "dropped_dead": [],
                                              "not_run": None}}


def test_a_failed_site_fails_the_report_and_is_named_in_the_markdown():
    site = Site("demo.rule", "main", "lv1", "fail", "max abs error 1 > 0.1", tolerance="1e-4")
    report = JobReport("m", "ccompiler", numeric=NumericResult(ok=True, status="pass"),
                       sites=SiteValidation(SiteReport([site], builds=2)))
    assert not report.ok
    assert report.to_dict()["sites"]["by_rule"] == {
        "demo.rule": {"sites": 1, "validated": 0, "failed": 1, "not_run": 0}}
    assert "* FAIL `demo.rule` in `main` at `lv1`: max abs error 1 > 0.1" in report_markdown(report)


def test_a_site_validation_that_could_not_run_is_not_a_failure():
    sites = SiteValidation(not_run="BuildError: no llvm")
    report = JobReport("m", "ccompiler", numeric=NumericResult(ok=True, status="pass"),
                       sites=sites)
    assert report.ok and sites.to_dict() == {"ok": True, "not_run": "BuildError: no llvm"}
    assert "rewrite sites NOT RUN (BuildError: no llvm)" in report.evidence


def test_reading_a_section_by_its_old_keys_still_works_with_a_warning():
    numeric = NumericResult(ok=True, status="pass", max_abs_error=1e-6)
    with pytest.warns(DeprecationWarning, match="NumericResult's attributes"):
        assert numeric["status"] == "pass"
    with pytest.warns(DeprecationWarning):
        assert numeric.get("not_built") is None and numeric.get("max_abs_error") == 1e-6
    with pytest.warns(DeprecationWarning):
        assert "sizes" not in numeric


def test_ops_left_on_the_host_for_one_reason_are_one_counted_line_in_the_markdown():
    report = JobReport("m", "ccompiler", numeric=NumericResult(ok=True, status="pass"))
    uncovered = "relax.reshape: uncovered: no pattern table entry matches it"
    report.offload.host_ops = [
        *(f"main:lv{i} = {uncovered}" for i in range(5)),
        "main:lv9 = relax.nn.relu: vetoed [ccompiler.conv2d_add_relu]: the bias is not per channel",
        "main:lv12 = relax.reshape: uncovered: no pattern table entry matches it"]
    text = report_markdown(report)
    assert ("* `relax.reshape` x6 (`main:lv0`, `main:lv1`, `main:lv2` and 3 more): uncovered: "
            "no pattern table entry matches it") in text
    assert ("* `relax.nn.relu` (`main:lv9`): vetoed [ccompiler.conv2d_add_relu]: the bias is not "
            "per channel") in text
    assert text.index("relax.reshape` x6") < text.index("relax.nn.relu")
    assert len(report.to_dict()["host_ops"]) == 7  # report.json keeps every call


def test_ops_a_rewrite_added_are_counted_apart_from_the_models_own():
    """An attention rewrite adds a mask test (``not_equal``): the model's one call was
    reported as three on the host, with nothing to say where two came from."""
    from types import SimpleNamespace

    from tvm import relax

    from patternkit.app.summary import op_summary

    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            test = bb.emit(relax.op.not_equal(x, relax.const(0.0, "float32")))
            out = bb.emit_output(relax.op.exp(x))
        bb.emit_func_output([out, test])
    before = bb.get()["main"]
    host = [SimpleNamespace(op="relax.not_equal", kind="uncovered", reason="no entry")] * 3
    rows = {row.op: row for row in op_summary(before, [], None, host, "ccompiler")}
    assert rows["not_equal"].count == 1 and rows["not_equal"].made == 2
    assert rows["not_equal"].where() == ("host (uncovered: no entry) (3); 2 of these made by "
                                         "a rewrite")
    assert rows["exp"].made == 0 and rows["exp"].where() == "unchanged"

