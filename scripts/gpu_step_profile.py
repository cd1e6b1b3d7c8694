"""Time one decoder layer's operators of a ``conf/model/*.yaml`` model (random weights, PyTorch) over a grid,
and write the two per-operator tables ``scripts/fit_step_model.py`` fits (Vidur's layout, ``docs/calibration.md``).

Usage::

    python scripts/gpu_step_profile.py --model llama3_1_8b --label h200 --out docs/data/h200 \\
        [--device cuda] [--tokens 1,2,4,...,4096] [--decode-batches 1,8,32,128] [--contexts 512,2048,8192]
        [--chunks 128,512,2048] [--prefix-fracs 0,0.5,0.9] [--repeats 20]
    python scripts/fit_step_model.py --mlp docs/data/h200/<model>_mlp_ms.csv \\
        --attention docs/data/h200/<model>_attention_ms.csv --model llama3_1_8b --peak h200=989e12 --bw h200=4.8e12

What is timed (one layer, batch of ``num_tokens`` rows; the medians of ``--repeats`` runs after warm-up, ms):

* ``<model>_mlp_ms.csv`` (columns of ``docs/data/vidur_llama2_7b_mlp_ms.csv``): per token count, the GEMMs
  ``attn_pre_proj`` (fused QKV: hidden -> (H + 2 Hkv) x D), ``attn_post_proj`` (H x D -> hidden),
  ``mlp_up_proj`` (fused gate + up: hidden -> 2 x intermediate), ``mlp_down_proj``; the elementwise
  ``input_layernorm`` / ``post_attention_layernorm`` (RMSNorm), ``attn_rope`` (rotary on q and k),
  ``mlp_act`` (SiLU x mul), ``add`` (one residual add), and ``emb`` (embedding lookup).
* ``<model>_attention_ms.csv`` (columns of ``docs/data/vidur_llama2_7b_attention_ms.csv``): prefill of a
  chunk of ``prefill_chunk_size`` tokens after a cached prefix of ``kv_cache_size`` tokens (causal within
  the chunk, full over the prefix: ``n * p + n (n + 1) / 2`` pairs; prefixes from ``--prefix-fracs`` of the
  chunk + prefix), and decode of ``batch_size`` sequences of ``kv_cache_size`` context each
  (``torch.nn.functional.scaled_dot_product_attention``, grouped KV heads expanded); ``reshape_ms`` is the
  write of the step's new K and V into a KV-cache tensor (``index_copy_``, vLLM's ``reshape_and_cache``).

Clocks: CUDA events on a CUDA device (``torch.cuda.Event(enable_timing=True)``), ``time.perf_counter``
otherwise (CPU PyTorch: the test runs the tiny model on a tiny grid in seconds). These are PyTorch's own
kernels, not vLLM's (FlashAttention / paged attention): the fitted efficiencies describe this script's
kernels, an upper bound on the step time of a tuned engine.

No GPU was lent to the session that wrote this script: it has run on CPU only (the test
``tests/test_gpu_step_profile.py``); an ``h200`` profile from it is still to be made on a lent device.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from harness.core import cmdline  # noqa: E402  (standard library only: the script needs no harness install)
MLP_COLUMNS = ["gpu", "num_tokens", "attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj",
               "input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add", "emb"]
ATTN_COLUMNS = ["gpu", "phase", "batch_size", "kv_cache_size", "prefill_chunk_size", "attn_ms", "reshape_ms"]


def load_model(name_or_path: str) -> dict:
    """A ``conf/model/<name>.yaml`` (or a YAML path) as a dict, its shape fields checked.

    Raises:
        FileNotFoundError: no such model file. ValueError: a shape field missing or not a positive int.
    """
    import yaml
    p = Path(name_or_path)
    if not p.is_file():
        p = ROOT / "conf" / "model" / f"{name_or_path}.yaml"
    if not p.is_file():
        raise FileNotFoundError(f"model {name_or_path!r}: neither a file nor conf/model/{name_or_path}.yaml")
    m = yaml.safe_load(p.read_text())
    for k in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size"):
        if not (isinstance(m.get(k), int) and m[k] > 0):
            raise ValueError(f"{p}: {k} must be a positive int, got {m.get(k)!r}")
    return m


class Timer:
    """Median time of a callable, ms: CUDA events on CUDA, ``time.perf_counter`` on CPU."""

    def __init__(self, device, repeats: int, warmup: int = 3):
        import torch
        self.torch, self.device, self.repeats, self.warmup = torch, device, repeats, warmup
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> float:
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        out = []
        if self.cuda:
            torch.cuda.synchronize(self.device)
            for _ in range(self.repeats):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b))          # ms
        else:
            for _ in range(self.repeats):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)


def profile_linear(m: dict, tokens, device, dtype, timer: Timer, label: str) -> list[dict]:
    """One row per token count of ``MLP_COLUMNS`` (ms)."""
    import torch
    import torch.nn.functional as F
    hid, H, Hkv, D, inter = m["hidden_size"], m["num_heads"], m["num_kv_heads"], m["head_dim"], m["intermediate_size"]
    g = torch.Generator(device="cpu").manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(device=device, dtype=dtype)
    qkv, o, up, down = w((H + 2 * Hkv) * D, hid), w(hid, H * D), w(2 * inter, hid), w(hid, inter)
    norm_w = torch.ones(hid, device=device, dtype=dtype)
    emb = w(m["vocab_size"], hid)
    rows = []
    for n in tokens:
        x = w(n, hid)
        q = w(n, H, D)
        k = w(n, Hkv, D)
        cos, sin = w(n, 1, D // 2), w(n, 1, D // 2)
        hmid = w(n, 2 * inter)
        a_in = w(n, inter)
        o_in = w(n, H * D)
        ids = torch.randint(0, m["vocab_size"], (n,), generator=g).to(device)

        def rms(x=x):
            return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * norm_w

        def rope(q=q, k=k):
            for t in (q, k):
                a, b = t[..., : D // 2], t[..., D // 2:]
                torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

        def act(hmid=hmid):
            gate, u = hmid.chunk(2, dim=-1)
            return F.silu(gate) * u
        rows.append({"gpu": label, "num_tokens": n,
                     "attn_pre_proj": timer(lambda: F.linear(x, qkv)),
                     "attn_post_proj": timer(lambda: F.linear(o_in, o)),
                     "mlp_up_proj": timer(lambda: F.linear(x, up)),
                     "mlp_down_proj": timer(lambda: F.linear(a_in, down)),
                     "input_layernorm": timer(rms), "post_attention_layernorm": timer(rms),
                     "attn_rope": timer(rope), "mlp_act": timer(act), "add": timer(lambda: x + x),
                     "emb": timer(lambda: F.embedding(ids, emb))})
    return rows


def profile_attention(m: dict, decode_batches, contexts, chunks, prefix_fracs, device, dtype, timer: Timer,
                      label: str) -> list[dict]:
    """Prefill (with cached prefixes) and decode rows of ``ATTN_COLUMNS`` (ms)."""
    import torch
    import torch.nn.functional as F
    H, Hkv, D = m["num_heads"], m["num_kv_heads"], m["head_dim"]
    g = torch.Generator(device="cpu").manual_seed(1)
    rep = H // Hkv

    def r(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    def kv_write(b, n, cache_tokens):
        cache = torch.zeros(2, cache_tokens, Hkv, D, device=device, dtype=dtype)
        new = r(2, b * n, Hkv, D)
        slots = torch.arange(b * n, device=device) % cache_tokens
        return lambda: cache.index_copy_(1, slots, new)

    rows = []
    for n in chunks:
        for f in prefix_fracs:
            p = int(round(f * n / (1 - f))) if f < 1 else 0    # prefix p of p + n with p / (p + n) = f
            q = r(1, H, n, D)
            k, v = r(1, Hkv, p + n, D), r(1, Hkv, p + n, D)
            # query i (absolute position p + i) sees keys 0 .. p + i
            mask = torch.ones(n, p + n, dtype=torch.bool, device=device).tril(diagonal=p)

            def attn(q=q, k=k, v=v, mask=mask):
                return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                      attn_mask=mask)
            rows.append({"gpu": label, "phase": "prefill", "batch_size": 1, "kv_cache_size": p,
                         "prefill_chunk_size": n, "attn_ms": timer(attn), "reshape_ms": timer(kv_write(1, n, p + n))})
    for b in decode_batches:
        for c in contexts:
            q = r(b, H, 1, D)
            k, v = r(b, Hkv, c + 1, D), r(b, Hkv, c + 1, D)

            def dec(q=q, k=k, v=v):
                return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))
            rows.append({"gpu": label, "phase": "decode", "batch_size": b, "kv_cache_size": c,
                         "prefill_chunk_size": 0, "attn_ms": timer(dec), "reshape_ms": timer(kv_write(b, 1, b * (c + 1)))})
    return rows


_ints = cmdline.number_list(1, integer=True)             # a comma-separated list of integers >= 1
_fracs = cmdline.number_list(0, 1, hi_open=True)           # a comma-separated list of fractions in [0, 1)


def main(argv=None) -> int:
    ap = cmdline.ArgumentParser(prog="scripts/gpu_step_profile.py", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 tables written; 2 bad input; 130 interrupted (the tables "
                                       "finished so far are written).")
    ap.add_argument("--model", required=True, help="conf/model/<name>.yaml name or a model YAML path")
    ap.add_argument("--label", required=True, help="the gpu column's value (e.g. h200, cpu)")
    ap.add_argument("--out", type=cmdline.writable(directory=True), required=True, help="directory for <model>_mlp_ms.csv, <model>_attention_ms.csv")
    ap.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    ap.add_argument("--dtype", default=None, help="bfloat16 | float16 | float32 (default: bfloat16 on CUDA, float32 on CPU)")
    ap.add_argument("--tokens", type=_ints, default=_ints("1,2,4,8,16,32,64,128,256,512,1024,2048,4096"))
    ap.add_argument("--decode-batches", type=_ints, default=_ints("1,4,16,64,128"))
    ap.add_argument("--contexts", type=_ints, default=_ints("128,512,2048,8192"))
    ap.add_argument("--chunks", type=_ints, default=_ints("64,256,1024,2048"))
    ap.add_argument("--prefix-fracs", type=_fracs, default=_fracs("0,0.5,0.8,0.9"))
    ap.add_argument("--repeats", type=cmdline.number(1, integer=True), default=20, help="timed repeats (>= 1)")
    a = ap.parse_args(argv)
    import pandas as pd
    import torch
    m = load_model(a.model)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, a.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    timer = Timer(device, a.repeats)
    a.out.mkdir(parents=True, exist_ok=True)
    name = m.get("name", Path(a.model).stem)
    with torch.inference_mode():
        lin = pd.DataFrame(profile_linear(m, a.tokens, device, dtype, timer, a.label), columns=MLP_COLUMNS)
        lin.to_csv(a.out / f"{name}_mlp_ms.csv", index=False)       # written before the attention grid runs
        att = pd.DataFrame(profile_attention(m, a.decode_batches, a.contexts, a.chunks, a.prefix_fracs, device,
                                             dtype, timer, a.label), columns=ATTN_COLUMNS)
        att.to_csv(a.out / f"{name}_attention_ms.csv", index=False)
    print(f"wrote {a.out / f'{name}_mlp_ms.csv'} ({len(lin)} rows), {a.out / f'{name}_attention_ms.csv'} "
          f"({len(att)} rows) on {device} ({'CUDA events' if device.type == 'cuda' else 'perf_counter'}, {dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
