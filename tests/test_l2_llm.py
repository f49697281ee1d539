"""The LLM proposer against a local chat-completions server started in the test (127.0.0.1, port 0).

The server answers by path: /good, /fenced, /malformed, /hostile, /huge, /slow, /flaky429, /down500 and so
on, each followed by /chat/completions. Waits between attempts go to a recorder, not to sleep."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from planforge.l2 import build_context, run_l2
from planforge.l2.llm import ANSWER_SCHEMA, LLMConfig, LLMConfigError, LLMProposer, first_json_object
from planforge.space import Space, categorical
from planforge.targets.table import TableBackend

GOOD = {"proposals": [{"plan": {"a": 2, "b": "y"}, "why": "the smaller tile"}, {"plan": {"a": 4}}]}
HOSTILE = {"proposals": [
    {"plan": {"a": "__import__('os').system('touch /tmp/pwned')"}},
    {"plan": {"b": "$(rm -rf ~)"}},
    {"plan": {"exec": "import os; os.remove('x')"}},
    {"plan": {"a": 1e308}},
    {"plan": {"a": -1, "b": "x"}},
    {"plan": {"a": True}},
]}


def chat(content) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):  # quiet
        pass

    def _send(self, code: int, body: bytes, headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading (the oversize cap)
            pass

    def do_POST(self):
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        scenario = self.path.split("/")[1]
        srv.requests.append((scenario, body, dict(self.headers)))
        n = sum(s == scenario for s, _, _ in srv.requests)
        if scenario == "good":
            self._send(200, chat(json.dumps(GOOD)))
        elif scenario == "fenced":
            self._send(200, chat("Sure! Here are my plans:\n```json\n" + json.dumps(GOOD) + "\n```\nGood luck."))
        elif scenario == "prose":
            self._send(200, chat("I would set a to 2 and b to y."))
        elif scenario == "malformed":
            self._send(200, b"<html>not json</html>")
        elif scenario == "nochoices":
            self._send(200, json.dumps({"choices": []}).encode())
        elif scenario == "schema":
            self._send(200, chat(json.dumps({"proposals": [{"plan": {"a": [1, 2]}}]})))
        elif scenario == "hostile":
            self._send(200, chat(json.dumps(HOSTILE)))
        elif scenario == "code":
            self._send(200, chat(json.dumps({"proposals": [{"plan": {"a": 2}, "code": "import os"}]})))
        elif scenario == "huge":
            big = {"proposals": [{"plan": {"a": 2}, "why": "x" * (10 * 2**20)}]}
            self._send(200, chat(json.dumps(big)))
        elif scenario == "slow":
            time.sleep(1.5)
            self._send(200, chat(json.dumps(GOOD)))
        elif scenario == "flaky429":
            if n == 1:
                self._send(429, b'{"error": "rate limited"}', [("Retry-After", "3")])
            else:
                self._send(200, chat(json.dumps(GOOD)))
        elif scenario == "down500":
            self._send(500, b'{"error": "overloaded"}')
        elif scenario == "noschema":
            if "response_format" in body:
                self._send(400, b'{"error": "response_format json_schema is not supported"}')
            else:
                self._send(200, chat(json.dumps(GOOD)))
        elif scenario == "unauthorised":
            self._send(401, b'{"error": "bad key"}')
        else:
            self._send(404, b"{}")


@pytest.fixture(scope="module")
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.requests = []
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def space():
    return Space([categorical("a", (1, 2, 4, 8)), categorical("b", ("x", "y"))])


TIMES = {(1, "x"): 5e-6, (2, "x"): 3e-6, (4, "x"): 4e-6, (8, "x"): 6e-6,
         (1, "y"): 7e-6, (2, "y"): 2e-6, (4, "y"): 5e-6, (8, "y"): 9e-6}


def setup():
    sp = space()
    be = TableBackend({sp.make({"a": a, "b": b}).fingerprint: t for (a, b), t in TIMES.items()}, label="llm")
    c = sp.make({"a": 1, "b": "x"})
    return sp, be, build_context("t", sp, be, [(c, be.measure([c])[0])])


def proposer(server, scenario, **kw):
    waits = []
    cfg = LLMConfig(f"http://127.0.0.1:{server.server_port}/{scenario}", "test-model", **kw)
    return LLMProposer(cfg, sleep=waits.append), waits


def test_a_good_answer_is_measured_and_the_faster_plan_kept(server):
    sp, be, ctx = setup()
    p, waits = proposer(server, "good", api_key="sk-test")
    res = run_l2(ctx, [p], be)
    assert res.calls[0].status == "ok" and res.calls[0].detail["attempts"] == ["200"]
    assert res.kept[0].as_dict() == {"a": 2, "b": "y"}
    assert [f.fate for f in res.fates] == ["kept", "reverted"] and res.fates[0].why == "the smaller tile"
    scenario, body, headers = server.requests[-1]
    assert headers["Authorization"] == "Bearer sk-test" and body["model"] == "test-model"
    assert body["response_format"]["json_schema"]["schema"] == ANSWER_SCHEMA
    prompt = body["messages"][1]["content"]
    assert '"incumbent": {"a": 1, "b": "x"}' in prompt and '"values": [1, 2, 4, 8]' in prompt
    assert waits == []


def test_the_first_json_object_of_a_wrapped_message_is_taken(server):
    _, _, ctx = setup()
    got = proposer(server, "fenced")[0].propose(ctx, 4)
    assert got.status == "ok" and [x.plan for x in got.proposals] == [g["plan"] for g in GOOD["proposals"]]
    assert first_json_object('x {"a": 1} {"b": 2}') == {"a": 1}


@pytest.mark.parametrize("scenario, status, message", [
    ("malformed", "error", "malformed: not a chat-completions reply (JSONDecodeError"),
    ("nochoices", "error", "malformed: not a chat-completions reply (IndexError"),
    ("prose", "error", "malformed: the message holds no JSON object"),
    ("schema", "error", "schema: the answer breaks the schema at proposals/0/plan/a"),
    ("code", "error", "schema: the answer breaks the schema at proposals/0: Additional properties"),
    ("unauthorised", "error", "http: HTTP 401 from"),
])
def test_malformed_answers_change_nothing_and_are_recorded(server, scenario, status, message):
    sp, be, ctx = setup()
    p, waits = proposer(server, scenario)
    res = run_l2(ctx, [p], be)
    assert res.kept is None and res.fates == [] and res.trials == []
    assert res.calls[0].status == status and res.calls[0].message.startswith(message), res.calls[0].message
    assert waits == []  # not retried: asking again would give the same


def test_hostile_plans_are_refused_one_by_one_and_nothing_is_run(server, tmp_path):
    sp, be, ctx = setup()
    res = run_l2(ctx, [proposer(server, "hostile")[0]], be)
    assert res.kept is None and res.trials == [] and {f.fate for f in res.fates} == {"refused"}
    reasons = [f.reason for f in res.fates]
    assert "is not one of its values [1, 2, 4, 8]" in reasons[0] and "is not one of its values ['x', 'y']" in reasons[1]
    assert reasons[2].startswith("unknown knob 'exec'")
    assert all("not one of its values" in r for r in reasons[3:])
    assert not (tmp_path / "pwned").exists()
    assert len(res.fates[0].plan) <= 300 + 40  # the raw plan is kept, shortened, as text


def test_a_huge_payload_is_capped_and_recorded(server):
    _, be, ctx = setup()
    p, _ = proposer(server, "huge", max_bytes=64 * 1024)
    got = p.propose(ctx, 4)
    assert got.status == "error" and got.message == "oversize: the reply exceeds 65536 bytes; not read further"


def test_a_slow_server_times_out_after_bounded_retries(server):
    _, _, ctx = setup()
    p, waits = proposer(server, "slow", timeout_s=0.2, retries=1, backoff_s=0.5)
    got = p.propose(ctx, 4)
    assert got.status == "error" and got.detail["attempts"] == ["timeout", "timeout"]
    assert "no answer from" in got.message and "within 0.2 s (gave up after 2 attempts)" in got.message
    assert waits == [0.5]


def test_429_waits_retry_after_then_succeeds(server):
    _, _, ctx = setup()
    p, waits = proposer(server, "flaky429", backoff_s=0.25)
    got = p.propose(ctx, 4)
    assert got.status == "ok" and got.detail["attempts"] == ["429", "200"] and waits == [3.0]


def test_5xx_is_retried_with_backoff_then_recorded(server):
    _, _, ctx = setup()
    p, waits = proposer(server, "down500", retries=2, backoff_s=0.5)
    got = p.propose(ctx, 4)
    assert got.status == "error" and got.detail["attempts"] == ["500", "500", "500"] and waits == [0.5, 1.0]
    assert got.message.startswith("unavailable: HTTP 500 from") and "gave up after 3 attempts" in got.message


def test_a_server_without_json_schema_is_asked_again_for_plain_json(server):
    _, _, ctx = setup()
    got = proposer(server, "noschema")[0].propose(ctx, 4)
    assert got.status == "ok" and got.detail["attempts"] == ["400", "200"]
    assert "response_format" not in server.requests[-1][1]


def test_a_refused_connection_is_recorded():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    _, _, ctx = setup()
    waits = []
    got = LLMProposer(LLMConfig(f"http://127.0.0.1:{port}", "m", retries=1), sleep=waits.append).propose(ctx, 4)
    assert got.status == "error" and got.detail["attempts"] == ["connection", "connection"]
    assert "cannot reach http://127.0.0.1:" in got.message and waits == [1.0]


def test_nothing_is_sent_without_configuration(server, tmp_path):
    before = len(server.requests)
    _, be, ctx = setup()
    p = LLMProposer(environ={"HOME": str(tmp_path)})  # no variables, no ~/.config/planforge/llm.json
    res = run_l2(ctx, [p], be)
    assert res.calls[0].status == "skipped" and "not configured" in res.calls[0].message
    assert "nothing was sent" in res.calls[0].message and len(server.requests) == before


def test_configuration_from_the_environment_and_a_file(tmp_path, server):
    assert LLMConfig.from_env({"HOME": str(tmp_path)}) is None
    f = tmp_path / "llm.json"
    f.write_text(json.dumps({"base_url": "http://127.0.0.1:1/v1", "model": "from-file", "timeout_s": 5}))
    cfg = LLMConfig.from_env({"PLANFORGE_LLM_CONFIG": str(f), "PLANFORGE_LLM_MODEL": "from-env"})
    assert cfg.url == "http://127.0.0.1:1/v1/chat/completions" and cfg.model == "from-env" and cfg.timeout_s == 5
    with pytest.raises(LLMConfigError, match="absent.json: .*No such file"):  # a file named but missing
        LLMConfig.from_env({"PLANFORGE_LLM_CONFIG": str(tmp_path / "absent.json")})
    home = tmp_path / "home"
    (home / ".config/planforge").mkdir(parents=True)
    (home / ".config/planforge/llm.json").write_text(json.dumps({"base_url": "https://h/v1", "model": "m"}))
    assert LLMConfig.from_env({"HOME": str(home)}).url == "https://h/v1/chat/completions"
    with pytest.raises(LLMConfigError, match="expected http"):
        LLMConfig("file:///etc/passwd", "m")
    with pytest.raises(LLMConfigError, match="needs a model name"):
        LLMConfig.from_env({"PLANFORGE_LLM_BASE_URL": "http://h", "HOME": str(tmp_path)})
    f.write_text(json.dumps({"base_url": "http://h", "model": "m", "shell": "rm"}))
    with pytest.raises(LLMConfigError, match="unknown field shell"):
        LLMConfig.from_env({"PLANFORGE_LLM_CONFIG": str(f)})
    p = LLMProposer(environ={"PLANFORGE_LLM_CONFIG": str(f)})
    _, _, ctx = setup()
    got = p.propose(ctx, 2)
    assert got.status == "skipped" and "unknown field shell" in got.message
