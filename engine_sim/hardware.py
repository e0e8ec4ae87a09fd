"""Step-time model: a roofline over published model shapes and GPU datasheets.

One engine iteration (a "step") runs every scheduled sequence's new tokens through the model
once. Its time is

    t = max(bytes / (bandwidth * mem_eff), flops / (peak * compute_eff)) + overhead + comm

per GPU, where a tensor-parallel group of `tp` GPUs splits bytes and FLOPs evenly and adds a
ring all-reduce after attention and after the MLP of every layer (`comm`).

* bytes: every weight matrix once (the decoder layers and the LM head; the input embedding is a
  row lookup, not a stream) + the KV cache read by attention (the context of every sequence)
  + the KV written for the new tokens.
* flops: 2 x (matmul parameters) per new token + attention (QK^T and PV: 4 x layers x q_heads
  x head_dim per (query, key) pair, causal within a prefill chunk) + the LM head for each
  sequence that samples a token in this step.
* mem_eff / compute_eff: achieved fractions of the datasheet peaks (MBU ~0.85 for decode
  GEMVs, MFU ~0.6 for prefill GEMMs on Hopper, as reported by vLLM/TensorRT-LLM benchmarks);
  overhead: scheduling, sampling and kernel launches per step (~0.4 ms with CUDA graphs).

Datasheet anchors (tested): Llama-3.1-8B bf16 weights are 16.06 GB, so a batch-1 decode step
streams them in ~4.8 ms at H100's 3.35 TB/s and ~3.3 ms at H200's 4.8 TB/s; prefill costs
~2 x params = ~16 GFLOP per token. Memory sizes are what nvidia-smi reports (MiB).

The KV handoff between a prefill and a decode engine moves prompt_tokens x kv_bytes_per_token
over the inter-node link (`kv_link_bandwidth`, e.g. one 400 Gb/s NIC per GPU) plus a fixed
setup latency (NIXL's handshake is done once; a transfer still posts descriptors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

GiB = 1024**3
MiB = 1024**2


class UnknownHardware(ValueError):
    """An unknown model or GPU name; the message lists the known ones."""


@dataclass(frozen=True)
class ModelShape:
    """Published architecture of a decoder-only transformer (its HF config.json)."""

    name: str
    hf_id: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_position: int
    tied_embeddings: bool = False
    dtype_bytes: int = 2  # bf16

    @property
    def layer_params(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate  # gate, up, down (SwiGLU)
        return q + kv + o + mlp

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        """All parameters as published (norms are negligible and left out)."""
        heads = 1 if self.tied_embeddings else 2
        return self.layers * self.layer_params + heads * self.embedding_params

    @property
    def matmul_params(self) -> int:
        """Parameters multiplied per token in the decoder layers (not the LM head)."""
        return self.layers * self.layer_params

    @property
    def weight_bytes(self) -> int:
        """Bytes the GPUs hold for the weights."""
        return self.total_params * self.dtype_bytes

    @property
    def streamed_weight_bytes(self) -> int:
        """Bytes a step reads from the weights: decoder layers + LM head (embedding is a lookup)."""
        return (self.matmul_params + self.lm_head_params) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer, all KV heads (summed over the tensor-parallel group)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def attn_flops_per_pair(self) -> int:
        """FLOPs of one (query, key) pair over all layers: QK^T and PV, 2 FLOPs per MAC."""
        return 4 * self.layers * self.heads * self.head_dim


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet numbers of one GPU (dense bf16 tensor-core peak, HBM bandwidth)."""

    name: str
    label: str
    bf16_flops: float  # FLOP/s, dense
    mem_bandwidth: float  # bytes/s
    memory_bytes: int  # as nvidia-smi reports it
    interconnect_bandwidth: float  # bytes/s per direction to the other GPUs of a TP group
    allreduce_latency: float = 8e-6  # s per all-reduce (NCCL small-message latency)
    mem_efficiency: float = 0.85
    compute_efficiency: float = 0.6
    step_overhead: float = 4e-4  # s per step
    kv_link_bandwidth: float = 50e9  # bytes/s per GPU for the P->D KV handoff (400 Gb/s)
    kv_link_latency: float = 1e-3  # s per handoff


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 32, 4096, 32, 8, 128,
                   14336, 128256, 131072),
        ModelShape("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", 80, 8192, 64, 8, 128,
                   28672, 128256, 131072),
        ModelShape("llama-3.2-1b", "meta-llama/Llama-3.2-1B-Instruct", 16, 2048, 32, 8, 64,
                   8192, 128256, 131072, tied_embeddings=True),
        ModelShape("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", 28, 3584, 28, 4, 128, 18944,
                   152064, 32768),
        ModelShape("qwen2.5-72b", "Qwen/Qwen2.5-72B-Instruct", 80, 8192, 64, 8, 128, 29568,
                   152064, 32768),
        ModelShape("mistral-7b", "mistralai/Mistral-7B-Instruct-v0.3", 32, 4096, 32, 8, 128,
                   14336, 32768, 32768),
    )
}

GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("h100", "NVIDIA H100 80GB HBM3 (SXM)", 989e12, 3.35e12, 81559 * MiB, 450e9),
        GPUSpec("h200", "NVIDIA H200 141GB HBM3e (SXM)", 989e12, 4.8e12, 143771 * MiB, 450e9),
        GPUSpec("a100", "NVIDIA A100-SXM4-80GB", 312e12, 2.039e12, 81920 * MiB, 300e9),
        GPUSpec("l40s", "NVIDIA L40S (PCIe, no NVLink)", 362e12, 0.864e12, 46068 * MiB, 32e9,
                allreduce_latency=20e-6, kv_link_bandwidth=25e9),
    )
}

_ALIASES = {
    "h100-sxm": "h100", "h100sxm": "h100", "a100-80gb": "a100", "a100-80g": "a100",
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama/llama-3.1-8b": "llama-3.1-8b",
    "meta-llama/llama-3.1-70b-instruct": "llama-3.1-70b",
    "meta-llama/llama-3.1-70b": "llama-3.1-70b",
    "qwen/qwen2.5-7b-instruct": "qwen2.5-7b",
    "qwen/qwen2.5-72b-instruct": "qwen2.5-72b",
    "meta-llama/llama-3.2-1b-instruct": "llama-3.2-1b",
    "mistralai/mistral-7b-instruct-v0.3": "mistral-7b",
}


def get_model(name: str) -> ModelShape:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in MODELS:
        raise UnknownHardware(
            f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}"
        )
    return MODELS[key]


def get_gpu(name: str) -> GPUSpec:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in GPUS:
        raise UnknownHardware(f"unknown GPU {name!r}; known GPUs: {', '.join(sorted(GPUS))}")
    return GPUS[key]


@dataclass(frozen=True)
class MemoryPlan:
    """How vLLM splits GPU memory: weights, a reserve, the rest for KV blocks."""

    weight_bytes_per_gpu: float
    reserve_bytes_per_gpu: float
    kv_bytes_per_gpu: float
    num_blocks: int
    block_size: int

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size


# Activations, CUDA graphs and the non-torch allocations vLLM profiles before sizing the KV
# cache; ~2 GiB per GPU for 7-8B models at 8k batched tokens.
RESERVE_BYTES = 2 * GiB


