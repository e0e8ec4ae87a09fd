"""Where the router learns which engine holds which prompt prefix: the contract both sources keep.

A prompt is a chain of block keys: key i identifies the prompt's first (i + 1) blocks, so two
prompts share their first k blocks exactly when their first k keys are equal (vLLM chains each
block's hash on its parent's in the same way). An endpoint is expected to hold a prompt's
first m blocks when it holds key m - 1 (and so, by the chain, every key before it).

Two sources keep that contract:
- approximate (`router.prefix_index`): the router's own record of the blocks it sent where,
  keys hashed from the prompt's text; works with any OpenAI-compatible engine.
- precise (`router.kv_events`): the engines' own KV events (vLLM's `--kv-events-config`), keys
  hashed from the prompt's token ids as the engine tokenizes them.

Pure: no I/O here; a source that must ask an engine (to tokenize) does it in `prompt_keys`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class PromptKeys:
    """A prompt as the chain of its full blocks' keys."""

    keys: tuple[int, ...]
    block_tokens: int  # prompt tokens one block stands for (an estimate for text chunks)

    def tokens(self, blocks: int) -> int:
        """Prompt tokens in the first `blocks` blocks."""
        return blocks * self.block_tokens


class PrefixSource(Protocol):
    """What the router's selection asks of a source of prefix locations."""

    async def prompt_keys(self, path: str, body: dict[str, Any]) -> PromptKeys | None:
        """The prompt's block keys, or None when they cannot be had (then route on load)."""
        ...

    def matched_blocks(self, prompt: PromptKeys, urls: Sequence[str], now: float) -> list[int]:
        """Per url (in order), how many of the prompt's leading blocks it is expected to hold."""
        ...

    def record(self, prompt: PromptKeys, url: str, now: float) -> None:
        """The router sent this prompt to `url` (the engine will cache its blocks)."""
        ...

    def forget(self, url: str) -> None:
        """`url` left the pool or restarted: nothing is known to be cached there any more."""
        ...
