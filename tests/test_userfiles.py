"""The refusing reader and the one YAML loader (tasks/userfiles.py), by property (hypothesis) and on real special
files: a FIFO nobody writes, character devices, a socket, a symlink loop, a dangling link, files past a limit."""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.userfiles import (
    UserFileError,
    decode_utf8,
    json_loads,
    load_yaml,
    open_user_file,
    path_kind,
    read_bytes,
    regular_file,
    yaml_text,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

keys = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=12)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.text(alphabet=string.printable, max_size=20),
)
documents = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)), max_leaves=20
)


@SETTINGS
@given(st.dictionaries(keys, documents, min_size=1, max_size=5))
def test_any_plain_document_round_trips_and_every_key_has_a_line(data):
    doc = yaml_text(yaml.safe_dump(data, sort_keys=False), "f.yaml")
    assert doc.data == data
    for k in data:
        line = doc.where((k,))
        assert line.startswith("f.yaml:") and int(line.split(":")[1]) >= 1


@SETTINGS
@given(st.dictionaries(keys, scalars, min_size=1, max_size=6), st.data())
def test_a_duplicate_key_anywhere_is_refused_naming_its_line(data, draw):
    key = draw.draw(st.sampled_from(sorted(data)))
    lines = yaml.safe_dump(data, sort_keys=False, width=10**6).splitlines()
    text = "\n".join([*lines, yaml.safe_dump({key: 1}).strip()]) + "\n"  # the key spelled as the dump spells it
    with pytest.raises(UserFileError, match="duplicate key") as info:
        yaml_text(text, "dup.yaml")
    assert f"dup.yaml:{len(lines) + 1}:1:" in str(info.value)


@SETTINGS
@given(st.sampled_from([".nan", ".NaN", ".NAN", ".inf", ".Inf", "-.inf", "+.inf", "-.INF"]), st.integers(0, 3))
def test_a_non_finite_number_is_refused_with_line_and_column(token, depth):
    text = "".join(f"{'  ' * i}k{i}:\n" for i in range(depth)) + f"{'  ' * depth}v: {token}\n"
    with pytest.raises(UserFileError, match="not a finite number") as info:
        yaml_text(text, "n.yaml")
    assert f"n.yaml:{depth + 1}:{2 * depth + 4}:" in str(info.value)


@pytest.mark.parametrize(
    "text", ["a: &x 1\nb: *x\n", "a: &x [1, 2]\nb: [*x, *x]\n", "base: &b {x: 1}\nc:\n  <<: *b\n", "a: &a [&b [1], *b]\n"]
)
def test_anchors_and_aliases_are_refused(text):
    with pytest.raises(UserFileError, match="(anchor|alias)"):
        yaml_text(text, "a.yaml")


