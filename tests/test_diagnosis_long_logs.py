"""Long logs (issue 45, round 11): the line that ended the run, not the first error-looking line.

Each case is a short synthetic log of one shape the red team's whole log files showed (set 10): an exception header
that announces its cause further down, a side error raised while handling the exception that ended the run, copies
of one error garbled by interleaved ranks, a start-up error or warning the run went on training after, and several
runs appended to one file. Written here in the formats the software prints them; the guards beside them keep the
conventions the earlier sets hold (the earliest copy of an error where nothing is garbled, a raise chain that ends
in another exception, a hardware fault before other ranks' progress lines).
"""

from __future__ import annotations

from tasks.diagnosis.compress import compress, head_of
from tasks.diagnosis.diagnose import diagnose

SITE = "/opt/conda/lib/python3.9/site-packages"


def _frames(n: int, prefix: str = "") -> str:
    return "".join(f'{prefix}  File "{SITE}/lib/mod{k}.py", line {10 + k}, in f{k}\n{prefix}    return g{k}(x)\n'
                   for k in range(n))


def _progress(steps: range, prefix: str = "") -> str:
    return "".join(f"{prefix}step {s} | loss: {2.5 - s / 1000:.4f} | lr 0.0001\n" for s in steps)


def test_header_yields_to_the_exception_that_states_its_cause() -> None:
    log = ("Epoch 1/10\nTraceback (most recent call last):\n" + _frames(6)
           + "ValueError: in user code:\n\n"
           + "".join(f"    {SITE}/keras/engine/training.py:{800 + k} train_function  *\n"
                     f"        return step_function(self, iterator)\n" for k in range(12))
           + "    ValueError: Input 0 of layer max_pooling2d is incompatible with the layer: expected ndim=4, "
             "found ndim=5.\n")
    d = diagnose(log.encode())
    assert d.root_cause_line is not None and "expected ndim=4, found ndim=5" in d.root_cause_line
    assert d.via == "chain"
    assert any("in user code" in e.line for e in d.evidence)


def test_a_side_error_in_the_handler_yields_to_the_exception_that_started_and_ended_the_chain() -> None:
    sig = "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4706 got signal: 1\n"
    during = "\nDuring handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n"
    log = ("Sending process 4714 closing signal SIGTERM\nTraceback (most recent call last):\n" + _frames(2) + sig
           + during + '  File "/usr/lib/python3.8/logging/__init__.py", line 1697, in isEnabledFor\n'
           + "    return self._cache[level]\nKeyError: 30\n" + during + _frames(4) + sig)
    d = diagnose(log.encode())
    assert d.type == "Hangup" and d.category == "script" and not d.restartable
    assert d.root_cause_line == sig.strip() and d.line_no == log.count("\n")


def test_a_handled_chain_that_ends_in_another_exception_keeps_the_rules_order() -> None:
    """Guard: where the chain ends in a different exception (a KeyError caught to raise a clearer error), nothing
    yields to the last one: the rules' priorities decide, as before."""
    log = ("Traceback (most recent call last):\n" + _frames(1) + "KeyError: 'labels'\n\nDuring handling of the above "
           "exception, another exception occurred:\n\nTraceback (most recent call last):\n" + _frames(2)
           + "ValueError: the batch has no labels\n")
    d = diagnose(log.encode())
    assert d.root_cause_line == "KeyError: 'labels'"


_NCCL = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, invalid usage, "
         "NCCL version 2.10.3")
_USAGE = "ncclInvalidUsage: This usually reflects invalid usage of NCCL library (such as too many async ops)."


def test_the_clean_copy_of_an_error_beats_copies_garbled_by_interleaved_ranks() -> None:
    log = (_frames(2) + "RuntimeError\n\nRuntimeError: RuntimeErrorRuntimeError: RuntimeError" + _NCCL + "\n"
           + _USAGE + "    : : " + _NCCL + "\n" + _USAGE + "\n" + _NCCL + "\n" + _USAGE + "\n\n\n"
           + "RuntimeError: " + _NCCL + "\n" + _USAGE + "\n"
           + "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 13069)\n")
    d = diagnose(log.encode())
    assert d.type == "ConfigError"
    assert d.root_cause_line == "RuntimeError: " + _NCCL


def test_without_garbling_the_earliest_copy_of_an_error_stands() -> None:
    """Guard: a logged copy of an error above the raised exception (torch's THCudaCheck line, TensorFlow's `W`
    allocator line) stays the root line where nothing is garbled: the earlier sets label it so."""
    check = "THCudaCheck FAIL file=/pytorch/THCStorage.cu line=58 error=59 : device-side assert triggered"
    log = (check + "\nTraceback (most recent call last):\n" + _frames(3)
           + "RuntimeError: cuda runtime error (59) : device-side assert triggered at /pytorch/THCStorage.cu:58\n")
    assert diagnose(log.encode()).root_cause_line == check


def test_a_start_up_error_the_run_carried_on_after_yields_to_the_failure() -> None:
    log = ("0: slurmstepd: error: couldn't chdir to `/workspace': No such file or directory: going to /tmp instead\n"
           + "0: INFO | Running with a single process. Device cuda.\n" + _progress(range(0, 50, 10), "0: ")
           + "0: Traceback (most recent call last):\n" + _frames(3, "0: ")
           + "0: AssertionError: SharedMemory objects are None.\n"
           + "srun: error: nid005059: task 0: Exited with exit code 1\n")
    d = diagnose(log.encode())
    assert d.root_cause_line == "0: AssertionError: SharedMemory objects are None."
    assert any("couldn't chdir" in e.line for e in d.evidence)


