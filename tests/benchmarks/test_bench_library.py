"""bench_library's rows: the best time over processes, and an older checkout beside them."""

from __future__ import annotations


def _run(library: float, rewrites: float, one_rule: float, composites: float | None = None):
    run = {"graph": "gpt2", "layers": 12, "library_s": library, "rewrites_s": rewrites,
           "one_rule_s": one_rule, "library_over_one_rule": round(library / one_rule, 2)}
    if composites is not None:
        run["composites_s"] = composites
    return run


def test_each_time_of_a_row_is_the_best_over_the_processes(bench_library):
    row = bench_library.combine([_run(0.030, 0.020, 0.010, 0.011),
                                 _run(0.027, 0.022, 0.009, 0.009)])
    assert (row["library_s"], row["rewrites_s"], row["one_rule_s"], row["composites_s"]) == (
        0.027, 0.020, 0.009, 0.009)
    assert row["library_over_one_rule"] == 3.0
    assert row["processes"] == 2


def test_an_older_checkout_without_the_composites_time_still_combines(bench_library):
    row = bench_library.combine([_run(0.030, 0.020, 0.010), _run(0.033, 0.021, 0.011)])
    assert "composites_s" not in row
    assert row["library_s"] == 0.030


def test_the_older_checkout_is_reported_beside_this_one(bench_library):
    after = bench_library.combine([_run(0.024, 0.016, 0.010, 0.008)])
    before = bench_library.combine([_run(0.030, 0.020, 0.010)])
    row = bench_library.compare(after, before)
    assert row["library_s"] == 0.024 and row["before_library_s"] == 0.030
    assert row["before_library_over_one_rule"] == 3.0
    assert row["library_over_one_rule"] == 2.4
    assert row["library_after_over_before"] == 0.8
    assert "before_composites_s" not in row  # the older rows did not time it


class _Owner:
    """Stands for a module or class whose functions ``--stages`` times."""

    @classmethod
    def build(cls, n: int) -> int:
        return n + 1


def _find(pattern: str, *, rule: str = "") -> str:
    return f"{rule}:{pattern}"


def test_stage_probes_time_each_call_under_its_label_and_are_put_back(bench_library):
    import types

    module = types.SimpleNamespace(find=_find)
    original_build = vars(_Owner)["build"]
    times: dict[str, float] = {}
    probes = [(module, "find", "match: {}"), (_Owner, "build", "index")]
    with bench_library.timed_calls(probes, lambda args, kwargs: kwargs.get("rule", "?"), times):
        assert module.find("p", rule="gelu") == "gelu:p"  # the call's own result
        module.find("q", rule="gelu")
        module.find("r")
        assert _Owner.build(1) == 2
    assert set(times) == {"match: gelu", "match: ?", "index"}
    assert all(seconds >= 0 for seconds in times.values())
    assert module.find is _find and vars(_Owner)["build"] is original_build


def test_stage_probes_are_put_back_after_an_error(bench_library):
    import types

    module = types.SimpleNamespace(find=_find)
    try:
        with bench_library.timed_calls([(module, "find", "match")], lambda a, k: "", {}):
            raise KeyError("inside")
    except KeyError:
        pass
    assert module.find is _find
