"""Record what the library's contract cases prove, to compare two versions of the code.

A restructuring of the rule model must not change what any rule does.  This script
imports every ``tests/patterns/test_*.py`` module, runs :func:`check_rule` on each
module-level :class:`RuleCase`, and writes one JSON line per case: whether all four
proofs passed, the first line of the failure otherwise, how often the rule fired on its
positive case, and the reason (and guard) each negative case refused with.  Run it
before and after a change and ``diff`` the two files; the run takes about a minute.

    python benchmarks/parity.py > before.jsonl
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from pathlib import Path

from patternkit.testing import RuleCase, apply_rule, check_rule

ROOT = Path(__file__).resolve().parent.parent


def cases() -> list[tuple[str, str, RuleCase]]:
    """Every module-level RuleCase of tests/patterns, with its module and variable name."""
    found = []
    sys.path.insert(0, str(ROOT / "tests"))
    for path in sorted((ROOT / "tests" / "patterns").glob("test_*.py")):
        spec = importlib.util.spec_from_file_location(f"parity_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        for name, value in vars(module).items():
            if isinstance(value, RuleCase):
                found.append((path.stem, name, value))
    return found


def record(module: str, variable: str, case: RuleCase) -> dict:
    """What the four proofs say about one case (never raises)."""
    entry: dict = {"case": f"{module}.{variable}", "rule": case.name}
    try:
        entry["fired"] = apply_rule(case.rule, case.before).fired
        proof = check_rule(case)
        entry["proved"] = True
        entry["negatives"] = [
            {"name": n.negative.name, "reasons": list(n.reasons)} for n in proof.negatives]
    except Exception as error:  # noqa: BLE001  (a record, not a test: keep going)
        entry["proved"] = False
        first_line = str(error).splitlines()[0] if str(error) else ""
        entry["error"] = f"{type(error).__name__}: {first_line}"
    return entry


def main() -> None:
    warnings.simplefilter("ignore")
    for module, variable, case in cases():
        print(json.dumps(record(module, variable, case), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
