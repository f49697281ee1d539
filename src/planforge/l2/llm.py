"""The LLM proposer: an OpenAI-compatible chat-completions endpoint asked for knob settings as JSON.

Nothing is sent unless the user configured an endpoint: ``PLANFORGE_LLM_BASE_URL``
and ``PLANFORGE_LLM_MODEL`` (``PLANFORGE_LLM_API_KEY`` optional), or a JSON
config file (``PLANFORGE_LLM_CONFIG``, default ``~/.config/planforge/llm.json``:
``{"base_url", "model", "api_key", "timeout_s", "retries"}``); the environment
wins over the file. Unconfigured, the proposer says so and is skipped.

The request is ``POST {base_url}/chat/completions`` with the task context in
the prompt and ``response_format`` a JSON schema (a server that refuses the
field is asked again without it); the reply's message is parsed as JSON (or
its first JSON object) and validated against the same schema with
``jsonschema``. Only the standard library talks HTTP (``urllib.request``).
Timeouts, refused connections, HTTP 429 (waiting ``Retry-After``, bounded) and
5xx are retried a bounded number of times with backoff; every failure,
malformed or oversize answer (the bytes read are capped) becomes a recorded
status with a clear message. The answer is data: its plans go through the
same admission as every proposal, and nothing in it is executed.
"""
from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .context import TaskContext
from .proposer import Proposal, Proposals

ENV_BASE, ENV_MODEL, ENV_KEY, ENV_CONFIG = ("PLANFORGE_LLM_BASE_URL", "PLANFORGE_LLM_MODEL", "PLANFORGE_LLM_API_KEY",
                                            "PLANFORGE_LLM_CONFIG")
DEFAULT_CONFIG = Path("~/.config/planforge/llm.json")
MAX_BYTES = 256 * 1024     # of a reply read at most; a larger one is an oversize answer
MAX_WAIT_S = 30.0          # the longest a Retry-After is honoured
MAX_PROPOSALS = 32
MAX_VALUE_CHARS = 64

ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["proposals"],
    "additionalProperties": False,
    "properties": {
        "proposals": {
            "type": "array", "maxItems": MAX_PROPOSALS,
            "items": {
                "type": "object", "required": ["plan"], "additionalProperties": False,
                "properties": {
                    "plan": {"type": "object", "maxProperties": 64, "additionalProperties": {
                        "anyOf": [{"type": "string", "maxLength": MAX_VALUE_CHARS}, {"type": "number"},
                                  {"type": "boolean"}]}},
                    "why": {"type": "string", "maxLength": 500},
                },
            },
        },
    },
}

SYSTEM = ("You tune kernels by choosing knob settings of an existing template; you never write code. "
          "Answer with one JSON object only, of the form {\"proposals\": [{\"plan\": {knob: value, ...}, "
          "\"why\": \"...\"}]}. Every value must be one of the listed values of its knob, and a plan must "
          "satisfy every restriction. A plan may name only the knobs it changes from the incumbent.")


class LLMConfigError(ValueError):
    """A configuration that names an endpoint but cannot be used (a bad URL, an unreadable file)."""


