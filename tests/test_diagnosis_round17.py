"""Issue 45, round 17: two shapes set 15 showed (benchmarks/results/diagnosis_round17.md).

1. The shell's report of a signal (`Killed`, `Segmentation fault (core dumped)`, `Bus error`) written over a
   progress bar's last draw: glued to the bar's leftover characters where the log was copied from a terminal
   (`Killedh 3 | batch 812 / 4000`), or after the last carriage return where the log kept them. It reads as the
   report alone; a program's prose that starts with the word (`Killed 3 stale workers`) and a bare `Aborted` or
   `Terminated` (no cause the rules read) do not.
2. A traceback cut before its exception line (an excerpt, a log a crash cut short): where no line names a failure
   and the log ends in the traceback's frames, its last frame's code line, with the category its frame gives (the
   user's file: script; site-packages: framework), the type a `raise` names where the rules know it, and a lower
   confidence. Never where a later line holds the failure.

Each case is a short synthetic log written here.
"""

from __future__ import annotations

import pytest

from tasks.diagnosis.diagnose import TRUNCATED_CONFIDENCE, diagnose
from tests.diagnosis_kit import assert_diagnosed

SITE = "/opt/conda/lib/python3.9/site-packages"
HEAD = "loading shards 4/4\nbuilding model\nstarting epoch 3\n"

OVERDRAWN = {
    # a terminal copy: the report overwrote the bar's first characters, the rest of the draw stayed
    "killed-glued-letter": (HEAD + "Killedh 3 | batch 812 / 4000 | loss 0.412\n", "Killed", "framework"),
    "killed-glued-digit": (HEAD + "Killed3/4000 [01:12<05:31, 9.8it/s, loss=0.41]\n", "Killed", "framework"),
    "killed-glued-bar": (HEAD + "Killed|####      | 1288/4000 [02:01<04:15]\n", "Killed", "framework"),
    "segfault-glued": (HEAD + "Segmentation fault (core dumped)ch 3 step 77 of 900\n", "SegFault", "script"),
    "bus-error-glued": (HEAD + "Bus error (core dumped)tep 77 of 900 eta 0:12\n", "SharedMemoryError", "script"),
    # the log kept the carriage returns: the text after the last one is what was written last
    "killed-after-cr": (HEAD + "step 10/900 loss 0.52\rstep 11/900 loss 0.51\rstep 12/900 loss 0.50\rKilled\n",
                        "Killed", "framework"),
    "segfault-after-cr": (HEAD + "  3%|#   | 30/900\r  4%|#   | 36/900\rSegmentation fault (core dumped)\n",
                          "SegFault", "script"),
}


@pytest.mark.parametrize("name", sorted(OVERDRAWN))
def test_signal_report_written_over_a_progress_line(name: str) -> None:
    text, type_, category = OVERDRAWN[name]
    assert_diagnosed(text, type_, category)


def test_a_carriage_return_line_reads_as_its_last_draw() -> None:
    d = assert_diagnosed(OVERDRAWN["killed-after-cr"][0], "Killed", "framework")
    assert d.root_cause_line == "Killed"


@pytest.mark.parametrize("text", [
    "supervisor: Killed 3 stale workers after the timeout\n",  # a program's prose: a space after the word
    "Killed: the queue drained, exiting\n",
    "Abortedsweep 4/10 | trial 17\n",  # bare Aborted names no cause the rules read, glued or not
    "Terminatedch 3 | batch 812 / 4000\n",  # a bare Terminated is unknown on its own line too
])
def test_prose_and_words_without_a_cause_stay_unknown(text: str) -> None:
    d = diagnose((HEAD + text).encode(), use_fallback=False)
    assert d.type == "Unknown", d.root_cause_line


def _traceback(frames: list[tuple[str, str]], after: str = "") -> str:
    lines = ["Traceback (most recent call last):"]
    for where, code in frames:
        lines += [f'  File "{where}", line 41, in step', f"    {code}"]
    return "config ok\nbuilding loaders\n" + "\n".join(lines) + "\n" + after


def test_truncated_traceback_in_the_users_file_is_the_script_with_the_raised_type() -> None:
    log = _traceback([("/home/kim/proj/train.py", "main(cfg)"),
                      ("/home/kim/proj/utils/options.py", "raise ValueError(f'unknown optimizer {name}')")])
    d = assert_diagnosed(log, "ValueError", "script", "raise ValueError(f'unknown optimizer {name}')")
    assert (d.via, d.confidence, d.restartable) == ("truncated", TRUNCATED_CONFIDENCE, False)


def test_truncated_traceback_in_a_library_is_the_frameworks() -> None:
    log = _traceback([("/home/kim/proj/train.py", "trainer.fit(model)"),
                      (f"{SITE}/lightning/trainer/connectors/data.py", "raise ShardUnavailable(path)")])
    d = assert_diagnosed(log, "TruncatedTraceback", "framework", "raise ShardUnavailable(path)")
    assert d.confidence == TRUNCATED_CONFIDENCE


def test_truncated_traceback_takes_a_known_type_and_the_frames_category() -> None:
    log = _traceback([("/home/kim/proj/train.py", "trainer.fit(model)"),
                      (f"{SITE}/lightning/trainer/connectors/data.py", "raise MisconfigurationException(msg)")])
    assert_diagnosed(log, "ConfigError", "framework", "raise MisconfigurationException(msg)")


def test_truncated_traceback_inside_a_quote_that_closes_after_it() -> None:
    log = "```\n" + _traceback([("train.py", "raise KeyError(key)")]) + "```\n"
    assert_diagnosed(log, "KeyError", "script", "raise KeyError(key)")


@pytest.mark.parametrize("after", [
    "KeyError: 'lr_decay'\n",  # the exception line is there: the rules read it as before
    "Killed\n",  # a later line holds the failure
])
def test_a_later_failure_line_is_the_answer_not_the_frame(after: str) -> None:
    log = _traceback([("/home/kim/proj/train.py", "raise KeyError(key)")], after)
    d = diagnose(log.encode(), use_fallback=False)
    assert d.via != "truncated" and d.confidence is None
    assert d.root_cause_line == after.strip()


def test_a_traceback_the_log_goes_on_after_is_not_read_as_truncated() -> None:
    log = _traceback([("/home/kim/proj/train.py", "raise KeyError(key)")],
                     "".join(f"retrying shard {i}\n" for i in range(6)))
    assert diagnose(log.encode(), use_fallback=False).type == "Unknown"


def test_truncated_traceback_whose_last_line_raises_nothing() -> None:
    log = _traceback([("/home/kim/proj/train.py", "main(cfg)"), ("/home/kim/proj/data.py", "batch = table[key]")])
    d = assert_diagnosed(log, "TruncatedTraceback", "script", "batch = table[key]")
    assert d.restartable is False


def test_the_command_says_a_truncated_traceback_is_read_with_lower_confidence(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    log = tmp_path / "train.log"
    log.write_text(_traceback([("/home/kim/proj/train.py", "raise KeyError(key)")]))
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "cli", "diagnose", str(log)], capture_output=True, text=True,
                         cwd=root, check=False)
    assert "KeyError" in out.stdout and "lower confidence" in out.stdout, out.stdout + out.stderr
