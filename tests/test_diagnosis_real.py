"""Issue 29's real-log benchmark as a test: the test half's figures hold (they fail if a rule regresses), every rule
family added for it is exercised on a real line of the tune half, the recovery policy acts on real logs, and the
learned fallback answers only above its calibrated threshold."""

from __future__ import annotations

import pytest

from tasks.diagnosis.diagnose import diagnose
from tasks.diagnosis.realbench import REAL, half_of, load, run, score
from tasks.diagnosis.recovery import decide


@pytest.fixture(scope="module")
def test_half():
    return score(run(load("test"), diagnose))


def test_the_corpus_is_real_sized_and_split_by_project():
    logs = load()
    assert len(logs) >= 150 and len({lg.project for lg in logs}) >= 12
    tune, test = load("tune"), load("test")
    assert {lg.project for lg in tune}.isdisjoint({lg.project for lg in test})
    assert all(lg.path.is_file() and lg.root_line in lg.path.read_text() for lg in logs)
    assert (REAL / "PROVENANCE.md").is_file() and all(lg.url.startswith("https://github.com/") for lg in logs)


def test_the_test_half_holds_its_recorded_figures(test_half):
    """Issue 45's targets (category 90%, root line 85%, unknown 3%) are not met on the test half grown to 169 logs
    (86.4% / 87.0% / 5.9%, benchmarks/results/diagnosis_real.md): this guards the recorded figures, and the 0.85
    precision target that is met, against a regression."""
    assert test_half.category_accuracy >= 0.86, test_half.by_type
    assert test_half.root_line_accuracy >= 0.85, test_half.by_type
    assert test_half.unknown_rate <= 0.06
    assert min(test_half.precision.values()) >= 0.85, test_half.precision


def _tune(log_id: str):
    lg = next(lg for lg in load("tune") if lg.id == log_id)
    assert half_of(lg.project) == "tune"
    return lg


# every rule family added for issue 29, on a real log of the tune half: (log, type, category, restartable)
@pytest.mark.parametrize(("log_id", "type_", "category", "restartable"), [
    ("databrickslabs__dolly/139", "DiskFull", "infrastructure", False),  # ENOSPC
    ("hiyouga__llamafactory/5155", "DiskFull", "infrastructure", False),  # StorageFull inside a SafetensorError
    ("ymcui__chinese-llama-alpaca/534", "NumericalError", "framework", False),  # fp16 loss scale at its floor
    ("ziqihuangg__reversion/6", "ModelLoadingError", "script", False),  # tokenizer
    ("optimalscale__lmflow/532", "ModelLoadingError", "script", False),  # hub unreachable, no local copy
    ("kohya-ss__sd-scripts/789", "ModelLoadingError", "script", False),  # size mismatch split over lines
    ("dao-ailab__flash-attention/1691", "ImportError", "script", False),  # undefined symbol: ABI mismatch
    ("vllm-project__vllm/2418", "ConfigError", "script", False),  # KV cache smaller than max_model_len
    ("rhasspy__piper/118", "ConfigError", "script", False),  # the exception line, not `raise ...(`
    ("nextflow-io__nextflow/5932", "HostOOM", "framework", False),  # Slurm cgroup OOM kill
    ("hkust-nlp__simplerl-reason/25", "RayError", "infrastructure", True),
    ("nvidia__nvsentinel/155", "NodeFailure", "infrastructure", True),  # fell off the bus, no Xid
    ("pku-yuangroup__open-sora-plan/386", "OutOfMemoryError", "framework", True),  # NCCL's Cuda failure OOM
    ("theatticusproject__cuad/9", "CUDAError", "infrastructure", True),  # NCCL unhandled cuda error
    ("om-ai-lab__vlm-r1/257", "NCCLTimeoutError", "infrastructure", True),  # watchdog heartbeat
    ("rikdz__graphwriter/6", "DriverError", "script", False),
    ("databrickslabs__dolly/156", "BuildError", "script", False),
    ("facebookresearch__maskrcnn-benchmark/400", "SegFault", "framework", True),
    ("huggingface__trl/1995", "IndexError", "script", False),  # the device assertion itself
    ("huggingface__pytorch-image-models/1269", "DataloaderKilled", "framework", True),
    ("rhasspy__piper/118-2", "AttributeError", "script", False),  # raised in the script's own frame
])
def test_each_new_rule_family_on_a_real_tune_log(log_id, type_, category, restartable):
    lg = _tune(log_id)
    d = diagnose(lg.path, use_fallback=False)
    assert (d.type, d.category, d.restartable) == (type_, category, restartable), d.root_cause_line
    assert lg.root_line in (d.root_cause_line or "")


def test_the_cause_outranks_its_symptoms_on_real_logs():
    # ECC error first, the NCCL watchdog's exception after it: the ECC line is the cause
    d = diagnose(next(lg for lg in load() if lg.id == "kohya-ss__sd-scripts/1434-2").path)
    assert d.type == "ECCError" and any(e.type == "NCCLTimeoutError" or e.type == "ECCError" for e in d.evidence)
    # across ranks, the earliest timestamp names the first rank to fail, not the first line in the file
    d = diagnose(next(lg for lg in load() if lg.id == "snowflakedb__arctictraining/219").path)
    assert d.rank == 2 and "05:06:30" in d.root_cause_line


