#!/usr/bin/env python3
"""Helpers of scripts/position-study.sh.

  position_study.py terciles TOKENIZER SOURCE_FILE
      prints the two source-length terciles (subwords, no EOS) of SOURCE_FILE.
  position_study.py report STUDY_DIR DOC --cap N --terciles T1 T2 --steps N --models ...
      writes the study's Markdown from the nmt-eval reports and training reports.

Only the standard library, but for `terciles`, which tokenizes with the `tokenizers`
package (the same library as the Rust tokenizer the trainer and the server use).
"""

import argparse
import json
import os
import shutil
import sys


def report(args):
    study, doc = args.dir, args.doc
    t1, t2 = args.terciles
    path = lambda name: os.path.join(study, name)
    ev_all = Eval(path("eval-all")) if os.path.exists(path("eval-all/report.json")) else None
    ev_short = Eval(path("eval-short")) if os.path.exists(path("eval-short/report.json")) else None
    runs = [f"{m}.{c}" for m in args.models for c in ("all", "short")]
    runs += [f"{m}.third{i}" for m in args.thirds_models for i in (1, 2, 3)]
    lines = [
        "# Positions beyond the training lengths: the papers' findings on our corpus",
        "",
        f"Written by `scripts/position-study.sh` (commit {commit()}, {cpu_model()}). Every model: "
        f"the `-{args.size}` twin of its preset ({SIZES[args.size]}; `docs/model-package.md`), "
        f"trained for the same {args.steps} optimizer steps of at most 3,000 padded tokens "
        f"(learning rate 1e-3, 400 warm-up steps, one core each, two at a time; "
        f"{seen_tokens(args.record)}), then exported and evaluated through the server's engine by "
        f"`nmt-eval` (greedy, sacrebleu 13a, inputs beyond a model's input limit decoded "
        f"rather than refused). Size and budget are what this 2-core CPU affords for "
        f"{len(runs)} models: the papers train d_model 512 models for 200k-300k steps on "
        f"millions of pairs, so our absolute BLEU is lower and the comparison is between our "
        f"models, not with the papers' scores.",
        "",
        f"(a) trains on every training pair (sources up to 107 subwords; the test books reach "
        f"the 65+ bucket); (b) only on pairs whose source has at most {args.cap} subwords, as "
        f"Rosendahl et al. cap at 75 a test set that reaches beyond 100. The long-input set "
        f"joins 2, 4 and 8 consecutive test verses (about 75, 150 and 300 subwords).",
        "",
    ]
    if ev_all:
        section_all(ev_all, args.models, lines)
        rel = copy_plot(study, "eval-all", doc, "bleu-by-length-all")
        if rel:
            lines += [f"![BLEU by source length, trained on all pairs]({rel})", ""]
    if ev_short:
        section_short(ev_short, ev_all, args.models, args.cap, lines)
        rel = copy_plot(study, "eval-short", doc, "bleu-by-length-short")
        if rel:
            lines += [f"![BLEU by source length, trained on sources of at most {args.cap} subwords]({rel})", ""]
    section_thirds(study, args.thirds_models, t1, t2, lines)
    findings(ev_all, ev_short, study, args.cap, lines)
    lines += [
        "## Training cost",
        "",
        "| run | parameters | steps | training pairs | minutes | target tokens/s | dev loss |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += training_rows(args.record, runs)
    lines += [
        "",
        f"Minutes are each run's own training time on one core, with another run on the other "
        f"core. Reports: `{study}/eval-*/report.md` (per-bucket paired bootstrap tables, "
        f"chrF, looping and length figures).",
        "",
    ]
    os.makedirs(os.path.dirname(doc) or ".", exist_ok=True)
    with open(doc, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def length_encodings(args):
    """Oka et al.'s table: BLEU, LR and VAR with the length from the predictor, the source
    and the reference, for the Transformer and each LDPE/LRPE decoder."""
    study, doc = args.dir, args.doc
    ev_all = os.path.join(study, "eval-all", "report.json")
    evals = {
        src: os.path.join(study, f"eval-length-{src}", "report.json")
        for src in ("auto", "source", "reference")
    }
    if not all(os.path.exists(p) for p in [ev_all, *evals.values()]):
        print(f"position_study: {doc} not written: evaluations missing", file=sys.stderr)
        return
    base = {s["label"]: s for s in load(ev_all)["systems"]}
    reports = {src: load(p) for src, p in evals.items()}
    by_src = {src: {s["label"]: s for s in r["systems"]} for src, r in reports.items()}

    def cells(system, control=False):
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

    lines = [
        "# Length encodings: Oka et al.'s table on our corpus",
        "",
        f"Written by `scripts/position-study.sh` (commit {commit()}, {cpu_model()}), with the "
        f"models of `docs/experiments/position-study.md`: `-{args.size}` presets "
        f"({SIZES[args.size]}), {args.steps} steps each on all training pairs. The decoder's "
        "positions are replaced by LDPE (length-difference) or LRPE (length-ratio), trained "
        "with the reference length plus uniform noise in [-n, n]; the length then comes from "
        "the BERT length predictor (`auto`, the shipped package's predictor), the source "
        "length, or the reference (an oracle), in soft mode with the server's defaults. BLEU: "
        "sacrebleu 13a; LR: output/reference length (words); VAR: variance of output minus "
        "reference subwords (Oka et al.'s VAR). The Transformer decodes freely.",
        "",
        "| model | predictor: BLEU | LR | VAR | source: BLEU | LR | VAR | reference: BLEU | LR | VAR | ±1 | ±2 | punct. |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        "| Transformer (free decoding) | " + " | ".join(cells(base.get("transformer.all")))
        + " | – | – | – | – | – | – | – | – | – |",
    ]
    for m in args.models:
        run = f"{m}.all"
        row = cells(by_src["auto"].get(run)) + cells(by_src["source"].get(run))
        row += cells(by_src["reference"].get(run), control=True)
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    lines += length_findings(args.models, base.get("transformer.all"), by_src, reports["auto"]["paired_bootstrap"])
    lines += [
        "",
        "Oka et al. (ASPEC En-Ja, VAR (LR)): Transformer 29.51 (0.916); with the predicted "
        "length LDPE 19.91 (0.938), LRPE 21.71 (0.929), LDPE [-2,2] 20.11 (0.927), LDPE [-4,4] "
        "21.15 (0.921), LRPE [-2,2] 23.87 (0.911), LRPE [-4,4] 25.12 (0.911); with the source "
        "length 71.83, 59.65, 55.85, 48.25, 35.18, 28.06; with the reference 0, 1.497, 2.411, "
        "6.429, 7.502, 12.506. (Their poster prints the two encodings' names swapped against "
        "their formulas, so which formula each of their rows used is not recoverable; they are listed by name.)",
        "",
        f"Reports: `{study}/eval-length-*/report.md`.",
        "",
    ]
    with open(doc, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def length_findings(models, free, by_src, auto_bootstrap):
    """What the table shows, computed from it: the claims a reader checks first."""
    runs = [f"{m}.all" for m in models if f"{m}.all" in by_src["reference"]]
    if not runs or free is None:
        return []

    def overall(src, run):
        return by_src[src][run]["overall"]

    def span(values, digits):
        return f"{min(values):.{digits}f}-{max(values):.{digits}f}"

    auto_bleu = [overall("auto", r)["bleu"]["score"] for r in runs]
    auto_var = [overall("auto", r)["subword_diff_variance"] for r in runs]
    lines = [
        "",
        "## What it shows",
        "",
        f"- **Against free decoding.** With the predicted length every length-aware decoder scores "
        f"{span(auto_bleu, 2)} BLEU against the Transformer's {free['overall']['bleu']['score']:.2f}, and the "
        f"variance of its length error is {span(auto_var, 1)} against {free['overall']['subword_diff_variance']:.1f} "
        f"(the free Transformer overruns: LR {free['overall']['length_ratio']:.3f}).",
    ]
    families = {}
    for r in runs:
        families.setdefault(r.split("-")[0].split(".")[0], []).append(r)
    noise = []
    for family, members in families.items():
        var = " → ".join(f"{overall('reference', r)['subword_diff_variance']:.1f}" for r in members)
        within = " → ".join(f"{100 * overall('reference', r)['length_control']['within_1_share']:.0f}%" for r in members)
        noise.append(f"{family.upper()} {var} (within ±1: {within})")
    lines.append(
        "- **Noise loosens the fit to a given length.** VAR with the reference length, noise 0 → [-2, 2] → "
        f"[-4, 4]: {'; '.join(noise)}. Oka et al. see the same direction (by their names, LDPE 0 → 2.411 → "
        "6.429, LRPE 1.497 → 7.502 → 12.506)."
    )
    by_origin = []
    for src, name in (("auto", "predicted"), ("source", "source")):
        per_family = "; ".join(
            family.upper() + " " + " → ".join(f"{overall(src, r)['subword_diff_variance']:.1f}" for r in members)
            for family, members in families.items()
        )
        by_origin.append(f"with the {name} length {per_family}")
    lines.append(
        f"- **Noise and an estimated length.** VAR, noise 0 → [-2, 2] → [-4, 4], {'; '.join(by_origin)}. "
        "Oka et al.: with the predicted length LDPE 19.91 → 20.11 → 21.15, LRPE 21.71 → 23.87 → 25.12; with "
        "the source length LDPE 71.83 → 55.85 → 48.25, LRPE 59.65 → 35.18 → 28.06 (English to Japanese, where "
        "the source length is a poor guess and noise makes the decoder tolerate it; English and Spanish share "
        "this tokenizer and the source length is already close)."
    )
    pb = auto_bootstrap
    # No paired test while only one length-aware model is recorded.
    if pb is not None:
        deltas = ", ".join(
            f"{s['label'].removesuffix('.all')} {s['bleu']['delta']:+.2f} (p = {s['bleu']['p_value']:.3f})"
            for s in pb["systems"]
            if s["bleu"]["p_value"] is not None
        )
        lines.append(
            f"- **BLEU with the predicted length**, paired bootstrap against {pb['baseline'].removesuffix('.all')} "
            f"(no noise): {deltas}."
        )
    punct = [overall("reference", r)["ends_in_punctuation_share"] for r in runs]
    lines.append(
        f"- **Sentences end as sentences**: given the reference length, {span([100 * x for x in punct], 1)}% of "
        "outputs end in punctuation (the goal is at least 85%)."
    )
    return lines


def terciles(args):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(args.tokenizer)
    with open(args.source, encoding="utf-8") as f:
        lines = f.read().splitlines()
    lengths = sorted(len(tokenizer.encode(line, add_special_tokens=False).ids) for line in lines)
    n = len(lengths)
    print(lengths[n // 3], lengths[2 * n // 3])


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


SIGNIFICANCE = 0.05

# What the papers report, for the write-up's comparison (BLEU).
PAPERS = {
    "rosendahl_t2": "Rosendahl et al. (2019), Table 2, De-En, trained on sources of at most 75 "
    "subwords: absolute 31.2 (51-75) -> 25.9 (76-100) -> 15.3 (>100); relative 31.5 -> 29.6 -> 27.2",
    "rosendahl_t2_in": "Rosendahl et al. (2019), Table 2: absolute and relative within 0.4 BLEU in "
    "every bucket seen in training (31.7 vs 31.7, 32.0 vs 31.9, 31.2 vs 31.5 at cap 75)",
    "rosendahl_t3": "Rosendahl et al. (2019), Table 3 (consecutive sentences joined): at >100 "
    "subwords absolute 20.1 vs relative 24.5 (cap 100), 14.9 vs 24.2 (cap 75)",
    "rosendahl_lstm": "Rosendahl et al. (2019), Table 2, cap 100: at >100 subwords absolute 21.5, "
    "LSTM 25.5, relative 29.3",
    "neishi_t3": "Neishi & Yoshinaga (2019), Table 3, ASPEC / WMT14: RNN-NMT 36.67 / 19.95, "
    "Transformer 38.44 / 21.00, Rel 39.58 / 22.51, RNN-Transformer 39.17 / 22.35, RR 40.34 / 23.01",
    "neishi_53": "Neishi & Yoshinaga (2019), section 5.3 (figure only): the Transformer is the "
    "worst Transformer variant on sentences longer than its training third, for every third; "
    "Rel-Transformer is competitive everywhere",
    "neishi_fig7": "Neishi & Yoshinaga (2019), Fig. 7 (figure only): trained on the Long third, "
    "Transformer and RNN-Transformer output inappropriately long translations of much shorter "
    "sentences; Rel-Transformer does not",
    "chen_t1": "Chen et al. (2019), Table 1 (WMT14 En-De) and Table 2 (NIST Zh-En): RPEHead "
    "(base) above Transformer (base) on both (the scores are in the paper's tables)",
    "neishi_learned": "Neishi & Yoshinaga (2019), footnote 1: sinusoidal positions did better than "
    "learned ones beyond the training lengths",
}

SIZES = {
    "small": "d_model 128, 4 heads, FFN 512, the variant's own depth",
    "tiny": "d_model 32, 2 heads, FFN 64, 2+2 layers: a pipeline check, not a result",
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


class Eval:
    """One nmt-eval report: systems by label, per-bucket rows, concat rows, paired tests."""

    def __init__(self, path):
        self.path = path
        self.data = load(os.path.join(path, "report.json"))
        self.systems = {s["label"]: s for s in self.data["systems"]}
        paired = self.data.get("paired_bootstrap") or {}
        self.baseline = paired.get("baseline")
        self.paired_bucket = {(p["system"], p["bucket"]): p for p in paired.get("by_bucket", [])}
        self.paired_concat = {(p["system"], p["n_verses"]): p for p in paired.get("by_n_verses", [])}
        self.paired_overall = {p["label"]: p for p in paired.get("systems", [])}

    def buckets(self):
        first = next(iter(self.systems.values()))
        return [b["bucket"] for b in first["by_source_length"]]

    def row(self, run, bucket=None):
        """`run`'s figures over all sentences or in one source-length bucket; None for a run
        not (yet) in this evaluation: the study fills in over sessions."""
        if run not in self.systems:
            return None
        s = self.systems[run]
        if bucket is None:
            return s["overall"]
        return next((b for b in s["by_source_length"] if b["bucket"] == bucket), None)

    def bleu(self, run, bucket=None):
        row = self.row(run, bucket)
        return None if row is None else row["bleu"]["score"]

    def sentences(self, bucket):
        first = next(iter(self.systems.values()))
        for b in first["by_source_length"]:
            if b["bucket"] == bucket:
                return b["sentences"]
        return 0

    def concat(self, run, n):
        if run not in self.systems:
            return None
        for c in self.systems[run]["concat"]:
            if c["n_verses"] == n:
                return c
        return None

    # p-values against the baseline, or None when there is none or the scores are equal
    # (sacrebleu's p is then 1/(samples+1), which is no evidence of a difference).
    def joined(self, run, n):
        """BLEU of `n` verses translated as one input."""
        c = self.concat(run, n) if run in self.systems else None
        return None if c is None else c["concat"]["bleu"]["score"]

    def p_bucket(self, run, bucket):
        p = self.paired_bucket.get((run, bucket))
        return None if p is None or p["bleu_delta"] == 0 else p["bleu_p"]

    def p_concat(self, run, n):
        p = self.paired_concat.get((run, n))
        return None if p is None or p["bleu_delta"] == 0 else p["bleu_p"]

    def p_overall(self, run):
        p = self.paired_overall.get(run)
        if p is None or p["bleu"]["delta"] == 0:
            return None
        return p["bleu"].get("p_value")


def fmt(x, digits=2):
    return "–" if x is None else f"{x:.{digits}f}"


def mark(value, p):
    """A score with a dagger when its paired test against the baseline has p < 0.05."""
    if value is None:
        return "–"
    return f"{value:.2f}" + (" †" if p is not None and p < SIGNIFICANCE else "")


def drop(a, b):
    return None if a is None or b is None else b - a


def verdict(delta, p):
    """held / not held / inconclusive, from a difference the claim says is positive and its
    bootstrap p-value."""
    if delta is None:
        return "not measured yet (a model it needs is not recorded)"
    agrees = delta > 0
    if p is not None and p < SIGNIFICANCE:
        return "**held**" if agrees else "**did not hold** (significant in the other direction)"
    return "inconclusive (same direction, p ≥ 0.05)" if agrees else "**did not hold** (no significant difference)"


def seen_tokens(record):
    """How much data the budget is, from the Transformer's run on all pairs."""
    path = os.path.join(record, "runs", "transformer.all", "report.json")
    if not os.path.exists(path):
        return "budget not yet spent"
    st = load(path)["state"]
    return (
        f"{st['target_tokens_seen'] / 1e6:.1f}M target tokens, into epoch {st['epoch'] + 1} "
        f"of the {st['train_pairs']:,} training pairs"
    )


def training_rows(record, runs):
    """The training-cost rows, then the notes kept beside a run's record (`note.md`: what its
    clock does not show, such as a pause), each marked on its row."""
    rows, notes = [], []
    for run in runs:
        path = os.path.join(record, "runs", run, "report.json")
        try:
            r = load(path)
        except (OSError, ValueError):
            continue
        st = r["state"]
        mark = ""
        note_path = os.path.join(record, "runs", run, "note.md")
        if os.path.exists(note_path):
            with open(note_path, encoding="utf-8") as f:
                notes.append(f"{run}: {f.read().strip()}")
            mark = f" ({len(notes)})"
        rows.append(
            f"| {run}{mark} | {r['parameters']:,} | {st['step']} | {st['train_pairs']:,} | "
            f"{st['train_seconds'] / 60:.1f} | {r['target_tokens_per_second']:.0f} | "
            f"{fmt(st.get('last_dev_loss'), 3)} |"
        )
    if notes:
        rows.append("")
        rows += [f"- ({i}) {note}" for i, note in enumerate(notes, 1)]
    return rows


def copy_plot(study, eval_name, doc, stem):
    src = os.path.join(study, eval_name, "bleu_by_length.png")
    if not os.path.exists(src):
        return None
    folder = os.path.join(os.path.dirname(doc), "position-study")
    os.makedirs(folder, exist_ok=True)
    dst = os.path.join(folder, f"{stem}.png")
    shutil.copyfile(src, dst)
    return os.path.relpath(dst, os.path.dirname(doc))


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def commit():
    try:
        import subprocess

        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def concat_cells(ev, run):
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


def section_all(ev, models, lines):
    buckets = ev.buckets()
    lines += [
        "## (a) Trained on all pairs",
        "",
        "BLEU on the test books by source length (subwords), and on the long-input set: "
        "verses joined into one input, with the change against the same verses translated one "
        "by one and joined. † : different from the Transformer (sinusoidal) at p < 0.05 "
        "(sacrebleu paired bootstrap, per bucket / per group size).",
        "",
        "| model | all | " + " | ".join(f"{b} ({ev.sentences(b)})" for b in buckets)
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
        lines.append(f"| {NAMES.get(m, m)} | " + " | ".join(cells) + " |")
    lines.append("")


def section_short(ev, ev_all, models, cap, lines):
    buckets = ev.buckets()
    inside, beyond = buckets[0], buckets[1:]
    lines += [
        f"## (b) Trained on sources of at most {cap} subwords",
        "",
        f"`{inside}` is the range seen in training; the other buckets and every joined input lie "
        "beyond it. Change: BLEU beyond minus BLEU inside. Trained on all: the same model's "
        "BLEU in that bucket when trained on every pair. † as above.",
        "",
        "| model | " + " | ".join(f"{b} ({ev.sentences(b)})" for b in buckets)
        + " | change to " + beyond[-1] + " | trained on all, " + beyond[-1]
        + " | 2 verses | 4 verses | 8 verses |",
        "| --- | " + " | ".join("---:" for _ in buckets) + " | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in models:
        run = f"{m}.short"
        if run not in ev.systems:
            continue
        cells = [mark(ev.bleu(run, b), ev.p_bucket(run, b)) for b in buckets]
        cells.append(fmt(drop(ev.bleu(run, inside), ev.bleu(run, beyond[-1]))))
        cells.append(fmt(ev_all.bleu(f"{m}.all", beyond[-1]) if ev_all and f"{m}.all" in ev_all.systems else None))
        cells += concat_cells(ev, run)
        lines.append(f"| {NAMES.get(m, m)} | " + " | ".join(cells) + " |")
    lines.append("")


def section_thirds(study, thirds_models, t1, t2, lines):
    lines += [
        "## Neishi & Yoshinaga, section 5.3: trained on one third of the data by length",
        "",
        f"The training pairs split at the source-length terciles ({t1} and {t2} subwords); the "
        "test books split at the same lengths. BLEU; the diagonal is the range each model "
        "saw in training.",
        "",
    ]
    header = None
    for m in thirds_models:
        path = os.path.join(study, f"eval-thirds-{m}")
        if not os.path.exists(os.path.join(path, "report.json")):
            continue
        ev = Eval(path)
        buckets = ev.buckets()
        if header is None:
            header = buckets
            lines.append("| model | trained on | " + " | ".join(f"test {b} ({ev.sentences(b)})" for b in buckets) + " | all |")
            lines.append("| --- | --- | " + " | ".join("---:" for _ in buckets) + " | ---: |")
        names = {f"{m}.third1": f"1-{t1}", f"{m}.third2": f"{t1 + 1}-{t2}", f"{m}.third3": f"{t2 + 1}+", f"{m}.all": "all"}
        for run, trained in names.items():
            if run in ev.systems:
                cells = [fmt(ev.bleu(run, b)) for b in buckets] + [fmt(ev.bleu(run))]
                lines.append(f"| {NAMES.get(m, m)} | {trained} | " + " | ".join(cells) + " |")
    lines.append("")


def tested(n, claim, measured, delta, p, paper):
    """One of the papers' claims that a difference and its paired-bootstrap p-value decide."""
    return (
        f"{n}. **{claim}** {measured} {fmt(delta)} (p = {fmt(p, 3)}). Paper: {paper}. "
        f"Verdict: {verdict(delta, p)}."
    )


def findings(ev_all, ev_short, study, cap, lines):
    """Each of the papers' claims, tested on our numbers."""
    lines += ["## Which findings held", ""]
    out = []
    if ev_short:
        b = ev_short.buckets()
        inside, last = b[0], b[-1]
        t_in, t_out = ev_short.bleu("transformer.short", inside), ev_short.bleu("transformer.short", last)
        r_in, r_out = ev_short.bleu("rel-transformer.short", inside), ev_short.bleu("rel-transformer.short", last)
        out.append(tested(
            1,
            "Relative positions keep their quality beyond the training lengths; absolute ones do not.",
            f"Trained on sources ≤ {cap}: Transformer {fmt(t_in)} ({inside}) → {fmt(t_out)} ({last}); "
            f"Rel-Transformer {fmt(r_in)} → {fmt(r_out)}; Rel minus Transformer at {last}:",
            drop(t_out, r_out),
            ev_short.p_bucket("rel-transformer.short", last),
            PAPERS["rosendahl_t2"],
        ))
        d_in = drop(t_in, r_in)
        p_in = ev_short.p_bucket("rel-transformer.short", inside)
        if d_in is None:
            same = "not measured yet (a model it needs is not recorded)"
        else:
            same = "held" if p_in is None or p_in >= SIGNIFICANCE else "**did not hold**"
        out.append(
            f"2. **Within the training lengths the two are equal.** Rel minus Transformer at {inside}: "
            f"{fmt(d_in)} (p = {fmt(p_in, 3)}). Paper: {PAPERS['rosendahl_t2_in']}. Verdict: {same}."
        )
        out.append(tested(
            3,
            "On joined inputs far beyond the training lengths, relative beats absolute.",
            f"8 verses joined, trained on ≤ {cap}: Rel minus Transformer",
            drop(ev_short.joined("transformer.short", 8), ev_short.joined("rel-transformer.short", 8)),
            ev_short.p_concat("rel-transformer.short", 8),
            PAPERS["rosendahl_t3"],
        ))
        # The learned model is the one tested against the sinusoidal baseline.
        out.append(tested(
            4,
            "Sinusoidal beats learned absolute positions beyond the training lengths.",
            f"At {last}, trained on ≤ {cap}: sinusoidal minus learned",
            drop(ev_short.bleu("transformer-learned.short", last), t_out),
            ev_short.p_bucket("transformer-learned.short", last),
            PAPERS["neishi_learned"],
        ))
        lstm = ev_short.bleu("lstm-pe.short", last)
        above = drop(t_out, lstm)
        p_above = ev_short.p_bucket("lstm-pe.short", last)
        if above is None or r_out is None:
            held = "not measured yet (a model it needs is not recorded)"
        else:
            first = verdict(above, p_above)
            second = "below relative" if lstm < r_out else f"but above relative by {lstm - r_out:.2f} (no paired test against Rel)"
            held = f"above absolute: {first}; {second}"
        out.append(
            f"5. **LSTM positions fall between absolute and relative beyond the training lengths.** "
            f"At {last}: Transformer {fmt(t_out)}, LSTM positions {fmt(lstm)}, Rel-Transformer {fmt(r_out)}; "
            f"LSTM minus Transformer {fmt(above)} (p = {fmt(p_above, 3)}). "
            f"Paper: {PAPERS['rosendahl_lstm']}. Verdict: {held}."
        )
        out.append(tested(
            6,
            "GRU positions (RNN-Transformer) beat the Transformer beyond the training lengths.",
            f"At {last}, RNN-Transformer minus Transformer:",
            drop(t_out, ev_short.bleu("rnn-transformer.short", last)),
            ev_short.p_bucket("rnn-transformer.short", last),
            "Neishi & Yoshinaga, Fig. 3 (figure only)",
        ))
    if ev_all:
        out += findings_all(ev_all)
    out += findings_thirds(study)
    lines += out + [""]


def findings_all(ev_all):
    """The papers' claims about models trained on every pair (numbered 7 to 9)."""
    out = []
    order = ["rnn-nmt", "transformer", "rel-transformer", "rnn-transformer", "rr-transformer", "rpe-head"]
    scores = {m: ev_all.bleu(f"{m}.all") for m in order if f"{m}.all" in ev_all.systems}
    parts = ", ".join(f"{NAMES.get(m, m)} {fmt(v)}" for m, v in scores.items())
    variants = ("rel-transformer", "rnn-transformer", "rr-transformer")
    measured = [m for m in variants if m in scores]
    beats = [m for m in measured if ev_all.p_overall(f"{m}.all") is not None
             and ev_all.p_overall(f"{m}.all") < SIGNIFICANCE and scores[m] > scores.get("transformer", 0)]
    best = max((m for m in scores if m in variants or m == "transformer"), key=scores.get, default=None)
    if len(measured) < len(variants) or "transformer" not in scores:
        held = "not measured yet (a model it needs is not recorded)"
    elif len(beats) == len(variants) and best == "rr-transformer":
        held = "**held**"
    else:
        held = (f"partly: {len(beats)} of {len(variants)} significantly above the Transformer; "
                f"best: {NAMES.get(best, best)}")
    out.append(
        f"7. **On all the data, every relative/recurrent variant beats the Transformer, and "
        f"RR-Transformer is best.** Ours: {parts}; significantly above the Transformer: "
        f"{', '.join(NAMES.get(m, m) for m in beats) or 'none'}. Paper: {PAPERS['neishi_t3']}. "
        f"Verdict: {held}."
    )
    out.append(tested(
        8,
        "RPEHead beats the Transformer.",
        "On all the data, RPEHead minus Transformer:",
        drop(scores.get("transformer"), scores.get("rpe-head")),
        ev_all.p_overall("rpe-head.all"),
        PAPERS["chen_t1"],
    ))
    out.append(tested(
        9,
        "The RNN-NMT baseline is below the Transformer.",
        "On all the data, Transformer minus RNN-NMT:",
        drop(scores.get("rnn-nmt"), scores.get("transformer")),
        ev_all.p_overall("rnn-nmt.all"),
        PAPERS["neishi_t3"],
    ))
    return out


def findings_thirds(study):
    """Neishi & Yoshinaga's section 5.3 on our thirds (numbered 10 and 11): per third, the
    Transformer against the Rel-Transformer trained on the same third."""
    evals = {}
    for k in (1, 2, 3):
        path = os.path.join(study, f"eval-third{k}")
        if os.path.exists(os.path.join(path, "report.json")):
            evals[k] = Eval(path)
    cells = []  # (trained on, tested on, Rel minus Transformer, p), on test buckets beyond the third
    for k, ev in evals.items():
        t, r = f"transformer.third{k}", f"rel-transformer.third{k}"
        if t not in ev.systems or r not in ev.systems:
            continue
        buckets = ev.buckets()
        for b in buckets[k:]:
            cells.append((buckets[k - 1], b, drop(ev.bleu(t, b), ev.bleu(r, b)), ev.p_bucket(r, b)))
    if len(cells) < 3:
        longer = "not measured yet (a model it needs is not recorded)"
        measured = "–"
    else:
        measured = "; ".join(f"trained {a}, tested {b}: {fmt(d)} (p = {fmt(p, 3)})" for a, b, d, p in cells)
        significant = [d for _, _, d, p in cells if p is not None and p < SIGNIFICANCE]
        above = sum(1 for d in significant if d > 0)
        below = sum(1 for d in significant if d < 0)
        counts = (f"Rel significantly above in {above} of {len(cells)} cells, significantly below "
                  f"in {below}, no significant difference in {len(cells) - above - below}")
        if above == len(cells):
            longer = "**held**"
        elif above == 0 and below == 0:
            same = sum(1 for _, _, d, _ in cells if d > 0)
            longer = f"inconclusive: no cell differs significantly (Rel above in {same} of {len(cells)})"
        elif above == 0:
            longer = f"**did not hold**: {counts}"
        else:
            longer = f"partly: {counts}"
    out = [
        f"10. **Trained on a third of the data by length, the Transformer is below the "
        f"Rel-Transformer on sentences longer than that third.** Rel minus Transformer: "
        f"{measured}. Paper: {PAPERS['neishi_53']}. Verdict: {longer}."
    ]
    ev = evals.get(3)
    if ev is None or "transformer.third3" not in ev.systems or "rel-transformer.third3" not in ev.systems:
        out.append(
            f"11. **Trained on the long third, the Transformer writes too long translations of "
            f"short sentences; the Rel-Transformer does not.** Paper: {PAPERS['neishi_fig7']}. "
            f"Verdict: not measured yet (a model it needs is not recorded)."
        )
    else:
        shortest = ev.buckets()[0]
        t, r = (ev.row(run, shortest)["length_ratio"] for run in ("transformer.third3", "rel-transformer.third3"))
        held = "**held**" if t > 1.0 and t > r else "**did not hold**"
        out.append(
            f"11. **Trained on the long third, the Transformer writes too long translations of "
            f"short sentences; the Rel-Transformer does not.** Length ratio (hypothesis / "
            f"reference words, sacrebleu's) at test {shortest}: Transformer {t:.3f}, "
            f"Rel-Transformer {r:.3f} (a ratio, no test). Paper: {PAPERS['neishi_fig7']}. "
            f"Verdict: {held}."
        )
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("terciles", help="source-length terciles of a file")
    t.add_argument("tokenizer")
    t.add_argument("source")
    r = sub.add_parser("report", help="write the study's Markdown")
    r.add_argument("dir")
    r.add_argument("doc")
    r.add_argument("--record", required=True, help="folder of the finished models' training reports")
    r.add_argument("--cap", type=int, required=True)
    r.add_argument("--terciles", type=int, nargs=2, required=True)
    r.add_argument("--steps", type=int, required=True)
    r.add_argument("--size", choices=sorted(SIZES), default="small")
    r.add_argument("--models", nargs="+", required=True)
    r.add_argument("--thirds-models", nargs="+", required=True)
    le = sub.add_parser("length-encodings", help="write Oka et al.'s table of length encodings")
    le.add_argument("dir")
    le.add_argument("doc")
    le.add_argument("--record", required=True, help="folder of the finished models' training reports")
    le.add_argument("--steps", type=int, required=True)
    le.add_argument("--size", choices=sorted(SIZES), default="small")
    le.add_argument("--models", nargs="+", required=True)
    args = parser.parse_args()
    if args.command == "terciles":
        terciles(args)
    elif args.command == "length-encodings":
        length_encodings(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
