"""Loading the job's model and choosing its entry function."""

from __future__ import annotations

import pytest
import tvm

from patternkit.app.cli import main
from patternkit.app.loading import JobError, entry_function
from patternkit.models import seed_batchnorm
from patternkit.verification.numeric import build as build_for_checks


def _renamed(*names: str) -> tvm.IRModule:
    """A module with one copy of ``seed_batchnorm``'s ``main`` under each of ``names``."""
    return tvm.IRModule({name: seed_batchnorm()["main"].with_attr("global_symbol", name)
                         for name in names})


def test_main_is_the_entry_when_there_is_one_else_the_only_public_function():
    assert entry_function(seed_batchnorm()) == "main"
    assert entry_function(_renamed("forward")) == "forward"
    assert entry_function(_renamed("main", "forward")) == "main"
    assert entry_function(_renamed("a", "b"), "b") == "b"


@pytest.mark.parametrize("mod, func, message", [
    (tvm.IRModule(), None, "no public Relax function to run"),
    (_renamed("a", "b"), None, "several public functions (a, b): choose one"),
    (_renamed("forward"), "main", "no Relax function 'main' (it has: forward)"),
])
def test_an_entry_that_cannot_be_chosen_is_a_one_line_error(mod, func, message):
    with pytest.raises(JobError) as err:
        entry_function(mod, func)
    assert message in str(err.value) and "\n" not in str(err.value)


def _write_module(path, mod_expr: str) -> None:
    path.write_text("import tvm\nfrom patternkit.models import seed_batchnorm\n"
                    "_f = seed_batchnorm()['main']\n" + mod_expr + "\n")


def test_run_checks_and_reports_a_forward_entry(tmp_path, capsys):
    model = tmp_path / "forward.py"
    _write_module(model, "mod = tvm.IRModule({'forward': _f.with_attr('global_symbol', "
                         "'forward')})")
    out = tmp_path / "out"
    assert main(["run", str(model), "--out", str(out), "--quiet", "--no-draw"]) == 0
    report = (out / "report.md").read_text()
    assert "# patternkit run: PASS" in report and "entry function `forward`" in report


@pytest.mark.parametrize("mod_expr, argv, message", [
    ("mod = tvm.IRModule()", [], "no public Relax function to run"),
    ("mod = tvm.IRModule({'a': _f.with_attr('global_symbol', 'a'), 'b': "
     "seed_batchnorm()['main'].with_attr('global_symbol', 'b')})", [], "choose one with --func"),
    ("mod = seed_batchnorm()", ["--func", "forward"], "no Relax function 'forward'"),
])
def test_run_without_a_usable_entry_exits_2_with_one_line(tmp_path, capsys, mod_expr, argv,
                                                          message):
    model = tmp_path / "model.py"
    _write_module(model, mod_expr)
    assert main(["run", str(model), "--out", str(tmp_path / "out"), "--quiet", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.models
def test_run_on_a_zoo_model_whose_entry_is_forward(tmp_path, zoo):
    model = zoo("gpt2", entry="forward")
    out = tmp_path / "out"
    assert main(["run", model.name, "--out", str(out), "--quiet"]) == 0
    import json

    report = json.loads((out / "report.json").read_text())
    assert report["func"] == "forward" and report["numeric"]["ok"]
    assert {"before.svg", "after.svg", "diff.svg"} <= set(report["outputs"])


def test_a_model_that_is_not_well_formed_is_refused_at_the_jobs_input(tmp_path, capsys):
    model = tmp_path / "shared.py"
    # the same parameters in two functions: TVM's checker refuses it
    _write_module(model, "mod = tvm.IRModule({'main': _f, 'other': "
                         "_f.with_attr('global_symbol', 'other')})")
    assert main(["run", str(model), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the job's input" in err and "not well formed" in err
    assert len(err.strip().splitlines()) == 1


def test_an_onnx_file_exported_with_a_dynamic_batch_keeps_its_static_shapes(tmp_path, caplog):
    # x + Range(0, Shape(x)[1], 1): what torch.onnx.export writes for position ids; TVM
    # 0.27's importer alone gives y no shape at all (docs/tvm-bugs.md)
    onnx = pytest.importorskip("onnx")
    import logging

    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from patternkit.app.loading import load

    def scalar(name, value):
        return helper.make_node("Constant", [], [name],
                                value=numpy_helper.from_array(np.array(value, np.int64)))

    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shape"]), scalar("one", 1), scalar("zero", 0),
         helper.make_node("Gather", ["shape", "one"], ["length"]),
         helper.make_node("Range", ["zero", "length", "one"], ["ids"]),
         helper.make_node("Cast", ["ids"], ["positions"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["x", "positions"], ["y"])],
        "positions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    path = tmp_path / "positions.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), path)
    with caplog.at_level(logging.INFO, logger="patternkit.app.loading"):
        loaded = load(str(path))
    mod = loaded.mod
    assert "1 Gather of static Shape dimensions folded to Constant" in caplog.text
    assert loaded.import_fixups == ("1 Gather of static Shape dimensions folded to Constant",)
    batch, length = mod["main"].ret_ty.shape
    assert tvm.ir.is_prim_var(batch) and int(length) == 8
    vm = build_for_checks(mod)
    x = np.random.default_rng(0).standard_normal((3, 8)).astype("float32")
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(),
                                  x + np.arange(8, dtype="float32"))


def test_a_saved_exported_program_loads_with_its_negative_indices_read_as_torch_reads(
        tmp_path, capsys):
    # x[..., [-2], :] through torch.export.save: TVM 0.27's importer alone reads out of
    # bounds (docs/tvm-bugs.md); the job imports it with the fix and its numbers hold
    torch = pytest.importorskip("torch")
    import numpy as np

    from patternkit.app.loading import load

    class SecondToLastRow(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x[..., [-2], :])

    x = torch.randn(2, 3, 4, 5)
    path = tmp_path / "rows.pt2"
    torch.export.save(torch.export.export(SecondToLastRow(), (x,)), str(path))
    loaded = load(str(path))
    assert loaded.import_fixups == (
        "wrapped the negative indices of 1 take(mode='fast') (TVM's torch importer keeps them)",)
    vm = build_for_checks(loaded.mod)
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x.numpy())).numpy(),
                                  SecondToLastRow()(x).numpy())
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    assert "PASS" in capsys.readouterr().out


