//! The report: what report.json holds, and its Markdown rendering.

use std::fmt::Write;
use std::path::PathBuf;

use serde::Serialize;

use crate::sacrebleu::{PairedMetric, PairedSystem, Scores, Signatures};
use crate::stats::{BucketEdges, Counts};
use nmt_engine::PackageInfo;

/// p-values below this count as a significant difference.
pub const SIGNIFICANCE_LEVEL: f64 = 0.05;

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// `nmt-eval <version>`.
    pub tool: String,
    pub set: SetInfo,
    pub decoding: Decoding,
    pub sacrebleu: SacrebleuInfo,
    pub systems: Vec<SystemReport>,
    pub paired_bootstrap: Option<PairedReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SetInfo {
    pub name: String,
    pub source: PathBuf,
    pub reference: PathBuf,
    /// The references as scored (the first `--limit` lines).
    pub reference_file: PathBuf,
    pub sentences: usize,
    pub concat: Option<PathBuf>,
}

/// The server's rules the decoding followed.
#[derive(Clone, Debug, Serialize)]
pub struct Decoding {
    pub batch_size: usize,
    pub max_length_ratio: f64,
    pub max_length_offset: usize,
    /// `--runaway-ratio`: past this many times a predicted length (plus 5), EOS is pulled.
    pub runaway_ratio: f64,
    /// `--no-repeat-ngram-size`: no n-gram of this many subwords twice in an output (0: off).
    pub no_repeat_ngram_size: usize,
    /// Placeholders, numbers, URLs and markup masked before the model (the server's
    /// default; `--no-placeholder-masking` turns it off).
    pub placeholder_masking: bool,
    pub beyond_input_limit: bool,
    /// The length every test sentence asked for, as request fields (`None`: none).
    pub length_ask: Option<String>,
    /// Inclusive upper bounds (source subwords) of the source-length buckets
    /// (`--bucket-edges`); the last bucket is open.
    pub bucket_edges: BucketEdges,
}

#[derive(Clone, Debug, Serialize)]
pub struct SacrebleuInfo {
    pub signatures: Signatures,
    pub bootstrap_samples: usize,
    /// Every scoring command, to rerun by hand.
    pub commands: Vec<String>,
}

/// A set of sentences: tool counts and sacrebleu scores.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub counts: Counts,
    #[serde(flatten)]
    pub scores: Scores,
}

#[derive(Clone, Debug, Serialize)]
pub struct BucketRow {
    /// The bucket's label: source subwords, `--bucket-edges` (by default the server's
    /// `input_length` buckets).
    pub bucket: String,
    #[serde(flatten)]
    pub row: Row,
}

