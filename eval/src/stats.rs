//! What the tool counts itself (sacrebleu does the scoring): looping outputs, outputs that hit
//! the length budget, refusals, the spread of output minus reference length, and the
//! source-length buckets.

use std::collections::HashMap;

use nmt_engine::limits::INPUT_LENGTH_BUCKETS;
use serde::Serialize;

use nmt_engine::{Outcome, Translation};

/// A word 3-gram seen this many times makes an output "looping": greedy decoding that
/// repeats itself, the failure that long inputs and missing EOS produce.
pub const LOOP_REPEATS: usize = 3;
const LOOP_NGRAM: usize = 3;

/// Whether some 3-gram of whitespace-separated words occurs at least [`LOOP_REPEATS`] times.
pub fn is_looping(text: &str) -> bool {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut counts: HashMap<&[&str], usize> = HashMap::new();
    words.windows(LOOP_NGRAM).any(|gram| {
        let count = counts.entry(gram).or_default();
        *count += 1;
        *count >= LOOP_REPEATS
    })
}

/// Source-length buckets: inclusive upper bounds in source subwords (EOS not counted), one
/// bucket per edge and an open one past the last. The default is the server's
/// `input_length` buckets, so that a score by length lines up with the latency dashboards.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct BucketEdges(Vec<usize>);

impl Default for BucketEdges {
    fn default() -> Self {
        BucketEdges(
            INPUT_LENGTH_BUCKETS
                .iter()
                .map(|(bound, _)| *bound)
                .filter(|&bound| bound != usize::MAX)
                .collect(),
        )
    }
}

impl std::str::FromStr for BucketEdges {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Err("give at least one edge, e.g. `32`".into());
        }
        let edges = text
            .split(',')
            .map(|e| {
                let e = e.trim();
                match e.parse::<usize>() {
                    Ok(0) => Err("0 is not an edge: the first bucket starts at 1 subword".into()),
                    Ok(n) => Ok(n),
                    Err(_) => Err(format!("{e:?} is not a subword count")),
                }
            })
            .collect::<Result<Vec<usize>, String>>()?;
        if let Some(w) = edges.windows(2).find(|w| w[0] >= w[1]) {
            return Err(format!(
                "edges must increase strictly: {} then {}",
                w[0], w[1]
            ));
        }
        Ok(BucketEdges(edges))
    }
}

impl std::fmt::Display for BucketEdges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let edges: Vec<String> = self.0.iter().map(usize::to_string).collect();
        f.write_str(&edges.join(","))
    }
}

impl BucketEdges {
    pub fn edges(&self) -> &[usize] {
        &self.0
    }

    /// Whether these are the server's `input_length` buckets.
    pub fn are_the_servers(&self) -> bool {
        *self == BucketEdges::default()
    }

    /// The labels in order, in the server's style: `1-16`, `17-32`, ..., `513+`.
    pub fn labels(&self) -> Vec<String> {
        let mut low = 1;
        let mut labels = Vec::new();
        for &edge in &self.0 {
            labels.push(format!("{low}-{edge}"));
            low = edge + 1;
        }
        labels.push(format!("{low}+"));
        labels
    }

    /// The index of the bucket of a text of `tokens` subwords (an empty text is in the first,
    /// as on the server).
    pub fn bucket(&self, tokens: usize) -> usize {
        self.0.partition_point(|&edge| edge < tokens)
    }
}

/// Labels and indices of the sentences in each bucket, in bucket order; empty buckets are
/// left out.
pub fn by_bucket(translations: &[Translation], edges: &BucketEdges) -> Vec<(String, Vec<usize>)> {
    let mut rows = vec![Vec::new(); edges.edges().len() + 1];
    for (i, t) in translations.iter().enumerate() {
        rows[edges.bucket(t.source_tokens)].push(i);
    }
    edges
        .labels()
        .into_iter()
        .zip(rows)
        .filter(|(_, rows)| !rows.is_empty())
        .collect()
}

/// Counts over a set of sentences. Shares and length statistics are over the sentences that
/// were decoded (not refused).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Counts {
    pub sentences: usize,
    pub refused: usize,
    pub looping: usize,
    pub looping_share: f64,
    pub hit_budget: usize,
    pub hit_budget_share: f64,
    pub mean_source_subwords: f64,
    /// Mean of output subwords minus reference subwords (the package's tokenizer).
    pub subword_diff_mean: f64,
    /// Population variance of the same differences.
    pub subword_diff_variance: f64,
    /// Share of outputs whose last character (closing quotes and brackets aside) is
    /// punctuation (`. , ; : ! ?`): outputs that end where a clause can end.
    pub ends_in_punctuation_share: f64,
    /// How well planned lengths were met; `None` when no sentence had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub length_control: Option<LengthControl>,
}

