"""The ordered rule base: which error line means which failure, and how much it outranks the others.

Each rule is a regular expression over one log line (searched, case-sensitive unless the pattern says otherwise),
the failure type it names (Acme's Table 3), its category, and a `priority`: the root cause of a failed job is the
matching line of highest priority, the earliest among equals. Hardware and node faults outrank what they cause
(a CUDA error on one rank makes the other ranks' NCCL collectives time out; a dead node makes its peers lose their
connections), specific framework and script errors outrank generic ones, and pure symptoms (NCCL watchdog
timeouts, torchrun's ChildFailedError, a bare exit code) rank lowest. Rules are tried in order; the first that
matches a line names it, except that a generic exception class (`blame`: RuntimeError, ValueError, KeyError, ...)
names a line only where no rule that reads the message does: `RuntimeError: NCCL communicator was aborted ...` is
a network fault, not a RuntimeError. Where a line holds a chain (`... Original reason for failure was: X`), the
innermost part is read first (tasks/diagnosis/chains.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

Category = Literal["infrastructure", "framework", "script"]


@dataclass(frozen=True)
class Rule:
    type: str
    category: Category
    pattern: str
    priority: int
    restartable: bool
    mitigation: str
    blame: bool = False
    """A generic exception class alone (KeyError, ValueError, ...): tried after every other rule. Its category is
    the rule's: the script's for the exceptions a callee raises about what it was given (ValueError, KeyError,
    TypeError, ...: code written for another version of a library, a config, data), even from a library's frame;
    a runtime's own exceptions (RuntimeError, AssertionError: a library's invariant) are the framework's, unless
    raised from the script's own file."""
    regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern))


_PY = r"(?:^|[\s:\]>])(?:[\w.]+\.)?"  # an exception name, optionally module-qualified, at a token start
_SHELL = r"^\W{0,3}(?:(?:zsh|bash|sh): |\[\d+\]\s*[+-]?\s+(?:\d+\s+)?|\d+\s+)?(?:[\w./-]+: line \d+: +\d+ )?"
"""Where a shell's report of a signal starts: bash's `./run.sh: line 3: 4711 `, zsh's `zsh: `, a job report's
`[1]+  ` (bash) or `[1]    14957 ` (zsh: the job and its pid), or the pid alone where a copy dropped the job."""
_COMMAND = r"(?:\s*\(core dumped\))?(?:\s{2,}\S.*|(?<=\)) \S.*)?\W{0,3}$"
"""The rest of a shell's signal report: `(core dumped)`, then the command the job ran (zsh and bash's job reports
pad the report to a column, so two spaces or more, or one after `(core dumped)`), and nothing else."""
_UNUSED = ("DDP: some parameters take no part in the loss (the model code, or options that freeze part of it): "
           "pass find_unused_parameters=True or make every parameter used; a restart fails the same way")
_ASSERT = ("a device-side assert: usually an index out of range in the data (a label at or past the number of "
           "classes, a class id not zero-based): check the labels against the model's class count; a restart fails the "
           "same way")
_ARCH = ("the environment: the installed build has no kernels for this GPU (its compute capability); install a build "
         "for this GPU architecture, or run on GPUs it supports")

_STOP = r"(?:terminat(?:e|es|ed|ing)|end(?:s|ed|ing)?|stop(?:s|ped|ping)?|abort(?:s|ed|ing)?|halt(?:s|ed|ing)?)\s+" \
        r"(?:the\s+)?training\b"
"""A run's words for ending its training (`Terminate training`, `stopping training`)."""
_NO_CONNECT = ("the job's processes never connected: the launch's network settings (MASTER_ADDR and port reachable "
               "from every node, NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME naming the interface the nodes share, the "
               "hostfile's addresses, a firewall); a restart fails the same way until they are fixed")
_TIME_LIMIT = "the scheduler's time limit ended the job: resume from the newest checkpoint (or ask for more time)"
_FULL = "the disk or quota is full: free space (old checkpoints) or point the output elsewhere, then resume"
_FETCH = ("the run could not reach the server it downloads from (weights, a config, a dataset: a model hub, a release "
          "URL): the connection was never opened, so this machine's network access is the cause (no internet on a "
          "compute node, a proxy or firewall, DNS); set the proxy (HTTPS_PROXY), use a mirror (HF_ENDPOINT), or fetch "
          "the files beforehand and point the run at them; a restart from the same machine fails the same way")
# Round 19 (issue 45): failures named in words the rules below did not read, each a mechanism, not a log's string.
_SETUP_AND_RESOURCE: list[Rule] = [
    # init_process_group's store-based barrier counts the workers that joined (`worker_count`) against the size it
    # was told (`world_size`). Where they differ the launch is wrong, whichever way: more joined than the world
    # holds (a file:// rendezvous file left by an earlier run, two jobs on one store or port) or fewer (ranks not
    # started: a `gpus=4` script run as one process). The store answered, so the network is not the cause.
    Rule("RendezvousError", "script",
         r"store based barrier[^\n]*\(world_size=(\d+), worker_count=(?!\1\b)\d+\b", 35, False,
         "the processes that joined the store differ from the world size it was given: the launch (more joined: a "
         "file:// init file left by an earlier run, or two jobs sharing one store address and port; fewer: ranks the "
         "launcher never started, a --nproc_per_node / world size that does not match the processes run). Delete the "
         "stale init file or give each job its own port, and start every rank with the launcher; a restart waits "
         "the same way"),
    # init_process_group's URL has no scheme it knows: an empty `--dist_url` / init_method gives `://`
    Rule("ConfigError", "script", r"No rendezvous handler for \S*://", 64, False,
         "the process group's init method names no rendezvous scheme torch knows (an empty --dist_url / init_method "
         "gives `://`): pass env:// (with MASTER_ADDR and MASTER_PORT set, as torchrun does), tcp://HOST:PORT or "
         "file:///PATH; a restart fails the same way"),
    # urllib's URLError prints its reason as `<urlopen error REASON>` only where no response came (a connect that
    # failed, a name that did not resolve, a proxy): a download that never reached its server
    Rule("ServiceUnreachable", "script", r"<urlopen error |Max retries exceeded[^\n]*Caused by NameResolutionError\b",
         53, False, _FETCH),
    # Windows' resolver words a name it does not know `getaddrinfo failed` (WSAHOST_NOT_FOUND 11001, WSANO_DATA
    # 11004); 11002 (WSATRY_AGAIN) is the resolver's transient failure and is left out
    Rule("NameResolutionError", "script", r"(?<!\[Errno 11002\] )getaddrinfo failed", 53, False,
         "a host name the run resolves is unknown to the resolver (the machine's own name, resolved for a distributed "
         "set-up, MASTER_ADDR, a URL's host): fix the name, add it to the hosts file or DNS, or give an address; a "
         "restart fails the same way"),
    # a native framework's fatal check on a CUDA allocation (MXNet's mshadow, Caffe): GPU memory, as torch's OOM
    Rule("OutOfMemoryError", "framework", r"Check failed: \w+ == cudaSuccess\b[^\n]*\bout of memory|\bCUDA: out of memory",
         80, True,
         "a native framework's check on a CUDA allocation failed: the GPU ran out of memory (the abort that follows is "
         "its consequence); restart with more memory per GPU or a smaller batch"),
    # page-locked host memory (a data pipeline's pinned buffers) could not be allocated: the host's memory
    Rule("HostOOM", "framework", r"cuda(?:HostAlloc|MallocHost)\b[^\n]*(?:out of memory|cudaErrorMemoryAllocation)",
         81, False,
         "the host could not give page-locked (pinned) memory for the data pipeline's buffers: host RAM is exhausted "
         "(or the locked-memory limit, ulimit -l, is low); a smaller prefetch or queue, fewer workers, or pinned "
         "memory off; a restart fails the same way"),
    # mpirun's report that a rank died of SIGKILL with no error of its own, like the shell's `Killed`
    Rule("Killed", "framework", r"\b(?:exited|killed|terminated) on signal 9\b", 12, True,
         "mpirun reports a rank killed by SIGKILL (signal 9) with no error of its own: the host's OOM killer (or a "
         "lost node); resumed once, and if it recurs, check dmesg for the OOM killer and lower the host memory the "
         "ranks use (data-loader workers, CPU offload)"),
]
# Round 24 (issue 45): sets 21 and 22's families, each a mechanism in the words of the system that reports it.
_ROUND24: list[Rule] = [
    # The shell could not find the program it was told to run (bash's `X: command not found`, zsh's `command not
    # found: X`, dash's `sh: 1: X: not found`), in the locale's words where the shell is translated, or Windows'
    # cmd.exe and PowerShell: the launcher (torchrun, deepspeed, python of an environment) is not installed or not
    # on PATH in the environment the script ran in. The job never started; a restart fails the same way.
    Rule("CommandNotFound", "script",
         r"\bcommand not found\b|^\S*sh: (?:line )?\d+: [^\s:]+: not found\s*$|"
         r"未找到命令|找不到命令|命令找不到|コマンドが見つかりません|Befehl nicht gefunden|commande introuvable|"
         r"no se encontró la orden|orden no encontrada|comando não encontrado|comando non trovato|"
         r"команда не найдена|is not recognized as an internal or external command|"
         r"is not recognized as (?:the )?name of a cmdlet", 66, False,
         "the shell could not find the program the script runs (torchrun, deepspeed, a python of another "
         "environment): install it or activate the environment that has it (check with `which NAME`), or call it by "
         "its full path (`python -m torch.distributed.run`); a restart fails the same way"),
    # gloo could not build a transport device for this host (`makeDeviceForHostname(): unsupported gloo device`,
    # `makeDeviceForInterface`): the host's name resolves to no address of an interface gloo can use, or this
    # build's gloo has no transport for the platform (Windows builds: libuv only). Before any peer is contacted,
    # so the machine's set-up, not the network.
    Rule("DistributedInitError", "script",
         r"makeDeviceFor(?:Hostname|Interface)\(\)[^\n]*(?:unsupported|failed|error)|unsupported gloo device",
         63, False,
         "gloo could not make a network device for this host before any peer was contacted: set GLOO_SOCKET_IFNAME to "
         "an interface the host has (and MASTER_ADDR to its address), make the host's name resolve to that address, "
         "or on Windows use a build and init method its gloo supports (USE_LIBUV=1, a tcp:// init_method); a restart "
         "fails the same way"),
    # XLA's device allocator words its failure without `out of memory` (`Error allocating device buffer: Attempting
    # to allocate 15.65G. That was not possible. There are 11.08G free.`): the accelerator's memory, as torch's OOM
    Rule("OutOfMemoryError", "framework",
         r"Error allocating device buffer|Attempting to allocate [\d.]+\s?[KMGT]?i?B?\. That was not possible", 80,
         True, "the accelerator (GPU or TPU HBM) ran out of memory: free what an earlier run in this process still "
               "holds, a smaller batch or model shard; restart with more memory per device"),
]
# Round 20 (issue 45): failures in the words of other frameworks, runtimes and services (set 17's families).
_OTHER_WORDS: list[Rule] = [
    # GPU memory exhausted, in the words of runtimes other than torch's: Paddle's allocator (`Out of memory error on
    # GPU 0. Cannot allocate ...`), a native library's failed cudaMalloc (MXNet's pooled storage manager:
    # `cudaMalloc failed: out of memory`; dlib's `reason: out of memory`), ROCm's HIP and the driver API's cuMemAlloc,
    # Apple's MPS and Intel's XPU backends
    Rule("OutOfMemoryError", "framework",
         r"Out of memory error on (?:GPU|XPU|NPU|MLU) \d+|\bcu(?:da)?Mem(?:Alloc)?\w*\b[^\n]*(?:failed|error)[^\n]*out of memory|"
         r"\bcudaMalloc(?!Host)\w*\b[^\n]*(?:failed|error)[^\n]*out of memory|hipErrorOutOfMemory|"
         r"MPS backend out of memory|XPU out of memory|Error while calling cuda\w+\([^\n]*reason: out of memory", 80,
         True, "the GPU ran out of memory (in the runtime's own words): restart with more memory per GPU or a smaller "
               "batch"),
    # ROCm's words for a kernel's faulting memory access (CUDA's illegal memory access): the GPU, its driver stack
    # or the host's kernel modules, as the GPU-fault rule reads CUDA's; the abort after it is its consequence
    Rule("CUDAError", "infrastructure",
         r"Memory access fault by GPU node-\d+|HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION|hipErrorIllegalAddress",
         90, True, "the GPU faulted on a memory access (ROCm): run the node check on this rank's node (the GPU's "
                   "temperature and clocks, the amdgpu/amdkfd driver), cordon it if it fails, and resume"),
    # a native library's own check on a CUDA call, with the runtime's reason (dlib's `Error while calling
    # cudaX(...) in file F:N. code: 98, reason: ...`): a failed CUDA call, as `CUDA error: ...` is read
    Rule("CUDAError", "infrastructure", r"Error while calling cu\w+\([^\n]*\bcode: \d+, reason: (?!out of memory)",
         90, True, "a CUDA call failed inside a native library: run the node check on this rank's node, cordon it if "
                   "it fails, and resume"),
    # Horovod's notice that it stopped: a rank raised, or finished while the others still called a collective
    # (early stopping on one rank); the rank's own exception, where the log holds it, ranks above it
    Rule("HorovodShutdown", "framework", r"Horovod has been shut down\b", 25, False,
         "Horovod shut down because one rank raised (its exception is above the first shutdown message) or finished "
         "while the others still called allreduce/allgather/broadcast (early stopping or a data split that gives "
         "the ranks different step counts): make every rank run the same number of collective steps; a restart "
         "fails the same way"),
    # NCCL's topology detection cannot resolve a GPU's PCI path in /sys (WSL, a container without the host's /sys):
    # the environment the job runs in
    Rule("TopologyError", "script", r"NCCL WARN Could not find real path of /sys/", 51, False,
         "NCCL could not read the GPUs' PCI topology from /sys (WSL, or a container without the host's /sys): run "
         "where /sys shows the GPUs, or on one GPU; a restart fails the same way"),
    # a tracking service's client (wandb) that never connected to its server: the host's network access, as a
    # download that never reached its server; a read timeout on an open connection stays the transient fault
    Rule("ServiceUnreachable", "script", r"Network error \(ConnectTimeout\)", 53, False, _FETCH),
    # a summary writer's warning that a value logged was NaN/inf: the loss it was given; the progress line that
    # shows the divergence (DIVERGENCE, 77) outranks it, and a line that says the loss diverged (78) too
    Rule("NumericalError", "framework", r"(?i)nan or inf found in input tensor", 76, False,
         "a NaN/inf was logged (the loss diverged): lower the learning rate, use bf16 or gradient clipping, and "
         "resume from a checkpoint before the divergence"),
]
NCCL_INIT_CUDA = Rule("DriverError", "script", r"(?!)", 90, False,
                      "NCCL could not make a CUDA call while the process group was being set up, before any "
                      "collective ran: the machine's CUDA set-up (a driver older than the CUDA runtime torch or NCCL "
                      "was built with, two ranks given one GPU, CUDA_VISIBLE_DEVICES hiding the GPU a rank asks for, "
                      "IPC or peer access blocked in a container: --ipc=host, NCCL_P2P_DISABLE=1 to test); run with "
                      "NCCL_DEBUG=INFO for the call that failed; a restart fails the same way")
