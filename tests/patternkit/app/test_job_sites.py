"""``patternkit run`` validates every rewrite site and rests its verdict on real evidence."""

import json

import numpy as np
import tvm
from scaled_softmax import ScaledSoftmax
from tvm import relax

from patternkit.app.cli import main as cli_main
from patternkit.app.job import run


def _module(body_of, shape=(2, 256)) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body_of(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def _tiny_outputs(bb, x):
    """Probabilities over 256 keys, scaled by 1e-3: outputs of about 4e-6."""
    p = bb.emit(relax.op.nn.softmax(x, axis=-1))
    return relax.op.multiply(p, relax.const(1e-3, "float32"))


def _zero_outputs(bb, x):
    """A written-out GELU whose result is multiplied by zero: outputs all zero."""
    half = relax.const(0.5, "float32")
    erf = bb.emit(relax.op.erf(relax.op.multiply(x, relax.const(2 ** -0.5, "float32"))))
    gelu = bb.emit(relax.op.multiply(relax.op.multiply(x, half),
                                     relax.op.add(relax.const(1.0, "float32"), erf)))
    return relax.op.multiply(gelu, relax.const(np.zeros((256,), "float32")))


def test_a_wrong_rule_fails_the_run_on_a_model_with_tiny_outputs(tmp_path):
    mod = _module(_tiny_outputs)
    report = run(mod, patterns=[ScaledSoftmax()], out_dir=tmp_path, draw=False)
    assert report.rewrites == {"demo.scaled_softmax": 1}
    assert not report.ok
    (failed,) = [s for s in report.sites.report.sites if s.status == "fail"]
    assert (failed.rule, failed.function) == ("demo.scaled_softmax", "main")
    markdown = (tmp_path / "report.md").read_text()
    assert markdown.startswith("# patternkit run: FAIL")
    assert f"FAIL `demo.scaled_softmax` in `main` at `{failed.binding}`" in markdown
    assert "`demo.scaled_softmax`: 1 site(s), 0 validated, 1 failed" in markdown
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["ok"] is False and saved["sites"]["by_rule"]["demo.scaled_softmax"]["failed"] == 1


def test_the_cli_exits_1_naming_the_rule(tmp_path, capsys):
    rules = tmp_path / "rules.py"
    rules.write_text(
        "import patternkit as pk\nfrom tvm import relax\n\n"
        "class ScaledSoftmax(pk.DFPatternCallback):\n"
        "    name = 'demo.scaled_softmax'\n"
        "    def __init__(self):\n"
        "        super().__init__(rewrite_once=True)\n"
        "        self.x = pk.wildcard()\n"
        "        self.pattern = pk.is_op('nn.softmax')(self.x)\n"
        "    def callback(self, pre, post, node_map):\n"
        "        return relax.op.multiply(relax.op.nn.softmax(node_map[self.x][0], axis=-1),\n"
        "                                 relax.const(1.5, 'float32'))\n\n"
        "import numpy as np\n"
        "x = relax.Var('x', relax.TensorType((2, 256), 'float32'))\n"
        "bb = relax.BlockBuilder()\n"
        "with bb.function('main', [x]):\n"
        "    with bb.dataflow():\n"
        "        p = bb.emit(relax.op.nn.softmax(x, axis=-1))\n"
        "        out = bb.emit_output(relax.op.multiply(p, relax.const(1e-3, 'float32')))\n"
        "    bb.emit_func_output(out)\n"
        "mod = bb.get()\n"
        "rule = ScaledSoftmax()\n")
    code = cli_main(["run", str(rules), "--patterns", f"{rules}:rule",
                     "--out", str(tmp_path / "out"), "--no-draw"])
    assert code == 1
    printed = capsys.readouterr().out
    assert printed.startswith("FAIL: ") and "evidence: " in printed
    assert "FAIL demo.scaled_softmax in main at " in printed
    assert "FAIL `demo.scaled_softmax`" in (tmp_path / "out" / "report.md").read_text()


def test_outputs_that_are_all_zero_are_no_evidence_and_the_sites_decide(tmp_path):
    mod = _module(_zero_outputs)
    report = run(mod, patterns=["gelu.collapse"], out_dir=tmp_path, draw=False)
    assert report.rewrites == {"gelu.collapse": 1}
    assert report.numeric.status == "inconclusive"
    assert report.sites.by_rule["gelu.collapse"] == {"sites": 1, "validated": 1,
                                                         "failed": 0, "not_run": 0}
    assert report.ok
    markdown = (tmp_path / "report.md").read_text()
    assert "INCONCLUSIVE" in markdown and "the verdict rests on the rewrite sites" in markdown
    assert "1 of 1 rewrite site(s) validated" in markdown
