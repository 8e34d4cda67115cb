"""The words after `--` that serve and rollout hand to vLLM: each read the way vLLM will read it, then judged.

vLLM's parser (FlexibleArgumentParser: argparse with allow_abbrev) reads a word as one of its options
exactly, in its `_` form (`--max_model_len`), with its value attached (`--port=1`, `-n3`), with a key of
a JSON setting after a dot (`--kv-events-config.endpoint=...`) or as an unambiguous prefix
(`--api-ke`). So each word is first resolved to the setting (argparse's dest) that the image's vLLM
reads it as (VllmOptions: its own table, read per image by checks/vllm_options.py), and only then
judged; no spelling decides:

- a setting the plan sets (serve/plan's _OWNED_*, a disaggregated fleet's --kv-transfer-config) is
  refused, naming the bootstrap option to use instead;
- a setting in FENCED, the one table of what else may not pass, is refused with its reason and fix: a
  credential (on a command line it is in every node's `ps`, `docker inspect` and logs), a listener
  the plan does not make (outside the fence, serve's probes and the router), the container's files
  opened to the endpoint's clients, or more options read from a file bootstrap cannot check. The
  `--no-` form of a fenced switch turns it off and passes;
- with the image's table, a word it does not know or cannot tell apart is refused (vLLM would
  refuse to start).

Where the image's table is unknown (the CLI's first look, before any host is read; an image whose
options cannot be read) the words are resolved the same way against the spellings bootstrap knows,
the plan's and FENCED's, prefixes included (check_words with opts=None). Pure.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from bootstrap.errors import ServePlanError
from bootstrap.inventory.envvars import looks_like_credential


@dataclass(frozen=True)
class VllmOptions:
    """What the image's `vllm serve` parser takes (checks/vllm_options.py): each option string and
    the setting (argparse dest) it writes, and whether it takes abbreviations."""
    version: str | None
    dests: Mapping[str, str]
    abbrev: bool = True

    @classmethod
    def from_doc(cls, doc: Any) -> "VllmOptions | None":
        """The script's answer; None for an error or anything malformed (the caller falls back)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("options"), dict):
            return None
        dests = {k: v for k, v in doc["options"].items() if isinstance(k, str) and isinstance(v, str)
                 and k.startswith("-")}
        if not dests:
            return None
        version = doc.get("version")
        return cls(version if isinstance(version, str) else None, dests, doc.get("abbrev") is not False)

    def to_doc(self) -> dict:
        return {"version": self.version, "options": dict(self.dests), "abbrev": self.abbrev}


@dataclass(frozen=True)
class Fence:
    """A vLLM setting that may not pass: its spellings in vLLM 0.32 (what the check without the
    image's table resolves against), what it would do, and what to do instead."""
    kind: str  # "credential", "listener" or "files"
    flags: tuple[str, ...]
    why: str
    fix: str


_CREDENTIAL = "would put a credential on every node's command line (ps, docker inspect, logs)"


def _secret(name: str) -> str:
    return f"list {name} under cluster.secrets and set it in your environment, vLLM reads it from there"


_GRPC = ("would start vLLM's gRPC server, a listener the serve plan does not make (on a port outside the "
         "fence, asking for no credentials; serve's probes and the router speak HTTP)")
_LB = ("would start API servers beyond the head's (vLLM's external or hybrid data parallel load balancing), "
       "listeners the serve plan does not make and the router does not know")
_LB_FIX = "use --dp (the head's API server balances the engines), and drop it"
_TLS = ("would put TLS on vLLM's own endpoint from a key file inside every container, and serve's probes and the "
        "router reach vLLM over plain HTTP")
_TLS_FIX = "terminate TLS in front of the endpoint (a proxy), and drop it"

