"""The KV cache capacity vLLM reports in its startup log, parsed: pure, no I/O.

Sources (vLLM): docs/serving/distributed_serving.md (the `GPU KV cache size` / `Maximum concurrency`
lines); vllm/v1/core/kv_cache_utils.py; the V0 executors' block counts.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

#: vLLM's default KV cache block size on CUDA (the distributed-serving docs: "# GPU blocks" x 16).
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class KvCapacity:
    #: tokens the KV cache holds at once (all requests together)
    tokens: int
    #: blocks, when the log gave blocks (older vLLM); None when it gave tokens
    blocks: int | None
    #: block size used to turn blocks into tokens; None when the log gave tokens
    block_size: int | None
    #: the log line the capacity was read from
    source_line: str
    #: "Maximum concurrency for N tokens per request: Xx": X and N, when logged
    concurrency: float | None = None
    request_tokens: int | None = None


# V1 (vllm/v1/core/kv_cache_utils.py): "GPU KV cache size: 643,232 tokens". Any device word, so
# that a platform naming its own device (or a combined line) still parses.
_KV_TOKENS = re.compile(r"\b([A-Za-z]+) KV cache size: ([\d,]+) tokens")
# V0 (executor): "# GPU blocks: 790, # CPU blocks: 512" (later "# cuda blocks: ..."; the CPU
# blocks there are swap space, not capacity); early V1: "# GPU blocks: 1381"; V0 CPU backend
# (cpu_executor.py): "# CPU blocks: 2730", its only KV cache line. The look-behind keeps the
# trailing ", # CPU blocks" of a GPU line from matching on its own.
_KV_BLOCKS = re.compile(r"(?<!, )# ([A-Za-z]+) blocks: (\d+)")
_KV_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


def kv_capacity(log_text: str, *, block_size: int = DEFAULT_BLOCK_SIZE) -> KvCapacity | None:
    """The KV cache capacity vLLM logged at startup, from the last such line (the latest start);
    None when the log has none yet. `block_size` turns older logs' block counts into tokens
    (vLLM's default 16; pass --block-size when it was set)."""
    found: KvCapacity | None = None
    conc: tuple[float, int, str] | None = None
    for line in log_text.splitlines():
        m = _KV_TOKENS.search(line)
        if m:
            found = KvCapacity(int(m.group(2).replace(",", "")), None, None, line.strip())
        else:
            m = _KV_BLOCKS.search(line)
            if m:
                blocks = int(m.group(2))
                found = KvCapacity(blocks * block_size, blocks, block_size, line.strip())
        c = _KV_CONCURRENCY.search(line)
        if c:
            conc = (float(c.group(2)), int(c.group(1).replace(",", "")), line.strip())
    if found is None and conc is None:
        return None
    if found is None:
        assert conc is not None
        x, req, line = conc
        return KvCapacity(int(x * req), None, None, line, x, req)
    if conc is not None:
        return KvCapacity(found.tokens, found.blocks, found.block_size, found.source_line, conc[0], conc[1])
    return found
