//! One evaluation from start to end: read the sets, decode them with every package, write
//! the hypothesis and reference files, score them all with sacrebleu, write the report.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::cli::{Args, EvalChars, EvalTargetLength};
use crate::data::{self, ConcatGroup, Parallel};
use crate::report::{
    self, BucketPaired, BucketRow, Compared, ConcatPaired, ConcatRow, Decoding, PairedEntry,
    PairedReport, Report, Row, SacrebleuInfo, SetInfo, SubsetPaired, SystemReport,
};
use crate::sacrebleu::{self, Job, PairedSystem, Signatures};
use crate::saved;
use crate::stats::{self, BucketEdges, Counts};
use nmt_engine::length::{LengthMode, LengthRequest, TargetChars, TargetLength};
use nmt_engine::{Engine, EngineOptions, Outcome, PackageInfo, Translation};

/// The set to evaluate.
pub(crate) struct EvalSet {
    pub(crate) name: String,
    source: PathBuf,
    reference: PathBuf,
    pub(crate) data: Parallel,
    pub(crate) concat: Option<ConcatSet>,
}

/// The long-input set and the verses its groups join.
pub(crate) struct ConcatSet {
    path: PathBuf,
    pub(crate) groups: Vec<ConcatGroup>,
    verses: Parallel,
}

fn load_set(args: &Args) -> Result<EvalSet> {
    let (name, source, reference) = match (&args.source, &args.reference) {
        (Some(s), Some(r)) => {
            let stem = s.file_stem().unwrap_or_default().to_string_lossy();
            (stem.into_owned(), s.clone(), r.clone())
        }
        _ => (
            args.split.clone(),
            args.corpus.join(format!("{}.en", args.split)),
            args.corpus.join(format!("{}.es", args.split)),
        ),
    };
    let mut data = data::read_parallel(&source, &reference, args.source.is_none())?;
    if let Some(n) = args.limit {
        data.truncate(n);
    }
    ensure!(!data.is_empty(), "--limit 0 leaves nothing to evaluate");
    let concat = load_concat(args)?;
    Ok(EvalSet {
        name,
        source,
        reference,
        data,
        concat,
    })
}

/// `--concat`, or the corpus's when the set is its test split and the file is there. Not
/// with a length ask: its one-by-one side reuses the main set's translations, which would
/// then be length-controlled.
fn load_concat(args: &Args) -> Result<Option<ConcatSet>> {
    let default = args.corpus.join("test-concat.tsv");
    let length_ask =
        args.target_length.is_some() || args.max_chars.is_some() || args.target_chars.is_some();
    let path = match &args.concat {
        _ if args.no_concat || length_ask => return Ok(None),
        Some(path) => path.clone(),
        None if args.source.is_none() && args.split == "test" && default.is_file() => default,
        None => return Ok(None),
    };
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut groups = data::parse_concat(&text).with_context(|| path.display().to_string())?;
    if let Some(n) = args.limit {
        groups = data::limit_groups(groups, n);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let verses = data::read_parallel(&dir.join("test.en"), &dir.join("test.es"), true)?;
    data::locate_verses(&mut groups, &verses).with_context(|| path.display().to_string())?;
    Ok(Some(ConcatSet {
        path,
        groups,
        verses,
    }))
}

/// Everything decoded with one package.
#[derive(Serialize, Deserialize)]
pub(crate) struct Decoded {
    info: PackageInfo,
    translations: Vec<Translation>,
    reference_subwords: Vec<usize>,
    seconds: f64,
    pub(crate) concat: Vec<DecodedConcat>,
}

/// One group size of the long-input set, decoded both ways.
#[derive(Serialize, Deserialize)]
pub(crate) struct DecodedConcat {
    n_verses: usize,
    pub(crate) references: Vec<String>,
    reference_subwords: Vec<usize>,
    joined: Vec<Translation>,
    one_by_one: Vec<Translation>,
}

fn progress_bar(len: usize, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>20} [{elapsed_precise}] {wide_bar} {pos}/{len} sentences ({per_sec}, eta {eta})",
        )
        .expect("a valid template"),
    );
    bar.set_message(label.to_string());
    bar
}

