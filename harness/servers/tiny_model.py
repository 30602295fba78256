"""Build a tiny random Llama model and a word-level tokenizer for driving a real engine offline.

Run it with the ENGINE's python (it needs torch + transformers + tokenizers, which the harness
venv does not carry):

    .engine-venv/vllm/bin/python harness/servers/tiny_model.py OUT_DIR

(as a file, not with -m: importing the harness package would need the harness's dependencies in
the engine venv). Idempotent: a directory already built with the same settings is left alone.

Why a random model: the harness only needs the engine's scheduling, paging and prefix cache to be
real; what the tokens mean is irrelevant (prompts are random ids, decoding is greedy with
ignore_eos). No hub access is possible on CI or on the cluster's compute nodes, so the model and
tokenizer are generated locally from a fixed seed; greedy output is then repeatable across restarts.
The vocabulary covers ids 0..31999 so any client token range [4, 32000) is valid.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VOCAB_SIZE = 32000
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3: unk, bos, eos, pad
SEED = 20261129
MAX_POSITIONS = 65536
STAMP = "agentload-tiny-model.json"


def build(out_dir: Path, *, seed: int = SEED, max_positions: int = MAX_POSITIONS) -> Path:
    """Write config, bf16 safetensors and tokenizer files into `out_dir`; idempotent by stamp."""
    out_dir = Path(out_dir)
    stamp = out_dir / STAMP
    spec = {"seed": seed, "vocab_size": VOCAB_SIZE, "max_position_embeddings": max_positions, "version": 1}
    if stamp.exists() and json.loads(stamp.read_text()) == spec and (out_dir / "config.json").exists():
        return out_dir

    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=max_positions,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIALS), VOCAB_SIZE)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=max_positions,
    )
    fast.save_pretrained(out_dir)
    stamp.write_text(json.dumps(spec))
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build the tiny random Llama model + tokenizer used for CPU engine tests.")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--max-positions", type=int, default=MAX_POSITIONS)
    args = ap.parse_args(argv)
    path = build(args.out_dir, seed=args.seed, max_positions=args.max_positions)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
