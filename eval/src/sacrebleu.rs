//! Scoring with sacrebleu's own command line, not a re-implementation: the field trusts its
//! signatures. Every scoring job is one sacrebleu command line (`REF -i HYP -m bleu chrf ter
//! -f json --confidence`, or `--paired-bs` with several systems); the jobs of a run go to one
//! Python process (`sacrebleu_cli.py`) that calls sacrebleu's `main` once per job.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

const RUNNER: &str = include_str!("sacrebleu_cli.py");
/// The version whose signatures this tool's reports are meant to carry.
pub const EXPECTED_VERSION: &str = "2.6.0";
/// Decimals sacrebleu prints (`-w`).
const WIDTH: &str = "2";

/// A scoring job: the arguments of one sacrebleu command line.
#[derive(Clone, Debug, PartialEq)]
pub struct Job(pub Vec<String>);

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

impl Job {
    /// BLEU, chrF and (with `ter`) TER of one system, with bootstrap confidence intervals.
    /// sacrebleu's TER is pure Python with a shift search: on the long-input set, whose
    /// looping outputs run to hundreds of words, it takes minutes where BLEU takes a second.
    pub fn single(reference: &Path, hypothesis: &Path, samples: usize, ter: bool) -> Job {
        let mut args = vec![path(reference), "-i".into(), path(hypothesis)];
        args.extend(common_args(ter));
        args.extend(["--confidence".into(), "--confidence-n".into()]);
        args.push(samples.to_string());
        Job(args)
    }

    /// sacrebleu's paired bootstrap of `systems` against `baseline` (files with distinct
    /// paths: sacrebleu drops a system named like the baseline), TER only with `ter` (see
    /// [`Job::single`]).
    pub fn paired(
        reference: &Path,
        baseline: &Path,
        systems: &[PathBuf],
        samples: usize,
        ter: bool,
    ) -> Job {
        let mut args = vec![path(reference), "-i".into(), path(baseline)];
        args.extend(systems.iter().map(|s| path(s)));
        args.extend(common_args(ter));
        args.extend(["--paired-bs".into(), "--paired-bs-n".into()]);
        args.push(samples.to_string());
        Job(args)
    }

    /// The job as a shell command a reader can rerun.
    pub fn command_line(&self) -> String {
        format!("python3 -m sacrebleu {}", self.0.join(" "))
    }
}

fn common_args(ter: bool) -> Vec<String> {
    let metrics: &[&str] = if ter {
        &["bleu", "chrf", "ter"]
    } else {
        &["bleu", "chrf"]
    };
    let mut args = vec!["-m".to_string()];
    args.extend(metrics.iter().map(|m| m.to_string()));
    args.extend(["-f", "json", "-w", WIDTH, "-q"].map(String::from));
    args
}

/// Runs every job with `python`; returns each job's standard output (JSON).
pub fn run(python: &Path, jobs: &[Job]) -> Result<Vec<String>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let mut child = Command::new(python)
        .args(["-c", RUNNER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} for sacrebleu", python.display()))?;
    let input = serde_json::to_vec(&jobs.iter().map(|j| &j.0).collect::<Vec<_>>())?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(&input)
        .context("sending the scoring jobs to sacrebleu")?;
    let output = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        output.status.success(),
        "sacrebleu failed ({}): {stderr}\n(scripts/setup.sh installs sacrebleu=={EXPECTED_VERSION})",
        output.status
    );
    #[derive(Deserialize)]
    struct Answer {
        exit: i32,
        stdout: String,
    }
    let answers: Vec<Answer> = serde_json::from_slice(&output.stdout)
        .with_context(|| format!("reading sacrebleu's answers; its stderr: {stderr}"))?;
    ensure!(
        answers.len() == jobs.len(),
        "sacrebleu answered {} of {} jobs",
        answers.len(),
        jobs.len()
    );
    jobs.iter()
        .zip(answers)
        .map(|(job, a)| match a.exit {
            0 => Ok(a.stdout),
            code => bail!("`{}` exited {code}: {stderr}", job.command_line()),
        })
        .collect()
}

