"""lm-evaluation-harness on Frenzy (issue 42), against lm-eval 0.4.13 itself: its HF backend request by request,
six task types through a Frenzy suite and through `lm_eval`, the `frenzy` model through lm-eval's CLI, and what is
refused. Offline: task data and models are written here (tests/lmeval_kit.py)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
# the datasets library's cache of the task files, out of the user's home (read when the library is imported)
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="frenzy-test-hf-datasets-"))
lm_eval = pytest.importorskip("lm_eval")

from tasks.errors import FrenzyError  # noqa: E402
from tasks.evaluation.lmeval.requests import RequestError, cut_at_stops, gen_settings, rolling_windows  # noqa: E402
from tests import lmeval_kit as kit  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
REL = 1e-4  # the bound on per-example log-likelihoods


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("lmeval")
    old = os.environ.get("FRENZY_CACHE")
    os.environ["FRENZY_CACHE"] = str(root / "cache")
    yield {"root": root, "tasks": kit.write_tasks(root), "llama": kit.export_model(root, kit.LLAMA, seed=0),
           "gpt2": kit.export_model(root, kit.GPT2, seed=1)}
    if old is None:
        os.environ.pop("FRENZY_CACHE", None)
    else:
        os.environ["FRENZY_CACHE"] = old


def test_windows_stops_and_generation_settings_follow_lm_eval():
    from lm_eval import utils as U
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

    for n in (0, 1, 7, 63, 64, 65, 128, 200, 1000):
        toks = list(range(5, 5 + n))
        want = [U.make_disjoint_window(w) for w in U.get_rolling_token_windows(toks, 0, 64, 1)]
        assert rolling_windows(toks, 0, 64) == [(list(a), list(b)) for a, b in want], n
    for text, until in [("a\nb Q: c", ["\n", "Q:"]), ("x</s>y\nz", ["</s>"]), ("none", ["\n"]), ("", ["a"])]:
        assert cut_at_stops(text, until) == postprocess_generated_text(text, until, None)
    for kw in [{"until": "\n"}, {"until": ["a", "b"], "max_new_tokens": 7}, {"max_gen_toks": 3, "max_tokens": 9},
               {"do_sample": False, "temperature": 0.0}, {}]:
        norm = normalize_gen_kwargs(dict(kw), 256)
        st = gen_settings(kw, "<eos>")
        assert st.max_gen_toks == norm["max_gen_toks"]
        assert list(st.until) == handle_stop_sequences(norm.get("until"), "<eos>")
    for bad in [{"do_sample": True, "temperature": 0.7}, {"temperature": 0.5}, {"num_beams": 4}]:
        with pytest.raises(RequestError, match="greedily|not supported"):
            gen_settings(bad, None)


def test_continuations_share_a_row_only_within_the_context_length():
    """Choices of a question share one row; rolling windows (long continuations after the 1-token prefix) do not,
    or one row would grow to every window's length and its attention with the square of it."""
    from tasks.evaluation.lmeval.requests import _pack

    mc = _pack(list(range(100)), {(i, i + 1, i + 2): [i] for i in range(4)}, max_length=256)
    assert len(mc) == 1 and mc[0].length == 100 + 4 * 2 and mc[0].owners == [[0], [1], [2], [3]]
    windows = _pack([0], {tuple(range(k, k + 256)): [k] for k in range(5)}, max_length=256)
    assert [len(r.conts) for r in windows] == [1] * 5 and all(r.length <= 256 for r in windows)
    many = _pack(list(range(10)), {tuple(range(k, k + 60)): [k] for k in range(12)}, max_length=256)
    assert all(r.length <= 256 for r in many) and sum(len(r.conts) for r in many) == 12 and len(many) == 3


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_harness_answers_every_request_type_as_the_hf_backend(world, arch):
    """Request by request against lm-eval's HFLM on the same exported directory: log-likelihoods (empty and
    whitespace-ended contexts, one- and many-token continuations, rows longer than the context), rolling
    log-likelihoods over several windows, greedy generations with stop strings and truncated contexts."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from tasks.evaluation.engine import LM, load_remote
    from tasks.evaluation.lmeval.requests import Harness

    hf_dir = world[arch]
    hf = HFLM(pretrained=str(hf_dir), device="cpu", dtype="float32", batch_size=8)
    h = Harness(LM(*load_remote(str(hf_dir))), batch_tokens=1024, gen_batch=5)
    assert (h.max_length, h.prefix_id, h.eos_id) == (hf.max_length, hf.prefix_token_id, hf.eot_token_id)
    lines = kit.corpus_lines()
    long_ctx = " ".join(lines[:80])  # far past the 256-token context: both keep the last 257 tokens
    pairs = [(lines[i][:30], " " + lines[i + 1][:k]) for i in range(12) for k in (1, 4, 17)]
    pairs += [("", "def f(x): return x"), ("a trailing space ", "moves"), (long_ctx, " and the tail"),
              (lines[20], lines[21])]
    inst = lambda kind, args: Instance(request_type=kind, doc={}, arguments=args, idx=0)  # noqa: E731
    ref = hf.loglikelihood([inst("loglikelihood", p) for p in pairs])
    got = h.loglikelihood(pairs)
    assert max(abs(a[0] - b[0]) / abs(a[0]) for a, b in zip(ref, got, strict=True)) < REL
    assert [a[1] for a in ref] == [b[1] for b in got]
    docs = ["\n".join(lines[100 + 40 * i:140 + 40 * i + 25 * i]) for i in range(4)]
    ref_r = hf.loglikelihood_rolling([inst("loglikelihood_rolling", (d,)) for d in docs])
    assert max(abs(a - b) / abs(a) for a, b in zip(ref_r, h.loglikelihood_rolling(docs), strict=True)) < REL
    gens = [(lines[300 + i][:25 + i], {"until": ["\n", "e"], "max_gen_toks": 12}) for i in range(9)]
    gens += [(long_ctx, {"until": ["\n"], "max_gen_toks": 20}), ("Q: 1 + 2 =\nA:", {"until": "\n", "max_gen_toks": 6})]
    ref_g = hf.generate_until([inst("generate_until", g) for g in gens])
    assert h.generate_until(gens) == ref_g
    with pytest.raises(RequestError, match="no room"):  # lm-eval's default 256 new tokens fill the whole context
        h.generate_until([("Q:", {"until": "\n"})])


def _hf_results(world, tasks: list[str]) -> dict:
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={world['llama']},dtype=float32", device="cpu",
                                   tasks=tasks, batch_size=8, log_samples=True,
                                   task_manager=TaskManager(include_path=str(world["tasks"]), include_defaults=False))


def _frenzy_predictions(out: Path, task: str) -> dict[int, list]:
    rows = [json.loads(ln) for f in sorted((out / "predictions" / task).glob("*.jsonl")) for ln in f.read_text().splitlines()]
    return {r["id"]: r["prediction"]["resps"] for r in rows}


def _compare(ref: dict, ours: dict[str, dict[int, list]]) -> dict[str, float]:
    """Per task: the largest relative difference of a log-likelihood (generations must be equal strings)."""
    worst = {}
    for task, per_doc in ours.items():
        samples = {s["doc_id"]: s for s in ref["samples"][task]}
        assert sorted(samples) == sorted(per_doc), task
        w = 0.0
        for doc_id, resps in per_doc.items():
            theirs = [r[0] for r in samples[doc_id]["resps"]]
            for a, b in zip(theirs, resps, strict=True):
                if isinstance(a, str):
                    assert a == b, (task, doc_id)
                else:
                    a0, b0 = (a[0], b[0]) if isinstance(a, list | tuple) else (a, b)
                    w = max(w, abs(a0 - b0) / abs(a0))
                    if isinstance(a, list | tuple):
                        assert bool(a[1]) == bool(b[1]), (task, doc_id)
        worst[task] = w
    return worst


def _same_metrics(ref: dict, ours: dict[str, dict[str, float]]) -> None:
    """Every metric lm-eval reports for a task or group: discrete ones (acc, exact_match, their stderr) equal,
    ones computed from log-likelihoods (perplexity, bits per byte) within REL."""
    for name, metrics in ours.items():
        theirs = {k: v for k, v in ref["results"][name].items() if "," in k and isinstance(v, int | float)}
        assert set(theirs) == set(metrics), (name, sorted(theirs), sorted(metrics))
        for k, v in theirs.items():
            if "perplexity" in k or "bits_per_byte" in k:
                assert math.isclose(v, metrics[k], rel_tol=REL), (name, k, v, metrics[k])
            else:
                assert v == metrics[k], (name, k, v, metrics[k])


def _suite_parity(world, tmp_path, tasks: list[str], leaves: list[str], limit: int | None) -> dict:
    """The suite `tasks` through Frenzy's evaluation (precursor, trials on two slots, CPU metric jobs) on the
    exported model against lm-eval's HF backend on it: every per-example log-likelihood within 1e-4 relative,
    every generation the same text, every task and group metric the same."""
    from tasks.evaluation.runner import EvalOptions, evaluate
    from tasks.evaluation.suite import load_suite

    suite_file = tmp_path / "suite.yaml"
    suite_file.write_text(f"name: lmeval\nmodel_load_s: {{remote: 1.0, shm: 0.5}}\nlmeval:\n"
                          f"  include: [{os.path.relpath(world['tasks'], tmp_path)}]\n  tasks: {tasks}\n"
                          f"  bootstrap_iters: 1000\n  limit: {limit or 'null'}\n")
    res = evaluate(str(world["llama"]), load_suite(suite_file), EvalOptions(out_dir=str(tmp_path / "out"),
                   gpus_per_node=2, learn_priors=False, cpu_workers_per_node=2, shm_root=str(tmp_path / "shm")))
    ref = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={world['llama']},dtype=float32", device="cpu",
                                  tasks=tasks, batch_size=8, log_samples=True, bootstrap_iters=1000, limit=limit,
                                  task_manager=_task_manager(world))
    assert sorted(res.scores) == sorted(set(leaves) | set(ref["groups"]))
    worst = _compare(ref, {t: _frenzy_predictions(tmp_path / "out", t) for t in leaves})
    assert max(worst.values()) < REL, worst
    _same_metrics(ref, res.scores)
    assert len(res.trials) >= 2 and all(t.load == "shm" for t in res.trials)
    # each task was aggregated by a metric job when its last chunk was scored, not after the run
    assert sorted(f.stem for f in (tmp_path / "out" / "aggregates").glob("*.json")) == sorted(leaves)
    return res.scores


def test_a_suite_of_lm_eval_tasks_gives_lm_evals_numbers(world, tmp_path):
    """Multiple choice, generation with a regex filter and a group holding a 3-shot task, first 6 documents."""
    scores = _suite_parity(world, tmp_path, ["frz_mc", "frz_gen", "frz_group"],
                           ["frz_mc", "frz_gen", "frz_mc_b", "frz_fewshot"], limit=6)
    # equal to lm-eval's (above); whether it is above 0 on 6 documents depends on what a random model emits for the
    # two whose answer is the regex fallback, i.e. on the corpus (this repository's source): the 200-document test
    # below also holds it strictly between 0 and 1
    assert 0 <= scores["frz_gen"]["exact_match,strict-match"] <= 1


@pytest.mark.slow  # about 40 s of CPU: every document of six task types, twice
def test_six_task_types_through_a_suite_give_lm_evals_numbers(world, tmp_path):
    scores = _suite_parity(world, tmp_path, kit.TASKS,
                           ["frz_mc", "frz_ppl", "frz_gen", "frz_cont", "frz_mc_b", "frz_fewshot"], limit=None)
    assert 0 < scores["frz_gen"]["exact_match,strict-match"] < 1 and 0 < scores["frz_group"]["acc,none"] < 1


def test_lm_eval_templates_compiled_once_build_the_requests_a_fresh_compile_builds(world, monkeypatch):
    """Every task's requests are the same whether lm-eval compiles each template for every document (its own way)
    or once per source (Frenzy's), and a second build compiles nothing."""
    from lm_eval import utils

    from tasks.evaluation.lmeval import source
    from tasks.evaluation.suite import LmevalSource

    src = LmevalSource(tasks=kit.TASKS, include=[str(world["tasks"])])
    tasks = source.load(src).tasks  # its loading turns compile-once on
    env = utils.env
    compiles = []
    compile_one = type(env).compile
    monkeypatch.setattr(type(env), "compile", lambda self, *a, **k: compiles.append(1) or compile_one(self, *a, **k))
    once = {n: source.build_requests(t, src) for n, t in tasks.items()}
    compiles.clear()
    assert {n: source.build_requests(t, src) for n, t in tasks.items()} == once and not compiles
    monkeypatch.setattr(env, "from_string", type(env).from_string.__get__(env))  # lm-eval's: a compile per use
    assert {n: source.build_requests(t, src) for n, t in tasks.items()} == once and len(compiles) > 100


def test_a_metric_with_array_values_is_aggregated_as_lm_eval_aggregates_it(world, tmp_path):
    """`brier_score`'s per-document value holds a numpy array (the class probabilities): the metric job writes it as
    JSON and the aggregate equals lm-eval's own (it failed with "ndarray is not JSON serializable")."""
    from lm_eval.tasks import TaskManager

    from tasks.evaluation.runner import EvalOptions, evaluate
    from tasks.evaluation.suite import LmevalSource, Suite

    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "frz_brier.yaml").write_text(f"include: {world['tasks'] / 'frz_mc.yaml'}\ntask: frz_brier\n"
                                          "metric_list: [{metric: brier_score}]\n")
    suite = Suite(name="b", lmeval=LmevalSource(tasks=["frz_brier"], include=[str(extra)], limit=6, bootstrap_iters=0))
    res = evaluate(str(world["llama"]), suite, EvalOptions(out_dir=str(tmp_path / "out"), gpus_per_node=1,
                   learn_priors=False, cpu_workers_per_node=1, shm_root=str(tmp_path / "shm")))
    ref = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={world['llama']},dtype=float32", device="cpu",
                                  tasks=["frz_brier"], batch_size=8, limit=6, bootstrap_iters=0,
                                  task_manager=TaskManager(include_path=str(extra), include_defaults=False))
    ours, theirs = res.scores["frz_brier"]["brier_score,none"], ref["results"]["frz_brier"]["brier_score,none"]
    assert 0 < theirs < 2 and math.isclose(ours, theirs, rel_tol=REL), (ours, theirs)


