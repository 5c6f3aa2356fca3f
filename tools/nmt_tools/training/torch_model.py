"""The Transformer of `train/src/model/transformer.rs` in PyTorch, for `torch_train`: parameter
for parameter under the same checkpoint names, the same arithmetic (pre-norm, tied embeddings
scaled by sqrt(d), Shaw et al.'s relative self-attention with one table shared by the heads,
LDPE/LRPE added to the decoder's embeddings, dropout on embeddings, FFN activations and
sublayer outputs but not on attention probabilities).

Supports pre-norm models with relative self-attention (keys and values, keys only) or none, sinusoidal,
learned or no absolute positions, an LDPE/LRPE length-aware decoder or none, and a GRU or LSTM
position encoder or none: the shipped models and the position study's Transformer,
Rel-Transformer, RNN- and RR-Transformer, LSTM-PE and length-aware variants; not rel-sinusoidal
(fixed relative tables), Chen et al.'s recurrent embeddings (rpe-head, mpr-head), the RNN-NMT
baseline or post-norm models. Any other config is refused by name.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

PAD = 0
# Added to attention scores at masked keys, as in train/src/model/layers.rs.
MASKED_SCORE = -1e9


def refuse_unsupported(config: dict[str, Any]) -> None:
    unsupported = {
        "architecture": config["architecture"] != "transformer",
        "norm": config["norm"] != "pre",
        "recurrent_position": config["recurrent_position"] not in ("none", "gru", "lstm"),
        "relative_attention": config["relative_attention"] not in ("keys_values", "keys", "none"),
    }
    refused = [field for field, bad in unsupported.items() if bad]
    if refused:
        raise SystemExit(f"torch_model: {', '.join(refused)} of {config['preset']} is not built here")


def sin_cos(angles: Any) -> Any:  # noqa: ANN401
    """Angles `[..., d/2]` -> `[..., d]`: sin of angle i in dim 2i, its cos in dim 2i + 1."""
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)


class Attention(nn.Module):  # type: ignore[misc]
    def __init__(self, config: dict[str, Any], self_attention: bool) -> None:
        super().__init__()
        d = config["d_model"]
        self.heads, self.head_dim, self.clip = config["num_heads"], d // config["num_heads"], config["relative_clip"]
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.relative = config["relative_attention"] in ("keys_values", "keys") and self_attention
        self.relative_to_values = self.relative and config["relative_attention"] == "keys_values"
        rows, scale = 2 * self.clip + 1, self.head_dim**-0.5
        if self.relative:
            self.relative_keys = nn.Parameter(torch.randn(rows, self.head_dim) * scale)
        if self.relative_to_values:
            self.relative_values = nn.Parameter(torch.randn(rows, self.head_dim) * scale)

    def split(self, x: Any) -> Any:  # noqa: ANN401
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Any, memory: Any, bias: Any) -> Any:  # noqa: ANN401
        q = self.split(self.q_proj(x)) * self.head_dim**-0.5
        k, v = self.split(self.k_proj(memory)), self.split(self.v_proj(memory))
        scores = q @ k.transpose(-1, -2)
        if self.relative:
            # Table row of each (query, key): clip(key - query, -k, k) + k.
            tq, tk = q.shape[2], k.shape[2]
            distance = torch.arange(tk, device=x.device)[None, :] - torch.arange(tq, device=x.device)[:, None]
            index = distance.clamp(-self.clip, self.clip) + self.clip
            by_distance = q @ self.relative_keys.t().to(q.dtype)
            scores = scores + by_distance.gather(3, index.expand(q.shape[0], self.heads, tq, tk))
        probs = torch.softmax(scores.float() + bias, dim=-1).to(v.dtype)
        context = probs @ v
        if self.relative_to_values:
            one_hot = F.one_hot(index, 2 * self.clip + 1).to(probs.dtype)
            per_distance = torch.einsum("bhqk,qkr->bhqr", probs, one_hot)
            context = context + per_distance @ self.relative_values.to(probs.dtype)
        b, _, t, _ = context.shape
        return self.out_proj(context.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class FeedForward(nn.Module):  # type: ignore[misc]
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.p = config["dropout"]
        self.fc1 = nn.Linear(config["d_model"], config["ffn_dim"])
        self.fc2 = nn.Linear(config["ffn_dim"], config["d_model"])

    def forward(self, x: Any) -> Any:  # noqa: ANN401
        return self.fc2(F.dropout(F.relu(self.fc1(x)), self.p, self.training))


class Layer(nn.Module):  # type: ignore[misc]
    def __init__(self, config: dict[str, Any], cross: bool) -> None:
        super().__init__()
        d, eps = config["d_model"], config["layer_norm_eps"]
        self.p = config["dropout"]
        self.self_attn, self.self_attn_norm = Attention(config, True), nn.LayerNorm(d, eps=eps)
        if cross:
            self.cross_attn, self.cross_attn_norm = Attention(config, False), nn.LayerNorm(d, eps=eps)
        self.ffn, self.ffn_norm = FeedForward(config), nn.LayerNorm(d, eps=eps)

    def forward(self, x: Any, self_bias: Any, memory: Any = None, memory_bias: Any = None) -> Any:  # noqa: ANN401
        h = self.self_attn_norm(x)
        x = x + F.dropout(self.self_attn(h, h, self_bias), self.p, self.training)
        if memory is not None:
            h = self.cross_attn_norm(x)
            x = x + F.dropout(self.cross_attn(h, memory, memory_bias), self.p, self.training)
        return x + F.dropout(self.ffn(self.ffn_norm(x)), self.p, self.training)


class Recurrent(nn.Module):  # type: ignore[misc]
    """A one-layer GRU or LSTM over the scaled embeddings (train/src/model/recurrent.rs): torch's
    own layer, saved and loaded under nmt-train's names (`weight_ih`, ..., `_reverse`)."""

    def __init__(self, cell: str, d: int, bidirectional: bool) -> None:
        super().__init__()
        hidden = d // 2 if bidirectional else d
        layer = nn.GRU if cell == "gru" else nn.LSTM
        self.rnn = layer(d, hidden, batch_first=True, bidirectional=bidirectional)
        self.names = {
            f"{kind}{suffix}": f"{kind}_l0{suffix}"
            for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            for suffix in ("", "_reverse")
        }
        self.register_state_dict_post_hook(self.to_checkpoint_names)
        self.register_load_state_dict_pre_hook(self.from_checkpoint_names)

    @staticmethod
    def to_checkpoint_names(module: Any, state: dict[str, Any], prefix: str, _: Any) -> None:  # noqa: ANN401
        for ours, theirs in module.names.items():
            if f"{prefix}rnn.{theirs}" in state:
                state[f"{prefix}{ours}"] = state.pop(f"{prefix}rnn.{theirs}")

    @staticmethod
    def from_checkpoint_names(module: Any, state: dict[str, Any], prefix: str, *_: Any) -> None:  # noqa: ANN401
        for ours, theirs in module.names.items():
            if f"{prefix}{ours}" in state:
                state[f"{prefix}rnn.{theirs}"] = state.pop(f"{prefix}{ours}")

    def forward(self, x: Any, lengths: Any = None) -> Any:  # noqa: ANN401
        """`lengths` (real positions of each row) keep trailing padding out of the state, in
        both directions, and zero the outputs there, as the Rust layer does."""
        if lengths is None:
            return self.rnn(x)[0]
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        return nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]


