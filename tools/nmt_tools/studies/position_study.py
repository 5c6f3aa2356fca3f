"""Helpers of scripts/position-study.sh.

  terciles TOKENIZER SOURCE_FILE
      prints the two source-length terciles (subwords, no EOS) of SOURCE_FILE.
  report STUDY_DIR DOC --record DIR --cap N --terciles T1 T2 --steps N --models ... --thirds-models ...
      writes the study's Markdown from the nmt-eval reports and training reports.
  length-encodings STUDY_DIR DOC --record DIR --steps N --models ...
      writes Oka et al.'s table of length encodings.
  import-gpu --parts DIR --name RUN --config CONFIG --out RUN_DIR
      keeps a run trained on a GPU (scripts/gpu-train-jobs.sh) as the study keeps its own:
      its checkpoint in RUN_DIR/last and a training report in nmt-train's shape.

The pages' prose, the papers' numbers and the findings' wording are Markdown templates beside
the study's record (docs/experiments/position-study/*.template.md); this module computes the
figures and verdicts and fills them in. Only the standard library, but for `terciles`, which
tokenizes with the `tokenizers` package (the same library as the Rust tokenizer the trainer
and the server use; `pip install -e 'tools[tokenizers]'`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from nmt_tools.machine import cpu_model
from nmt_tools.paths import repo_root
from nmt_tools.provenance import short_commit
from nmt_tools.studies.template import Template

MODULE = "nmt_tools.studies.position_study"
SIGNIFICANCE = 0.05
# The pages' templates, beside the study's record, by subcommand.
TEMPLATES = Path("docs/experiments/position-study")
TEMPLATE_FILES = {
    "report": "position-study.template.md",
    "length-encodings": "length-encodings.template.md",
    # `report --beside`, as scripts/position-study.sh --full runs it
    "report-full": "position-study-full.template.md",
}

SIZES = {
    "small": "d_model 128, 4 heads, FFN 512, the variant's own depth",
    "tiny": "d_model 32, 2 heads, FFN 64, 2+2 layers: a pipeline check, not a result",
    "full": "d_model 256, 4 heads, FFN 1024, the variant's own depth: the shipped models' size",
}

NAMES = {
    "transformer": "Transformer (sinusoidal)",
    "transformer-learned": "Transformer (learned absolute)",
    "rel-transformer": "Rel-Transformer (Shaw, k=16)",
    "rnn-transformer": "RNN-Transformer (GRU positions)",
    "rr-transformer": "RR-Transformer (GRU + Shaw)",
    "lstm-pe": "LSTM positions",
    "rpe-head": "RPEHead (Chen et al.)",
    "mpr-head": "MPRHead (Chen et al.)",
    "rnn-nmt": "RNN-NMT (LSTM)",
}

Json = dict[str, Any]


def load(path: str | Path) -> Json:
    loaded: Json = json.loads(Path(path).read_text(encoding="utf-8"))
    return loaded


def name(model: str) -> str:
    return NAMES.get(model, model)


class Eval:
    """One nmt-eval report: systems by label, per-bucket rows, concat rows, paired tests."""

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self.data = load(os.path.join(path, "report.json"))
        self.systems: dict[str, Json] = {s["label"]: s for s in self.data["systems"]}
        paired = self.data.get("paired_bootstrap") or {}
        self.baseline = paired.get("baseline")
        self.paired_bucket = {(p["system"], p["bucket"]): p for p in paired.get("by_bucket", [])}
        self.paired_concat = {(p["system"], p["n_verses"]): p for p in paired.get("by_n_verses", [])}
        self.paired_overall = {p["label"]: p for p in paired.get("systems", [])}

    @classmethod
    def at(cls, path: str | Path) -> Eval | None:
        """The report in `path`, or None while that evaluation has not run."""
        return cls(path) if os.path.exists(os.path.join(path, "report.json")) else None

    def buckets(self) -> list[str]:
        first = next(iter(self.systems.values()))
        return [b["bucket"] for b in first["by_source_length"]]

    def row(self, run: str, bucket: str | None = None) -> Json | None:
        """`run`'s figures over all sentences or in one source-length bucket; None for a run
        not (yet) in this evaluation: the study fills in over sessions."""
        if run not in self.systems:
            return None
        s = self.systems[run]
        if bucket is None:
            overall: Json = s["overall"]
            return overall
        return next((b for b in s["by_source_length"] if b["bucket"] == bucket), None)

    def bleu(self, run: str, bucket: str | None = None) -> float | None:
        row = self.row(run, bucket)
        return None if row is None else float(row["bleu"]["score"])

    def sentences(self, bucket: str) -> int:
        first = next(iter(self.systems.values()))
        return next((int(b["sentences"]) for b in first["by_source_length"] if b["bucket"] == bucket), 0)

    def concat(self, run: str, n: int) -> Json | None:
        if run not in self.systems:
            return None
        return next((c for c in self.systems[run]["concat"] if c["n_verses"] == n), None)

    def joined(self, run: str, n: int) -> float | None:
        """BLEU of `n` verses translated as one input."""
        c = self.concat(run, n)
        return None if c is None else float(c["concat"]["bleu"]["score"])

    # p-values against the baseline, or None when there is none or the scores are equal
    # (sacrebleu's p is then 1/(samples+1), which is no evidence of a difference).
    def p_bucket(self, run: str, bucket: str) -> float | None:
        p = self.paired_bucket.get((run, bucket))
        return None if p is None or p["bleu_delta"] == 0 else float(p["bleu_p"])

    def p_concat(self, run: str, n: int) -> float | None:
        p = self.paired_concat.get((run, n))
        return None if p is None or p["bleu_delta"] == 0 else float(p["bleu_p"])

    def p_overall(self, run: str) -> float | None:
        p = self.paired_overall.get(run)
        if p is None or p["bleu"]["delta"] == 0:
            return None
        value = p["bleu"].get("p_value")
        return None if value is None else float(value)


def fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def mark(value: float | None, p: float | None) -> str:
    """A score with a dagger when its paired test against the baseline has p < 0.05."""
    if value is None:
        return "–"
    return f"{value:.2f}" + (" †" if p is not None and p < SIGNIFICANCE else "")


def drop(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def significant(p: float | None) -> bool:
    return p is not None and p < SIGNIFICANCE


def verdict(t: Template, delta: float | None, p: float | None) -> str:
    """held / not held / inconclusive, from a difference the claim says is positive and its
    bootstrap p-value."""
    if delta is None:
        return t.text("verdict-unmeasured")
    agrees = delta > 0
    if significant(p):
        return t.text("verdict-held" if agrees else "verdict-reversed")
    return t.text("verdict-inconclusive" if agrees else "verdict-not-held")


def equal(t: Template, delta: float | None, p: float | None) -> str:
    """The verdict on a claim that two models are equal: held unless the paired test finds a
    difference."""
    if delta is None:
        return t.text("verdict-unmeasured")
    return t.text("verdict-unequal" if significant(p) else "verdict-equal")


def tested(t: Template, block: str, delta: float | None, p: float | None, **values: object) -> str:
    """A finding that one difference and its paired-bootstrap p-value decide."""
    return t.text(block, delta=fmt(delta), p=fmt(p, 3), verdict=verdict(t, delta, p), **values)


def seen_tokens(t: Template, record: str) -> str:
    """How much data the budget is, from the Transformer's run on all pairs."""
    path = os.path.join(record, "runs", "transformer.all", "report.json")
    if not os.path.exists(path):
        return t.text("seen-tokens-unknown")
    st = load(path)["state"]
    return t.text(
        "seen-tokens",
        tokens=f"{st['target_tokens_seen'] / 1e6:.1f}M",
        epoch=st["epoch"] + 1,
        pairs=f"{st['train_pairs']:,}",
    )


