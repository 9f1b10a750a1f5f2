"""Issue 45, round 19: the families set 16 showed (benchmarks/results/diagnosis_round19.md).

A. The store-based barrier timing out with `worker_count` != `world_size`: the launch, not the network.
B. A download that never reached its server (urllib's `<urlopen error ...>`, a connect failure raised in an HTTP
   client's frame, urllib3's `NameResolutionError`, Windows' `getaddrinfo failed`): the machine's network access,
   the script's, not restartable; a collective's or the store's connect keeps the infrastructure's rule.
C. The cause before a generic crash: a native framework's fatal check on a CUDA allocation before `Aborted (core
   dumped)`; c10d's error-level line after its warning-level one (the error names the line, the warning the cause).
D. Failures named in words no rule read: mpirun's rank `exited on signal 9 (Killed)`, pinned host memory
   (`cudaHostAlloc failed ... out of memory`).
E. `No rendezvous handler for ://`: an empty init method.

Each case is a short synthetic log written here.
"""

from __future__ import annotations

import pytest

from tasks.diagnosis.diagnose import diagnose
from tests.diagnosis_kit import assert_diagnosed

SITE = "/opt/conda/envs/tr/lib/python3.10/site-packages"
HEAD = "rank 0: building the model\nloading data from /data/shards\n"


