"""What a KV cache costs: bytes per token, per context, and how long a context fits a card.

Chapter: "Applications" (book part two), section "Long documents: what the KV cache still costs".

During generation every layer keeps the keys and values of every past token, so that a new token
attends to them without recomputing them. For one sequence of ``context`` tokens::

    bytes = 2 (K and V) * layers * kv_heads * head_dim * dtype_bytes * context * batch

FlashAttention does not change this number: it removes the N x N score matrix (an activation of
prefill and training), not the cache, which stays O(N). Two things do shrink it: fewer key/value
heads (multi-query and grouped-query attention, GQA) and fewer bytes per element (KV
quantization). The errata of the course correct the claim that FlashAttention lets a 24 GB card
hold 32K-128K tokens: Llama-2-7B in fp16 needs 16 GiB of cache at 32K tokens and 64 GiB at 128K,
on top of its 12.6 GiB of weights.

Sizes are in bytes; ``GiB`` = 2**30 bytes, ``GB`` = 10**9 bytes (card sizes are sold in GB).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validate import check_positive_int

GIB = 2**30
GB = 10**9

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


@dataclass(frozen=True)
class ModelConfig:
    """The attention shape of a decoder-only transformer (what sets its KV cache).

    ``kv_heads < heads`` is grouped-query attention (GQA); ``kv_heads == 1`` is multi-query
    attention (MQA). ``params`` is the parameter count (weights in memory = params x bytes).
    """

    name: str
    layers: int
    heads: int  # query heads
    kv_heads: int  # key/value heads (= heads without GQA)
    head_dim: int
    params: float  # number of parameters
    max_context: int  # the context length the model was trained for
    source: str

    def __post_init__(self):
        for field in ("layers", "heads", "kv_heads", "head_dim", "max_context"):
            check_positive_int(getattr(self, field), field)
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads must be a multiple of kv_heads (GQA groups); got {self.heads} and "
                f"{self.kv_heads}"
            )

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 = standard multi-head attention)."""
        return self.heads // self.kv_heads


# Every number below is from the model's paper and the config.json its authors published
# (num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size / heads).
MODELS: dict[str, ModelConfig] = {
    "GPT-2": ModelConfig(
        "GPT-2 (124M)",
        layers=12,
        heads=12,
        kv_heads=12,
        head_dim=64,
        params=124e6,
        max_context=1024,
        source="Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners', "
        "smallest model; Hugging Face openai-community/gpt2 config.json (n_layer 12, n_head 12, "
        "n_embd 768)",
    ),
    "Llama-2-7B": ModelConfig(
        "Llama-2-7B",
        layers=32,
        heads=32,
        kv_heads=32,
        head_dim=128,
        params=6.74e9,
        max_context=4096,
        source="Touvron et al. 2023, 'Llama 2' (arXiv 2307.09288), Table 1 and the published "
        "config.json of meta-llama/Llama-2-7b-hf (num_hidden_layers 32, num_attention_heads 32, "
        "num_key_value_heads 32, hidden_size 4096)",
    ),
    "Llama-2-13B": ModelConfig(
        "Llama-2-13B",
        layers=40,
        heads=40,
        kv_heads=40,
        head_dim=128,
        params=13.0e9,
        max_context=4096,
        source="Touvron et al. 2023 (arXiv 2307.09288); meta-llama/Llama-2-13b-hf config.json "
        "(num_hidden_layers 40, num_attention_heads 40, hidden_size 5120)",
    ),
    "Llama-2-70B": ModelConfig(
        "Llama-2-70B",
        layers=80,
        heads=64,
        kv_heads=8,
        head_dim=128,
        params=69.0e9,
        max_context=4096,
        source="Touvron et al. 2023 (arXiv 2307.09288), GQA with 8 key/value heads; "
        "meta-llama/Llama-2-70b-hf config.json (num_hidden_layers 80, num_attention_heads 64, "
        "num_key_value_heads 8, hidden_size 8192)",
    ),
    "Mistral-7B": ModelConfig(
        "Mistral-7B",
        layers=32,
        heads=32,
        kv_heads=8,
        head_dim=128,
        params=7.24e9,
        max_context=32768,
        source="Jiang et al. 2023, 'Mistral 7B' (arXiv 2310.06825), Table 1: n_layers 32, "
        "head_dim 128, n_heads 32, n_kv_heads 8",
    ),
    "Llama-3-8B": ModelConfig(
        "Llama-3-8B",
        layers=32,
        heads=32,
        kv_heads=8,
        head_dim=128,
        params=8.03e9,
        max_context=8192,
        source="Meta 2024, 'The Llama 3 Herd of Models' (arXiv 2407.21783), Table 3; "
        "meta-llama/Meta-Llama-3-8B config.json (num_hidden_layers 32, num_attention_heads 32, "
        "num_key_value_heads 8, hidden_size 4096)",
    ),
}