def training_rows(record: str, runs: list[str]) -> list[str]:
    """The training-cost rows, then the notes kept beside a run's record (`note.md`: what its
    clock does not show, such as a pause), each marked on its row."""
    rows, notes = [], []
    for run in runs:
        try:
            r = load(os.path.join(record, "runs", run, "report.json"))
        except (OSError, ValueError):
            continue
        st = r["state"]
        marker = ""
        note_path = Path(record, "runs", run, "note.md")
        if note_path.exists():
            notes.append(f"{run}: {note_path.read_text(encoding='utf-8').strip()}")
            marker = f" ({len(notes)})"
        rows.append(
            f"| {run}{marker} | {r['parameters']:,} | {st['step']} | {st['train_pairs']:,} | "
            f"{st['train_seconds'] / 60:.1f} | {r['target_tokens_per_second']:.0f} | "
            f"{fmt(st.get('last_dev_loss'), 3)} |"
        )
    if notes:
        rows.append("")
        rows += [f"- ({i}) {note}" for i, note in enumerate(notes, 1)]
    return rows


def copy_plot(study: str, eval_name: str, doc: str, stem: str) -> str | None:
    """The evaluation's BLEU-by-length plot, copied into the folder named after the page (where
    its record is); its path from the page."""
    src = os.path.join(study, eval_name, "bleu_by_length.png")
    if not os.path.exists(src):
        return None
    folder = os.path.splitext(doc)[0]
    os.makedirs(folder, exist_ok=True)
    dst = os.path.join(folder, f"{stem}.png")
    shutil.copyfile(src, dst)
    return os.path.relpath(dst, os.path.dirname(doc))


def concat_cells(ev: Eval, run: str) -> list[str]:
    """Joined BLEU and its change against the same verses one by one, per group size."""
    cells = []
    for n in (2, 4, 8):
        c = ev.concat(run, n)
        if c is None:
            cells.append("–")
            continue
        joined, alone = c["concat"]["bleu"]["score"], c["one_by_one"]["bleu"]["score"]
        rel = f" ({100 * (joined - alone) / alone:+.0f}%)" if alone else ""
        cells.append(mark(joined, ev.p_concat(run, n)) + rel)
    return cells


