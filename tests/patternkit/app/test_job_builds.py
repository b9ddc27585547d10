"""``patternkit run`` builds the model once for before, after and the per-site checks,
and reports exactly what it reports with every side built apart.
"""

import threading

import pytest
import tvm
from scaled_softmax import ScaledSoftmax
from tvm import relax

from patternkit.app.job import run
from patternkit.verification import numeric
from patternkit.verification.builds import caching


def _model() -> tvm.IRModule:
    """A written-out GELU, then a softmax, over a symbolic batch (checked at two sizes)."""
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            erf = bb.emit(relax.op.erf(relax.op.multiply(x, relax.const(2 ** -0.5,
                                                                        "float32"))))
            gelu = bb.emit(relax.op.multiply(relax.op.multiply(x, relax.const(0.5, "float32")),
                                             relax.op.add(relax.const(1.0, "float32"), erf)))
            out = bb.emit_output(relax.op.nn.softmax(gelu, axis=-1))
        bb.emit_func_output(out)
    return bb.get()


def _without_timings(report) -> dict:
    found = report.to_dict()
    found.pop("seconds", None)
    return found


@pytest.mark.parametrize("patterns", [None, [ScaledSoftmax()]], ids=["library", "wrong"])
def test_one_build_serves_every_check_and_the_report_is_the_same(monkeypatch, patterns):
    builds = []
    real = numeric.build
    monkeypatch.setattr(numeric, "build", lambda m, *a, **k: builds.append(m) or real(m, *a, **k))
    mod = _model()
    text = mod.script()
    reports, counts = {}, {}
    for shared in (True, False):
        numeric.REFERENCE_BUILDS.clear()
        numeric.CANDIDATE_BUILDS.clear()
        builds.clear()
        with caching(shared):
            reports[shared] = run(mod, patterns=patterns, out_dir=None, draw=False)
        counts[shared] = len(builds)
    # apart: before, after and the sites, and the two sides again at the second size; a
    # miss also builds its float64 arbitration, either way
    assert counts[False] - counts[True] == 4
    assert counts[True] == 1 or patterns is not None
    shared, apart = reports[True], reports[False]
    assert shared.rewrites and shared.sites.report.sites
    assert len(shared.numeric.sizes) == 2  # the symbolic batch checked at two sizes
    assert shared.ok is (patterns is None)
    assert _without_timings(shared) == _without_timings(apart)
    assert mod.script() == text


def test_the_drawings_and_scripts_are_made_while_the_model_builds(tmp_path, monkeypatch):
    from patternkit.app import drawings, scripts

    started, written = threading.Event(), threading.Event()
    real_draw, real_write = drawings.draw_job, scripts.write_script

    def draw_job(*args, **kwargs):
        started.set()
        return real_draw(*args, **kwargs)

    def write_script(path, mod):
        if path.name == "after.py":
            written.set()
        return real_write(path, mod)

    waited = []
    real_build = numeric.build

    def build(mod, *args, **kwargs):
        # sequential: neither the drawing nor the second script ever starts
        waited.append(started.wait(timeout=10) and written.wait(timeout=10))
        return real_build(mod, *args, **kwargs)

    monkeypatch.setattr(drawings, "draw_job", draw_job)
    monkeypatch.setattr(scripts, "write_script", write_script)
    monkeypatch.setattr(numeric, "build", build)
    report = run(_model(), out_dir=tmp_path / "out")
    assert waited and all(waited)
    assert report.outputs[:2] == ["before.py", "after.py"]
    assert "mod = Module" in (tmp_path / "out" / "after.py").read_text()
    assert list(report.drawings) == ["before", "after", "diff"]
    for name, how in report.drawings.items():
        assert not how.startswith("not drawn"), how
        assert "<svg" in (tmp_path / "out" / f"{name}.svg").read_text()
    assert {"before.svg", "after.svg", "diff.svg"} <= set(report.outputs)


def test_a_run_that_fails_after_the_drawing_started_waits_for_it(tmp_path, monkeypatch):
    from patternkit.app import job

    def broken(*args, **kwargs):
        raise RuntimeError("the build broke")

    monkeypatch.setattr(job, "build_joint", broken)
    with pytest.raises(RuntimeError, match="the build broke"):
        run(_model(), out_dir=tmp_path / "out")
    assert not [t for t in threading.enumerate()
                if t.name.startswith(("patternkit-drawing", "patternkit-scripts"))]
    # the staged drawings and scripts went with the run
    assert not list(tmp_path.rglob("*.svg")) and not list(tmp_path.rglob("*.py"))



def test_the_round_trips_run_after_the_build_in_the_jobs_own_thread(monkeypatch):
    """Never alongside the build: both legalise operators through TVM's TE, whose tag scope
    (``tvm.te.tag.TagScope._current``) is one for the whole process, so two threads
    legalising at once fail with "nested op_tag is not allowed" (the mutation benchmark's
    ResNet-18 runs did, with the round trips in a thread of their own).
    """
    from patternkit.app import job

    events: list[tuple[str, str]] = []
    real_trip, real_joint = job.check_roundtrip, job.build_joint

    def trip(*args, **options):
        events.append(("round trip", threading.current_thread().name))
        return real_trip(*args, **options)

    def joint(*args, **options):
        events.append(("build", threading.current_thread().name))
        try:
            return real_joint(*args, **options)
        finally:
            events.append(("built", threading.current_thread().name))

    monkeypatch.setattr(job, "check_roundtrip", trip)
    monkeypatch.setattr(job, "build_joint", joint)
    report = run(_model(), out_dir=None, draw=False)
    main = threading.current_thread().name
    assert events == [("build", main), ("built", main), ("round trip", main),
                      ("round trip", main)]
    assert list(report.roundtrip) == ["FuseOps", "MergeComposite+PartitionGraph"]


def test_a_round_trip_tvm_cannot_run_is_not_run_with_its_reason_not_a_traceback(monkeypatch,
                                                                                 tmp_path):
    """A dynamic-shape ``strided_slice`` TVM's legalisation refuses stopped the whole job
    with a traceback at the round trips; it is NOT RUN, with TVM's line, and the rest of the
    report (the numeric verdict) stands.
    """
    from patternkit.app import job
    from patternkit.app.report import report_markdown

    def refused(*args, **options):
        raise tvm.error.InternalError("Traceback ...\n  Check failed: axis < src_tensor_dim "
                                      "(-1 vs. 2) :")

    monkeypatch.setattr(job, "check_roundtrip", refused)
    report = run(_model(), out_dir=tmp_path / "out", draw=False)
    trip = report.roundtrip["FuseOps"]
    assert trip.ok and trip.not_run.endswith("Check failed: axis < src_tensor_dim (-1 vs. 2)")
    assert report.verdict == "PASS"  # the rewrite's own evidence is not weakened
    assert "* FuseOps: NOT RUN: TVM could not prepare or fuse the model: Check failed" in \
        report_markdown(report)
    assert (tmp_path / "out" / "report.html").exists()