def test_an_alias_bomb_is_refused_at_once():
    """The "billion laughs": nine levels of ten aliases would expand to 10^9 items for any consumer."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    with pytest.raises(UserFileError, match="anchor &a0 refused"):
        yaml_text("\n".join(lines), "bomb.yaml")


def test_merge_keys_and_non_scalar_keys_are_refused():
    with pytest.raises(UserFileError, match="merge key"):
        yaml_text("a:\n  <<: {x: 1}\n", "m.yaml")
    with pytest.raises(UserFileError, match="plain value"):
        yaml_text("? [1, 2]\n: x\n", "k.yaml")


@SETTINGS
@given(st.text(max_size=300))
def test_any_text_either_parses_or_is_refused_as_a_user_error(text):
    try:
        yaml_text(text, "fuzz.yaml")
    except UserFileError as err:
        assert str(err).startswith("fuzz.yaml")


@SETTINGS
@given(st.binary(max_size=300))
def test_any_bytes_either_parse_as_json_or_are_refused_as_a_user_error(data):
    try:
        json_loads(data, "fuzz.json")
    except UserFileError as err:
        assert str(err).startswith("fuzz.json")


@SETTINGS
@given(documents)
def test_json_round_trips_finite_data(data):
    assert json_loads(json.dumps(data), "x.json") == data


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"a": NaN}', "NaN is not a finite"),
        ("[Infinity]", "Infinity"),
        ('{"a": 1, "a": 2}', "duplicate key 'a'"),
        ('{"a": [1,', "x.json:1:"),
    ],
)
def test_json_refuses_non_finite_numbers_and_duplicate_keys(text, words):
    with pytest.raises(UserFileError, match="x.json") as info:
        json_loads(text, "x.json")
    assert words in str(info.value)


@SETTINGS
@given(st.lists(st.text(alphabet=string.ascii_letters + " ", max_size=30), min_size=1, max_size=8), st.data())
def test_a_bad_byte_is_named_by_line_and_column(lines, draw):
    row = draw.draw(st.integers(0, len(lines) - 1))
    col = draw.draw(st.integers(0, len(lines[row])))
    bad = [ln.encode() for ln in lines]
    bad[row] = bad[row][:col] + b"\xff" + bad[row][col:]
    with pytest.raises(UserFileError, match=f"t.txt:{row + 1}:{col + 1}: not UTF-8"):
        decode_utf8(b"\n".join(bad), "t.txt")


# ------------------------------------------------------------------------------------------- special files
def test_a_fifo_nobody_writes_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    with pytest.raises(UserFileError, match="is a FIFO"):
        load_yaml(fifo, "job file")
    with pytest.raises(UserFileError, match="is a FIFO"), open_user_file(fifo, "job file", 100):
        pass


@pytest.mark.parametrize("dev", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_character_devices_are_refused(dev):
    if not os.path.exists(dev):
        pytest.skip(f"no {dev} here")
    with pytest.raises(UserFileError, match="character device"):
        read_bytes(dev, "trace file", 1 << 20)


def test_a_socket_is_refused(tmp_path):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(UserFileError, match="is a socket"):
            regular_file(path, "suite file")


def test_a_symlink_loop_is_named_as_one_not_as_missing(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(UserFileError, match="symlink loop"):
        regular_file(tmp_path / "a", "job file")
    with pytest.raises(UserFileError, match="symlink loop"):
        path_kind(tmp_path / "a", "job file")


def test_a_dangling_link_is_named(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "gone.yaml")
    with pytest.raises(UserFileError, match="symlink to a missing file"):
        regular_file(tmp_path / "a", "job file")


def test_path_kind(tmp_path):
    (tmp_path / "f").write_text("x")
    assert [path_kind(tmp_path / n, "x") for n in ("f", ".", "nope")] == ["file", "dir", "missing"]


@SETTINGS
@given(st.integers(0, 4096), st.integers(0, 4096))
def test_a_file_past_its_limit_is_refused_and_never_read_past_it(tmp_path_factory, size, limit):
    p = tmp_path_factory.mktemp("lim") / "f.bin"
    p.write_bytes(b"x" * size)
    if size <= limit:
        assert read_bytes(p, "data file", limit) == b"x" * size
    else:
        with pytest.raises(UserFileError, match="past the size limit"):
            read_bytes(p, "data file", limit)


def test_a_proc_file_that_reports_size_zero_is_still_bounded():
    """/proc files are regular and report size 0 but hold data: at most limit + 1 bytes are read, then refused."""
    p = Path("/proc/self/maps")
    if not p.exists():
        pytest.skip("no /proc here")
    with pytest.raises(UserFileError, match="past the size limit"):
        read_bytes(p, "map", 16)


def test_floats_of_the_loader_are_finite_by_construction():
    doc = yaml_text("a: 1.5\nb: -2.0e+3\nc: [0.0, 1.0e-300]\n", "ok.yaml")
    assert all(math.isfinite(x) for x in (doc.data["a"], doc.data["b"], *doc.data["c"]))


# ------------------------------------------------------------------------------- the readers of typed documents
anything = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)), max_leaves=6
)


@functools.cache
def _fuzz_for(model: type, depth: int = 0) -> st.SearchStrategy:
    """Documents shaped like `model` (its keys, nested sections as mappings) whose values are anything YAML holds:
    numbers, strings, booleans, lists and mappings where the model wants something else. Built once per model: a
    strategy made again for every example cost a quarter of the job-document test's time (its own construction and
    hypothesis's first look at each new strategy object), for the same documents."""
    from pydantic import BaseModel

    fields = {}
    for name, f in model.model_fields.items():
        sub = next(
            (a for a in (f.annotation, *getattr(f.annotation, "__args__", ())) if isinstance(a, type) and issubclass(a, BaseModel)),
            None,
        )
        fields[name] = st.one_of(_fuzz_for(sub, depth + 1), anything) if sub is not None and depth < 2 else anything
    return st.fixed_dictionaries({}, optional=fields)


def _valid_or(err: type, fn, doc, tmp: Path, name: str) -> None:
    p = tmp / name
    p.write_text(yaml.safe_dump(doc))
    try:
        fn(p)
    except err as e:
        assert str(e).strip(), "an error must say something"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.data())
def test_any_job_document_is_read_or_refused_as_a_job_error(tmp_path, data):
    """Not a TypeError from a validator that assumed a type, not a KeyError, not an OverflowError: a JobSpecError."""
    from tasks.jobspec import JobSpec, JobSpecError, load_job

    doc = data.draw(_fuzz_for(JobSpec))
    _valid_or(JobSpecError, load_job, doc, tmp_path, "job.yaml")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_cluster_document_is_read_or_refused_as_an_inventory_error(tmp_path, data):
    from cluster.inventory import Cluster, InventoryError, load_cluster

    doc = data.draw(
        st.one_of(_fuzz_for(Cluster), st.lists(_fuzz_for(Cluster.model_fields["nodes"].annotation.__args__[0]), max_size=3))
    )
    _valid_or(InventoryError, load_cluster, doc, tmp_path, "c.yaml")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_suite_document_is_read_or_refused_as_a_suite_error(tmp_path, data):
    from tasks.evaluation.suite import Suite, SuiteError, load_suite

    _valid_or(SuiteError, load_suite, data.draw(_fuzz_for(Suite)), tmp_path, "s.yaml")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_meta_and_catalog_document_is_read_or_refused(tmp_path, data):
    from cluster.catalog import CatalogError, GPUType, load_catalog
    from tasks.stragglers.trace import JobMeta, TraceError, load_meta

    _valid_or(TraceError, load_meta, data.draw(_fuzz_for(JobMeta)), tmp_path, "meta.yaml")
    _valid_or(CatalogError, load_catalog, data.draw(st.lists(_fuzz_for(GPUType), max_size=3)), tmp_path, "cat.yaml")