def test_bootstrapped_standard_errors_come_from_a_forkserver_pool_with_lm_evals_numbers(monkeypatch):
    """lm-eval's bootstrap forks a pool from the metric thread (a worker forked while another thread holds a lock can
    hang the run for ever: it hung CI twice); Frenzy's replacement draws the same chunks with the same seeds."""
    import multiprocessing as mp

    import lm_eval.api.metrics as m

    from tasks.evaluation.lmeval.source import bootstrap_without_fork

    xs = [(-float(i % 7) - 0.5, 3 + i % 5) for i in range(40)]  # (log-likelihood, words) items of word_perplexity
    before = m.bootstrap_stderr  # already replaced where an earlier test of this process evaluated a suite
    original = getattr(before, "lm_evals", before)
    want = original(m.weighted_perplexity, xs, 2000)  # lm-eval's own, forked here from a quiet main thread
    bootstrap_without_fork()
    try:
        assert m.bootstrap_stderr is not original and m.bootstrap_stderr.lm_evals is original

        def no_default_pool(*a, **k):  # what lm-eval's own calls: the default (fork) start method
            raise AssertionError("a pool of the default start method")

        monkeypatch.setattr(mp, "Pool", no_default_pool)
        with pytest.raises(AssertionError, match="default start method"):
            original(m.weighted_perplexity, xs, 2000)  # the negative control: lm-eval's would fork
        assert m.bootstrap_stderr(m.weighted_perplexity, xs, 2000) == want and want > 0
    finally:
        m.bootstrap_stderr = before


