//! The limits every request is checked against, and the rules that derive a text's input
//! bound and output budget from them: one place for the server, `nmt-translate` and
//! `nmt-eval`, so that an offline run decodes exactly as a request is decoded.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::length::{DEFAULT_LENGTH_PULL, DEFAULT_RUNAWAY_RATIO};
use crate::logits::DEFAULT_NO_REPEAT_NGRAM_SIZE;

/// `--max-texts-per-request`'s default.
pub const DEFAULT_MAX_TEXTS_PER_REQUEST: usize = 64;
/// `--max-input-tokens`'s default.
pub const DEFAULT_MAX_INPUT_TOKENS: usize = 1024;
/// `--max-output-tokens`'s default.
pub const DEFAULT_MAX_OUTPUT_TOKENS: usize = 1024;
/// `--max-body-bytes`'s default.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
/// `--max-length-ratio`'s default.
pub const DEFAULT_MAX_LENGTH_RATIO: f64 = 2.0;
/// `--max-length-offset`'s default.
pub const DEFAULT_MAX_LENGTH_OFFSET: usize = 10;
/// `--exact-plans`' default: the first four of [`crate::pipeline::EXACT_PLAN_OFFSETS`]
/// (on the Bible dev books, 56% of exact counts closed by the model itself, against 18%
/// decoded once as told the count; on the test books ten rows close 66% against four's 53%,
/// at 2.4 times the decoding).
pub const DEFAULT_EXACT_PLANS: usize = 4;
/// `--exact-plans`' largest value.
pub const MAX_EXACT_PLANS: usize = crate::pipeline::EXACT_PLAN_OFFSETS.len();
/// `--request-timeout`'s default, in seconds.
pub const DEFAULT_REQUEST_TIMEOUT_SECONDS: f64 = 30.0;

/// Most texts a model worker decodes together (nmt-server's `--max-batch-size`,
/// `nmt-translate --batch-size`): `auto`, by the package's precision ([`BatchRows::rows`]),
/// or a number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BatchRows {
    #[default]
    Auto,
    Most(usize),
}

impl BatchRows {
    /// The most texts of a batch. `auto`: 32 for float32 weights, 8 for int8. A step reads
    /// every row's source keys and values and cache (about 6 KB a position for the shipped
    /// shape) beside the weights; float32 weights (25 MB for the shipped shape) come from
    /// memory every step whatever the batch, so more rows share that read, while int8 weights
    /// (6 MB) stay in the cache as long as the rows' keys and values leave room: at 32 rows
    /// they do not, and attention waits on memory. Measured on a 2-core AMD EPYC (Zen 5, 32 MB
    /// L3 shared with other guests), target subwords/s (docs/benchmarks/ctranslate2-gap.md,
    /// "Session 30"): int8 engine, one core, sorted batches of 8 / 16 / 32: 14,186 / 12,125
    /// / 9,254; nmt-server, 64 clients, two workers, at most 8 / 16 / 32 rows each: 20,238 /
    /// 17,405 / 15,593; float32 server 7,164 / 8,064 / 7,889 at 16 / 32 / 48.
    pub fn rows(self, precision: model_package::Precision) -> usize {
        match (self, precision) {
            (BatchRows::Most(rows), _) => rows,
            (BatchRows::Auto, model_package::Precision::Float32) => 32,
            (BatchRows::Auto, model_package::Precision::Int8) => 8,
        }
    }
}

impl std::str::FromStr for BatchRows {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let expected = "`auto` or a number of texts from 1 to 4096";
        match s.trim() {
            "auto" => Ok(BatchRows::Auto),
            number => match number.parse::<usize>() {
                Ok(rows @ 1..=4096) => Ok(BatchRows::Most(rows)),
                _ => Err(format!("{s:?}: expected {expected}")),
            },
        }
    }
}

impl std::fmt::Display for BatchRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchRows::Auto => f.write_str("auto"),
            BatchRows::Most(rows) => write!(f, "{rows}"),
        }
    }
}

