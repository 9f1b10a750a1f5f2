"""lm-eval tasks through Frenzy's evaluation against `lm_eval` with its Hugging Face backend: the same numbers,
end-to-end time on the same machine and threads, and where the time goes.

Workload (written here, offline, tests/lmeval_kit.py): six task types as lm-eval YAMLs over local JSONL, `--docs`
documents each (multiple choice with acc/acc_norm, rolling perplexity, generation with a regex filter, a 3-shot task
inside a group, a multi-token continuation). Model: a randomly initialised Llama-shaped Frenzy model (`--layers`,
`--hidden`, BPE vocabulary `--vocab`, context 512) exported to a Hugging Face directory with `export_hf`.

Runs, each a fresh process timed from start to exit (`--threads` CPU threads in all):
- `lm_eval --model hf` on the directory, batch size 16, torch using `--threads` threads;
- `lm_eval --model frenzy` on the same directory (lm-eval's process and scheduling, Frenzy's request engine);
- `frenzy evaluate` on the same directory with a suite naming the same tasks: a precursor copies the model into shared
  memory, `--threads` inference slots of one thread each run the planned trials, metric jobs run as predictions land
  (fresh priors: the first run of this model).
The numbers must agree: every task and group metric equal (log-likelihood-derived ones within 1e-4 relative).
`--profile` also runs lm_eval under cProfile in-process and reports its phases.

    python benchmarks/lmeval.py            # writes benchmarks/results/lmeval.{json,md}
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import lmeval_kit as kit  # noqa: E402

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _run(cmd: list[str], env: dict, cwd: Path) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return dt


def _metrics(doc: dict) -> dict[str, dict[str, float]]:
    return {t: {k: float(v) for k, v in m.items() if "," in k and isinstance(v, int | float)} for t, m in doc.items()}


def lm_eval_run(model: str, model_args: str, tasks_dir: Path, out: Path, threads: int, env: dict) -> tuple[float, dict]:
    cmd = [str(Path(sys.executable).parent / "lm_eval"), "--model", model, "--model_args", model_args, "--device", "cpu",
           "--tasks", ",".join(kit.TASKS), "--include_path", str(tasks_dir), "--batch_size", "16",
           "--output_path", str(out)]
    if model == "frenzy":  # lm-eval 0.4.13 reads no entry points: the plugin's .pth, in a site dir of its own
        site = out.parent / f"site-{out.name}"
        subprocess.run([sys.executable, "-m", "tasks.evaluation.lmeval.plugin", "install", "--site-dir", str(site)],
                       check=True, cwd=ROOT, capture_output=True)
        code = ("import site, sys; site.addsitedir(sys.argv[1]); from lm_eval.__main__ import cli_evaluate; "
                "sys.argv = ['lm_eval'] + sys.argv[2:]; cli_evaluate()")
        cmd = [sys.executable, "-c", code, str(site)] + cmd[1:]
    dt = _run(cmd, {**env, "OMP_NUM_THREADS": str(threads)}, ROOT)
    doc = json.loads(next(out.rglob("results_*.json")).read_text())
    return dt, _metrics(doc["results"])


def frenzy_run(hf_dir: Path, tasks_dir: Path, work: Path, threads: int, env: dict, r: int = 0) -> tuple[float, dict, dict]:
    suite = work / "suite.yaml"
    suite.write_text(f"name: lmeval-bench\nmodel_load_s: {{remote: 3.0, shm: 2.0, remote_streams_per_node: 1}}\n"
                     f"cpu_workers_per_node: {threads}\nlmeval:\n  include: [{tasks_dir}]\n  tasks: {kit.TASKS}\n")
    out = work / f"frenzy-{r}"
    cmd = [sys.executable, "-m", "cli", "evaluate", str(hf_dir), "--suite", str(suite), "--gpus-per-node", str(threads),
           "--threads", "1", "--cpu-workers-per-node", str(threads), "--out-dir", str(out), "--history-dir",
           str(work / f"history-{r}"), "--json"]
    dt = _run(cmd, {**env, "FRENZY_EVAL_PRIORS": str(work / f"priors-{r}.json")}, ROOT)  # fresh priors each round
    res = json.loads((out / "result.json").read_text())
    return dt, res["scores"], res


def agree(ref: dict, got: dict) -> tuple[bool, float]:
    """Same metric names; discrete metrics equal, log-likelihood-derived ones within 1e-4 relative (the largest
    relative difference is returned)."""
    worst, ok = 0.0, set(ref) == set(got)
    for t, m in ref.items():
        ok = ok and set(m) == set(got.get(t, {}))
        for k, v in m.items():
            w = got.get(t, {}).get(k, math.nan)
            if "perplexity" in k or "bits_per_byte" in k:
                rel = abs(v - w) / abs(v) if v else abs(w)
                worst = max(worst, rel)
                ok = ok and rel < 1e-4
            else:
                ok = ok and v == w
    return ok, worst


def profile_lm_eval(hf_dir: Path, tasks_dir: Path, threads: int) -> list[dict]:
    """lm_eval's phases (cumulative seconds under cProfile, in-process, the CLI's default task index)."""
    import torch

    torch.set_num_threads(threads)
    prof = cProfile.Profile()
    prof.enable()
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    simple_evaluate(model="hf", model_args=f"pretrained={hf_dir},dtype=float32", device="cpu", tasks=kit.TASKS,
                    batch_size=16, task_manager=TaskManager(include_path=str(tasks_dir)))
    prof.disable()
    stats = pstats.Stats(prof)
    phases = {"TaskManager.__init__ (task index)": "__init__ manager.py", "HFLM.__init__ (model load)": "__init__ huggingface.py",
              "build_all_requests": "build_all_requests", "loglikelihood (incl. multiple choice)": "loglikelihood huggingface.py",
              "loglikelihood_rolling": "loglikelihood_rolling", "generate_until": "generate_until huggingface.py",
              "metrics and aggregation (_process_results)": "_process_results"}
    rows = []
    for label, key in phases.items():
        name, _, file = key.partition(" ")
        cum = max((v[3] for (f, _, fn), v in stats.stats.items() if fn == name and f.endswith(file or f)), default=0.0)
        rows.append({"phase": label, "seconds": cum})
    rows.append({"phase": "total (simple_evaluate, imports included)", "seconds": stats.total_tt})
    return rows


def engine_breakdown(hf_dir: Path, work: Path, threads: int) -> list[dict]:
    """Each request type of the workload (the requests Frenzy built, which are lm-eval's) answered in-process by
    lm-eval's HFLM (batch 16) and by Frenzy's Harness, same threads: seconds of each, and whether the answers agree
    (log-likelihoods within 1e-4 relative, the same greedy flags and texts)."""
    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from tasks.evaluation.engine import LM, load_remote
    from tasks.evaluation.lmeval.requests import Harness

    torch.set_num_threads(threads)
    reqs: dict[str, list] = {"loglikelihood": [], "loglikelihood_rolling": [], "generate_until": []}
    for f in sorted((work / "cache" / "lmeval").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            for kind, args, _, _ in json.loads(line)["requests"]:
                reqs[kind].append(tuple(args) if kind != "generate_until" else (args[0], dict(args[1])))
    hf = HFLM(pretrained=str(hf_dir), device="cpu", dtype="float32", batch_size=16)
    fz = Harness(LM(*load_remote(str(hf_dir))))
    ours = {"loglikelihood": fz.loglikelihood, "loglikelihood_rolling": lambda r: fz.loglikelihood_rolling([a[0] for a in r]),
            "generate_until": fz.generate_until}
    rows = []
    for kind, rs in reqs.items():
        t0 = time.perf_counter()
        ref = getattr(hf, kind)([Instance(request_type=kind, doc={}, arguments=a, idx=0) for a in rs], disable_tqdm=True)
        t_hf = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = ours[kind](rs)
        t_fz = time.perf_counter() - t0
        if kind == "generate_until":
            same = ref == got
        else:
            a = [x[0] if isinstance(x, tuple) else x for x in ref]
            b = [x[0] if isinstance(x, tuple) else x for x in got]
            same = all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a, b, strict=True)) and (
                kind != "loglikelihood" or [x[1] for x in ref] == [y[1] for y in got])
        rows.append({"requests": kind, "count": len(rs), "hf_s": t_hf, "frenzy_s": t_fz, "speedup": t_hf / t_fz,
                     "same": same})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=200, help="documents per task (default 200)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="CPU threads for each run (default: cores)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--profile", action="store_true", help="also profile lm_eval's phases in-process")
    ap.add_argument("--work", help="working directory (default: a temporary one)")
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds of the three runs; medians reported")
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="lmeval-bench-"))
    env = {**os.environ, **OFFLINE, "FRENZY_CACHE": str(work / "cache"), "HF_HOME": str(work / "hf-home"),
           "PYTHONPATH": str(ROOT)}
    os.environ.update({k: env[k] for k in ("FRENZY_CACHE", "HF_HOME", *OFFLINE)})
    tasks_dir = kit.write_tasks(work, n=a.docs)
    shape = {**kit.LLAMA, "layers": a.layers, "hidden": a.hidden, "heads": max(1, a.hidden // 64),
             "kv_heads": max(1, a.hidden // 128)}
    hf_dir = kit.export_model(work, shape, seq_len=512, vocab=a.vocab)
    times: dict[str, list[float]] = {"hf": [], "frenzy_model": [], "frenzy": []}
    for r in range(a.rounds):  # alternating, so that a busy minute of the shared machine hits every run alike
        t_hf, m_hf = lm_eval_run("hf", f"pretrained={hf_dir},dtype=float32", tasks_dir, work / f"lm-eval-hf-{r}",
                                 a.threads, env)
        t_fl, m_fl = lm_eval_run("frenzy", f"uri={hf_dir}", tasks_dir, work / f"lm-eval-frenzy-{r}", a.threads, env)
        t_fz, m_fz, res = frenzy_run(hf_dir, tasks_dir, work, a.threads, env, r)
        for k, t in zip(times, (t_hf, t_fl, t_fz), strict=True):
            times[k].append(t)
        print(f"round {r}: lm_eval hf {t_hf:.1f}s, lm_eval frenzy {t_fl:.1f}s, frenzy evaluate {t_fz:.1f}s",
              file=sys.stderr, flush=True)
    t_hf, t_fl, t_fz = (statistics.median(times[k]) for k in times)
    ok_fz, worst_fz = agree(m_hf, {k: v for k, v in m_fz.items() if k in m_hf})
    ok_fl, worst_fl = agree(m_hf, m_fl)
    doc = {"date": datetime.now(UTC).date().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
           "command": "python benchmarks/lmeval.py " + " ".join(sys.argv[1:]), "threads": a.threads, "docs": a.docs,
           "model": {**shape, "vocab": a.vocab, "seq_len": 512,
                     "parameters": _params(hf_dir)}, "versions": _versions(),
           "lm_eval_hf_s": t_hf, "lm_eval_frenzy_s": t_fl, "frenzy_evaluate_s": t_fz, "rounds": times,
           "speedup": t_hf / t_fz, "speedup_engine_only": t_hf / t_fl, "same_numbers": ok_fz and ok_fl,
           "worst_relative_difference": max(worst_fz, worst_fl), "metrics_hf": m_hf, "metrics_frenzy": m_fz,
           "frenzy_phases": _frenzy_phases(res), "requests": _request_counts(work)}
    doc["engine"] = engine_breakdown(hf_dir, work, a.threads)
    doc["same_numbers"] = doc["same_numbers"] and all(r["same"] for r in doc["engine"])
    if a.profile:
        doc["lm_eval_profile"] = profile_lm_eval(hf_dir, tasks_dir, a.threads)
    out = ROOT / "benchmarks" / "results"
    (out / "lmeval.json").write_text(json.dumps(doc, indent=1))
    (out / "lmeval.md").write_text(report(doc))
    print(report(doc))
    return 0 if doc["same_numbers"] else 1


def _params(hf_dir: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(hf_dir / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118 - safe_open has no iterator


def _versions() -> dict:
    from importlib.metadata import version

    return {p: version(p) for p in ("lm_eval", "transformers", "torch", "datasets", "tokenizers")}


def _frenzy_phases(res: dict) -> dict:
    trials = res["trials"]
    chunks = [c for t in trials for c in t["chunks"]]
    return {"precursor_s": res["precursor_s"], "trials": len(trials), "trial_load_s": [round(t["load_s"], 2) for t in trials],
            "infer_s": sum(c["infer_s"] for c in chunks), "metric_s": sum(c["metric_s"] for c in chunks),
            "makespan_s": res["makespan_s"], "predicted_makespan_s": res["predicted_makespan_s"]}


def _request_counts(work: Path) -> dict:
    counts: dict[str, int] = {}
    for f in (work / "cache" / "lmeval").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            for r in json.loads(line)["requests"]:
                counts[r[0]] = counts.get(r[0], 0) + 1
    return counts


def _fmt(xs: list[float]) -> str:
    return ", ".join(f"{x:.1f}" for x in xs)


def report(doc: dict) -> str:
    m = doc["model"]
    lines = [f"# lm-eval tasks: Frenzy against lm_eval's HF backend ({doc['date']}, {doc['machine']})", "",
             f"`{doc['command']}`; {doc['threads']} threads for each run; versions: "
             + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()), "",
             f"Six task types (tests/lmeval_kit.py), {doc['docs']} documents each; requests: "
             + ", ".join(f"{v} {k}" for k, v in sorted(doc["requests"].items()))
             + f". Model: Llama-shaped, {m['layers']} layers, hidden {m['hidden']}, vocab {m['vocab']}, context 512, "
             f"{m['parameters'] / 1e6:.1f}M parameters, random weights, exported with export_hf.", "",
             "| run | end to end | speedup vs lm_eval hf |", "|---|---|---|",
             f"| `lm_eval --model hf` (batch 16) | {doc['lm_eval_hf_s']:.1f} s | 1.00x |",
             f"| `lm_eval --model frenzy` (lm-eval's process, Frenzy's engine) | {doc['lm_eval_frenzy_s']:.1f} s | "
             f"{doc['speedup_engine_only']:.2f}x |",
             f"| `frenzy evaluate` (suite with the same tasks; target >= 2x) | {doc['frenzy_evaluate_s']:.1f} s | "
             f"**{doc['speedup']:.2f}x** |", "",
             f"Medians of {len(doc['rounds']['hf'])} alternating round(s); per round (s): lm_eval hf "
             f"{_fmt(doc['rounds']['hf'])}, lm_eval frenzy {_fmt(doc['rounds']['frenzy_model'])}, frenzy evaluate "
             f"{_fmt(doc['rounds']['frenzy'])}.", "",
             f"Same numbers: **{doc['same_numbers']}** (every task and group metric; largest relative difference of a "
             f"log-likelihood-derived metric {doc['worst_relative_difference']:.1e}).", "",
             "Frenzy's run: " + json.dumps(doc["frenzy_phases"]), "",
             "The request engine alone, in-process, the same requests (lm-eval's `HFLM` batch 16 against Frenzy's "
             "`Harness`):", "", "| requests | count | lm-eval HF s | Frenzy s | speedup | same answers |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['requests']} | {r['count']} | {r['hf_s']:.1f} | {r['frenzy_s']:.1f} | {r['speedup']:.2f}x | "
              f"{r['same']} |" for r in doc["engine"]]
    if "lm_eval_profile" in doc:
        lines += ["", "lm_eval's phases (cProfile, in-process):", "", "| phase | seconds |", "|---|---|"]
        lines += [f"| {r['phase']} | {r['seconds']:.1f} |" for r in doc["lm_eval_profile"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
