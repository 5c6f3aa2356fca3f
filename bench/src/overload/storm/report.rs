//! The storm report: how each run's requests ended, as a Markdown table (stdout, `--out-md`)
//! and JSON (`--out-json`), every run with how it was made.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::overload::report::{isa_flags, load_average};
use crate::report::Document;
use crate::single_server::RunHeader;
use crate::stats::percentile;

/// How one request ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// 200, from the model of that name.
    Answered { model: String },
    /// Refused at the door (a 4xx, or 503) with its error type and message, and its
    /// `Retry-After`.
    Refused {
        status: u16,
        error_type: String,
        message: String,
        retry_after: Option<Duration>,
    },
    /// Accepted, then not answered within the server's request timeout: 504.
    TimedOut,
    /// Accepted, then another server error (500, ...).
    Error { status: u16, error_type: String },
    /// No HTTP answer: the bench's own timeout, or the connection, by kind.
    Failed(String),
}

impl Outcome {
    /// The outcome of an answer with `status`, `Retry-After` and `body`.
    pub fn of(status: u16, retry_after: Option<Duration>, body: &[u8]) -> Self {
        let json: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let field = |name: &str| json[name].as_str().unwrap_or_default().to_string();
        match status {
            200 => Outcome::Answered {
                model: field("model"),
            },
            504 => Outcome::TimedOut,
            400..=499 | 503 => Outcome::Refused {
                status,
                error_type: field("error_type"),
                message: field("error"),
                retry_after,
            },
            _ => Outcome::Error {
                status,
                error_type: field("error_type"),
            },
        }
    }
}

/// One request: when it was sent (seconds into the run), how long it took, how it ended.
#[derive(Debug, Clone)]
pub struct Sample {
    pub sent_at: f64,
    pub latency: f64,
    pub outcome: Outcome,
}

/// What the clients sent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StormLoad {
    pub clients: usize,
    /// Texts per request.
    pub texts: usize,
    /// Subwords per text, when the texts were made to a length; verses otherwise.
    pub subwords: Option<usize>,
    /// Whether refused clients waited their `Retry-After`.
    pub polite: bool,
    pub verses_file: String,
    /// Fields every request carried beside `text`.
    pub request_fields: Option<serde_json::Value>,
}

impl StormLoad {
    /// `64 texts of test.en (longest first)` or `64 texts x 1024 subwords`.
    pub fn describe(&self) -> String {
        match self.subwords {
            Some(subwords) => format!("{} texts x {subwords} subwords", self.texts),
            None => {
                let file = std::path::Path::new(&self.verses_file)
                    .file_name()
                    .map_or(self.verses_file.clone(), |f| {
                        f.to_string_lossy().into_owned()
                    });
                format!("{} texts of {file} (longest first)", self.texts)
            }
        }
    }
}

/// One run's numbers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StormRun {
    pub label: String,
    /// Date, command line, machine, server and model.
    #[serde(flatten)]
    pub header: RunHeader,
    /// The instruction sets that decide the model's kernels (`tools/nmt_tools/machine.py`).
    pub isa_flags: Vec<String>,
    pub load: StormLoad,
    /// Seconds the clients sent for.
    pub seconds: f64,
    /// From the first request to the last answer.
    pub wall_seconds: f64,
    pub sent: usize,
    /// Not refused at the door: answered, timed out or failed after acceptance.
    pub accepted: usize,
    pub answered: usize,
    /// Accepted, then 504 (or no answer within the bench's own timeout).
    pub timed_out_after_acceptance: usize,
    /// Refusals at the door by `STATUS error_type`.
    pub refused: BTreeMap<String, usize>,
    /// The first message of each kind of refusal.
    pub refusal_messages: BTreeMap<String, String>,
    /// Other outcomes by kind (`500 internal`, `connect`).
    pub other: BTreeMap<String, usize>,
    /// Latency of the answered requests, in seconds (nearest rank).
    pub p50_s: Option<f64>,
    pub p90_s: Option<f64>,
    pub p99_s: Option<f64>,
    pub max_s: Option<f64>,
    /// The median `Retry-After` of the 429s, in seconds.
    pub retry_after_median_s: Option<f64>,
    /// Answered requests, and their texts, per second of the wall time.
    pub answered_per_second: f64,
    pub texts_per_second: f64,
    /// The 1-minute load average at the end (server and clients account for up to about 2).
    pub load_average: Option<f64>,
}

