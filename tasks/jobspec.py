"""The job YAML contract: what a user submits (a model and a batch size, never a GPU count).

Every field has a default and a docstring (shown as help text in Prefect UI forms); unknown keys are an
error that names the key. Load a file with `load_job(path)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.errors import FrenzyError
from tasks.formschema import drop_null_branches, optional_section
from tasks.presets import MODEL_PRESETS
from tasks.userfiles import UserFileError, YamlDoc, load_yaml, path_kind, refuse_bool_numbers


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False,
                              json_schema_extra=drop_null_branches, validate_assignment=True)
    _no_bool_numbers = field_validator("*", mode="before")(classmethod(refuse_bool_numbers))


PresetName = Literal[tuple(MODEL_PRESETS)]  # type: ignore[valid-type]
# the explicit shape a model without a preset must give, and the defaults of the optional style fields
_REQUIRED_SHAPE = ("layers", "hidden", "heads", "vocab")
_STYLE_DEFAULTS: dict[str, Any] = dict(mlp="gelu", norm="layernorm", tied_embeddings=True, position="learned", bias=True,
                                       rope_theta=10000.0, norm_eps=1e-5)


class RopeScalingSpec(_Strict):
    """Llama 3.1's frequency-dependent RoPE scaling (`rope_scaling: {rope_type: llama3, ...}` in config.json)."""

    model_config = ConfigDict(json_schema_extra=optional_section)  # optional in ModelSpec / JobSpec: see it

    factor: float = Field(8.0, gt=0)
    """Low frequencies are divided by this."""
    low_freq_factor: float = Field(1.0, gt=0)
    """Wavelengths above original_max_position / low_freq_factor are fully scaled."""
    high_freq_factor: float = Field(4.0, gt=0)
    """Wavelengths below original_max_position / high_freq_factor are kept."""
    original_max_position: int = Field(8192, ge=1)
    """The context length the model was pretrained at."""


