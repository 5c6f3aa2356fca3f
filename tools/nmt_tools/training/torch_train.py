"""The shipped Transformer trained in PyTorch, for a machine with a GPU: the same model, the same
checkpoint format and the same objective as `nmt-train train`, so that `nmt-export --checkpoint`
packages what it writes and `nmt-train train --init-from` continues it on the CPU.

`nmt-train train` (candle, CPU only) manages ~850 target subwords/s on two cores; a GPU lent for
minutes is worth more than a day of it. This module mirrors, in torch:

- the model of `train/src/model` (pre-norm Transformer, tied and sqrt(d)-scaled embeddings,
  Shaw et al.'s relative self-attention with tables shared by the heads, LDPE/LRPE length
  encodings in the decoder, no attention dropout), parameter for parameter under the same
  checkpoint names (`encoder.layers.0.self_attn.relative_keys`, ...);
- the objective and schedule of `train/src/train` (label-smoothed cross-entropy averaged over
  target tokens, Adam with betas 0.9/0.98 and eps 1e-9, global-norm clipping, linear warm-up
  then 1/sqrt(step), Oka et al.'s length noise, token-count batches);
- the data steps that only repeat or join pairs (`--oversample`, `--joined-fraction`): the pairs
  come from `nmt-train pairs`, which decides placeholder masking by the Rust rule.

Joined examples are joined as subwords (the Rust trainer joins the texts with a space before
tokenizing, which gives the same subwords with this tokenizer's metaspace) and unmasked.
Training stops `--minutes` after the program started and writes a checkpoint every `--save-minutes`, so a
lease that ends early still leaves one. With `--resume` a run picks up where its `OUT/resume.pt`
left it (weights, moving average, Adam's moments, counters, the random state, and its place in
the batch order), so that a run of hours on a CPU can span several sessions. Beside the trained
weights it keeps an exponential moving average (`--ema`), written as a second checkpoint in
`OUT/ema`.

Needs PyPI torch, safetensors and tokenizers (`pip install -e 'tools[torch]'`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import lzma
import math
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODULE = "nmt_tools.training.torch_train"
PAD, BOS, EOS = 0, 1, 2
WEIGHTS_FILE, CONFIG_FILE, STATE_FILE = "model.safetensors", "config.json", "trainer_state.json"
RESUME_FILE = "resume.pt"
# The flags a resumed run may change: how long and where it runs and how it reports, not what it
# trains (a run begun on a CPU may end on a lent GPU).
RESUME_MAY_CHANGE = {"minutes", "save_minutes", "log_seconds", "resume", "max_steps", "device"}


@dataclass
class Example:
    """One tokenized pair: `source` ends with EOS, `target` holds the bare subwords."""

    source: list[int]
    target: list[int]


def read_pairs(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of `nmt-train pairs` (plain or `.xz`)."""
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def parse_oversample(rule: str) -> tuple[str, int]:
    prefix, _, times = rule.rpartition("=")
    if not prefix or not times.isdigit() or int(times) < 1:
        raise argparse.ArgumentTypeError(f"expected PREFIX=TIMES, got {rule!r}")
    return prefix, int(times)


