"""Self-made Llama models with random weights: no model can be downloaded here, and tests and
benchmarks need a real Hugging Face layout that transformers and vLLM load offline.

Everything is deterministic from the seed: the tokenizer corpus, the BPE merges and every tensor
(each tensor gets its own generator seeded from (seed, tensor name), so the bytes do not depend on
the order tensors are made in). Weights are drawn straight into bf16 tensors with a seeded
``torch.Generator`` (no transformers initialisation: the ~1.3 GiB "bench" model takes seconds).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from coldstart.errors import ColdstartError
from coldstart.fsutil import fsync_dir, fsync_tree
from coldstart.state import cache_root


@dataclass(frozen=True)
class TinySpec:
    """Shape of a generated model (Llama architecture)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # model vocabulary (>= tokenizer vocabulary; the rest are padding rows)
    tokenizer_vocab: int  # BPE vocabulary trained on the generated corpus
    max_position_embeddings: int = 2048


# head_dim 64 everywhere: vLLM's CPU attention backend supports it.
SIZES: dict[str, TinySpec] = {
    # ~7 MB bf16: fast enough for every test, still a real multi-layer GQA Llama.
    "tiny": TinySpec(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=2048, tokenizer_vocab=2048),
    # ~1.3 GiB bf16 (~700 M parameters): the benchmark model (big enough that reads dominate).
    "bench": TinySpec(hidden_size=2048, intermediate_size=5632, num_hidden_layers=12, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=32000, tokenizer_vocab=4096),
}

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]

_WORDS = (
    "the a an of to in and is was for on with as by at from that this it be are were has have had not "
    "but or which one all will can there their they we you he she his her its our your model weight "
    "token cache memory page file disk read write load store start restore snapshot server request "
    "fast slow cold warm first second time process thread buffer stream copy layer tensor vector matrix "
    "attention head value key query kernel device host network socket image container checkpoint "
    "coldstart engine worker sleep wake prompt answer question number data test run result table"
).split()


def _corpus(seed: int, n_lines: int = 4000) -> list[str]:
    """A deterministic pseudo-English corpus (words, numbers, punctuation) for BPE training."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = []
        for _ in range(rng.randint(4, 20)):
            r = rng.random()
            if r < 0.08:
                words.append(str(rng.randint(0, 9999)))
            elif r < 0.12:
                words.append(rng.choice([",", ".", "?", "!", ":", ";", "(", ")", "-"]))
            else:
                w = rng.choice(_WORDS)
                words.append(w.capitalize() if rng.random() < 0.1 else w)
        lines.append(" ".join(words))
    return lines


def _train_tokenizer(spec: TinySpec, seed: int):
    """Byte-level BPE trained locally with `tokenizers`, wrapped as a transformers fast tokenizer."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # deterministic and quiet
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.tokenizer_vocab, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=spec.max_position_embeddings)


def _tensor_seed(seed: int, name: str) -> int:
    h = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def _param_shapes(spec: TinySpec) -> list[tuple[str, tuple[int, ...], float]]:
    """(name, shape, init std) in the Hugging Face LlamaForCausalLM naming; std 0 means ones (norms).

    Standard deviations are 1/sqrt(fan_in) (not HF's 0.02) so activations stay O(1) and the logits
    of random weights are well separated: greedy decoding then gives the same tokens every time.
    """
    h, i, hd = spec.hidden_size, spec.intermediate_size, spec.hidden_size // spec.num_attention_heads
    kv = spec.num_key_value_heads * hd
    out: list[tuple[str, tuple[int, ...], float]] = [("model.embed_tokens.weight", (spec.vocab_size, h), 1.0)]
    for n in range(spec.num_hidden_layers):
        p = f"model.layers.{n}."
        out += [
            (p + "input_layernorm.weight", (h,), 0.0),
            (p + "self_attn.q_proj.weight", (h, h), 1 / math.sqrt(h)),
            (p + "self_attn.k_proj.weight", (kv, h), 1 / math.sqrt(h)),
            (p + "self_attn.v_proj.weight", (kv, h), 1 / math.sqrt(h)),
            (p + "self_attn.o_proj.weight", (h, h), 1 / math.sqrt(h)),
            (p + "post_attention_layernorm.weight", (h,), 0.0),
            (p + "mlp.gate_proj.weight", (i, h), 1 / math.sqrt(h)),
            (p + "mlp.up_proj.weight", (i, h), 1 / math.sqrt(h)),
            (p + "mlp.down_proj.weight", (h, i), 1 / math.sqrt(i)),
        ]
    out += [("model.norm.weight", (h,), 0.0), ("lm_head.weight", (spec.vocab_size, h), 4 / math.sqrt(h))]
    return out