class ModelSpec(_Strict):
    """Transformer shape: a `preset`, or the explicit shape (layers, hidden, heads, vocab), or a preset with
    overrides. Empty fields take the preset's value, so a form that names only a preset cannot contradict it."""

    preset: PresetName | None = None
    """Name of a built-in model (see `frenzy presets`); fields given below override it."""
    hf: str | None = None
    """A Hugging Face model directory (config.json + safetensors; Llama, Qwen2, Mistral or GPT-2 architecture):
    the shape comes from its config, training starts from its weights and its tokenizer.json is the default
    tokenizer. Fields given below override the config (not the weights' shapes)."""
    layers: int | None = Field(None, ge=1, le=4096)
    """Number of transformer blocks, at most 4096 (empty: the preset's)."""
    hidden: int | None = Field(None, ge=8, le=1 << 20)
    """Model (residual stream) width (empty: the preset's)."""
    heads: int | None = Field(None, ge=1, le=1 << 16)
    """Attention (query) heads (empty: the preset's)."""
    kv_heads: int | None = Field(None, ge=1, le=1 << 16)
    """Key/value heads for grouped-query attention; empty means the preset's, else equal to `heads` (MHA)."""
    ffn_hidden: int | None = Field(None, ge=1, le=1 << 22)
    """MLP inner width; empty means the preset's, else 4 x hidden for GELU and the Llama rule (2/3 x 4h, rounded
    to 256) for SwiGLU."""
    vocab: int | None = Field(None, ge=2, le=1 << 24)
    """Vocabulary size (256 for the byte-level tokenizer; empty: the preset's)."""
    mlp: Literal["gelu", "swiglu"] | None = None
    """MLP kind: GELU (GPT-2, BERT) or SwiGLU (Llama, Mistral, Qwen); empty: the preset's, else gelu."""
    norm: Literal["layernorm", "rmsnorm"] | None = None
    """Normalisation layer; empty: the preset's, else layernorm."""
    tied_embeddings: bool | None = None
    """Share the input embedding with the output projection; empty: the preset's, else yes."""
    position: Literal["learned", "rope"] | None = None
    """Position encoding: a learned table of `seq_len` rows (GPT-2, BERT) or rotary (Llama); empty: the preset's,
    else learned."""
    bias: bool | None = None
    """Biases in linear and norm layers (GPT-2, BERT: yes; Llama: no); empty: the preset's, else yes."""
    qkv_bias: bool | None = None
    """Biases on the query/key/value projections alone (Qwen2: yes); empty: the same as `bias`."""
    rope_theta: float | None = Field(None, gt=0)
    """Rotary base frequency (Llama 2: 10000, Llama 3: 500000, Qwen2: 1000000); empty: the preset's, else 10000."""
    rope_scaling: RopeScalingSpec | None = None
    """Llama 3.1-style RoPE scaling; empty: none."""
    norm_eps: float | None = Field(None, gt=0)
    """Epsilon of the norm layers (GPT-2: 1e-5, Llama 2: 1e-5, Qwen2: 1e-6); empty: the preset's, else 1e-5."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, str):
            data = {"preset": data}
        if not isinstance(data, dict):
            return data
        given = {k: v for k, v in data.items() if v is not None}
        for key in ("hf", "preset"):
            if key in given and not isinstance(given[key], str):
                raise ValueError(f"{key}: {given[key]!r} is not a name; give "
                                 + ("a model directory path" if key == "hf" else "one of " + ", ".join(MODEL_PRESETS)))
        if given.get("hf"):
            from tasks.hf.config import spec_fields_from_hf  # reads config.json only; no torch, no transformers

            fields = spec_fields_from_hf(given["hf"])
            if given.get("preset"):
                raise ValueError("give either `preset` or `hf`, not both")
            return {**_STYLE_DEFAULTS, **fields, **given}
        name = given.get("preset")
        if name:
            if name not in MODEL_PRESETS:
                raise ValueError(f"unknown model preset {name!r}; choose one of: {', '.join(sorted(MODEL_PRESETS))}")
            return {**_STYLE_DEFAULTS, **MODEL_PRESETS[name], **given}
        missing = [k for k in _REQUIRED_SHAPE if k not in given]
        if missing:
            raise ValueError(f"give a `preset` (see `frenzy presets`) or the explicit shape; missing: {', '.join(missing)}")
        return {**_STYLE_DEFAULTS, **given}

    @model_validator(mode="after")
    def _check_shape(self) -> ModelSpec:
        kv = self.kv_heads or self.heads
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}")
        if self.heads % kv:
            raise ValueError(f"heads={self.heads} is not divisible by kv_heads={kv}")
        return self

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        if self.mlp == "gelu":
            return 4 * self.hidden
        return 256 * ((int(2 * 4 * self.hidden / 3) + 255) // 256)

    @property
    def attn_bias(self) -> bool:
        """Whether the q/k/v projections carry biases."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def display_name(self) -> str:
        if self.hf:
            return Path(self.hf).name or self.hf
        return self.preset or f"custom-L{self.layers}-h{self.hidden}"

    def shape_dump(self) -> dict[str, Any]:
        """The shape alone (no preset name or source directory): what checkpoints record and compare."""
        return self.model_dump(exclude={"preset", "hf"})


class CheckpointSpec(_Strict):
    """Asynchronous checkpointing."""

    every_steps: Annotated[int, Field(ge=1)] | Literal["auto"] = 100
    """Checkpoint every N optimizer steps, or `auto`: the Young/Daly interval sqrt(2 x cost x MTBF) from the measured
    checkpoint cost and the pool's failure rate (tasks/training/interval.py), re-tuned at every save."""
    mtbf_s: float | None = Field(None, gt=0)
    """The job's mean time between failures in seconds, for `auto`; unset: `frenzy submit` estimates it from the
    ledger's failures on the GPU pool, else a prior from Llama 3's failure rate divided by the GPU count."""
    uri: str | None = None
    """Where checkpoints go: a `file://` directory (relative: to the job file) or an `s3://bucket/prefix`; empty:
    `ckpt/` in the run directory."""
    keep: int = Field(3, ge=1)
    """How many committed checkpoints to retain (one healthy pre-spike checkpoint is always kept)."""


class DataSpec(_Strict):
    """Training data."""

    source: Literal["builtin", "text", "jsonl", "parquet", "tokens"] = "builtin"
    """`builtin`: the offline corpus Frenzy ships; `text`: UTF-8 files; `jsonl`/`parquet`: one document per row
    (`text_field`); `tokens`: pre-tokenized shards (`.bin` as nanoGPT/llm.c or `frenzy data prepare` write)."""
    path: str | None = None
    """A file, directory or glob, local or `s3://bucket/prefix`, for every source but `builtin`."""
    text_field: str = "text"

    @field_validator("path")
    @classmethod
    def _local_or_s3(cls, v: str | None) -> str | None:
        scheme = v.split("://", 1)[0].lower() if v and "://" in v else ""
        if scheme not in ("", "file", "s3"):
            raise ValueError(f"{v!r}: only local paths and s3:// are read ({scheme}:// is not); download it first "
                             "(e.g. `curl -o corpus.txt URL`) and give the local path")
        return v
    """The field (jsonl) or column (parquet) that holds each document's text."""
    tokenizer: str | None = None
    """`byte` (UTF-8 bytes, vocab 256), a tokenizer.json, or a directory holding one (a Hugging Face model);
    empty: the model's own when `model.hf` is given, else `byte`."""
    inject_spike_steps: list[int] = Field(default_factory=list)
    """Fault injection for drills and tests: the batches an uninterrupted run would train on at these steps
    are replaced by random bytes (a loss spike)."""


