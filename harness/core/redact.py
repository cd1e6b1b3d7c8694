"""Redaction of credentials: one rule for every file a run writes and for W&B.

Moved here from ``harness.run.loggers`` (which re-exports every name) so that the analysis wing
(``harness.analysis.provenance``: a lock file's command line) uses the same rule without importing the run
wing. What the rule redacts and where: docs/outputs.md, "Secrets, partial runs and the cache"; the module
docstring of ``harness.run.loggers``.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from typing import Any, Sequence

REDACTED = "<redacted>"
# Credential-like key names. "token" must be a whole word (not "tokens"), and "per_token" (a unit) is not
# a credential.
_SECRET_WORDS = re.compile(r"api[_\-]?key|secret|passw(or)?d|credential|private[_\-]?key|bearer|authorization",
                           re.IGNORECASE)
_TOKEN_WORD = re.compile(r"(^|[^a-z])token($|[^a-z])", re.IGNORECASE)
_UNIT_TOKEN = re.compile(r"per[_\-]token", re.IGNORECASE)
_TOKEN_END = re.compile(r"token$", re.IGNORECASE)   # a name ending in "token" (authtoken, HFTOKEN), not "tokens"


@functools.lru_cache(maxsize=4096)
def is_secret_key(key: str) -> bool:
    """Whether a mapping key names a credential (its value must never be logged).

    True for e.g. ``api_key``, ``WANDB_API_KEY``, ``hf_token``, ``token``, ``access-token``, ``authtoken``,
    ``client_secret``, ``db_password`` (every name ending in ``api_key``, ``token``, ``secret`` or ``password``);
    false for token counts and units (``max_num_batched_tokens``, ``prompt_tokens``,
    ``kv_bytes_per_token``, ``tokens_per_joule``).
    """
    k = str(key)
    if _SECRET_WORDS.search(k):
        return True
    return bool(_TOKEN_WORD.search(k) or _TOKEN_END.search(k)) and not _UNIT_TOKEN.search(k)


# Secret-looking values, whatever their key: well-known credential prefixes (OpenAI/Anthropic ``sk-``,
# Hugging Face ``hf_``, GitHub ``ghp_``/``github_pat_``, Slack ``xox?-``, AWS access key ids, W&B's
# 40-hex API keys, JWTs), and ``Bearer`` headers; a ``KEY=value`` string whose key is a credential.
_SECRET_VALUE = re.compile(
    r"\b(sk-[A-Za-z0-9_\-]{16,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|xox[abpors]-[A-Za-z0-9\-]{10,}|AKIA[0-9A-Z]{16}|[0-9a-f]{40}|eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]+)\b"
    r"|bearer\s+\S+", re.IGNORECASE)
# CLI flags whose next argument is a credential (``--api-key sk-...``); also ``--api-key=...``.
_SECRET_FLAG = re.compile(r"^--?[a-z0-9_\-]*(api[_\-]?key|token|secret|passw(or)?d|credential)$", re.IGNORECASE)


# A URL's password (``scheme://user:password@host``).
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.\-]*://[^/\s:@]*:)(?P<pw>[^/\s@]+)(?=@)", re.IGNORECASE)
# A header or assignment whose name is a credential: ``X-Api-Key: v``, ``Authorization: Basic v``,
# ``api_key=v``, ``"token": "v"`` (the name is judged by :func:`is_secret_key`).
_NAMED_VALUE = re.compile(r"(?P<name>[A-Za-z][A-Za-z0-9_\-]*)(?P<sep>\"?\s*[:=]\s*\"?)(?P<val>[^\s\"',;&]+)")
# ``Authorization: <scheme> <credentials>`` (RFC 9110 11.6.2): the scheme is kept, the credentials go.
_AUTH_HEADER = re.compile(r"(?P<head>(proxy-)?authorization\"?\s*[:=]\s*\"?(?:[A-Za-z]+\s+)?)(?P<val>[^\s\"',;]+)",
                          re.IGNORECASE)
_MIN_ENV_SECRET = 8  # shorter environment values ("1", "true") are not redacted wherever they occur
_MIN_KNOWN_SECRET = 4   # shorter values under a credential's name ("", "none") are not redacted wherever they occur


def _env_secrets() -> list[str]:
    """Values of the environment variables whose names are credentials (``WANDB_API_KEY``, ``HF_TOKEN``,
    ``AWS_SECRET_ACCESS_KEY``, ...); read at each call (the environment may change)."""
    return [v for k, v in os.environ.items() if is_secret_key(k) and len(v) >= _MIN_ENV_SECRET]


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _named(m: re.Match) -> str:
    name, val = m.group("name"), m.group("val")
    if not is_secret_key(name) or val == REDACTED or name.lower().endswith("authorization"):
        return m.group(0)
    if _NUMBER.fullmatch(val) and not _SECRET_WORDS.search(name):   # a count or a scale (token_scale=0.1)
        return m.group(0)
    return f"{name}{m.group('sep')}{REDACTED}"


def scrub_string(v: str, known: Sequence[str] = ()) -> str:
    """``v`` with every credential it holds replaced by ``"<redacted>"``, whatever key it is logged under:
    each of the strings ``known`` (a run's own credentials, :func:`secret_values`) and the value of an
    environment variable named like a credential (:func:`_env_secrets`) wherever they occur, a URL's password,
    the value after a credential's name (``X-Api-Key: ...``, ``token=...``, ``--api-key=...``), and
    well-known credential shapes (``sk-``/``hf_``/``ghp_`` prefixes, 40-hex keys, JWTs, ``Bearer ...``)."""
    return _scrub_str(v, _literals(known))


_RUN_SECRETS: set[str] = set()


def remember_secrets(values: Sequence[str]) -> None:
    """Register a run's own credentials (:func:`secret_values` of its config; ``harness.run.cli`` does, before
    anything is written) so that every later :func:`scrub` / :func:`scrub_string` in this process redacts
    them wherever they occur -- a log line, an error message in ``summary.json`` -- as the environment's are."""
    _RUN_SECRETS.update(v for v in values if len(v) >= _MIN_KNOWN_SECRET)