@pytest.mark.parametrize(("log_id", "kind", "node_check"), [
    ("nvidia__nvsentinel/155", "resume", True),  # a GPU fell off the bus: node check, cordon, resume
    ("theatticusproject__cuad/9", "resume", True),
    ("deepseek-ai__deepseek-coder/78", "replan", False),  # CUDA OOM: the next plan with more memory per GPU
    ("databrickslabs__dolly/139", "stop", False),  # a full disk fails again until space is freed
    ("ziqihuangg__reversion/6", "stop", False),  # a loading error is the script's: stop with the cause
    ("dao-ailab__flash-attention/1691", "stop", False),
])
def test_the_recovery_policy_on_real_logs(log_id, kind, node_check):
    d = diagnose(next(lg for lg in load() if lg.id == log_id).path)
    a = decide(d, restarts_done=0, max_restarts=2)
    assert (a.kind, a.node_check) == (kind, node_check), a.reason


def test_the_learned_fallback_answers_above_its_threshold_and_abstains_below():
    from tasks.diagnosis.fallback import Fallback

    model = Fallback.load()
    assert model is not None and 0 < model.threshold < 1
    lg = _tune("databrickslabs__dolly/139")
    v = model.predict([(1, ln) for ln in lg.path.read_text().splitlines()])
    assert v is not None and v.category == "infrastructure" and v.confidence >= model.threshold
    assert model.predict([(1, "[rank3]: gpu-b12-1: the quantum flux capacitor hiccupped, error 77")]) is None
    d = diagnose(b"step 1 loss 2.0\nsomething odd happened, error code 4\n")
    assert d.category == "unknown" and d.source == "rules"


def test_a_log_only_the_fallback_explains_says_so(tmp_path):
    # a data-loader death worded so that no rule matches: the nearest labelled logs (killed workers: the red-team
    # sets label most of them the host's OOM killer's work) vote framework
    p = tmp_path / "train.log"
    p.write_text("step 9 loss 2.0\n[rank0]: DataLoader worker is gone: killed by signal\n")
    d = diagnose(p)
    assert (d.source, d.category) == ("learned", "framework")
    assert d.type in {"HostOOM", "HostOutOfMemoryError", "DataloaderKilled"}
    assert d.confidence is not None and "most like" in d.mitigation and d.line_no == 2
    assert diagnose(p, use_fallback=False).category == "unknown"


@pytest.mark.parametrize(("line", "type_", "category"), [
    # families without a tune-half log; the lines are written here in the formats Slurm and errno print
    (b"slurmstepd: error: *** JOB 77 ON node-3 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***", "TimeLimit",
     "infrastructure"),
    (b"OSError: [Errno 122] Disk quota exceeded: '/ckpt/step_100'", "DiskFull", "infrastructure"),
    (b"OSError: [Errno 116] Stale file handle: '/nfs/ckpt'", "StorageError", "infrastructure"),
])
def test_families_without_a_tune_log(line, type_, category):
    d = diagnose(line + b"\n", use_fallback=False)
    assert (d.type, d.category) == (type_, category)


def test_learned_rules_are_confined(tmp_path, monkeypatch):
    from tasks.diagnosis.agent import AgentVerdict, learn
    from tasks.diagnosis.rules import LEARNED_PRIORITY, learned_rules

    monkeypatch.setenv("FRENZY_HOME", str(tmp_path))

    def verdict(type_: str, line: str, restartable: bool = False) -> AgentVerdict:
        return AgentVerdict(type=type_, category="x", line=line, restartable=restartable, mitigation="\x1b[2Jstop",
                            votes=3, samples=3)

    # a benign start-up warning every healthy run prints: the rule would fire on every log
    assert learn(verdict("NodeFailure", "The client socket has failed to connect to [localhost]:29500 (errno: 99 "
                                        "- Cannot assign requested address).")) is None
    # a labelled real log says this line is infrastructure (a full disk): a script rule for it contradicts the label
    assert learn(verdict("KeyError", "OSError: [Errno 28] No space left on device")) is None
    ok = learn(verdict("ECCError", "gpu-b12-1: thermal slowdown engaged, clocks fell to 300 MHz (error 77)"))
    assert ok is not None and ok.priority == LEARNED_PRIORITY and ok.restartable  # infrastructure stays restartable
    (rule,) = learned_rules()
    assert rule.pattern == ok.pattern and "\x1b" not in rule.mitigation and rule.priority < 10


def test_a_labelled_root_line_matches_whatever_its_leading_whitespace():
    """Labels copy a log line as it stands (`  what():  CUDA error ...` under a C++ abort); the diagnosis answers the
    line stripped. The benchmarks' comparison strips the label too, or a right answer is scored a miss."""
    from tasks.diagnosis.realbench import Outcome, RealLog

    log = RealLog(id="x/1", project="x", url="", type="cuda_error", category="infrastructure", restartable=True,
                  root_line="  what():  CUDA error: an illegal memory access was encountered", label_source="", trim="")
    hit = Outcome(log, "infrastructure", "cuda_error", "what():  CUDA error: an illegal memory access was encountered",
                  True, "rule")
    assert hit.root_ok
    assert not Outcome(log, "infrastructure", "cuda_error", "Aborted (core dumped)", True, "rule").root_ok