fn subwords(engine: &Engine, texts: &[String]) -> Result<Vec<usize>> {
    texts.iter().map(|t| engine.count_subwords(t)).collect()
}

/// Each test sentence's length ask, from `--target-length`, `--length-mode`, `--max-chars`,
/// `--target-chars`.
fn length_requests(engine: &Engine, set: &EvalSet, args: &Args) -> Result<Vec<LengthRequest>> {
    let scale = args.reference_length_scale;
    let reference_chars = |i: usize| set.data.references[i].chars().count();
    let mode = args.length_mode;
    let references = match args.target_length {
        Some(EvalTargetLength::Reference) => subwords(engine, &set.data.references)?,
        _ => Vec::new(),
    };
    Ok((0..set.data.len())
        .map(|i| LengthRequest {
            target: args.target_length.map(|t| match t {
                EvalTargetLength::Ask(asked) => asked,
                EvalTargetLength::Reference => {
                    let scaled = references[i] as f64 * args.reference_length_scale;
                    TargetLength::Tokens(
                        (scaled.round().max(1.0) as usize).min(engine.info.max_output_tokens),
                    )
                }
            }),
            mode,
            max_chars: args
                .max_chars
                .map(|m| match m.chars(reference_chars(i), scale) {
                    TargetChars::Chars(n) => n,
                    // `--max-chars` takes no `source` (cli::char_budget).
                    TargetChars::Source => usize::MAX,
                }),
            target_chars: args
                .target_chars
                .map(|t| t.chars(reference_chars(i), scale)),
        })
        .collect())
}

fn decode(engine: &mut Engine, set: &EvalSet, args: &Args) -> Result<Decoded> {
    let concat_len = set
        .concat
        .as_ref()
        .map_or(0, |c| c.groups.len() + verse_count(c));
    let bar = progress_bar(set.data.len() + concat_len, &engine.info.name);
    let started = Instant::now();
    let lengths = length_requests(engine, set, args)?;
    let translations =
        engine.translate(&set.data.sources, &lengths, args.batch_size, &mut |n| {
            bar.inc(n as u64)
        })?;
    let seconds = started.elapsed().as_secs_f64();
    let concat = match &set.concat {
        Some(c) => decode_concat(engine, c, set, &translations, args.batch_size, &bar)?,
        None => Vec::new(),
    };
    bar.finish_and_clear();
    Ok(Decoded {
        info: engine.info.clone(),
        reference_subwords: subwords(engine, &set.data.references)?,
        translations,
        seconds,
        concat,
    })
}

/// Decodes the groups as single inputs, and their verses one by one, reusing the
/// translations of the main set when it holds the same verse.
fn decode_concat(
    engine: &mut Engine,
    concat: &ConcatSet,
    set: &EvalSet,
    main: &[Translation],
    batch_size: usize,
    bar: &ProgressBar,
) -> Result<Vec<DecodedConcat>> {
    let texts: Vec<String> = concat.groups.iter().map(|g| g.en.clone()).collect();
    let plain = vec![LengthRequest::default(); texts.len()];
    let joined = engine.translate(&texts, &plain, batch_size, &mut |n| bar.inc(n as u64))?;
    let verses = verse_translations(engine, concat, set, main, batch_size, bar)?;
    let mut out = Vec::new();
    for n in data::group_sizes(&concat.groups) {
        let rows: Vec<usize> = (0..concat.groups.len())
            .filter(|&i| concat.groups[i].n_verses == n)
            .collect();
        let references: Vec<String> = rows.iter().map(|&i| concat.groups[i].es.clone()).collect();
        out.push(DecodedConcat {
            n_verses: n,
            reference_subwords: subwords(engine, &references)?,
            references,
            joined: rows.iter().map(|&i| joined[i].clone()).collect(),
            one_by_one: rows
                .iter()
                .map(|&i| join_verses(&concat.groups[i].verses, &verses))
                .collect(),
        });
    }
    Ok(out)
}