def _task_manager(world):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(world["tasks"]), include_defaults=False)


def test_the_pth_hook_registers_frenzy_after_lm_evals_models_and_is_silent_without_frenzy(tmp_path):
    """The .pth the plugin writes, in a fresh interpreter: `frenzy` resolves through the entry point, lm-eval's own
    `hf` still does; with another `tasks` package in the way, start-up prints nothing and lm-eval is unchanged."""
    from tasks.evaluation.lmeval.plugin import main

    assert main(["install", "--site-dir", str(tmp_path)]) == 0
    probe = ("import sys, site; {pre}site.addsitedir(sys.argv[1]); from lm_eval.api.registry import get_model; "
             "print(get_model('hf').__name__, 'frenzy' in sys.modules['lm_eval.api.registry'].model_registry)")
    for pre, want in [("", "HFLM True"), ("sys.modules['tasks'] = type(sys)('tasks'); ", "HFLM False")]:
        r = subprocess.run([sys.executable, "-c", probe.format(pre=pre), str(tmp_path)], capture_output=True, text=True,
                           cwd=tmp_path)
        assert r.returncode == 0 and r.stdout.split() == want.split() and "Error" not in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", "import sys, site; site.addsitedir(sys.argv[1]); from lm_eval.api.registry "
                        "import get_model; print(get_model('frenzy').__module__)", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.stdout.strip() == "tasks.evaluation.lmeval.model", r.stderr
    assert main(["uninstall", "--site-dir", str(tmp_path)]) == 0 and not (tmp_path / "frenzy-lmeval.pth").exists()


