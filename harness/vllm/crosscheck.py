"""Cross-check our client-side TTFT against the server's own ``vllm:time_to_first_token_seconds``.

``python -m harness.vllm.crosscheck URL MODEL [--requests 8] [--prompt-tokens 512]`` sends a fixed set of
sequential streaming requests (so no queueing), measures TTFT the way the replay does (first token chunk
minus send time, ``time.perf_counter``), and compares the mean with the server histogram's mean over the
same requests (delta of ``_sum`` / delta of ``_count`` between two scrapes). The server clocks from when
it received the request, so ours should exceed it by the HTTP and tokenisation overhead only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

from harness.vllm.client import completion_body, stream_completion
from harness.vllm.scrape import histogram_mean, parse_metrics


@dataclass
class CrossCheck:
    """Means over the same requests (s): ``ours_mean_s`` (client), ``server_mean_s`` (histogram);
    ``count`` requests; ``server_count`` observations the histogram gained (should equal ``count``)."""

    ours_mean_s: float
    server_mean_s: float
    count: int
    server_count: float


async def _scrape(session: aiohttp.ClientSession, url: str):
    async with session.get(url + "/metrics") as r:
        return parse_metrics(await r.text())


async def crosscheck(url: str, model: str, requests: int = 8, prompt_tokens: int = 512, max_tokens: int = 4,
                     first_id: int = 3, vocab: int = 4000) -> CrossCheck:
    """Run the fixed request set against ``url`` and return both means. Raises RuntimeError on a failed request."""
    async with aiohttp.ClientSession() as session:
        before = histogram_mean(await _scrape(session, url), "vllm:time_to_first_token_seconds")
        ours = []
        for k in range(requests):
            ids = [first_id + (k * 7919 + j * 31) % (vocab - first_id) for j in range(prompt_tokens)]
            t0 = time.perf_counter()
            res = await stream_completion(session, url, completion_body(model, ids, max_tokens, True))
            if res.error:
                raise RuntimeError(f"cross-check request {k} failed: {res.error}")
            ours.append(res.first_token_s - t0)
        await asyncio.sleep(0.5)  # let the server's metrics catch up
        after = histogram_mean(await _scrape(session, url), "vllm:time_to_first_token_seconds")
    n = after[1] - before[1]
    return CrossCheck(sum(ours) / len(ours), (after[0] - before[0]) / n if n else float("nan"), requests, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(crosscheck(a.url, a.model, a.requests, a.prompt_tokens)).__dict__, indent=2))


if __name__ == "__main__":
    main()
