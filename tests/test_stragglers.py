"""Straggler what-if analysis: schedules, recovery of injected stragglers, trace format, CLI and flow."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pandas as pd
import pytest

from tasks.artifactkey import run_key
from tasks.stragglers.analyze import analyze
from tasks.stragglers.synth import SynthSpec, build_program, execute, generate, step_times
from tasks.stragglers.trace import COLUMNS, OPTYPES, JobMeta, Trace, TraceError, load_trace, write_trace

NO_EXTRAS = dict(noise=0.0, launch_delay_s=0.0, p2p_s=0.0, dp_comm_s=0.0, optimizer_s=0.0, clip_s=0.0,
                 embedding_s=0.0, fwd_s=1.0, bwd_s=2.0)


@pytest.mark.parametrize(("schedule", "P", "M", "V", "expected"), [
    ("1f1b", 4, 8, 1, 33.0), ("gpipe", 4, 8, 1, 33.0), ("1f1b", 2, 5, 1, 18.0), ("1f1b", 8, 32, 1, 117.0),
    ("interleaved", 4, 8, 2, 28.5), ("interleaved", 4, 8, 4, 8 * 3 + 3 * 3 / 4),
])
def test_schedules_have_the_analytic_step_time(schedule, P, M, V, expected):
    # uniform forward 1 and backward 2 per micro-batch, no communication cost: (M + P - 1)(tf + tb) for 1F1B and
    # GPipe, M (tf + tb) + (P - 1)(tf + tb) / V interleaved
    spec = SynthSpec(schedule=schedule, pp=P, microbatches=M, vpp=V, dp=2, steps=1, **NO_EXTRAS)
    prog = build_program(spec)
    start, end = execute(prog, [np.full((1, 2), op.base) for op in prog.ops])
    assert step_times(start, end)[0] == pytest.approx(expected)
    # every micro-batch runs forward and backward once per chunk on every stage
    counts = {}
    for op in prog.ops:
        counts[op.optype] = counts.get(op.optype, 0) + 1
    assert counts["forward-compute"] == counts["backward-compute"] == P * M * V


def test_1f1b_warmup_order_is_megatrons():
    spec = SynthSpec(pp=4, microbatches=8, dp=1, steps=1, **NO_EXTRAS)
    prog = build_program(spec)
    rank0 = [prog.ops[ops[0]] for ins, ops in prog.code[0] if ins == "compute"]
    seq = " ".join(("F" if op.optype == "forward-compute" else "B") + str(op.mb_id) for op in rank0)
    assert seq == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"


def _trace(spec: SynthSpec):
    run = generate(spec)
    return run, Trace(spec.meta, run.columns(), "synthetic")


def test_a_straggler_free_trace_has_no_slowdown():
    spec = SynthSpec(steps=4, noise=0.0, launch_delay_s=0.0)
    _, tr = _trace(spec)
    res, _ = analyze(tr)
    assert res.slowdown == pytest.approx(1.0, abs=1e-6) and res.waste == pytest.approx(0.0, abs=1e-6)
    assert res.sim_error < 1e-6
    assert all(v == pytest.approx(1.0, abs=1e-6) for v in res.by_optype.values())


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved"])
@pytest.mark.parametrize("dp_mode", ["allreduce", "zero"])
def test_an_injected_slow_worker_is_recovered(schedule, dp_mode):
    spec = SynthSpec(schedule=schedule, dp_mode=dp_mode, steps=6, slow_worker={"dp": 1, "stage": 2, "factor": 1.3})
    run, tr = _trace(spec)
    res, _ = analyze(tr)
    assert res.slowdown == pytest.approx(run.truth(), rel=0.03)
    worker_truth = run.truth(ops=lambda op: op.stage == 2, dp=1)
    assert res.workers[2][1] == pytest.approx(worker_truth, rel=0.03)
    assert (res.top_workers[0]["stage"], res.top_workers[0]["dp_rank"]) == (2, 1)
    assert max(res.by_dp_rank, key=res.by_dp_rank.get) == "1" and max(res.by_stage, key=res.by_stage.get) == "2"
    assert res.m_w > 0.8  # the one slow worker explains the slowdown
    assert res.sim_error < 0.02


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
@pytest.mark.parametrize("dp_mode", ["allreduce", "zero"])
def test_the_batched_per_rank_simulation_equals_one_full_simulation_per_rank(schedule, dp_mode, monkeypatch):
    """The linear two-column method (analyze.py's docstring) against the quadratic definition: D ranks, each put
    back in a full D-column timeline, for every op and for each stage's ops; chunked batches included."""
    from tasks.stragglers import analyze as an
    from tasks.stragglers.model import build

    spec = SynthSpec(schedule=schedule, dp_mode=dp_mode, dp=5, pp=2, steps=3, seq_imbalance=0.2,
                     slow_worker={"dp": 3, "stage": 1, "factor": 1.4}, seed=7)
    _, tr = _trace(spec)
    g = build(tr)
    p = an.prepare(g)
    col_dp = g.col_dp()
    for rows in (None, g.stage == 0, g.stage == 1):
        brute = []
        for k in range(g.n_dp):
            d = np.repeat(p.ideal[:, None], g.start.shape[1], axis=1)
            sel = np.ix_(np.arange(g.n) if rows is None else np.flatnonzero(rows), np.flatnonzero(col_dp == k))
            d[sel] = p.dur[sel]
            brute.append(an.step_times(g, *an.simulate(g, d)).mean())
        np.testing.assert_allclose(an.per_rank_put_back(g, p, rows), brute, rtol=1e-12)
        monkeypatch.setattr(an, "_BATCH_CELLS", 1)  # one rank per batch
        np.testing.assert_allclose(an.per_rank_put_back(g, p, rows), brute, rtol=1e-12)
        monkeypatch.undo()
    assert len(set(np.round(brute, 9))) > 1  # the ranks differ: the comparison is not of constants


def test_a_slow_last_stage_is_attributed_to_it_and_explains_m_s():
    spec = SynthSpec(steps=6, pp=4, slow_stage={"stage": 3, "factor": 1.4})
    run, tr = _trace(spec)
    res, _ = analyze(tr)
    assert res.slowdown == pytest.approx(run.truth(), rel=0.03)
    assert res.by_stage["3"] == pytest.approx(run.truth(ops=lambda op: op.stage == 3), rel=0.03)
    assert max(res.by_stage, key=res.by_stage.get) == "3" and res.m_s > 0.8
    # the whole row of the heatmap is hot, not one worker
    assert min(res.workers[3]) > 1.05


def test_sequence_imbalance_spreads_over_dp_ranks():
    spec = SynthSpec(steps=8, dp=8, seq_imbalance=0.15, seed=3)
    run, tr = _trace(spec)
    res, _ = analyze(tr)
    assert res.slowdown == pytest.approx(run.truth(), rel=0.03)
    hot = [k for k, v in res.by_dp_rank.items() if v > 1.03]
    assert len(hot) >= 3  # diffuse, not a single rank
    for k in (0, 5):
        assert res.by_dp_rank[str(k)] == pytest.approx(run.truth(ops=lambda op: True, dp=k), rel=0.03)


def test_a_slow_link_is_attributed_to_pipeline_communication():
    spec = SynthSpec(steps=6, p2p_s=0.002, slow_link={"stage": 1, "factor": 6.0})
    run, tr = _trace(spec)
    res, _ = analyze(tr)
    assert res.slowdown == pytest.approx(run.truth(), rel=0.03)
    pp_comm = max(res.by_optype["forward-pp-comm"], res.by_optype["backward-pp-comm"])
    assert pp_comm > 1.05 and pp_comm > res.by_optype["forward-compute"]
    truth = run.truth(ops=lambda op: op.kind == "p2p")
    assert max(res.by_optype["forward-pp-comm"], res.by_optype["backward-pp-comm"]) <= truth * 1.03


def test_launch_delays_are_measured_apart_from_straggling():
    spec = SynthSpec(steps=4, noise=0.0, launch_delay_s=0.002)
    _, tr = _trace(spec)
    res, _ = analyze(tr)
    assert res.launch_slowdown > 1.05
    assert res.slowdown == pytest.approx(1.0, abs=1e-6)  # CPU gaps are not straggling


def test_trace_round_trip_has_the_format_dtypes_and_finds_its_meta(tmp_path):
    spec = SynthSpec(steps=2, dp=2, pp=2)
    run = generate(spec)
    (tmp_path / "t").mkdir()
    path = write_trace(tmp_path / "t" / "trace.parquet", run.columns(), spec.meta)
    df = pd.read_parquet(path)
    assert list(df.columns) == list(COLUMNS)
    assert df["dp_rank"].dtype == np.int8 and df["rank"].dtype == np.int16 and df["start_ts"].dtype == np.float32
    assert isinstance(df["optype"].dtype, pd.CategoricalDtype)
    tr = load_trace(tmp_path / "t")
    assert tr.meta.dp_size == 2 and tr.meta.pp_size == 2 and tr.meta.world_size == 4
    assert tr.n_ops == len(df)


def test_bad_traces_are_refused_with_the_fix_named(tmp_path):
    spec = SynthSpec(steps=2, dp=2, pp=2)
    cols = generate(spec).columns()
    path = write_trace(tmp_path / "trace.parquet", cols, spec.meta)
    df = pd.read_parquet(path)
    df.drop(columns=["seq_id"]).to_parquet(tmp_path / "nocol.parquet")
    with pytest.raises(TraceError, match="lacks the columns.*seq_id"):
        load_trace(tmp_path / "nocol.parquet")
    bad = df.copy()
    bad["optype"] = bad["optype"].astype(str).replace("forward-compute", "fwd")
    bad.to_parquet(tmp_path / "badop.parquet")
    with pytest.raises(TraceError, match="unknown op types.*fwd"):
        load_trace(tmp_path / "badop.parquet")
    named = {k: v for k, v in cols.items()}
    named["optype"] = np.array([OPTYPES[c] for c in cols["optype"]], dtype=object)
    named["optype"][0] = "fwd-compute"
    with pytest.raises(TraceError, match="unknown op types.*fwd-compute"):
        write_trace(tmp_path / "w.parquet", named, spec.meta)
    alone = tmp_path / "alone"
    alone.mkdir()
    df.to_parquet(alone / "trace.parquet")
    with pytest.raises(TraceError, match="--meta"):
        load_trace(alone / "trace.parquet")


def test_steps_missing_ops_are_dropped_and_reported_and_extra_tp_ranks_ignored():
    spec = SynthSpec(steps=5, dp=2, pp=2)
    run = generate(spec)
    cols = run.columns()
    keep = ~((cols["step"] == 3) & (cols["dp_rank"] == 1) & (cols["optype"] == OPTYPES.index("optimizer")))
    cols = {k: v[keep] for k, v in cols.items()}
    extra = {k: v.copy() for k, v in cols.items()}  # a second TP rank traced by mistake
    extra["rank"] = extra["rank"] + 1
    extra["start_ts"] = extra["start_ts"] + 5.0
    both = {k: np.concatenate([cols[k], extra[k]]) for k in cols}
    res, _ = analyze(Trace(spec.meta, both, "x"))
    assert res.dropped_steps == [3] and res.steps == 4
    assert res.sim_error < 0.02  # the shifted copy of the other TP rank was not mixed in


def test_trainer_traces_are_in_the_format(tmp_path):
    from tasks.training.optrace import OpTracer, merge_traces

    for rank in (0, 1):
        tr = OpTracer(rank, rank, every=1)
        for step in (1, 2):
            tr.begin_step(step)
            tr.record("forward-compute", tr._t0, tr._t0 + 0.01, mb_id=0)
            tr.record("backward-compute", tr._t0 + 0.01, tr._t0 + 0.03, mb_id=0)
            tr.record("separate-grads-all-reduce", tr._t0 + 0.02, tr._t0 + 0.025 + 0.001 * rank)
            tr.record("optimizer", tr._t0 + 0.03, tr._t0 + 0.035)
        tr.write(tmp_path)
    path = merge_traces(tmp_path, "job", dp=2, tp=1, world=2)
    df = pd.read_parquet(path)
    assert df["dp_rank"].dtype == np.int8 and df["seq_id"].dtype == np.int32
    res, prep = analyze(load_trace(path))
    assert res.dp_size == 2 and res.ops == 16
    # the gradient all-reduce overlaps the backward pass: anchored half-way through it, not after it
    g = prep.graph
    ar = int(np.flatnonzero(g.optype == OPTYPES.index("separate-grads-all-reduce"))[0])
    assert g.anchor[ar] >= 0 and g.frac[ar] == pytest.approx(0.5, abs=0.01)


def test_a_step_run_again_after_a_resume_is_traced_once(tmp_path):
    """A resumed (or rolled back) run re-runs a step number it had traced: its rows replace the earlier ones (before:
    `TraceError: step 141 of DP rank 0 has duplicate rows`, and no straggler section in the report)."""
    from tasks.training.optrace import OpTracer, merge_traces

    tr = OpTracer(0, 0, every=1)
    for step in (1, 2, 2, 3):  # step 2 runs twice
        tr.begin_step(step)
        tr.record("forward-compute", tr._t0, tr._t0 + 0.01, mb_id=0)
        tr.record("backward-compute", tr._t0 + 0.01, tr._t0 + 0.03, mb_id=0)
        tr.record("optimizer", tr._t0 + 0.03, tr._t0 + 0.035)
    tr.write(tmp_path)
    df = pd.read_parquet(merge_traces(tmp_path, "job", dp=1, tp=1, world=1))
    assert df.groupby("step").size().to_dict() == {1: 3, 2: 3, 3: 3}
    res, _ = analyze(load_trace(tmp_path / "trace.parquet"))
    assert res.steps == 3


def test_cli_generate_then_analyze_json_heatmap_timeline(tmp_path, capsys):
    from cli.main import main

    trace = tmp_path / "gen" / "trace.parquet"
    trace.parent.mkdir()
    assert main(["stragglers", "generate", str(trace), "--schedule", "interleaved", "--slow-worker", "2,1,1.5",
                 "--steps", "4", "--json"]) == 0
    gen = json.loads(capsys.readouterr().out)
    assert gen["true_slowdown"] > 1.1
    hm, tl = tmp_path / "hm.png", tmp_path / "tl.json.gz"
    assert main(["stragglers", "analyze", str(trace), "--json", "--heatmap", str(hm), "--timeline", str(tl),
                 "--timeline-steps", "2", "--timeline-dp-ranks", "0,2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in ("slowdown", "launch_slowdown", "waste", "by_optype", "by_stage", "by_dp_rank", "m_w", "m_s",
                "per_step", "sim_error"):
        assert key in doc
    assert doc["slowdown"] == pytest.approx(gen["true_slowdown"], rel=0.03)
    assert set(doc["by_stage"]) == {"0", "1", "2", "3"} and len(doc["per_step"]) == 4
    assert hm.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.load(gzip.open(tl, "rt"))["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {"original - DP rank 0", "original - DP rank 2", "ideal - DP rank 0", "ideal - DP rank 2"}
    ops = [e for e in events if e["ph"] == "X"]
    assert ops and all(e["dur"] >= 0 for e in ops)
    assert {e["args"]["step"] for e in ops} == {0, 1}


def test_cli_analyze_reports_a_missing_trace(tmp_path, capsys):
    from cli.main import main

    assert main(["stragglers", "analyze", str(tmp_path / "none.parquet")]) == 2
    assert "no trace at" in capsys.readouterr().err


def test_stragglers_flow_writes_report_and_artifacts(prefect_server, tmp_path):
    from prefect.artifacts import Artifact

    from flows.stragglers import StragglerRequest, stragglers_flow

    spec = SynthSpec(steps=3, slow_stage={"stage": 1, "factor": 1.3})
    write_trace(tmp_path / "trace.parquet", generate(spec).columns(), JobMeta(run_id="flowtest", dp_size=4, pp_size=4))
    rep = stragglers_flow(StragglerRequest(trace=str(tmp_path / "trace.parquet")))
    assert rep.worst_stage == "1" and rep.slowdown > 1.05
    assert json.loads(open(rep.report).read())["slowdown"] == pytest.approx(rep.slowdown)
    assert rep.heatmap and rep.timeline
    art = Artifact.get(run_key("stragglers", "flowtest", str(tmp_path / "trace.parquet")))
    assert art is not None and "Straggler what-if analysis" in str(art.data)


def test_the_artifacts_own_file_layout_is_read_as_it_is(tmp_path):
    """Files written the way the what-if paper's artifact writes them: meta with `run_id: 0` (an int), optype a
    pandas categorical whose category list (in another order) includes `first-op`, which no row uses, narrow
    integer columns and float32 timestamps. The analysis must equal that of the same ops in our own format."""
    run = generate(SynthSpec(dp=2, pp=2, microbatches=4, steps=4, slow_worker={"dp": 1, "stage": 1, "factor": 1.3}))
    cols = run.columns()
    (tmp_path / "ours").mkdir()
    ours = write_trace(tmp_path / "ours" / "trace.parquet", cols, JobMeta(dp_size=2, pp_size=2, run_id="x"))
    cats = ["first-op", *reversed(OPTYPES)]
    frame = {name: np.asarray(cols[name]).astype(dt) for name, dt in COLUMNS.items() if dt is not None}
    frame["optype"] = pd.Categorical([OPTYPES[i] for i in cols["optype"]], categories=cats)
    art = tmp_path / "artifact"
    art.mkdir()
    pd.DataFrame(frame).to_parquet(art / "trace.parquet", index=False)
    (art / "meta.yaml").write_text("trial_name: job-0\nrun_id: 0\ndp_size: 2\npp_size: 2\ntp_size: 1\n"
                                   "dsp_size: 1\nvpp_size: 1\nworld_size: 4\n")
    tr = load_trace(art)
    assert tr.meta.run_id == "0" and tr.meta.trial_name == "job-0"
    a, _ = analyze(tr)
    b, _ = analyze(load_trace(ours))
    assert a.slowdown == pytest.approx(b.slowdown, rel=1e-9) and a.slowdown > 1.05
    assert a.by_optype == pytest.approx(b.by_optype, rel=1e-9)
    # a value outside the known op types is still refused, by name
    frame["optype"] = pd.Categorical(["mystery-op"] + [OPTYPES[i] for i in cols["optype"][1:]],
                                     categories=[*cats, "mystery-op"])
    pd.DataFrame(frame).to_parquet(art / "trace.parquet", index=False)
    with pytest.raises(TraceError, match=r"unknown op types \['mystery-op'\]"):
        load_trace(art)


def _someone_waits_on(path) -> bool:
    """A blocked flock request on `path`'s inode (a `->` line of /proc/locks)."""
    ino = os.stat(path).st_ino
    return any("->" in line and line.split()[-3].endswith(f":{ino}") for line in open("/proc/locks"))


def test_a_second_analysis_of_one_run_waits_for_the_heatmap_and_gets_it(tmp_path):
    """Red team 41c S3: two analyses of one run raced on trace/stragglers/heatmap.png and the loser failed."""
    import threading
    import time

    from tasks.outdir import held
    from tasks.stragglers.report import heatmap

    write_trace(tmp_path / "trace.parquet", generate(SynthSpec(steps=2)).columns(), JobMeta(run_id="race", dp_size=4,
                                                                                          pp_size=4))
    res, _ = analyze(load_trace(str(tmp_path / "trace.parquet")))
    dest = tmp_path / "stragglers" / "heatmap.png"
    errors: list[BaseException] = []
    with held(dest, "stragglers analyze --heatmap"):  # the first analysis is writing it
        with pytest.raises(Exception, match="is writing"):  # a path a person typed: refused at once, naming the writer
            heatmap(res, dest)
        second = threading.Thread(target=lambda: errors.extend(_run(lambda: heatmap(res, dest, wait=True))))
        second.start()
        deadline = time.monotonic() + 60
        while not _someone_waits_on(tmp_path / "stragglers" / ".heatmap.png.lock"):
            assert second.is_alive() and time.monotonic() < deadline, errors
    second.join(60)
    assert not second.is_alive() and errors == []
    assert dest.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _run(fn) -> list[BaseException]:
    try:
        fn()
    except BaseException as err:  # noqa: BLE001 - handed to the test thread
        return [err]
    return []
