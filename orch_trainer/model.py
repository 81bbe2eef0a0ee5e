"""The tiny char-level transformer of ``--preset tiny``, with optional LoRA adapters.

Small on purpose: 60 steps take a few seconds on one CPU core, so every failure path (OOM, NaN,
disk full, preemption, kill -9) can be exercised for real in the test suite.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 96
    block_size: int = 64
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    dropout: float = 0.1  # non-zero on purpose: exact resume must restore the RNG, not get lucky

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, ModelConfig] = {"tiny": ModelConfig()}


class LoRALinear(nn.Module):
    """``base(x) + (x A^T B^T) * alpha/r`` with ``base`` frozen; B starts at zero (no-op at init)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float = 16.0) -> None:
        super().__init__()
        self.base = base
        self.base.weight.requires_grad_(False)
        if self.base.bias is not None:
            self.base.bias.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scale

    def merged(self) -> dict[str, torch.Tensor]:
        """The plain Linear's parameters with the adapter folded in (for result/model.pt)."""
        out = {"weight": self.base.weight + (self.lora_b @ self.lora_a) * self.scale}
        if self.base.bias is not None:
            out["bias"] = self.base.bias
        return out


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.p_drop = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.p_drop if self.training else 0.0)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class TinyGPT(nn.Module):
    def __init__(self, cfg: ModelConfig, lora_rank: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.lora_rank = lora_rank
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if lora_rank:
            # LoRA fine-tunes the attention and MLP projections; everything else stays frozen.
            for p in self.parameters():
                p.requires_grad_(False)
            for blk in self.blocks:
                for name in ("qkv", "proj", "fc", "out"):
                    setattr(blk, name, LoRALinear(getattr(blk, name), lora_rank))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of next-character prediction."""
        t = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))

    def plain_state_dict(self) -> dict[str, torch.Tensor]:
        """State dict of the plain architecture (LoRA merged): loads into ``TinyGPT(cfg)``."""
        sd = {k: v.detach().clone() for k, v in self.state_dict().items()
              if ".lora_" not in k and ".base." not in k}
        for name, mod in self.named_modules():
            if isinstance(mod, LoRALinear):
                for pname, val in mod.merged().items():
                    sd[f"{name}.{pname}"] = val.detach().clone()
        return sd


def checkpoint_bytes_estimate(cfg: ModelConfig, lora_rank: int) -> tuple[int, int]:
    """(bytes of one training checkpoint, bytes of result/model.pt), without allocating the model.

    Built on the meta device: the free-space check runs before the model loads (lesson 2: a
    filesystem check must not wait for the expensive part).
    """
    with torch.device("meta"):
        m = TinyGPT(cfg, lora_rank)
    total = sum(p.numel() * p.element_size() for p in m.parameters())
    trainable = sum(p.numel() * p.element_size() for p in m.parameters() if p.requires_grad)
    plain = sum(p.numel() * p.element_size() for n, p in m.named_parameters() if ".lora_" not in n)
    overhead = 64 * 1024  # zip headers, pickles, RNG states, manifest
    return total + 2 * trainable + overhead, plain + overhead  # AdamW keeps two moments per trainable
