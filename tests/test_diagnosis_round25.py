"""Issue 45, round 25: the families set 23 showed (benchmarks/results/diagnosis_round25.md).

A. A bare `raise` with no exception being handled (Python 3's `RuntimeError: No active exception to reraise`,
   Python 2's `TypeError: exceptions must be old-style classes or derived from BaseException, not NoneType`): the
   script's error path re-raised nothing; the error it logged just above the traceback is the root line.
B. A library's check of what the caller's code returned or gave it, raised as a class no rule knows (gymnasium's
   passive checker on `Env.step`): the caller's code against the library's API, the script's (as the corpus labels
   an API called with arguments it no longer takes), though the raising frame is the library's.

Each case is a short synthetic log written here (none is a log of set 23).
"""

from __future__ import annotations

import pytest

from tests.diagnosis_kit import assert_case

HEAD = "epoch 1 | step 200 | loss 2.41 | lr 1e-4\nepoch 1 | step 210 | loss 2.39 | lr 1e-4\n"

_SITE = "/opt/conda/lib/python3.10/site-packages"

# (what the case shows, the log after HEAD, type, category, a piece of the root line, restartable)
CASES = [
    (
        "Python 3's bare re-raise names the error logged above its traceback",
        "2024-03-02 11:20:41,118 ERROR feature_prep: unknown feature type 'mfcc40' in the acoustic config\n"
        'Traceback (most recent call last):\n  File "/home/u/tts/run.py", line 212, in <module>\n    main(cfg)\n'
        '  File "/home/u/tts/prep.py", line 97, in extract\n    raise\n'
        "RuntimeError: No active exception to reraise\n",
        "BareReraise",
        "script",
        "ERROR feature_prep: unknown feature type 'mfcc40'",
        False,
    ),
    (
        "Python 2's words for the same, under a bracketed level",
        "[CRITICAL] vocoder 'straight' is not installed\n\n"
        'Traceback (most recent call last):\n  File "synth.py", line 40, in <module>\n    raise\n'
        "TypeError: exceptions must be old-style classes or derived from BaseException, not NoneType\n",
        "BareReraise",
        "script",
        "[CRITICAL] vocoder 'straight' is not installed",
        False,
    ),
    (
        "a library's check of what the caller's env returned is the caller's code",
        'Traceback (most recent call last):\n  File "/home/u/rl/train_ppo.py", line 88, in rollout\n'
        "    obs, reward, done = env.step(action)\n"
        f'  File "{_SITE}/gymnasium/wrappers/common.py", line 393, in step\n'
        "    return env_step_passive_checker(self.env, action)\n"
        f'  File "{_SITE}/gymnasium/utils/passive_env_checker.py", line 223, in env_step_passive_checker\n'
        "    raise error.Error(\n"
        "gymnasium.error.Error: Expected `Env.step` to return a four or five element tuple, actual number of "
        "elements returned: 6.\n",
        "UncaughtException",
        "script",
        "gymnasium.error.Error: Expected `Env.step`",
        False,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_failure_named_and_line_chosen(case: tuple[str, str, str, str, str, bool]) -> None:
    assert_case(HEAD, case)


def test_a_bare_reraise_with_nothing_logged_above_keeps_its_line() -> None:
    """Guard: where no error-level line precedes the traceback, the bare raise's own line is the answer."""
    assert_case(
        HEAD,
        (
            "no logged error: the bare raise's line",
            'Traceback (most recent call last):\n  File "/home/u/tts/prep.py", line 97, in extract\n    raise\n'
            "RuntimeError: No active exception to reraise\n",
            "BareReraise",
            "script",
            "RuntimeError: No active exception to reraise",
            False,
        ),
    )


def test_a_library_exception_without_a_check_of_its_caller_stays_the_frameworks() -> None:
    """Guard: a class no rule knows, raised in a library's frame with a message that checks nothing the caller
    gave, keeps the framework's category."""
    assert_case(
        HEAD,
        (
            "a library's own failure",
            'Traceback (most recent call last):\n  File "/home/u/proj/train.py", line 51, in <module>\n'
            "    loss = compiled(batch)\n"
            f'  File "{_SITE}/torch/_dynamo/exc.py", line 221, in unimplemented\n    raise Unsupported(msg)\n'
            "torch._dynamo.exc.Unsupported: call_function BuiltinVariable(open) [ConstantVariable()] {}\n",
            "UncaughtException",
            "framework",
            "torch._dynamo.exc.Unsupported: call_function",
            False,
        ),
    )