/// Limits every request is checked against.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestLimits {
    /// Texts in one request.
    pub max_texts_per_request: usize,
    /// Subword tokens in one text (EOS not counted).
    pub max_input_tokens: usize,
    /// Subword tokens generated for one text (EOS not counted).
    pub max_output_tokens: usize,
    /// Size of a request body (HTTP) or message (gRPC).
    pub max_body_bytes: usize,
    /// Without a target length, a text stops after `ratio * source_tokens + offset` tokens.
    pub max_length_ratio: f64,
    pub max_length_offset: usize,
    /// Soft length mode's pull of EOS toward the target length, in logits per subword of
    /// distance beyond ±1 ([`crate::logits::EosRule::Pull`]); 0 leaves the ending to the
    /// length encoding alone.
    pub length_pull: f32,
    /// Soft mode toward a predicted length: a translation that runs past this many times the
    /// prediction (plus [`crate::length::RUNAWAY_SLACK`]) has its end pulled
    /// ([`crate::logits::EosRule::PullAfter`]); 0 never.
    pub runaway_ratio: f64,
    /// No n-gram of this many subwords is generated twice, unless a request says otherwise
    /// (0: off).
    pub no_repeat_ngram_size: usize,
    /// Rows an exact count that ends in sentence punctuation is decoded in, each planned
    /// for a length around the count ([`crate::pipeline::EXACT_PLAN_OFFSETS`], the first
    /// this many) and ended on a closer like the source's ([`crate::ending`]); 1 decodes it
    /// once; 0 forces the count alone, with no closer.
    pub exact_plans: usize,
    /// From arrival to answer; longer gives 504 and the request leaves the batch.
    pub request_timeout: Duration,
}

/// The server's defaults: what `nmt-server` applies without flags, and what the offline
/// tools decode under.
impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_texts_per_request: DEFAULT_MAX_TEXTS_PER_REQUEST,
            max_input_tokens: DEFAULT_MAX_INPUT_TOKENS,
            max_output_tokens: DEFAULT_MAX_OUTPUT_TOKENS,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_length_ratio: DEFAULT_MAX_LENGTH_RATIO,
            max_length_offset: DEFAULT_MAX_LENGTH_OFFSET,
            length_pull: DEFAULT_LENGTH_PULL,
            runaway_ratio: DEFAULT_RUNAWAY_RATIO,
            no_repeat_ngram_size: DEFAULT_NO_REPEAT_NGRAM_SIZE,
            exact_plans: DEFAULT_EXACT_PLANS,
            request_timeout: Duration::from_secs_f64(DEFAULT_REQUEST_TIMEOUT_SECONDS),
        }
    }
}

/// How texts are decoded, as command-line flags and `NMT_*` variables: defined once, so that
/// nmt-server, nmt-translate and nmt-eval take the same flags with the same defaults and
/// decode alike when given the same ones.
#[cfg(feature = "clap")]
#[derive(Clone, Debug, PartialEq, clap::Args)]
pub struct DecodingArgs {
    /// Most subword tokens in one text (the server answers 413 above; nmt-translate and
    /// nmt-eval leave it untranslated): room for a page of text (8 verses of the test books
    /// reach ~500). A model with absolute positions may declare a lower limit of its own,
    /// which wins.
    #[arg(long, env = "NMT_MAX_INPUT_TOKENS", default_value_t = DEFAULT_MAX_INPUT_TOKENS)]
    pub max_input_tokens: usize,

    /// Most subword tokens generated for one text (also caps `target_length`); the model's
    /// own `max_target_tokens` wins when lower.
    #[arg(long, env = "NMT_MAX_OUTPUT_TOKENS", default_value_t = DEFAULT_MAX_OUTPUT_TOKENS)]
    pub max_output_tokens: usize,

    /// Without a target length, a text stops after `ratio * source_tokens + offset` tokens.
    #[arg(long, env = "NMT_MAX_LENGTH_RATIO", default_value_t = DEFAULT_MAX_LENGTH_RATIO)]
    pub max_length_ratio: f64,

    /// See `--max-length-ratio`.
    #[arg(long, env = "NMT_MAX_LENGTH_OFFSET", default_value_t = DEFAULT_MAX_LENGTH_OFFSET)]
    pub max_length_offset: usize,

    /// Soft length mode (`"length_mode": "soft"`, the default for a target length): how
    /// hard the end of the translation is pulled toward the asked length, in logits per
    /// subword of distance beyond ±1 of it. The length encoding plans the sentence; the pull
    /// only discourages ending well before the target and encourages ending once well past
    /// it, so the model still picks where, at a sentence end. 0 turns it off.
    #[arg(long, env = "NMT_LENGTH_PULL", default_value_t = crate::length::DEFAULT_LENGTH_PULL)]
    pub length_pull: f32,