@dataclass(frozen=True)
class LLMConfig:
    """Where and how to ask: ``base_url`` (``http``/``https``, up to before ``/chat/completions``), ``model``,
    ``api_key`` (sent as a bearer token; default none), ``timeout_s`` per attempt (default 60), ``retries``
    after the first attempt (default 2), ``backoff_s`` (first wait, doubled each retry; default 1),
    ``max_bytes`` of a reply (default 256 KiB), ``json_schema`` (ask for ``response_format`` json_schema;
    default True)."""

    base_url: str
    model: str
    api_key: str = ""
    timeout_s: float = 60.0
    retries: int = 2
    backoff_s: float = 1.0
    max_bytes: int = MAX_BYTES
    json_schema: bool = True

    def __post_init__(self):
        u = urllib.parse.urlparse(self.base_url)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise LLMConfigError(f"LLM base URL {self.base_url!r}: expected http(s)://host[:port][/path]")
        if not self.model:
            raise LLMConfigError("an LLM endpoint needs a model name (PLANFORGE_LLM_MODEL or 'model' in the file)")
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0 or self.max_bytes < 1:
            raise LLMConfigError("LLM timeout_s and max_bytes must be positive, retries and backoff_s >= 0")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "LLMConfig | None":
        """The configuration of ``environ`` (default ``os.environ``) and the config file; None when neither
        names an endpoint (then nothing is ever sent)."""
        env = os.environ if environ is None else environ
        home = Path(env["HOME"]) if env.get("HOME") else Path("~").expanduser()
        path = Path(env[ENV_CONFIG]).expanduser() if env.get(ENV_CONFIG) else home / DEFAULT_CONFIG.relative_to("~")
        data: dict[str, Any] = {}
        if env.get(ENV_CONFIG) or path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as e:
                raise LLMConfigError(f"LLM config file {path}: {e}") from None
            if not isinstance(data, dict):
                raise LLMConfigError(f"LLM config file {path}: expected a JSON object")
        for key, name in (("base_url", ENV_BASE), ("model", ENV_MODEL), ("api_key", ENV_KEY)):
            if env.get(name):
                data[key] = env[name]
        if not data.get("base_url"):
            return None
        known = {f for f in cls.__dataclass_fields__}
        extra = sorted(set(data) - known)
        if extra:
            raise LLMConfigError(f"LLM configuration: unknown field{'s' if len(extra) > 1 else ''} {', '.join(extra)}")
        data.setdefault("model", "")  # so that a missing model gets its own message
        try:
            return cls(**data)
        except TypeError as e:
            raise LLMConfigError(f"LLM configuration: {e}") from None


@dataclass
class Reply:
    """One exchange's result: ``answer`` (the validated JSON) or ``status`` and ``message`` of a failure,
    with each attempt's HTTP status (or error kind) in ``attempts``."""

    answer: dict[str, Any] | None
    status: str
    message: str
    attempts: list[str] = field(default_factory=list)


def prompt(ctx: TaskContext, n: int) -> list[dict[str, str]]:
    """The chat messages for ``ctx``: the system rules, then the context as JSON and the request."""
    body = json.dumps(ctx.to_json(), sort_keys=True, default=str)
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Task context (JSON):\n{body}\n\nPropose up to {n} plans likely to beat "
                                        f"the incumbent, most promising first."}]


