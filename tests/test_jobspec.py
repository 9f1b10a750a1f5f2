import pytest
import torch

from tasks.jobspec import JobSpecError, ModelSpec, load_job, parse_job
from tasks.planning.layout import count_params
from tasks.presets import MODEL_PRESETS
from tasks.training.model import GPT


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_every_preset_loads_and_counts_match_the_model(name):
    spec = ModelSpec(preset=name)
    with torch.device("meta"):
        model = GPT(spec, seq_len=256)
    assert count_params(spec, 256).total == model.num_params()


def test_known_preset_sizes():
    assert abs(count_params(ModelSpec(preset="llama2-7b"), 4096).total / 1e9 - 6.74) < 0.01
    assert abs(count_params(ModelSpec(preset="llama3-8b"), 8192).total / 1e9 - 8.03) < 0.01
    assert abs(count_params(ModelSpec(preset="gpt2-124m"), 1024).total / 1e6 - 124.4) < 0.1


def test_unknown_key_is_named():
    with pytest.raises(JobSpecError, match="training.lerning_rate: unknown key 'lerning_rate'"):
        parse_job({"model": "gpt-tiny", "training": {"lerning_rate": 1e-3}})


def test_unknown_preset_lists_choices():
    with pytest.raises(JobSpecError, match="unknown model preset 'gpt5'.*llama2-7b"):
        parse_job({"model": {"preset": "gpt5"}})


def test_preset_overrides_and_defaults():
    job = parse_job({"model": {"preset": "llama2-7b", "layers": 2}})
    assert job.model.layers == 2 and job.model.hidden == 4096 and job.model.mlp == "swiglu"
    assert job.training.precision == "bf16-mixed" and job.training.checkpoint.keep == 3


def test_bad_shape_rejected():
    with pytest.raises(JobSpecError, match="not divisible by kv_heads"):
        parse_job({"model": {"layers": 2, "hidden": 768, "heads": 12, "kv_heads": 5, "vocab": 256}})


def test_a_job_without_a_model_is_refused_with_the_fix(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    for bad in (lambda: load_job(empty), lambda: parse_job({"name": "x", "training": {"steps": 3}})):
        with pytest.raises(JobSpecError, match=r"model: missing; give `model: \{preset: NAME\}`"):
            bad()
    with pytest.raises(JobSpecError, match="missing: hidden, heads, vocab"):
        parse_job({"model": {"layers": 3}})


def test_the_form_schema_does_not_prefill_the_shape():
    """The Prefect UI form renders these defaults: a preset chosen alone must not be overridden by them."""
    from flows.train import TrainRequest

    props = TrainRequest.model_json_schema()["$defs"]["ModelSpec"]["properties"]
    for field in ("layers", "hidden", "heads", "vocab", "mlp", "norm", "position", "bias", "tied_embeddings"):
        assert props[field].get("default") is None, field
    assert "llama3-8b" in str(props["preset"])  # a choice, not free text
    # the form submitted as rendered: every shape field empty (null), only the preset chosen
    form = {"preset": "llama3-8b", **{f: None for f in props if f != "preset"}}
    m = ModelSpec.model_validate(form)
    assert (m.layers, m.hidden, m.vocab, m.mlp) == (32, 4096, 128256, "swiglu")


def test_example_jobs_load(tmp_path):
    for path in ("examples/jobs/gpt2-7b.yaml", "examples/jobs/llama3-8b.yaml", "examples/jobs/tiny.yaml"):
        assert load_job(path).name
    bad = tmp_path / "bad.yaml"
    bad.write_text("- not a mapping\n")
    with pytest.raises(JobSpecError, match="must be a mapping"):
        load_job(bad)
    with pytest.raises(JobSpecError, match="no such job file"):
        load_job(tmp_path / "missing.yaml")


def test_a_data_path_url_other_than_s3_is_refused_naming_the_fix():
    """Red team 41f S07: an https:// data.path was planned and placed, then failed on DNS with a traceback."""
    with pytest.raises(JobSpecError, match=r"only local paths and s3:// are read \(https:// is not\); download it first"):
        parse_job({"name": "u", "model": {"preset": "gpt-tiny"},
                   "training": {"data": {"source": "text", "path": "https://example.com/c.txt"}}}, "job.yaml")
    for ok in ("s3://bucket/x", "corpus/*.txt", "file:///x", "/abs/c.txt"):
        assert parse_job({"name": "u", "model": {"preset": "gpt-tiny"},
                          "training": {"data": {"source": "text", "path": ok}}}, "job.yaml").training.data.path


def test_a_text_glob_reads_every_file_it_matches_and_one_matching_nothing_says_so(tmp_path, monkeypatch):
    """Red team 41f S08: `corpus/*.txt` (byte-level text) said 'does not exist', even when it matched files."""
    from tasks.jobspec import DataSpec
    from tasks.training.data import DataError, _text_corpus_bytes

    monkeypatch.setenv("FRENZY_CACHE", str(tmp_path / "cache"))
    (tmp_path / "corpus").mkdir()
    with pytest.raises(DataError, match="the pattern matches no file"):
        _text_corpus_bytes(DataSpec(source="text", path=f"{tmp_path}/corpus/*.txt"))
    (tmp_path / "corpus" / "a.txt").write_text("alpha")
    (tmp_path / "corpus" / "b.txt").write_text("beta")
    (tmp_path / "corpus" / "c.md").write_text("not matched")
    got = _text_corpus_bytes(DataSpec(source="text", path=f"{tmp_path}/corpus/*.txt")).read_bytes()
    assert got == b"alpha\nbeta"
