"""Step-time model: per-kernel rooflines over published model shapes and GPU datasheets.

One engine iteration (a "step") runs every scheduled sequence's new tokens through the model
once. Per GPU (a tensor-parallel group of `tp` GPUs splits weights, heads and MLP width
evenly), the step is a sequence of kernels that run one after another, so their times add:

    t = linear + attention(decode) + attention(prefill) + elementwise + launches + comm

* linear: the GEMMs of every layer and the LM head. Inside one GEMM the weight reads overlap
  the math, but not perfectly near the ridge point (pipeline fill and drain, partial waves):
  `max(mem, math) + overlap_loss x min(mem, math)`, with mem = weight bytes / achieved
  bandwidth and math = 2 x params x tokens (LM head: x sampling sequences) / achieved FLOP/s.
* attention: a separate kernel from the GEMMs, so its KV reads do not hide behind their math
  (the old `max(all bytes, all FLOPs)` roofline assumed they did, and priced a decode batch
  plus a prefill chunk up to 46% below the H200 measurement). Decode sequences (one new token)
  read their context's KV: memory-bound; prefill chunks do 4 x layers x heads x head_dim
  FLOPs per (query, key) pair, causal within the chunk, at the attention kernel's efficiency.
* elementwise: vLLM's fused norms (+residual), RoPE, the KV-cache write and SiLU-and-mul read
  and write activations per token: memory-bound, after the GEMM that produced them.
* launches: each of a layer's ~9 kernels costs a fixed latency even in a CUDA graph (launch,
  ramp-up, tail), plus a per-step overhead (scheduling, sampling).
* comm: tensor parallel adds a ring all-reduce after attention and after the MLP of every
  layer.

Efficiencies are fractions of the datasheet peaks. They were checked against step times
measured on one H200 (engine_sim/data/h200-*.json, docs/engine-simulator.md#calibration):
plain-PyTorch steps (unfused ops, cuBLAS GEMMs, flash SDPA, CUDA graphs for decode) are an
upper bound for vLLM's fused kernels, so the model sits at or below them - decode between
the (weights + KV) / bandwidth floor and the measurement, prefill >= 512 tokens within 15%,
mixed decode + prefill steps within 25% (tests/unit/engine_sim/test_engine_sim_calibration.py).

Datasheet anchors (tested): Llama-3.1-8B bf16 weights are 16.06 GB, so streaming them takes
~4.8 ms at H100's 3.35 TB/s and ~3.3 ms at H200's 4.8 TB/s; prefill costs ~2 x params = ~16
GFLOP per token. Memory sizes are what nvidia-smi reports (MiB).

The KV handoff between a prefill and a decode engine moves prompt_tokens x kv_bytes_per_token
over the inter-node link (`kv_link_bandwidth`, e.g. one 400 Gb/s NIC per GPU) plus a fixed
setup latency (NIXL's handshake is done once; a transfer still posts descriptors).
"""

from __future__ import annotations

