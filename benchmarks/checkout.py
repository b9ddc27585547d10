"""Run a benchmark's child process on an older checkout of patternkit (``--before DIR``).

``DIR`` is a ``git archive <commit> | tar -x`` of the repository.  Putting it first on
``PYTHONPATH`` makes ``import patternkit`` load the old engine, but the editable install
maps ``patternkit.patterns`` to the working tree's ``patterns/`` folder by name, which would
pair the old engine with today's rule library (and may not even import).  So the child is
told the checkout in an environment variable and imports that checkout's own ``patterns/``
before anything else imports the library.
"""

from __future__ import annotations

import importlib.util
import os
import sys

#: Set in a ``--before`` child: the checkout whose rule library it imports.
CODE_VARIABLE = "PATTERNKIT_BENCH_CODE"


def child_env(code: str | None) -> dict[str, str]:
    """The environment of a child process that imports the checkout ``code`` (or this
    tree's patternkit when ``code`` is ``None``).
    """
    env = dict(os.environ)
    env.pop(CODE_VARIABLE, None)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [code, env.get("PYTHONPATH")]))
        env[CODE_VARIABLE] = code
    return env


def import_checkout_library() -> None:
    """In a child started with :func:`child_env`, import the checkout's ``patterns/`` as
    ``patternkit.patterns`` (nothing to do in a child of this tree).
    """
    code = os.environ.get(CODE_VARIABLE)
    if not code:
        return
    import patternkit

    folder = os.path.join(code, "patterns")
    spec = importlib.util.spec_from_file_location(
        "patternkit.patterns", os.path.join(folder, "__init__.py"),
        submodule_search_locations=[folder])
    if spec is None or spec.loader is None or not patternkit.__file__.startswith(code):
        raise SystemExit(f"--before: {code} is not a patternkit checkout imported first")
    module = importlib.util.module_from_spec(spec)
    sys.modules["patternkit.patterns"] = module
    spec.loader.exec_module(module)
