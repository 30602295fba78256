"""A config-only model folder for the engines' schedulers: no weights, no tokenizer.

vLLM's ModelConfig reads an HF config.json to size the scheduler (context length, architecture);
the differential tests never run a forward pass, so the tiny Llama shape of the CPU test model is
written as JSON, without transformers.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 65536,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 3,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "torch_dtype": "float32",
    "tie_word_embeddings": False,
}


def fake_model_dir(root: Path | str | None = None) -> str:
    """Write (once) and return a folder holding only config.json."""
    base = Path(root) if root else Path(tempfile.gettempdir()) / "agentload-sim2real-model"
    base.mkdir(parents=True, exist_ok=True)
    cfg = base / "config.json"
    text = json.dumps(CONFIG, indent=1)
    if not cfg.exists() or cfg.read_text() != text:
        cfg.write_text(text)
    return str(base)
