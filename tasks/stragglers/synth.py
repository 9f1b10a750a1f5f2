"""Synthetic training traces: pipeline schedules executed by an independent interpreter, with injected stragglers.

Every pipeline stage runs a program (the instruction order of Megatron's 1F1B, GPipe, or Megatron's interleaved
1F1B) of compute, p2p and collective instructions. The interpreter is vectorised over (step, DP rank): a p2p
transfer starts when both ends have posted and takes the link time; a collective starts when its last member
posts. It shares no code with the analysis (`model.py`, `simulate.py`), so the analysis can be checked against
it: `ground_truth` replays the same programs with chosen durations to give the true slowdowns.

1F1B uses Megatron's blocking, batched p2p (`send_forward_recv_backward` is one batch whose two rows have the
same timing); GPipe and interleaved use non-blocking sends and blocking receives, waited for before the end of
the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.errors import FrenzyError
from tasks.stragglers.trace import LOCAL, OPTYPES, JobMeta


class SlowWorker(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    dp: int = Field(ge=0)
    stage: int = Field(ge=0)
    factor: float = Field(gt=0)


class SlowStage(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    stage: int = Field(ge=0)
    factor: float = Field(gt=0)


class SlowLink(BaseModel):
    """The p2p link between `stage` and `stage + 1` (both directions)."""

    model_config = ConfigDict(allow_inf_nan=False)

    stage: int = Field(ge=0)
    factor: float = Field(gt=0)


MAX_COMPUTE_OPS = 20_000_000
"""The largest synthetic trace (forward and backward ops); about 1 GB of parquet and minutes to generate."""


class SynthSpec(BaseModel):
    """A synthetic job: layout, schedule, per-op times (seconds) and injected stragglers."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    schedule: Literal["1f1b", "gpipe", "interleaved"] = "1f1b"
    dp: int = Field(4, ge=1, le=4096)
    pp: int = Field(4, ge=1, le=127)
    vpp: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    microbatches: int = Field(8, ge=1, le=127)
    steps: int = Field(10, ge=1, le=100_000)
    fwd_s: float = Field(0.010, gt=0, description="forward of one micro-batch on one stage (all its chunks)")
    bwd_s: float = Field(0.020, gt=0)
    p2p_s: float = Field(0.0005, ge=0)
    dp_mode: Literal["allreduce", "zero"] = "allreduce"
    dp_comm_s: float = Field(0.004, ge=0, description="gradient all-reduce per stage (zero: AG and RS each)")
    optimizer_s: float = Field(0.003, ge=0)
    clip_s: float = Field(0.0003, ge=0)
    embedding_s: float = Field(0.0005, ge=0)
    noise: float = Field(0.02, ge=0, le=0.5, description="relative s.d. of every duration")
    launch_delay_s: float = Field(2e-5, ge=0, description="mean CPU gap before each op (exponential)")
    slow_worker: SlowWorker | None = None
    slow_stage: SlowStage | None = None
    seq_imbalance: float = Field(0.0, ge=0, le=2.0, description="s.d. of log compute time per (step, DP rank)")
    slow_link: SlowLink | None = None
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> SynthSpec:
        if self.schedule == "interleaved":
            if self.vpp < 2:
                self.vpp = 2
            if self.microbatches % self.pp:
                raise ValueError(f"interleaved needs microbatches divisible by pp ({self.microbatches} % {self.pp})")
        elif self.vpp != 1:
            raise ValueError(f"vpp={self.vpp} needs schedule: interleaved")
        for what, x in (("slow_worker", self.slow_worker), ("slow_stage", self.slow_stage),
                        ("slow_link", self.slow_link)):
            if x is not None and x.stage >= self.pp:
                raise ValueError(f"--{what.replace('_', '-')} ({what}.stage): stage {x.stage} is out of range "
                                 f"0..{self.pp - 1} for --pp {self.pp}; give a stage below pp")
        if self.slow_worker is not None and self.slow_worker.dp >= self.dp:
            raise ValueError(f"--slow-worker (slow_worker.dp): DP rank {self.slow_worker.dp} is out of range "
                             f"0..{self.dp - 1} for --dp {self.dp}; give a rank below dp")
        ops = 2 * self.steps * self.dp * self.pp * self.vpp * self.microbatches
        if ops > MAX_COMPUTE_OPS:
            raise ValueError(f"{self.steps} steps x {self.dp} DP ranks x {self.pp * self.vpp} stages x "
                             f"{self.microbatches} micro-batches is {ops:,} compute ops, more than the "
                             f"{MAX_COMPUTE_OPS:,} a synthetic trace may hold; lower --steps or the layout")
        return self

    @property
    def meta(self) -> JobMeta:
        return JobMeta(trial_name=f"synth-{self.schedule}", run_id=f"synth-{self.schedule}-{self.seed}",
                       dp_size=self.dp, pp_size=self.pp, tp_size=self.tp, vpp_size=self.vpp,
                       world_size=self.dp * self.pp * self.tp)