fn verse_count(concat: &ConcatSet) -> usize {
    let mut used: Vec<usize> = concat
        .groups
        .iter()
        .flat_map(|g| g.verses.clone())
        .collect();
    used.sort_unstable();
    used.dedup();
    used.len()
}

/// The translation of every verse some group uses (others stay `None`).
fn verse_translations(
    engine: &mut Engine,
    concat: &ConcatSet,
    set: &EvalSet,
    main: &[Translation],
    batch_size: usize,
    bar: &ProgressBar,
) -> Result<Vec<Option<Translation>>> {
    let known: HashMap<&str, &Translation> = set
        .data
        .sources
        .iter()
        .map(String::as_str)
        .zip(main)
        .collect();
    let mut verses: Vec<Option<Translation>> = vec![None; concat.verses.len()];
    let mut missing = Vec::new();
    for g in &concat.groups {
        for &v in &g.verses {
            if verses[v].is_none() {
                match known.get(concat.verses.sources[v].as_str()) {
                    Some(t) => verses[v] = Some((*t).clone()),
                    None if !missing.contains(&v) => missing.push(v),
                    None => {}
                }
            }
        }
    }
    bar.inc((verse_count(concat) - missing.len()) as u64);
    let texts: Vec<String> = missing
        .iter()
        .map(|&v| concat.verses.sources[v].clone())
        .collect();
    for (v, t) in missing.into_iter().zip(engine.translate(
        &texts,
        &vec![LengthRequest::default(); texts.len()],
        batch_size,
        &mut |n| bar.inc(n as u64),
    )?) {
        verses[v] = Some(t);
    }
    Ok(verses)
}

/// A group's verse translations as one: texts joined with a space, lengths summed; refused
/// or stopped at the budget when one of its verses was.
fn join_verses(indices: &[usize], verses: &[Option<Translation>]) -> Translation {
    let parts: Vec<&Translation> = indices
        .iter()
        .map(|&v| verses[v].as_ref().expect("every used verse is translated"))
        .collect();
    Translation {
        text: parts
            .iter()
            .map(|t| t.text.as_str())
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join(" "),
        source_tokens: parts.iter().map(|t| t.source_tokens).sum(),
        output_tokens: parts.iter().map(|t| t.output_tokens).sum(),
        target_length: None,
        length_source: None,
        predicted_length: None,
        length_mode: None,
        truncated: false,
        candidates: Vec::new(),
        outcome: Outcome::of_parts(parts.iter().map(|t| t.outcome)),
    }
}

/// Files of one scored subset and what the tool counted in it.
struct Pending {
    hypotheses: PathBuf,
    references: PathBuf,
    counts: Counts,
}