/// One metric's corpus score, and its bootstrap mean and 95% confidence half-width.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Metric {
    pub score: f64,
    pub mean: Option<f64>,
    pub ci: Option<f64>,
}

/// sacrebleu's signature per metric.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Signatures {
    pub bleu: String,
    pub chrf: String,
    pub ter: String,
}

/// A single-system result.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Scores {
    pub bleu: Metric,
    pub chrf: Metric,
    /// `None` where TER was not asked for (the long-input set).
    pub ter: Option<Metric>,
    /// System over reference length in BLEU's tokens, as sacrebleu reports it.
    pub length_ratio: f64,
    pub hyp_len: u64,
    pub ref_len: u64,
    #[serde(skip)]
    pub signatures: Signatures,
}

fn by_name<'a>(entries: &'a [Value], prefix: &str) -> Result<&'a Value> {
    entries
        .iter()
        .find(|e| e["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .with_context(|| format!("no {prefix} in sacrebleu's output"))
}

fn metric(entry: &Value) -> Result<Metric> {
    Ok(Metric {
        score: entry["score"].as_f64().context("no score")?,
        mean: entry["confidence_mean"].as_f64(),
        ci: entry["confidence_var"].as_f64(),
    })
}

/// The number after `key = ` in BLEU's verbose score.
fn verbose_field(verbose: &str, key: &str) -> Result<f64> {
    let pattern = format!("{key} = ");
    let start = verbose
        .find(&pattern)
        .with_context(|| format!("no `{key}` in {verbose:?}"))?
        + pattern.len();
    let value: String = verbose[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    value
        .parse()
        .with_context(|| format!("`{key}` in {verbose:?}"))
}

/// Parses the JSON of a [`Job::single`].
pub fn parse_single(stdout: &str) -> Result<Scores> {
    let entries: Vec<Value> = serde_json::from_str(stdout).context("sacrebleu's JSON")?;
    let (bleu, chrf) = (by_name(&entries, "BLEU")?, by_name(&entries, "chrF")?);
    let ter = by_name(&entries, "TER").ok();
    let verbose = bleu["verbose_score"]
        .as_str()
        .context("no BLEU verbose_score")?;
    let signature = |e: &Value| e["signature"].as_str().unwrap_or_default().to_string();
    Ok(Scores {
        bleu: metric(bleu)?,
        chrf: metric(chrf)?,
        ter: ter.map(metric).transpose()?,
        length_ratio: verbose_field(verbose, "ratio")?,
        hyp_len: verbose_field(verbose, "hyp_len")? as u64,
        ref_len: verbose_field(verbose, "ref_len")? as u64,
        signatures: Signatures {
            bleu: signature(bleu),
            chrf: signature(chrf),
            ter: ter.map(signature).unwrap_or_default(),
        },
    })
}

/// One metric of the paired bootstrap for one system.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PairedMetric {
    pub score: f64,
    /// Bootstrap mean and 95% confidence half-width.
    pub mean: f64,
    pub ci: f64,
    /// sacrebleu's p-value; `None` for the baseline.
    pub p_value: Option<f64>,
}

/// One system of the paired bootstrap (the baseline first).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PairedSystem {
    pub bleu: PairedMetric,
    pub chrf: PairedMetric,
    /// `None` where TER was not asked for.
    pub ter: Option<PairedMetric>,
}

fn paired_metric(system: &Value, prefix: &str) -> Result<PairedMetric> {
    let (_, m) = system
        .as_object()
        .context("a paired result is not an object")?
        .iter()
        .find(|(k, _)| k.starts_with(prefix))
        .with_context(|| format!("no {prefix} in a paired result"))?;
    Ok(PairedMetric {
        score: m["score"].as_f64().context("no score")?,
        mean: m["mean"].as_f64().context("no mean")?,
        ci: m["ci"].as_f64().context("no ci")?,
        p_value: m["p_value"].as_f64(),
    })
}