/// Output length against the target length each sentence was decoded for.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LengthControl {
    /// Sentences decoded for a target length.
    pub sentences: usize,
    /// Mean of output minus target subwords.
    pub diff_mean: f64,
    /// Population variance of output minus target subwords.
    pub diff_variance: f64,
    /// Share exactly at the target, within +/-1 and within +/-2 subwords.
    pub exact_share: f64,
    pub within_1_share: f64,
    pub within_2_share: f64,
    /// Outputs cut at a word boundary to meet `max_chars`.
    pub truncated: usize,
    /// Longest output in characters.
    pub max_chars_seen: usize,
}

/// Whether `text` ends in punctuation, closing quotes and brackets aside.
pub fn ends_in_punctuation(text: &str) -> bool {
    text.trim_end()
        .trim_end_matches(['"', '\'', '»', '”', '’', ')', ']'])
        .ends_with(['.', ',', ';', ':', '!', '?'])
}

fn length_control(decoded: &[(&Translation, usize)]) -> Option<LengthControl> {
    let planned: Vec<(&Translation, usize)> = decoded
        .iter()
        .filter_map(|(t, _)| t.target_length.map(|n| (*t, n)))
        .collect();
    if planned.is_empty() {
        return None;
    }
    let diffs: Vec<f64> = planned
        .iter()
        .map(|(t, n)| t.output_tokens as f64 - *n as f64)
        .collect();
    let (diff_mean, diff_variance) = mean_variance(&diffs);
    let within = |k: f64| {
        ratio(
            diffs.iter().filter(|d| d.abs() <= k).count() as f64,
            diffs.len() as f64,
        )
    };
    Some(LengthControl {
        sentences: planned.len(),
        diff_mean,
        diff_variance,
        exact_share: within(0.0),
        within_1_share: within(1.0),
        within_2_share: within(2.0),
        truncated: planned.iter().filter(|(t, _)| t.truncated).count(),
        max_chars_seen: decoded
            .iter()
            .map(|(t, _)| t.text.chars().count())
            .max()
            .unwrap_or(0),
    })
}

