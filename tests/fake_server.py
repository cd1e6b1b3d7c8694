"""A stand-in for ``vllm.entrypoints.openai.api_server`` in tests/test_launcher_guard.py (standard library
only, run by path): answers ``GET /health`` (200) on ``--port`` and, like vLLM's API server spawning
``VLLM::EngineCore`` and ``VLLM::Worker``, starts three children that outlive it unless someone stops them:
one that stays in its process group, one that ignores SIGTERM (only SIGKILL stops it), and one that leaves
the group (``setsid``; reachable only as a descendant). Writes its own pid and its children's, one a line,
to ``--pids`` once it listens."""

from __future__ import annotations

import argparse
import http.server
import os
import subprocess
import sys

SLEEP = "import time; time.sleep(600)"
IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 -- http.server's name
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pids", required=True)
    a, _ = ap.parse_known_args()
    kids = [subprocess.Popen([sys.executable, "-c", SLEEP]),
            subprocess.Popen([sys.executable, "-c", IGNORE_TERM]),
            subprocess.Popen([sys.executable, "-c", SLEEP], start_new_session=True)]
    srv = http.server.HTTPServer(("127.0.0.1", a.port), Health)
    tmp = a.pids + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(str(p) for p in [os.getpid(), *(k.pid for k in kids)]) + "\n")
    os.replace(tmp, a.pids)
    srv.serve_forever()


if __name__ == "__main__":
    main()