def test_a_pt2_file_that_is_not_an_exported_program_is_a_clear_error(tmp_path):
    pytest.importorskip("torch")
    from patternkit.app.loading import load

    path = tmp_path / "broken.pt2"
    path.write_bytes(b"not a zip")
    with pytest.raises(JobError, match="not a program saved by torch.export.save"):
        load(str(path))


_LOAD_IN_A_FRESH_PROCESS = """
import sys
from patternkit.app.loading import JobError, load
try:
    loaded = load(sys.argv[1])
except JobError as err:
    print("JobError:", err)
else:
    print("loaded", [gv.name_hint for gv in loaded.mod.functions],
          "transformers.modeling_outputs" in sys.modules)
"""


def _load_in_a_fresh_process(path) -> str:
    """What loading ``path`` prints in a process that has imported nothing of the model's."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _LOAD_IN_A_FRESH_PROCESS, str(path)],
                          capture_output=True, text=True, timeout=300, check=True)
    return done.stdout.strip().splitlines()[-1]


def test_a_hugging_face_model_output_is_registered_before_the_pt2_loads(tmp_path):
    # A transformers model returns a ModelOutput, which torch.export.save records by class
    # name; a process that has not imported it could not load the file (torch only says
    # "check the warnings above")
    torch = pytest.importorskip("torch")
    outputs = pytest.importorskip("transformers.modeling_outputs")

    class Encoder(torch.nn.Module):
        def forward(self, x):
            return outputs.BaseModelOutput(last_hidden_state=torch.relu(x) * 2.0)

    path = tmp_path / "encoder.pt2"
    torch.export.save(torch.export.export(Encoder(), (torch.randn(2, 3),)), str(path))
    assert _load_in_a_fresh_process(path) == "loaded ['main'] True"


def test_a_pytree_class_from_elsewhere_is_named_in_one_line(tmp_path):
    torch = pytest.importorskip("torch")
    (tmp_path / "my_outputs.py").write_text(
        "from dataclasses import dataclass\n"
        "import torch\n"
        "@dataclass\n"
        "class Out:\n"
        "    y: torch.Tensor\n"
        "torch.utils._pytree.register_dataclass(Out, serialized_type_name='my_outputs.Out')\n")
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("my_outputs", tmp_path / "my_outputs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["my_outputs"] = module
    try:
        spec.loader.exec_module(module)

        class Model(torch.nn.Module):
            def forward(self, x):
                return module.Out(torch.relu(x))

        path = tmp_path / "model.pt2"
        torch.export.save(torch.export.export(Model(), (torch.randn(2, 3),)), str(path))
    finally:
        del sys.modules["my_outputs"]
    message = _load_in_a_fresh_process(path)  # my_outputs is not importable there
    assert message.startswith(f"JobError: {path}: torch.export.load cannot read it here: "
                              f"Deserializing my_outputs.Out in pytree is not registered")
    assert "\n" not in message


@pytest.mark.parametrize("name", ["model.onnx", "model.pt2", "model.py"])
def test_an_empty_model_file_is_named_empty_in_one_line(tmp_path, capsys, name):
    path = tmp_path / name
    path.write_bytes(b"")
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"patternkit: error: {path} is empty (0 bytes): was the export " \
                           f"or copy interrupted?\n"
    assert captured.out == "" and path.read_bytes() == b""
