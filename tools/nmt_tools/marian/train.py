"""Train a small Hugging Face Marian model (OPUS-MT's architecture: post-norm, sinusoidal
positions, tied embeddings, separate source and target SentencePiece models) on the corpus, with
torch on the CPU: a trained model in the format users bring, for what random fixtures cannot
show (`nmt-export import-marian` agreeing with `transformers` on real sentences, and int8's
quality gate measured in BLEU on an imported model).

    nice -n 19 python3 -m nmt_tools.marian.train --out runs/marian-small --minutes 100

SentencePiece models and the shared `vocab.json` are made as `nmt_tools.marian.fixture` makes
them; pairs are batched by length (at most `--batch-tokens` target tokens a batch, shuffled
batches), Adam with inverse-square-root decay after a linear warm-up, label smoothing 0.1,
dropout 0.1. A checkpoint is written every `--checkpoint-minutes` and at the end; a second run
with the same `--out` resumes from it (the config is read back from it, the budget counts on).
The Hugging Face directory (`hf/`) is written with `save_pretrained` at the end, with
OPUS-MT's generation settings; `train.log` holds one JSON line per report.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt_tools.marian.fixture import Variant, random_model, write_tokenizer
from nmt_tools.paths import shown

if TYPE_CHECKING:
    from transformers import MarianTokenizer

MODULE = "nmt_tools.marian.train"
Model = Any
Optimizer = Any


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides the model: written into the checkpoint and the log."""

    corpus: str
    d_model: int = 256
    layers: int = 3
    heads: int = 4
    ffn: int = 1024
    activation: str = "swish"
    vocab_per_side: int = 6000
    spm_lines: int = 200000
    max_subwords: int = 64
    batch_tokens: int = 3000
    learning_rate: float = 7e-4
    warmup_steps: int = 1000
    label_smoothing: float = 0.1
    dropout: float = 0.1
    seed: int = 1

    def variant(self) -> Variant:
        return Variant(
            "trained",
            d_model=self.d_model,
            layers=self.layers,
            heads=self.heads,
            ffn=self.ffn,
            activation=self.activation,
            vocab_per_side=self.vocab_per_side,
            max_positions=512,
            seed=self.seed,
            zero_pad_embedding=True,
        )


Pair = tuple[list[int], list[int]]


def aligned_lines(english: Path, spanish: Path, count: int) -> tuple[list[str], list[str]]:
    """The first `count` pairs of two line-aligned files, pairs with an empty side left out."""
    sides = (english.read_text(encoding="utf-8").split("\n"), spanish.read_text(encoding="utf-8").split("\n"))
    pairs = [(e.strip(), s.strip()) for e, s in zip(*sides, strict=True) if e.strip() and s.strip()][:count]
    return [e for e, _ in pairs], [s for _, s in pairs]


def encode_pairs(tokenizer: MarianTokenizer, english: list[str], spanish: list[str], limit: int) -> list[Pair]:
    """Source and target ids, EOS appended to both, pairs longer than `limit` on a side left out."""
    sources = tokenizer(english, add_special_tokens=True)["input_ids"]
    targets = tokenizer(text_target=spanish, add_special_tokens=True)["input_ids"]
    return [(s, t) for s, t in zip(sources, targets, strict=True) if len(s) <= limit and len(t) <= limit]


def batches(pairs: list[Pair], batch_tokens: int, rng: random.Random) -> list[list[Pair]]:
    """Pairs sorted by length into batches of at most `batch_tokens` padded target tokens, shuffled."""
    ordered = sorted(pairs, key=lambda p: (len(p[1]), len(p[0]), rng.random()))
    out: list[list[Pair]] = []
    current: list[Pair] = []
    for pair in ordered:
        longest = max([len(pair[1]), *(len(p[1]) for p in current[-1:])])
        if current and (len(current) + 1) * longest > batch_tokens:
            out.append(current)
            current = []
        current.append(pair)
    if current:
        out.append(current)
    rng.shuffle(out)
    return out


