"""Build a tiny random-weight Qwen3 model and a matching tokenizer, offline, for real-vLLM tests on CPU.

``python -m harness.vllm.tiny_model OUT_DIR`` writes a Hugging Face model directory that ``vllm serve``
loads: ``Qwen3ForCausalLM`` with 2 layers, hidden 256, 4 query / 2 KV heads, head_dim 64, intermediate
512, tied embeddings, bf16 (about 2 M parameters, the shape recorded in docs/vllm_cpu.md), and a
byte-level BPE tokenizer trained with ``tokenizers`` on Python's own standard-library sources. No hub is
contacted. Output text is gibberish; lengths are exact with ``ignore_eos`` and ``max_tokens``.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path


def _corpus(max_files: int = 200) -> list[str]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(lib.glob("*.py"))[:max_files]
    return [f.read_text(errors="replace") for f in files]


def build(out_dir: str | Path, vocab_size: int = 4096, max_position_embeddings: int = 8192,
          seed: int = 0) -> Path:
    """Write the tiny model + tokenizer to ``out_dir``; returns the path. Needs torch, transformers."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(_corpus(), vocab_size=vocab_size, min_frequency=2, special_tokens=specials)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>",
                                  pad_token="<|endoftext|>", bos_token=None)
    tok.save_pretrained(out)
    n_vocab = len(tok)
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=n_vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
                      torch_dtype="bfloat16", eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    (out / "harness_tiny_model.json").write_text(json.dumps({"vocab_size": n_vocab, "seed": seed}))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--vocab-size", type=int, default=4096)
    args = ap.parse_args(argv)
    path = build(args.out_dir, args.vocab_size)
    print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
