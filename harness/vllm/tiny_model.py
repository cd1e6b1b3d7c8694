"""Build a tiny random-weight Qwen3 model and a matching tokenizer, offline, for real-vLLM tests on CPU.

``python -m harness.vllm.tiny_model OUT_DIR`` writes a Hugging Face model directory that ``vllm serve``
loads: ``Qwen3ForCausalLM`` with 2 layers, hidden 256, 4 query / 2 KV heads, head_dim 64, intermediate
512, tied embeddings, bf16 (about 2 M parameters, the shape recorded in docs/vllm_cpu.md), and a
byte-level BPE tokenizer trained with ``tokenizers`` on Python's own standard-library sources. No hub is
contacted. Output text is gibberish; lengths are exact with ``ignore_eos`` and ``max_tokens``.

The directory is built whole or not at all: :func:`build` writes into a temporary directory beside
the target (``.<name>.build-<pid>-*``), the marker ``harness_tiny_model.json`` last, and renames it into place
(``rename(2)``, atomic within one filesystem). An interrupted build leaves only its temporary directory (removed
by the next build once its pid is gone); of two concurrent builds the first rename wins and the other discards
its copy. :func:`ensure` (``backend.model=tiny``, ``harness.vllm.cluster.model_path``) trusts a directory only
with the marker: one without it (left by a build before this, or by another hand) is moved aside and rebuilt.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)
MARKER = "harness_tiny_model.json"   # written last: a directory with it is complete


def _corpus(max_files: int = 200) -> list[str]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(lib.glob("*.py"))[:max_files]
    return [f.read_text(errors="replace") for f in files]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(out: Path) -> None:
    """Remove the temporary directories of builds of ``out`` whose process is gone (killed mid-build)."""
    for d in out.parent.glob(f".{out.name}.build-*"):
        try:
            pid = int(d.name[len(f".{out.name}.build-"):].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(d, ignore_errors=True)


def _move_aside(out: Path) -> None:
    """Move an incomplete ``out`` (no :data:`MARKER`) out of the way and remove it (another process may have
    done so already)."""
    aside = out.with_name(f".{out.name}.incomplete-{os.getpid()}")
    try:
        os.rename(out, aside)
    except FileNotFoundError:
        return
    log.warning("%s has no %s (an interrupted build): moved aside and rebuilt", out, MARKER)
    shutil.rmtree(aside, ignore_errors=True)


def ensure(out_dir: str | Path) -> Path:
    """The tiny model at ``out_dir``: returned as is when complete (:data:`MARKER`), else built (:func:`build`);
    a directory there without the marker is moved aside first (module docstring).

    Raises:
        OSError: the directory cannot be written. ImportError: torch / transformers / tokenizers missing.
    """
    out = Path(out_dir)
    if out.parent.is_dir():
        _remove_stale(out)
    if (out / MARKER).is_file():
        return out
    if out.exists():
        _move_aside(out)
    log.info("building the tiny test model in %s", out)
    return build(out)


def build(out_dir: str | Path, vocab_size: int = 4096, max_position_embeddings: int = 8192,
          seed: int = 0) -> Path:
    """Write the tiny model + tokenizer to ``out_dir``, atomically (module docstring); returns the path. When a
    complete model is already there (another build finished first), this build's copy is discarded. Needs
    torch, transformers.

    Raises:
        OSError: the directory cannot be written.
    """
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-{os.getpid()}-", dir=out.parent))
    try:
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(_corpus(), vocab_size=vocab_size, min_frequency=2, special_tokens=specials)
        tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>",
                                      pad_token="<|endoftext|>", bos_token=None)
        tok.save_pretrained(tmp)
        n_vocab = len(tok)
        torch.manual_seed(seed)
        cfg = Qwen3Config(vocab_size=n_vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                          max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
                          torch_dtype="bfloat16", eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
        model.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps({"vocab_size": n_vocab, "seed": seed}))
        os.chmod(tmp, 0o755)                  # mkdtemp's 0700 -> a plain directory's mode
        for _ in range(2):
            try:
                os.rename(tmp, out)           # atomic: out appears complete or not at all
                return out
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                    raise
            if (out / MARKER).is_file():      # another build finished first: its copy is the model
                shutil.rmtree(tmp, ignore_errors=True)
                return out
            _move_aside(out)                  # an incomplete directory in the way
        raise OSError(errno.EEXIST, "cannot rename the built model into place", str(out))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--vocab-size", type=int, default=4096)
    args = ap.parse_args(argv)
    path = build(args.out_dir, args.vocab_size)
    print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