"""NCCL's `unhandled cuda error` (ncclUnhandledCudaError: a CUDA call NCCL made failed) in a log whose frames show the
process group's set-up (tasks/diagnosis/diagnose.py reads them); elsewhere it keeps the GPU-fault rule."""
FETCH_FAILED = Rule("ServiceUnreachable", "script", r"(?!)", 53, False, _FETCH)
"""A connect failure (`Network is unreachable`, `Connection timed out`, ...) raised in an HTTP client's or a
download's frame (tasks/diagnosis/diagnose.py reads the frame): the run's download never reached its server."""

# Round 21 (issue 45): mechanisms in any framework's, allocator's or vendor's words, tried after every other
# content rule (a rule that names the line more precisely wins it) and ranked just below the precise rule of the
# same mechanism (so its line wins where a log holds both).
_UNHEDGED = r"(?i)^(?!.*\b(?:may|might|could|if|avoid\w*|prevent\w*|warn\w*|potential(?:ly)?|possibl[ey])\b).*?(?:"
"""The start of a pattern for a line that states a failure: not one that guesses at a cause (Ray's `potential root
causes: (1) ... killed by OOM killer`), advises (`to avoid OOM, ...`) or warns (`GPU memory almost full, may OOM`).
The pattern closes the group it opens."""
_ANY_WORDS: list[Rule] = [
    # a device's memory exhausted, however the runtime words it: an allocator that ran out of memory on a GPU (or
    # an accelerator: CUDA's runtime enum, Level Zero's, `device memory`), the GPU's OOM read as torch's
    Rule("OutOfMemoryError", "framework",
         _UNHEDGED + r"\b(?:GPU|CUDA|device|HIP|XPU|NPU|TPU|VRAM|HBM)\b[^\n]*\b(?:ran out of memory|out of memory|OOM)\b|"
         r"\b(?:ran out of|insufficient|not enough) (?:GPU|device|CUDA|HBM|accelerator) memory\b|"
         r"\b(?:out of memory|OOM)\b[^\n]*\b(?:on|for|in) (?:the )?(?:GPU|CUDA|device|HIP|XPU|NPU|TPU)\b|"
         r"\b(?:cuda|cu|hip|ze|cl)[A-Z]\w*\b[^\n]*\bout of memory\b|"
         r"cudaErrorMemoryAllocation|ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)", 79, True,
         "the GPU (accelerator) ran out of memory: restart with more memory per GPU, a smaller batch or activation "
         "checkpointing"),
    # the host's memory exhausted in any words: an allocator's `out of memory` with no device named, a VM or
    # container stopped for memory, an OOM named in an error line
    Rule("HostOOM", "framework",
         _UNHEDGED + r"\b(?:ran|runs|running) out of (?:host |system |cpu |)memory\b|\bout of memory: failed to allocate\b|"
         r"\b(?:instance|vm|container|pod)\b[^\n]*\b(?:killed|terminated|stopped|evicted)\b[^\n]*"
         r"\b(?:memory|oom)\b|(?-i:\b(?:Error|ERROR|FATAL|Fatal)\b[^\n]*\bOOM\b))", 78, False,
         "the host ran out of memory (RAM): fewer data-loader workers, a smaller prefetch or cache, no CPU offload, or "
         "a machine with more RAM; a restart fails the same way"),
    # a GPU lost or faulted, in any vendor's words: Intel's Level Zero and XPU (`device lost`), AMD's kernel
    # driver (a GPU reset, a ring timeout: a hung GPU), a GPU page fault, CUDA's ECC enum
    Rule("ECCError", "infrastructure", r"cudaErrorECCUncorrectable|CUDA_ERROR_ECC_UNCORRECTABLE|ECCUncorrectable",
         95, True, "cordon the node (GPU memory errors) and resume on healthy GPUs; have the GPU checked"),
    Rule("NodeFailure", "infrastructure",
         # the runtime's enum for a lost device: Level Zero's, Unified Runtime's (SYCL, torch's XPU), Vulkan's
         _UNHEDGED + r"\b(?:ZE|UR|VK)_(?:RESULT_)?ERROR_DEVICE_LOST\b|"
         r"\b(?:GPU|XPU|device)(?: error)?:? (?:device )?(?:was |is |has been )?lost\b|"
         r"\bamdgpu\b[^\n]*(?:GPU reset|ring \w+ timeout|GPU fault|page fault)|\bGPU (?:reset|hang)\b(?! ?(?:succeeded|ok))|"
         r"\bGPU page fault\b|\b(?:memory access|page) fault\b[^\n]*\b(?:by|on) (?:the )?(?:GPU|device)\b)", 92, True,
         "the GPU was lost or hung (a reset, a page fault, the device gone): run the node check on this rank's node, "
         "cordon it if it fails, and resume from the newest checkpoint"),
]