impl StormRun {
    /// Sums up `samples`, sent over `(seconds, wall_seconds)`.
    pub fn summarize(
        label: &str,
        mut header: RunHeader,
        load: StormLoad,
        samples: &[Sample],
        (seconds, wall_seconds): (f64, f64),
    ) -> Self {
        if header.model.is_none() {
            header.model = samples.iter().find_map(|s| match &s.outcome {
                Outcome::Answered { model } if !model.is_empty() => Some(model.clone()),
                _ => None,
            });
        }
        let mut run = StormRun {
            label: label.to_string(),
            header,
            isa_flags: isa_flags(),
            load,
            seconds,
            wall_seconds,
            sent: samples.len(),
            accepted: 0,
            answered: 0,
            timed_out_after_acceptance: 0,
            refused: BTreeMap::new(),
            refusal_messages: BTreeMap::new(),
            other: BTreeMap::new(),
            p50_s: None,
            p90_s: None,
            p99_s: None,
            max_s: None,
            retry_after_median_s: None,
            answered_per_second: 0.0,
            texts_per_second: 0.0,
            load_average: load_average(),
        };
        run.count(samples);
        run.times(samples);
        run
    }

    /// Counts the outcomes.
    fn count(&mut self, samples: &[Sample]) {
        for sample in samples {
            match &sample.outcome {
                Outcome::Answered { .. } => self.answered += 1,
                Outcome::TimedOut => self.timed_out_after_acceptance += 1,
                Outcome::Refused {
                    status,
                    error_type,
                    message,
                    ..
                } => {
                    let kind = format!("{status} {error_type}");
                    self.refusal_messages
                        .entry(kind.clone())
                        .or_insert_with(|| message.clone());
                    *self.refused.entry(kind).or_default() += 1;
                }
                Outcome::Error { status, error_type } => {
                    *self
                        .other
                        .entry(format!("{status} {error_type}"))
                        .or_default() += 1;
                }
                // The bench's own timeout is longer than the server's: an accepted request
                // that was never answered.
                Outcome::Failed(kind) if kind == "timeout" => self.timed_out_after_acceptance += 1,
                Outcome::Failed(kind) => *self.other.entry(kind.clone()).or_default() += 1,
            }
        }
        let refused: usize = self.refused.values().sum();
        let lost: usize = self
            .other
            .iter()
            .filter(|(kind, _)| !kind.starts_with(|c: char| c.is_ascii_digit()))
            .map(|(_, n)| n)
            .sum();
        self.accepted = self.sent - refused - lost;
    }

    /// Latency percentiles, `Retry-After`, and goodput.
    fn times(&mut self, samples: &[Sample]) {
        let mut answered: Vec<f64> = samples
            .iter()
            .filter(|s| matches!(s.outcome, Outcome::Answered { .. }))
            .map(|s| s.latency)
            .collect();
        answered.sort_by(f64::total_cmp);
        self.p50_s = percentile(&answered, 50.0);
        self.p90_s = percentile(&answered, 90.0);
        self.p99_s = percentile(&answered, 99.0);
        self.max_s = answered.last().copied();
        let mut retry: Vec<f64> = samples
            .iter()
            .filter_map(|s| match &s.outcome {
                Outcome::Refused {
                    status: 429,
                    retry_after: Some(r),
                    ..
                } => Some(r.as_secs_f64()),
                _ => None,
            })
            .collect();
        retry.sort_by(f64::total_cmp);
        self.retry_after_median_s = percentile(&retry, 50.0);
        if self.wall_seconds > 0.0 {
            self.answered_per_second = self.answered as f64 / self.wall_seconds;
            self.texts_per_second = self.answered_per_second * self.load.texts as f64;
        }
    }

