"""A small client for the vLLM server's health, dev-mode (sleep/wake/collective_rpc) and completion
endpoints. Every HTTP failure becomes one ColdstartError naming the endpoint."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from coldstart.errors import ColdstartError


@dataclass
class Completion:
    text: str
    token_ids: list[int]

    def __iter__(self):  # allows `text, ids = client.complete(...)`
        return iter((self.text, self.token_ids))


@dataclass
class ScoredCompletion:
    """A completion with the model's scores: the prompt's token ids and the log-probability the model
    gives each prompt token (None for the first), plus the generated tokens and their logprobs."""
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    prompt_logprobs: list[float | None]
    token_logprobs: list[float | None]


class EngineClient:
    """Talks to one server at ``base_url`` (e.g. http://127.0.0.1:8000)."""

    def __init__(self, base_url: str, timeout: float = 120.0, token: str | None = None):
        """``token``: the server's control token (coldstart.engine.gate), sent with every request:
        the dev-mode routes and a snapshot's closed server answer only requests that carry it."""
        import requests

        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._s = requests.Session()
        self._s.trust_env = False  # loopback: never through an HTTP proxy from the environment
        if token:
            from coldstart.engine.gate import TOKEN_HEADER

            self._s.headers[TOKEN_HEADER] = token
        self._model: str | None = None

    # --- plumbing
    def _req(self, method: str, path: str, *, timeout: float | None = None, **kw) -> Any:
        import requests

        url = self.base_url + path
        try:
            r = self._s.request(method, url, timeout=timeout or self.timeout, **kw)
        except requests.Timeout as e:
            raise ColdstartError(f"{method} {path}: no answer from {self.base_url} within "
                                 f"{timeout or self.timeout:.0f} s") from e
        except requests.RequestException as e:
            raise ColdstartError(f"{method} {path}: cannot reach {self.base_url} ({type(e).__name__})") from e
        if r.status_code >= 400:
            detail = r.text.strip().replace("\n", " ")[:300]
            raise ColdstartError(f"{method} {path}: HTTP {r.status_code}: {detail}")
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            return r.text

    # --- health
    def health(self) -> bool:
        """True if GET /health answers 200 now (never raises)."""
        import requests

        try:
            return self._s.get(self.base_url + "/health", timeout=min(self.timeout, 5.0)).status_code == 200
        except requests.RequestException:
            return False

    def wait_healthy(self, timeout: float = 300.0, interval: float = 0.1) -> float:
        """Poll /health until 200; returns the seconds waited."""
        t0 = time.monotonic()
        while not self.health():
            if time.monotonic() - t0 > timeout:
                raise ColdstartError(f"GET /health: {self.base_url} not healthy after {timeout:.0f} s")
            time.sleep(interval)
        return time.monotonic() - t0

    def models(self) -> list[str]:
        data = self._req("GET", "/v1/models")
        return [m["id"] for m in data.get("data", [])]

    def model(self) -> str:
        if self._model is None:
            ids = self.models()
            if not ids:
                raise ColdstartError(f"GET /v1/models: {self.base_url} serves no model")
            self._model = ids[0]
        return self._model

    def open_gate(self) -> bool:
        """Let clients without the control token in (coldstart.engine.gate; this client must carry it)."""
        from coldstart.engine.gate import OPEN_PATH

        return bool(self._req("POST", OPEN_PATH)["open"])

    # --- dev mode (VLLM_SERVER_DEV_MODE=1; the gate answers them only with the control token)
    def sleep(self, level: int = 1) -> dict:
        return self._req("POST", "/sleep", params={"level": level})

    def wake_up(self, tags: list[str] | None = None) -> dict:
        return self._req("POST", "/wake_up", params=[("tags", t) for t in (tags or [])])

    def is_sleeping(self) -> bool:
        return bool(self._req("GET", "/is_sleeping")["is_sleeping"])

    def collective_rpc(self, method: str, args: list | tuple = (), kwargs: dict | None = None,
                       timeout: float | None = None) -> list[Any]:
        """Call ``method`` on every worker; returns one result per worker. vLLM passes only strings
        through this endpoint, so non-string arguments are JSON-encoded (our worker decodes them)."""
        body: dict[str, Any] = {
            "method": method,
            "args": [a if isinstance(a, str) else json.dumps(a) for a in args],
            "kwargs": {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in (kwargs or {}).items()},
        }
        if timeout is not None:
            body["timeout"] = timeout
        data = self._req("POST", "/collective_rpc", json=body,
                         timeout=(timeout + 30) if timeout else max(self.timeout, 600.0))
        if data is None:
            return []
        results = data.get("results", []) if isinstance(data, dict) else []
        out = []
        for r in results:
            if isinstance(r, str):
                try:
                    r = json.loads(r)
                except ValueError:
                    pass
            out.append(r)
        return out

    # --- inference
    def complete(self, prompt: str, max_tokens: int = 16, seed: int = 0, temperature: float = 0.0,
                 ignore_eos: bool = False, timeout: float | None = None) -> Completion:
        """Greedy (by default) completion; returns the text and the generated token ids.
        ``ignore_eos`` makes the length fixed (a canary compares exactly ``max_tokens`` tokens)."""
        body = {"model": self.model(), "prompt": prompt, "max_tokens": max_tokens, "seed": seed,
                "temperature": temperature, "return_token_ids": True}
        if ignore_eos:
            body["ignore_eos"] = True
        data = self._req("POST", "/v1/completions", json=body, timeout=timeout)
        try:
            choice = data["choices"][0]
            ids = choice.get("token_ids")
            if ids is None:
                raise KeyError("token_ids")
            return Completion(text=choice["text"], token_ids=list(ids))
        except (KeyError, IndexError, TypeError) as e:
            raise ColdstartError(f"POST /v1/completions: unexpected answer ({e}): {str(data)[:200]}") from e

    def score(self, prompt: str, max_tokens: int = 1, seed: int = 0, timeout: float | None = None) -> ScoredCompletion:
        """Greedy completion that also returns the prompt's token ids and per-token logprobs
        (``prompt_logprobs=0``: one forward pass over the prompt scores every prompt token)."""
        body = {"model": self.model(), "prompt": prompt, "max_tokens": max_tokens, "seed": seed,
                "temperature": 0.0, "return_token_ids": True, "prompt_logprobs": 0, "logprobs": 0}
        data = self._req("POST", "/v1/completions", json=body, timeout=timeout)
        try:
            choice = data["choices"][0]
            ptoks = list(choice["prompt_token_ids"])
            plps: list[float | None] = []
            for tok, entry in zip(ptoks, choice["prompt_logprobs"]):
                if entry is None:
                    plps.append(None)
                    continue
                lp = entry.get(str(tok), entry.get(tok))  # the prompt token's own logprob
                plps.append(float(lp["logprob"]) if lp is not None else None)
            tlps = [None if x is None else float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs", [])]
            return ScoredCompletion(text=choice["text"], token_ids=list(choice["token_ids"]), prompt_token_ids=ptoks,
                                    prompt_logprobs=plps, token_logprobs=tlps)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ColdstartError(f"POST /v1/completions (prompt_logprobs): unexpected answer ({e}): {str(data)[:200]}") from e
