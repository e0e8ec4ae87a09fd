"""A tiny random Llama with a byte-level BPE tokenizer and a chat template, made offline.

Real vLLM needs a real model folder; none can be downloaded here. This builds one (2 layers,
hidden 128, 4 heads, random weights) in a few seconds. Its outputs are noise: compare two
serving paths with each other (and send `ignore_eos: true`), never with fixed text.

The build needs torch, transformers and tokenizers, which live in the vLLM venv, not in
poolpilot's. So `ensure_tiny_model()` runs this file as a script with the vLLM venv's Python;
only the standard library is imported at module level.

    python sandbox/tinymodel.py OUT_DIR        # with a Python that has transformers
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Bump when the recipe changes so cached folders are rebuilt.
RECIPE_VERSION = "2"
MARKER = ".poolpilot-tiny-model.json"
DEFAULT_DIR = Path(".cache") / "tiny-llama"

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CONFIG = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    # Larger than the usual 0.02 so greedy outputs vary with the prompt (comparisons between
    # serving paths mean something) instead of repeating one token.
    "initializer_range": 0.2,
}


def vllm_python() -> Path:
    """The vLLM venv's interpreter: $POOLPILOT_VLLM_VENV (default .cache/vllm-venv)."""
    venv = Path(os.environ.get("POOLPILOT_VLLM_VENV", ".cache/vllm-venv"))
    return venv / "bin" / "python"


def is_built(dest: Path) -> bool:
    marker = dest / MARKER
    if not marker.is_file():
        return False
    try:
        return bool(json.loads(marker.read_text()).get("recipe") == RECIPE_VERSION)
    except ValueError:
        return False


def ensure_tiny_model(dest: Path | None = None, python: Path | None = None) -> Path:
    """Build the model into `dest` unless it is already there; return the folder.

    Idempotent and cached: the marker file is written last, so an interrupted build is redone.
    """
    dest = (dest or DEFAULT_DIR).resolve()
    if is_built(dest):
        return dest
    interpreter = python or vllm_python()
    if not Path(interpreter).exists():
        raise FileNotFoundError(
            f"{interpreter} not found: the tiny model is built with the vLLM venv's Python; "
            "run `./dev setup-vllm` or set POOLPILOT_VLLM_VENV"
        )
    subprocess.run([str(interpreter), str(Path(__file__).resolve()), str(dest)], check=True)
    if not is_built(dest):
        raise RuntimeError(f"building the tiny model in {dest} did not finish")
    return dest


def _corpus() -> list[str]:
    """Deterministic English-like text to train the BPE on (no downloads)."""
    text = (
        "the a prefill decode cache token engine router pool request stream model fast slow "
        "batch queue latency scale replica kernel memory block transfer user assistant system "
        "hello world question answer number one two three four five six seven eight nine ten"
    )
    words = text.split()
    lines = []
    for i in range(3000):
        n = 5 + i % 17
        lines.append(" ".join(words[(i * 7 + j * 13) % len(words)] for j in range(n)) + ".")
    lines += [f"{i} + {i + 1} = {2 * i + 1}" for i in range(500)]
    return lines


def build(dest: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    dest.mkdir(parents=True, exist_ok=True)
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CONFIG["vocab_size"],
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(dest)

    torch.manual_seed(0)
    config = LlamaConfig(
        **CONFIG,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(dest, safe_serialization=True)
    (dest / MARKER).write_text(json.dumps({"recipe": RECIPE_VERSION}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tinymodel.py OUT_DIR")
    build(Path(sys.argv[1]))
