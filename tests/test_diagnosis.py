"""Failure diagnosis (tasks/diagnosis): real logs from public issues, the labelled corpus, compression, the CLI."""

from __future__ import annotations

import collections
import json
import random
from pathlib import Path

import pytest

from cli.main import main
from tasks.diagnosis.compress import compress
from tasks.diagnosis.corpus import ROOTS, corpus, make_log
from tasks.diagnosis.diagnose import diagnose

REAL = Path(__file__).parent / "data" / "diagnosis"


@pytest.mark.parametrize(("name", "type_", "rank", "node"), [
    ("llamafactory-7396-nccl-timeout.log", "NCCLTimeoutError", 0, None),
    ("minigpt4-237-childfailed.log", "ChildFailed", 0, "n136-117-136.byted.org"),  # the "Root Cause" block
    ("sglang-1693-watchdog.log", "NCCLTimeoutError", 5, None),
    ("pytorch-16417-oom.log", "OutOfMemoryError", None, None),
    ("maddog-11-oom-old-format.log", "OutOfMemoryError", None, None),
    ("pytorch-118369-watchdog-after-progress.log", "NCCLTimeoutError", 0, None),
])
def test_real_logs_posted_in_public_issues(name, type_, rank, node):
    d = diagnose(REAL / name)
    assert (d.type, d.rank, d.node) == (type_, rank, node), d.root_cause_line
    assert d.root_cause_line and d.root_cause_line in (REAL / name).read_text()


def test_every_class_of_the_labelled_corpus_is_diagnosed_with_its_rank_and_node():
    logs = corpus(per_class=4, seed=11, noise_lines=200)
    wrong = []
    for lab in logs:
        d = diagnose(lab.text.encode())
        if d.type != lab.type or d.node != lab.node or d.root_cause_line != lab.root_line:
            wrong.append((lab.type, d.type, d.node, lab.node, d.root_cause_line))
        if lab.root_line.startswith("[rank"):
            assert d.rank == lab.rank, (lab.type, d.root_cause_line)
    assert not wrong, wrong[:5]
    assert {lab.type for lab in logs} == set(ROOTS)


def test_the_root_cause_outranks_the_symptoms_it_causes():
    """A CUDA error on one rank, then NCCL timeouts and lost connections on the others, then torchrun's summary:
    the diagnosis is the CUDA error on that rank's node; the rest is evidence."""
    lab = make_log("CUDAError", random.Random(5), noise_lines=100)
    d = diagnose(lab.text.encode())
    assert d.type == "CUDAError" and d.category == "infrastructure" and d.restartable
    kinds = collections.Counter(e.type for e in d.evidence)
    assert kinds["ChildFailed"] >= 1 and (kinds["NCCLTimeoutError"] >= 1 or lab.text.count("[rank") < 3)


@pytest.mark.parametrize(("kind", "category", "restartable"), [
    ("SyntaxError", "script", False), ("OutOfMemoryError", "framework", True), ("ECCError", "infrastructure", True),
    ("S3StorageError", "infrastructure", True), ("ModelLoadingError", "script", False)])  # loading: configuration (issue 29)
def test_categories_and_restartability(kind, category, restartable):
    d = diagnose(make_log(kind, random.Random(3), noise_lines=50).text.encode())
    assert (d.type, d.category, d.restartable) == (kind, category, restartable) and d.mitigation


def test_a_log_without_a_known_error_is_unknown_not_guessed():
    d = diagnose(b"step 1 loss 2.0\nstep 2 loss 1.9\nsomething odd happened\n")
    assert d.type == "Unknown" and d.category == "unknown" and not d.restartable and d.root_cause_line is None


