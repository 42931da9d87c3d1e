"""The BERT family: one definition, the standard sizes, Hugging Face `BertModel` parameter names and shapes.

Because names and shapes match `BertModel`'s state dict, upstream checkpoints load with a plain
`load_state_dict` (see `zoo import`). The classifier reads token ids only: id 0 is [PAD], and the
attention mask is derived from it, so the exported ONNX has one input like the other zoo models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from zoo.data.langid import TRAINED
from zoo.models.registry import register_model


@dataclass(frozen=True)
class BertConfig:
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int = 30522
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    pad_token_id: int = 0

    @classmethod
    def from_hf(cls, config: dict) -> "BertConfig":
        """From a Hugging Face config.json (BertModel); other keys are ignored."""
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in config.items() if k in names})


# The standard sizes (Turc et al. 2019 "Well-Read Students Learn Better" for the small ones; Devlin et al. 2019 base).
# What `zoo import` converts into a BERT entry (zoo.importer): a transformers BertModel checkpoint folder.
UPSTREAM = "a Hugging Face BERT checkpoint (`--from hf:<repo id>` from the local hub cache, or a folder)"

SIZES = {
    "bert-tiny": BertConfig(2, 128, 2, 512),
    "bert-mini": BertConfig(4, 256, 4, 1024),
    "bert-small": BertConfig(4, 512, 8, 2048),
    "bert-medium": BertConfig(8, 512, 8, 2048),
    "bert-base": BertConfig(12, 768, 12, 3072),
}


class BertEmbeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)  # noqa: N815 (upstream name)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # Single-segment inputs: token type 0 everywhere.
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings.weight[0]
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.head_dim = c.hidden_size // c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.dropout = nn.Dropout(c.attention_probs_dropout_prob)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # The head count follows the (possibly tensor-parallel sharded) width; a constant in the exported graph, the
        # [batch, tokens, heads, head_dim] reshape onnxruntime's transformer optimizer fuses into one Attention op.
        q, k, v = (y.view(b, t, int(y.shape[-1]) // self.head_dim, self.head_dim).transpose(1, 2)
                   for y in (self.query(x), self.key(x), self.value(x)))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask_bias
        context = self.dropout(scores.softmax(dim=-1)) @ v
        return context.transpose(1, 2).reshape(b, t, -1)


class BertSelfOutput(nn.Module):
    def __init__(self, c: BertConfig, in_features: int):
        super().__init__()
        self.dense = nn.Linear(in_features, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)  # noqa: N815
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertSelfOutput(c, c.hidden_size)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, mask_bias), x)


class BertIntermediate(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertSelfOutput(c, c.intermediate_size)  # same shape as upstream's BertOutput

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        attended = self.attention(x, mask_bias)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(c) for _ in range(c.num_hidden_layers))

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask_bias)
        return x


class BertPooler(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class BertModel(nn.Module):
    """Parameter names and shapes of Hugging Face's BertModel (embeddings / encoder.layer.N / pooler)."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.config = c
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)
        self.pooler = BertPooler(c)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Last hidden states [batch, tokens, hidden]; padding (id 0) is masked out of attention."""
        return self.encoder(self.embeddings(input_ids), mask_bias(self.keep(input_ids)))

    def keep(self, input_ids: torch.Tensor) -> torch.Tensor:
        """1 for real tokens, 0 for padding (int64: pipeline stages pass it on without gradients)."""
        return (input_ids != self.config.pad_token_id).long()


def mask_bias(keep: torch.Tensor) -> torch.Tensor:
    """Additive attention bias: 0 where attended, the float32 minimum on padding."""
    # Broadcast first, then Cast, Sub, Mul: Hugging Face's order, the mask pattern onnxruntime's Attention fusion knows.
    return (1.0 - keep[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min


class BertClassifier(nn.Module):
    """BertModel + a linear head over the [CLS] pooler output ("cls") or the mean of real tokens ("mean")."""

    def __init__(self, c: BertConfig, num_classes: int, pooling: str = "cls"):
        super().__init__()
        self.bert = BertModel(c)
        self.pooling = pooling
        self.dropout = nn.Dropout(c.hidden_dropout_prob)
        self.classifier = nn.Linear(c.hidden_size, num_classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        keep = (input_ids != self.bert.config.pad_token_id)
        return self.classify(self.bert(input_ids), keep)

    def classify(self, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        if self.pooling == "cls":
            pooled = self.bert.pooler(hidden)
        else:
            weights = keep.to(hidden.dtype)[:, :, None]
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return self.classifier(self.dropout(pooled))

    def parallel_units(self) -> list[nn.Module]:
        return [self.bert.embeddings, *self.bert.encoder.layer]

    def pipeline_blocks(self) -> list[nn.Module]:
        # Split points between transformer layers; the padding mask (int64, no gradient) travels with the hidden states.
        return [_EmbedStage(self.bert), *(_LayerStage(layer) for layer in self.bert.encoder.layer), _HeadStage(self)]

    def tensor_parallel_plan(self) -> dict:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel  # lazy: TP ranks only

        plan = {}
        for i in range(len(self.bert.encoder.layer)):
            prefix = f"bert.encoder.layer.{i}"
            # Heads split across ranks (q/k/v column-wise), projections back to the hidden size row-wise:
            # one all-reduce after attention and one after the FFN.
            for name in ("attention.self.query", "attention.self.key", "attention.self.value", "intermediate.dense"):
                plan[f"{prefix}.{name}"] = ColwiseParallel()
            for name in ("attention.output.dense", "output.dense"):
                plan[f"{prefix}.{name}"] = RowwiseParallel()
        return plan


class _EmbedStage(nn.Module):
    def __init__(self, bert: BertModel):
        super().__init__()
        self.embeddings = bert.embeddings
        self._keep = bert.keep

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.embeddings(input_ids), self._keep(input_ids)


class _LayerStage(nn.Module):
    def __init__(self, layer: BertLayer):
        super().__init__()
        self.layer = layer

    def forward(self, hidden: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer(hidden, mask_bias(keep)), keep


class _HeadStage(nn.Module):
    def __init__(self, model: BertClassifier):
        super().__init__()
        self.pooler, self.dropout, self.classifier = model.bert.pooler, model.dropout, model.classifier
        self._classify = model.classify

    def forward(self, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return self._classify(hidden, keep.bool())


def _register(name: str, config: BertConfig) -> None:
    @register_model(name, family="bert", dataset=TRAINED, imports=UPSTREAM, transformer=True)
    def builder(num_classes: int = 8, pooling: str = "cls", vocab_size: int = config.vocab_size) -> nn.Module:
        return BertClassifier(replace(config, vocab_size=vocab_size), num_classes, pooling)

    builder.__name__ = name.replace("-", "_")


for _name, _config in SIZES.items():
    _register(_name, _config)


@register_model("bert", family="bert", dataset="langid", imports=UPSTREAM, transformer=True)
def bert_custom(num_classes: int = 8, pooling: str = "cls", **config) -> nn.Module:
    """Any BERT shape, from config keys (num_hidden_layers, hidden_size, ...): for imported checkpoints, which keep
    their upstream (English-uncased) vocabulary."""
    return BertClassifier(BertConfig(**config), num_classes, pooling)