/// Parses the JSON of a [`Job::paired`]: the baseline, then the systems in order.
pub fn parse_paired(stdout: &str) -> Result<Vec<PairedSystem>> {
    let systems: Vec<Value> = serde_json::from_str(stdout).context("sacrebleu's JSON")?;
    systems
        .iter()
        .map(|s| {
            Ok(PairedSystem {
                bleu: paired_metric(s, "BLEU")?,
                chrf: paired_metric(s, "chrF")?,
                ter: paired_metric(s, "TER").ok(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // sacrebleu 2.6.0's output for a 20-line system, trimmed to the fields read.
    const SINGLE: &str = r#"[
{"name": "BLEU", "score": 76.36, "signature": "nrefs:1|bs:1000|seed:12345|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
 "confidence_mean": 76.21, "confidence_var": 5.94,
 "verbose_score": "90.5/80.7/72.0/64.7 (BP = 1.000 ratio = 1.002 hyp_len = 633 ref_len = 632)"},
{"name": "chrF2", "score": 89.07, "signature": "nrefs:1|chrf"},
{"name": "TER", "score": 10.89, "signature": "nrefs:1|ter", "confidence_mean": 10.96, "confidence_var": 2.82}
]"#;

    #[test]
    fn reads_sacrebleus_single_system_json() {
        let s = parse_single(SINGLE).unwrap();
        assert_eq!(s.bleu.score, 76.36);
        assert_eq!(s.bleu.ci, Some(5.94));
        assert_eq!(s.chrf.mean, None);
        assert_eq!(s.ter.unwrap().mean, Some(10.96));
        assert_eq!((s.hyp_len, s.ref_len, s.length_ratio), (633, 632, 1.002));
        assert!(s.signatures.bleu.ends_with("version:2.6.0"));
        assert!(parse_single("[]").is_err());
        let without_ter = SINGLE.replace("\"TER\"", "\"other\"");
        assert_eq!(parse_single(&without_ter).unwrap().ter, None);
    }

    #[test]
    fn jobs_are_sacrebleu_command_lines() {
        let job = Job::single(Path::new("r"), Path::new("h"), 100, true);
        assert_eq!(
            job.command_line(),
            "python3 -m sacrebleu r -i h -m bleu chrf ter -f json -w 2 -q --confidence --confidence-n 100"
        );
        let paired = Job::paired(Path::new("r"), Path::new("b"), &["s".into()], 10, true);
        assert!(paired
            .command_line()
            .contains("r -i b s -m bleu chrf ter -f"));
        let no_ter = Job::single(Path::new("r"), Path::new("h"), 100, false);
        assert!(no_ter.command_line().contains("-m bleu chrf -f json"));
        assert!(paired
            .command_line()
            .ends_with("--paired-bs --paired-bs-n 10"));
        let paired = Job::paired(Path::new("r"), Path::new("b"), &["s".into()], 10, false);
        assert!(paired
            .command_line()
            .contains("r -i b s -m bleu chrf -f json"));
    }

    #[test]
    fn reads_the_paired_bootstrap() {
        let json = r#"[{"system": "Baseline: b", "BLEU": {"score": 1.0, "p_value": null, "mean": 1.1, "ci": 0.5},
            "chrF2": {"score": 2.0, "p_value": null, "mean": 2.1, "ci": 0.5},
            "TER": {"score": 3.0, "p_value": null, "mean": 3.1, "ci": 0.5}},
            {"system": "s", "BLEU": {"score": 1.5, "p_value": 0.2, "mean": 1.4, "ci": 0.5},
            "chrF2": {"score": 2.5, "p_value": 0.01, "mean": 2.4, "ci": 0.5},
            "TER": {"score": 3.5, "p_value": 0.3, "mean": 3.4, "ci": 0.5}}]"#;
        let p = parse_paired(json).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].bleu.p_value, None);
        assert_eq!(p[1].chrf.p_value, Some(0.01));
        assert_eq!(p[1].ter.as_ref().map(|t| t.score), Some(3.5));
        let without_ter = json.replace("\"TER\"", "\"other\"");
        assert_eq!(parse_paired(&without_ter).unwrap()[1].ter, None);
    }
}