class SpikeSpec(_Strict):
    """Loss-spike detection and rollback."""

    zscore: float = Field(6.0, gt=0)
    """A step whose loss or gradient norm is this many standard deviations above the rolling mean is a spike."""
    window: int = Field(64, ge=4)
    """Healthy steps in the rolling window."""
    min_steps: int = Field(20, ge=2)
    """History needed before spikes are judged."""
    skip_batches: int = Field(4, ge=1)
    """Batches skipped from the spike's batch on (PaLM skipped 200-500 at scale)."""
    rollback: bool = True
    """Roll back to the newest healthy checkpoint before the spike and skip `skip_batches` batches; False (or no
    healthy checkpoint yet) skips only the spike's update and its batch."""
    max_consecutive: int = Field(3, ge=1)
    """Spikes in a row (no healthy update past them) the guard handles before it gives up: a finite one is then
    trained through and the detector's history restarts at the new level; a non-finite one stops the run."""
    max_rollbacks: int = Field(3, ge=1)
    """Rollbacks in a row that do not carry the run past the step of the furthest spike they answered (never fewer
    than `max_consecutive`); one more stops the run (exit 2) with the last healthy checkpoint as its newest commit."""


class TrainingSpec(_Strict):
    """How the model is trained; the batch size is the user's, the GPUs are Frenzy's choice."""

    seq_len: int = Field(1024, ge=1, le=1 << 22)
    """Tokens per sequence (at most 4M)."""
    global_batch: int = Field(8, ge=1, le=1 << 22)
    """Sequences per optimizer step, across all data-parallel replicas and accumulation steps (at most 4M)."""
    micro_batch: int | None = Field(None, ge=1)
    """Sequences per forward pass per GPU; None lets the planner choose."""
    precision: Literal["bf16-mixed", "fp16-mixed", "bf16", "fp32"] = "bf16-mixed"
    """`*-mixed`: fp32 master weights, half-precision compute (AMP); `bf16`: everything bf16; `fp32`."""
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    """Optimizer; Adam(W) keeps two fp32 moments per parameter, SGD with momentum one."""
    zero_stage: int = Field(0, ge=0, le=3)
    """ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also parameters (FSDP) over data-parallel ranks."""
    distributed_optimizer: bool = False
    """Megatron-style distributed optimizer (shards fp32 master weights and moments; same memory as ZeRO-1)."""
    recompute: Literal["none", "selective", "full", "op"] = "none"
    """Activation recomputation: `selective` recomputes the attention core, `full` whole blocks, `op` keeps the
    outputs of every other matmul and of the attention kernel and recomputes the rest (torchtitan's per-op
    selective checkpointing)."""
    attention: Literal["flash", "math"] = "flash"
    """`flash`: fused attention that never stores the s x s score matrix; `math`: materialised softmax."""
    compile: bool = False
    """`torch.compile` each transformer block (as torchtitan does): fused kernels for a compile time at start;
    state dicts and checkpoints are unchanged."""
    steps: int = Field(1000, ge=1, le=10**9)
    """Optimizer steps to train."""
    lr: float = Field(3e-4, gt=0)
    """Peak learning rate."""
    seed: int = 0
    """Random seed for initialisation and data order."""
    warmup_steps: int | None = Field(None, ge=0)
    """Linear learning-rate warmup; None means min(100, steps // 10). Cosine decay to 10% follows."""
    grad_clip: float = Field(1.0, ge=0)
    """Clip the global gradient norm to this (0 disables)."""
    log_every_steps: int = Field(10, ge=1)
    """Progress line (step, loss, tokens/s, ETA) every N steps."""
    trace_every_steps: int = Field(10, ge=0)
    """Write op traces (straggler format) for every Nth step; 0 disables."""
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """Checkpointing."""
    spike: SpikeSpec = Field(default_factory=SpikeSpec)
    """Loss-spike detection and rollback."""
    data: DataSpec = Field(default_factory=DataSpec)
    """Training data."""

    @model_validator(mode="after")
    def _micro_batch_divides(self) -> TrainingSpec:
        if self.micro_batch is not None and self.global_batch % self.micro_batch:
            raise ValueError(f"micro_batch {self.micro_batch} does not divide global_batch {self.global_batch}; "
                             "choose a divisor, or leave micro_batch empty for the planner to choose")
        return self