    /// One line for stderr.
    pub fn line(&self) -> String {
        format!(
            "{}: {} sent, {} accepted, {} answered, {} timed out after acceptance, refused {:?}, \
             p99 {} s, {:.1} texts/s",
            self.label,
            self.sent,
            self.accepted,
            self.answered,
            self.timed_out_after_acceptance,
            self.refused,
            seconds(self.p99_s),
            self.texts_per_second
        )
    }
}

/// Every run reported so far, in the order they ran.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StormReport {
    pub runs: Vec<StormRun>,
}

impl StormReport {
    pub fn with_run(mut runs: Vec<StormRun>, run: StormRun) -> Self {
        runs.push(run);
        StormReport { runs }
    }
}

impl Document for StormReport {
    const TABLES: fn(&Self) -> String = tables;
    const MARKDOWN: fn(&Self) -> String = markdown;
}

fn seconds(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.1}"))
}

/// `429 overloaded: 12, 413 request_too_costly: 3`, or `-`.
fn kinds(counts: &BTreeMap<String, usize>) -> String {
    if counts.is_empty() {
        return "-".into();
    }
    counts
        .iter()
        .map(|(kind, n)| format!("{kind}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The runs' table.
pub fn tables(report: &StormReport) -> String {
    let mut s = String::from(
        "| run | load | clients | sent | accepted | answered | accepted, then timed out | refused | other | answered p50 / p99 / max s | answered texts/s |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |\n",
    );
    for run in &report.runs {
        let _ = writeln!(
            s,
            "| {} | {}{} | {} | {} | {} | {} | **{}** | {} | {} | {} / {} / {} | {:.1} |",
            run.label,
            run.load.describe(),
            if run.load.polite { ", polite" } else { "" },
            run.load.clients,
            run.sent,
            run.accepted,
            run.answered,
            run.timed_out_after_acceptance,
            kinds(&run.refused),
            kinds(&run.other),
            seconds(run.p50_s),
            seconds(run.p99_s),
            seconds(run.max_s),
            run.texts_per_second,
        );
    }
    s
}

/// The Markdown document: what the columns mean, the table, then how each run was made.
pub fn markdown(report: &StormReport) -> String {
    let mut s = String::from(
        "# nmt-bench storm: closed-loop clients of maximal requests\n\n\
         Every client sends a request of many texts, and its next one as soon as the last came \
         back (polite clients first wait the `Retry-After` of a 429), for the run's sending \
         time; the requests in flight then are followed to their end. Accepted: not refused at \
         the door (429, 413, another 4xx, 503) nor lost connecting. Accepted, then timed out: \
         the server's 504 after its request timeout (or no answer within the bench's own). \
         Latency: of the answered requests, from sending to the whole answer. Answered texts/s: \
         the answered requests' texts over the wall time, first request to last answer.\n\n",
    );
    s.push_str(&tables(report));
    s.push_str("\n## How each run was made\n");
    for run in &report.runs {
        let _ = writeln!(s, "\n### {}\n", run.label);
        run.header.write_markdown(&mut s);
        let _ = writeln!(
            s,
            "- ISA flags: {}",
            if run.isa_flags.is_empty() {
                "none read".to_string()
            } else {
                run.isa_flags.join(", ")
            }
        );
        let _ = writeln!(
            s,
            "- load: {} clients x {}{}, texts from {}; {} s of sending, {:.0} s in all; load average after {}",
            run.load.clients,
            run.load.describe(),
            if run.load.polite { ", polite (Retry-After honoured)" } else { "" },
            run.load.verses_file,
            run.seconds,
            run.wall_seconds,
            run.load_average.map_or("-".into(), |l| format!("{l:.2}")),
        );
        if let Some(median) = run.retry_after_median_s {
            let _ = writeln!(s, "- Retry-After of the 429s: median {median:.0} s");
        }
        for (kind, message) in &run.refusal_messages {
            let _ = writeln!(s, "- first `{kind}`: \"{message}\"");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(latency: f64, outcome: Outcome) -> Sample {
        Sample {
            sent_at: 0.0,
            latency,
            outcome,
        }
    }

    fn refused(status: u16, error_type: &str, retry_after: Option<u64>) -> Outcome {
        Outcome::Refused {
            status,
            error_type: error_type.into(),
            message: format!("{error_type} because"),
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    fn load() -> StormLoad {
        StormLoad {
            clients: 48,
            texts: 64,
            subwords: None,
            polite: false,
            verses_file: "verses.en".into(),
            request_fields: None,
        }
    }

    #[test]
    fn outcomes_by_status() {
        let body = br#"{"error": "busy", "error_type": "overloaded"}"#;
        assert_eq!(
            Outcome::of(429, Some(Duration::from_secs(3)), body),
            Outcome::Refused {
                status: 429,
                error_type: "overloaded".into(),
                message: "busy".into(),
                retry_after: Some(Duration::from_secs(3)),
            }
        );
        assert_eq!(Outcome::of(504, None, b"{}"), Outcome::TimedOut);
        assert_eq!(
            Outcome::of(200, None, br#"{"model": "m", "translations": []}"#),
            Outcome::Answered { model: "m".into() }
        );
        assert!(matches!(
            Outcome::of(500, None, b"not json"),
            Outcome::Error { status: 500, .. }
        ));
    }

    #[test]
    fn a_run_counts_what_the_door_took_and_how_it_ended() {
        let answered = |latency| sample(latency, Outcome::Answered { model: "m".into() });
        let samples = vec![
            answered(2.0),
            answered(4.0),
            sample(30.0, Outcome::TimedOut),
            sample(120.0, Outcome::Failed("timeout".into())),
            sample(0.01, refused(429, "overloaded", Some(5))),
            sample(0.01, refused(429, "overloaded", Some(9))),
            sample(0.01, refused(413, "request_too_costly", None)),
            sample(0.0, Outcome::Failed("connect".into())),
            sample(
                1.0,
                Outcome::Error {
                    status: 500,
                    error_type: "internal".into(),
                },
            ),
        ];
        let header = RunHeader::for_tests("nmt-bench storm", &[], None);
        let run = StormRun::summarize("after", header, load(), &samples, (60.0, 80.0));
        assert_eq!(run.header.model.as_deref(), Some("m"));
        assert_eq!((run.sent, run.accepted, run.answered), (9, 5, 2));
        assert_eq!(run.timed_out_after_acceptance, 2);
        assert_eq!(run.refused["429 overloaded"], 2);
        assert_eq!(run.refused["413 request_too_costly"], 1);
        assert_eq!(
            run.refusal_messages["413 request_too_costly"],
            "request_too_costly because"
        );
        assert_eq!((run.other["connect"], run.other["500 internal"]), (1, 1));
        assert_eq!((run.p50_s, run.max_s), (Some(2.0), Some(4.0)));
        assert_eq!(run.retry_after_median_s, Some(5.0));
        assert!((run.texts_per_second - 2.0 * 64.0 / 80.0).abs() < 1e-9);
        let report = StormReport::with_run(Vec::new(), run);
        let table = tables(&report);
        assert!(
            table.contains("| after | 64 texts of verses.en (longest first) | 48 | 9 | 5 | 2 | **2** | 413 request_too_costly: 1, 429 overloaded: 2 |"),
            "{table}"
        );
        // A report reads back as it was written, to be appended to.
        let json = serde_json::to_string(&report).unwrap();
        let back: StormReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back.runs[0].load, report.runs[0].load);
        assert!(markdown(&back).contains("first `413 request_too_costly`"));
    }
}