import functools
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

    def elementwise_bytes_per_token(self, tp: int = 1) -> int:
        """Activation bytes one GPU's fused elementwise kernels move per token, all layers.

        Per layer: two fused add+RMSNorms read x and the residual and write both (4 x hidden
        each, replicated on every GPU); RoPE reads and writes q and k; the cache write reads
        k and v and stores them; SiLU-and-mul reads gate and up and writes their product
        (heads and MLP width are split over the tensor-parallel group)."""
        d = self.dtype_bytes
        replicated = 2 * 4 * self.hidden
        split = (2 * (self.heads + self.kv_heads) * self.head_dim
                 + 4 * self.kv_heads * self.head_dim + 3 * self.intermediate)
        return self.layers * d * (replicated + split // tp)


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
    # Achieved fractions of the peaks and fixed costs; Hopper values, checked on an H200
    # (module docstring). Other GPUs keep them: no measurement says otherwise.
    mem_efficiency: float = 0.85  # GEMV weight streams and KV reads (a copy reaches 0.89)
    compute_efficiency: float = 0.65  # Llama-shaped GEMMs (an 8192^3 GEMM reaches 0.80)
    attention_efficiency: float = 0.40  # causal prefill attention FLOPs (flash kernels)
    overlap_loss: float = 0.3  # share of min(mem, math) a GEMM does not hide
    kernel_latency: float = 3e-6  # s per kernel in a CUDA graph (launch, ramp, tail)
    step_overhead: float = 4e-4  # s per step (scheduling, sampling)
    kv_link_bandwidth: float = 50e9  # bytes/s per GPU for the P->D KV handoff (400 Gb/s)
    kv_link_latency: float = 1e-3  # s per handoff
    # bytes/s per GPU from host memory to HBM (PCIe Gen5 x16: 64 GB/s a direction, pinned
    # copies reach ~50): the CPU offload tier's loads
    host_link_bandwidth: float = 50e9


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
        GPUSpec("a100", "NVIDIA A100-SXM4-80GB", 312e12, 2.039e12, 81920 * MiB, 300e9,
                host_link_bandwidth=25e9),  # PCIe Gen4
        GPUSpec("l40s", "NVIDIA L40S (PCIe, no NVLink)", 362e12, 0.864e12, 46068 * MiB, 32e9,
                allreduce_latency=20e-6, kv_link_bandwidth=25e9, host_link_bandwidth=25e9),
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


# Kernels per decoder layer in vLLM's fused Llama layer: add+RMSNorm, QKV GEMM, RoPE,
# attention (with the cache write), O GEMM, add+RMSNorm, gate/up GEMM, SiLU-and-mul, down GEMM.
KERNELS_PER_LAYER = 9

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
    def comm_time(self, tokens: float | np.ndarray) -> float | np.ndarray:
        """Two ring all-reduces per layer of `tokens` x hidden activations (0 without TP)."""
        if self.tp == 1:
            return 0.0
        size = tokens * self.model.hidden * self.model.dtype_bytes
        per = 2 * (self.tp - 1) / self.tp * size / self.gpu.interconnect_bandwidth
        return 2 * self.model.layers * (per + self.gpu.allreduce_latency)

    @functools.cached_property
    def _coef(self) -> tuple[float, ...]:
        """Per-unit seconds of gpu_time's terms (the model and GPU are frozen)."""
        m, g, tp = self.model, self.gpu, self.tp
        bw = g.mem_bandwidth * g.mem_efficiency
        gemm = g.bf16_flops * g.compute_efficiency
        attn = g.bf16_flops * g.attention_efficiency
        return (m.streamed_weight_bytes / tp / bw,  # weight stream
                2.0 * m.matmul_params / tp / gemm,  # GEMM math per token
                2.0 * m.lm_head_params / tp / gemm,  # LM-head math per sampled row
                m.kv_bytes_per_token / tp / bw,  # KV read per context token
                m.attn_flops_per_pair / tp / attn,  # attention math per (query, key) pair
                m.elementwise_bytes_per_token(tp) / bw,  # elementwise kernels per token
                m.layers * KERNELS_PER_LAYER * g.kernel_latency + g.step_overhead)

    def gpu_time(self, new: Any, sampled: Any, decode_seqs: Any = 0, decode_kv: Any = 0,
                 prefill_pairs: Any = 0.0, prefill_kv: Any = 0) -> Any:
        """One GPU's share of a step, without the all-reduces (scalars, or numpy arrays).

        new: tokens computed (all sequences); sampled: sequences that sample a token (LM-head
        rows); decode_seqs / decode_kv: sequences computing one token and the context tokens
        whose KV they read; prefill_pairs / prefill_kv: attention (query, key) pairs of the
        longer chunks and the context tokens before them."""
        w, tok, row, kv, pair, elem, fixed = self._coef
        vec = any(isinstance(x, np.ndarray) for x in (new, sampled, decode_kv, prefill_pairs))
        hi, lo = (np.maximum, np.minimum) if vec else (max, min)
        math = tok * new + row * sampled
        linear = hi(w, math) + self.gpu.overlap_loss * lo(w, math)
        decode = hi(kv * decode_kv, pair * (decode_kv + decode_seqs))
        prefill = hi(kv * prefill_kv, pair * prefill_pairs)
        return linear + decode + prefill + elem * new + fixed

    def step_time(self, chunks: list[tuple[int, int]], sampled: int | None = None, *,
                  all_reduce: bool = True) -> float:
        """Time of one step; chunks = [(new_tokens, context_before)] per scheduled sequence.

        all_reduce=False: one GPU's compute alone (what was measured per GPU of a TP group)."""
        if not chunks:
            return 0.0
        new = dec = dec_kv = pre_kv = 0
        pre_pairs = 0.0
        for n, c in chunks:
            new += n
            if n == 1:
                dec += 1
                dec_kv += c
            else:
                pre_kv += c
                pre_pairs += n * c + n * (n + 1) / 2
        s = len(chunks) if sampled is None else sampled
        t = float(self.gpu_time(new, s, dec, dec_kv, pre_pairs, pre_kv))
        return t + float(self.comm_time(new)) if all_reduce else t

    def step_time_from(self, new: int, sampled: int, decode_seqs: int, decode_kv: int,
                       prefill_pairs: float, prefill_kv: int) -> float:
        """step_time from aggregate counts (the engine's scalar fast path)."""
        return float(self.gpu_time(new, sampled, decode_seqs, decode_kv, prefill_pairs,
                                   prefill_kv) + self.comm_time(new))

    def decode_step_time(self, batch: int, context: int) -> float:
        """A pure decode step: `batch` sequences, each with `context` tokens of KV."""
        return self.step_time_from(batch, batch, batch, batch * context, 0.0, 0)

    def mixed_step_time(self, batch: int, context_sum: int, chunk: int,
                        chunk_context: int = 0) -> float:
        """A decode batch (contexts summing to `context_sum`) plus one prefill chunk of `chunk`
        tokens after `chunk_context` tokens of its prompt: a decode engine prefilling locally
        (the chunk counts one LM-head row, as when it ends its prompt)."""
        pairs = chunk * chunk_context + chunk * (chunk + 1) / 2 if chunk > 1 else 0.0
        dec, dec_kv = batch, context_sum
        if chunk == 1:  # a one-token chunk is priced like a decode token
            dec, dec_kv, pairs = batch + 1, context_sum + chunk_context, 0.0
        return self.step_time_from(batch + chunk, batch + (1 if chunk else 0), dec, dec_kv,
                                   pairs, chunk_context if chunk > 1 else 0)

    def max_chunk_within(self, step_budget: float, batch: int, context_sum: int,
                         chunk_context: int = 0, limit: int = 1 << 16) -> int:
        """Largest prefill chunk (<= limit) whose mixed step with this decode batch stays
        within `step_budget` seconds; 0 if even the decode batch alone does not."""
        if self.mixed_step_time(batch, context_sum, 1, chunk_context) > step_budget:
            return 0
        lo, hi = 1, limit  # step time grows with the chunk: bisect
        if self.mixed_step_time(batch, context_sum, hi, chunk_context) <= step_budget:
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.mixed_step_time(batch, context_sum, mid, chunk_context) <= step_budget:
                lo = mid
            else:
                hi = mid
        return lo

    def decode_run_times(self, batch: int, context_sum: int, steps: int) -> np.ndarray:
        """Durations of `steps` consecutive pure-decode steps of the same `batch` sequences
        whose contexts sum to `context_sum` before the first step (each grows by one a step)."""
        kv_read = context_sum + np.arange(steps, dtype=np.float64) * batch
        t = self.gpu_time(batch, batch, batch, kv_read) + self.comm_time(float(batch))
        return np.asarray(t, dtype=np.float64)

    def kv_transfer_time(self, prompt_tokens: int) -> float:
        """P->D handoff of a prompt's KV: bytes over the per-GPU links of the TP group."""
        if prompt_tokens <= 0:
            return 0.0
        bytes_ = prompt_tokens * self.model.kv_bytes_per_token
        return bytes_ / (self.gpu.kv_link_bandwidth * self.tp) + self.gpu.kv_link_latency

    def host_load_time(self, tokens: int) -> float:
        """CPU offload tier to HBM: `tokens`' KV over each rank's own PCIe link."""
        return tokens * self.model.kv_bytes_per_token / (self.gpu.host_link_bandwidth * self.tp)

    def host_tier_blocks(self, offload_bytes: float, block_size: int = 16) -> int:
        """KV blocks an offload tier of `offload_bytes` (summed over the ranks, as vLLM's
        --kv-offloading-size) holds."""
        return int(offload_bytes // (self.model.kv_bytes_per_token * block_size))


def make_step_model(model: str, gpu: str, tensor_parallel: int = 1) -> StepModel:
    return StepModel(get_model(model), get_gpu(gpu), tensor_parallel)
