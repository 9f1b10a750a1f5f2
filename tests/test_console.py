"""What `frenzy submit` / `frenzy demo` print on the terminal (issue 30, points 4 and 7): the cause, in one
paragraph, with the tracebacks left to the logs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import yaml

from cli.console import OneLineFormatter, interrupted_message
from tests.trainer_util import copy_trained


def test_an_infeasible_job_is_refused_with_marps_message_alone(tmp_path):
    """Before: MARP's message came after about 60 lines of Prefect traceback."""
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"name": "huge", "model": {"preset": "llama3-70b"},
                                                       "training": {"global_batch": 8}}))
    env = {**os.environ, "FRENZY_HOME": str(tmp_path / "home")}
    from cluster.ledger import Ledger

    Ledger(str(tmp_path / "l.db"))  # `submit --ledger` takes an existing ledger (a mistyped path is refused)
    p = subprocess.run([sys.executable, "-m", "cli", "submit", "job.yaml", "--ledger", str(tmp_path / "l.db")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("frenzy submit: error: ") and "GiB per GPU" in lines[0], p.stderr


def test_console_records_lose_their_traceback_but_other_handlers_keep_it():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "task failed", None, sys.exc_info())
    line = OneLineFormatter(logging.Formatter("%(levelname)s %(message)s")).format(rec)
    assert line == "ERROR task failed (traceback in the flow run's logs)"
    assert "Traceback" in logging.Formatter().format(rec)  # the API log handler still sends it


def test_the_interrupt_line_names_the_newest_committed_step(tmp_path, tiny_trained):
    root = f"file://{tmp_path}/ckpt"
    assert interrupted_message("demo", root) == ("frenzy demo: stopped before the first checkpoint was committed; "
                                                 "rerun the same command to resume")
    copy_trained(tiny_trained, tmp_path)  # tiny_job(root, steps=20, every=10), trained in tmp_path / "run"
    assert interrupted_message("submit", root) == (f"frenzy submit: stopped at step 20, committed under {root}; "
                                                   "rerun the same command to resume")


def test_a_module_colon_name_in_a_log_line_is_printed_verbatim_not_as_an_emoji():
    """Red team 41g S03: the submit warning for a suite dataset `badplug:factory` read `plugin badplug🏭 ...`: Prefect's
    console handler prints through rich, which turns `:factory:` into an emoji. A process started as `frenzy` and a
    flow run start (a worker, a notebook) see the same: the handlers Prefect configured, then `verbatim_console`."""
    code = ("import logging, flows, prefect.main\n"
            "logging.getLogger('prefect.frenzy-test').warning('before: badplug:factory: no module here')\n"
            "from flows.logs import verbatim_console\n"
            "verbatim_console()\n"
            "logging.getLogger('prefect.frenzy-test').warning('after: badplug:factory: no module here')\n")
    env = {**os.environ, "PREFECT_LOGGING_LEVEL": "INFO", "PYTHONIOENCODING": "utf-8"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       encoding="utf-8")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-2000:]
    before = next(line for line in out.splitlines() if "before: " in line)
    after = next(line for line in out.splitlines() if "after: " in line)
    assert "\N{FACTORY}" in before  # the control: Prefect's handler as configured does replace it
    assert "after: badplug:factory: no module here" in after and "\N{FACTORY}" not in after