def _tb(frames: list[tuple[str, str, str]], exc: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, func, code in frames:
        lines += [f'  File "{path}", line 88, in {func}', f"    {code}"]
    return HEAD + "\n".join(lines) + "\n" + exc + "\n"


@pytest.mark.parametrize("line", [
    # more workers joined than the world: a stale rendezvous file or a second job on the store
    "RuntimeError: Timed out initializing process group in store based barrier on rank: 1, for key: "
    "store_based_barrier_key:1 (world_size=8, worker_count=16, timeout=0:30:00)",
    # fewer: ranks the launcher never started
    "Timed out initializing process group in store based barrier on rank: 0, for key: store_based_barrier_key:2 "
    "(world_size=3, worker_count=1, timeout=0:10:00)",
])
def test_a_barrier_whose_worker_count_is_not_the_world_size_is_the_launch(line: str) -> None:
    d = assert_diagnosed(HEAD + line + "\n", "RendezvousError", "script", "store based barrier")
    assert d.restartable is False


@pytest.mark.parametrize("text,root", [
    (HEAD + "urllib.error.URLError: <urlopen error [Errno 111] Connection refused>\n", "<urlopen error"),
    (HEAD + "urllib.error.URLError: <urlopen error timed out>\n", "<urlopen error"),
    # a connect failure raised in the HTTP client's frame (the log cut before the client's own summary)
    (_tb([("train.py", "main", "model = build(cfg)"),
          (f"{SITE}/urllib3/util/connection.py", "create_connection", "sock.connect(sa)")],
         "OSError: [Errno 101] Network is unreachable"), "Network is unreachable"),
    (_tb([("/work/proj/models/backbone.py", "load_weights", "state = fetch(url)"),
          ("/usr/lib/python3.10/socket.py", "create_connection", "sock.connect(sa)")],
         "TimeoutError: [Errno 110] Connection timed out"), "Connection timed out"),
    (_tb([("/work/proj/models/backbone.py", "__init__", "self.enc = Enc.from_pretrained(name)"),
          (f"{SITE}/torch/hub.py", "download_url_to_file", "u = urlopen(req)")],
         "ConnectionRefusedError: [Errno 111] Connection refused"), "Connection refused"),
    (HEAD + "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', port=443): Max retries "
     "exceeded with url: /bert-base-uncased/resolve/main/config.json (Caused by NameResolutionError(\"<urllib3."
     "connection.HTTPSConnection object at 0x7f00>: Failed to resolve 'huggingface.co' ([Errno -3] Temporary failure "
     "in name resolution)\"))\n", "Max retries exceeded"),
])
def test_a_download_that_never_reached_its_server_is_the_machines_network_access(text: str, root: str) -> None:
    d = assert_diagnosed(text, "ServiceUnreachable", "script", root)
    assert d.restartable is False


def test_windows_getaddrinfo_failure_is_a_name_that_does_not_resolve() -> None:
    log = _tb([("scripts/train.py", "setup_dist", "hostname = socket.gethostbyname(socket.getfqdn())")],
              "socket.gaierror: [Errno 11001] getaddrinfo failed")
    assert_diagnosed(log, "NameResolutionError", "script", "getaddrinfo failed")


@pytest.mark.parametrize("text,type_", [
    # a connect failure in a frame of the user's own code (a peer, not a download): the network rule keeps it
    (_tb([("/work/proj/dist.py", "join_peers", "s.connect((peer, port))")],
         "OSError: [Errno 113] No route to host"), "NetworkError"),
    # WSATRY_AGAIN is the resolver's transient failure: not read as an unknown name
    (HEAD + "socket.gaierror: [Errno 11002] getaddrinfo failed\n", "Unknown"),
])
def test_other_connect_failures_keep_their_reading(text: str, type_: str) -> None:
    assert diagnose(text.encode(), use_fallback=False).type == type_


def test_a_fatal_cuda_allocation_check_outranks_the_abort_after_it() -> None:
    log = (HEAD + "terminate called after throwing an instance of 'dmlc::Error'\n"
           "  what():  [10:01:02] src/storage/./pooled_storage_manager.h:157: Check failed: e == cudaSuccess "
           "CUDA: out of memory\n\nStack trace:\n  [bt] (0) libmxnet.so(+0x3e1f)\n\nAborted (core dumped)\n")
    d = assert_diagnosed(log, "OutOfMemoryError", "framework", "Check failed: e == cudaSuccess CUDA: out of memory")
    assert d.restartable is True


def test_caffe_style_cuda_check_out_of_memory() -> None:
    log = HEAD + "F0412 10:11:12.1 42 syncedmem.cpp:56] Check failed: error == cudaSuccess (2 vs. 0)  out of memory\n"
    assert_diagnosed(log, "OutOfMemoryError", "framework", "out of memory")


def test_c10d_error_after_its_warning_names_the_line_and_the_warning_the_cause() -> None:
    warn = ("[W socket.cpp:601] [c10d] The IPv6 network addresses of (trainer-7.lab, 29500) cannot be retrieved "
            "(gai error: -5 - No address associated with hostname).")
    err = "[E socket.cpp:860] [c10d] The client socket has timed out after 900s while trying to connect to " \
          "(trainer-7.lab, 29500)."
    d = assert_diagnosed(HEAD + (warn + "\n") * 3 + err + "\n", "NameResolutionError", "script", err)
    assert d.restartable is False and any(warn in e.line for e in d.evidence)


def test_c10d_error_of_the_warnings_own_type_leaves_the_warning_the_root() -> None:
    warn = ("[W socket.cpp:401] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address "
            "already in use).")
    log = HEAD + warn + "\n[E socket.cpp:435] [c10d] The server socket has failed to listen on any local network " \
                        "address.\n"
    assert_diagnosed(log, "AddressInUse", "script", "errno: 98")


def test_an_error_line_of_another_source_file_does_not_move_the_root() -> None:
    warn = ("[W socket.cpp:601] [c10d] The IPv6 network addresses of (trainer-7.lab, 29500) cannot be retrieved "
            "(gai error: -5 - No address associated with hostname).")
    log = HEAD + warn + "\n[E ProcessGroupGloo.cpp:138] Gloo connectFullMesh failed with a timeout\n"
    assert_diagnosed(log, "NameResolutionError", "script", "IPv6 network addresses")


def test_mpirun_rank_killed_by_signal_9_is_a_kill() -> None:
    log = (HEAD + "-" * 60 + "\nPrimary job  terminated normally, but 1 process returned\na non-zero exit code.\n"
           + "-" * 60 + "\nmpirun noticed that process rank 3 with PID 0 on node gpu-12 exited on signal 9 (Killed).\n")
    d = assert_diagnosed(log, "Killed", "framework", "exited on signal 9")
    assert d.restartable is True


def test_pinned_host_memory_that_cannot_be_allocated_is_host_memory() -> None:
    log = (HEAD + "[ERROR] PIPE(77,7f01,python):2024-01-02 [pipeline/buffer.cc:90] Init] cudaHostAlloc failed, "
           "ret[2], out of memory\n[ERROR] PIPE(77,7f01,python): task stopped: Memory malloc failed.\n")
    d = assert_diagnosed(log, "HostOOM", "framework", "cudaHostAlloc failed")
    assert d.restartable is False


@pytest.mark.parametrize("scheme", ["://", "tpc://"])
def test_an_init_method_without_a_known_scheme_is_the_configuration(scheme: str) -> None:
    log = _tb([(f"{SITE}/torch/distributed/rendezvous.py", "rendezvous",
                'raise RuntimeError("No rendezvous handler for {}://".format(result.scheme))')],
              f"RuntimeError: No rendezvous handler for {scheme}")
    d = assert_diagnosed(log, "ConfigError", "script", "No rendezvous handler")
    assert d.restartable is False