#: What may not pass whatever the spelling, by the setting (argparse dest) vLLM reads it as.
FENCED: dict[str, Fence] = {
    "api_key": Fence("credential", ("--api-key",), _CREDENTIAL, _secret("VLLM_API_KEY")),
    "hf_token": Fence("credential", ("--hf-token",), _CREDENTIAL, _secret("HF_TOKEN")),
    "grpc": Fence("listener", ("--grpc",), _GRPC, "bootstrap serves vLLM's HTTP API; drop it"),
    "grpc_port": Fence("listener", ("--grpc-port",), _GRPC, "bootstrap serves vLLM's HTTP API; drop it"),
    "uds": Fence("listener", ("--uds",), "would move vLLM's API to a Unix socket inside the container, where serve's "
                 "probes, the router and the clients cannot reach it", "drop it (the endpoint is --listen and "
                 "cluster.ports.vllm)"),
    "kv_events_config": Fence("listener", ("--kv-events-config",), "can publish KV cache events on ZMQ sockets of "
                              "vLLM's own (tcp://*:5557 by default: every interface, a port outside the fence, no "
                              "credentials)", "drop it"),
    "data_parallel_external_lb": Fence("listener", ("--data-parallel-external-lb", "-dpe"), _LB,
                                       _LB_FIX),
    "data_parallel_hybrid_lb": Fence("listener", ("--data-parallel-hybrid-lb", "-dph"), _LB,
                                     _LB_FIX),
    "data_parallel_multi_port_external_lb": Fence("listener", ("--data-parallel-multi-port-external-lb", "-dpm"),
                                                  _LB, _LB_FIX),
    "data_parallel_supervisor_port": Fence("listener", ("--data-parallel-supervisor-port",),
                                           "would choose a port vLLM listens on that the plan does not: outside the "
                                           "ranges the fence covers it is open to anyone", "drop it"),
    "allowed_local_media_path": Fence("files", ("--allowed-local-media-path",),
                                      "would let every client of the endpoint read the container's files under that "
                                      "path (file:// media URLs), and vLLM's API asks for no credentials",
                                      "send media inline (data: URLs) or from the web (--allowed-media-domains)"),
    "ssl_keyfile": Fence("files", ("--ssl-keyfile",), _TLS, _TLS_FIX),
    "ssl_certfile": Fence("files", ("--ssl-certfile",), _TLS, _TLS_FIX),
    "ssl_ca_certs": Fence("files", ("--ssl-ca-certs",), _TLS, _TLS_FIX),
    "config": Fence("files", ("--config",), "would read more vLLM options from a YAML file inside the containers, "
                    "which bootstrap cannot check against the plan (a host, a port or a credential there would "
                    "override it)", "pass each option after -- instead"),
}

#: vLLM's spellings of the credential settings: what credentials.mask hides the value after (any
#: prefix vLLM would read as one, `_` forms included)
CREDENTIAL_FLAGS = tuple(f for fence in FENCED.values() if fence.kind == "credential" for f in fence.flags)

NUMBER = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?|-\.\d+")


def resolve(word: str, opts: VllmOptions) -> tuple[str, str | None, list[str]]:
    """(the name as written, the dest vLLM's argparse reads it as or None, the candidates): exact, its
    `_` form (FlexibleArgumentParser turns `--a_b` into `--a-b`), a key of a JSON setting after a dot
    (`--a.b=1` is `--a '{"b": 1}'`), a short option with its value attached (`-tp2`), or an
    unambiguous prefix (argparse's abbreviations; several spellings of one setting are one)."""
    name = word.split("=", 1)[0]
    key = name.replace("_", "-").split(".", 1)[0] if name.startswith("--") else name
    if key in opts.dests:
        return name, opts.dests[key], [key]
    if not key.startswith("--") and key[:2] in opts.dests:
        return name, opts.dests[key[:2]], [key[:2]]
    found = sorted(o for o in opts.dests if o.startswith(key)) if opts.abbrev and len(key) > 2 else []
    dests = {opts.dests[o] for o in found}
    return name, (dests.pop() if len(dests) == 1 else None), found


def _negation(found: list[str], dest: str, opts: VllmOptions) -> bool:
    """The word is the `--no-` form of a switch (BooleanOptionalAction): it turns the setting off."""
    return len(found) == 1 and found[0].startswith("--no-") and opts.dests.get("--" + found[0][5:]) == dest


def reads_as(word: str, flags: Sequence[str]) -> str | None:
    """The one of `flags` that vLLM would read `word` as, without the image's table (exactly, in its
    `_`, `=` or dotted form, or as a prefix of four characters or more), else None."""
    if not isinstance(word, str) or not word.startswith("-"):
        return None
    name, _, found = resolve(word, VllmOptions(None, {f: f for f in flags}))
    key = name.replace("_", "-").split(".", 1)[0] if name.startswith("--") else name
    if found and (found[0] == key or (name.startswith("--") and len(name) > 3)):
        return found[0]
    return None


def _known(owned: Mapping[str, str]) -> tuple[str, ...]:
    """The spellings bootstrap knows without the image's table: the plan's and FENCED's."""
    return (*owned, *(f for fence in FENCED.values() for f in fence.flags))