# priority bands: 90 hardware/node, 70 resource & loading, 60 script, 50 network faults and storage, 40 generic
# framework, 30 what a peer's death looks like from here (remote errors, lost connections), 20 collective
# timeouts, 10 launcher symptoms
RULES: list[Rule] = [
    # -- infrastructure: hardware and nodes --------------------------------------------------------------
    Rule("ECCError", "infrastructure",
         r"(?i)uncorrectable ECC error|\bECC\b.*\b(?:error|fault)|Xid \([^)]*\):\s*(?:48|63|64|92|94|95)\b|"
         r"double bit ECC|page retirement|row remapping failure", 95, True,
         "cordon the node (GPU memory errors) and resume on healthy GPUs; have the GPU checked"),
    Rule("NVLinkError", "infrastructure",
         r"(?i)nvlink[^\n]*(?:error|fault|down|inactive)|Xid \([^)]*\):\s*74\b", 95, True,
         "cordon the node (NVLink fault) and resume on healthy GPUs"),
    Rule("NodeFailure", "infrastructure",
         r"(?i)fallen off the bus|Unable to determine the device handle for GPU|RmInitAdapter failed|"
         r"rm_init_adapter failed|Cannot attach gpu|GPU is lost|Xid \([^)]*\):\s*(?:79|119|120)\b|"
         r"machine check|Hardware Error|"
         r"kernel panic|node\b[^\n]*\b(?:failed(?! to\b)|down|unreachable|NotReady|lost)\b|"
         r"\bNodeFailure\b|heartbeat (?:timeout|lost)|DUE TO NODE FAILURE|preempted \(node failure\)|"
         r"srun: error: Node failure on\b|"
         r"slurmstepd: error: execve\(\)[^\n]*slurm_script", 92, True,
         "cordon the node and resume on the remaining healthy GPUs from the newest verified checkpoint"),
    Rule("Preempted", "infrastructure",  # the scheduler's decision: what the tasks print after it are its symptoms
         r"DUE TO PREEMPTION|DUE TO JOB REQUEUE|job is preempted|(?i:spot instance[^\n]*(?:interrupt|terminat))|"
         r"(?i:termination is imminent|preemption notice|instance (?:was |is |has been )?preempted)|"
         # what was taken back named before the word: a TPU, a node, a VM (`Your TPU was preempted`, `TPU preempted`)
         r"(?i:\b(?:TPU|node|VM|pod)s? (?:was |is |has been |is being |got )?preempted\b|terminated by (?:EC2 )?spot)|"
         r"lame workers found|"
         r"(?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ \*\*\*\s*$", 89,  # cancelled, no reason given: by the scheduler
         True,
         "the scheduler or the cloud took the nodes back: resume from the newest checkpoint on the next allocation"),
    Rule("DriverError", "script",
         r"(?i)driver version is insufficient for CUDA runtime|NVIDIA driver on your system is too old|"
         r"CUDA driver initialization failed|no CUDA-capable device is detected|(?-i:Torch not compiled with CUDA "
         r"enabled)|Found no NVIDIA driver on your system|No CUDA GPUs are available|"
         # PTX built by a newer CUDA toolkit than the driver can compile (cudaErrorUnsupportedPtxVersion): the
         # driver is older than the toolkit, as above
         r"PTX was compiled with an unsupported toolchain|cudaErrorUnsupportedPtxVersion|"
         r"CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 93, False,
         "the environment: the NVIDIA driver is older than the CUDA this build needs (or there is no GPU); "
         "install a matching driver or a build for this driver"),
    # a C++/CUDA extension (torch_scatter's, torch_cluster's, detectron2's and mmcv's ops) installed as a CPU-only
    # build and called on GPU tensors: the user's install, as `Torch not compiled with CUDA enabled` above
    Rule("ExtensionBuildError", "script", r"\bNot compiled with (?:CUDA|GPU) support\b", 93, False,
         "the environment: this extension was installed without its CUDA kernels; install its build for the CUDA "
         "version torch was built with (or build it from source with CUDA available)"),
    Rule("GPUArchError", "script",  # the warning that names the GPU and the build's capabilities says why
         r"sm_\d+ is not compatible with the current PyTorch installation|only supports Ampere GPUs or newer|"
         r"requires a GPU with compute capability", 93, False, _ARCH),
    Rule("GPUArchError", "script",  # the build (or a kernel library) has no code for this GPU: the environment
         r"no kernel image is available for execution on the device|CUDA error: invalid device function", 92, False,
         _ARCH),
    Rule("ConfigError", "script",  # the setup lacks a capability the run asks for: deterministic, not a fault
         r"peer access is not supported|(?i:\b(?:your )?(?:setup|system|hardware|gpu|device|platform|machine)s? "
         r"(?:doesn't|does not|don't|do not) support\b)|(?i:bf16[^\n]*(?:not supported|only supported|requires))",
         91, False,
         "the setup lacks what the run asks for (bf16 on a GPU without it, peer-to-peer access between these GPUs): "
         "change the setting (fp16/fp32, NCCL_P2P_DISABLE=1) or run on hardware that has it; a restart fails the "
         "same way"),
    Rule("ConfigError", "script",  # NCCL's invalid usage and a device index past the node's GPUs: the launch config
         r"invalid device ordinal|ncclInvalidUsage|(?i:NCCL error)[^\n]*invalid usage|Duplicate GPU detected", 91,
         False,
         "the launch configuration: more processes per node than GPUs, or two ranks on one GPU; fix "
         "--nproc_per_node / CUDA_VISIBLE_DEVICES (a restart fails the same way)"),
    Rule("OutOfMemoryError", "framework",  # cuBLAS cannot create its handle: no GPU memory left for it
         r"CUBLAS_STATUS_(?:NOT_INITIALIZED|ALLOC_FAILED)", 91, True,
         "cuBLAS could not create its handle, almost always because GPU memory is full (a large batch, another "
         "process on the GPU); if memory is free, an earlier kernel failed (an index past an embedding's size: rerun "
         "with CUDA_LAUNCH_BLOCKING=1). Restart with more memory per GPU or a smaller micro-batch"),
    Rule("DriverError", "script",  # cuDNN failing inside itself at setup: the installed CUDA/cuDNN, not the GPU
         r"CUDNN_STATUS_INTERNAL_ERROR", 66, False,
         "cuDNN failed internally: the installed CUDA, cuDNN and torch do not fit together (or fit the driver); "
         "reinstall a matching build (or set torch.backends.cudnn.benchmark=False to rule out one kernel); a restart "
         "fails the same way"),
    # A kernel stopped by the operating system's run-time limit (cudaErrorLaunchTimeout, CUDA_ERROR_LAUNCH_TIMEOUT):
    # CUDA raises it only on a GPU whose kernel time limit is on (`kernelExecTimeoutEnabled`: a GPU that also drives
    # a display, whose driver's watchdog, Windows' TDR or the X server's, ends a long kernel). The machine's set-up,
    # not a fault of the GPU: it fails the same way until the limit is lifted, the GPU is freed of the display or
    # the kernels are shortened. Tried before the GPU-fault rule below, whose CUDA_ERROR_ family would take it.
    Rule("CUDAError", "script",
         r"the launch timed out and was terminated|CUDA_ERROR_LAUNCH_TIMEOUT|cudaErrorLaunchTimeout", 90, False,
         "a kernel ran past the GPU's run-time limit (a display watchdog: Windows TDR, an X server on this GPU): run on "
         "a GPU with no display attached, raise or lift the limit (TdrDelay on Windows), or shorten each kernel "
         "(a smaller batch or resolution); a restart fails the same way"),
    Rule("CUDAError", "infrastructure",
         r"(?i)unhandled cuda error|Cuda failure (?!(?:\d+ )?'?out of memory)|"
         r"(?-i:CUDA error: (?!out of memory)(?!device-side assert)(?!invalid device (?:ordinal|function))"
         r"(?!no kernel image)|"
         r"CUDA_ERROR_(?!OUT_OF_MEMORY)\w+|"
         r"cudaErrorIllegalAddress|unspecified launch failure|an illegal memory access was encountered|"
         # a kernel library's own word that the kernel it launched failed on the GPU (cuBLAS's, cuDNN's)
         r"CU(?:BLAS|DNN)_STATUS_EXECUTION_FAILED|CUBLAS_STATUS_INTERNAL_ERROR|Xid \([^)]*\):\s*(?:13|31|43|45|61|62|69)\b)", 90, True,
         "run the node check on this rank's node, cordon it if it fails, and resume"),
    # -- infrastructure: storage (errno families; a full disk fails again until space is freed) -----------------
    Rule("SharedMemoryError", "script",  # ENOSPC from the shared-memory machinery, not from a disk
         r"(?i)(?:/dev/shm|\bshm\b|semaphore|SemLock|joblib|_multiprocessing)[^\n]*(?:No space left on device|\[Errno 28\])|"
         r"(?:No space left on device|\[Errno 28\])[^\n]*(?:/dev/shm|\bshm\b|semaphore|SemLock|joblib)", 87, False,
         "shared memory (/dev/shm, where semaphores and worker tensors live) is full, not the disk: run the "
         "container with a larger --shm-size (or --ipc=host), or fewer workers; a restart fails the same way"),
    Rule("DiskFull", "infrastructure",
         r"No space left on device|\[Errno (?:28|122)\]|\bENOSPC\b|\bEDQUOT\b|(?i:disk quota exceeded)|StorageFull",
         86, False, _FULL),
    # a library's summary of a write that failed (HDF5's `file write failed: time = ..., errno = 28, error message =
    # 'No space left on device'`, its message often wrapped onto a second line): the errno's text, where the log
    # holds it, says why, so the summary ranks just below it
    Rule("DiskFull", "infrastructure", r"file write failed|failed writing file", 85, False, _FULL),
    Rule("StorageError", "infrastructure",
         # the errno's own text, or its number with the text cut short (`[Errno 5] Input/output` quoted to the
         # line's end): the number alone differs between platforms, the text does not
         r"Input/output error|\[Errno 5\] Input/output|\bEIO\b|Stale (?:NFS )?file handle|\[Errno 116\] Stale|"
         r"\bESTALE\b|Remote I/O error|\[Errno 121\] Remote I/O", 84, True,
         "the filesystem failed an I/O: check the mount on this node, then resume from the newest checkpoint"),
    # -- framework: resources and loading ---------------------------------------------------------------
    Rule("HostOOM", "framework",  # Slurm's reason for the cancel it prints next: above the bare cancel (89)
         r"(?i)exceeded (?:job |step )?memory limit\b[^\n]*(?:being killed|\(\d+ > \d+\))|"
         r"slurmstepd: error: Exceeded (?:job|step) memory limit\s*$|PBS: job killed: v?mem \S+ exceeded limit|"
         r"TERM_MEMLIMIT|reaching LSF memory usage limit", 90, False,
         "the job's processes went past the memory the scheduler granted it (Slurm killed them for it): ask for more "
         "memory (--mem / --mem-per-cpu), fewer data-loader workers or less CPU offload; a restart fails the same way"),
    Rule("HostOOM", "framework",
         r"oom[-_]kill event|Some of the step tasks have been OOM Killed|task \d+: Out Of Memory|"
         # the kernel's OOM killer names the process it killed, in the whole host's or a memory cgroup's words
         # (`Memory cgroup out of memory: Killed process N`; older kernels `Kill process N`): the cause of the
         # worker or rank killed by signal 9 that the run reports (DataloaderKilled 75, Killed 12 rank below)
         r"(?i:out of memory): Kill(?:ed)? process|invoked oom-killer|"
         # ... but not where the OOM killer is one of a list of causes a message names as possible (Ray's `Some
         # common causes include: (1) the process was killed by the OOM killer ..., (2) ray stop --force`)
         r"(?i:^(?!.*\bcauses? (?:include|are|is|could be|may be)\b).*?killed by (?:the )?oom[- ]?killer)|"
         # a notebook service's own report that the kernel used up the VM's RAM (no exception is raised: the
         # kernel is killed and restarted): Colab's and Kaggle's wording
         r"session crashed after using all available RAM|tried to allocate more memory than is available|"
         r"std::bad_alloc|Cannot allocate memory|\[Errno 12\]|"
         # numpy's MemoryError subclass and torch's CPU allocator: an array or tensor host memory cannot hold
         r"_ArrayMemoryError\b|Unable to allocate [\d.]+ [KMGTP]?i?B for an array|DefaultCPUAllocator: (?:can't|not "
         r"enough memory)|"
         r"low on resource: memory|\bOOMKilled\b|"
         r"killed due to memory pressure|running low on memory|ray-oom-prevention|"  # Ray's memory monitor
         + _PY + r"MemoryError\b", 81, False,
         "the host (or the job's cgroup) ran out of memory: fewer data-loader workers, less CPU offload or a "
         "larger memory request"),
    Rule("OutOfMemoryError", "framework",
         # NCCL's `Cuda failure 'out of memory'`, newer NCCL with the code first (`Cuda failure 2 'out of memory'`)
         r"Cuda failure (?:\d+ )?'?out of memory|OutOfMemoryError|CUDA out of memory|CUDA error: out of memory|"
         r"CUDA_ERROR_OUT_OF_MEMORY|"
         r"HIP out of memory|Tried to allocate [\d.]+ [KMG]iB|cuda runtime error \(2\) : out of memory|error=2 : out of "
         r"memory|ResourceExhaustedError|OOM when allocating|RESOURCE_EXHAUSTED: Out of memory", 80, True,
         "restart with the next resource plan with more memory per GPU (or a smaller micro-batch)"),
    Rule("SharedMemoryError", "script",
         r"(?i)error while creating shared memory segment|unable to (?:allocate|create|open) shared memory|"
         r"unable to (?:write to|open|mmap) (?:file|shared memory object) </torch_|"
         r"shm_open|/dev/shm[^\n]*(?:no space|too small|failed)", 79, False,
         "the container's shared memory (/dev/shm) is too small for NCCL or the data loader: run it with a larger "
         "--shm-size (or --ipc=host); a restart fails the same way"),
    Rule("DataloaderKilled", "script",  # a bus error in a worker: /dev/shm, the container's setting
         # torch's `killed by signal: Bus error.` wraps after `Bus` where a copy cut the line: SIGBUS is the signal
         r"(?i)(?:worker|dataloader)[^\n]*bus error|(?-i:DataLoader worker[^\n]*killed by signal: Bus\b)|"
         r"bus error[^\n]*worker|out of shared memory|insufficient shared "
         r"memory|raise your shared memory limit", 76, False,
         "the data-loader workers ran out of shared memory (/dev/shm, a container or host setting): run with a larger "
         "--shm-size (or --ipc=host), or fewer workers; a restart fails the same way"),
    Rule("DataloaderKilled", "framework",
         r"DataLoader worker \(pid[^\n]*killed|worker process[^\n]*killed by signal|"
         r"Unexpected (?:segmentation fault|bus error) encountered in worker", 75,
         True, "host memory ran out in the data loader: fewer workers or a smaller prefetch, then resume"),
    Rule("DataloaderKilled", "script",  # no signal named: below a "killed by signal" line (framework, 75) here
         r"DataLoader worker \(pid\(?s?\)?[^\n]*exited unexpectedly", 74, False,
         "the data-loader workers exited with no signal named: their start-up (spawn on Windows, a too small "
         "/dev/shm) or the dataset code in them; run with num_workers=0 to see the worker's own error, then fix it"),
    # torch's wrapper, in the main process, for an exception a DataLoader worker raised loading a sample: the dataset
    # code or the data it read (an unreadable file, a missing key). Where the worker's `Original Traceback` is in the
    # log, the exception that ends it is the cause (chains.py) and takes this line's place; where it is cut off,
    # this line is what is left to say so
    Rule("DataLoaderWorkerError", "script", r"Caught \w+ in DataLoader worker process \d+", 40, False,
         "a DataLoader worker failed loading a sample (the dataset code, or a file of the data it read): the worker's "
         "`Original Traceback` names the sample or the line; run with num_workers=0 to see it in the main process, "
         "fix the data or the dataset code; a restart fails the same way"),
    # the run's own statement that it ended training on a non-finite value, the value named before or after the
    # stop (`non-finite loss, ending training`, `Loss is not finite. Terminate training.`, `stopping training: loss
    # = nan`): above the notices of steps it skipped for one before (78)
    Rule("NumericalError", "framework",
         r"(?i)(?:not finite|non-finite|\bnan\b|\binf\b)[^\n]{0,60}?\b" + _STOP + r"|"
         + _STOP + r"[^\n]{0,60}?(?:not finite|non-finite|\bnan\b|\binf\b)", 79, False,
         "the loss became NaN/inf and the run stopped on it: lower the learning rate, use bf16 or gradient clipping, "
         "and resume from a checkpoint before the divergence"),
    Rule("NumericalError", "framework",
         r"(?i)loss became infinite or nan|loss scale already at minimum|minimum loss scale reached|non-finite loss|"
         r"loss scale reached (?:the |its )?minimum|Tensor had (?:nan|inf) values|nan in summary histogram|"
         r"iterations in a row due to (?:overflow|nan)|training (?:has )?diverged|"
         r"(?-i:to satisfy the constraint \w+\(\), but found invalid values)|"
         r"loss is (?:nan|inf)|detected (?:nan|inf) (?:loss|in)|\b(?:nan|inf) loss(?:es)? (?:with|in|at|for|on)\b|"
         r"probability tensor contains either|returned nan values|(?-i:FloatingPointError)|"
         r"(?:input|tensor|output|gradient)s? contains? (?:nan|inf)|(?:nan|inf) (?:loss|value)s? (?:detected|found|"
         r"encountered)|encountered (?:a )?nan|"
         # NaN/inf named before what holds it (`NaN detected in loss function`, `Inf found in the gradients`), a
         # loss said to hold one (`loss contains NaN`, `Loss has NaN values`) or not to be finite
         r"\b(?:nan|inf)s?(?: or (?:nan|inf)s?)?(?: values?)?(?: (?:was |were |is )?(?:detected|found|encountered))? "
         r"in (?:the )?(?:loss|gradients?|grads?|outputs?|logits|weights?|activations?)\b|"
         r"\bloss(?:es)? (?:has|have|had|contains?|contained) (?:a |some )?(?:nan|inf)\b|"
         r"\bloss(?:es)? (?:is|are|was|were|became|becomes) (?:not finite|non-finite)|"
         r"\b(?:loss(?:es)?|outputs?|logits|gradients?|grads?|weights?|param(?:eter)?s?|activations?|predictions?)\s+"
         r"(?:is|are|was|were|became|become|becomes|went|goes|turned)\s+(?:to\s+)?(?:nan|inf)\b|"
         r"loss[ _]scale\b[^\n\d]{0,30}\bto:? 0\.\d|loss[ _]scale[ =:]+0(?:\.0+)?(?![.\d])", 78, False,
         "the loss diverged (NaN/inf, or fp16 loss scale at its floor): lower the learning rate, use bf16 or "
         "gradient clipping, and resume from a checkpoint before the divergence"),
    Rule("ModelLoadingError", "script",
         r"Error\(s\) in loading state_dict|size mismatch for\b|SafetensorError|Can't load (?:the )?"
         r"(?:weights|model|config|tokenizer)|Unable to load weights|CheckpointMismatch|LocalEntryNotFoundError|"
         r"couldn't connect to 'https://huggingface.co'|is not the path to a directory containing", 72, False,
         "the checkpoint does not match the model: fix the model config or the checkpoint path"),
    Rule("DataError", "script",  # a data file that does not parse: the user's data
         _PY + r"(?:JSONDecodeError|UnicodeDecodeError|EmptyDataError|ParserError|ScannerError)\b|Error tokenizing "
         r"data|UnidentifiedImageError|BadZipFile\b|(?<![\"'])(?:cannot identify image file|image file is truncated)", 66, False,
         "the data file does not parse (its format or encoding, a broken or non-image file in an image folder): fix "
         "the file or the path given"),
    Rule("DataError", "script",  # the default collate cannot batch samples of different sizes: the user's data
         r"stack expects each tensor to be equal size|each element in list of batch should be of equal size", 62,
         False, "the samples of a batch differ in size (images or sequences of mixed shapes in the data): resize or "
                "pad them in the dataset, or give the DataLoader a collate_fn that does; a restart fails the same way"),
    Rule("DatasetLoadingError", "script",
         r"DatasetNotFoundError|Couldn't find (?:a )?dataset|ArrowInvalid|DataError|corpus[^\n]*(?:not found|"
         r"empty|unreadable)", 72, False, "fix the dataset path or format; a restart will fail the same way"),
    # -- script / configuration and the user's environment ---------------------------------------------------
    Rule("SyntaxError", "script", _PY + r"(?:SyntaxError|IndentationError)\b", 66, False,
         "fix the syntax error in the training script"),
    Rule("ImportError", "script",
         _PY + r"(?:ImportError|ModuleNotFoundError)\b|undefined symbol: \w+|cannot open shared object file|"
         r"No module named '|cannot import name '|DLL load failed|requires the [\w-]+ library but it was not found|"
         r"does not exist or is not currently imported|does not recognize this architecture|CUDA Setup failed|"
         r"did not contain \['lib[\w.]+\.so|"
         # numpy 2's refusal of an extension built against numpy 1 (it prints this, then the ImportError or a crash)
         r"compiled using NumPy 1\.x cannot be run in\s*NumPy 2",
         65, False, "the environment: install the missing package, or the build of a compiled extension that matches "
                    "this torch (an undefined symbol is an ABI mismatch)"),
    Rule("ConfigError", "script",  # the configured sizes do not divide (layers by pipeline stages, batch by GPUs)
         r"(?i)(?:should|must|has to) be (?:evenly )?divisible by|(?:is )?not (?:evenly )?divisible by|"
         r"is not equal to [\w.]+ \* [\w.]+|"
         r"(?:should|must) be (?:an? )?(?:integer )?multiple of", 64, False,
         "the configured sizes do not divide (layers by pipeline stages, heads by tensor-parallel ranks, the batch by "
         "the GPUs): change the sizes or the parallel layout named in the message; a restart fails the same way"),
    Rule("ConfigError", "script",  # a collective timeout set below a second: the setting, not the network
         r"Timeout\(ms\)=\d{1,3}\)", 64, False,
         "the collective timeout is configured below a second (Timeout(ms) in the message): no collective fits in "
         "it; set a realistic timeout (minutes: init_process_group(timeout=...), --ddp_timeout); a restart fails the "
         "same way"),
    Rule("ConfigError", "script",  # a tracker or hub the run logs in to, with no (or a wrong) key
         r"api_key not configured|(?i:api[ _]key)[^\n]{0,40}(?:not (?:configured|set|found)|missing|invalid)|"
         r"Invalid API key|wandb\.login\(key|401 Client Error: Unauthorized|Invalid (?:user )?token", 64, False,
         "the run logs in to a service (an experiment tracker, a model hub) with no valid key: set the key "
         "(e.g. WANDB_API_KEY, HF_TOKEN) or turn the service off (WANDB_MODE=disabled); a restart fails the same way"),
    # torch.distributed called with no process group: the script (or a config asking for a distributed piece,
    # SyncBatchNorm, DDP, a distributed sampler) runs in one plain process; it is started without a launcher or
    # never calls init_process_group. The library only reports that the run was set up so.
    Rule("ConfigError", "script",
         r"Default process group has not been initialized", 64, False,
         "a distributed call (SyncBatchNorm, DDP, a distributed sampler, a collective) ran with no process group: "
         "launch with torchrun (or the project's launcher) so the script calls init_process_group, or, on one GPU, "
         "switch the distributed piece off in the config (SyncBN -> BN, no DDP); a restart fails the same way"),
    Rule("ConfigError", "script",
         r"MisconfigurationException|larger than the maximum number of tokens that can be stored in KV cache|"
         r"\b(?:Config|Configuration)Error\b", 64, False,
         "fix the configuration named in the message (a restart fails the same way)"),
    Rule("ConfigError", "script",  # the line naming the parameters is the most specific
         r"Parameter indices which did not receive grad", 65, False, _UNUSED),
    Rule("ConfigError", "script",
         r"Expected to have finished reduction in the prior iteration|parameters that were not used in producing "
         r"loss", 64, False, _UNUSED),
    Rule("AddressInUse", "script",
         r"Address already in use|\bEADDRINUSE\b|errno: 98\b|server socket has failed to (?:listen|bind)", 64, False,
         "the rendezvous port is taken on this node (an earlier run still holds it, or another job): pick another "
         "--master_port / MASTER_PORT or end the process that holds it"),
    Rule("ArgumentError", "script",
         r"ArgumentError|error: unrecognized arguments|error: argument -|the following arguments are required",
         64, False, "fix the command line"),
    # EMFILE: the process's open-file limit (ulimit -n), not the disk. A DataLoader worker passes each tensor's
    # shared memory to the main process as a file descriptor (SCM_RIGHTS); where the receiver is out of descriptors
    # the message arrives without it, and multiprocessing's recvfds says `received 0 items of ancdata`
    Rule("ResourceLimitError", "script",
         r"\[Errno 24\]|\bEMFILE\b|(?i:too many (?:open files|files open))|received 0 items of ancdata", 63, False,
         "the process hit its open-file limit (ulimit -n), typically DataLoader workers passing tensors through file "
         "descriptors: raise the limit (ulimit -n 65535), use torch.multiprocessing.set_sharing_strategy('file_system') "
         "or fewer workers; a restart fails the same way"),
    Rule("ResourceLimitError", "script",  # EAGAIN on a new thread: the limit on threads or processes, not memory
         r"Thread creation via pthread_create\(\) failed|pthread_create failed|can't start new thread", 63, False,
         "the process hit its limit on threads or processes (ulimit -u, a container's pids limit) starting a thread: "
         "raise the limit, or start fewer (OMP_NUM_THREADS, data-loader workers); a restart fails the same way"),
    Rule("FileNotFoundError", "script", _PY + r"FileNotFoundError\b|No such file or directory", 63, False,
         "fix the path (a restart will fail the same way)"),
    Rule("PermissionError", "script", _PY + r"PermissionError\b|Permission denied", 63, False,
         "fix the permissions or the path"),
    Rule("BareReraise", "script",  # Python 3's and Python 2's words for a `raise` with nothing being handled
         r"No active exception to re-?raise|exceptions must be old-style classes or derived from BaseException, "
         r"not NoneType", 38, False,
         "a bare `raise` ran where no exception was being handled (an error path that reports a problem, then "
         "re-raises nothing): the failure is the error the program reported just before this traceback; fix that "
         "(and the bare raise); a restart fails the same way"),
    Rule("TypeError", "script",  # a call the callee does not take: code written for another version of the API
         r"got an unexpected keyword argument|takes (?:from )?\d+ (?:to \d+ )?positional arguments? but \d+ "
         r"(?:were|was) given|missing \d+ required (?:positional |keyword-only )?arguments?|got multiple values for "
         r"(?:keyword )?argument|takes no keyword arguments", 62, False,
         "the code calls an API with arguments this version of it does not take: install the library versions the "
         "code was written for (or update the call)"),
    Rule("AttributeError", "script",  # a module without the name: the installed version of a library is not the one
         r"module '[\w.]+' has no attribute '", 62, False,
         "the environment: the installed version of the library lacks this name; install the version the code was "
         "written for"),
    Rule("TensorMismatch", "script",  # a torch op refusing the tensors it was given: the calling code's mistake
         r"Expected all tensors to be on the same device|expected scalar type \w+ but found \w+|shapes cannot be "
         r"multiplied|must match the size of tensor b|Sizes of tensors must match|Input type \([^)]*\) and weight "
         r"type \([^)]*\) should be the same|element 0 of \w+ does not require grad|has been modified by an "
         r"inplace operation|Trying to backward through the graph a second time|Target -?\d+ is out of bounds|"
         r"label value of -?\d+ which is outside the valid range|Found dtype \w+ but expected \w+|expected dtype \w+ "
         r"but got dtype \w+|"
         # an op's own check of its input's shape, as torch words it: conv's channel and rank checks, old torch's
         # linear `size mismatch, m1: [..], m2: [..]`, normalisation layers fed the wrong number of features (or
         # a batch of one in training), a pooling window larger than its input. The check runs in the library's
         # frame, but what it refuses is what the calling code passed: the model built for one shape, fed another
         r"to have \d+ channels, but got \d+ channels|Expected \d+-dimensional input for \d+-dimensional weight|"
         r"Expected \dD \(unbatched\) or \dD \(batched\) input to|size mismatch, m1: \[|"
         r"running_mean should contain \d+ elements not \d+|Expected more than 1 value per channel when training|"
         r"expected input with shape \[[^\]]*\], but got input of size|Output size is too small", 61,
         False, "the code gives an operation tensors it cannot take (device, dtype or shape): fix the model or data "
                "code (a restart fails the same way)"),
    Rule("IndexError", "script",  # the kernel's assertion names the check that failed (a label past the classes)
         r"Assertion `[^`]*` failed|thread: \[\d+,\d+,\d+\] Assertion \S[^\n]* failed", 62, False, _ASSERT),
    Rule("IndexError", "script", r"device-side assert triggered", 61, False, _ASSERT),
    Rule("BuildError", "script",
         r"(?i)Error building extension|Command '\['ninja', '-v'\]' returned non-zero|ninja: build stopped|"
         r"mismatches the version that was used to compile PyTorch|CUDA_HOME environment variable is not set|"
         r"Could not build wheels|Failed building wheel|"
         # the compiler's own refusal in a build: nvcc's and setuptools' words for it
         r"nvcc fatal\s*:|error: command '[^']*(?:gcc|g\+\+|c\+\+|nvcc|cl\.exe|clang)[^']*' failed", 61,
         False, "the environment: a compiled extension does not build (compiler or CUDA toolkit against this "
                "torch); install a prebuilt wheel or fix the toolchain"),
    Rule("InstallError", "script",  # pip found no build of a pinned package for this Python or platform
         r"Could not find a version that satisfies the requirement|No matching distribution found for", 60, False,
         "the environment: a required package has no release for this Python version or platform (an old pin, a "
         "Python too new or too old for it); use the Python version the project names, or relax the pin"),
    Rule("SharedMemoryError", "script",  # the shell's report of a bus error: torch's shared memory (/dev/shm) ran out
         _SHELL + r"[Bb]us error" + _COMMAND, 15, False,
         "the process died of a bus error (SIGBUS), which in PyTorch is shared memory (/dev/shm, where workers and "
         "share_memory() put tensors) running out, typically a container's 64 MB default: run it with a larger "
         "--shm-size (or --ipc=host); a restart fails the same way"),
    Rule("SegFault", "script",  # the shell's report: a script run on its own crashed in a native library it loaded
         _SHELL + r"[Ss]egmentation fault" + _COMMAND, 15, False,
         "a script crashed in native code (SIGSEGV) when run on its own: usually the installed versions of a native "
         "library (the framework, its CUDA build, an extension) do not match; install the versions the code was "
         "written for"),
    # The C library's and the OS's own reports of a native crash, in the words the shell's `Segmentation fault`
    # line has elsewhere: glibc aborting on a corrupted heap or stack (`double free or corruption`, `free(): invalid
    # pointer`, `*** stack smashing detected ***`), the shell's SIGFPE report, and Windows' crash codes as an IDE
    # prints the exit code (access violation 0xC0000005 = -1073741819, stack overflow 0xC00000FD, stack buffer
    # overrun 0xC0000409) or faulthandler names them (`Windows fatal exception: access violation`). Like the
    # shell's segfault line (rule above): a native library the script loaded, built against other versions.
    Rule("SegFault", "script",
         r"double free or corruption|\b(?:free|malloc|realloc|munmap_chunk)\(\): (?:invalid|corrupted)\b|"
         r"corrupted (?:size vs\. prev_size|double-linked list)|\bstack smashing detected\b|"
         + _SHELL + r"[Ff]loating point exception(?:\s*\(core dumped\))?(?:\s+\S.*)?\W{0,3}$|"
         r"exit code -10737(?:41819|40791|41571)\b|\b0x[Cc]00000(?:05|FD|fd)\b|\b0x[Cc]0000409\b|"
         r"Windows fatal exception: (?:access violation|stack overflow)|Cannot recover from stack overflow", 15,
         False,
         "a script crashed in native code (a corrupted heap or stack, SIGFPE, an access violation): usually the "
         "installed versions of a native library (the framework, its CUDA build, an extension) do not match; install "
         "the versions the code was written for"),
    Rule("IllegalInstruction", "script",  # SIGILL: a binary built for instructions this CPU does not have
         _SHELL + r"[Ii]llegal (?:hardware )?instruction" + _COMMAND + r"|"
         r"Signals\.SIGILL\b|Signal 4 \(SIGILL\)|terminated with signal SIGILL\b", 16, False,
         "a process died of an illegal instruction (SIGILL): an installed binary (the framework, an extension, a data "
         "loader compiled elsewhere) uses CPU instructions this machine lacks, or was built wrong; install or rebuild "
         "it for this CPU; a restart fails the same way"),
    Rule("SegFault", "framework",
         r"Signals\.SIGSEGV|exitcode\s*:\s*-11\b|Signal 11 \(SIGSEGV\)|Fatal Python error: Segmentation fault|"
         r"Segmentation fault|exit(?:ed with)? (?:code|status)[:= ]*139\b|Bus error \(core dumped\)|"
         r"Signals\.SIG(?:BUS|ABRT)|Aborted \(core dumped\)|Fatal Python error: Aborted|"
         + _SHELL + r"abort(?:\s*\(core dumped\))?\s{2,}\S|"  # zsh's SIGABRT report, as bash's `Aborted (core dumped)`
         r"terminated with signal SIG(?:SEGV|BUS)\b", 14, True,
         "a process crashed in native code (SIGSEGV, SIGBUS or SIGABRT): one restart; if it recurs, a library or "
         "driver mismatch (a bus error in a container: too small /dev/shm)"),
    Rule("CollectiveMismatch", "framework",  # ranks took different code paths: deterministic, a restart repeats it
         r"Detected mismatch between collectives on ranks", 41, False,
         "the ranks ran different collectives (a code path that differs between ranks: a rank-dependent branch, "
         "uneven data, a hook that runs on one rank only): fix the code; a restart fails the same way"),
    Rule("ChildFailed", "framework",  # a launcher re-raising its child's exit status (the child's error is above)
         # DeepSpeed's launcher: `[launch.py:N:sigkill_handler] [...] exits with return code = 1` (-9: Killed)
         r"sigkill_handler\][^\n]*exits with return code = (?!-9\b)-?\d+|"
         r"CalledProcessError: Command '\[[^\]]*(?:python|torchrun|deepspeed|accelerate|mpirun|srun)[^\]]*\]' "
         r"returned non-zero exit status|See root cause above|Engine core initialization failed|"
         r"TrainingFailedError|inspect the previous error messages", 10, True,
         "a rank exited; the root cause is in the lines before"),
    Rule("CalledProcessError", "script", _PY + r"CalledProcessError\b", 13, False,
         "a subprocess the script runs failed: see its output above"),
    # c10d's client logs a warning for each address it failed to connect to, then its error that none answered: the
    # error (the outcome of every try) over the warnings of the single tries, which match the rule below as well
    Rule("NetworkConfigError", "script", r"client socket has failed to connect to any network address", 53, False,
         _NO_CONNECT),
    Rule("NetworkConfigError", "script",  # a connection the job's processes could never set up: the launch's config
         r"Connect to \S+ failed\s*:\s*(?:No route to host|Network is unreachable|Cannot assign requested "
         r"address)|no socket interface found|client socket has failed to connect|Cannot assign requested address|"
         r"errno: 99\b|ssh: connect to host|(?:Connect|connect|connection) "
         r"to (?:127\.0\.0\.1|localhost|\[localhost\])\b[^\n]*(?:failed|refused)", 52, False,
         _NO_CONNECT),
    Rule("NameResolutionError", "script",  # a host name that does not resolve: the URL or address the job was given
         r"Name or service not known|nodename nor servname provided|No address associated with hostname|"
         r"Could not resolve host", 53, False,
         "a host name the job connects to does not resolve (a typo in the URL, MASTER_ADDR or tracker address, a host "
         "unknown on this network, no DNS inside the container): fix the name or the DNS; a restart fails the same way"),
    # An HTTP client that gave up on every retry without ever connecting (a connect timeout, a refused connection, the
    # proxy) fails the same way from the same machine: its network access (a proxy, a firewall, a compute node with
    # no internet), like a name that does not resolve; a read that timed out or a connection dropped once open stays
    # a transient fault (NetworkError below). Not extended to the rendezvous store's connect timeout: the seen sets
    # label that one both ways (benchmarks/results/diagnosis_round13.md).
    Rule("ServiceUnreachable", "script",  # urllib3's MaxRetryError caused by a failed connect, no read begun
         r"Max retries exceeded[^\n]*Caused by (?:ConnectTimeoutError|NewConnectionError|ProxyError)\b|"
         r"Cannot connect to proxy|"
         # the client's own exception for the connect that failed, where the log holds it and not the summary
         r"urllib3\.exceptions\.(?:ConnectTimeoutError|NewConnectionError)\b|Failed to establish a new connection|"
         r"requests\.exceptions\.ConnectTimeout\b|httpx\.Connect(?:Timeout|Error)\b|"
         r"ClientConnectorError\b|Cannot connect to host \S+:\d+", 53, False,
         "the run could not open a connection to a remote service (a model or dataset hub, a tracker) on any retry: "
         "this machine's network access (a proxy, a firewall, a compute node without internet); set the proxy "
         "(HTTPS_PROXY), use a mirror (HF_ENDPOINT) or fetch the files beforehand and run offline (HF_HUB_OFFLINE=1); "
         "a restart from the same machine fails the same way"),
    *_SETUP_AND_RESOURCE,
    *_ROUND24,
    *_OTHER_WORDS,
    # -- infrastructure: network and storage (often the consequence of a dead peer) ---------------------------
    Rule("S3StorageError", "infrastructure",
         r"botocore\.exceptions\.\w+|EndpointConnectionError|S3 ?(?:Storage)?Error|An error occurred "
         r"\((?:SlowDown|InternalError|ServiceUnavailable|RequestTimeout)\)|StorageError|s3fs[^\n]*Error", 55, True,
         "the object store failed: the run resumes from the newest committed checkpoint once it answers"),
    Rule("NetworkError", "infrastructure",  # a remote service (model or dataset hub, tracker, API) a client called
         r"RemoteDisconnected|Remote end closed connection|Read timed out|read operation timed out|"
         r"\bReadTimeout(?:Error)?\b|\b(?:408|429|500|502|503|504) (?:Client|Server) "
         r"Error|Too Many Requests|Temporary failure in name resolution|IncompleteRead|ChunkedEncodingError|"
         r"Connection aborted\.", 50, True,
         "a remote service the run calls (a model or dataset hub, a tracker, an API) timed out, refused the rate or "
         "dropped the connection: transient; resume (cache the files locally, or raise the client's timeout and "
         "retries, e.g. HF_HUB_ETAG_TIMEOUT / HF_HUB_DOWNLOAD_TIMEOUT, to ride it out)"),
    Rule("NCCLRemoteError", "infrastructure",  # what a peer's death (or a lost link) looks like from here
         r"ncclRemoteError|remote process exit(?:ing prematurely|ed)|NCCL WARN[^\n]*(?:remote|reset by peer)|"
         r"Got completion from peer|communicator was aborted|ProcessGroupNCCL is aborted|"
         r"(?:Process group|NCCL) watchdog thread terminated", 32, True,
         "a peer rank died or its link failed: run the node check, cordon the faulty node, resume"),
    Rule("NetworkError", "infrastructure",  # the proxy passing on a failure: the socket/net warning is the cause
         r"\[Proxy Service \d+\] Failed to execute operation|Proxy Call to rank \d+ failed", 31, True,
         "a network fault: run the node check on the job's nodes and resume"),
    Rule("NetworkError", "infrastructure",  # HCCL (Ascend NPUs), NCCL's counterpart: a socket that timed out
         r"Getting socket times out|\bEI000[26]\b|(?i:HCCL[^\n]*(?:socket|connect)[^\n]*(?:time|fail|refused))", 50, True,
         "a network fault between NPUs (HCCL): run the node check on the job's nodes and resume"),
    Rule("NCCLRemoteError", "infrastructure",  # HCCL's collective failing with an error code: the cause follows
         r"OPS function error: Hccl\w+, error code is \d+|HCCL error in:", 32, True,
         "a collective failed on the NPUs (HCCL): run the node check, cordon the faulty node, resume"),
    Rule("NetworkError", "infrastructure",  # NCCL's system/internal errors and its socket, net and proxy warnings
         r"NET/IB[^\n]*(?:error|Error)|ibv_\w+ failed|IBV_WC_(?!SUCCESS)\w+|ncclSystemError|unhandled system error|"
         r"ncclInternalError|(?i:NCCL error)[^\n]*internal error|NCCL WARN (?:NET|Net|Socket|socket|Call to|Connect|"
         r"connect|[Bb]ootstrap|[Pp]roxy|IB)|(?:socket|net\w*|proxy|bootstrap|ib\w*)\.cc:\d+ NCCL WARN(?! Failed to open libibverbs)|"
         r"socket(?:StartConnect|PollConnect|Progress|Connect)|Software caused connection abort|"
         r"Transport endpoint is not connected|No route to host|Network is unreachable|connectFullMesh failed|"
         r"failed to connect to all addresses|Network error \((?:ReadTimeout|ConnectionError)\)|"
         r"Call to connect returned Connection timed out|"
         r"initialization has timed out", 50, True,
         "a network fault: run the node check on the job's nodes and resume"),
    # Ray's detail under an ActorDiedError saying why the actor died: its node (or its owner's) was lost. The
    # detail states the cause the exception only wraps, so it ranks just above it; any error the node's loss
    # followed from (the host OOM killer, a hardware fault) still ranks higher.
    Rule("RayError", "infrastructure",
         r"Owner's node has crashed|because its node has died|the actor's node was preempted", 34, True,
         "the node a Ray actor (or its owner) ran on died or was taken away (a crash, the raylet killed, a lost "
         "heartbeat, a preemption): check that node (dmesg, the raylet log), then resume on healthy nodes"),
    # The raylet's own report that a worker process died (`(raylet) A worker died or was killed while executing a
    # task by an unexpected system error`): the death that the driver's ActorDiedError or ActorUnavailableError (an
    # RPC to the dead worker failing) reports from the other side; the same standing as the node's loss above.
    Rule("RayError", "infrastructure", r"A worker died or was killed", 34, True,
         "a Ray worker process died (the raylet saw it exit: the host OOM killer, a crash, a lost connection): "
         "read the dead worker's log on its node (and dmesg for the OOM killer), then resume"),
    Rule("RayError", "infrastructure",
         r"ActorDiedError|ActorUnavailableError|RayActorError|The actor died unexpectedly|RaySystemError|"
         r"ObjectLostError|NodeDiedError", 33, True,
         "a Ray worker process died (often the host OOM killer or a lost node): check its node, then resume"),
    # The store-based barrier of init_process_group timed out: this rank reached the store (it counts the workers
    # that joined, `worker_count` of `world_size`), the others never arrived. The network carried this rank's
    # connection; the missing ranks were not started (the launch: `gpus=4` run as one plain process, fewer
    # processes than the world size), died before init, or were still busy (preprocessing that outlasts the
    # process-group timeout). The launch or the script's set-up, not a fault: a restart waits the same way. Every
    # seen label of this line is the script's (sets 5, 8, 15). Tried before the rule below, which reads a rank
    # that lost a connection it had.
    Rule("RendezvousError", "script",
         r"(?i)timed out initializing process group in store based barrier", 30, False,
         "the other ranks never joined the process group (worker_count < world_size): start every rank with the "
         "launcher (torchrun --nproc_per_node, the framework's DDP launch) so the processes match the world size, "
         "check that no rank died before init_process_group, and raise its timeout where set-up (preprocessing, "
         "loading) outlasts it; a restart waits the same way"),
    Rule("ConnectionError", "infrastructure",
         r"ConnectionError|Connection (?:reset by peer|refused|timed out|closed by peer)|DistNetworkError|"
         r"DistStoreError|Broken pipe|Socket Timeout|failed to recv, got 0 bytes|waiting for clients\. \d+/\d+ clients|"
         r"TCPStore[^\n]*(?:failed|timed out)|RendezvousTimeoutError|RendezvousConnectionError|connect\(\) timed out|"
         r"socket has timed out|errno: 113|\bECONNRE(?:SET|FUSED)\b|store based barrier|Timed out initializing "
         r"process group|RendezvousClosedError|"
         # the coordination service of XLA's runtime (JAX, TensorFlow) giving up on a barrier the tasks meet at (the
         # start-up registration of every task, a shutdown barrier): a task never reached it, as torch's rendezvous
         r"DEADLINE_EXCEEDED:[^\n]*\bBarrier timed out\b|"
         # ... or its agent giving up on a call to the leader (RegisterTask at start-up): the task never reached it
         r"Coordination service agent in error status: DEADLINE_EXCEEDED|RegisterTask[^\n]*DEADLINE_EXCEEDED", 30, True,
         "a rank lost its connection (often to a peer that died first): check the earliest failure, resume"),
    # -- symptoms ----------------------------------------------------------------------------------------------
    Rule("NCCLTimeoutError", "infrastructure",
         r"Watchdog caught collective operation timeout|NCCL timeout|ProcessGroupNCCL[^\n]*Timeout(?! at NCCL work)|"
         r"collective operation timeout|Timed out waiting \d+ms for|watchdog got stuck|"
         r"watchdog hang|Heartbeat monitor timed out|Stream synchronize timeout|stream sync timeout", 20, True,
         "a collective timed out (a rank hung or died): run the node check on the job's nodes and resume"),
    Rule("NCCLTimeoutError", "infrastructure",  # the watchdog's summary: below the line that names the collective
         r"Timeout at NCCL work|Exception \(either an error or timeout\) detected by watchdog", 19, True,
         "a collective timed out (a rank hung or died): run the node check on the job's nodes and resume"),
    # Slurm's report of one step cancelled at the limit (`*** STEP 174464.0 ON west1 CANCELLED AT ...`), printed
    # with or before its report of the job (`*** JOB 174464 ...`): the job's line states the event, the step's yields
    Rule("TimeLimit", "infrastructure", r"\*\*\* STEP \S+ ON \S+ CANCELLED AT \S+ DUE TO TIME LIMIT", 18, True,
         _TIME_LIMIT),
    Rule("TimeLimit", "infrastructure",  # Slurm's, PBS's and LSF's words for the wall-time limit
         r"DUE TO TIME LIMIT|PBS: job killed: walltime \d+ exceeded limit|TERM_RUNLIMIT|reaching LSF run time limit",
         19, True, _TIME_LIMIT),
    Rule("Hang", "infrastructure", r"frenzy-hang: ", 18, True,
         "no progress for too long: killed; treated as a node fault, the node check runs and training resumes"),
    Rule("Hangup", "script",  # the terminal the job ran in went away: the way it was launched, not a fault
         r"Received 1 death signal|closing signal SIGHUP|got signal: 1\b|Signals\.SIGHUP|\bSIGHUP\b", 41, False,
         "the job got SIGHUP: the terminal or SSH session it was started from closed and took it down; launch it "
         "detached (nohup, tmux/screen, a batch scheduler) and resume from the newest checkpoint"),
    Rule("Killed", "framework",
         r"exitcode\s*:\s*-9\b|\d+ Killed\s+\S*python|line \d+:\s+\d+\s+Killed\s+\S|"  # bash's job report
         r"^\W{0,3}(?:[Kk]illed|已杀死|已終止|Getötet|Processus arrêté)\W{0,3}$|"
         # zsh's and a job report's words for it, with the command after (`zsh: killed     python train.py`,
         # `[1]    2231 killed     python train.py`): only after a shell's prefix, padded to the command's column
         r"^\W{0,3}(?:zsh: |\[\d+\]\s*[+-]?\s+(?:\d+\s+)?)[Kk]illed\s{2,}\S|"
         r"(?:\w/s|s/\w+|\d%)\]?\s*Killed\s*$|srun: error: \S+: tasks? [\d,-]+: Killed\s*$|"
         r"exit(?:ed with)? (?:code|status)[:= ]*137\b|"
         r"WTERMSIG 9\b|return code = -9\b|error code -9\b|terminated with signal SIGKILL|killed by signal:? "
         r"(?:9\b|SIGKILL)|signal 9 \(SIGKILL\)", 12, True,
         "a rank was SIGKILLed with no error of its own: the host OOM killer or a lost node; resumed once, and if it "
         "recurs, check dmesg for the OOM killer (fewer data-loader workers, less CPU offload)"),
    Rule("ChildFailed", "framework",
         r"ChildFailedError|exitcode\s*:\s*-?\d+|failed \(exitcode: -?\d+\)|signal \d+ \(SIG\w+\) received|"
         r"trainer exited with signal \d+", 10, True,
         "a rank exited; the root cause is in the lines before"),
    # -- generic: an exception class alone, tried only where no rule above names the line; the user's code,
    # config or data, unless a library's own check or runtime raised it (AssertionError, RuntimeError) --------
    Rule("NameError", "script", _PY + r"NameError\b", 62, False, "fix the script: an undefined name", blame=True),
    Rule("KeyError", "script", _PY + r"KeyError\b", 61, False, "fix the script or config: a missing key", blame=True),
    Rule("TypeError", "script", _PY + r"TypeError\b", 61, False, "fix the script: a wrong type", blame=True),
    Rule("IndexError", "script", _PY + r"IndexError\b", 61, False, "fix the script or data: an index out of range",
         blame=True),
    Rule("AssertionError", "framework", _PY + r"AssertionError\b", 45, False,
         "an assertion in the training code failed: fix the code or config", blame=True),
    Rule("AttributeError", "script", _PY + r"AttributeError\b", 45, False, "fix the code: a missing attribute",
         blame=True),
    Rule("ValueError", "script", _PY + r"ValueError\b", 44, False,
         "fix the value named in the message (the config, the arguments or the data given)", blame=True),
    Rule("RuntimeError", "framework", _PY + r"RuntimeError\b", 40, True,
         "an unclassified runtime error: one restart from the newest checkpoint, then stop", blame=True),
    Rule("UncaughtException", "script",
         r"^\s*(?:\[(?:rank|Rank|default)\s*\d+\]:\s*)?(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::|\s*$)", 39,
         False, "an exception no rule classifies ended the run: read it and its traceback (the script's own file: "
                "fix the code; a library: check its version and the arguments given to it)", blame=True),
    *_ANY_WORDS,
]