class EvaluationSpec(_Strict):
    """Evaluation of committed checkpoints."""

    model_config = ConfigDict(json_schema_extra=optional_section)  # optional in ModelSpec / JobSpec: see it

    suite: str = "core"
    """Benchmark suite name or file."""
    on_checkpoint: bool = True
    """Evaluate every committed checkpoint as it lands."""


NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""Job and run names become directory names (runs/<name>, evals/<name>): a name, never a path."""


class JobSpec(_Strict):
    """A training job as submitted by a user."""

    name: str = Field("job", pattern=NAME_PATTERN)
    """Job name (letters, digits, `.`, `_`, `-`; up to 128); it names the run and evaluation directories."""
    model: ModelSpec
    """The model to train: `{preset: NAME}` (see `frenzy presets`) or the explicit shape."""
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    """Training settings."""
    evaluation: EvaluationSpec | None = None
    """Optional evaluation of checkpoints."""


class JobSpecError(FrenzyError, ValueError):
    """A job file that cannot be used; the message names the field and the fix."""


def tp_misfit(job: JobSpec, tp: int) -> str | None:
    """Why `tp`-way tensor parallelism cannot split `job`'s model (heads, kv_heads and the MLP's hidden width must
    each divide by it), or None: the launcher asks before any rank starts, each rank again."""
    m = job.model
    for what, n in (("heads", m.heads), ("kv_heads", m.n_kv_heads), ("ffn", m.ffn)):
        if n % tp:
            return f"--tp {tp} does not divide the model's {what}={n}; choose a tp that does (or --nproc for data parallel)"
    return None


def format_validation_error(err: ValidationError, source: str, doc: YamlDoc | None = None) -> str:
    """One line per problem, `FILE:LINE:COL: field: problem and fix` when the YAML document `doc` is known."""
    lines = [f"{source}: invalid job specification"]
    for e in err.errors():
        at = f"{doc.where(e['loc'])}: " if doc is not None and doc.where(e["loc"]) != doc.source else ""
        bare = ".".join(str(p) for p in e["loc"])
        loc = at + bare
        if e["type"] == "extra_forbidden":
            lines.append(f"  {loc}: unknown key {str(e['loc'][-1])!r} (check spelling; see docs/job-yaml.md)")
        elif e["type"] == "missing" and bare == "model":
            lines.append("  model: missing; give `model: {preset: NAME}` (see `frenzy presets`) or the explicit "
                         "shape (layers, hidden, heads, vocab)")
        elif e["type"] == "string_pattern_mismatch" and bare == "name":
            lines.append(f"  name: {e['input']!r} is not a name: use letters, digits, '.', '_' and '-' (at most 128; "
                         "it names the run's directories)")
        elif e["type"] == "literal_error" and bare == "model.preset":
            lines.append(f"  model.preset: unknown model preset {e['input']!r}; choose one of: "
                         f"{', '.join(sorted(MODEL_PRESETS))}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"  {loc or '(top level)'}: {msg}")
    return "\n".join(lines)


def parse_job(data: dict[str, Any], source: str = "<job>", doc: YamlDoc | None = None) -> JobSpec:
    """Validate a job dictionary, raising `JobSpecError` with every problem named (with its line, given `doc`)."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as err:
        raise JobSpecError(format_validation_error(err, source, doc)) from None


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job YAML file (through tasks/userfiles.py: a regular file, strict YAML)."""
    p = Path(path).expanduser()
    try:
        kind = path_kind(p, "job file")
        if kind == "missing":
            raise JobSpecError(f"{p}: no such job file (see examples/jobs/ for templates)")
        if kind == "dir":
            raise JobSpecError(f"{p} is a directory; give a job YAML file (see examples/jobs/ for templates)")
        doc = load_yaml(p, "job file")
    except UserFileError as err:
        raise JobSpecError(str(err)) from None
    data = doc.data if doc.data is not None else {}
    if not isinstance(data, dict):
        raise JobSpecError(f"{p}: a job file must be a mapping with keys name/model/training")
    return parse_job(data, str(p), doc)
