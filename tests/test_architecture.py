"""What the folders promise, checked on the source: which part may import which, that the engine reads no
environment, that functions stay short enough to read, and that tests use only what modules make public."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LONGEST_FUNCTION = 60


def sources(*folders: str) -> Iterator[Path]:
    for folder in folders:
        yield from (path for path in (ROOT / folder).rglob("*.py") if "migrations" not in path.parts)


def imported(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_no_function_is_longer_than_sixty_lines() -> None:
    long = [
        f"{relative(path)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"  # type: ignore[operator]
        for path in sources("inference", "webapp", "visualizer")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION  # type: ignore[operator]
    ]
    assert long == []


def test_nothing_in_the_engine_reads_the_environment() -> None:
    """Settings arrive as one LoadConfig (and SchedulerConfig), built by the worker or the CLI."""
    readers = [
        relative(path)
        for path in sources("inference")
        if "os.environ" in path.read_text() or "getenv" in path.read_text()
    ]
    assert readers == []


@pytest.mark.parametrize(
    "folder, forbidden",
    [
        ("inference", ("django", "channels", "webapp", "visualizer")),  # the engine knows no web framework
        ("webapp/worker", ("webapp.gateway", "webapp.api", "visualizer")),  # the worker never imports the gateway
        ("webapp/gateway", ("visualizer", "webapp.api", "torch", "webapp.worker.runner", "webapp.worker.service")),
        ("webapp/api", ("visualizer", "torch")),  # the API never depends on the page
    ],
)
def test_each_part_imports_only_what_lies_below_it(folder: str, forbidden: tuple[str, ...]) -> None:
    crossings = [
        f"{relative(path)} imports {name}"
        for path in sources(folder)
        for name in imported(path)
        if name.startswith(forbidden)
    ]
    assert crossings == []


def test_no_test_imports_a_private_name() -> None:
    private = [
        f"{relative(path)}:{node.lineno} {alias.name}"
        for path in sources("tests")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module != "__future__"
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert private == []