def _literals(known: Sequence[str]) -> tuple[str, ...]:
    """The literal credentials to replace wherever they occur: ``known``, the environment's and those
    :func:`remember_secrets` registered, longest first (read once per :func:`scrub` / :func:`scrub_string`
    call, not per string)."""
    return _longest_first(_env_secrets(), _RUN_SECRETS, known)


def _longest_first(*groups: Sequence[str]) -> tuple[str, ...]:
    """The distinct strings of ``groups``, longest first (a credential that holds another is replaced whole)."""
    return tuple(sorted({s for g in groups for s in g}, key=len, reverse=True))


def _scrub_str(v: str, literals: tuple[str, ...]) -> str:
    for secret in literals:
        v = v.replace(secret, REDACTED)
    v = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, v)
    if "=" in v:
        k, _, rest = v.partition("=")
        if _SECRET_FLAG.match(k) and rest:
            return f"{k}={REDACTED}"
    v = _AUTH_HEADER.sub(lambda m: m.group("head") + REDACTED, v)
    v = _NAMED_VALUE.sub(_named, v)
    return _SECRET_VALUE.sub(REDACTED, v)


def scrub(obj: Any, known: Sequence[str] = ()) -> Any:
    """A copy of ``obj`` (nested dicts / lists) with credentials replaced by ``"<redacted>"``: under a secret
    key (:func:`is_secret_key`) any value but a bool or null, and but a number under a token-named key (a
    metric named ``first_token_s`` or ``output_token_throughput_per_s`` keeps its number; ``token: "abc"`` and
    ``password: 123456`` are redacted); in every string,
    whatever its key, the credentials :func:`scrub_string` finds (``known`` among them); and in a list the
    argument after a credential flag (``["--api-key", "sk-..."]``). Keys themselves are kept (a metric's name
    is not a secret)."""
    return _scrub(obj, _literals(known))