DIVERGENCE = Rule("NumericalError", "framework", r"(?!)", 77, False,
                  "the loss became NaN/inf at this line and stayed so (the run printed it, raised nothing): lower the "
                  "learning rate, use bf16 or gradient clipping, and resume from a checkpoint before this step")
"""The failure a run's progress lines show without any error line (tasks/diagnosis/progress.py); it names no line
by pattern, and ranks one below the NumericalError rule: a line that says the loss diverged ("Loss is nan,
stopping training") is the root cause where the run printed one."""
CONTENT = [r for r in RULES if not r.blame]
GENERIC = [r for r in RULES if r.blame]

LEARNED_PRIORITY = 5
"""Learned rules rank below every built-in rule (the lowest built-in, ChildFailed, is 10), and a built-in rule
names a line before any learned one is tried, so a learned rule can only name lines nothing built-in explains."""
MAX_LEARNED_PATTERN = 512
_NUMBER = r"(?:0x[0-9a-fA-F]+|\d+)"
_LITERAL = re.compile(r"(?:\\.|[^\\.^$*+?{}\[\]|()])*")


def safe_pattern(pattern: str) -> bool:
    """A learned pattern is an escaped literal with number wildcards (what the agent writes) and nothing else:
    matching it is linear in the line, so a poisoned rules file cannot hang the diagnosis with a pattern such as
    `(a+)+$`, and at least 20 literal characters so it cannot match everything."""
    if not isinstance(pattern, str) or len(pattern) > MAX_LEARNED_PATTERN:
        return False
    rest = pattern.replace(_NUMBER, "")
    return bool(_LITERAL.fullmatch(rest)) and len(re.sub(r"\\(.)", r"\1", rest).strip()) >= 20