def test_compression_keeps_errors_and_context_and_mines_the_dropped_templates():
    lab = make_log("OutOfMemoryError", random.Random(1), noise_lines=3000)
    c = compress(lab.text.encode(), context=2)
    kept = [k.text for k in c.kept]
    assert lab.root_line in kept and c.ratio > 10
    errors = [k for k in c.kept if k.error]
    assert all(k.line_no > 0 for k in c.kept) and len(errors) < len(c.kept)  # context lines came along
    assert c.templates and "loss" in c.templates[0][0] and c.templates[0][1] > 1000  # the metric line, by Drain3
    assert "0.0000" in c.templates[0][0]  # numbers masked


def test_frenzy_diagnose_json_and_text(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text(make_log("NVLinkError", random.Random(2), noise_lines=100).text)
    assert main(["diagnose", str(log), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in ("category", "type", "root_cause_line", "rank", "node", "restartable", "mitigation", "evidence"):
        assert key in doc
    assert doc["type"] == "NVLinkError" and doc["node"]
    assert main(["diagnose", str(log)]) == 0
    out = capsys.readouterr().out
    assert "NVLinkError (infrastructure)" in out and "root cause, line" in out
    assert main(["diagnose", str(tmp_path / "missing.log")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["diagnose", str(tmp_path)]) == 2


class _FakeLLM:
    """An OpenAI-compatible chat endpoint on loopback whose answers are scripted, one per request."""

    def __init__(self, answers: list[dict]) -> None:
        import http.server
        import threading

        self.answers, self.requests = list(answers), []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                content = json.dumps(outer.answers.pop(0)) if outer.answers else "I cannot tell."
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


ODD = b"[rank3]: step 812 loss 2.1\n[rank3]: gpu-b12-1: thermal slowdown engaged, clocks fell to 300 MHz (error 77)\n"


def test_the_llm_agent_is_asked_only_without_a_rule_votes_and_teaches_a_rule(tmp_path, monkeypatch):
    from tasks.diagnosis.agent import AgentConfig

    monkeypatch.setenv("FRENZY_HOME", str(tmp_path))
    line = "gpu-b12-1: thermal slowdown engaged, clocks fell to 300 MHz (error 77)"
    good = {"type": "NodeFailure", "line": line, "restartable": True, "mitigation": "cordon the hot node"}
    llm = _FakeLLM([good, {"type": "CUDAError", "line": line, "restartable": True, "mitigation": "x"}, good])
    cfg = AgentConfig(url=llm.url, model="fake", samples=3)
    assert diagnose(make_log("OutOfMemoryError", random.Random(1), 20).text.encode(), agent=cfg).source == "rules"
    assert llm.requests == []  # a rule matched: the agent was not asked
    d = diagnose(ODD, agent=cfg)
    assert (d.type, d.source, d.rank, d.restartable) == ("NodeFailure", "agent", 3, True)
    assert len(llm.requests) == 3 and llm.requests[0][0] == "/v1/chat/completions"
    assert "NodeFailure (infrastructure)" in llm.requests[0][1]["messages"][0]["content"]
    # learned: the same failure with other numbers is now a rule match, with no agent
    again = diagnose(ODD.replace(b"300", b"450").replace(b"77", b"12"))
    assert again.type == "NodeFailure" and again.source == "rules"


def test_the_agent_needs_a_majority_and_a_line_that_is_in_the_log(tmp_path, monkeypatch):
    from tasks.diagnosis.agent import AgentConfig

    monkeypatch.setenv("FRENZY_HOME", str(tmp_path))
    invented = {"type": "ECCError", "line": "Xid 48 on gpu 3", "restartable": True, "mitigation": "x"}
    split = [{"type": "NodeFailure", "line": "thermal slowdown", "restartable": True, "mitigation": "x"},
             {"type": "CUDAError", "line": "thermal slowdown", "restartable": True, "mitigation": "x"}, invented]
    for answers in ([invented] * 3, split):
        d = diagnose(ODD, agent=AgentConfig(url=_FakeLLM(answers).url, model="fake", samples=3))
        assert d.type == "Unknown"
    assert not (tmp_path / "diagnosis-rules.jsonl").exists()