class Stack(nn.Module):  # type: ignore[misc]
    def __init__(self, config: dict[str, Any], layers: int, cross: bool) -> None:
        super().__init__()
        cell = config["recurrent_position"]
        # The encoder's LSTM reads both ways (Rosendahl et al.); GRUs and decoders read forward.
        if cell != "none":
            self.position = Recurrent(cell, config["d_model"], bidirectional=cell == "lstm" and not cross)
        self.layers = nn.ModuleList([Layer(config, cross) for _ in range(layers)])
        self.final_norm = nn.LayerNorm(config["d_model"], eps=config["layer_norm_eps"])

    def words(self, embedded: Any, lengths: Any = None) -> Any:  # noqa: ANN401
        """The embeddings through the position encoder, if the stack has one."""
        return self.position(embedded, lengths) if hasattr(self, "position") else embedded


class Transformer(nn.Module):  # type: ignore[misc]
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        refuse_unsupported(config)
        d = self.d = config["d_model"]
        self.p, self.length_kind = config["dropout"], config["length_encoding"]
        self.embed = nn.Embedding(config["vocab_size"], d)
        self.encoder = Stack(config, config["encoder_layers"], cross=False)
        self.decoder = Stack(config, config["decoder_layers"], cross=True)
        # Computed in f64 and rounded once, as sinusoid_inverse_frequencies in Rust.
        self.absolute = config["absolute_position"]
        if self.absolute == "learned":
            self.pos_embed = nn.Embedding(config["max_positions"], d)
        inverse = torch.tensor([10000.0 ** (-2.0 * i / d) for i in range(d // 2)], dtype=torch.float32)
        self.register_buffer("inverse", inverse, persistent=False)
        exponents = torch.tensor([-2.0 * i / d for i in range(d // 2)], dtype=torch.float32)
        self.register_buffer("exponents", exponents, persistent=False)
        for name, param in self.named_parameters():
            if name.endswith("bias") and ".position." not in name:
                nn.init.zeros_(param)
            elif name in ("embed.weight", "pos_embed.weight"):
                nn.init.normal_(param, std=d**-0.5)
            elif param.dim() == 2 and "relative" not in name and ".position." not in name:
                nn.init.xavier_uniform_(param)

    def length_encoding(self, lengths: Any, t: int) -> Any:  # noqa: ANN401
        positions = torch.arange(t, device=lengths.device, dtype=torch.float32)[None, :, None]
        lengths = lengths.float()[:, None, None]
        if self.length_kind == "ldpe":
            return sin_cos((lengths - positions) * self.inverse)
        return sin_cos(positions * torch.exp(lengths.clamp(min=1).log() * self.exponents))

    def positions(self, t: int, device: Any) -> Any:  # noqa: ANN401
        """Absolute positions 0..t as the config adds them to the embeddings (0 for none)."""
        if self.absolute == "sinusoidal":
            return sin_cos(torch.arange(t, device=device, dtype=torch.float32)[:, None] * self.inverse)
        if self.absolute == "learned":
            return self.pos_embed.weight[:t]
        return 0.0

    def forward(self, source: Any, decoder_input: Any, lengths: Any) -> Any:  # noqa: ANN401
        keys = torch.where(source == PAD, MASKED_SCORE, 0.0)[:, None, None, :]
        embedded = self.encoder.words(self.embed(source) * self.d**0.5, (source != PAD).sum(1))
        x = embedded + self.positions(source.shape[1], source.device)
        x = F.dropout(x, self.p, self.training)
        for layer in self.encoder.layers:
            x = layer(x, keys)
        memory = self.encoder.final_norm(x)
        t = decoder_input.shape[1]
        causal = torch.full((t, t), MASKED_SCORE, device=source.device).triu(1)
        # A length-aware decoder's length encoding takes the place of absolute positions.
        aware = self.length_kind != "none"
        order = self.length_encoding(lengths, t) if aware else self.positions(t, source.device)
        y = self.decoder.words(self.embed(decoder_input) * self.d**0.5) + order
        y = F.dropout(y, self.p, self.training)
        for layer in self.decoder.layers:
            y = layer(y, causal, memory, keys)
        return self.decoder.final_norm(y) @ self.embed.weight.t().to(y.dtype)