def learned_rules() -> list[Rule]:
    """Rules the LLM agent taught (tasks/diagnosis/agent.py), from `$FRENZY_HOME/diagnosis-rules.jsonl`, confined:
    only a built-in failure type, its category, a safe literal pattern (`safe_pattern`), the lowest priority, and
    an infrastructure type stays restartable. An entry that breaks any of these is skipped with a warning naming
    the file and line."""
    import json
    import logging

    from tasks.pathvars import frenzy_home
    path = frenzy_home() / "diagnosis-rules.jsonl"
    base = {r.type: r for r in RULES}
    out = []
    try:
        text = path.read_text(errors="replace") if path.is_file() else ""
    except OSError as e:
        logging.getLogger(__name__).warning("learned diagnosis rules %s unreadable (%s); skipped", path, e)
        return out
    for no, ln in enumerate(text.splitlines(), 1):
        try:
            d = json.loads(ln)
            b = base[d["type"]]
            if not safe_pattern(d["pattern"]):
                raise ValueError("the pattern is not an escaped literal of 20+ characters")
            restartable = b.restartable if b.category == "infrastructure" else bool(d["restartable"])
            mitigation = re.sub(r"[\x00-\x1f\x7f]", " ", str(d.get("mitigation") or b.mitigation))[:500]
            out.append(Rule(b.type, b.category, d["pattern"], LEARNED_PRIORITY, restartable, mitigation))
        except (ValueError, KeyError, TypeError, re.error) as e:
            logging.getLogger(__name__).warning("%s line %d: learned rule skipped (%s); delete the line or the file",
                                                path, no, e)
    return out