def tensors(batch: list[Pair], pad: int) -> tuple[Any, Any, Any, Any]:
    """input_ids, attention_mask, decoder_input_ids (pad first, as Marian starts), labels."""
    import torch

    source_len = max(len(s) for s, _ in batch)
    target_len = max(len(t) for _, t in batch)
    input_ids = torch.full((len(batch), source_len), pad, dtype=torch.long)
    labels = torch.full((len(batch), target_len), -100, dtype=torch.long)
    decoder_ids = torch.full((len(batch), target_len), pad, dtype=torch.long)
    for row, (source, target) in enumerate(batch):
        input_ids[row, : len(source)] = torch.tensor(source)
        labels[row, : len(target)] = torch.tensor(target)
        decoder_ids[row, 1 : len(target)] = torch.tensor(target[:-1])
    return input_ids, (input_ids != pad).long(), decoder_ids, labels


def learning_rate(config: TrainConfig, step: int) -> float:
    warm = min(1.0, (step + 1) / config.warmup_steps)
    decay = math.sqrt(config.warmup_steps / max(step + 1, config.warmup_steps))
    return config.learning_rate * warm * decay


@dataclass
class Progress:
    step: int = 0
    seconds: float = 0.0
    epoch: int = 0
    batch_in_epoch: int = 0


def save_checkpoint(path: Path, model: Model, optimizer: Optimizer, config: TrainConfig, progress: Progress) -> None:
    import torch

    scratch = path.with_suffix(".tmp")
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "config": asdict(config),
        "progress": asdict(progress),
    }
    torch.save(state, scratch)
    os.replace(scratch, path)


def log(out: Path, record: dict[str, Any]) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    with (out / "train.log").open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")


