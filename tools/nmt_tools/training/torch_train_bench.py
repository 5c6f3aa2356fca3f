"""Training-throughput anchor: PyTorch on this CPU, same shape as the shipped model (run by
bench/training/compare.sh beside candle's step_profile).

d_model 256, 4 heads, ffn 1024, 3+3 layers, pre-norm, vocab 8000 shared and tied, label
smoothing 0.1, Adam. Batches of B sentences x T tokens (source and target). Prints target
tokens/s for each (dtype, threads) after warm-up. Needs PyPI torch
(`pip install -e 'tools[torch]'`; the CPU wheel is enough).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from typing import Any

MODULE = "nmt_tools.training.torch_train_bench"
VOCAB, D_MODEL, HEADS, LAYERS, FFN, DROPOUT = 8000, 256, 4, 3, 1024, 0.1
MAX_POSITIONS = 512


def model() -> Any:  # noqa: ANN401 (a torch module; torch has no types here)
    """The shipped shape in PyTorch: sinusoidal positions, embeddings scaled by sqrt(d) and
    tied with the output projection."""
    import torch
    from torch import nn

    class Transformer(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, D_MODEL)
            self.t = nn.Transformer(D_MODEL, HEADS, LAYERS, LAYERS, FFN, DROPOUT, batch_first=True, norm_first=True)
            pe = torch.zeros(MAX_POSITIONS, D_MODEL)
            pos = torch.arange(MAX_POSITIONS).unsqueeze(1)
            div = torch.exp(torch.arange(0, D_MODEL, 2) * (-math.log(10000.0) / D_MODEL))
            pe[:, 0::2] = torch.sin(pos * div)
            pe[:, 1::2] = torch.cos(pos * div)
            self.register_buffer("pe", pe)

        def embed(self, x: Any) -> Any:  # noqa: ANN401
            return self.emb(x) * math.sqrt(D_MODEL) + self.pe[: x.shape[1]]

        def forward(self, src: Any, tgt: Any) -> Any:  # noqa: ANN401
            mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
            h = self.t(self.embed(src), self.embed(tgt), tgt_mask=mask, tgt_is_causal=True)
            return h @ self.emb.weight.t()

    return Transformer()


def train_step(args: argparse.Namespace) -> Callable[[], None]:
    """One optimizer step on a fixed random batch."""
    import torch
    from torch import nn

    m = model()
    opt = torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98))
    loss_f = nn.CrossEntropyLoss(label_smoothing=0.1)
    src = torch.randint(4, VOCAB, (args.batch, args.len))
    tgt = torch.randint(4, VOCAB, (args.batch, args.len + 1))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = m(src, tgt[:, :-1])
            loss = loss_f(logits.float().reshape(-1, VOCAB), tgt[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--batch", type=int, default=96, help="sentences per batch")
    p.add_argument("--len", type=int, default=32, help="tokens per source and target sentence")
    p.add_argument("--steps", type=int, default=8, help="timed steps, after 2 warm-up steps")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    step = train_step(args)
    for _ in range(2):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    dt = time.perf_counter() - start
    # bench/training/compare.sh reads the figure before "target tok/s".
    print(
        f"torch {torch.__version__} threads={args.threads} bf16={args.bf16} batch={args.batch}x{args.len}: "
        f"{args.batch * args.len * args.steps / dt:.0f} target tok/s ({dt / args.steps * 1000:.0f} ms/step)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