    /// Soft mode toward a predicted length (a length-aware model asked for no length, or
    /// `"auto"`): a translation that runs past RATIO times the prediction plus 5 subwords has
    /// its end pulled (2 logits per subword past it), so a decoder that has lost its plan
    /// stops there instead of looping on to the output budget. Outputs that end on their own
    /// end within 1.4x of the prediction on the test books; 0 turns it off.
    #[arg(long, env = "NMT_RUNAWAY_RATIO", default_value_t = crate::length::DEFAULT_RUNAWAY_RATIO)]
    pub runaway_ratio: f64,

    /// No n-gram of this many subwords appears twice in a translation (CTranslate2's and
    /// Hugging Face's `no_repeat_ngram_size`): a token that would repeat one gives way to the
    /// model's next choice. Stops a decoder that stutters through a list ("los consejos,
    /// los consejos, los consejos"); a request's `no_repeat_ngram_size` overrides it. 0
    /// turns it off; at most 64.
    #[arg(long, env = "NMT_NO_REPEAT_NGRAM_SIZE", default_value_t = crate::logits::DEFAULT_NO_REPEAT_NGRAM_SIZE)]
    pub no_repeat_ngram_size: usize,

    /// Exact mode (`"length_mode": "exact"`) for a text that ends in sentence punctuation:
    /// the translation ends on the same punctuation at the count, decoded in this many rows
    /// planned for lengths around the count (at most 10), the one the model closed itself
    /// and scores best returned. More rows end more translations where the model would
    /// have ended them, at that many times the decoding; 1 decodes each text once (a closer
    /// is then forced more often); 0 forces the count alone, ended wherever it falls.
    #[arg(long, env = "NMT_EXACT_PLANS", default_value_t = DEFAULT_EXACT_PLANS)]
    pub exact_plans: usize,

    /// Leave placeholders, numbers, URLs and markup to the model instead of masking them
    /// before it and putting them back after (models whose tokenizer has the sentinels
    /// `｟0｠`..; others are never masked): to measure what masking is worth.
    #[arg(long, env = "NMT_NO_PLACEHOLDER_MASKING")]
    pub no_placeholder_masking: bool,
}

#[cfg(feature = "clap")]
impl DecodingArgs {
    /// `limits` with these flags' values; an error names a flag out of range.
    pub fn apply(&self, limits: RequestLimits) -> anyhow::Result<RequestLimits> {
        if !(self.runaway_ratio.is_finite() && self.runaway_ratio >= 0.0) {
            anyhow::bail!(
                "--runaway-ratio must be 0 (off) or a positive number, not {}",
                self.runaway_ratio
            );
        }
        if self.no_repeat_ngram_size > crate::logits::MAX_NO_REPEAT_NGRAM_SIZE {
            anyhow::bail!(
                "--no-repeat-ngram-size must be at most {}, not {}",
                crate::logits::MAX_NO_REPEAT_NGRAM_SIZE,
                self.no_repeat_ngram_size
            );
        }
        if self.exact_plans > MAX_EXACT_PLANS {
            anyhow::bail!(
                "--exact-plans must be 0 to {MAX_EXACT_PLANS}, not {}",
                self.exact_plans
            );
        }
        Ok(RequestLimits {
            max_input_tokens: self.max_input_tokens,
            max_output_tokens: self.max_output_tokens,
            max_length_ratio: self.max_length_ratio,
            max_length_offset: self.max_length_offset,
            length_pull: self.length_pull,
            runaway_ratio: self.runaway_ratio,
            no_repeat_ngram_size: self.no_repeat_ngram_size,
            exact_plans: self.exact_plans,
            ..limits
        })
    }

    /// The request limits an offline tool decodes under: the server's defaults for what only
    /// the server has (texts per request, body size, timeout), these flags for the rest.
    pub fn limits(&self) -> anyhow::Result<RequestLimits> {
        self.apply(RequestLimits::default())
    }
}

/// Whose limit a text's input bound is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitSource {
    /// The model's own: it has absolute positions and declares the longest input it takes.
    Model,
    /// The server's `--max-input-tokens`.
    Server,
}