def _scrub(obj: Any, literals: tuple[str, ...]) -> Any:
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_key(k) and not _kept_under_secret_key(k, v) else _scrub(v, literals))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        out, redact_next = [], False
        for v in obj:
            out.append(REDACTED if redact_next else _scrub(v, literals))
            redact_next = isinstance(v, str) and bool(_SECRET_FLAG.match(v))
        return out
    return _scrub_str(obj, literals) if isinstance(obj, str) else obj


def secret_values(obj: Any) -> list[str]:
    """The credentials of a config (nested dicts / lists) as the literal strings :func:`scrub` redacts there:
    the string values under a secret key (:func:`is_secret_key`; lists of strings too), the argument after a
    credential flag in a list, and URLs' passwords; at least 4 characters, interpolations (``${...}``) left
    out. Passed as ``known`` to :func:`scrub` / :func:`scrub_string`, they are redacted wherever else they
    occur (a Hydra override ``backend.extra_args=[--api-key,VALUE]``, a log line). Longest first."""
    found: set[str] = set()

    def take(v: Any) -> None:
        if isinstance(v, str) and len(v) >= _MIN_KNOWN_SECRET and v != REDACTED and not v.startswith("${"):
            found.add(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                take(x)

    def walk(o: Any) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                if is_secret_key(k) and not _kept_under_secret_key(k, v):
                    take(v)
                else:
                    walk(v)
        elif isinstance(o, (list, tuple)):
            for prev, v in zip([None, *o], o):
                if isinstance(prev, str) and _SECRET_FLAG.match(prev):
                    take(v)
                else:
                    walk(v)
        elif isinstance(o, str):
            for m in _URL_PASSWORD.finditer(o):
                take(m.group("pw"))
            k, eq, rest = o.partition("=")
            if eq and _SECRET_FLAG.match(k):
                take(rest)
    walk(obj)
    return list(_longest_first(found))


def scrub_yaml(text: str, known: Sequence[str] = ()) -> str:
    """A YAML document (a config, Hydra's ``.hydra/*.yaml``) with :func:`scrub` applied to its values (the
    document's own :func:`secret_values` and ``known`` redacted wherever they occur); ``text`` itself,
    unchanged to the byte, when there is nothing to redact. The redacted text is written by OmegaConf
    (``OmegaConf.to_yaml``: interpolations kept as written), so it reads back as the same config but for the
    redacted values, and redacting it again changes nothing."""
    return _scrub_yaml(text, _literals(known))


@functools.lru_cache(maxsize=8)   # the run's config text is checked by harness.run.cli, then by execute
def _scrub_yaml(text: str, literals: tuple[str, ...]) -> str:
    import yaml
    # First a quick look with libyaml (OmegaConf's loader is ~10x slower): it reads a few strings that
    # OmegaConf reads as floats ("1e-3"), which can only make it find more to redact, never less.
    quick = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if _scrub(quick, _longest_first(secret_values(quick), literals)) == quick:
        return text
    from omegaconf import OmegaConf
    obj = OmegaConf.to_container(OmegaConf.create(text), resolve=False)
    out = _scrub(obj, _longest_first(secret_values(obj), literals))
    return text if out == obj else OmegaConf.to_yaml(OmegaConf.create(out))


class ScrubFilter(logging.Filter):
    """A logging filter that passes every record with its message scrubbed (:func:`scrub_string`: the
    environment's credentials, those :func:`remember_secrets` registered, and the shapes it knows): put on
    the handlers of a run's log (``run.log``), so no log line writes a credential there. The record's
    arguments are merged into its message first, and its traceback, if any, is formatted and scrubbed here."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        clean = scrub_string(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:   # the traceback a handler's formatter would add
            record.exc_text = scrub_string(logging.Formatter().formatException(record.exc_info))
        return True


def _kept_under_secret_key(key: Any, v: Any) -> bool:
    """Whether value ``v`` under the credential-named ``key`` is kept: null and booleans always (``api_key:
    null`` is no credential), numbers under a token-named key (a metric: ``first_token_s``), not under one
    that names a key, secret or password (``password: 123456`` is one)."""
    if v is None or isinstance(v, bool):
        return True
    return isinstance(v, (int, float)) and not _SECRET_WORDS.search(str(key))