def test_a_warning_the_run_trained_after_yields_to_the_failure() -> None:
    log = ("2024-03-01 10:00:01 WARNING could not write the cache /data/cache.pt: [Errno 13] Permission denied\n"
           + _progress(range(0, 30, 10)) + "Traceback (most recent call last):\n" + _frames(2)
           + "TypeError: forward() got an unexpected keyword argument 'labels'\n")
    d = diagnose(log.encode())
    assert d.root_cause_line == "TypeError: forward() got an unexpected keyword argument 'labels'"


def test_an_error_line_before_other_ranks_progress_stays_the_root() -> None:
    """Guard: only a warning or a line that says it carried on yields to progress after it: a rank's CUDA error
    while the other ranks print a few more steps is still what ended the run."""
    cuda = "[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered"
    log = (cuda + "\n" + _progress(range(0, 30, 10), "[rank0]: ")
           + "[rank0]: [E ProcessGroupNCCL.cpp:475] Watchdog caught collective operation timeout: "
             "WorkNCCL(SeqNum=88, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600005 milliseconds before timing out.\n")
    assert diagnose(log.encode()).root_cause_line == cuda


_HEAD = "Loaded module: python3/3.8.11"


def _run(error: str) -> str:
    return (_HEAD + "\nLoaded module: cuda/11.3\nTraceback (most recent call last):\n"
            '  File "main.py", line 219, in <module>\n    preds, labels = test()\n' + _frames(1) + error + "\n")


def test_the_last_of_several_appended_runs_ended_the_log() -> None:
    log = (_run("ImportError: IProgress not found. Please update jupyter and ipywidgets.")
           + _run("RuntimeError: Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be "
                  "the same") + _run("NameError: name 'labels_oneh' is not defined"))
    d = diagnose(log.encode())
    assert d.root_cause_line == "NameError: name 'labels_oneh' is not defined"
    assert compress(log.encode()).restarts == (9, 17)


def test_a_first_line_printed_again_without_a_run_ending_before_it_is_no_restart() -> None:
    """Guard: a second node's copy of the banner after a warning (no uncaught exception before it) starts no run."""
    log = (_HEAD + "\n[W socket.cpp:601] [c10d] The client socket has failed to connect: Connection refused\n"
           + _HEAD + "\n" + "Traceback (most recent call last):\n" + _frames(1)
           + "torch.distributed.DistNetworkError: Connection reset by peer\n")
    d = diagnose(log.encode())
    assert d.root_cause_line is not None and "Connection refused" in d.root_cause_line


def test_head_of_takes_a_plain_first_line_only() -> None:
    assert head_of(b"\n  \nLoaded module: cuda/11.3\nmore\n") == b"Loaded module: cuda/00.0"
    assert head_of(b"Traceback (most recent call last):\nx\n") == b""  # an error line starts no run
    assert head_of(b'  File "train.py", line 3, in <module>\n') == b""  # a pasted traceback's frame
    assert head_of(b"***\n") == b""


def test_a_first_line_that_recurs_like_a_progress_line_starts_no_runs() -> None:
    """More than MAX_RESTARTS copies of the first line in a chunk: a regular line, not runs (digits count as 0)."""
    log = "".join(f"Epoch {k:03d}: training\nloss: 1.{k:03d}\n" for k in range(100))
    log += "Traceback (most recent call last):\n" + _frames(1) + "KeyError: 'x'\n" + "Epoch 100: training\n"
    assert compress(log.encode()).restarts == ()
    assert compress(log.encode()[: log.index("Epoch 010")]).restarts == tuple(range(3, 21, 2))


_INFO_LINES = (
    "INFO:2025-11-01 01:06:35,616:jax._src.xla_bridge:925: Unable to initialize backend 'tpu': INTERNAL: Failed to "
    "open libtpu.so: libtpu.so: cannot open shared object file: No such file or directory\n",
    "01:06:35.616 [I] Unable to initialize backend 'tpu': libtpu.so: cannot open shared object file: No such file\n",
    "2025-11-01 01:06:35,616 - INFO - ImportError: No module named 'apex', using the native kernels\n",
    "I1101 01:06:35.616000 140 loader.cc:42] could not open libcudnn_adv.so: cannot open shared object file\n",
)


def test_a_line_logged_at_info_level_yields_to_the_exception_that_ended_the_run() -> None:
    for info in _INFO_LINES:
        log = (info + "".join(f"setup line {k}: config loaded\n" for k in range(40))
               + "Traceback (most recent call last):\n" + _frames(5)
               + "jaxlib.xla_extension.XlaRuntimeError: UNIMPLEMENTED: StreamBeginCaptureToGraph is not implemented "
                 "for CUDA below version 12.3.\n")
        d = diagnose(log.encode())
        assert d.root_cause_line is not None and "XlaRuntimeError" in d.root_cause_line, info


def test_an_info_line_with_no_exception_after_it_still_stands() -> None:
    log = _INFO_LINES[0] + "".join(f"setup line {k}: config loaded\n" for k in range(40)) + "Killed\n"
    d = diagnose(log.encode())
    assert d.root_cause_line is not None and "libtpu.so" in d.root_cause_line