def section_all(t: Template, ev: Eval, models: list[str]) -> list[str]:
    buckets = ev.buckets()
    lines = t.lines("all-intro") + [
        "",
        "| model | all | "
        + " | ".join(f"{b} ({ev.sentences(b)})" for b in buckets)
        + " | 2 verses | 4 verses | 8 verses | looping (8 verses) |",
        "| --- | ---: | " + " | ".join("---:" for _ in buckets) + " | ---: | ---: | ---: | ---: |",
    ]
    for m in models:
        run = f"{m}.all"
        if run not in ev.systems:
            continue
        cells = [mark(ev.bleu(run), ev.p_overall(run))]
        cells += [mark(ev.bleu(run, b), ev.p_bucket(run, b)) for b in buckets]
        cells += concat_cells(ev, run)
        c8 = ev.concat(run, 8)
        cells.append("–" if c8 is None else f"{100 * c8['concat']['looping_share']:.0f}%")
        lines.append(f"| {name(m)} | " + " | ".join(cells) + " |")
    return lines + [""]


def section_short(t: Template, ev: Eval, ev_all: Eval | None, models: list[str], cap: int) -> list[str]:
    buckets = ev.buckets()
    inside, beyond = buckets[0], buckets[1:]
    lines = t.lines("short-intro", cap=cap, inside=inside) + [
        "",
        "| model | "
        + " | ".join(f"{b} ({ev.sentences(b)})" for b in buckets)
        + " | change to "
        + beyond[-1]
        + " | trained on all, "
        + beyond[-1]
        + " | 2 verses | 4 verses | 8 verses |",
        "| --- | " + " | ".join("---:" for _ in buckets) + " | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in models:
        run = f"{m}.short"
        if run not in ev.systems:
            continue
        cells = [mark(ev.bleu(run, b), ev.p_bucket(run, b)) for b in buckets]
        cells.append(fmt(drop(ev.bleu(run, inside), ev.bleu(run, beyond[-1]))))
        on_all = ev_all.bleu(f"{m}.all", beyond[-1]) if ev_all and f"{m}.all" in ev_all.systems else None
        cells.append(fmt(on_all))
        cells += concat_cells(ev, run)
        lines.append(f"| {name(m)} | " + " | ".join(cells) + " |")
    return lines + [""]


def section_thirds(t: Template, study: str, thirds_models: list[str], t1: int, t2: int) -> list[str]:
    lines = t.lines("thirds-intro", t1=t1, t2=t2) + [""]
    header = None
    for m in thirds_models:
        ev = Eval.at(os.path.join(study, f"eval-thirds-{m}"))
        if ev is None:
            continue
        buckets = ev.buckets()
        if header is None:
            header = buckets
            tests = " | ".join(f"test {b} ({ev.sentences(b)})" for b in buckets)
            lines.append(f"| model | trained on | {tests} | all |")
            lines.append("| --- | --- | " + " | ".join("---:" for _ in buckets) + " | ---: |")
        trained_on = {
            f"{m}.third1": f"1-{t1}",
            f"{m}.third2": f"{t1 + 1}-{t2}",
            f"{m}.third3": f"{t2 + 1}+",
            f"{m}.all": "all",
        }
        for run, trained in trained_on.items():
            if run in ev.systems:
                cells = [fmt(ev.bleu(run, b)) for b in buckets] + [fmt(ev.bleu(run))]
                lines.append(f"| {name(m)} | {trained} | " + " | ".join(cells) + " |")
    return lines + [""]


# Where findings 1, 2, 3 and 6 compare a model trained on short sources with the Transformer:
# the first ("inside") or last source-length bucket, or that many verses joined. The model is
# the Rel-Transformer, or for finding 6 the one with GRU positions (`gru_model`).
SHORT_FINDINGS: dict[int, str | int] = {1: "last", 2: "inside", 3: 8, 6: "last"}


# Each finding's row label in the two-size table.
SIZES_FINDING_BLOCKS = {1: "sizes-finding-1", 2: "sizes-finding-2", 3: "sizes-finding-3", 6: "sizes-finding-6"}


def gru_model(ev: Eval) -> str:
    """Finding 6's model: the RNN-Transformer where it was trained, else the RR-Transformer
    (GRU positions under Shaw's relative attention: the full-size study trains only that one)."""
    return "rnn-transformer" if "rnn-transformer.short" in ev.systems else "rr-transformer"


def short_delta(ev: Eval, finding: int) -> tuple[float | None, float | None]:
    """Finding `finding`'s model minus the Transformer, both trained on short sources, and the
    paired bootstrap's p."""
    where = SHORT_FINDINGS[finding]
    model = gru_model(ev) if finding == 6 else "rel-transformer"
    run, base = f"{model}.short", "transformer.short"
    if isinstance(where, int):
        return drop(ev.joined(base, where), ev.joined(run, where)), ev.p_concat(run, where)
    buckets = ev.buckets()
    bucket = buckets[0] if where == "inside" else buckets[-1]
    return drop(ev.bleu(base, bucket), ev.bleu(run, bucket)), ev.p_bucket(run, bucket)


def findings_short(t: Template, ev: Eval, cap: int) -> list[str]:
    """The papers' claims about training on short sources only (numbered 1 to 6; 4 and 5 where
    their models were trained)."""
    b = ev.buckets()
    inside, last = b[0], b[-1]
    t_in, t_out = ev.bleu("transformer.short", inside), ev.bleu("transformer.short", last)
    r_in, r_out = ev.bleu("rel-transformer.short", inside), ev.bleu("rel-transformer.short", last)
    where = {"cap": cap, "inside": inside, "last": last}
    bleus = {"t_in": fmt(t_in), "t_out": fmt(t_out), "r_in": fmt(r_in), "r_out": fmt(r_out)}
    delta, p = short_delta(ev, 1)
    out = [tested(t, "finding-1", delta, p, **bleus, **where)]
    d_in, p_in = short_delta(ev, 2)
    out.append(t.text("finding-2", delta=fmt(d_in), p=fmt(p_in, 3), verdict=equal(t, d_in, p_in), **where))
    delta, p = short_delta(ev, 3)
    out.append(tested(t, "finding-3", delta, p, **where))
    if "transformer-learned.short" in ev.systems:
        # The learned model is the one tested against the sinusoidal baseline.
        learned = drop(ev.bleu("transformer-learned.short", last), t_out)
        out.append(tested(t, "finding-4", learned, ev.p_bucket("transformer-learned.short", last), **where))
    if "lstm-pe.short" in ev.systems:
        out.append(finding_lstm(t, ev, t_out, r_out, where))
    delta, p = short_delta(ev, 6)
    out.append(tested(t, "finding-6", delta, p, **where))
    return out


def section_sizes(t: Template, ev: Eval, small: Eval, models: list[str]) -> list[str]:
    """The models trained on short sources at both sizes, and each tested finding's verdict at
    each: did size change it?"""
    buckets = ev.buckets()
    lines = t.lines("sizes-intro") + [
        "",
        "| model | size | " + " | ".join(f"{b} ({ev.sentences(b)})" for b in buckets) + " | 8 verses |",
        "| --- | --- | " + " | ".join("---:" for _ in buckets) + " | ---: |",
    ]
    for m in models:
        run = f"{m}.short"
        for size, e in (("-small", small), ("full", ev)):
            if run in e.systems:
                cells = [mark(e.bleu(run, b), e.p_bucket(run, b)) for b in buckets]
                lines.append(f"| {name(m)} | {size} | " + " | ".join(cells) + f" | {concat_cells(e, run)[2]} |")
    lines += ["", "| finding | -small | full | verdict changed |", "| --- | --- | --- | --- |"]
    for finding in SHORT_FINDINGS:
        cells, verdicts = [], []
        for e in (small, ev):
            delta, p = short_delta(e, finding)
            # Finding 2 claims no difference; the others, a difference in the model's favour.
            said = equal(t, delta, p) if finding == 2 else verdict(t, delta, p)
            verdicts.append(said)
            cells.append(t.text("sizes-cell", delta=fmt(delta), p=fmt(p, 3), verdict=said))
        changed = t.text("sizes-same" if verdicts[0] == verdicts[1] else "sizes-changed")
        lines.append(f"| {t.text(SIZES_FINDING_BLOCKS[finding])} | {cells[0]} | {cells[1]} | {changed} |")
    return lines + [""]


def length_looping(row: Json | None) -> str:
    """A bucket's or a joined group's length ratio and looping share, as one cell."""
    if row is None:
        return "–"
    return f"{row['length_ratio']:.2f} / {100 * row['looping_share']:.0f}%"


def section_lengths(t: Template, ev: Eval, small: Eval, models: list[str]) -> list[str]:
    """Beyond the training lengths a model can fail by stopping early (length ratio well
    under 1) or by repeating itself (looping): both, per bucket and per joined group, at both
    sizes."""
    buckets = ev.buckets()
    lines = t.lines("lengths-intro") + [
        "",
        "| model | size | " + " | ".join(buckets) + " | 2 verses | 4 verses | 8 verses |",
        "| --- | --- | " + " | ".join("---:" for _ in buckets) + " | ---: | ---: | ---: |",
    ]
    for m in models:
        run = f"{m}.short"
        for size, e in (("-small", small), ("full", ev)):
            if run not in e.systems:
                continue
            cells = [length_looping(e.row(run, b)) for b in buckets]
            cells += [length_looping((e.concat(run, n) or {}).get("concat")) for n in (2, 4, 8)]
            lines.append(f"| {name(m)} | {size} | " + " | ".join(cells) + " |")
    return lines + [""]


def finding_lstm(t: Template, ev: Eval, t_out: float | None, r_out: float | None, where: dict[str, object]) -> str:
    """Finding 5: LSTM positions between absolute and relative."""
    last = str(where["last"])
    lstm = ev.bleu("lstm-pe.short", last)
    above = drop(t_out, lstm)
    p_above = ev.p_bucket("lstm-pe.short", last)
    if above is None or r_out is None or lstm is None:
        held = t.text("verdict-unmeasured")
    else:
        relative = (
            t.text("verdict-between-below")
            if lstm < r_out
            else t.text("verdict-between-above", margin=f"{lstm - r_out:.2f}")
        )
        held = t.text("verdict-between", above=verdict(t, above, p_above), relative=relative)
    return t.text(
        "finding-5",
        t_out=fmt(t_out),
        lstm=fmt(lstm),
        r_out=fmt(r_out),
        delta=fmt(above),
        p=fmt(p_above, 3),
        verdict=held,
        **where,
    )


def findings_all(t: Template, ev_all: Eval) -> list[str]:
    """The papers' claims about models trained on every pair (numbered 7 to 9)."""
    order = ["rnn-nmt", "transformer", "rel-transformer", "rnn-transformer", "rr-transformer", "rpe-head"]
    scores = {m: ev_all.bleu(f"{m}.all") for m in order if f"{m}.all" in ev_all.systems}
    variants = ("rel-transformer", "rnn-transformer", "rr-transformer")
    measured = [m for m in variants if m in scores]
    baseline = scores.get("transformer") or 0
    beats = [m for m in measured if significant(ev_all.p_overall(f"{m}.all")) and (scores[m] or 0) > baseline]
    contenders = [m for m in scores if m in variants or m == "transformer"]
    best = max(contenders, key=lambda m: scores[m] or 0, default=None)
    if len(measured) < len(variants) or "transformer" not in scores:
        held = t.text("verdict-unmeasured")
    elif len(beats) == len(variants) and best == "rr-transformer":
        held = t.text("verdict-held")
    else:
        held = t.text("verdict-partly-significant", above=len(beats), variants=len(variants), best=name(best or "none"))
    return [
        t.text(
            "finding-7",
            scores=", ".join(f"{name(m)} {fmt(v)}" for m, v in scores.items()),
            above=", ".join(name(m) for m in beats) or "none",
            verdict=held,
        ),
        tested(
            t,
            "finding-8",
            drop(scores.get("transformer"), scores.get("rpe-head")),
            ev_all.p_overall("rpe-head.all"),
        ),
        tested(
            t,
            "finding-9",
            drop(scores.get("rnn-nmt"), scores.get("transformer")),
            ev_all.p_overall("rnn-nmt.all"),
        ),
    ]


def thirds_cells(evals: dict[int, Eval]) -> list[tuple[str, str, float | None, float | None]]:
    """(trained on, tested on, Rel minus Transformer, p) of every test bucket beyond the third
    each pair of models was trained on."""
    cells = []
    for k, ev in evals.items():
        tr, rel = f"transformer.third{k}", f"rel-transformer.third{k}"
        if tr not in ev.systems or rel not in ev.systems:
            continue
        buckets = ev.buckets()
        for b in buckets[k:]:
            cells.append((buckets[k - 1], b, drop(ev.bleu(tr, b), ev.bleu(rel, b)), ev.p_bucket(rel, b)))
    return cells


def thirds_verdict(t: Template, cells: list[tuple[str, str, float | None, float | None]]) -> str:
    significant_deltas = [d for _, _, d, p in cells if d is not None and significant(p)]
    above = sum(1 for d in significant_deltas if d > 0)
    below = sum(1 for d in significant_deltas if d < 0)
    counts = t.text("verdict-cells-counts", above=above, cells=len(cells), below=below, rest=len(cells) - above - below)
    if above == len(cells):
        return t.text("verdict-held")
    if above == 0 and below == 0:
        same = sum(1 for _, _, d, _ in cells if d is not None and d > 0)
        return t.text("verdict-cells-inconclusive", above=same, cells=len(cells))
    if above == 0:
        return t.text("verdict-cells-not-held", counts=counts)
    return t.text("verdict-cells-partly", counts=counts)


def findings_thirds(t: Template, study: str) -> list[str]:
    """Neishi & Yoshinaga's section 5.3 on our thirds (numbered 10 and 11): per third, the
    Transformer against the Rel-Transformer trained on the same third."""
    evals = {k: ev for k in (1, 2, 3) if (ev := Eval.at(os.path.join(study, f"eval-third{k}"))) is not None}
    cells = thirds_cells(evals)
    if not cells:
        longer, measured = t.text("verdict-unmeasured"), "–"
    else:
        listed = [t.text("finding-10-cell", trained=a, tested=b, delta=fmt(d), p=fmt(p, 3)) for a, b, d, p in cells]
        longer, measured = thirds_verdict(t, cells), "; ".join(listed)
    out = [t.text("finding-10", cells=measured, verdict=longer)]
    ev = evals.get(3)
    if ev is None or "transformer.third3" not in ev.systems or "rel-transformer.third3" not in ev.systems:
        out.append(t.text("finding-11-unmeasured", verdict=t.text("verdict-unmeasured")))
        return out
    shortest = ev.buckets()[0]
    ratios = [(ev.row(run, shortest) or {})["length_ratio"] for run in ("transformer.third3", "rel-transformer.third3")]
    tr, rel = ratios
    held = t.text("verdict-held" if tr > 1.0 and tr > rel else "verdict-ratio-not-held")
    out.append(t.text("finding-11", shortest=shortest, transformer=f"{tr:.3f}", rel=f"{rel:.3f}", verdict=held))
    return out


def findings(t: Template, ev_all: Eval | None, ev_short: Eval | None, study: str, cap: int) -> list[str]:
    """Each of the papers' claims, tested on our numbers."""
    out = t.lines("findings-intro") + [""]
    if ev_short:
        out += findings_short(t, ev_short, cap)
    if ev_all:
        out += findings_all(t, ev_all)
    out += findings_thirds(t, study)
    return out + [""]


def report(args: argparse.Namespace) -> None:
    """Writes the study's page."""
    study, doc = args.dir, args.doc
    t = Template.load(args.template or repo_root() / TEMPLATES / TEMPLATE_FILES["report"])
    if args.template_over:
        t = t.overridden_by(Template.load(args.template_over))
    t1, t2 = args.terciles
    ev_all = Eval.at(os.path.join(study, "eval-all"))
    ev_short = Eval.at(os.path.join(study, "eval-short"))
    runs = [f"{m}.{c}" for m in args.models for c in ("all", "short")]
    runs += [f"{m}.third{i}" for m in args.thirds_models for i in (1, 2, 3)]
    # The runs this page's record holds (the full-size tier trains a few of them).
    runs = [r for r in runs if os.path.exists(os.path.join(args.record, "runs", r, "report.json"))]
    lines = t.lines(
        "intro",
        commit=short_commit(),
        cpu=cpu_model(),
        size=args.size,
        size_description=SIZES[args.size],
        steps=args.steps,
        seen_tokens=seen_tokens(t, args.record),
        runs=len(runs),
        cap=args.cap,
    ) + [""]
    if ev_all:
        lines += section_all(t, ev_all, args.models)
        rel = copy_plot(study, "eval-all", doc, "bleu-by-length-all")
        if rel:
            lines += t.lines("all-plot", path=rel) + [""]
    if ev_short:
        lines += section_short(t, ev_short, ev_all, args.models, args.cap)
        rel = copy_plot(study, "eval-short", doc, "bleu-by-length-short")
        if rel:
            lines += t.lines("short-plot", path=rel, cap=args.cap) + [""]
    if ev_short and args.beside and (small := Eval.at(args.beside)) is not None:
        lines += section_sizes(t, ev_short, small, args.models)
        rel = copy_plot(study, "eval-short-sizes", doc, "bleu-by-length-sizes")
        if rel:
            lines += t.lines("sizes-plot", path=rel, cap=args.cap) + [""]
        lines += section_lengths(t, ev_short, small, args.models)
    lines += section_thirds(t, study, args.thirds_models, t1, t2)
    lines += findings(t, ev_all, ev_short, study, args.cap)
    lines += t.lines("training-intro") + [
        "",
        "| run | parameters | steps | training pairs | minutes | target tokens/s | dev loss |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += training_rows(args.record, runs)
    lines += [""] + t.lines("training-outro", study=study) + [""]
    os.makedirs(os.path.dirname(doc) or ".", exist_ok=True)
    Path(doc).write_text("\n".join(lines), encoding="utf-8")


def length_cells(system: Json | None, control: bool = False) -> list[str]:
    """BLEU, LR and VAR of a system, with the shares within ±1 and ±2 and ending in
    punctuation when the length was given (`control`)."""
    if system is None:
        return ["–"] * (6 if control else 3)
    o = system["overall"]
    out = [f"{o['bleu']['score']:.2f}", f"{o['length_ratio']:.3f}", f"{o['subword_diff_variance']:.1f}"]
    if control:
        lc = o.get("length_control") or {}
        out += [
            f"{100 * lc['within_1_share']:.1f}%" if lc else "–",
            f"{100 * lc['within_2_share']:.1f}%" if lc else "–",
            f"{100 * o['ends_in_punctuation_share']:.1f}%",
        ]
    return out


def span(values: list[float], digits: int) -> str:
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def noise_families(runs: list[str]) -> dict[str, list[str]]:
    """The runs by encoding (ldpe, lrpe), in noise order."""
    families: dict[str, list[str]] = {}
    for r in runs:
        families.setdefault(r.split("-")[0].split(".")[0], []).append(r)
    return families


def length_findings(
    t: Template, models: list[str], free: Json | None, by_src: dict[str, dict[str, Json]], bootstrap: Json | None
) -> list[str]:
    """What the table shows, computed from it: the claims a reader checks first."""
    runs = [f"{m}.all" for m in models if f"{m}.all" in by_src["reference"]]
    if not runs or free is None:
        return []

    def overall(src: str, run: str) -> Json:
        found: Json = by_src[src][run]["overall"]
        return found

    def variances(src: str, members: list[str]) -> str:
        return " → ".join(f"{overall(src, r)['subword_diff_variance']:.1f}" for r in members)

    families = noise_families(runs)
    fit = [
        t.text(
            "noise-fit-family",
            family=family.upper(),
            variances=variances("reference", members),
            within=" → ".join(
                f"{100 * overall('reference', r)['length_control']['within_1_share']:.0f}%" for r in members
            ),
        )
        for family, members in families.items()
    ]
    origins = [
        t.text(
            "noise-estimate-origin",
            origin=origin,
            families="; ".join(family.upper() + " " + variances(src, members) for family, members in families.items()),
        )
        for src, origin in (("auto", "predicted"), ("source", "source"))
    ]
    lines = [""] + t.lines("shows-intro") + [""]
    lines.append(
        t.text(
            "against-free",
            auto_bleu=span([overall("auto", r)["bleu"]["score"] for r in runs], 2),
            free_bleu=f"{free['overall']['bleu']['score']:.2f}",
            auto_var=span([overall("auto", r)["subword_diff_variance"] for r in runs], 1),
            free_var=f"{free['overall']['subword_diff_variance']:.1f}",
            free_lr=f"{free['overall']['length_ratio']:.3f}",
        )
    )
    lines.append(t.text("noise-fit", families="; ".join(fit)))
    lines.append(t.text("noise-estimate", origins="; ".join(origins)))
    # No paired test while only one length-aware model is recorded.
    if bootstrap is not None:
        deltas = ", ".join(
            f"{s['label'].removesuffix('.all')} {s['bleu']['delta']:+.2f} (p = {s['bleu']['p_value']:.3f})"
            for s in bootstrap["systems"]
            if s["bleu"]["p_value"] is not None
        )
        lines.append(t.text("bleu-predicted", baseline=bootstrap["baseline"].removesuffix(".all"), deltas=deltas))
    punct = [100 * overall("reference", r)["ends_in_punctuation_share"] for r in runs]
    lines.append(t.text("punctuation", share=span(punct, 1)))
    return lines


def length_encodings(args: argparse.Namespace) -> None:
    """Oka et al.'s table: BLEU, LR and VAR with the length from the predictor, the source
    and the reference, for the Transformer and each LDPE/LRPE decoder."""
    study, doc = args.dir, args.doc
    t = Template.load(args.template or repo_root() / TEMPLATES / TEMPLATE_FILES["length-encodings"])
    ev_all = os.path.join(study, "eval-all", "report.json")
    evals = {src: os.path.join(study, f"eval-length-{src}", "report.json") for src in ("auto", "source", "reference")}
    if not all(os.path.exists(p) for p in [ev_all, *evals.values()]):
        print(f"position_study: {doc} not written: evaluations missing", file=sys.stderr)
        return
    base = {s["label"]: s for s in load(ev_all)["systems"]}
    reports = {src: load(p) for src, p in evals.items()}
    by_src = {src: {s["label"]: s for s in r["systems"]} for src, r in reports.items()}
    lines = t.lines(
        "intro",
        commit=short_commit(),
        cpu=cpu_model(),
        size=args.size,
        size_description=SIZES[args.size],
        steps=args.steps,
    ) + [
        "",
        "| model | predictor: BLEU | LR | VAR | source: BLEU | LR | VAR | reference: BLEU | LR | VAR | ±1 | ±2 "
        "| punct. |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {t.text('free-row')} | "
        + " | ".join(length_cells(base.get("transformer.all")))
        + " | – | – | – | – | – | – | – | – | – |",
    ]
    for m in args.models:
        run = f"{m}.all"
        row = length_cells(by_src["auto"].get(run)) + length_cells(by_src["source"].get(run))
        row += length_cells(by_src["reference"].get(run), control=True)
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    free = base.get("transformer.all")
    lines += length_findings(t, args.models, free, by_src, reports["auto"]["paired_bootstrap"])
    lines += [""] + t.lines("outro", study=study) + [""]
    Path(doc).write_text("\n".join(lines), encoding="utf-8")


def import_gpu(args: argparse.Namespace) -> None:
    """A run of `scripts/gpu-train-jobs.sh` (moving-average weights in parts, its trainer
    state) as the study's record keeps a run: RUN_DIR/last and RUN_DIR/report.json."""
    from safetensors import safe_open

    from nmt_tools.training import torch_train

    prefix = f"{args.name}.{args.kind}-"
    last = args.out / "last"
    torch_train.join(argparse.Namespace(parts=args.parts, prefix=prefix, config=args.config, out=last))
    state = load(args.parts / f"{prefix}{torch_train.STATE_FILE}")
    # A best point's state is the state at that point; how far the run went (its budget) is in
    # the last moving average's state, which scripts/gpu-train.sh brings back beside it.
    final_file = args.parts / f"{args.name}.final-{torch_train.STATE_FILE}"
    final = load(final_file) if args.kind == "best" and final_file.exists() else state
    with safe_open(str(last / torch_train.WEIGHTS_FILE), framework="np") as weights:
        parameters = sum(math.prod(weights.get_slice(k).get_shape()) for k in weights.keys())  # noqa: SIM118
    seconds = float(final["train_seconds"])
    report = {
        "state": {
            "step": final["step"],
            "weights_step": state["step"],
            "epoch": final["epoch"],
            "train_pairs": state["train_pairs"],
            "target_tokens_seen": final["target_tokens_seen"],
            "source_tokens_seen": final["source_tokens_seen"],
            "train_seconds": seconds,
            "last_dev_loss": state["dev_loss"],
            "seed": state["seed"],
            "trainer": state["trainer"],
            "weights": f"moving average, decay {state['ema']}"
            + (", at its lowest dev loss" if args.kind == "best" else ""),
            "args": state["args"],
        },
        "target_tokens_per_second": final["target_tokens_seen"] / seconds,
        "source_tokens_per_second": final["source_tokens_seen"] / seconds,
        "parameters": parameters,
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"{args.name}: step {state['step']}, {parameters:,} parameters -> {args.out}")


def terciles(args: argparse.Namespace) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(args.tokenizer)
    lines = Path(args.source).read_text(encoding="utf-8").splitlines()
    lengths = sorted(len(tokenizer.encode(line, add_special_tokens=False).ids) for line in lines)
    n = len(lengths)
    print(lengths[n // 3], lengths[2 * n // 3])


def relabel(args: argparse.Namespace) -> None:
    """A saved decoding (nmt-eval's decoded.json) under another name: nmt-eval names each
    curve and hypotheses folder after its package, and the same run at two sizes shares one."""
    saved = load(args.decoded)
    saved["decoded"]["info"]["name"] = args.name
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(saved), encoding="utf-8")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("terciles", help="source-length terciles of a file")
    t.add_argument("tokenizer")
    t.add_argument("source")
    r = sub.add_parser("relabel", help="a saved decoding (decoded.json) under another package name")
    r.add_argument("decoded", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("name")
    g = sub.add_parser("import-gpu", help="keep a run trained on a GPU as the study keeps its own")
    g.add_argument("--parts", type=Path, required=True, help="the folder scripts/gpu-train-jobs.sh filled")
    g.add_argument("--name", required=True, help="the run's name there (its files' prefix)")
    g.add_argument("--config", type=Path, required=True, help="the config.json it was trained from")
    g.add_argument("--out", type=Path, required=True, help="the study's folder for the run")
    g.add_argument(
        "--kind",
        default="ema",
        choices=["ema", "best"],
        help="which weights: the last moving average, or its best point",
    )
    for command, help_text in (
        ("report", "write the study's Markdown"),
        ("length-encodings", "write Oka et al.'s table of length encodings"),
    ):
        s = sub.add_parser(command, help=help_text)
        s.add_argument("dir", help="the study's folder (runs, packages, evaluations)")
        s.add_argument("doc", help="the page to write")
        s.add_argument("--record", required=True, help="folder of the finished models' training reports")
        s.add_argument("--steps", type=int, required=True, help="optimizer steps of every model")
        s.add_argument("--size", choices=sorted(SIZES), default="small", help="the presets' size twin")
        s.add_argument("--models", nargs="+", required=True, help="the presets of the page's main table")
        s.add_argument(
            "--template", type=Path, help=f"the page's template (default: {TEMPLATES / TEMPLATE_FILES[command]})"
        )
        if command == "report":
            s.add_argument("--cap", type=int, required=True, help="longest source (subwords) of the short-only runs")
            s.add_argument(
                "--terciles", type=int, nargs=2, required=True, help="source-length terciles (`terciles` prints them)"
            )
            s.add_argument("--thirds-models", nargs="+", required=True, help="the presets trained on each third")
            s.add_argument("--beside", help="an evaluation of the same runs at another size (its folder), shown beside")
            s.add_argument(
                "--template-over",
                type=Path,
                help="blocks that replace the template's of the same name (a second budget's intro)",
            )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "terciles":
        terciles(args)
    elif args.command == "import-gpu":
        import_gpu(args)
    elif args.command == "relabel":
        relabel(args)
    elif args.command == "length-encodings":
        length_encodings(args)
    else:
        report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
