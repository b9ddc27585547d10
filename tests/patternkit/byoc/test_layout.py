"""byoc's rooms: tables < merge < partition < reports, each importing only the rooms below it.

A table knows nothing of merging, merging nothing of partitioning, and the reports read
all three; an import the other way would make the rooms one drawer again.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import patternkit.byoc

BYOC = Path(patternkit.byoc.__file__).parent
ROOMS = ["tables", "merge", "partition", "reports"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(BYOC.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every import of ``path``, relative ones resolved."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return found


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["patternkit", "byoc"] and len(parts) > 2 else None


@pytest.mark.parametrize("room", ROOMS)
def test_a_room_imports_only_the_rooms_below_it(room):
    files = sorted((BYOC / room).glob("*.py"))
    assert files, f"patternkit/byoc/{room}/ is empty"
    upward = [f"{path.relative_to(BYOC)}:{line} imports {module}"
              for path in files for line, module in _imported(path)
              if _room(module) in ROOMS and ROOMS.index(_room(module)) > ROOMS.index(room)]
    assert not upward, f"byoc/{room} imports a room above it:\n" + "\n".join(upward)


def test_every_byoc_module_lives_in_a_room():
    loose = sorted(p.name for p in BYOC.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside tables/, merge/, partition/, reports/: {loose}"