/// One text a line, as sacrebleu reads them: a text's own line breaks and tabs (catalog
/// strings have them) become spaces, which its tokenizer treats alike.
fn write_lines<'a>(path: &Path, lines: impl Iterator<Item = &'a str>) -> Result<()> {
    let mut text = String::new();
    for line in lines {
        text.push_str(&line.replace(['\n', '\r', '\t'], " "));
        text.push('\n');
    }
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Writes the subset `rows` of `translations` and `references` as `<stem>.hyp`/`<stem>.ref`.
fn write_subset(
    dir: &Path,
    stem: &str,
    rows: &[usize],
    translations: &[Translation],
    references: &[String],
    reference_subwords: &[usize],
) -> Result<Pending> {
    let hypotheses = dir.join(format!("{stem}.hyp"));
    let reference_file = dir.join(format!("{stem}.ref"));
    write_lines(
        &hypotheses,
        rows.iter().map(|&i| translations[i].text.as_str()),
    )?;
    write_lines(
        &reference_file,
        rows.iter().map(|&i| references[i].as_str()),
    )?;
    let picked: Vec<&Translation> = rows.iter().map(|&i| &translations[i]).collect();
    let ref_lengths: Vec<usize> = rows.iter().map(|&i| reference_subwords[i]).collect();
    Ok(Pending {
        hypotheses,
        references: reference_file,
        counts: stats::counts(&picked, &ref_lengths),
    })
}

/// What is scored for one package.
struct Plan {
    dir: PathBuf,
    overall: Pending,
    /// Label, sentence indices, files.
    buckets: Vec<(String, Vec<usize>, Pending)>,
    concat: Vec<(usize, Pending, Pending)>,
}

fn plan(
    dir: &Path,
    set: &EvalSet,
    decoded: &Decoded,
    reference_file: &Path,
    edges: &BucketEdges,
) -> Result<Plan> {
    fs::create_dir_all(dir.join("by-length"))?;
    let all: Vec<usize> = (0..set.data.len()).collect();
    let (t, refs, lens) = (
        &decoded.translations,
        &set.data.references,
        &decoded.reference_subwords,
    );
    let mut overall = write_subset(dir, &set.name, &all, t, refs, lens)?;
    // One reference file for every package, so the paired bootstrap reads the same one.
    fs::remove_file(&overall.references)?;
    overall.references = reference_file.to_path_buf();
    let mut buckets = Vec::new();
    for (label, rows) in stats::by_bucket(t, edges) {
        let stem = format!("by-length/{}.{label}", set.name);
        let pending = write_subset(dir, &stem, &rows, t, refs, lens)?;
        buckets.push((label, rows, pending));
    }
    let mut concat = Vec::new();
    for c in &decoded.concat {
        let rows: Vec<usize> = (0..c.references.len()).collect();
        let stem = format!("concat-{}", c.n_verses);
        let (r, l) = (&c.references, &c.reference_subwords);
        let joined = write_subset(dir, &stem, &rows, &c.joined, r, l)?;
        let one = write_subset(
            dir,
            &format!("{stem}.one-by-one"),
            &rows,
            &c.one_by_one,
            r,
            l,
        )?;
        concat.push((c.n_verses, joined, one));
    }
    Ok(Plan {
        dir: dir.to_path_buf(),
        overall,
        buckets,
        concat,
    })
}

impl Plan {
    /// Every subset in a fixed order, the order of the jobs and of their results, and
    /// whether it gets TER (not the long-input set: see [`Job::single`]).
    fn subsets(&self) -> Vec<(&Pending, bool)> {
        let mut all = vec![(&self.overall, true)];
        all.extend(self.buckets.iter().map(|(_, _, p)| (p, true)));
        all.extend(
            self.concat
                .iter()
                .flat_map(|(_, a, b)| [(a, false), (b, false)]),
        );
        all
    }
}

fn row(pending: &Pending, scores: &mut impl Iterator<Item = sacrebleu::Scores>) -> Row {
    Row {
        counts: pending.counts.clone(),
        scores: scores.next().expect("one result per job"),
    }
}

fn system_report(
    label: &str,
    decoded: Decoded,
    plan: &Plan,
    scores: Vec<sacrebleu::Scores>,
) -> SystemReport {
    let mut scores = scores.into_iter();
    let overall = row(&plan.overall, &mut scores);
    let by_source_length = plan
        .buckets
        .iter()
        .map(|(bucket, _, p)| BucketRow {
            bucket: bucket.clone(),
            row: row(p, &mut scores),
        })
        .collect();
    let concat = plan
        .concat
        .iter()
        .map(|(n, joined, one)| {
            let (concat, one_by_one) = (row(joined, &mut scores), row(one, &mut scores));
            let bleu_delta = concat.scores.bleu.score - one_by_one.scores.bleu.score;
            ConcatRow {
                n_verses: *n,
                concat,
                one_by_one,
                bleu_delta,
            }
        })
        .collect();
    let seconds = decoded.seconds.max(1e-9);
    let output_tokens: usize = decoded.translations.iter().map(|t| t.output_tokens).sum();
    SystemReport {
        label: label.to_string(),
        hypotheses: plan.overall.hypotheses.clone(),
        package: decoded.info,
        seconds: decoded.seconds,
        sentences_per_second: decoded.translations.len() as f64 / seconds,
        output_tokens_per_second: output_tokens as f64 / seconds,
        overall,
        by_source_length,
        concat,
    }
}

/// Labels are manifest names, made unique with `-2`, `-3`, ...
fn unique_label(name: &str, taken: &[String]) -> String {
    let mut label = name.to_string();
    let mut k = 1;
    while taken.contains(&label) {
        k += 1;
        label = format!("{name}-{k}");
    }
    label
}

/// The packages to decode, in report order, and which one is the baseline.
fn packages(args: &Args) -> (Vec<PathBuf>, Option<usize>) {
    let mut dirs = args.packages.clone();
    match &args.baseline {
        Some(b) => {
            dirs.push(b.clone());
            let last = dirs.len() - 1;
            (dirs, Some(last))
        }
        None if dirs.len() > 1 => (dirs, Some(0)),
        None => (dirs, None),
    }
}

pub fn run(args: &Args) -> Result<()> {
    let set = load_set(args)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("runs/eval-{}", set.name)));
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let reference_file = out.join(format!("{}.ref", set.name));
    write_lines(
        &reference_file,
        set.data.references.iter().map(String::as_str),
    )?;
    let (dirs, baseline) = packages(args);
    let options = EngineOptions {
        device: args.device,
        intra_op_threads: args.intra_op_threads,
        ort_dylib_path: args.ort_dylib_path.clone(),
        beyond_input_limit: args.beyond_input_limit,
        limits: args.decoding.limits()?,
        placeholder_masking: !args.decoding.no_placeholder_masking,
        workers: args.workers,
    };
    let mut labels: Vec<String> = Vec::new();
    let mut decoded = Vec::new();
    let mut plans = Vec::new();
    let provenance = saved::provenance(
        &set,
        length_ask(args),
        args.beyond_input_limit,
        !args.decoding.no_placeholder_masking,
    );
    for dir in &dirs {
        let d = if saved::is_saved(dir) {
            saved::load(dir, &set, &provenance)?
        } else {
            let mut engine = Engine::load(dir, &options)?;
            decode(&mut engine, &set, args)?
        };
        let label = unique_label(&d.info.name, &labels);
        let edges = &args.bucket_edges;
        plans.push(plan(&out.join(&label), &set, &d, &reference_file, edges)?);
        saved::save(&out.join(&label), &d, &provenance)?;
        labels.push(label);
        decoded.push(d);
    }
    let report = score(args, &set, &out, labels, decoded, &plans, baseline)?;
    write_report(args, &report, &out)
}