cells = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.floats().map(repr),
    st.sampled_from(["", "nan", "inf", "-inf", "1e999", "abc", "1,5", "\x00", "gpt-tiny", "llama3-8b", '"q"']),
    st.text(alphabet=string.printable, max_size=8),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(cells, cells, cells, cells, cells), min_size=0, max_size=6))
def test_any_trace_csv_is_read_or_refused_naming_a_line(tmp_path, rows):
    """Every job it returns is finite and sane; every refusal is a TraceError (never a ValueError of float())."""
    import csv
    import io

    from cluster.traces import TraceError, load_trace

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["submit_time", "duration", "num_gpus", "model", "global_batch"])
    w.writerows(rows)
    (tmp_path / "t.csv").write_text(buf.getvalue())
    try:
        jobs = load_trace(tmp_path / "t.csv")
    except TraceError as err:
        assert "t.csv" in str(err) or "trace" in str(err)
        return
    for j in jobs:
        assert math.isfinite(j.submit_s) and j.submit_s >= 0 and math.isfinite(j.duration_s) and j.duration_s > 0
        assert 1 <= j.num_gpus <= 1_000_000 and j.global_batch >= 1


def test_a_small_file_under_a_large_limit_needs_no_large_buffer(tmp_path):
    """A 4 GiB limit is a bound, not an allocation: under a 1 GiB address-space limit a small JSONL still reads (it
    once reserved the whole limit and died with MemoryError)."""
    import subprocess
    import sys

    (tmp_path / "d.jsonl").write_text('{"prompt": "a", "answer": "b"}\n' * 100)
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from tasks.userfiles import LIMITS, read_text\n"
        "print(len(read_text(sys.argv[1], 'dataset file', LIMITS['jsonl'])))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "d.jsonl")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == "3100", r.stderr


YAML_MISTAKES = [  # (job text, FILE:LINE:COL it is named at, words of the fix)
    ("name: tabs\ntraining:\n\tseq_len: 64\n", ":3:1:", "indent with spaces"),
    ("name: tabs\ntraining:\n  seq_len:\t64\n  steps: 4\n", ":3:", "indent with spaces"),
    ("name: a: b\n", ":1:8:", "quote it"),
    ("name: x\ntraining:\n  seq_len: 64\n steps: 4\n", ":4:2:", "same number of spaces"),
    ("name: 'x\n", ":2:1:", "quote is not closed"),
    ("name: x\ntraining: {seq_len: 64\n", ":3:1:", "write `{a: 1, b: 2}`"),
    ("name: x\n---\nname: y\n", ":2:1:", "one document per file"),
    ("name: !secret x\n", ":1:7:", "tags"),
    ("name: @x\n", ":1:7:", "quote the value"),
    ("name: x\x07\n", ":1:8:", "remove it"),
]


@pytest.mark.parametrize("text,where,fix", YAML_MISTAKES)
def test_a_yaml_mistake_in_a_job_file_is_named_with_its_place_and_its_fix(tmp_path, text, where, fix):
    from tasks.jobspec import JobSpecError, load_job

    job = tmp_path / "job.yaml"
    job.write_text(text)
    with pytest.raises(JobSpecError) as err:
        load_job(job)
    msg = str(err.value)
    assert msg.startswith(f"{job}{where}") and "not valid YAML" in msg and fix in msg, msg


@SETTINGS
@given(st.text(alphabet=string.printable + "\t\x07", max_size=60))
def test_every_yaml_parse_error_says_what_to_do(text):
    """Whatever PyYAML stops on, the message goes on past its own words to a fix (`; ` then what to do)."""
    try:
        yaml_text(text, "fuzz.yaml")
    except UserFileError as err:
        msg = str(err)
        if "not valid YAML" in msg:
            assert any(
                w in msg
                for w in (
                    "indent with spaces",
                    "; a ",
                    "; this line",
                    "; the file",
                    "; YAML tags",
                    "; `*`",
                    "; remove it",
                    "; fix the YAML",
                    "; a quote",
                )
            ), msg


def test_tabs_in_a_job_file_are_refused_by_the_cli_with_the_fix(tmp_path, capsys):
    from cli.main import main

    job = tmp_path / "tabs.yaml"
    job.write_text("name: tabs\nmodel: {preset: gpt-tiny}\ntraining:\n\tseq_len: 64\n\tsteps: 4\n")
    assert main(["plan", str(job), "--json"]) == 2
    err = capsys.readouterr().err
    assert f"{job}:4:1:" in err and "indent with spaces" in err and err.count("\n") == 1, err