def encode(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:  # noqa: ANN401
    return [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def training_examples(
    pairs: list[dict[str, Any]],
    tokenizer: Any,  # noqa: ANN401
    oversample: list[tuple[str, int]],
    joined_fraction: float,
    joined_max_verses: int,
    max_len: int,
    seed: int,
) -> list[Example]:
    """Pairs -> examples as `nmt-train train` builds them: oversampled copies appended in corpus
    order, then `round(joined_fraction * n)` joined examples of 2..max pairs two lines apart,
    then everything longer than `max_len` on either side dropped."""
    plain_src = encode(tokenizer, [p["source"] for p in pairs])
    plain_tgt = encode(tokenizer, [p["target"] for p in pairs])
    masked_at = [i for i, p in enumerate(pairs) if p.get("masked")]
    masked_src = encode(tokenizer, [pairs[i]["masked"][0] for i in masked_at])
    masked_tgt = encode(tokenizer, [pairs[i]["masked"][1] for i in masked_at])
    shown_src, shown_tgt = list(plain_src), list(plain_tgt)
    for k, i in enumerate(masked_at):
        shown_src[i], shown_tgt[i] = masked_src[k], masked_tgt[k]
    order = list(range(len(pairs)))
    for prefix, times in oversample:
        chosen = [i for i in range(len(pairs)) if pairs[i]["origin"].startswith(prefix)]
        order.extend(chosen * (times - 1))
    examples = [Example(shown_src[i] + [EOS], shown_tgt[i]) for i in order]
    rng = random.Random(seed ^ 0x6A09E667)
    for _ in range(round(joined_fraction * len(order))):
        parts = rng.randint(2, max(2, joined_max_verses))
        span = 2 * (parts - 1)
        if len(order) <= span:
            continue
        start = rng.randrange(len(order) - span)
        chosen = [order[start + 2 * k] for k in range(parts)]
        source = [t for i in chosen for t in plain_src[i]] + [EOS]
        examples.append(Example(source, [t for i in chosen for t in plain_tgt[i]]))
    return [e for e in examples if len(e.source) <= max_len and len(e.target) + 1 <= max_len]


def dev_examples(tokenizer: Any, paths: Sequence[Path], limit: int, max_len: int) -> list[Example]:  # noqa: ANN401
    """The first `limit` pairs of each dev file, as `nmt-train`'s dev loss reads them."""
    examples = []
    for path in paths:
        pairs = read_pairs(path)[:limit]
        sources = encode(tokenizer, [p["source"] for p in pairs])
        targets = encode(tokenizer, [p["target"] for p in pairs])
        examples += [
            Example(s + [EOS], t)
            for s, t in zip(sources, targets, strict=True)
            if len(s) + 1 <= max_len and len(t) + 1 <= max_len
        ]
    return examples


def token_batches(examples: Sequence[Example], max_tokens: int, rng: random.Random) -> list[list[int]]:
    """Groups of similar length with rows x longest side <= max_tokens, in random order."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    order.sort(key=lambda i: (len(examples[i].source), len(examples[i].target)))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        size = max(len(examples[i].source), len(examples[i].target) + 1)
        grown = max(longest, size)
        if current and grown * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], size
        else:
            longest = grown
        current.append(i)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def pad(rows: Sequence[Sequence[int]]) -> Any:  # noqa: ANN401 (a torch tensor)
    """Rows of ids -> `[rows, longest]` int64, PAD after each row (filled in one numpy step: a
    GPU step is shorter than a Python loop over thousands of rows)."""
    import numpy as np
    import torch

    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
    out = np.full((len(rows), int(lengths.max())), PAD, dtype=np.int64)
    out[np.arange(out.shape[1])[None, :] < lengths[:, None]] = flat
    return torch.from_numpy(out)


def batch_tensors(rows: Sequence[Example], device: Any) -> dict[str, Any]:  # noqa: ANN401
    import torch

    source = pad([e.source for e in rows])
    return {
        "source": source.to(device, non_blocking=True),
        "decoder_input": pad([[BOS, *e.target] for e in rows]).to(device, non_blocking=True),
        "decoder_output": pad([[*e.target, EOS] for e in rows]).to(device, non_blocking=True),
        "lengths": torch.tensor([len(e.target) for e in rows]).to(device, non_blocking=True),
    }


def build_model(config: dict[str, Any]) -> Any:  # noqa: ANN401 (a torch module)
    from nmt_tools.training.torch_model import Transformer

    return Transformer(config)


def describe(device: Any) -> str:  # noqa: ANN401
    import torch

    return str(torch.cuda.get_device_name(device)) if device.type == "cuda" else str(device.type)


def learning_rate(step: int, peak: float, warmup: int) -> float:
    step, warmup = max(step, 1), max(warmup, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


def save_checkpoint(model: Any, config: dict[str, Any], state: dict[str, Any], out: Path, half: bool = False) -> None:  # noqa: ANN401
    """`nmt-train`'s checkpoint layout (weights, config, trainer state), written to a temporary
    folder and renamed so that a kill mid-write leaves the previous one."""
    import torch
    from safetensors.torch import save_file

    dtype = torch.float16 if half else torch.float32
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp / WEIGHTS_FILE))
    (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))
    if out.exists():
        for f in out.iterdir():
            f.unlink()
        out.rmdir()
    tmp.rename(out)


def load_weights(model: Any, path: Path) -> None:  # noqa: ANN401
    from safetensors.torch import load_file

    tensors = {k: v.float() for k, v in load_file(str(path)).items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise SystemExit(f"{MODULE}: {path}: missing {missing}, unexpected {unexpected}")


def dev_loss(model: Any, examples: Sequence[Example], batch_tokens: int, device: Any, autocast: Any) -> float:  # noqa: ANN401
    """Plain NLL per target token at the references' own lengths, as `nmt-train`'s dev loss."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    model.eval()
    nll, tokens = 0.0, 0
    with torch.no_grad(), autocast():
        for indices in token_batches(examples, batch_tokens, random.Random(0)):
            b = batch_tensors([examples[i] for i in indices], device)
            logits = model(b["source"], b["decoder_input"], b["lengths"]).float()
            out = b["decoder_output"]
            nll += F.cross_entropy(logits.flatten(0, 1), out.flatten(), ignore_index=PAD, reduction="sum").item()
            tokens += int((out != PAD).sum().item())
    model.train()
    return nll / max(tokens, 1)


def endless_batches(examples: list[Example], batch_tokens: int, seed: int) -> Iterator[tuple[int, list[int]]]:
    epoch = 0
    while True:
        for batch in token_batches(examples, batch_tokens, random.Random(seed * 1_000_003 + epoch)):
            yield epoch, batch
        epoch += 1


class Trainer:
    """One run's model, optimizer, moving average of the weights and counters."""

    def __init__(self, args: argparse.Namespace, config: dict[str, Any], train_pairs: int) -> None:
        import torch

        self.args, self.config = args, config
        self.device = torch.device(args.device)
        self.model = build_model(config).to(self.device)
        if args.init_from:
            load_weights(self.model, args.init_from)
        torch.backends.cuda.matmul.allow_tf32 = True
        self.weights = list(self.model.state_dict().values())
        self.ema = [w.detach().clone().float() for w in self.weights]
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9, fused=self.device.type == "cuda"
        )
        self.noise = config.get("length_noise", 0)
        self.state: dict[str, Any] = {
            "trainer": f"{MODULE} (torch {torch.__version__}, {describe(self.device)})",
            "args": json.loads(json.dumps(vars(args), default=str)),
            "train_pairs": train_pairs,
            "step": 0,
            "target_tokens_seen": 0,
            "source_tokens_seen": 0,
            "seed": args.seed,
        }
        self.best_dev_loss = math.inf

    def autocast(self) -> Any:  # noqa: ANN401
        import torch

        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.args.bf16)

    def step(self, rows: Sequence[Example], epoch: int) -> tuple[Any, float]:  # noqa: ANN401
        """One update on `rows`: the loss (a tensor, read only when logged) and the learning rate."""
        import torch
        import torch.nn.functional as F  # noqa: N812

        b = batch_tensors(rows, self.device)
        lengths = b["lengths"]
        if self.noise:
            moves = torch.randint(-self.noise, self.noise + 1, lengths.shape, device=self.device)
            lengths = (lengths + moves).clamp(min=1)
        lr = learning_rate(self.state["step"] + 1, self.args.lr, self.args.warmup_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with self.autocast():
            logits = self.model(b["source"], b["decoder_input"], lengths)
        loss = F.cross_entropy(
            logits.float().flatten(0, 1),
            b["decoder_output"].flatten(),
            ignore_index=PAD,
            label_smoothing=self.args.label_smoothing,
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(self.ema, self.weights, 1 - self.args.ema)
        # Counted on the host: reading them from the GPU would wait for every step to finish.
        self.state["step"] += 1
        self.state["epoch"] = epoch
        self.state["target_tokens_seen"] += sum(len(e.target) + 1 for e in rows)
        self.state["source_tokens_seen"] += sum(len(e.source) for e in rows)
        return loss, lr

    def averaged(self) -> Any:  # noqa: ANN401
        """A model holding the moving average of the weights."""
        model = build_model(self.config).to(self.device)
        model.load_state_dict(dict(zip(self.model.state_dict().keys(), self.ema, strict=True)))
        return model

    def keep_best(self, dev: Sequence[Example], train_seconds: float) -> float:
        """The moving average's dev loss now; written to OUT/best when it is the lowest yet, so
        that a run past its data's worth (many passes over little data) keeps its best point."""
        args = self.args
        averaged = self.averaged()
        loss = dev_loss(averaged, dev, args.batch_tokens, self.device, self.autocast)
        if loss < self.best_dev_loss:
            self.best_dev_loss = loss
            state = {**self.state, "train_seconds": train_seconds, "dev_loss": loss, "ema": args.ema}
            save_checkpoint(averaged, self.config, state, args.out / "best", half=args.ema_half)
        return loss

    def save_resume(self, train_seconds: float) -> None:
        """Everything a later `--resume` needs to go on as if never stopped, written to a
        temporary file and renamed so that a kill mid-write leaves the previous one."""
        import torch

        snapshot = {
            "model": self.model.state_dict(),
            "ema": self.ema,
            "optimizer": self.optimizer.state_dict(),
            "state": {**self.state, "train_seconds": train_seconds},
            "best_dev_loss": self.best_dev_loss,
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None,
        }
        path = self.args.out / RESUME_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(snapshot, path.with_name(RESUME_FILE + ".tmp"))
        path.with_name(RESUME_FILE + ".tmp").replace(path)

    def resume(self) -> float:
        """Loads `OUT/resume.pt`; the seconds trained before. Refuses a snapshot of another run."""
        import torch

        snapshot = torch.load(self.args.out / RESUME_FILE, map_location=self.device, weights_only=False)
        saved = {k: v for k, v in snapshot["state"]["args"].items() if k not in RESUME_MAY_CHANGE}
        asked = {k: v for k, v in self.state["args"].items() if k not in RESUME_MAY_CHANGE}
        if saved != asked:
            changed = sorted(k for k in saved.keys() | asked.keys() if saved.get(k) != asked.get(k))
            raise SystemExit(f"{MODULE}: --resume with other settings than the snapshot's: {', '.join(changed)}")
        self.model.load_state_dict(snapshot["model"])
        with torch.no_grad():
            for kept, saved_average in zip(self.ema, snapshot["ema"], strict=True):
                kept.copy_(saved_average)
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.state = {**snapshot["state"], "args": self.state["args"]}
        self.best_dev_loss = snapshot["best_dev_loss"]
        torch.set_rng_state(snapshot["rng"].cpu())
        if snapshot["cuda_rng"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state_all(snapshot["cuda_rng"])
        return float(self.state.pop("train_seconds"))

    def finish(self, dev: Sequence[Example], train_seconds: float) -> None:
        """Writes OUT/last and OUT/ema, each with its dev loss."""
        args = self.args
        self.state["train_seconds"] = train_seconds
        self.state["dev_loss"] = dev_loss(self.model, dev, args.batch_tokens, self.device, self.autocast)
        save_checkpoint(self.model, self.config, self.state, args.out / "last")
        averaged = self.averaged()
        ema_loss = dev_loss(averaged, dev, args.batch_tokens, self.device, self.autocast)
        ema_state = {**self.state, "dev_loss": ema_loss, "ema": args.ema}
        save_checkpoint(averaged, self.config, ema_state, args.out / "ema", half=args.ema_half)
        print(json.dumps({"last": self.state, "ema": ema_state}), flush=True)


def train(args: argparse.Namespace) -> None:
    import torch
    from tokenizers import Tokenizer

    started = time.monotonic()
    torch.manual_seed(args.seed)
    config = json.loads(args.config.read_text())
    tokenizer = Tokenizer.from_file(str(args.tokenizer))
    pairs = read_pairs(args.pairs)
    examples = training_examples(
        pairs, tokenizer, args.oversample, args.joined_fraction, args.joined_max_verses, args.max_len, args.seed
    )
    # As nmt-train's --min/--max-source-len: a band of source lengths (EOS not counted), after
    # the joined examples are made; the dev loss keeps every dev pair unless --dev-in-band.
    low, high = args.min_source_len or 0, args.max_source_len or math.inf
    examples = [e for e in examples if low <= len(e.source) - 1 <= high]
    dev = dev_examples(tokenizer, args.dev, args.dev_limit, args.max_len)
    if args.dev_in_band:
        dev = [e for e in dev if low <= len(e.source) - 1 <= high]
    print(f"{len(examples)} training examples, {len(dev)} dev, ready in {time.monotonic() - started:.0f} s", flush=True)
    trainer = Trainer(args, config, len(examples))
    trained_before = 0.0
    if args.resume and (args.out / RESUME_FILE).exists():
        trained_before = trainer.resume()
        print(f"resumed at step {trainer.state['step']} after {trained_before:.0f} s of training", flush=True)
    # The batch order is a function of the seed alone: a resumed run skips the batches it has seen.
    batches = itertools.islice(endless_batches(examples, args.batch_tokens, args.seed), trainer.state["step"], None)
    train_started = time.monotonic() - trained_before
    last_save, last_log = time.monotonic(), time.monotonic()
    logged_tokens = trainer.state["target_tokens_seen"]
    for epoch, indices in batches:
        if time.monotonic() - started > args.minutes * 60 or 0 < args.max_steps <= trainer.state["step"]:
            break
        rows = [examples[i] for i in indices]
        loss, lr = trainer.step(rows, epoch)
        now = time.monotonic()
        if now - last_log > args.log_seconds:
            print(
                f"step {trainer.state['step']} epoch {epoch} loss {loss.item():.3f} lr {lr:.1e} "
                f"{(trainer.state['target_tokens_seen'] - logged_tokens) / (now - last_log):.0f} tgt tok/s, "
                f"{now - started:.0f} s",
                flush=True,
            )
            last_log, logged_tokens = now, trainer.state["target_tokens_seen"]
        if args.eval_steps and trainer.state["step"] % args.eval_steps == 0:
            loss = trainer.keep_best(dev, now - train_started)
            print(f"step {trainer.state['step']} dev nll (moving average) {loss:.4f}", flush=True)
        if now - last_save > args.save_minutes * 60:
            save_checkpoint(trainer.model, config, trainer.state, args.out / "last")
            if args.resume:
                trainer.save_resume(time.monotonic() - train_started)
            last_save = now
    if args.resume:
        trainer.save_resume(time.monotonic() - train_started)
    trainer.finish(dev, time.monotonic() - train_started)


def evaluate(args: argparse.Namespace) -> None:
    """The dev loss of a checkpoint: checks this model against `nmt-train`'s on the same weights."""
    import torch
    from tokenizers import Tokenizer

    config = json.loads((args.checkpoint / CONFIG_FILE).read_text())
    tokenizer = Tokenizer.from_file(str(args.tokenizer))
    model = build_model(config)
    load_weights(model, args.checkpoint / WEIGHTS_FILE)
    dev = dev_examples(tokenizer, args.dev, args.dev_limit, args.max_len)
    loss = dev_loss(model, dev, 3000, torch.device("cpu"), lambda: torch.autocast("cpu", enabled=False))
    print(f"dev nll {loss:.4f} over {len(dev)} pairs")


def split(args: argparse.Namespace) -> None:
    """A checkpoint's weights as several files of at most `--max-mib` each (a transfer that caps
    file sizes and counts), beside its trainer state; the config stays where training read it."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(args.checkpoint / WEIGHTS_FILE))
    limit, size = args.max_mib * 2**20, 0
    parts: list[dict[str, Any]] = []
    part: dict[str, Any] = {}
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if part and size + nbytes > limit:
            parts.append(part)
            part, size = {}, 0
        part[name], size = tensors[name], size + nbytes
    parts.append(part)
    args.out.mkdir(parents=True, exist_ok=True)
    for k, part in enumerate(parts):
        save_file(part, str(args.out / f"{args.prefix}weights-{k}.safetensors"))
    (args.out / f"{args.prefix}{STATE_FILE}").write_bytes((args.checkpoint / STATE_FILE).read_bytes())
    print(f"{args.checkpoint}: {len(parts)} parts -> {args.out}/{args.prefix}*")


def join(args: argparse.Namespace) -> None:
    """The inverse of `split`: one float32 nmt-train checkpoint from the parts. Through numpy, not
    torch, so that the machine that imports a lease's runs needs no torch (the parts are float16
    or float32; numpy has no bfloat16, which `split` never writes)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    tensors: dict[str, Any] = {}
    for part in sorted(args.parts.glob(f"{args.prefix}weights-*.safetensors")):
        tensors.update({k: v.astype(np.float32) for k, v in load_file(str(part)).items()})
    if not tensors:
        raise SystemExit(f"{MODULE}: no {args.prefix}weights-*.safetensors in {args.parts}")
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out / WEIGHTS_FILE))
    (args.out / STATE_FILE).write_bytes((args.parts / f"{args.prefix}{STATE_FILE}").read_bytes())
    (args.out / CONFIG_FILE).write_bytes(args.config.read_bytes())
    print(f"{len(tensors)} tensors -> {args.out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python3 -m {MODULE}", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("train", help="train for a wall-clock budget and write checkpoints")
    run.add_argument(
        "--pairs", type=Path, required=True, help="training pairs from `nmt-train pairs` (.jsonl or .jsonl.xz)"
    )
    run.add_argument(
        "--dev", type=Path, action="append", default=[], help="dev pairs from `nmt-train pairs` (repeatable)"
    )
    run.add_argument("--dev-limit", type=int, default=400, help="the first N pairs of each dev file")
    run.add_argument("--tokenizer", type=Path, required=True, help="the tokenizer.json the checkpoint uses")
    run.add_argument("--config", type=Path, required=True, help="a checkpoint's config.json (the model to build)")
    run.add_argument("--init-from", type=Path, help="start from these weights (model.safetensors, f32 or f16)")
    run.add_argument("--out", type=Path, required=True, help="writes OUT/last and OUT/ema (nmt-train checkpoints)")
    run.add_argument(
        "--minutes", type=float, default=8.0, help="wall-clock budget from the start, data preparation included"
    )
    run.add_argument("--max-steps", type=int, default=0, help="stop after this many updates (0: no limit)")
    run.add_argument("--save-minutes", type=float, default=2.0, help="write OUT/last this often")
    run.add_argument("--log-seconds", type=float, default=15.0, help="print a status line this often")
    run.add_argument("--batch-tokens", type=int, default=24000, help="rows x longest side per batch")
    run.add_argument("--lr", type=float, default=6e-4, help="peak learning rate, reached after warm-up")
    run.add_argument("--warmup-steps", type=int, default=500, help="linear warm-up before 1/sqrt(step)")
    run.add_argument("--label-smoothing", type=float, default=0.1, help="label smoothing of the loss")
    run.add_argument(
        "--oversample",
        type=parse_oversample,
        action="append",
        default=[],
        metavar="PREFIX=TIMES",
        help="pairs whose origin starts with PREFIX appear TIMES times",
    )
    run.add_argument("--joined-fraction", type=float, default=0.0, help="this share of joined examples")
    run.add_argument("--joined-max-verses", type=int, default=4, help="the most pairs one joined example joins")
    run.add_argument("--max-len", type=int, default=256, help="drop examples longer than this on either side")
    run.add_argument("--min-source-len", type=int, help="train only on sources of at least N subwords")
    run.add_argument("--max-source-len", type=int, help="train only on sources of at most N subwords")
    run.add_argument("--ema", type=float, default=0.999, help="decay of the weights' moving average")
    run.add_argument(
        "--eval-steps",
        type=int,
        default=0,
        help="every N updates, the moving average's dev loss; the lowest yet is written to OUT/best (0: never)",
    )
    run.add_argument(
        "--dev-in-band",
        action="store_true",
        help="the dev loss (and so the best point) counts only dev pairs in the source-length band: "
        "choosing a checkpoint then looks at no length the run is not trained on",
    )
    run.add_argument("--ema-half", action="store_true", help="write OUT/ema in float16 (half the bytes)")
    run.add_argument(
        "--resume",
        action="store_true",
        help=f"go on from OUT/{RESUME_FILE} when it exists, and keep it up to date (every --save-minutes "
        "and at the end); refused when the snapshot was trained with other settings",
    )
    run.add_argument("--bf16", action="store_true", help="bfloat16 autocast (a GPU, or a CPU with AMX or AVX-512 BF16)")
    run.add_argument("--device", default="cuda", help="torch device")
    run.add_argument("--seed", type=int, default=1, help="seed of batches, dropout and joined examples")
    check = commands.add_parser("dev-loss", help="the dev loss of a checkpoint (compare with nmt-train's)")
    check.add_argument("--checkpoint", type=Path, required=True, help="an nmt-train checkpoint folder")
    check.add_argument("--tokenizer", type=Path, required=True, help="its tokenizer.json")
    check.add_argument("--dev", type=Path, action="append", required=True, help="dev pairs (repeatable)")
    check.add_argument("--dev-limit", type=int, default=400, help="the first N pairs of each dev file")
    check.add_argument("--max-len", type=int, default=256, help="drop pairs longer than this")
    cut = commands.add_parser("split", help="a checkpoint's weights as files of a bounded size")
    cut.add_argument("--checkpoint", type=Path, required=True, help="an nmt-train checkpoint folder")
    cut.add_argument("--out", type=Path, required=True, help="folder for PREFIXweights-K.safetensors and the rest")
    cut.add_argument("--prefix", default="", help="prefix of the written files' names")
    cut.add_argument("--max-mib", type=float, default=15.0, help="largest weights file")
    glue = commands.add_parser("join", help="one float32 checkpoint from the files of `split`")
    glue.add_argument("--parts", type=Path, required=True, help="folder holding the parts")
    glue.add_argument("--prefix", default="", help="the parts' prefix")
    glue.add_argument("--config", type=Path, required=True, help="the config.json training read")
    glue.add_argument("--out", type=Path, required=True, help="the checkpoint folder to write")
    args = parser.parse_args(argv)
    {"train": train, "dev-loss": evaluate, "split": split, "join": join}[args.command](args)


if __name__ == "__main__":
    main(sys.argv[1:])