@dataclass(frozen=True)
class StepModel:
    """Step-time model of one engine (a model on `tp` GPUs of one kind)."""

    model: ModelShape
    gpu: GPUSpec
    tp: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {self.tp}")

    # ---- memory ----
    def memory_plan(self, gpu_memory_utilization: float = 0.9, block_size: int = 16) -> MemoryPlan:
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        weights = self.model.weight_bytes / self.tp
        budget = self.gpu.memory_bytes * gpu_memory_utilization
        kv = budget - weights - RESERVE_BYTES
        per_token = self.model.kv_bytes_per_token / self.tp
        blocks = int(kv // (per_token * block_size)) if kv > 0 else 0
        if blocks <= 0:
            need = math.ceil(self.model.weight_bytes / (budget - RESERVE_BYTES))
            raise ValueError(
                f"{self.model.name} ({self.model.weight_bytes / 1e9:.1f} GB of weights) does not "
                f"fit on {self.tp} x {self.gpu.name} with gpu_memory_utilization="
                f"{gpu_memory_utilization}; use --tensor-parallel {need} or more"
            )
        return MemoryPlan(weights, RESERVE_BYTES, kv, blocks, block_size)

    # ---- ideal roofline terms (no efficiency, no overhead): the datasheet anchors ----
    def ideal_weight_stream_time(self) -> float:
        """Time to read every weight once at peak bandwidth (all published params)."""
        return self.model.weight_bytes / self.tp / self.gpu.mem_bandwidth

    def prefill_flops_per_token(self, prompt_tokens: int) -> float:
        """Average FLOPs per prompt token of a whole-prompt prefill (one LM-head call)."""
        n = prompt_tokens
        lin = 2.0 * self.model.matmul_params * n
        attn = self.model.attn_flops_per_pair * n * (n + 1) / 2
        head = 2.0 * self.model.lm_head_params
        return (lin + attn + head) / n

    # ---- step time ----
    def _comm_time(self, tokens: float | np.ndarray) -> float | np.ndarray:
        if self.tp == 1:
            return 0.0
        size = tokens * self.model.hidden * self.model.dtype_bytes
        per = 2 * (self.tp - 1) / self.tp * size / self.gpu.interconnect_bandwidth
        return 2 * self.model.layers * (per + self.gpu.allreduce_latency)

    def _time(self, bytes_: float | np.ndarray, flops: float | np.ndarray,
              tokens: float | np.ndarray) -> float | np.ndarray:
        g = self.gpu
        mem = bytes_ / self.tp / (g.mem_bandwidth * g.mem_efficiency)
        comp = flops / self.tp / (g.bf16_flops * g.compute_efficiency)
        return np.maximum(mem, comp) + g.step_overhead + self._comm_time(tokens)

    def step_terms(self, new_tokens: int, pairs: Any, kv_read_tokens: Any,
                   sampled: int) -> tuple[Any, Any]:
        """(bytes, flops) of a step from aggregate counts.

        new_tokens: tokens computed in this step (all sequences); pairs: attention
        (query, key) pairs; kv_read_tokens: context tokens whose KV is read; sampled:
        sequences that sample a token (LM head rows).
        """
        m = self.model
        bytes_ = (m.streamed_weight_bytes + (kv_read_tokens + new_tokens) * m.kv_bytes_per_token)
        flops = (2.0 * m.matmul_params * new_tokens + m.attn_flops_per_pair * pairs
                 + 2.0 * m.lm_head_params * sampled)
        return bytes_, flops

    def step_time(self, chunks: list[tuple[int, int]], sampled: int | None = None) -> float:
        """Time of one step; chunks = [(new_tokens, context_before)] per scheduled sequence."""
        if not chunks:
            return 0.0
        new = sum(n for n, _ in chunks)
        pairs = sum(n * c + n * (n + 1) / 2 for n, c in chunks)
        kv_read = sum(c for _, c in chunks)
        s = len(chunks) if sampled is None else sampled
        return self.step_time_from(new, pairs, kv_read, s)

    def step_time_from(self, new: int, pairs: float, kv_read: int, sampled: int) -> float:
        """step_time from aggregate counts (scalar fast path of _time)."""
        b, f = self.step_terms(new, pairs, kv_read, sampled)
        g = self.gpu
        mem = b / self.tp / (g.mem_bandwidth * g.mem_efficiency)
        comp = f / self.tp / (g.bf16_flops * g.compute_efficiency)
        return float((mem if mem > comp else comp) + g.step_overhead + self._comm_time(new))

    def decode_step_time(self, batch: int, context: int) -> float:
        """A pure decode step: `batch` sequences, each with `context` tokens of KV."""
        return self.step_time([(1, context)] * batch)

    def decode_run_times(self, batch: int, context_sum: int, steps: int) -> np.ndarray:
        """Durations of `steps` consecutive pure-decode steps of the same `batch` sequences
        whose contexts sum to `context_sum` before the first step (each grows by one a step)."""
        j = np.arange(steps, dtype=np.float64)
        kv_read = context_sum + j * batch
        pairs = kv_read + batch  # each query attends its context plus itself
        bytes_, flops = self.step_terms(batch, pairs, kv_read, batch)
        return np.asarray(self._time(bytes_, flops, float(batch)), dtype=np.float64)

    def kv_transfer_time(self, prompt_tokens: int) -> float:
        """P->D handoff of a prompt's KV: bytes over the per-GPU links of the TP group."""
        if prompt_tokens <= 0:
            return 0.0
        bytes_ = prompt_tokens * self.model.kv_bytes_per_token
        return bytes_ / (self.gpu.kv_link_bandwidth * self.tp) + self.gpu.kv_link_latency

    def kv_transfer_bytes(self, prompt_tokens: int) -> int:
        return prompt_tokens * self.model.kv_bytes_per_token


def make_step_model(model: str, gpu: str, tensor_parallel: int = 1) -> StepModel:
    return StepModel(get_model(model), get_gpu(gpu), tensor_parallel)
