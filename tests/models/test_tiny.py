"""The self-made models: deterministic bytes, an offline-loadable HF layout, a stable greedy output."""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coldstart.errors import ColdstartError
from coldstart.models.tiny import SIZES, _param_shapes, make_tiny


def _digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_layout(tiny_model_dir):
    names = {p.name for p in tiny_model_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= names
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["torch_dtype"] == "bfloat16"
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64  # a head size vLLM's CPU backend takes
    size = (tiny_model_dir / "model.safetensors").stat().st_size
    assert 1 << 20 < size < 32 << 20
    assert not [p for p in tiny_model_dir.parent.iterdir() if ".staging-" in p.name and "tiny-seed0" in p.name]


def test_deterministic_from_seed(tmp_path, tiny_model_dir):
    a = make_tiny(tmp_path / "a", size="tiny", seed=0)
    assert _digests(a) == _digests(tiny_model_dir)  # same bytes as the shared fixture, made elsewhere
    b = make_tiny(tmp_path / "b", size="tiny", seed=1)
    da, db = _digests(a), _digests(b)
    assert da["model.safetensors"] != db["model.safetensors"]
    assert make_tiny(a, size="tiny", seed=0) == a  # idempotent: the same model is already there
    with pytest.raises(ColdstartError, match="another model"):
        make_tiny(a, size="tiny", seed=1)
    with pytest.raises(ColdstartError, match="unknown model size"):
        make_tiny(tmp_path / "c", size="huge")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_bench_size_is_in_range():
    spec = SIZES["bench"]
    nbytes = sum(math.prod(shape) * 2 for _, shape, _ in _param_shapes(spec))
    assert 1.2 * 2**30 <= nbytes <= 1.6 * 2**30


def test_transformers_loads_offline_and_greedy_is_stable(tiny_model_dir):
    """transformers (offline) loads it; greedy decoding gives the same, non-trivial tokens twice."""
    code = f"""
import json, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained({str(tiny_model_dir)!r})
m = AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r}, dtype=torch.bfloat16)
ids = tok("The fast model loads weights", return_tensors="pt").input_ids
outs = [m.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:].tolist() for _ in range(2)]
logits = m(ids).logits[0, -1].float()
top = logits.topk(2).values.tolist()
print(json.dumps({{"outs": outs, "text": tok.decode(outs[0]), "margin": top[0] - top[1],
                   "roundtrip": tok.decode(tok("hello world 42").input_ids, skip_special_tokens=True)}}))
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["outs"][0] == res["outs"][1] and len(res["outs"][0]) == 12
    assert len(set(res["outs"][0])) > 1
    assert res["margin"] > 0.1  # the top logit is clearly ahead: greedy is not decided by rounding
    assert res["roundtrip"] == "hello world 42"


def test_cli_make_tiny(tmp_path, capsys, monkeypatch):
    from coldstart import cli

    out = tmp_path / "m"
    monkeypatch.setattr(sys, "argv", ["coldstart", "model", "make-tiny", "--size", "tiny", "--seed", "3", "--out", str(out)])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code in (0, None)
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out) and (out / "model.safetensors").exists()
    # the script wrapper, as a newcomer runs it (fails fast: no model is made)
    script = Path(__file__).resolve().parents[2] / "scripts" / "make-tiny-model"
    r = subprocess.run([str(script), "--size", "nope", "--out", str(tmp_path / "x")], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1 and r.stderr.strip().startswith("error:") and not (tmp_path / "x").exists()