impl RequestLimits {
    /// The input limit for a model whose own bound is `model_max` (EOS not counted; `None`
    /// when it has none), and where it comes from.
    pub fn input_limit(&self, model_max: Option<usize>) -> (usize, LimitSource) {
        match model_max {
            Some(m) if m < self.max_input_tokens => (m, LimitSource::Model),
            _ => (self.max_input_tokens, LimitSource::Server),
        }
    }

    /// Most tokens generated per text for a model whose own bound is `model_max`.
    pub fn max_output(&self, model_max: usize) -> usize {
        self.max_output_tokens.min(model_max)
    }

    /// The output budget of a text of `source_tokens` subwords decoded without a target
    /// length: `ratio * source_tokens + offset`, within `1..=max_output`.
    pub fn output_budget(&self, source_tokens: usize, max_output: usize) -> usize {
        let bound =
            (self.max_length_ratio * source_tokens as f64).ceil() as usize + self.max_length_offset;
        bound.clamp(1, max_output)
    }
}

/// Upper bounds (subword tokens, inclusive) and label values of the input-length buckets: the
/// server's `input_length` metric label and `nmt-eval`'s default report buckets.
/// The last bucket is open.
pub const INPUT_LENGTH_BUCKETS: [(usize, &str); 7] = [
    (16, "1-16"),
    (32, "17-32"),
    (64, "33-64"),
    (128, "65-128"),
    (256, "129-256"),
    (512, "257-512"),
    (usize::MAX, "513+"),
];

/// The `input_length` label of a text of `tokens` subwords.
pub fn input_length_bucket(tokens: usize) -> &'static str {
    INPUT_LENGTH_BUCKETS
        .iter()
        .find(|(bound, _)| tokens <= *bound)
        .map(|(_, label)| *label)
        .expect("the last bucket is open")
}

/// The longest input the model itself takes, in subwords without EOS (the manifest's limit
/// counts EOS; request limits do not); `None` when it declares none.
pub fn model_input_limit(manifest: &model_package::Manifest) -> Option<usize> {
    manifest
        .limits
        .max_source_tokens
        .map(|m| m.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_rows_are_auto_or_a_number_and_auto_goes_by_precision() {
        use model_package::Precision;
        let parse = |s: &str| s.parse::<BatchRows>();
        assert_eq!(parse("auto"), Ok(BatchRows::Auto));
        assert_eq!(parse("12"), Ok(BatchRows::Most(12)));
        for bad in ["0", "-1", "4097", "eight", ""] {
            assert!(parse(bad).unwrap_err().contains("expected `auto`"), "{bad}");
        }
        assert_eq!(BatchRows::Auto.rows(Precision::Float32), 32);
        assert_eq!(BatchRows::Auto.rows(Precision::Int8), 8);
        assert_eq!(BatchRows::Most(3).rows(Precision::Int8), 3);
        for rows in [BatchRows::Auto, BatchRows::Most(5)] {
            assert_eq!(parse(&rows.to_string()), Ok(rows));
        }
    }

    #[cfg(feature = "clap")]
    #[test]
    fn the_flags_default_to_the_defaults() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            decoding: DecodingArgs,
        }
        let cli = Cli::try_parse_from(["tool"]).unwrap();
        assert_eq!(cli.decoding.limits().unwrap(), RequestLimits::default());
        assert!(!cli.decoding.no_placeholder_masking);
        let bad = Cli::try_parse_from(["tool", "--no-repeat-ngram-size", "65"]).unwrap();
        assert!(bad.decoding.limits().is_err());
    }

    #[test]
    fn decoding_rules_for_a_text_without_a_target_length() {
        let limits = RequestLimits {
            max_input_tokens: 256,
            max_output_tokens: 100,
            max_length_ratio: 1.5,
            ..RequestLimits::default()
        };
        // ceil(1.5 * 7) + 10 = 21; capped by the model's bound and kept at least 1.
        assert_eq!(limits.output_budget(7, 100), 21);
        assert_eq!(limits.output_budget(200, limits.max_output(64)), 64);
        assert_eq!(
            RequestLimits {
                max_length_offset: 0,
                ..limits.clone()
            }
            .output_budget(0, 64),
            1
        );
        assert_eq!(limits.input_limit(Some(127)), (127, LimitSource::Model));
        assert_eq!(limits.input_limit(Some(300)), (256, LimitSource::Server));
        assert_eq!(limits.input_limit(None), (256, LimitSource::Server));
    }
}