def dev_loss(model: Model, dev: list[list[Pair]], pad: int) -> float:
    """Mean token cross-entropy (no smoothing) on the dev batches."""
    import torch
    import torch.nn.functional as F

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in dev:
            input_ids, mask, decoder_ids, labels = tensors(batch, pad)
            logits = model(input_ids=input_ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
            total += float(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum"))
            count += int((labels != -100).sum())
    model.train()
    return total / max(count, 1)


def new_model(
    config: TrainConfig, vocab_size: int, pad: int, hf_dir: Path, state: dict[str, Any] | None
) -> tuple[Model, Optimizer]:
    """A MarianMTModel of the config's shape with transformers' own initialization (the
    fixture draws every weight for its traps), or the checkpoint's weights, and its optimizer."""
    import torch

    model = random_model(config.variant(), vocab_size, pad, hf_dir)
    model.config.dropout = config.dropout
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = config.dropout
    model.apply(model._init_weights)
    with torch.no_grad():
        model.final_logits_bias.zero_()
        model.get_input_embeddings().weight[pad].zero_()
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, betas=(0.9, 0.98), eps=1e-9)
    if state:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    return model, optimizer


def train_step(
    model: Model, optimizer: Optimizer, batch: list[Pair], config: TrainConfig, pad: int, step: int
) -> float:
    """One update on `batch`; its label-smoothed loss. Pad's embedding row stays zero, as
    CTranslate2's Marian conversion assumes of trained models."""
    import torch
    import torch.nn.functional as F

    for group in optimizer.param_groups:
        group["lr"] = learning_rate(config, step)
    input_ids, mask, decoder_ids, labels = tensors(batch, pad)
    logits = model(input_ids=input_ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    loss = F.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=config.label_smoothing
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    with torch.no_grad():
        model.get_input_embeddings().weight[pad].zero_()
    return float(loss.item())


def load_data(config: TrainConfig, corpus: Path, hf_dir: Path) -> tuple[dict[str, int], list[Pair], list[list[Pair]]]:
    """The vocabulary (SentencePiece models trained on a sample of the training pairs, or the
    run's own when resuming), the training pairs' ids and the dev batches."""
    from transformers import MarianTokenizer

    english, spanish = aligned_lines(corpus / "train.en", corpus / "train.es", 10**9)
    if (hf_dir / "vocab.json").exists():
        tokenizer = MarianTokenizer.from_pretrained(str(hf_dir))
        vocab: dict[str, int] = tokenizer.get_vocab()
    else:
        spm = random.Random(config.seed)
        picked = sorted(spm.sample(range(len(english)), min(config.spm_lines, len(english))))
        tokenizer, vocab = write_tokenizer(
            config.variant(), [english[i] for i in picked], [spanish[i] for i in picked], hf_dir
        )
    pairs = encode_pairs(tokenizer, english, spanish, config.max_subwords)
    dev_pairs = encode_pairs(tokenizer, *aligned_lines(corpus / "l10n-dev.en", corpus / "l10n-dev.es", 600), 10**6)
    return vocab, pairs, batches(dev_pairs, config.batch_tokens, random.Random(0))


def train(args: argparse.Namespace) -> None:
    import torch

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "checkpoint.pt"
    state = torch.load(checkpoint, weights_only=False) if checkpoint.exists() else None
    corpus = Path(args.corpus)
    config = TrainConfig(**state["config"]) if state else TrainConfig(corpus=shown(corpus))
    progress = Progress(**state["progress"]) if state else Progress()
    torch.set_num_threads(args.threads)
    torch.manual_seed(config.seed + progress.step)

    vocab, pairs, dev = load_data(config, corpus, out / "hf")
    pad = vocab["<pad>"]

    model, optimizer = new_model(config, len(vocab), pad, out / "hf", state)
    log(
        out,
        {
            "start": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "config": asdict(config),
            "pairs": len(pairs),
            "vocab": len(vocab),
            "parameters": sum(p.numel() for p in model.parameters()),
            "resumed_at": asdict(progress),
            "threads": args.threads,
        },
    )
    model.train()
    budget_end = progress.seconds + args.minutes * 60
    last_checkpoint = time.monotonic()
    started = time.monotonic() - progress.seconds
    while progress.seconds < budget_end:
        epoch = batches(pairs, config.batch_tokens, random.Random(config.seed * 1000 + progress.epoch))
        while progress.batch_in_epoch < len(epoch) and progress.seconds < budget_end:
            loss = train_step(model, optimizer, epoch[progress.batch_in_epoch], config, pad, progress.step)
            progress.step += 1
            progress.batch_in_epoch += 1
            progress.seconds = time.monotonic() - started
            if progress.step % args.report_every == 0:
                log(
                    out,
                    {
                        "step": progress.step,
                        "epoch": progress.epoch,
                        "loss": round(loss, 4),
                        "lr": learning_rate(config, progress.step),
                        "minutes": round(progress.seconds / 60, 1),
                    },
                )
            if time.monotonic() - last_checkpoint > args.checkpoint_minutes * 60:
                save_checkpoint(checkpoint, model, optimizer, config, progress)
                log(out, {"step": progress.step, "dev_loss": round(dev_loss(model, dev, pad), 4)})
                last_checkpoint = time.monotonic()
        if progress.batch_in_epoch >= len(epoch):
            progress.epoch += 1
            progress.batch_in_epoch = 0
    save_checkpoint(checkpoint, model, optimizer, config, progress)
    model.eval()
    model.save_pretrained(str(out / "hf"), safe_serialization=True)
    log(
        out,
        {
            "end": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "step": progress.step,
            "epoch": progress.epoch,
            "minutes": round(progress.seconds / 60, 1),
            "dev_loss": round(dev_loss(model, dev, pad), 4),
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="run folder: checkpoint.pt, train.log, hf/")
    parser.add_argument("--corpus", default="data/corpus-l10n", help="corpus folder (train.en/.es, l10n-dev.en/.es)")
    parser.add_argument("--minutes", type=float, default=60.0, help="training time this run adds")
    parser.add_argument("--threads", type=int, default=2, help="torch's intra-op threads")
    parser.add_argument("--checkpoint-minutes", type=float, default=10.0, help="minutes between checkpoints")
    parser.add_argument("--report-every", type=int, default=50, help="steps between loss lines")
    train(parser.parse_args())


if __name__ == "__main__":
    main()