@dataclass
class Op:
    stage: int
    optype: str
    seq_id: int
    mc: int = 0
    mb_id: int = -1
    kind: str = "local"  # local | p2p | dp | stagecoll
    key: tuple = ()  # p2p: (direction, micro-batch, receiving global stage); stagecoll: (optype, seq)
    base: float = 0.0


@dataclass
class Program:
    spec: SynthSpec
    ops: list[Op] = field(default_factory=list)
    code: list[list[tuple[str, list[int]]]] = field(default_factory=list)  # per stage: (instr, op ids)


class _StageCode:
    """One pipeline stage's instruction list while it is built; op ids index the shared `prog.ops`."""

    def __init__(self, prog: Program, r: int) -> None:
        self.prog, self.spec, self.r = prog, prog.spec, r
        self.seq: dict[str, int] = {}
        self.code: list[tuple[str, list[int]]] = []
        self.pending: list[int] = []  # non-blocking sends and reduce-scatters, waited for at the end of the step

    def new(self, optype: str, **kw: object) -> int:
        s = self.seq.get(optype, 0)
        self.seq[optype] = s + 1
        self.prog.ops.append(Op(self.r, optype, s, **kw))
        return len(self.prog.ops) - 1

    def p2p(self, direction: str, send: bool, mb: int, c: int) -> list[int]:
        """The send or receive of micro-batch `mb`'s chunk `c` (none at the ends of the global pipeline)."""
        P, V = self.spec.pp, self.spec.vpp
        g = c * P + self.r
        if direction == "f":
            dest = g + 1 if send else g
            ok = g + 1 < P * V if send else g > 0
        else:
            dest = g - 1 if send else g
            ok = g > 0 if send else g + 1 < P * V
        if not ok:
            return []
        name = ("forward" if direction == "f" else "backward") + ("-send" if send else "-recv")
        return [self.new(name, mc=c, kind="p2p", key=(direction, mb, dest), base=self.spec.p2p_s)]

    def compute(self, fwd: bool, mb: int, c: int) -> None:
        base = (self.spec.fwd_s if fwd else self.spec.bwd_s) / self.spec.vpp
        self.code.append(("compute", [self.new("forward-compute" if fwd else "backward-compute", mc=c, mb_id=mb,
                                               base=base)]))

    def blocking(self, ops: list[int]) -> None:
        if ops:
            self.code.extend([("post", ops), ("wait", ops)])


def _one_f_one_b(sc: _StageCode) -> None:
    """Megatron's 1F1B: warm-up forwards, steady one-forward-one-backward with batched p2p, cool-down backwards."""
    P, M = sc.spec.pp, sc.spec.microbatches
    W = min(P - sc.r - 1, M)
    R = M - W
    for i in range(W):
        sc.blocking(sc.p2p("f", False, i, 0))
        sc.compute(True, i, 0)
        sc.blocking(sc.p2p("f", True, i, 0))
    if R > 0:
        sc.blocking(sc.p2p("f", False, W, 0))
    for i in range(R):
        sc.compute(True, W + i, 0)
        sc.blocking(sc.p2p("f", True, W + i, 0) + sc.p2p("b", False, i, 0))
        sc.compute(False, i, 0)
        nxt = [] if i == R - 1 else sc.p2p("f", False, W + i + 1, 0)
        sc.blocking(sc.p2p("b", True, i, 0) + nxt)
    for i in range(W):
        sc.blocking(sc.p2p("b", False, R + i, 0))
        sc.compute(False, R + i, 0)
        sc.blocking(sc.p2p("b", True, R + i, 0))