ERROR_KEYWORDS: tuple[bytes, ...] = (
    b"error", b"exception", b"traceback", b"failed", b"fatal", b"killed", b"xid", b"nccl warn", b"timeout",
    b"timed out", b"refused", b"panic", b"out of memory", b"ecc", b"nvlink", b"fallen off", b"exitcode",
    b"root cause", b"invalid", b"denied", b"no such file", b"not found", b"segmentation fault", b"core dumped",
    b"abort", b"machine check", b"frenzy-hang", b"reset by peer", b"broken pipe", b"unreachable",
    b"exited with signal", b"no space left", b"quota", b"input/output", b"stale", b"undefined symbol",
    b"shared object", b"misconfiguration", b"kv cache", b"oom", b"time limit", b"died", b"loss scale",
    b"infinite or nan", b"cuda failure", b"unable to determine", b"sigkill", b"size mismatch", b"assertion",
    b"sigsegv", b"segmentation", b"illegal hardware", b"driver", b"couldn't connect", b"huggingface.co", b"building extension",
    b"caused by", b"what()", b"no module named", b"cannot import", b"keyword argument", b"positional argument",
    b"bad_alloc", b"cannot allocate", b"already in use", b"closed by", b"connection abort", b"not connected",
    b"no route", b"shared memory", b"ordinal", b"ibv_", b"non-finite", b"contains nan", b"contains inf",
    b"has no attribute", b"dll load", b"socket timeout", b"waiting for clients", b"got 0 bytes", b"econnre",
    b"eaddrinuse", b"shm_open", b"/dev/shm", b"returned nan", b"not compiled with cuda",
    b"no cuda gpus", b"kernel image", b"sm_", b"compute capability", b"ampere", b"currently imported",
    b"recognize this architecture", b"cuda_home", b"wheel", b"same device", b"scalar type", b"shapes cannot",
    b"must match", b"does not require grad", b"inplace operation", b"backward through", b"out of bounds",
    b"bus error", b"aborted", b"sigabrt", b"root cause above", b"trainingfailed", b"previous error",
    b"barrier", b"rendezvous", b"heartbeat", b"preemption", b"spot instance", b"node failure", b"exit code",
    b"exit status", b"encountered", b"exited with", b"nan loss", b"inf loss", b"nan value", b"inf value",
    b"wtermsig", b"did not contain", b"cuda setup", b"low on resource", b"loss_scale", b"preempted", b"requeue",
    b"not supported", b"n't support", b"not support", b"receive grad", b"reduction in the prior",
    b"not used in producing", b"socket interface", b"cannot assign requested", b"ssh: connect",
    b"remote end closed", b"remotedisconnected", b"too many requests", b"name or service", b"nodename nor servname",
    b"address associated with hostname", b"resolve host", b"name resolution", b"incompleteread", b"return code",
    b"valid range", b"connection aborted",
    b"device lost", b"gpu reset", b"page fault", b"gpu hang", b"loss is nan", b"loss is inf", b"times out", b"hccl", b"imminent",
    b"lame worker", b"diverged", b"mismatch between collectives", b"rminitadapter", b"rm_init_adapter",
    b"attach gpu", b"gpu is lost", b"overflow", b"divisible", b"multiple of", b"api_key", b"api key",
    b"unauthorized", b"invalid token", b"memory pressure", b"death signal", b"sighup", b"identify image",
    b"image file", b"dtype", b"connect to proxy", b"illegal instruction", b"sigill", b"too many", b"memory limit",
    "已杀死".encode(), "已終止".encode(), "getötet".encode(), "arrêté".encode(), b"stream sync", b"</torch_",
    b"all available ram", b"more memory than", b"nan detected", b"inf detected", b"nan in ", b"inf in ", b"nan or inf",
    b"nans in", b"infs in", b"nan found", b"inf found", b"has nan", b"have nan", b"had nan", b"contain nan",
    b"has inf", b"not finite", b"became nan", b"became inf", b"unable to allocate", b"establish a new connection",
    b"cannot connect", b"connecttimeout", b"double free", b"free(): ", b"corrupted", b"stack smashing",
    b"floating point exception", b"walltime", b"runlimit", b"run time limit", b"memlimit",
    b"memory usage limit", b" spot", b"nvcc fatal", b"satisfies the requirement",
    b"matching distribution", b"badzipfile", b"windows fatal", b"tensor had", b"summary histogram", b"preempted",
    b"pthread_create", b"start new thread", b"stack overflow", b"compiled using numpy", b"critical", b"check failed",
    b"on signal", b"signals.sig", b"sigterm", b"memory access fault", b"has been shut down",
    b"not recognized", "未找到命令".encode(), "找不到命令".encode(), "命令找不到".encode(),
    "コマンドが見つかりません".encode(), b"befehl nicht gefunden", b"commande introuvable", "no se encontró".encode(),
    b"orden no encontrada", "comando não encontrado".encode(), b"comando non trovato", "команда не найдена".encode())
"""Lines worth keeping in compression and trying rules on (lower-case substrings): cheap to find (`bytes.find`,
in C), a superset of what the rules match. They are looked for in templates whose digits are 0, so no keyword holds
another digit."""