_CREDENTIAL_WORD = ("an extra vllm argument is a credential (its value is not shown): it would be on every node's "
                    "command line; pass it through cluster.secrets")
_FLAG_FENCE = {f: fence for fence in FENCED.values() for f in fence.flags}


def check_words(extra: Sequence[str], owned: Mapping[str, str], opts: VllmOptions | None = None) -> None:
    """Refuse a word after `--` that vLLM would read as a setting the plan sets (`owned`: each of
    vLLM's spellings of one -> what to use instead) or as a FENCED one; with `opts` (the image's
    table) also one it does not know or cannot tell apart. One line, naming the word, what vLLM reads
    it as, and the fix; nothing is touched."""
    for word in extra:
        if not isinstance(word, str):
            raise ServePlanError(f"extra vllm arguments must be strings, got {word!r}")
        if opts is None and not word.startswith("-") and looks_like_credential(word):
            raise ServePlanError(_CREDENTIAL_WORD)
        if not word.startswith("-") or word in ("-", "--") or NUMBER.fullmatch(word):
            continue
        if opts is None:
            _judge_offline(word, owned)
        else:
            _judge(word, owned, opts)


def _judge_offline(word: str, owned: Mapping[str, str]) -> None:
    name = word.split("=", 1)[0]
    flag = reads_as(word, _known(owned))  # a short word's prefix or attached value: judged with the table only
    exact = flag if flag is not None and flag in (name, name.replace("_", "-").split(".", 1)[0]) else None
    fence = _FLAG_FENCE.get(flag) if flag else None
    if fence is not None and fence.kind == "credential":
        raise ServePlanError(_fence_line(name, flag, exact is not None, fence))
    if looks_like_credential(word):
        raise ServePlanError(_CREDENTIAL_WORD)
    if flag is None:
        return
    if fence is not None:
        raise ServePlanError(_fence_line(name, flag, exact is not None, fence))
    if exact is not None:
        raise ServePlanError(f"{name} is set by the serve plan; do not pass it as an extra vllm argument "
                             f"(use {owned[flag]})")
    raise ServePlanError(f"{name} is an abbreviation vLLM would read as {flag}, which the serve plan sets; do not "
                         f"pass it as an extra vllm argument (use {owned[flag]})")


def _fence_line(name: str, flag: str, exact: bool, fence: Fence) -> str:
    if exact and name.replace("_", "-").split(".", 1)[0] == flag:
        return f"{name} {fence.why}: {fence.fix}"
    if exact:
        return f"{name} (vLLM reads it as {flag}) {fence.why}: {fence.fix}"
    return f"{name} is an abbreviation vLLM would read as {flag}, which {fence.why}: {fence.fix}"


def _judge(word: str, owned: Mapping[str, str], opts: VllmOptions) -> None:
    import difflib

    owned_by_dest: dict[str, str] = {}
    for flag in owned:
        if flag in opts.dests:
            owned_by_dest.setdefault(opts.dests[flag], flag)
    where = f"vLLM {opts.version}" if opts.version else "the image's vLLM"
    name, dest, found = resolve(word, opts)
    if dest is None and len(found) > 1:
        raise ServePlanError(f"{name} is ambiguous to {where} (it could be {', '.join(found[:4])}"
                             f"{', ...' if len(found) > 4 else ''}): spell the option out")
    if dest is None:
        longs = sorted(o for o in opts.dests if o.startswith("--"))
        near = difflib.get_close_matches(name.replace("_", "-"), longs, n=1, cutoff=0.75)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ServePlanError(f"{name} is not an option of {where}'s `vllm serve`{hint}: it would refuse to start")
    if dest in owned_by_dest:
        flag = owned_by_dest[dest]
        as_ = "" if name == flag else f" (vLLM reads it as {flag})"
        raise ServePlanError(f"{name}{as_} is set by the serve plan; do not pass it as an extra vllm argument "
                             f"(use {owned[flag]})")
    fence = FENCED.get(dest)
    if fence is not None and not (fence.kind != "credential" and _negation(found, dest, opts)):
        flag = next((f for f in fence.flags if opts.dests.get(f) == dest), found[0] if found else fence.flags[0])
        as_ = "" if name == flag else f" (vLLM reads it as {flag})"
        raise ServePlanError(f"{name}{as_} {fence.why}: {fence.fix}")