def _nonblocking_schedule(sc: _StageCode) -> None:
    """GPipe (all forwards, then all backwards) or Megatron's interleaved 1F1B: blocking receives, sends posted
    and left pending."""
    P, V, M = sc.spec.pp, sc.spec.vpp, sc.spec.microbatches
    if sc.spec.schedule == "gpipe":
        fwd = [(i, 0) for i in range(M)]
        order = [("F", k) for k in range(M)] + [("B", k) for k in range(M)]
        bwd = fwd
    else:
        table = [(mb, c) for g0 in range(0, M, P) for c in range(V) for mb in range(g0, g0 + P)]
        fwd = table
        bwd = [(mb, V - 1 - c) for mb, c in table]
        T = len(table)
        W = min(2 * (P - sc.r - 1) + (V - 1) * P, T)
        R = T - W
        order = ([("F", k) for k in range(W)]
                 + [x for i in range(R) for x in (("F", W + i), ("B", i))]
                 + [("B", k) for k in range(R, T)])
    for what, k in order:
        mb, c = fwd[k] if what == "F" else bwd[k]
        d = "f" if what == "F" else "b"
        sc.blocking(sc.p2p(d, False, mb, c))
        sc.compute(what == "F", mb, c)
        sends = sc.p2p(d, True, mb, c)
        if sends:
            sc.code.append(("post", sends))
            sc.pending += sends


def _zero_collectives(sc: _StageCode) -> None:
    """ZeRO: every chunk's parameter all-gather posted at the start of the step and waited for before its first
    forward; its gradient reduce-scatter posted after its last backward."""
    V, dp_comm_s = sc.spec.vpp, sc.spec.dp_comm_s
    ags = [sc.new("params-all-gather", mc=c, kind="dp", base=dp_comm_s / V) for c in range(V)]
    first_f: dict[int, int] = {}
    last_b: dict[int, int] = {}
    for i, (ins, ops) in enumerate(sc.code):
        if ins == "compute":
            op = sc.prog.ops[ops[0]]
            if op.optype == "forward-compute":
                first_f.setdefault(op.mc, i)
            else:
                last_b[op.mc] = i
    new_code: list[tuple[str, list[int]]] = [("post", ags)]
    for i, ins in enumerate(sc.code):
        new_code += [("wait", [ags[c]]) for c, j in first_f.items() if j == i]
        new_code.append(ins)
        for c, j in last_b.items():
            if j == i:
                rs = sc.new("grads-reduce-scatter", mc=c, kind="dp", base=dp_comm_s / V)
                new_code.append(("post", [rs]))
                sc.pending.append(rs)
    sc.code = new_code


def _step_end(sc: _StageCode) -> None:
    """After the schedule: wait for pending sends, then the gradient collectives and the optimizer step."""
    spec, P, r, code = sc.spec, sc.spec.pp, sc.r, sc.code
    if sc.pending:
        code.append(("waitall", list(sc.pending)))
    if P > 1 and spec.embedding_s > 0 and r in (0, P - 1):
        code.append(("coll", [sc.new("embedding-grads-all-reduce", kind="stagecoll", key=("emb", 0),
                                     base=spec.embedding_s)]))
    if spec.dp_mode == "allreduce" and spec.dp > 1:
        code.append(("coll", [sc.new("separate-grads-all-reduce", kind="dp", base=spec.dp_comm_s)]))
    if P > 1 and spec.clip_s > 0:
        code.append(("coll", [sc.new("optimizer-clip-main-grad", kind="stagecoll", key=("clip", 0),
                                     base=spec.clip_s)]))
    if spec.optimizer_s > 0:
        code.append(("compute", [sc.new("optimizer", base=spec.optimizer_s)]))


