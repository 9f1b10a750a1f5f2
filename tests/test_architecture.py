"""The rules of ARCHITECTURE.md, checked on the source (ast, nothing imported): no import circle among the project's
modules, counting imports inside functions and under TYPE_CHECKING too; Prefect only in flows/ and deployments/;
the lower layers (tasks/, cluster/) never import the upper ones (flows/, cli/); no function over 60 lines;
docstrings, comments and docs cite only files that exist."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("cli", "cluster", "deployments", "flows", "tasks")
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project's packages."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported(tree: ast.Module, name: str, is_package: bool, known: dict[str, Path]) -> Iterator[str]:
    """Project modules that `name` imports anywhere in its source (module level, functions, TYPE_CHECKING)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            # `from a import b` imports the module a.b when there is one, else the name b from a
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import a.b.c` where only a.b is ours: the deepest module we have
                t = t.rpartition(".")[0]
            if t and t != name:
                yield t


def import_graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: set(_imported(ast.parse(path.read_text()), name, path.name == "__init__.py", known))
            for name, path in known.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as one concrete cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(_a_cycle(graph, set(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def _a_cycle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """One cycle through the component: a -> b -> ... -> a (breadth-first back to the start)."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def test_the_cycle_finder_finds_a_planted_cycle_and_names_it():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(g) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_parser_resolves_from_imports_to_modules_and_sees_function_level_imports():
    known = {"cluster.inventory": Path(), "cluster.ray_nodes": Path(), "cluster": Path()}
    tree = ast.parse("from cluster import ray_nodes\ndef f():\n    from cluster.inventory import Cluster\n"
                     "import json\n")
    assert set(_imported(tree, "x", False, known)) == {"cluster.ray_nodes", "cluster.inventory"}


def test_no_import_cycle_among_the_project_modules():
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles (move the shared piece into a lower module): " + "; ".join(
        " -> ".join(c) for c in cycles)


def test_lower_layers_never_import_upper_ones():
    """tasks/ and cluster/ are the work; flows/ wraps it for Prefect and cli/ for the shell, never the reverse."""
    upper = ("flows", "cli", "deployments")
    bad = [f"{m} imports {t}" for m, ts in import_graph().items() if m.split(".")[0] in ("tasks", "cluster")
           for t in ts if t.split(".")[0] in upper]
    assert not bad, bad


def test_pure_logic_never_imports_prefect():
    """Pure logic (tasks/, cluster/) never imports Prefect (ARCHITECTURE.md): @flow/@task wrappers live in flows/, and the
    front-ends (cli/, deployments/) drive them."""
    bad = []
    for name, path in _modules().items():
        if name.split(".")[0] not in ("tasks", "cluster"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{path.relative_to(REPO)}:{node.lineno} imports {m}" for m in mods if m.split(".")[0] == "prefect"]
    assert not bad, bad


def long_functions(limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions longer than `limit` lines, as `path:line name (N lines)`."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > limit:
                        out.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_over_60_lines():
    long = long_functions()
    assert long == [], f"split these into named steps: {long}"


# cited paths ----------------------------------------------------------------------------------------------------
PROSE_ROOTS = (*PACKAGES, "tests", "benchmarks")
_CITED = re.compile(r"(?<![\w./-])(?:[\w.-]+/)*[\w-]+\.(?:md|py|yaml)\b(?![\w/-])")


def _python_text(text: str) -> tuple[list[tuple[int, str]], set[str]]:
    """(line, text) of every comment and string statement (module, class, function and attribute docstrings), and
    the other string constants: the names of the files the code reads and writes."""
    prose = []
    if any(_CITED.search(line, line.index("#")) for line in text.splitlines() if "#" in line):  # tokenize is slow
        prose = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
                 if t.type == tokenize.COMMENT]
    docs, strings = set(), {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            prose.append((node.lineno, node.value.value))
            docs.add(id(node.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200:
            strings[id(node)] = node.value
    return prose, {v for k, v in strings.items() if k not in docs}


def _markdown_prose(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every line outside fenced code blocks (a command's example names the user's files)."""
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield i, line


def missing_citations(sources: dict[Path, str], repo: Path = REPO) -> list[str]:
    """Paths ending .md/.py/.yaml that prose cites and that are not there. A path with a directory must exist from
    the repository root or from the citing file's folder; a bare name is checked only for .md (a bare job.yaml or
    program.py is the user's or a run's file) and is fine when a file of that name is in the repository or the code
    writes or reads it (it appears in a string constant, as summary.md does)."""
    names = {p.name for root in (*PROSE_ROOTS, "docs") for p in (repo / root).rglob("*")} | \
        {p.name for p in repo.iterdir()}
    prose: dict[Path, list[tuple[int, str]]] = {}
    written: set[str] = set()
    for path, text in sources.items():
        if path.suffix == ".py":
            prose[path], strings = _python_text(text)
            written |= {Path(s).name for s in strings}
        else:
            prose[path] = list(_markdown_prose(text))
    out = []
    for path, chunks in prose.items():
        for line, chunk in chunks:
            for cited in {m.group(0) for m in _CITED.finditer(chunk)}:
                if "/" in cited:
                    if not ((repo / cited).exists() or (path.parent / cited).exists()):
                        out.append(f"{path.relative_to(repo)}:{line} cites {cited}")
                elif cited.endswith(".md") and cited not in names and cited not in written:
                    out.append(f"{path.relative_to(repo)}:{line} cites {cited}")
    return sorted(set(out))


def _prose_sources() -> dict[Path, str]:
    paths = [p for root in PROSE_ROOTS for p in sorted((REPO / root).rglob("*.py"))]
    paths += sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md", REPO / "ARCHITECTURE.md"]
    return {p: p.read_text() for p in paths}


def test_the_citation_check_finds_a_planted_missing_path_and_spares_real_and_written_files():
    src = {REPO / "tasks" / "x.py": '"""See design.md and notes/scheduling.md, docs/commands.md and README.md."""\n'
                                     '# also tasks/nothing_here.py; the user gives job.yaml\n'
                                     'OUT = "summary.md"\nX = "not/prose.md"\n',
           REPO / "docs" / "y.md": "Read [this](commands.md) and ../gone.md.\n```\nfrenzy x missing/file.yaml\n```\n"}
    assert missing_citations(src) == ["docs/y.md:1 cites ../gone.md", "tasks/x.py:1 cites design.md",
                                      "tasks/x.py:1 cites notes/scheduling.md", "tasks/x.py:2 cites tasks/nothing_here.py"]


def test_docstrings_comments_and_docs_cite_only_paths_that_exist():
    missing = missing_citations(_prose_sources())
    assert not missing, f"point these at the file that holds it, or say it in place: {missing}"