/// One group size of the long-input set.
#[derive(Clone, Debug, Serialize)]
pub struct ConcatRow {
    pub n_verses: usize,
    /// Each group translated as one input.
    pub concat: Row,
    /// The same verses translated one by one and joined with a space; a group counts as
    /// refused or as hitting the budget when one of its verses does.
    pub one_by_one: Row,
    /// Concat BLEU minus one-by-one BLEU: the long-input penalty.
    pub bleu_delta: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SystemReport {
    /// Folder name under `--out` and name in the tables.
    pub label: String,
    pub package: PackageInfo,
    pub hypotheses: PathBuf,
    pub seconds: f64,
    pub sentences_per_second: f64,
    pub output_tokens_per_second: f64,
    pub overall: Row,
    pub by_source_length: Vec<BucketRow>,
    pub concat: Vec<ConcatRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PairedReport {
    pub baseline: String,
    pub samples: usize,
    pub significance_level: f64,
    pub systems: Vec<PairedEntry>,
    /// Each bucket's sentences (as the baseline's tokenizer buckets them), every system
    /// against the baseline, bucket by bucket; BLEU and chrF.
    pub by_bucket: Vec<BucketPaired>,
    /// Each group size of the long-input set, translated joined; BLEU and chrF.
    pub by_n_verses: Vec<ConcatPaired>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BucketPaired {
    pub bucket: String,
    #[serde(flatten)]
    pub paired: SubsetPaired,
}

#[derive(Clone, Debug, Serialize)]
pub struct ConcatPaired {
    pub n_verses: usize,
    #[serde(flatten)]
    pub paired: SubsetPaired,
}

/// One system against the baseline on a subset: scores, score minus the baseline's, and
/// sacrebleu's p-value, flat so that a table of them reads straight into a data frame.
#[derive(Clone, Debug, Serialize)]
pub struct SubsetPaired {
    pub system: String,
    /// Sentences (long-input groups) in the subset.
    pub sentences: usize,
    pub bleu: f64,
    pub bleu_baseline: f64,
    pub bleu_delta: f64,
    pub bleu_p: f64,
    pub bleu_significant: bool,
    pub chrf: f64,
    pub chrf_baseline: f64,
    pub chrf_delta: f64,
    pub chrf_p: f64,
    pub chrf_significant: bool,
}

impl SubsetPaired {
    /// `None` for the baseline itself (no p-value).
    pub fn new(
        system: &str,
        sentences: usize,
        result: &PairedSystem,
        baseline: &PairedSystem,
    ) -> Option<SubsetPaired> {
        let bleu = Compared::new(result.bleu.clone(), &baseline.bleu);
        let chrf = Compared::new(result.chrf.clone(), &baseline.chrf);
        Some(SubsetPaired {
            system: system.to_string(),
            sentences,
            bleu: bleu.metric.score,
            bleu_baseline: baseline.bleu.score,
            bleu_delta: bleu.delta,
            bleu_p: bleu.metric.p_value?,
            bleu_significant: bleu.significant,
            chrf: chrf.metric.score,
            chrf_baseline: baseline.chrf.score,
            chrf_delta: chrf.delta,
            chrf_p: chrf.metric.p_value?,
            chrf_significant: chrf.significant,
        })
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct PairedEntry {
    pub label: String,
    pub bleu: Compared,
    pub chrf: Compared,
    pub ter: Compared,
}

/// A metric of a system compared with the baseline.
#[derive(Clone, Debug, Serialize)]
pub struct Compared {
    #[serde(flatten)]
    pub metric: PairedMetric,
    pub delta: f64,
    pub significant: bool,
}

impl Compared {
    /// A difference is significant when sacrebleu's p-value is below the level and the
    /// scores differ at all: with a zero difference sacrebleu's p is 1/(samples+1) (it counts
    /// resampled differences strictly above the observed one), which is no evidence of a
    /// difference.
    pub fn new(metric: PairedMetric, baseline: &PairedMetric) -> Compared {
        let delta = metric.score - baseline.score;
        let significant = delta != 0.0 && metric.p_value.is_some_and(|p| p < SIGNIFICANCE_LEVEL);
        Compared {
            metric,
            delta,
            significant,
        }
    }
}

fn ci(m: &crate::sacrebleu::Metric) -> String {
    match m.ci {
        Some(ci) => format!("{:.2} ± {:.2}", m.score, ci),
        None => format!("{:.2}", m.score),
    }
}

/// A share of the decoded sentences; "–" when none was decoded.
fn pct(share: f64, counts: &Counts) -> String {
    decoded(counts, || format!("{:.1}%", 100.0 * share))
}

/// `cell()` when some sentence was decoded, "–" otherwise.
fn decoded(counts: &Counts, cell: impl FnOnce() -> String) -> String {
    if counts.refused == counts.sentences {
        "–".into()
    } else {
        cell()
    }
}

/// The Markdown report.
pub fn render_markdown(report: &Report) -> String {
    let mut md = String::new();
    let set = &report.set;
    let _ = writeln!(md, "# Evaluation: {}\n", set.name);
    let _ = writeln!(
        md,
        "{} sentences from `{}` / `{}`; greedy decoding as nmt-server does it (budget \
         {} × source subwords + {}, {}, batches of {}{}). Scores: sacrebleu, 95% bootstrap \
         confidence intervals ({} resamples). Shares of looping outputs (a word 3-gram 3 or \
         more times) and of outputs that hit the length budget are over decoded sentences; \
         Δlen is output minus reference subwords (mean and variance).\n",
        set.sentences,
        set.source.display(),
        set.reference.display(),
        report.decoding.max_length_ratio,
        report.decoding.max_length_offset,
        if report.decoding.runaway_ratio > 0.0 {
            format!(
                "a predicted length's runaways pulled to an end past {} × it + 5, or the \
                 prediction pulled toward beyond the package's `prediction_pull` share of it",
                report.decoding.runaway_ratio
            )
        } else {
            "no runaway guard".to_string()
        } + &match report.decoding.no_repeat_ngram_size {
            0 => String::new(),
            n => format!(", no {n}-subword n-gram twice"),
        },
        report.decoding.batch_size,
        if report.decoding.beyond_input_limit {
            "; inputs over the input limit decoded anyway"
        } else {
            "; inputs over the input limit are refused, as the server does, and score as empty"
        }
        .to_string()
            + if report.decoding.placeholder_masking {
                ""
            } else {
                "; placeholders, numbers, URLs and markup left to the model (not masked)"
            },
        report.sacrebleu.bootstrap_samples,
    );
    let edges = &report.decoding.bucket_edges;
    let _ = writeln!(
        md,
        "Source-length buckets (source subwords, EOS not counted; `--bucket-edges {edges}`): {}.\n",
        edges.labels().join(", ")
    );
    if let Some(ask) = &report.decoding.length_ask {
        let _ = writeln!(md, "Every test sentence asks for: {ask}.\n");
    }
    overall_table(&mut md, report);
    length_table(&mut md, report);
    for system in &report.systems {
        bucket_table(&mut md, system, &report.decoding.bucket_edges);
    }
    if report.systems.iter().any(|s| !s.concat.is_empty()) {
        concat_tables(&mut md, report);
    }
    if let Some(paired) = &report.paired_bootstrap {
        paired_table(&mut md, paired);
    }
    let sig = &report.sacrebleu.signatures;
    let _ = writeln!(
        md,
        "## Signatures\n\n- BLEU `{}`\n- chrF `{}`\n- TER `{}`",
        sig.bleu, sig.chrf, sig.ter
    );
    md
}

const ROW_HEADER: &str = "| sentences | BLEU | chrF | TER | length ratio | refused | looping | hit budget | Δlen mean | Δlen var |";
const ROW_RULE: &str = "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |";

fn row_cells(row: &Row) -> String {
    let (c, s) = (&row.counts, &row.scores);
    format!(
        "{} | {} | {} | {} | {:.3} | {} | {} | {} | {} | {} |",
        c.sentences,
        ci(&s.bleu),
        ci(&s.chrf),
        s.ter.as_ref().map_or("–".into(), ci),
        s.length_ratio,
        c.refused,
        pct(c.looping_share, c),
        pct(c.hit_budget_share, c),
        decoded(c, || format!("{:.1}", c.subword_diff_mean)),
        decoded(c, || format!("{:.1}", c.subword_diff_variance)),
    )
}

fn overall_table(md: &mut String, report: &Report) {
    let _ = writeln!(md, "## Overall\n");
    let _ = writeln!(md, "| package {ROW_HEADER} sentences/s |");
    let _ = writeln!(md, "| --- {ROW_RULE} ---: |");
    for s in &report.systems {
        let _ = writeln!(
            md,
            "| {} | {} {:.1} |",
            s.label,
            row_cells(&s.overall),
            s.sentences_per_second
        );
    }
    let _ = writeln!(md);
}

/// Where outputs end and, for planned lengths, how close they came to the target.
fn length_table(md: &mut String, report: &Report) {
    let _ = writeln!(md, "## Length\n");
    let _ = writeln!(
        md,
        "Ends in punctuation: the output's last character (closing quotes aside) is one of \
         `. , ; : ! ?`. Against the target (output minus target subwords, for sentences \
         decoded for one): mean, variance, shares at it and within ±1 and ±2; cut: outputs \
         cut at a word boundary to meet `max_chars`.\n"
    );
    let _ = writeln!(
        md,
        "| package | ends in punctuation | planned | Δtarget mean | Δtarget var | at target | ±1 | ±2 | cut | longest (chars) |"
    );
    let _ = writeln!(
        md,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for s in &report.systems {
        let c = &s.overall.counts;
        let planned = match &c.length_control {
            Some(l) => format!(
                "{} | {:.2} | {:.2} | {} | {} | {} | {} | {}",
                l.sentences,
                l.diff_mean,
                l.diff_variance,
                pct(l.exact_share, c),
                pct(l.within_1_share, c),
                pct(l.within_2_share, c),
                l.truncated,
                l.max_chars_seen
            ),
            None => "0 | – | – | – | – | – | – | –".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {planned} |",
            s.label,
            pct(c.ends_in_punctuation_share, c)
        );
    }
    let _ = writeln!(md);
}

fn bucket_table(md: &mut String, system: &SystemReport, edges: &BucketEdges) {
    let which = if edges.are_the_servers() {
        "the server's buckets".to_string()
    } else {
        format!("bucket edges {edges}")
    };
    let _ = writeln!(
        md,
        "## {}: by source length (subwords, {which})\n",
        system.label
    );
    let _ = writeln!(md, "| bucket {ROW_HEADER}");
    let _ = writeln!(md, "| --- {ROW_RULE}");
    for b in &system.by_source_length {
        let _ = writeln!(md, "| {} | {}", b.bucket, row_cells(&b.row));
    }
    let _ = writeln!(md);
}

fn concat_tables(md: &mut String, report: &Report) {
    let _ = writeln!(
        md,
        "## Long inputs: verses joined into one input vs translated one by one\n"
    );
    let _ = writeln!(
        md,
        "| package | verses | groups | source subwords | refused | BLEU joined | BLEU one by one | ΔBLEU | chrF joined | chrF one by one | ratio joined | ratio one by one | looping | hit budget |"
    );
    let _ = writeln!(
        md,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for s in &report.systems {
        for c in &s.concat {
            let (j, o) = (&c.concat, &c.one_by_one);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} | {} | {} | {} | {:+.2} | {:.2} | {:.2} | {:.3} | {:.3} | {} | {} |",
                s.label,
                c.n_verses,
                j.counts.sentences,
                j.counts.mean_source_subwords,
                j.counts.refused,
                ci(&j.scores.bleu),
                ci(&o.scores.bleu),
                c.bleu_delta,
                j.scores.chrf.score,
                o.scores.chrf.score,
                j.scores.length_ratio,
                o.scores.length_ratio,
                pct(j.counts.looping_share, &j.counts),
                pct(j.counts.hit_budget_share, &j.counts),
            );
        }
    }
    let _ = writeln!(md);
}

fn paired_table(md: &mut String, paired: &PairedReport) {
    let _ = writeln!(
        md,
        "## Paired bootstrap against {} (sacrebleu --paired-bs, {} resamples)\n",
        paired.baseline, paired.samples
    );
    let _ = writeln!(
        md,
        "| package | BLEU | chrF | TER |\n| --- | ---: | ---: | ---: |"
    );
    let cell = |c: &Compared| match c.metric.p_value {
        Some(p) => paired_cell(c.metric.score, c.delta, p, c.significant),
        None => format!("{:.2} (baseline)", c.metric.score),
    };
    for e in &paired.systems {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            e.label,
            cell(&e.bleu),
            cell(&e.chrf),
            cell(&e.ter)
        );
    }
    subset_paired_tables(md, paired);
    let _ = writeln!(
        md,
        "\n`*`: significant at p < {} with a non-zero difference.\n",
        paired.significance_level
    );
}

/// A system's score, its difference from the baseline and sacrebleu's p-value.
fn paired_cell(score: f64, delta: f64, p: f64, significant: bool) -> String {
    format!(
        "{score:.2} ({delta:+.2}, p = {p:.4}){}",
        if significant { " *" } else { "" }
    )
}

fn subset_cells(s: &SubsetPaired) -> String {
    format!(
        "{} | {} | {} | {} |",
        s.sentences,
        s.system,
        paired_cell(s.bleu, s.bleu_delta, s.bleu_p, s.bleu_significant),
        paired_cell(s.chrf, s.chrf_delta, s.chrf_p, s.chrf_significant)
    )
}

/// The paired bootstrap run again on each bucket and each long-input group size.
fn subset_paired_tables(md: &mut String, paired: &PairedReport) {
    if !paired.by_bucket.is_empty() {
        let _ = writeln!(
            md,
            "\nBy source length (each bucket's sentences as the baseline's tokenizer counts \
             them; one sacrebleu --paired-bs per bucket):\n"
        );
        let _ = writeln!(
            md,
            "| bucket | sentences | package | BLEU | chrF |\n| --- | ---: | --- | ---: | ---: |"
        );
        for b in &paired.by_bucket {
            let _ = writeln!(md, "| {} | {}", b.bucket, subset_cells(&b.paired));
        }
    }
    if !paired.by_n_verses.is_empty() {
        let _ = writeln!(md, "\nLong inputs, verses joined into one input:\n");
        let _ = writeln!(
            md,
            "| verses | groups | package | BLEU | chrF |\n| ---: | ---: | --- | ---: | ---: |"
        );
        for c in &paired.by_n_verses {
            let _ = writeln!(md, "| {} | {}", c.n_verses, subset_cells(&c.paired));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sacrebleu::Metric;

    fn row(sentences: usize, bleu: f64, ratio: f64) -> Row {
        Row {
            counts: Counts {
                sentences,
                refused: 1,
                looping: 1,
                looping_share: 0.25,
                hit_budget: 0,
                hit_budget_share: 0.0,
                mean_source_subwords: 20.0,
                subword_diff_mean: 1.5,
                subword_diff_variance: 4.0,
                ends_in_punctuation_share: 0.5,
                length_control: None,
            },
            scores: Scores {
                bleu: Metric {
                    score: bleu,
                    mean: Some(bleu),
                    ci: Some(1.25),
                },
                chrf: Metric {
                    score: 30.0,
                    mean: None,
                    ci: None,
                },
                ter: Some(Metric {
                    score: 90.0,
                    mean: None,
                    ci: None,
                }),
                length_ratio: ratio,
                hyp_len: 10,
                ref_len: 9,
                signatures: Signatures::default(),
            },
        }
    }

    fn system(label: &str) -> SystemReport {
        SystemReport {
            label: label.into(),
            package: PackageInfo {
                dir: "models/m".into(),
                name: "m".into(),
                preset: "transformer".into(),
                source_language: "en".into(),
                execution_provider: "CPU".into(),
                precision: Default::default(),
                input_limit: 127,
                max_output_tokens: 256,
            },
            hypotheses: format!("out/{label}/test.hyp").into(),
            seconds: 2.0,
            sentences_per_second: 2.0,
            output_tokens_per_second: 40.0,
            overall: row(4, 10.5, 1.1),
            by_source_length: vec![
                BucketRow {
                    bucket: "1-16".into(),
                    row: row(1, 3.0, 1.9),
                },
                BucketRow {
                    bucket: "17-32".into(),
                    row: row(3, 12.0, 1.05),
                },
            ],
            concat: vec![ConcatRow {
                n_verses: 2,
                concat: row(2, 8.0, 1.2),
                one_by_one: row(2, 11.0, 1.1),
                bleu_delta: -3.0,
            }],
        }
    }

    fn paired(p: f64, score: f64) -> PairedMetric {
        PairedMetric {
            score,
            mean: score,
            ci: 1.0,
            p_value: Some(p),
        }
    }

    fn subset_paired(system: &str, sentences: usize) -> SubsetPaired {
        let system_result = |bleu, chrf, p| PairedSystem {
            bleu: paired(p, bleu),
            chrf: paired(p, chrf),
            ter: None,
        };
        let baseline = PairedSystem {
            bleu: PairedMetric {
                p_value: None,
                ..paired(0.0, 12.0)
            },
            ..system_result(12.0, 30.0, 0.0)
        };
        SubsetPaired::new(
            system,
            sentences,
            &system_result(9.5, 30.0, 0.02),
            &baseline,
        )
        .unwrap()
    }

    fn report() -> Report {
        let base = PairedMetric {
            p_value: None,
            ..paired(0.0, 10.5)
        };
        Report {
            tool: "nmt-eval 0".into(),
            set: SetInfo {
                name: "test".into(),
                source: "data/corpus/test.en".into(),
                reference: "data/corpus/test.es".into(),
                reference_file: "out/test.ref".into(),
                sentences: 4,
                concat: None,
            },
            decoding: Decoding {
                batch_size: 32,
                max_length_ratio: 2.0,
                max_length_offset: 10,
                runaway_ratio: 1.5,
                no_repeat_ngram_size: 0,
                placeholder_masking: true,
                beyond_input_limit: false,
                length_ask: None,
                bucket_edges: BucketEdges::default(),
            },
            sacrebleu: SacrebleuInfo {
                signatures: Signatures {
                    bleu: "nrefs:1|bs:1000|version:2.6.0".into(),
                    chrf: "c".into(),
                    ter: "t".into(),
                },
                bootstrap_samples: 1000,
                commands: vec![],
            },
            systems: vec![system("a"), system("b")],
            paired_bootstrap: Some(PairedReport {
                baseline: "a".into(),
                samples: 1000,
                significance_level: SIGNIFICANCE_LEVEL,
                systems: vec![
                    PairedEntry {
                        label: "a".into(),
                        bleu: Compared::new(base.clone(), &base),
                        chrf: Compared::new(base.clone(), &base),
                        ter: Compared::new(base.clone(), &base),
                    },
                    PairedEntry {
                        label: "b".into(),
                        bleu: Compared::new(paired(0.001, 12.0), &base),
                        chrf: Compared::new(paired(0.3, 11.0), &base),
                        ter: Compared::new(paired(0.001, 10.5), &base),
                    },
                ],
                by_bucket: vec![BucketPaired {
                    bucket: "17-32".into(),
                    paired: subset_paired("b", 3),
                }],
                by_n_verses: vec![ConcatPaired {
                    n_verses: 2,
                    paired: subset_paired("b", 2),
                }],
            }),
        }
    }

    #[test]
    fn markdown_has_every_table_and_the_signatures() {
        let md = render_markdown(&report());
        assert!(md.starts_with("# Evaluation: test\n"), "{md}");
        assert!(md.contains("| a | 4 | 10.50 ± 1.25 | 30.00 | 90.00 | 1.100 | 1 | 25.0% | 0.0% | 1.5 | 4.0 | 2.0 |"), "{md}");
        assert!(md.contains("## b: by source length"), "{md}");
        assert!(md.contains("| 17-32 | 3 | 12.00 ± 1.25 |"), "{md}");
        assert!(
            md.contains("| a | 2 | 2 | 20 | 1 | 8.00 ± 1.25 | 11.00 ± 1.25 | -3.00 |"),
            "{md}"
        );
        assert!(md.contains("| a | 10.50 (baseline) |"), "{md}");
        assert!(
            md.contains("- BLEU `nrefs:1|bs:1000|version:2.6.0`"),
            "{md}"
        );
    }

    #[test]
    fn a_zero_difference_is_never_significant() {
        let md = render_markdown(&report());
        // BLEU differs with p = 0.001: significant. TER has p = 0.001 but the same score
        // (sacrebleu's p for a zero difference): not significant. chrF: p = 0.3.
        assert!(md.contains("| b | 12.00 (+1.50, p = 0.0010) * | 11.00 (+0.50, p = 0.3000) | 10.50 (+0.00, p = 0.0010) |"), "{md}");
    }

    #[test]
    fn bucket_edges_and_the_paired_bootstrap_by_subset_are_reported() {
        let mut report = report();
        let md = render_markdown(&report);
        assert!(md.contains("## b: by source length (subwords, the server's buckets)"));
        assert!(
            md.contains("`--bucket-edges 16,32,64,128,256,512`): 1-16, 17-32,"),
            "{md}"
        );
        // chrF: p = 0.02 but the same score, so not significant.
        assert!(
            md.contains(
                "| 17-32 | 3 | b | 9.50 (-2.50, p = 0.0200) * | 30.00 (+0.00, p = 0.0200) |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| 2 | 2 | b | 9.50 (-2.50, p = 0.0200) * |"),
            "{md}"
        );
        report.decoding.bucket_edges = "32".parse().unwrap();
        let md = render_markdown(&report);
        assert!(
            md.contains("## b: by source length (subwords, bucket edges 32)"),
            "{md}"
        );
        assert!(md.contains("`--bucket-edges 32`): 1-32, 33+."), "{md}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["decoding"]["bucket_edges"], serde_json::json!([32]));
        let bucket = &json["paired_bootstrap"]["by_bucket"][0];
        assert_eq!(bucket["bucket"], "17-32");
        assert_eq!(bucket["system"], "b");
        assert_eq!(bucket["sentences"], 3);
        assert_eq!(bucket["bleu_delta"], -2.5);
        assert_eq!(bucket["bleu_baseline"], 12.0);
        assert_eq!(bucket["bleu_p"], 0.02);
        assert_eq!(bucket["bleu_significant"], true);
        assert_eq!(bucket["chrf_significant"], false);
        assert_eq!(json["paired_bootstrap"]["by_n_verses"][0]["n_verses"], 2);
        // The baseline has no p-value, so no row of its own.
        let base = PairedSystem {
            bleu: PairedMetric::default(),
            chrf: PairedMetric::default(),
            ter: None,
        };
        assert!(SubsetPaired::new("a", 1, &base, &base).is_none());
    }

    #[test]
    fn json_flattens_counts_and_scores() {
        let json = serde_json::to_value(report()).unwrap();
        let overall = &json["systems"][0]["overall"];
        assert_eq!(overall["sentences"], 4);
        assert_eq!(overall["bleu"]["score"], 10.5);
        assert_eq!(overall["length_ratio"], 1.1);
        assert_eq!(json["systems"][1]["by_source_length"][1]["bucket"], "17-32");
        assert_eq!(
            json["paired_bootstrap"]["systems"][1]["ter"]["significant"],
            false
        );
        assert_eq!(
            json["paired_bootstrap"]["systems"][1]["bleu"]["significant"],
            true
        );
    }
}