def build_program(spec: SynthSpec) -> Program:
    """The per-stage instruction lists of the spec's schedule."""
    prog = Program(spec)
    for r in range(spec.pp):
        sc = _StageCode(prog, r)
        if spec.schedule == "1f1b":
            _one_f_one_b(sc)
        else:
            _nonblocking_schedule(sc)
        if spec.dp_mode == "zero":
            _zero_collectives(sc)
        _step_end(sc)
        prog.code.append(sc.code)
    return prog


class Deadlock(FrenzyError, RuntimeError):
    pass


def draw(prog: Program, rng: np.random.Generator) -> tuple[list[np.ndarray], list[list[np.ndarray | float]]]:
    """Durations per op (transfer time for communication) and launch delays per instruction, each (steps, dp)."""
    spec = prog.spec
    shape = (spec.steps, spec.dp)
    imbalance = np.exp(rng.normal(0.0, spec.seq_imbalance, shape)) if spec.seq_imbalance > 0 else None
    durs = []
    for op in prog.ops:
        x = op.base * np.clip(1.0 + spec.noise * rng.standard_normal(shape), 0.2, None)
        if op.optype in ("forward-compute", "backward-compute"):
            w, s = spec.slow_worker, spec.slow_stage
            if w is not None and op.stage == w.stage:
                x[:, w.dp] *= w.factor
            if s is not None and op.stage == s.stage:
                x *= s.factor
            if imbalance is not None:
                x *= imbalance
        if op.kind == "p2p" and spec.slow_link is not None and op.optype.endswith("send"):
            src, dst = op.stage, _dest_stage(op, spec)
            if {src, dst} == {spec.slow_link.stage, (spec.slow_link.stage + 1) % spec.pp}:
                x *= spec.slow_link.factor
        durs.append(x)
    delays = [[rng.exponential(spec.launch_delay_s, shape) if spec.launch_delay_s > 0 else 0.0 for _ in code]
              for code in prog.code]
    return durs, delays


def _dest_stage(op: Op, spec: SynthSpec) -> int:
    return op.key[2] % spec.pp


def _partners(prog: Program) -> tuple[dict[int, int], dict[tuple, list[int]]]:
    """Each p2p op's other end, and the members of every p2p pair and stage collective by (kind, key)."""
    partner: dict[int, int] = {}
    by_key: dict[tuple, list[int]] = {}
    for o, op in enumerate(prog.ops):
        if op.kind in ("p2p", "stagecoll"):
            by_key.setdefault((op.kind, op.key), []).append(o)
    for (kind, _), members in by_key.items():
        if kind == "p2p":
            if len(members) != 2:
                raise Deadlock(f"p2p {members} has no partner")
            partner[members[0]], partner[members[1]] = members[1], members[0]
    return partner, by_key


