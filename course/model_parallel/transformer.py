"""A tiny decoder-only transformer (GPT-style), the model the tensor- and pipeline-parallel lessons split.

Tokens -> embedding + learned positions -> ``num_layers`` blocks -> layer norm -> logits over the characters.
Each :class:`Block` is pre-norm: ``x + attention(norm1(x))`` then ``x + mlp(norm2(x))``. :class:`Attention`
keeps one ``qkv`` linear whose output is laid out ``[q | k | v]``, each ``num_heads`` heads of ``head_dim``
features, so heads can later be split across ranks by slicing rows (``course.model_parallel.tensor_parallel``).
:func:`train` is the single-device reference loop on the grammar corpus (``corpus``): a hundred Adam steps
take seconds on one CPU core. Taught in ``notebooks/08_tensor_pipeline.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - torch's own idiom

from course.model_parallel import corpus


@dataclass(frozen=True)
class Config:
    """The transformer's shape (defaults: ~0.2 M parameters, seconds to train on a CPU)."""

    vocab_size: int = 32   # characters; corpus.Vocabulary.of(text).size
    seq_len: int = 32      # tokens per sequence (the longest context)
    d_model: int = 64      # width of the residual stream
    num_heads: int = 4     # attention heads; d_model must divide by it
    num_layers: int = 4    # transformer blocks
    d_ff: int = 256        # hidden width of each MLP (4 x d_model)

    def __post_init__(self) -> None:
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} must divide into num_heads={self.num_heads} heads of equal "
                             "width: pick num_heads among the divisors of d_model.")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


def attend(qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Causal multi-head attention on projected ``(B, S, 3·num_heads·head_dim)`` laid out ``[q | k | v]``.

    Returns:
        ``(B, S, num_heads·head_dim)``: every head's output, side by side.
    """
    batch_size, seq_len, width = qkv.shape
    q, k, v = (t.reshape(batch_size, seq_len, num_heads, width // (3 * num_heads)).transpose(1, 2)
               for t in qkv.chunk(3, dim=-1))  # (B, H, S, head_dim)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(batch_size, seq_len, width // 3)


class Attention(nn.Module):
    """Causal self-attention: ``proj(attend(qkv(x)))``."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(attend(self.qkv(x), self.num_heads))


class MLP(nn.Module):
    """``fc2(gelu(fc1(x)))``: d_model -> d_ff -> d_model."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attention(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.norm1, self.attention = nn.LayerNorm(config.d_model), Attention(config)
        self.norm2, self.mlp = nn.LayerNorm(config.d_model), MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """Decoder-only transformer: ``(B, S)`` token ids -> ``(B, S, vocab_size)`` logits of the next token."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, S)`` ids -> ``(B, S, d_model)``: token embedding plus position embedding.

        Raises:
            ValueError: sequences longer than ``config.seq_len``.
        """
        if tokens.shape[-1] > self.config.seq_len:
            raise ValueError(f"sequences of {tokens.shape[-1]} tokens are longer than the model's seq_len="
                             f"{self.config.seq_len}: cut them, or build the model with a larger seq_len.")
        return self.embedding(tokens) + self.position(torch.arange(tokens.shape[-1], device=tokens.device))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``(B, S, V)`` logits against ``(B, S)`` next-token ids."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build(config: Config = Config(), seed: int = 0, device: torch.device | str = "cpu") -> Transformer:
    """The transformer with seeded weights on ``device`` (a rank passes ``world.current().device``): the same on
    every rank and every device for the same seed, since they are drawn on the CPU first."""
    torch.manual_seed(seed)
    return Transformer(config).to(device)


@dataclass(frozen=True)
class TrainConfig:
    """The single-device reference run."""

    steps: int = 100          # Adam steps
    batch_size: int = 16      # sequences per step
    lr: float = 3e-3          # Adam learning rate
    sentences: int = 2000     # corpus size (about 60 characters each)
    seed: int = 0             # corpus, weights and batches


def train(config: Config = Config(), train_config: TrainConfig = TrainConfig()) -> tuple[Transformer, list[float]]:
    """Train the transformer on the grammar corpus on one device: the reference every split version must equal.

    Returns:
        ``(model, losses)``: the trained model and the loss of every step.
    """
    tokens = corpus_tokens(config, train_config.sentences, train_config.seed)
    model = build(config, train_config.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=train_config.lr)
    generator = torch.Generator().manual_seed(train_config.seed)
    losses = []
    for _ in range(train_config.steps):
        inputs, targets = corpus.batch(tokens, train_config.batch_size, config.seq_len, generator)
        optimizer.zero_grad(set_to_none=True)
        step_loss = loss(model(inputs), targets)
        step_loss.backward()
        optimizer.step()
        losses.append(step_loss.item())
    return model, losses


def sample_batch(config: Config = Config(), batch_size: int = 8, seed: int = 0, device: torch.device | str = "cpu"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """One ``(inputs, targets)`` batch of the corpus, ``(batch_size, config.seq_len)`` each, on ``device``: the batch
    the parallel versions are compared on (drawn on the CPU, so the same on every device)."""
    tokens = corpus_tokens(config, 200, seed)
    inputs, targets = corpus.batch(tokens, batch_size, config.seq_len, torch.Generator().manual_seed(seed))
    return inputs.to(device), targets.to(device)


def corpus_tokens(config: Config, sentences: int, seed: int) -> torch.Tensor:
    """``(T,)`` token ids of ``sentences`` grammar sentences.

    Raises:
        ValueError: a vocab_size smaller than the grammar's characters.
    """
    vocabulary = corpus.vocabulary()
    if vocabulary.size > config.vocab_size:
        raise ValueError(f"the corpus has {vocabulary.size} characters but vocab_size={config.vocab_size}: "
                         f"build the Config with vocab_size >= {vocabulary.size}.")
    return vocabulary.encode(corpus.sentences(sentences, seed))