def first_json_object(text: str) -> Any:
    """The JSON of ``text``, else its first JSON object (a reply wrapped in prose or a code fence)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    dec = json.JSONDecoder()
    i = text.find("{")
    while i >= 0:
        try:
            return dec.raw_decode(text, i)[0]
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
    raise ValueError("the message holds no JSON object")


class LLMClient:
    """Talks to ``config``'s endpoint. ``sleep`` waits between attempts (tests pass a recorder)."""

    def __init__(self, config: LLMConfig, sleep: Callable[[float], None] = time.sleep):
        self.config, self.sleep = config, sleep

    def _request(self, messages: list[dict[str, str]], schema: bool) -> urllib.request.Request:
        body: dict[str, Any] = {"model": self.config.model, "messages": messages, "temperature": 0}
        if schema:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "proposals", "schema": ANSWER_SCHEMA, "strict": False}}
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return urllib.request.Request(self.config.url, data=json.dumps(body).encode(), headers=headers, method="POST")

    def _read(self, resp) -> bytes:
        data = resp.read(self.config.max_bytes + 1)
        if len(data) > self.config.max_bytes:
            raise _Oversize(f"the reply exceeds {self.config.max_bytes} bytes; not read further")
        return data

    def ask(self, messages: list[dict[str, str]]) -> Reply:
        """Send ``messages``; the validated answer or why there is none. Never raises for the server's sake."""
        import jsonschema

        cfg, attempts = self.config, []
        schema, last = cfg.json_schema, ""
        tries = cfg.retries + 1
        i = 0
        while i < tries:
            wait = cfg.backoff_s * (2 ** i)
            try:
                with urllib.request.urlopen(self._request(messages, schema), timeout=cfg.timeout_s) as resp:
                    raw = self._read(resp)
                attempts.append(str(getattr(resp, "status", 200)))
            except _Oversize as e:
                attempts.append("oversize")
                return Reply(None, "oversize", str(e), attempts)
            except urllib.error.HTTPError as e:
                attempts.append(str(e.code))
                detail = _body(e)
                if e.code == 400 and schema and "response_format" in detail:
                    schema = False  # a server without json_schema support: ask again for plain JSON
                    continue
                if e.code == 429 or e.code >= 500:
                    last = f"HTTP {e.code} from {cfg.url}" + (f": {detail}" if detail else "")
                    if e.code == 429:
                        wait = max(wait, _retry_after(e.headers.get("Retry-After")))
                    i += 1
                    if i < tries:
                        self.sleep(min(wait, MAX_WAIT_S))
                    continue
                return Reply(None, "http", f"HTTP {e.code} from {cfg.url}" + (f": {detail}" if detail else ""),
                             attempts)
            except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError, OSError) as e:
                reason = getattr(e, "reason", e)
                kind = "timeout" if isinstance(reason, (socket.timeout, TimeoutError)) or "timed out" in str(reason) \
                    else "connection"
                attempts.append(kind)
                last = (f"no answer from {cfg.url} within {cfg.timeout_s:g} s" if kind == "timeout"
                        else f"cannot reach {cfg.url}: {reason}")
                i += 1
                if i < tries:
                    self.sleep(min(wait, MAX_WAIT_S))
                continue
            return self._parse(raw, attempts, jsonschema)
        return Reply(None, "unavailable", f"{last} (gave up after {tries} attempt{'s' if tries > 1 else ''})",
                     attempts)

    @staticmethod
    def _parse(raw: bytes, attempts: list[str], jsonschema) -> Reply:
        try:
            envelope = json.loads(raw.decode("utf-8"))
            content = envelope["choices"][0]["message"]["content"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
            return Reply(None, "malformed", f"not a chat-completions reply ({type(e).__name__}: {str(e)[:120]})",
                         attempts)
        if not isinstance(content, str):
            return Reply(None, "malformed", "the reply's message content is not text", attempts)
        try:
            answer = first_json_object(content)
        except ValueError as e:
            return Reply(None, "malformed", f"{e} (message starts {content[:80]!r})", attempts)
        try:
            jsonschema.validate(answer, ANSWER_SCHEMA)
        except jsonschema.ValidationError as e:
            path = "/".join(map(str, e.absolute_path)) or "(the answer)"
            return Reply(None, "schema", f"the answer breaks the schema at {path}: {e.message[:200]}", attempts)
        return Reply(answer, "ok", "", attempts)


class _Oversize(Exception):
    pass


def _body(e: urllib.error.HTTPError) -> str:
    try:
        return e.read(2000).decode("utf-8", "replace").strip()[:200]
    except Exception:  # a body that cannot be read adds nothing to the message
        return ""


def _retry_after(value: str | None) -> float:
    """Seconds of a ``Retry-After`` header (a number; an HTTP date or nonsense counts as 0)."""
    try:
        return max(0.0, float(value)) if value is not None else 0.0
    except ValueError:
        return 0.0


class LLMProposer:
    """Proposals from an OpenAI-compatible endpoint (``config``; default ``LLMConfig.from_env()``). Without a
    configuration every call is ``skipped``: nothing is sent anywhere."""

    name = "llm"

    def __init__(self, config: LLMConfig | None = None, environ: Mapping[str, str] | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.error = ""
        if config is None:
            try:
                config = LLMConfig.from_env(environ)
            except LLMConfigError as e:
                self.error = str(e)
        self.config = config
        self.client = LLMClient(config, sleep) if config is not None else None

    def propose(self, ctx: TaskContext, n: int) -> Proposals:
        t0 = time.perf_counter()
        if self.client is None:
            return Proposals(self.name, [], "skipped", self.error or
                             f"not configured (set {ENV_BASE} and {ENV_MODEL}, or write {DEFAULT_CONFIG}): "
                             "nothing was sent")
        reply = self.client.ask(prompt(ctx, n))
        detail = {"attempts": reply.attempts, "model": self.config.model}  # type: ignore[union-attr]
        if reply.answer is None:
            return Proposals(self.name, [], "error", f"{reply.status}: {reply.message}", time.perf_counter() - t0,
                             detail)
        props = [Proposal(p["plan"], "llm", str(p.get("why", ""))[:200]) for p in reply.answer["proposals"]]
        return Proposals(self.name, props, "ok", "", time.perf_counter() - t0, detail)