class _Interpreter:
    """The state of one execution: per op its post time, end, recorded end and start on its stream, each
    (steps, dp); per stage its clock, DP-stream free time and program counter."""

    def __init__(self, prog: Program, durs: list[np.ndarray], delays: list[list[np.ndarray | float]] | None) -> None:
        spec, n = prog.spec, len(prog.ops)
        self.prog, self.durs, self.delays = prog, durs, delays
        zeros = np.zeros((spec.steps, spec.dp))
        self.post: list[np.ndarray | None] = [None] * n
        self.end: list[np.ndarray | None] = [None] * n
        self.rec_end: list[np.ndarray | None] = [None] * n
        self.eff: list[np.ndarray | None] = [None] * n
        self.partner, self.by_key = _partners(prog)
        self.t = [zeros.copy() for _ in range(spec.pp)]
        self.dp_free = [zeros.copy() for _ in range(spec.pp)]
        self.prev_on_stream: dict[int, int] = {}  # a PP stream runs its ops one at a time, in posting order
        self.last_posted: dict[tuple[int, str], int] = {}
        self.pc = [0] * spec.pp

    def complete(self, o: int) -> None:
        """Set the op's end once everything it waits for is known."""
        op, post, end = self.prog.ops[o], self.post, self.end
        if end[o] is not None or post[o] is None:
            return
        if op.kind == "p2p":
            q = self.partner[o]
            if post[q] is None or not (self.ready(o) and self.ready(q)):
                return
            send = o if op.optype.endswith("send") else q
            end[o] = end[q] = np.maximum(self.eff[o], self.eff[q]) + self.durs[send]
        elif op.kind == "stagecoll":
            members = self.by_key[("stagecoll", op.key)]
            if any(post[m] is None for m in members):
                return
            start = np.max([post[m] for m in members], axis=0)
            for m in members:
                end[m] = start + self.durs[m]

    def ready(self, o: int) -> bool:
        """Whether the op's stream has reached it (its start on the stream is then known)."""
        if self.eff[o] is not None:
            return True
        prev = self.prev_on_stream.get(o)
        if prev is not None:
            if self.end[prev] is None:
                self.complete(prev)
            if self.end[prev] is None:
                return False
            self.eff[o] = np.maximum(self.post[o], self.end[prev])
        else:
            self.eff[o] = self.post[o]
        return True

    def do_post(self, o: int, at: np.ndarray) -> None:
        op = self.prog.ops[o]
        if op.kind == "p2p":
            stream = (op.stage, op.optype)
            if stream in self.last_posted:
                self.prev_on_stream[o] = self.last_posted[stream]
            self.last_posted[stream] = o
        if op.kind == "dp":  # a DP stream runs its collectives one at a time
            at = np.maximum(at, self.dp_free[op.stage])
            self.end[o] = at.max(axis=1, keepdims=True) + self.durs[o]
            self.dp_free[op.stage] = self.end[o]
        self.post[o] = at
        self.complete(o)

    def delay(self, r: int) -> np.ndarray | float:
        return 0.0 if self.delays is None else self.delays[r][self.pc[r]]

    def run_stage(self, r: int) -> bool:
        """Run stage r's program until it blocks or ends; whether it made progress."""
        code, t, end, progress = self.prog.code[r], self.t, self.end, False
        while self.pc[r] < len(code):
            ins, ops = code[self.pc[r]]
            if ins == "compute":
                o = ops[0]
                self.post[o] = t[r] + self.delay(r)
                end[o] = self.rec_end[o] = self.post[o] + self.durs[o]
                t[r] = end[o]
            elif ins == "post":
                for o in ops:
                    self.do_post(o, t[r] + self.delay(r))
            elif ins in ("wait", "waitall", "coll"):
                if ins == "coll" and self.post[ops[0]] is None:
                    self.do_post(ops[0], t[r] + self.delay(r))
                for o in ops:
                    self.complete(o)
                if any(end[o] is None for o in ops):
                    break
                done = np.max([end[o] for o in ops], axis=0)
                for o in ops:  # a batched p2p call's rows share the batch's timing
                    self.rec_end[o] = done if ins == "wait" else end[o]
                t[r] = np.maximum(t[r], done)
            self.pc[r] += 1
            progress = True
        return progress


