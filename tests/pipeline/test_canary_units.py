"""The canary's comparison and the manifest's backward compatibility (no server: the real engine
checks are in test_pipeline.py: every restore passes it, a swapped weights file fails it)."""
from __future__ import annotations

from coldstart.engine.client import ScoredCompletion
from coldstart.pipeline.canary import MIN_TOLERANCE, check, record
from coldstart.pipeline.manifest import Canary, Manifest


class _Replay:
    """Answers score() with the given completions in turn (stands in for a server's answers)."""

    def __init__(self, *answers: ScoredCompletion):
        self.answers = list(answers)

    def score(self, prompt, max_tokens=1, seed=0):
        return self.answers.pop(0)


def _sc(lps, tok=7, ptoks=(1, 2, 3)):
    return ScoredCompletion(text="x", token_ids=[tok], prompt_token_ids=list(ptoks),
                            prompt_logprobs=[None, *lps], token_logprobs=[-0.5])


def test_record_and_check_logprob_canary():
    c = record(_Replay(_sc([-1.0, -2.0]), _sc([-1.0, -2.0])), "p")
    assert c.kind == "logprobs" and c.max_tokens == 1 and c.tolerance == MIN_TOLERANCE
    assert check(_Replay(_sc([-1.0, -2.0 + MIN_TOLERANCE / 2])), c)[0] is None
    bad, _ = check(_Replay(_sc([-1.0, -2.3])), c)
    assert bad and "logprobs differ" in bad
    assert "first token" in check(_Replay(_sc([-1.0, -2.0], tok=8)), c)[0]
    assert "tokenises" in check(_Replay(_sc([-1.0, -2.0], ptoks=(1, 2, 4))), c)[0]
    noisy = record(_Replay(_sc([-1.0, -2.0]), _sc([-1.0, -2.01])), "p")
    assert abs(noisy.tolerance - 0.04) < 1e-9  # 4x the difference of the two recordings


def test_old_manifest_canary_is_the_token_kind():
    m = Manifest(model="/m", model_digest="d", served_model_name="/m", engine_args=[], host={},
                 canary=Canary(prompt="p", token_ids=[1, 2]), files={})
    d = m.to_dict()
    for k in ("kind", "prompt_token_ids", "prompt_logprobs", "token_logprobs", "tolerance"):
        del d["canary"][k]  # a manifest written before the logprob canary
    old = Manifest.from_dict(d)
    assert old.canary.kind == "tokens" and old.canary.max_tokens == 16