fn score(
    args: &Args,
    set: &EvalSet,
    out: &Path,
    labels: Vec<String>,
    decoded: Vec<Decoded>,
    plans: &[Plan],
    baseline: Option<usize>,
) -> Result<Report> {
    let samples = args.bootstrap_samples;
    let mut jobs: Vec<Job> = plans
        .iter()
        .flat_map(Plan::subsets)
        .map(|(p, ter)| Job::single(&p.references, &p.hypotheses, samples, ter))
        .collect();
    let singles = jobs.len();
    let paired_jobs = match baseline {
        Some(b) => paired_jobs(&set.name, &decoded, plans, b, samples)?,
        None => Vec::new(),
    };
    jobs.extend(paired_jobs.iter().map(|p| p.job.clone()));
    eprintln!("nmt-eval: scoring {} subsets with sacrebleu", jobs.len());
    let outputs = sacrebleu::run(&args.python, &jobs)?;
    let parsed = outputs[..singles]
        .iter()
        .map(|o| sacrebleu::parse_single(o))
        .collect::<Result<Vec<_>>>()?;
    let signatures = parsed[0].signatures.clone();
    let mut parsed = parsed.into_iter();
    let mut systems = Vec::new();
    for ((label, d), plan) in labels.iter().zip(decoded).zip(plans) {
        let n = plan.subsets().len();
        systems.push(system_report(
            label,
            d,
            plan,
            parsed.by_ref().take(n).collect(),
        ));
    }
    let paired = match baseline {
        Some(b) => Some(paired_report(
            &labels,
            b,
            &outputs[singles..],
            &paired_jobs,
            samples,
        )?),
        None => None,
    };
    check_version(&signatures);
    Ok(Report {
        tool: format!("nmt-eval {}", env!("CARGO_PKG_VERSION")),
        set: SetInfo {
            name: set.name.clone(),
            source: set.source.clone(),
            reference: set.reference.clone(),
            reference_file: out.join(format!("{}.ref", set.name)),
            sentences: set.data.len(),
            concat: set.concat.as_ref().map(|c| c.path.clone()),
        },
        decoding: decoding(args)?,
        sacrebleu: SacrebleuInfo {
            signatures,
            bootstrap_samples: samples,
            commands: jobs.iter().map(Job::command_line).collect(),
        },
        systems,
        paired_bootstrap: paired,
    })
}