def test_a_stop_after_training_ended_says_only_the_wait_for_evaluations_was_cut(tmp_path, tiny_trained):
    """Red team 41g S12: SIGTERM while submit only waited for the evaluation runs (training done, GPUs back) said
    "stopped at step 10 ...; rerun the same command to resume", as if training had been cut. The run's ledger record
    says how far it got: after the release, the line says what was cut and how the rest gets scored."""
    from cluster.ledger import Ledger, RunRecord

    root, ledger = f"file://{tmp_path}/ckpt", str(tmp_path / "l.db")
    copy_trained(tiny_trained, tmp_path)  # tiny_job(root, steps=20, every=10), trained in tmp_path / "run"
    led = Ledger(ledger)
    rec = RunRecord(job="tiny", stage="training", checkpoint_root=root, run_dir=str(tmp_path / "run"),
                    history_dir=str(tmp_path / "evals"))
    led.record_run(rec)  # the control: stopped while it trained, the line is the resume line
    assert interrupted_message("submit", root, ledger=ledger, job="tiny") == (
        f"frenzy submit: stopped at step 20, committed under {root}; rerun the same command to resume")
    for stage in ("released", "evaluated"):
        led.record_run(rec.model_copy(update={"stage": stage}))
        line = interrupted_message("submit", root, ledger=ledger, job="tiny")
        assert line.startswith(f"frenzy submit: training had finished (step 20, committed under {root}; its GPUs were "
                               "released); only the wait for the evaluations and the report was cut"), line
        assert "`evaluate-pending`" in line and "resume" not in line and "rerun the same command" in line
    assert interrupted_message("submit", root, ledger=str(tmp_path / "none.db"), job="tiny").startswith(
        "frenzy submit: stopped at step 20")  # no ledger there: the storage's line, and no ledger made
    assert not (tmp_path / "none.db").exists()


def _summaries(steps: list[int], datasets: int) -> list:
    from tasks.evaluation.record import EvalSummary

    return [EvalSummary(uri=f"file:///c/step_{s:08d}", run="j", step=s, suite="big",
                        scores={f"qa-set-{d:02d}": {"acc": 0.5 + d / 100 + s / 1000} for d in range(datasets)},
                        makespan_s=1, predicted_makespan_s=1, result="r.json", history_plot=None) for s in steps]


def test_the_scores_table_of_many_datasets_turns_to_one_row_per_score_and_fits_a_terminal():
    """Red team 41g S09: a suite of 40 datasets printed a 41-column "scores by checkpoint" table ~750 characters wide."""
    from cli.submit import TABLE_WIDTH, scores_table

    few = scores_table(_summaries([10, 20], datasets=2), "/r/report.html")  # the control: one row per checkpoint
    assert few.splitlines()[0].split() == ["step", "qa-set-00", "acc", "qa-set-01", "acc"] and len(few.splitlines()) == 4
    many = scores_table(_summaries([10, 20], datasets=40), "/r/report.html")
    lines = many.splitlines()
    assert max(map(len, lines)) <= TABLE_WIDTH and lines[0].split() == ["dataset", "metric", "step", "10", "step", "20"]
    assert len(lines) == 2 + 40 and lines[2].split() == ["qa-set-00", "acc", "0.51", "0.52"]
    long = scores_table(_summaries(list(range(100, 3100, 100)), datasets=40), "/r/report.html")  # 30 checkpoints
    lines = long.splitlines()
    assert max(map(len, lines)) <= TABLE_WIDTH and "step 3000" in lines[0] and "step 100 " not in lines[0] + " "
    assert lines[-1].startswith("(the newest ") and lines[-1].endswith("of 30 checkpoints; the report has every one: "
                                                                      "/r/report.html)")


def test_a_stop_while_in_flow_evaluations_run_after_training_says_training_had_finished(tmp_path, tiny_trained):
    """A SIGTERM 2 s after training ended, while the in-flow evaluations of the last checkpoints ran, printed
    "stopped at step 60 ...; rerun the same command to resume": in-flow, the run's record stays `training` until they
    are done. What happened decides the line: the trainer finished here and the ledger released its allocation."""
    from cluster.has import GpuRequest
    from cluster.inventory import Cluster, Node
    from cluster.ledger import Ledger, RunRecord
    from tasks.pipeline.stopped import trainer_ended

    root, ledger = f"file://{tmp_path}/ckpt", str(tmp_path / "l.db")
    copy_trained(tiny_trained, tmp_path)
    led = Ledger(ledger)
    led.sync(Cluster(name="t", nodes=[Node(name="n0", gpu="A100-40GB-PCIE", count=2)]))
    led.record_run(RunRecord(job="tiny", stage="training", checkpoint_root=root, run_dir=str(tmp_path / "run"),
                             history_dir=str(tmp_path / "evals")))
    a = led.allocate("tiny", [GpuRequest(1, 10)], lease_s=600)
    resume = f"frenzy submit: stopped at step 20, committed under {root}; rerun the same command to resume"
    try:
        trainer_ended("tiny", a.id)  # the control: on cuda in-flow the GPUs stay held while it evaluates on them
        assert interrupted_message("submit", root, ledger=ledger, job="tiny") == resume
        led.release(a.id, by_holder=True)
        line = interrupted_message("submit", root, ledger=ledger, job="tiny")
        assert line.startswith(f"frenzy submit: training had finished (step 20, committed under {root}; its GPUs were "
                               "released); only the wait for the evaluations and the report was cut"), line
        trainer_ended("tiny", None)  # a new attempt trains: its stop is the resume line again
        assert interrupted_message("submit", root, ledger=ledger, job="tiny") == resume
    finally:
        trainer_ended("tiny", None)