def execute(prog: Program, durs: list[np.ndarray], delays: list[list[np.ndarray | float]] | None = None
            ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Run every stage's program; returns (start, recorded end) per op, each (steps, dp), step-relative."""
    P = prog.spec.pp
    it = _Interpreter(prog, durs, delays)
    while True:
        progress = False
        for r in range(P):
            progress = it.run_stage(r) or progress
        if all(it.pc[r] == len(prog.code[r]) for r in range(P)):
            break
        if not progress:
            stuck = {r: prog.code[r][it.pc[r]] for r in range(P) if it.pc[r] < len(prog.code[r])}
            raise Deadlock(f"schedule deadlocks at {stuck}")
    post, rec_end = it.post, it.rec_end
    for o in range(len(prog.ops)):
        if rec_end[o] is None:  # a non-blocking op never waited for individually
            rec_end[o] = it.end[o]
        if it.eff[o] is not None:  # a p2p op starts (as a trace records it) when its stream reaches it
            post[o] = it.eff[o]
    return post, rec_end  # type: ignore[return-value]


def step_times(start: list[np.ndarray], end: list[np.ndarray]) -> np.ndarray:
    """Per step: the last end minus the first start over every op of every worker."""
    hi = np.max([e.max(axis=1) for e in end], axis=0)
    lo = np.min([s.min(axis=1) for s in start], axis=0)
    return hi - lo


@dataclass
class SynthRun:
    """A generated trace and the means to compute its true slowdowns."""

    prog: Program
    durs: list[np.ndarray]
    delays: list[list[np.ndarray | float]]
    start: list[np.ndarray]
    end: list[np.ndarray]

    def ideal(self) -> list[np.ndarray]:
        """Each op at the analysis's ideal: the mean per op type for compute, the median transfer for comm."""
        by_type: dict[str, list[int]] = {}
        for o, op in enumerate(self.prog.ops):
            if op.kind == "p2p" and not op.optype.endswith("send"):
                continue  # a pair's transfer time is the send's
            by_type.setdefault(op.optype, []).append(o)
        value = {}
        for name, ops in by_type.items():
            x = np.concatenate([self.durs[o].ravel() for o in ops])
            value[name] = float(x.mean() if name in LOCAL else np.median(x))
        out = []
        for o, op in enumerate(self.prog.ops):
            name = op.optype
            if op.kind == "p2p" and not name.endswith("send"):
                name = name.replace("recv", "send")
            out.append(np.full_like(self.durs[o], value.get(name, 0.0)))
        return out

    def step_time(self, durs: list[np.ndarray], delays: bool = False) -> np.ndarray:
        start, end = execute(self.prog, durs, self.delays if delays else None)
        return step_times(start, end)

    def truth(self, ops: object = None, dp: int | None = None) -> float:
        """True slowdown: the step time with the original durations put back (all ops, or `ops(op) -> bool`,
        optionally only on DP rank `dp`) over the ideal step time; launch delays removed."""
        ideal = self.ideal()
        mixed = []
        for o, op in enumerate(self.prog.ops):
            if ops is None or ops(op):
                d = ideal[o].copy()
                if dp is None:
                    d = self.durs[o]
                else:
                    d[:, dp] = self.durs[o][:, dp]
                mixed.append(d)
            else:
                mixed.append(ideal[o])
        return float(self.step_time(mixed).mean() / self.step_time(ideal).mean())

    def columns(self) -> dict[str, np.ndarray]:
        """The trace's columns (optype as indices into OPTYPES)."""
        spec = self.prog.spec
        S, D = spec.steps, spec.dp
        step = np.repeat(np.arange(S, dtype=np.int64), D)
        dp = np.tile(np.arange(D, dtype=np.int32), S)
        parts: dict[str, list[np.ndarray]] = {k: [] for k in
                                              ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration",
                                               "seq_id", "mc", "gmc", "mb_id")}
        for o, op in enumerate(self.prog.ops):
            n = S * D
            parts["dp_rank"].append(dp)
            parts["stage"].append(np.full(n, op.stage, np.int32))
            parts["rank"].append(op.stage * D * spec.tp + dp * spec.tp)
            parts["step"].append(step)
            parts["optype"].append(np.full(n, OPTYPES.index(op.optype), np.int8))
            parts["start_ts"].append(self.start[o].ravel())
            parts["duration"].append((self.end[o] - self.start[o]).ravel())
            parts["seq_id"].append(np.full(n, op.seq_id, np.int32))
            parts["mc"].append(np.full(n, op.mc, np.int8))
            parts["gmc"].append(np.full(n, op.mc * spec.pp + op.stage, np.int16))
            parts["mb_id"].append(np.full(n, op.mb_id, np.int8))
        return {k: np.concatenate(v) for k, v in parts.items()}


def generate(spec: SynthSpec) -> SynthRun:
    """Build the programs, draw durations and launch delays, and execute them."""
    prog = build_program(spec)
    durs, delays = draw(prog, np.random.default_rng(spec.seed))
    start, end = execute(prog, durs, delays)
    return SynthRun(prog, durs, delays, start, end)