/// [`Counts`] of `translations`, given each one's reference length in subwords.
pub fn counts(translations: &[&Translation], reference_subwords: &[usize]) -> Counts {
    assert_eq!(translations.len(), reference_subwords.len());
    let decoded: Vec<(&Translation, usize)> = translations
        .iter()
        .zip(reference_subwords)
        .filter(|(t, _)| t.outcome != Outcome::Refused)
        .map(|(t, &r)| (*t, r))
        .collect();
    let share = |n: usize| ratio(n as f64, decoded.len() as f64);
    let looping = decoded.iter().filter(|(t, _)| is_looping(&t.text)).count();
    let hit_budget = decoded
        .iter()
        .filter(|(t, _)| t.outcome == Outcome::Budget)
        .count();
    let diffs: Vec<f64> = decoded
        .iter()
        .map(|(t, r)| t.output_tokens as f64 - *r as f64)
        .collect();
    let (mean, variance) = mean_variance(&diffs);
    let sources: Vec<f64> = translations
        .iter()
        .map(|t| t.source_tokens as f64)
        .collect();
    Counts {
        sentences: translations.len(),
        refused: translations.len() - decoded.len(),
        looping,
        looping_share: share(looping),
        hit_budget,
        hit_budget_share: share(hit_budget),
        mean_source_subwords: mean_variance(&sources).0,
        subword_diff_mean: mean,
        subword_diff_variance: variance,
        ends_in_punctuation_share: share(
            decoded
                .iter()
                .filter(|(t, _)| ends_in_punctuation(&t.text))
                .count(),
        ),
        length_control: length_control(&decoded),
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}

/// Mean and population variance; (0, 0) for no values.
pub fn mean_variance(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = ratio(values.iter().sum(), n);
    let variance = ratio(values.iter().map(|v| (v - mean).powi(2)).sum(), n);
    (mean, variance)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nmt_engine::limits::input_length_bucket;

    fn translation(text: &str, source_tokens: usize, outcome: Outcome) -> Translation {
        Translation {
            text: text.into(),
            source_tokens,
            output_tokens: text.split_whitespace().count(),
            outcome,
            target_length: None,
            length_source: None,
            predicted_length: None,
            length_mode: None,
            truncated: false,
            candidates: Vec::new(),
        }
    }

    #[test]
    fn a_loop_is_a_word_trigram_three_times() {
        assert!(is_looping("y dijo y dijo a y dijo a y dijo a"));
        assert!(is_looping("a b c x a b c y a b c"));
        // Twice is not a loop, nor are three repeats of a bigram.
        assert!(!is_looping("a b c x a b c"));
        assert!(!is_looping("a b x a b y a b"));
        assert!(!is_looping(""));
        // Words, not characters: the same 3-gram with other spacing still counts.
        assert!(is_looping("la la la  la\tla"));
    }

    #[test]
    fn default_buckets_are_the_servers_and_cover_every_sentence_once() {
        let edges = BucketEdges::default();
        assert_eq!(
            edges.labels(),
            ["1-16", "17-32", "33-64", "65-128", "129-256", "257-512", "513+"]
        );
        assert!(edges.are_the_servers());
        for tokens in [0, 1, 16, 17, 64, 65, 512, 513, 100_000] {
            let label = &edges.labels()[edges.bucket(tokens)];
            assert_eq!(label, input_length_bucket(tokens), "{tokens} subwords");
        }
        let t: Vec<Translation> = [3, 16, 17, 200, 40, 0]
            .iter()
            .map(|&n| translation("x", n, Outcome::Eos))
            .collect();
        let buckets = by_bucket(&t, &edges);
        let labels: Vec<&str> = buckets.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["1-16", "17-32", "33-64", "129-256"]);
        assert_eq!(buckets[0].1, vec![0, 1, 5]);
        let total: usize = buckets.iter().map(|(_, rows)| rows.len()).sum();
        assert_eq!(total, t.len());
    }

    #[test]
    fn bucket_edges_split_at_each_edge_inclusive() {
        let edges: BucketEdges = "32".parse().unwrap();
        assert_eq!(edges.labels(), ["1-32", "33+"]);
        assert_eq!((edges.bucket(32), edges.bucket(33)), (0, 1));
        assert!(!edges.are_the_servers());
        let edges: BucketEdges = " 8, 24 ,100".parse().unwrap();
        assert_eq!(edges.edges(), [8, 24, 100]);
        assert_eq!(edges.labels(), ["1-8", "9-24", "25-100", "101+"]);
        assert_eq!(edges.to_string(), "8,24,100");
        assert_eq!(BucketEdges::default().to_string(), "16,32,64,128,256,512");
        let t: Vec<Translation> = [101, 5, 30]
            .iter()
            .map(|&n| translation("x", n, Outcome::Eos))
            .collect();
        let buckets = by_bucket(&t, &edges);
        assert_eq!(
            buckets,
            [
                ("1-8".to_string(), vec![1]),
                ("25-100".to_string(), vec![2]),
                ("101+".to_string(), vec![0])
            ]
        );
    }

    #[test]
    fn bucket_edges_reject_empty_zero_and_non_increasing() {
        for bad in [
            "", " ", "16,", ",16", "0", "0,16", "16,16", "32,16", "x", "-1", "1.5",
        ] {
            assert!(bad.parse::<BucketEdges>().is_err(), "{bad:?} was accepted");
        }
        let err = "16,8".parse::<BucketEdges>().unwrap_err();
        assert!(err.contains("16 then 8"), "{err}");
        assert!("1".parse::<BucketEdges>().is_ok());
    }

    #[test]
    fn counts_leave_refused_sentences_out_of_shares_and_lengths() {
        let t = [
            translation("a b c d", 5, Outcome::Eos),
            translation("a b c a b c a b c", 5, Outcome::Budget),
            translation("", 300, Outcome::Refused),
        ];
        let refs: Vec<&Translation> = t.iter().collect();
        let c = counts(&refs, &[2, 9, 50]);
        assert_eq!(c.sentences, 3);
        assert_eq!(c.refused, 1);
        assert_eq!((c.looping, c.looping_share), (1, 0.5));
        assert_eq!((c.hit_budget, c.hit_budget_share), (1, 0.5));
        // Differences 4 - 2 = 2 and 9 - 9 = 0: mean 1, variance 1.
        assert_eq!((c.subword_diff_mean, c.subword_diff_variance), (1.0, 1.0));
        assert!((c.mean_source_subwords - 310.0 / 3.0).abs() < 1e-9);
        assert_eq!(counts(&[], &[]).looping_share, 0.0);
        assert_eq!(c.ends_in_punctuation_share, 0.0);
        assert_eq!(c.length_control, None);
    }

    #[test]
    fn planned_lengths_are_scored_against_their_targets() {
        let planned = |text: &str, target| Translation {
            target_length: Some(target),
            ..translation(text, 3, Outcome::Eos)
        };
        let t = [
            planned("Y lloró Jesús.", 3),
            planned("a b c d e", 3),
            planned("a b c d e f g,", 3),
            translation("sin plan", 2, Outcome::Eos),
        ];
        let refs: Vec<&Translation> = t.iter().collect();
        let c = counts(&refs, &[3, 3, 3, 3]);
        // Differences 0, 2, 4 against the targets.
        let l = c.length_control.unwrap();
        assert_eq!((l.sentences, l.diff_mean), (3, 2.0));
        assert!((l.diff_variance - 8.0 / 3.0).abs() < 1e-9);
        assert_eq!((l.exact_share, l.within_1_share), (1.0 / 3.0, 1.0 / 3.0));
        assert_eq!(l.within_2_share, 2.0 / 3.0);
        assert_eq!(l.max_chars_seen, 14);
        assert_eq!(c.ends_in_punctuation_share, 0.5);
        assert!(ends_in_punctuation("Y dijo: «Ven.»"));
        assert!(!ends_in_punctuation("y el"));
    }
}