_API_LOG_REFUSED = """
import sys
from flows.logs import verbatim_console
from prefect.logging.handlers import APILogWorker
if sys.argv[1] == "frenzy":
    verbatim_console()  # what every flow of Frenzy does as it starts
APILogWorker.instance().send({"name": "prefect.flow_runs", "level": 20, "message": "a line", "flow_run_id": None,
                              "task_run_id": None, "timestamp": "2026-11-27T18:00:00+00:00", "__payload_size__": 100})
APILogWorker.drain_all(timeout=60)
sys.stderr.write("frenzy's next line\\n")
"""


@pytest.mark.parametrize("who", ["prefect", "frenzy"])
def test_prefects_error_logging_to_api_ends_its_line_before_frenzys_next_line(who):
    """Red team 41r: during a server outage Prefect's "Error logging to API" text ran into submit's next log line
    (Prefect writes the error without a newline). A real Prefect API log worker against a loopback port that refuses
    connections (bound, not listening): with Prefect's own handler the next line is glued on (the control), with
    Frenzy's it starts a line of its own."""
    import socket

    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    try:
        env = {**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{port.getsockname()[1]}/api",
               "PREFECT_CLIENT_MAX_RETRIES": "0"}
        p = subprocess.run([sys.executable, "-c", _API_LOG_REFUSED, who], env=env, capture_output=True, text=True,
                           timeout=120)
    finally:
        port.close()
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stderr.splitlines()
    assert "--- Error logging to API ---" in p.stderr, p.stderr[-3000:]
    if who == "prefect":  # the control: the remark as the red team saw it
        assert "frenzy's next line" not in lines, p.stderr[-3000:]
        return
    assert lines[-1] == "frenzy's next line", p.stderr[-3000:]
    said = next(line for line in lines if "Error logging to API" in line)
    assert "1 log line(s) not sent to the Prefect API (ConnectError: " in said and said.endswith(
        "the run's logs on the server lack them"), said


def test_an_interrupt_that_escapes_submit_says_planning_only_before_the_run_said_where_it_was(monkeypatch, capsys):
    """A Ctrl-C or SIGTERM that reaches the CLI's boundary (cli/output.py) before `run_submit` started the run (reading
    the job, the imports) was planning; one after the run said where it was (while its result is printed) is no stop
    of the run, and is not called planning."""
    import signal

    import tasks.pipeline.stopped as stopped
    from cli.output import Signalled, finish

    monkeypatch.setattr(stopped, "_phase", {})
    assert finish("submit", Signalled(signal.SIGTERM)) == 143
    assert capsys.readouterr().err.strip() == ("frenzy submit: stopped while planning, before it asked for GPUs: "
                                               "nothing was queued or trained; rerun the same command to start it")
    stopped.reached("job", "training")
    assert finish("submit", KeyboardInterrupt()) == 130
    assert capsys.readouterr().err.strip() == "frenzy submit: interrupted"
    assert finish("plan", KeyboardInterrupt()) == 130 and capsys.readouterr().err.strip() == "frenzy plan: interrupted"