fn decoding(args: &Args) -> Result<Decoding> {
    let limits = args.decoding.limits()?;
    Ok(Decoding {
        batch_size: args.batch_size,
        max_length_ratio: limits.max_length_ratio,
        max_length_offset: limits.max_length_offset,
        runaway_ratio: limits.runaway_ratio,
        no_repeat_ngram_size: limits.no_repeat_ngram_size,
        placeholder_masking: !args.decoding.no_placeholder_masking,
        beyond_input_limit: args.beyond_input_limit,
        length_ask: length_ask(args),
        bucket_edges: args.bucket_edges.clone(),
    })
}

/// The length flags as the request fields they stand for.
fn length_ask(args: &Args) -> Option<String> {
    let mut fields = Vec::new();
    match args.target_length {
        Some(EvalTargetLength::Reference) => fields.push(format!(
            "`target_length` = {} × the reference's subwords",
            args.reference_length_scale
        )),
        Some(EvalTargetLength::Ask(asked)) => fields.push(format!(
            "`target_length` {}",
            serde_json::to_string(&asked).expect("a target length serializes")
        )),
        None => {}
    }
    let chars = |name: &str, asked: EvalChars| match asked {
        EvalChars::Reference => format!(
            "`{name}` = {} × the reference's characters",
            args.reference_length_scale
        ),
        EvalChars::Ask(asked) => format!(
            "`{name}` {}",
            serde_json::to_string(&asked).expect("a length serializes")
        ),
    };
    if let Some(asked) = args.max_chars {
        fields.push(chars("max_chars", asked));
    }
    if let Some(asked) = args.target_chars {
        fields.push(chars("target_chars", asked));
    }
    if fields.is_empty() {
        return None;
    }
    let mode = match args.length_mode {
        LengthMode::Soft => "soft".to_string(),
        LengthMode::Exact => match args.decoding.exact_plans {
            0 => "exact (no closer: `--exact-plans 0`)".to_string(),
            n => format!(
                "exact (a text that ends in sentence punctuation ended on it, in {n} rows \
                 planned around its count: `--exact-plans`)"
            ),
        },
    };
    fields.push(format!("`length_mode` {mode}"));
    Some(fields.join(", "))
}

fn check_version(signatures: &Signatures) {
    let expected = format!("version:{}", sacrebleu::EXPECTED_VERSION);
    if !signatures.bleu.ends_with(&expected) {
        eprintln!(
            "nmt-eval: warning: sacrebleu's signature is {:?}, not {}; scores may not compare",
            signatures.bleu, expected
        );
    }
}

/// What one paired bootstrap compares the packages on.
enum Subset {
    Whole,
    Bucket(String),
    Concat(usize),
}

struct PairedJob {
    subset: Subset,
    sentences: usize,
    job: Job,
}