def _make_weights(spec: TinySpec, seed: int) -> dict:
    import torch

    tensors = {}
    for name, shape, std in _param_shapes(spec):
        if std == 0.0:
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            continue
        g = torch.Generator().manual_seed(_tensor_seed(seed, name))
        tensors[name] = torch.empty(shape, dtype=torch.bfloat16).normal_(0.0, std, generator=g)
    return tensors


def _config(spec: TinySpec, tokenizer) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.hidden_size // spec.num_attention_heads,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
        "use_cache": True,
    }


def make_tiny(out_dir: Path, size: str = "tiny", seed: int = 0, *, overwrite: bool = False) -> Path:
    """Write a random-weight Llama (safetensors + config + tokenizer) to ``out_dir`` atomically.

    The model is built in a staging directory next to ``out_dir`` and renamed into place, so a
    crash never leaves a half-made model at ``out_dir``. If another process published the same
    model first, its copy is kept (same seed and size give the same bytes).
    """
    if size not in SIZES:
        raise ColdstartError(f"unknown model size {size!r} (choose from {', '.join(SIZES)})")
    spec = SIZES[size]
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        if _same_model(out_dir, size, seed):
            return out_dir  # already made (same size and seed give the same bytes)
        if (out_dir / "config.json").exists():
            raise ColdstartError(f"{out_dir} already exists and is another model (use --overwrite to replace it)")
        if any(out_dir.iterdir()):
            raise ColdstartError(f"{out_dir} exists and is not empty")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        from safetensors.torch import save_file

        tokenizer = _train_tokenizer(spec, seed)
        tokenizer.save_pretrained(str(staging))
        cfg = _config(spec, tokenizer)
        (staging / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False}
        (staging / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
        save_file(_make_weights(spec, seed), str(staging / "model.safetensors"), metadata={"format": "pt"})
        (staging / "coldstart-model.json").write_text(
            json.dumps({"generator": "coldstart.models.tiny", "size": size, "seed": seed, "spec": asdict(spec)},
                       indent=2, sort_keys=True) + "\n")
        for p in staging.iterdir():
            p.chmod(0o644)  # safetensors writes 0600; models are shared read-only by every user/container
        fsync_tree(staging)
        if out_dir.exists():  # overwrite (or an empty directory): move the old one aside first
            old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
            os.rename(out_dir, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(staging, out_dir)
        except OSError:
            if (out_dir / "config.json").exists():  # a concurrent maker won the race: keep theirs
                shutil.rmtree(staging, ignore_errors=True)
                return out_dir
            raise
        fsync_dir(out_dir.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def _same_model(out_dir: Path, size: str, seed: int) -> bool:
    try:
        meta = json.loads((out_dir / "coldstart-model.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("size") == size and meta.get("seed") == seed and (out_dir / "model.safetensors").exists()


def model_dir(size: str = "tiny", seed: int = 0) -> Path:
    """Where this machine keeps a made model: $COLDSTART_CACHE/models/<size>-seed<seed>."""
    return cache_root() / "models" / f"{size}-seed{seed}"


def cached_model(size: str = "tiny", seed: int = 0) -> Path:
    """The machine's copy of a tiny model ($COLDSTART_CACHE/models/<size>-seed<seed>), made on first use:
    what the demo, the benchmarks and the tests share."""
    out = model_dir(size, seed)
    if not (out / "config.json").exists():
        make_tiny(out, size=size, seed=seed)
    return out
