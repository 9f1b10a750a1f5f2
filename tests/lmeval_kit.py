"""lm-eval tasks with local data, and small models, for the lm-eval tests and benchmark (written here, offline).

`write_tasks` makes six task types as lm-eval YAMLs over JSONL files: multiple choice with acc and acc_norm,
loglikelihood_rolling perplexity, generate_until with exact match and a regex filter, a 3-shot task, a
multi-token-continuation task, and a group of two multiple-choice tasks with a size-weighted mean. The text is lines
of this repository's Python source, shuffled with a fixed seed. `export_model` trains a byte-level BPE on the same
text and writes a randomly initialised Frenzy model of a given shape as a Hugging Face directory with tokenizer.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

#: the parity table's rows: task type -> task name
TASK_TYPES = {
    "multiple choice (acc, acc_norm)": "frz_mc",
    "loglikelihood_rolling (perplexity, bits per byte)": "frz_ppl",
    "generate_until (exact match, regex filter)": "frz_gen",
    "few-shot (3-shot multiple choice)": "frz_fewshot",
    "multi-token continuation (perplexity, acc)": "frz_cont",
    "group (size-weighted acc of two tasks)": "frz_group",
}
#: what a suite or `lm_eval --tasks` names to run all six (the few-shot task runs inside the group)
TASKS = ["frz_mc", "frz_ppl", "frz_gen", "frz_cont", "frz_group"]


def corpus_lines() -> list[str]:
    lines = []
    for f in sorted((REPO / "tasks").rglob("*.py")):
        lines += [ln.strip() for ln in f.read_text().splitlines() if 24 <= len(ln.strip()) <= 72 and ln.isascii()]
    random.Random(0).shuffle(lines)
    return lines


def _mc(lines: list[str], n: int, at: int, rng: random.Random) -> list[dict]:
    rows, m = [], len(lines)
    for i in range(n):
        q = lines[(at + i) % m]
        cut = len(q) // 2
        others = [lines[(at + m // 2 + 3 * i + j) % m] for j in range(3)]
        choices = [q[cut:]] + [o[len(o) // 2:] for o in others]
        label = rng.randrange(4)
        choices[0], choices[label] = choices[label], choices[0]
        rows.append({"question": q[:cut], "choices": choices, "label": label})
    return rows


def _yaml(name: str, files: dict[str, Path], body: str) -> str:
    data = ", ".join(f"{k}: {v}" for k, v in files.items())
    return f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files: {{{data}}}\ntest_split: test\n{body}"


_MC = ('output_type: multiple_choice\ndoc_to_text: "Question: {{question}}\\nAnswer:"\ndoc_to_choice: "{{choices}}"\n'
       'doc_to_target: "{{label}}"\n')
_ACC = "  - {metric: acc, aggregation: mean, higher_is_better: true}\n"


def write_tasks(root: Path, n: int = 24) -> Path:
    """The six task types under `root/tasks` (YAMLs) and `root/tasks/data` (JSONL, absolute paths); `n` documents
    per task (the rolling one gets n // 2 documents of 12 lines)."""
    lines, rng = corpus_lines(), random.Random(1)
    m = len(lines)
    d = root / "tasks" / "data"
    d.mkdir(parents=True, exist_ok=True)
    rows = {"mc": _mc(lines, n, 0, rng), "mc_b": _mc(lines, n // 2 + 3, 1000, rng),
            "mc_train": _mc(lines, 16, 2000, rng),
            "ppl": [{"text": "\n".join(lines[(3000 + 12 * i + j) % m] for j in range(12))} for i in range(max(n // 2, 2))],
            "cont": [{"text": lines[(4000 + i) % m]} for i in range(n)]}
    pairs = [(rng.randrange(60), rng.randrange(60)) for _ in range(n)]
    # every third answer is lm-eval's regex filter fallback, which a completion without digits earns: exact match
    # then scores 1 on some documents whatever the model says, so the metric is not zero everywhere
    rows["gen"] = [{"question": f"{a} + {b} =", "answer": "[invalid]" if i % 3 == 0 else str(a + b)}
                   for i, (a, b) in enumerate(pairs)]
    for name, r in rows.items():
        (d / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in r))
    f = {k: d / f"{k}.jsonl" for k in rows}
    metrics = "metric_list:\n" + _ACC + "  - {metric: acc_norm, aggregation: mean, higher_is_better: true}\n"
    yamls = {
        "frz_mc": _yaml("frz_mc", {"test": f["mc"]}, _MC + metrics),
        "frz_mc_b": _yaml("frz_mc_b", {"test": f["mc_b"]}, _MC.replace("Question: {{question}}\\nAnswer:",
                                                                         "{{question}}") + "metric_list:\n" + _ACC),
        "frz_fewshot": _yaml("frz_fewshot", {"test": f["mc"], "train": f["mc_train"]},
                             _MC + "fewshot_split: train\nnum_fewshot: 3\n" + metrics),
        "frz_ppl": _yaml("frz_ppl", {"test": f["ppl"]}, 'output_type: loglikelihood_rolling\ndoc_to_text: ""\n'
                         'doc_to_target: "{{text}}"\nmetric_list:\n  - metric: word_perplexity\n'
                         "  - metric: byte_perplexity\n  - metric: bits_per_byte\n"),
        "frz_cont": _yaml("frz_cont", {"test": f["cont"]}, "output_type: loglikelihood\n"
                          "doc_to_text: \"{{text.split(' ')[:-1]|join(' ')}}\"\n"
                          "doc_to_target: \"{{' '+text.split(' ')[-1]}}\"\nmetric_list:\n"
                          "  - {metric: perplexity, aggregation: perplexity, higher_is_better: false}\n" + _ACC),
        "frz_gen": _yaml("frz_gen", {"test": f["gen"]}, 'output_type: generate_until\ndoc_to_text: "Q: {{question}}\\nA:"\n'
                         'doc_to_target: "{{answer}}"\ngeneration_kwargs: {until: ["\\n", "Q:"], max_gen_toks: 16, '
                         "do_sample: false}\nmetric_list:\n"
                         "  - {metric: exact_match, aggregation: mean, higher_is_better: true, ignore_case: true}\n"
                         "filter_list:\n  - name: strict-match\n    filter:\n"
                         '      - {function: regex, regex_pattern: "(-?[0-9]+)"}\n      - {function: take_first}\n'
                         "  - name: raw\n    filter:\n      - {function: take_first}\n"),
        "frz_group": "group: frz_group\ntask: [frz_mc_b, frz_fewshot]\naggregate_metric_list:\n"
                     "  - {metric: acc, aggregation: mean, weight_by_size: true}\n",
    }
    for name, text in yamls.items():
        (root / "tasks" / f"{name}.yaml").write_text(text)
    return root / "tasks"


def export_model(root: Path, shape: dict, seq_len: int = 256, vocab: int = 512, seed: int = 0) -> Path:
    """A BPE tokenizer trained on the corpus and a random Frenzy model of `shape` (ModelSpec fields), written as
    the Hugging Face directory `root/hf-<seed>` (config, safetensors, tokenizer.json, tokenizer_config.json)."""
    from tasks.hf.convert import export_hf
    from tasks.jobspec import ModelSpec
    from tasks.training.model import GPT
    from tasks.training.tokenizer import load_tokenizer, train_bpe

    text = root / "corpus"
    text.mkdir(parents=True, exist_ok=True)
    (text / "lines.txt").write_text("\n".join(corpus_lines()))
    tok_path = root / f"tokenizer-{vocab}.json"
    if not tok_path.exists():
        train_bpe([str(text)], tok_path, vocab_size=vocab)
    tok = load_tokenizer(str(tok_path))
    spec = ModelSpec.model_validate({**shape, "vocab": tok.vocab_size})
    torch.manual_seed(seed)
    model = GPT(spec, seq_len)
    return export_hf(model.state_dict(), spec, seq_len, root / f"hf-{seed}", tokenizer_json=tok_path.read_text(),
                     eos_id=tok.eos_id, overwrite=True)


LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "mlp": "swiglu", "norm": "rmsnorm", "position": "rope",
         "bias": False, "tied_embeddings": False}
GPT2 = {"preset": "gpt-tiny"}