/// The paired bootstrap's jobs, one sacrebleu call with every system per subset: the whole
/// set (with TER), each of the baseline's buckets and each long-input group size, translated
/// joined (BLEU and chrF: see [`Job::single`] on TER).
fn paired_jobs(
    set_name: &str,
    decoded: &[Decoded],
    plans: &[Plan],
    b: usize,
    samples: usize,
) -> Result<Vec<PairedJob>> {
    let others: Vec<usize> = (0..plans.len()).filter(|&i| i != b).collect();
    let base = &plans[b];
    let whole: Vec<PathBuf> = others
        .iter()
        .map(|&i| plans[i].overall.hypotheses.clone())
        .collect();
    let (reference, hypotheses) = (&base.overall.references, &base.overall.hypotheses);
    let mut jobs = vec![PairedJob {
        subset: Subset::Whole,
        sentences: base.overall.counts.sentences,
        job: Job::paired(reference, hypotheses, &whole, samples, true),
    }];
    for (label, rows, pending) in &base.buckets {
        let systems = others
            .iter()
            .map(|&i| bucket_hypotheses(set_name, &plans[i], &decoded[i], label, rows))
            .collect::<Result<Vec<_>>>()?;
        let (reference, hypotheses) = (&pending.references, &pending.hypotheses);
        jobs.push(PairedJob {
            subset: Subset::Bucket(label.clone()),
            sentences: rows.len(),
            job: Job::paired(reference, hypotheses, &systems, samples, false),
        });
    }
    for (n, joined, _) in &base.concat {
        let systems = others
            .iter()
            .map(|&i| {
                let found = plans[i].concat.iter().find(|(m, ..)| m == n);
                found
                    .map(|(_, j, _)| j.hypotheses.clone())
                    .with_context(|| format!("a package has no {n}-verse groups"))
            })
            .collect::<Result<Vec<_>>>()?;
        jobs.push(PairedJob {
            subset: Subset::Concat(*n),
            sentences: joined.counts.sentences,
            job: Job::paired(
                &joined.references,
                &joined.hypotheses,
                &systems,
                samples,
                false,
            ),
        });
    }
    Ok(jobs)
}

/// A package's outputs for the sentences the baseline put in bucket `label`: its own bucket
/// file when its tokenizer put the same sentences there. A package with another tokenizer
/// may count a sentence into another bucket, and a paired comparison needs the same
/// sentences on both sides, so its outputs for the baseline's rows get a file of their own.
fn bucket_hypotheses(
    set_name: &str,
    plan: &Plan,
    decoded: &Decoded,
    label: &str,
    rows: &[usize],
) -> Result<PathBuf> {
    if let Some((.., p)) = plan
        .buckets
        .iter()
        .find(|(l, r, _)| l == label && r == rows)
    {
        return Ok(p.hypotheses.clone());
    }
    let path = plan
        .dir
        .join(format!("by-length/{set_name}.{label}.baseline-rows.hyp"));
    let texts = rows.iter().map(|&i| decoded.translations[i].text.as_str());
    write_lines(&path, texts)?;
    Ok(path)
}