def dtype_bytes(dtype) -> float:
    """Bytes per element for a dtype name ('float16', 'fp8', ...) or a number of bytes."""
    if isinstance(dtype, str):
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)} or bytes")
        return DTYPE_BYTES[dtype]
    if isinstance(dtype, bool) or not isinstance(dtype, (int, float)) or not dtype > 0:
        raise TypeError(f"dtype must be a dtype name or a positive number of bytes; got {dtype!r}")
    return float(dtype)


def _config(model) -> ModelConfig:
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, str):
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; known: {sorted(MODELS)}")
        return MODELS[model]
    raise TypeError(f"model must be a ModelConfig or a name in MODELS; got {type(model).__name__}")


def bytes_per_token(model, dtype="float16") -> float:
    """KV-cache bytes one token adds: 2 * layers * kv_heads * head_dim * dtype_bytes."""
    cfg = _config(model)
    return 2 * cfg.layers * cfg.kv_heads * cfg.head_dim * dtype_bytes(dtype)


def kv_cache_bytes(model, context: int, batch: int = 1, dtype="float16") -> float:
    """Bytes of the K and V caches of ``batch`` sequences of ``context`` tokens each.

    ``model`` is a :class:`ModelConfig` or a name in :data:`MODELS`. For Llama-2-7B in fp16:
    0.5 MiB per token, 16 GiB at 32K tokens, 64 GiB at 128K.
    """
    context = check_positive_int(context, "context")
    batch = check_positive_int(batch, "batch")
    return bytes_per_token(model, dtype) * context * batch


def weight_bytes(model, dtype="float16") -> float:
    """Bytes of the model's weights in ``dtype`` (parameters x bytes per parameter)."""
    return _config(model).params * dtype_bytes(dtype)


def max_context(
    model,
    memory_bytes: float,
    batch: int = 1,
    dtype="float16",
    weights_dtype="float16",
    reserve_bytes: float = 0.0,
) -> int:
    """The longest context whose KV cache fits next to the weights in ``memory_bytes``.

    ``reserve_bytes`` sets aside memory for activations, the CUDA context and fragmentation.
    Returns 0 when the weights alone do not fit.
    """
    batch = check_positive_int(batch, "batch")
    if not memory_bytes > 0:
        raise ValueError(f"memory_bytes must be > 0; got {memory_bytes}")
    free = memory_bytes - weight_bytes(model, weights_dtype) - reserve_bytes
    if free <= 0:
        return 0
    return int(free // (bytes_per_token(model, dtype) * batch))


def table(models=None, contexts=(4096, 32768, 131072), dtype="float16"):
    """Rows ``[name, KiB/token, GiB at each context..., weights GiB]`` for the book's tables."""
    rows = []
    for key in models or MODELS:
        cfg = _config(key)
        row = [cfg.name, bytes_per_token(cfg, dtype) / 1024]
        row += [kv_cache_bytes(cfg, n, dtype=dtype) / GIB for n in contexts]
        row.append(weight_bytes(cfg) / GIB)
        rows.append(row)
    return rows