@pytest.mark.slow  # lm_eval's CLI indexes its ~10,000 task files first (15-60 s here)
def test_lm_eval_runs_the_frenzy_model_through_its_own_cli(world, tmp_path):
    """`lm_eval --model frenzy` in a fresh interpreter whose site directory holds the plugin's .pth: the entry point
    resolves, lm-eval's own models keep their names, and the numbers equal the HF backend's."""
    site = tmp_path / "site"
    site.mkdir()
    r = subprocess.run([sys.executable, "-m", "tasks.evaluation.lmeval.plugin", "install", "--site-dir", str(site)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and (site / "frenzy-lmeval.pth").is_file(), r.stderr
    out = tmp_path / "out"
    code = ("import site, sys; site.addsitedir(sys.argv[1]); from lm_eval.api.registry import get_model; "
            "assert get_model('hf').__name__ == 'HFLM'; from lm_eval.__main__ import cli_evaluate; "
            "sys.argv = ['lm_eval'] + sys.argv[2:]; cli_evaluate()")
    r = subprocess.run([sys.executable, "-c", code, str(site), "--model", "frenzy", "--model_args",
                        f"uri={world['llama']}", "--device", "cpu", "--tasks", "frz_mc,frz_gen,frz_ppl",
                        "--include_path", str(world["tasks"]), "--log_samples", "--output_path", str(out)],
                       capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(next(out.rglob("results_*.json")).read_text())
    assert got["config"]["model"] == "frenzy" and got["config"]["uri"] == str(world["llama"])
    ref = _hf_results(world, ["frz_mc", "frz_gen", "frz_ppl"])
    _same_metrics(ref, {t: {k: v for k, v in got["results"][t].items() if "," in k and isinstance(v, int | float)}
                        for t in ("frz_mc", "frz_gen", "frz_ppl")})


def test_frenzy_evaluate_runs_an_lm_eval_suite_on_a_model_directory(world, tmp_path):
    """The user's entry: `frenzy evaluate DIR --suite FILE --json` with an lmeval section (task names, a YAML path,
    the include path relative to the suite file); scores keyed as lm-eval prints them, history written."""
    suite = tmp_path / "lm.yaml"
    rel = os.path.relpath(world["tasks"], tmp_path)
    suite.write_text(f"name: lm\nlmeval:\n  include: [{rel}]\n  tasks: [frz_cont, {rel}/frz_mc.yaml]\n  limit: 4\n")
    r = subprocess.run([sys.executable, "-m", "cli", "evaluate", str(world["gpt2"]), "--suite", str(suite), "--json",
                        "--out-dir", str(tmp_path / "out"), "--history-dir", str(tmp_path / "hist"), "--no-learn"],
                       capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["step"] == 0 and doc["run"] == world["gpt2"].name
    assert sorted(doc["scores"]) == ["frz_cont", "frz_mc"]
    assert {"acc,none", "acc_norm,none", "acc_stderr,none"} <= set(doc["scores"]["frz_mc"])
    assert doc["scores"]["frz_cont"]["perplexity,none"] > 1
    assert (tmp_path / "hist" / world["gpt2"].name).is_dir()


def _frenzy_model_scores(world, uri: str, names: list[str]) -> dict:
    from tasks.evaluation.lmeval import model  # noqa: F401 - registers `frenzy` (the entry point does it for the CLI)

    res = lm_eval.simple_evaluate(model="frenzy", model_args=f"uri={uri}", tasks=names, limit=5, bootstrap_iters=0,
                                  task_manager=_task_manager(world))
    return {t: {k: v for k, v in m.items() if "," in k and isinstance(v, int | float)}
            for t, m in res["results"].items()}


def test_the_frenzy_model_evaluates_a_checkpoint_without_exporting_it(world, tmp_path):
    """`model=frenzy, uri=file://...` on a checkpoint the trainer wrote (a root: its newest commit; or the step
    directory): the numbers of a Frenzy suite on the same checkpoint, and nothing exported."""
    from tasks.evaluation.runner import EvalOptions, evaluate
    from tasks.evaluation.suite import LmevalSource, Suite
    from tests.trainer_util import run, tiny_job

    uri = f"file://{tmp_path / 'ckpt'}"
    run(tiny_job(uri, steps=10, every=10), tmp_path / "run")
    tasks = ["frz_mc", "frz_gen"]
    by_root = _frenzy_model_scores(world, uri, tasks)
    assert by_root == _frenzy_model_scores(world, f"{uri}/step_00000010", tasks)
    suite = Suite(name="s", lmeval=LmevalSource(tasks=tasks, include=[str(world["tasks"])], limit=5, bootstrap_iters=0))
    res = evaluate(uri, suite, EvalOptions(out_dir=str(tmp_path / "out"), learn_priors=False,
                                           shm_root=str(tmp_path / "shm")))
    assert res.scores == by_root and 0 <= by_root["frz_mc"]["acc,none"] <= 1
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.is_dir()) == ["step_00000010"]


@pytest.mark.slow  # a real S3 endpoint on loopback (moto) and a training run
def test_the_frenzy_model_reads_a_checkpoint_on_s3(world, tmp_path):
    pytest.importorskip("moto.server")
    from tests.trainer_util import run, tiny_job

    local, remote = f"file://{tmp_path / 'ckpt'}", "s3://frenzy/lmeval-run"
    with _loopback_s3():
        run(tiny_job(remote, steps=10, every=10), tmp_path / "run-s3")
        on_s3 = _frenzy_model_scores(world, remote, ["frz_mc", "frz_cont"])
    run(tiny_job(local, steps=10, every=10), tmp_path / "run")  # the same job, trained again (training is deterministic)
    assert on_s3 == _frenzy_model_scores(world, local, ["frz_mc", "frz_cont"])


@contextlib.contextmanager
def _loopback_s3():
    """moto's S3 server on loopback as the environment's S3 endpoint (bucket `frenzy`) while in use."""
    from moto.server import ThreadedMotoServer

    from tests.s3_endpoint import free_port, s3_env

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        with s3_env(port):
            yield
    finally:
        server.stop()


def _suite(world, tmp_path, task_yaml: str, **lmeval) -> object:
    from tasks.evaluation.suite import LmevalSource, Suite

    d = tmp_path / "t"
    d.mkdir(exist_ok=True)
    (d / "x.yaml").write_text(task_yaml)
    return Suite(name="s", lmeval=LmevalSource(tasks=lmeval.pop("tasks", ["x"]), include=[str(d)], **lmeval))


@pytest.mark.parametrize("task_yaml, says", [
    ("task: x\ndataset_path: allenai/ai2_arc\noutput_type: loglikelihood\ntest_split: test\ndoc_to_text: a\n"
     "doc_to_target: b\n", "not local data"),
    ("task: x\ndataset_path: json\ndataset_kwargs: {data_files: {test: /no/such/file.jsonl}}\noutput_type: "
     "loglikelihood\ntest_split: test\ndoc_to_text: a\ndoc_to_target: b\n", "does not exist"),
    ("task: x\ndataset_path: json\ndataset_kwargs: {data_files: {test: https://example.org/x.jsonl}}\noutput_type: "
     "loglikelihood\ntest_split: test\ndoc_to_text: a\ndoc_to_target: b\n", "not a local file"),
    ("task: x\ndataset_path: json\ndataset_kwargs: {data_files: {test: DATA}}\noutput_type: generate_until\n"
     "test_split: test\ndoc_to_text: a\ndoc_to_target: b\ngeneration_kwargs: {do_sample: true, temperature: 0.8}\n",
     "greedily"),
    ("task: x\ndataset_path: json\ndataset_kwargs: {data_files: {test: DATA}}\noutput_type: generate_until\n"
     "test_split: test\ndoc_to_text: a\ndoc_to_target: b\nunsafe_code: true\n", "sandbox"),
    ("task: x\ndataset_path: json\ndataset_kwargs: {data_files: {test: DATA}}\noutput_type: loglikelihood\n"
     "test_split: test\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{question[:0]}}'\n", "document 0 has an empty continuation"),
])
def test_what_cannot_run_is_refused_before_anything_runs(world, tmp_path, task_yaml, says):
    from tasks.evaluation.lmeval.source import expand

    suite = _suite(world, tmp_path, task_yaml.replace("DATA", str(world["tasks"] / "data" / "gen.jsonl")))
    with pytest.raises(FrenzyError, match=says):
        expand(suite)


def test_an_unknown_task_names_the_known_ones(world, tmp_path):
    from tasks.evaluation.lmeval.source import expand
    from tasks.evaluation.suite import LmevalSource, Suite

    with pytest.raises(FrenzyError, match="frz_mc.*lmeval.include"):
        expand(Suite(name="s", lmeval=LmevalSource(tasks=["frz_nope"], include=[str(world["tasks"])])))
    with pytest.raises(FrenzyError, match="frz_mc_b.*name each task once"):  # alone and inside frz_group
        expand(Suite(name="s", lmeval=LmevalSource(tasks=["frz_mc_b", "frz_group"], include=[str(world["tasks"])])))
    globbed = expand(Suite(name="s", lmeval=LmevalSource(tasks=["frz_c*", "frz_p??"], include=[str(world["tasks"])])))
    assert [d.name for d in globbed.datasets] == ["frz_cont", "frz_ppl"]  # patterns match as lm_eval --tasks does