fn paired_report(
    labels: &[String],
    baseline: usize,
    outputs: &[String],
    jobs: &[PairedJob],
    samples: usize,
) -> Result<PairedReport> {
    // sacrebleu answers the baseline first, then the systems in the order given.
    let order: Vec<usize> = std::iter::once(baseline)
        .chain((0..labels.len()).filter(|&i| i != baseline))
        .collect();
    let mut results = Vec::new();
    for output in outputs {
        let r: Vec<PairedSystem> = sacrebleu::parse_paired(output)?;
        ensure!(
            r.len() == order.len(),
            "sacrebleu's paired bootstrap gave {} systems for {}",
            r.len(),
            order.len()
        );
        results.push(r);
    }
    let whole = &results[0];
    let base_ter = whole[0]
        .ter
        .clone()
        .context("no TER in the paired bootstrap")?;
    let systems = order
        .iter()
        .zip(whole)
        .map(|(&i, r)| {
            Ok(PairedEntry {
                label: labels[i].clone(),
                bleu: Compared::new(r.bleu.clone(), &whole[0].bleu),
                chrf: Compared::new(r.chrf.clone(), &whole[0].chrf),
                ter: Compared::new(r.ter.clone().context("no TER")?, &base_ter),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut report = PairedReport {
        baseline: labels[baseline].clone(),
        samples,
        significance_level: report::SIGNIFICANCE_LEVEL,
        systems,
        by_bucket: Vec::new(),
        by_n_verses: Vec::new(),
    };
    for (job, r) in jobs.iter().zip(&results).skip(1) {
        for (&i, system) in order.iter().zip(r).skip(1) {
            let paired = SubsetPaired::new(&labels[i], job.sentences, system, &r[0])
                .context("no p-value in the paired bootstrap")?;
            match &job.subset {
                Subset::Bucket(bucket) => report.by_bucket.push(BucketPaired {
                    bucket: bucket.clone(),
                    paired,
                }),
                Subset::Concat(n_verses) => report.by_n_verses.push(ConcatPaired {
                    n_verses: *n_verses,
                    paired,
                }),
                Subset::Whole => {}
            }
        }
    }
    Ok(report)
}

fn write_report(args: &Args, report: &Report, out: &Path) -> Result<()> {
    let json = serde_json::to_string_pretty(report)?;
    fs::write(out.join("report.json"), json + "\n")?;
    let markdown = report::render_markdown(report);
    fs::write(out.join("report.md"), &markdown)?;
    println!("{markdown}");
    match crate::plot::write_plots(report, out, &args.font) {
        Ok(files) => eprintln!(
            "nmt-eval: wrote {} plots and the report to {}",
            files,
            out.display()
        ),
        Err(e) => eprintln!("nmt-eval: warning: no plots: {e:#}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn translation(text: &str, source_tokens: usize) -> Translation {
        Translation {
            text: text.into(),
            source_tokens,
            output_tokens: 1,
            outcome: Outcome::Eos,
            target_length: None,
            length_source: None,
            predicted_length: None,
            length_mode: None,
            truncated: false,
            candidates: Vec::new(),
        }
    }

    #[test]
    fn a_package_that_buckets_otherwise_is_compared_on_the_baselines_rows() {
        let dir = tempfile::tempdir().unwrap();
        let decoded = Decoded {
            info: PackageInfo {
                dir: "p".into(),
                name: "p".into(),
                preset: "transformer".into(),
                source_language: "en".into(),
                execution_provider: "CPU".into(),
                precision: Default::default(),
                input_limit: 127,
                max_output_tokens: 256,
            },
            // Its tokenizer puts sentence 1 in `33+`, where the baseline's has it in `1-32`.
            translations: vec![translation("uno", 10), translation("dos", 40)],
            reference_subwords: vec![1, 1],
            seconds: 1.0,
            concat: Vec::new(),
        };
        fs::create_dir_all(dir.path().join("by-length")).unwrap();
        let edges: BucketEdges = "32".parse().unwrap();
        let refs = ["a".to_string(), "b".to_string()];
        let bucket = |label: &str, rows: Vec<usize>| {
            let stem = format!("by-length/test.{label}");
            let t = &decoded.translations;
            let pending = write_subset(dir.path(), &stem, &rows, t, &refs, &[1, 1]).unwrap();
            (label.to_string(), rows, pending)
        };
        let plan = Plan {
            dir: dir.path().to_path_buf(),
            overall: write_subset(
                dir.path(),
                "test",
                &[0, 1],
                &decoded.translations,
                &refs,
                &[1, 1],
            )
            .unwrap(),
            buckets: vec![bucket("1-32", vec![0]), bucket("33+", vec![1])],
            concat: Vec::new(),
        };
        assert_eq!(stats::by_bucket(&decoded.translations, &edges).len(), 2);
        let same = bucket_hypotheses("test", &plan, &decoded, "1-32", &[0]).unwrap();
        assert_eq!(same, plan.buckets[0].2.hypotheses);
        let other = bucket_hypotheses("test", &plan, &decoded, "1-32", &[0, 1]).unwrap();
        assert!(other.ends_with("by-length/test.1-32.baseline-rows.hyp"));
        assert_eq!(fs::read_to_string(other).unwrap(), "uno\ndos\n");
    }
}
