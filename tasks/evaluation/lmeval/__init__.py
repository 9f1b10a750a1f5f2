"""lm-evaluation-harness on Frenzy (issue 42).

- `requests.py`: lm-eval's three request types (`loglikelihood`, `loglikelihood_rolling`, `generate_until`)
  computed on Frenzy's GPT, tokenised and truncated as lm-eval's Hugging Face backend does. Pure torch: trial
  processes use it without importing lm_eval.
- `model.py`: the `frenzy` model for lm-eval (`lm_eval --model frenzy --model_args uri=...`).
- `tasks.py`: lm-eval task YAMLs (and groups) with local data as a suite source: requests built once with
  lm-eval's own templates and few-shot sampler, metrics with its filters, metrics and aggregations.
- `plugin.py`: makes `lm_eval --model frenzy` resolve on lm-eval releases that do not read the `lm_eval.models`
  entry points (0.4.13 among them).

lm_eval itself is an optional dependency (`pip install -e ".[lmeval]"`); nothing here imports it at module level.
"""
