//! Length control: what a request may ask for, where each text's target length comes from,
//! and how a target becomes decoder input.
//!
//! Like CTranslate2's logits processors, length control stays out of the decode loop: it
//! only sets a row's [`DecodeInput`] (the length a length-aware decoder is fed, and the EOS
//! bounds), so every model and the batcher treat length-controlled rows like any other.

use std::fmt;
use std::str::FromStr;

use model_package::LinearFit;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::char_length::{About, CharGoal};
use crate::decode::DecodeInput;
use crate::error::ValidationError;
use crate::limits::RequestLimits;
use crate::logits::EosRule;
use crate::predictor::{LengthPredictor, PredictorError, SourceText};

/// The length a request asks for: in JSON a positive integer, `"source"` or `"auto"`; on a
/// command line the same words (one parser for every transport and tool).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetLength {
    /// This many subword tokens (EOS not counted).
    Tokens(usize),
    /// As many subword tokens as the source has.
    Source,
    /// The length predicted for the text (the package's predictor, else its linear fit).
    Auto,
}

impl TargetLength {
    /// The word for [`TargetLength::Source`].
    pub const SOURCE: &'static str = "source";
    /// The word for [`TargetLength::Auto`].
    pub const AUTO: &'static str = "auto";
    const EXPECTED: &'static str = r#"a number of subword tokens, "source" or "auto""#;
}

impl FromStr for TargetLength {
    type Err = String;

    /// A number of subwords, `source` or `auto`. 0 parses: whether a number is within a
    /// model's output limit is validation's to say ([`ValidationError`]), with the limit.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            Self::SOURCE => Ok(TargetLength::Source),
            Self::AUTO => Ok(TargetLength::Auto),
            n => n
                .parse::<usize>()
                .map(TargetLength::Tokens)
                .map_err(|_| format!("`{n}` is not {}", Self::EXPECTED)),
        }
    }
}

impl fmt::Display for TargetLength {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            TargetLength::Tokens(n) => write!(f, "{n}"),
            TargetLength::Source => f.write_str(Self::SOURCE),
            TargetLength::Auto => f.write_str(Self::AUTO),
        }
    }
}

impl Serialize for TargetLength {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            TargetLength::Tokens(n) => serializer.serialize_u64(*n as u64),
            TargetLength::Source => serializer.serialize_str(Self::SOURCE),
            TargetLength::Auto => serializer.serialize_str(Self::AUTO),
        }
    }
}

impl<'de> Deserialize<'de> for TargetLength {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LengthVisitor;
        impl Visitor<'_> for LengthVisitor {
            type Value = TargetLength;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(TargetLength::EXPECTED)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(TargetLength::Tokens(
                    usize::try_from(v).unwrap_or(usize::MAX),
                ))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                u64::try_from(v)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                match v {
                    TargetLength::SOURCE => Ok(TargetLength::Source),
                    TargetLength::AUTO => Ok(TargetLength::Auto),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
        }
        deserializer.deserialize_any(LengthVisitor)
    }
}

/// A length in characters a request can ask for (`target_chars`): in JSON a positive
/// integer or `"source"`; on a command line the same words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetChars {
    /// About this many characters, spaces counted (within ±10%).
    Chars(usize),
    /// Isometric: about as many characters as the source, spaces not counted on either side
    /// (the IWSLT 2022 isometric task's length compliance).
    Source,
}

impl TargetChars {
    const EXPECTED: &'static str = r#"a number of characters or "source""#;

    /// The goal for a text whose source is `source`.
    pub fn about(self, source: &str) -> About {
        match self {
            TargetChars::Chars(n) => About::chars(n),
            TargetChars::Source => About::isometric(source),
        }
    }
}

impl FromStr for TargetChars {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            TargetLength::SOURCE => Ok(TargetChars::Source),
            n => n
                .parse::<usize>()
                .map(TargetChars::Chars)
                .map_err(|_| format!("`{n}` is not {}", Self::EXPECTED)),
        }
    }
}

impl fmt::Display for TargetChars {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            TargetChars::Chars(n) => write!(f, "{n}"),
            TargetChars::Source => f.write_str(TargetLength::SOURCE),
        }
    }
}

impl Serialize for TargetChars {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            TargetChars::Chars(n) => serializer.serialize_u64(*n as u64),
            TargetChars::Source => serializer.serialize_str(TargetLength::SOURCE),
        }
    }
}

impl<'de> Deserialize<'de> for TargetChars {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CharsVisitor;
        impl Visitor<'_> for CharsVisitor {
            type Value = TargetChars;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(TargetChars::EXPECTED)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(TargetChars::Chars(usize::try_from(v).unwrap_or(usize::MAX)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                u64::try_from(v)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                v.parse()
                    .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
            }
        }
        deserializer.deserialize_any(CharsVisitor)
    }
}

/// How a target length is met.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum LengthMode {
    /// The length encoding guides a length-aware decoder, which plans a sentence of that
    /// length and may end a little early or late.
    #[default]
    Soft,
    /// EOS is masked before the length and forced at it: exactly that many tokens.
    Exact,
}

/// The length part of a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LengthRequest {
    pub target: Option<TargetLength>,
    pub mode: LengthMode,
    /// At most this many characters per translation.
    pub max_chars: Option<usize>,
    /// About this many characters per translation (n-best over lengths).
    pub target_chars: Option<TargetChars>,
}

impl LengthRequest {
    /// Whether the request constrains the length at all.
    pub fn is_constrained(&self) -> bool {
        self.target.is_some() || self.max_chars.is_some() || self.target_chars.is_some()
    }

    /// The character goal of a text whose source is `source`: `None` when the request has
    /// none, and the text is decoded once.
    pub fn char_goal(&self, source: &str) -> Option<CharGoal> {
        let about = self.target_chars.map(|t| t.about(source));
        (about.is_some() || self.max_chars.is_some()).then_some(CharGoal {
            about,
            at_most: self.max_chars,
        })
    }
}

/// Where a text's target length came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LengthSource {
    /// The number the request gave.
    Request,
    /// The source text's subword count.
    Source,
    /// The package's learned length predictor.
    Predictor,
    /// The package's linear fit on the source length (no predictor, or a source too long
    /// for it).
    LinearFit,
    /// `max_chars`, converted to subwords, was shorter than any of the above.
    MaxChars,
    /// A candidate length for `target_chars`.
    TargetChars,
}

/// Longest `max_chars` accepted: far beyond any output limit, so only absurd values fail.
pub const MAX_CHARS_LIMIT: usize = 100_000;

/// What a served model knows about lengths: how to predict one, how characters map to
/// subwords, and whether its decoder can plan one.
pub struct LengthModel {
    pub length_aware: bool,
    pub linear_fit: Option<LinearFit>,
    pub predictor: Option<std::sync::Arc<LengthPredictor>>,
    /// Soft mode pulls toward a predicted length from both sides beyond this share of it
    /// (the manifest's `prediction_pull`); `None`: only a runaway far past it is pulled.
    pub prediction_pull: Option<f64>,
    /// Mean characters (spaces included) per target subword on the training targets.
    pub chars_per_subword: f64,
}

/// Characters per target subword when a package does not say: about what the shipped
/// Spanish Unigram tokenizer gives.
pub const DEFAULT_CHARS_PER_SUBWORD: f64 = 4.0;

impl LengthModel {
    /// A model that knows nothing about lengths beyond its decoder.
    pub fn without_prediction(length_aware: bool) -> Self {
        LengthModel {
            length_aware,
            linear_fit: None,
            predictor: None,
            prediction_pull: None,
            chars_per_subword: DEFAULT_CHARS_PER_SUBWORD,
        }
    }

    /// What the package's manifest offers, the learned predictor opened when installed. A
    /// predictor whose pretrained files are not installed is left out with a warning (the
    /// linear fit answers instead); one that is installed but broken fails the start.
    pub fn load(
        env: &ort::environment::Environment,
        dir: &std::path::Path,
        manifest: &model_package::Manifest,
        options: &crate::onnx::SessionOptions,
    ) -> anyhow::Result<Self> {
        let mut length = LengthModel::without_prediction(manifest.config.is_length_aware());
        let Some(prediction) = &manifest.length_prediction else {
            return Ok(length);
        };
        length.linear_fit = Some(prediction.linear_fit);
        length.prediction_pull = prediction.prediction_pull;
        if let Some(share) = prediction.prediction_pull {
            anyhow::ensure!(
                share > 0.0 && share <= 1.0,
                "{}: prediction_pull {share} is not a share in (0, 1]",
                dir.display()
            );
        }
        if let Some(chars) = prediction.chars_per_target_subword {
            length.chars_per_subword = chars;
        }
        if let Some(spec) = &prediction.predictor {
            match LengthPredictor::load(env, dir, spec, i64::from(manifest.pad_id), options) {
                Ok(predictor) => length.predictor = Some(std::sync::Arc::new(predictor)),
                Err(PredictorError::NotInstalled { path, source_hint }) => tracing::warn!(
                    model = %manifest.name,
                    "the length predictor is not installed ({path} is missing; it comes from \
                     {source_hint}; scripts/install-length-predictor.sh installs it): \
                     \"auto\" lengths use the linear fit on the source length"
                ),
                Err(PredictorError::Broken(e)) => {
                    return Err(e.context(format!("the length predictor of {}", dir.display())))
                }
            }
        }
        Ok(length)
    }

    /// Whether `"auto"` can be answered.
    pub fn can_predict(&self) -> bool {
        self.predictor.is_some() || self.linear_fit.is_some()
    }

    /// Refuses what this model cannot honour, before anything is tokenized.
    pub fn check(
        &self,
        request: &LengthRequest,
        model: &str,
        max_output: usize,
    ) -> Result<(), ValidationError> {
        if let Some(TargetLength::Tokens(n)) = request.target {
            if n == 0 || n > max_output {
                return Err(ValidationError::TargetLengthOutOfRange {
                    tokens: n,
                    max_output,
                    model: model.to_string(),
                });
            }
        }
        let asked_chars = [
            ("max_chars", request.max_chars),
            (
                "target_chars",
                match request.target_chars {
                    Some(TargetChars::Chars(n)) => Some(n),
                    _ => None,
                },
            ),
        ];
        for (field, chars) in asked_chars {
            if let Some(chars) = chars.filter(|&c| c == 0 || c > MAX_CHARS_LIMIT) {
                return Err(ValidationError::CharsOutOfRange { field, chars });
            }
        }
        if request.target.is_some() && request.target_chars.is_some() {
            return Err(ValidationError::TwoTargets);
        }
        if request.is_constrained() && !self.length_aware && request.mode == LengthMode::Soft {
            return Err(ValidationError::NoLengthEncoding {
                model: model.to_string(),
            });
        }
        // max_chars alone uses a prediction when there is one, and the budget alone if not.
        if request.target == Some(TargetLength::Auto) && !self.length_aware && !self.can_predict() {
            return Err(ValidationError::NoPredictor {
                model: model.to_string(),
            });
        }
        Ok(())
    }

    /// The natural length of each text, and what predicted it: the learned predictor where it
    /// takes the text, else the linear fit; `None` when the package has neither. Blocking
    /// (a neural network may run).
    pub fn predict(
        &self,
        texts: &[SourceText],
    ) -> anyhow::Result<Vec<Option<(f64, LengthSource)>>> {
        let learned = match &self.predictor {
            Some(predictor) => predictor.predict(texts)?,
            None => vec![None; texts.len()],
        };
        let source_tokens: Vec<usize> = texts.iter().map(|t| t.source_tokens).collect();
        Ok(learned
            .into_iter()
            .zip(self.fit(&source_tokens))
            .map(|(p, fit)| p.map(|p| (p, LengthSource::Predictor)).or(fit))
            .collect())
    }

    /// The linear fit's length of each text; `None` when the package has none. Cheap: what
    /// a text gets when the predictor cannot take it, or cannot take it soon.
    pub fn fit(&self, source_tokens: &[usize]) -> Vec<Option<(f64, LengthSource)>> {
        source_tokens
            .iter()
            .map(|&n| {
                self.linear_fit
                    .map(|fit| (fit.predict(n).max(1.0), LengthSource::LinearFit))
            })
            .collect()
    }

    /// The subword budget `max_chars` allows, at least one.
    pub fn subwords_for_chars(&self, max_chars: usize) -> usize {
        ((max_chars as f64 / self.chars_per_subword).floor() as usize).max(1)
    }
}

/// The length a text was decoded for, and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LengthPlan {
    /// Target subwords (EOS not counted); `None` for free decoding of a model that is not
    /// length-aware.
    pub target: Option<usize>,
    pub source: Option<LengthSource>,
    /// The prediction, when one was made.
    pub predicted: Option<f64>,
    /// Soft mode pulls EOS toward the target from both sides (`--length-pull`): a length
    /// asked for, or a prediction where the package sets `prediction_pull`. Otherwise the
    /// length encoding alone plans it and only a runaway far past it is pulled to an end: a
    /// guess at the natural length, or a candidate length for a character goal (which ends
    /// as a sentence more often unpulled).
    pub pulled: bool,
    /// Subwords either side of the target within which a pulled row ends where the model
    /// likes: 1 for a length asked for, a share of a prediction (the manifest's
    /// `prediction_pull`).
    pub tolerance: usize,
    /// What the length encoding is told, where it is not `target`: exact mode's candidates
    /// for one count ([`crate::ending`]) are forced to `target` tokens, each planned for a
    /// length around it, since the model's plan lands a few subwords either side of what it
    /// is told.
    pub told: Option<usize>,
}

impl LengthPlan {
    pub const FREE: LengthPlan = LengthPlan {
        target: None,
        source: None,
        predicted: None,
        pulled: false,
        tolerance: 1,
        told: None,
    };
}

/// Turns a request's length ask into each text's plan. `predicted[i]` is the prediction for
/// text `i` (with its source), present exactly for the texts that need one (see
/// [`needs_prediction`]).
pub fn plan(
    request: &LengthRequest,
    length: &LengthModel,
    source_tokens: usize,
    predicted: Option<(f64, LengthSource)>,
    max_output: usize,
) -> LengthPlan {
    let clamp = |n: f64| (n.round().max(1.0) as usize).min(max_output);
    let mut plan = match (request.target, predicted) {
        (Some(TargetLength::Tokens(n)), _) => LengthPlan {
            target: Some(n),
            source: Some(LengthSource::Request),
            predicted: None,
            pulled: true,
            tolerance: 1,
            told: None,
        },
        (Some(TargetLength::Source), _) => LengthPlan {
            target: Some(clamp(source_tokens as f64)),
            source: Some(LengthSource::Source),
            predicted: None,
            pulled: true,
            tolerance: 1,
            told: None,
        },
        (_, Some((p, source))) => LengthPlan {
            target: Some(clamp(p)),
            source: Some(source),
            predicted: Some(p),
            // A prediction's error grows with its length: the model ends freely within a
            // share of it either side.
            pulled: length.prediction_pull.is_some(),
            tolerance: length
                .prediction_pull
                .map_or(1, |share| ((share * p).round() as usize).max(1)),
            told: None,
        },
        // A length-aware decoder always needs a length; without a prediction the source's
        // is the best guess it has.
        _ if length.length_aware => LengthPlan {
            target: Some(clamp(source_tokens as f64)),
            source: Some(LengthSource::Source),
            predicted: None,
            pulled: true,
            tolerance: 1,
            told: None,
        },
        _ => LengthPlan::FREE,
    };
    if let Some(chars) = request.max_chars {
        let cap = length.subwords_for_chars(chars).min(max_output);
        if plan.target.is_none_or(|t| t > cap) {
            plan.target = Some(cap);
            plan.source = Some(LengthSource::MaxChars);
        }
    }
    plan
}

/// Whether a text of this request gets a prediction: `"auto"`, `max_chars` alone (the
/// natural length, if shorter, beats the character budget), and a length-aware model asked
/// for nothing.
pub fn needs_prediction(request: &LengthRequest, length: &LengthModel) -> bool {
    length.can_predict()
        && match request.target {
            Some(TargetLength::Auto) => true,
            Some(_) => false,
            None => {
                request.max_chars.is_some() || request.target_chars.is_some() || length.length_aware
            }
        }
}

/// `--length-pull`'s default, measured on the test books with the reference length
/// (`docs/length-control.md`): the variance of output minus asked length falls from 7.3 to
/// 5.0 and 97.8% of outputs still end in punctuation; stronger pulls cut more sentences short.
pub const DEFAULT_LENGTH_PULL: f32 = 2.0;

/// `--runaway-ratio`'s default. On the test books and their 2-, 4- and 8-verse
/// concatenations the shipped model's outputs end within 1.4x of their predicted length, but
/// for the few that loop, which run on to the output budget (~1.9x on 8 verses)
/// (`docs/training.md`, leg 7).
pub const DEFAULT_RUNAWAY_RATIO: f64 = 1.5;
/// Subwords past `--runaway-ratio` times a guessed length before its end is pulled: room
/// for short sentences, whose predictions are a few subwords off either way.
pub const RUNAWAY_SLACK: usize = 5;
/// Logits per subword the end of a runaway is pulled by: EOS a few logits behind the looping
/// token wins within a few subwords.
pub const RUNAWAY_PULL: f32 = 2.0;

/// Soft mode's EOS rule ([`LengthPlan::pulled`]). A length someone asked for is pulled
/// toward from both sides. A predicted length is a guess at the natural one, and pulling
/// toward a guess costs quality, so only a runaway far past it is pulled to an end (unless
/// the package's `prediction_pull` says its model needs the pull, beyond a share of the
/// guess); so is a candidate length of a character goal, which the model is left to end as
/// a sentence.
fn soft_rule(target: usize, pulled: bool, tolerance: usize, limits: &RequestLimits) -> EosRule {
    if pulled {
        if limits.length_pull > 0.0 {
            return EosRule::Pull {
                target,
                tolerance,
                per_token: limits.length_pull,
            };
        }
    } else if limits.runaway_ratio > 0.0 {
        return EosRule::PullAfter {
            after: (limits.runaway_ratio * target as f64).ceil() as usize + RUNAWAY_SLACK,
            per_token: RUNAWAY_PULL,
        };
    }
    EosRule::Free
}

/// Decoder input for a text of `source_tokens` subwords under `plan`: the rule every
/// transport and `nmt-eval` share.
pub fn decode_input(
    source_ids: Vec<i64>,
    source_tokens: usize,
    plan: &LengthPlan,
    mode: LengthMode,
    length_aware: bool,
    limits: &RequestLimits,
    max_output: usize,
) -> DecodeInput {
    let free_budget = limits.output_budget(source_tokens, max_output);
    let Some(n) = plan.target else {
        return DecodeInput {
            no_repeat_ngram_size: limits.no_repeat_ngram_size,
            ..DecodeInput::new(source_ids, free_budget)
        };
    };
    let (eos, max_output_tokens) = match mode {
        LengthMode::Exact => (EosRule::BanUntil(n), n),
        // The decoder plans the length itself; the budget only stops a runaway row, with
        // room for the planned length plus some slack.
        LengthMode::Soft => (
            soft_rule(n, plan.pulled, plan.tolerance, limits),
            free_budget
                .max(n + limits.max_length_offset)
                .min(max_output),
        ),
    };
    DecodeInput {
        source_ids,
        eos,
        max_output_tokens,
        target_length: length_aware.then_some(plan.told.unwrap_or(n)),
        no_repeat_ngram_size: limits.no_repeat_ngram_size,
        score: false,
        ending: None,
    }
}

/// `text` cut to at most `max_chars` characters at a word boundary, with trailing spaces and
/// clause punctuation dropped; mid-word only when not even the first word fits; `None` when
/// it already fits.
pub fn cut_to_chars(text: &str, max_chars: usize) -> Option<String> {
    if text.chars().count() <= max_chars {
        return None;
    }
    let limit = text
        .char_indices()
        .nth(max_chars)
        .map_or(text.len(), |(i, _)| i);
    // The cut falls on a boundary when the first dropped character is a space.
    let head = &text[..limit];
    let kept = if text[limit..].starts_with(char::is_whitespace) {
        head
    } else {
        head.rfind(char::is_whitespace).map_or("", |i| &head[..i])
    };
    let kept =
        kept.trim_end_matches(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | ':' | '-'));
    // No whole word fits: the budget's worth of the first one, rather than an empty answer
    // to a text that had something to say (the response marks it cut).
    let kept = if kept.is_empty() {
        head.trim_end()
    } else {
        kept
    };
    Some(kept.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits() -> RequestLimits {
        RequestLimits {
            max_texts_per_request: 8,
            max_input_tokens: 100,
            max_output_tokens: 100,
            max_body_bytes: 1 << 16,
            max_length_ratio: 1.5,
            max_length_offset: 10,
            no_repeat_ngram_size: 0,
            request_timeout: Duration::from_secs(5),
            ..RequestLimits::default()
        }
    }

    fn model(length_aware: bool, fit: bool) -> LengthModel {
        LengthModel {
            linear_fit: fit.then_some(LinearFit {
                slope: 1.2,
                intercept: 1.0,
            }),
            ..LengthModel::without_prediction(length_aware)
        }
    }

    fn ask(
        target: Option<TargetLength>,
        mode: LengthMode,
        max_chars: Option<usize>,
    ) -> LengthRequest {
        LengthRequest {
            target,
            mode,
            max_chars,
            target_chars: None,
        }
    }

    #[test]
    fn what_a_model_cannot_honour_is_refused() {
        let plain = model(false, false);
        let aware = model(true, false);
        let soft = |t| ask(Some(t), LengthMode::Soft, None);
        let exact = |t| ask(Some(t), LengthMode::Exact, None);
        let kind = |r: Result<(), ValidationError>| {
            r.err().map(|e| match e {
                ValidationError::NoLengthEncoding { .. } | ValidationError::NoPredictor { .. } => {
                    "unsupported"
                }
                ValidationError::TargetLengthOutOfRange { .. }
                | ValidationError::CharsOutOfRange { .. } => "invalid_target_length",
                other => panic!("{other}"),
            })
        };
        assert_eq!(
            kind(plain.check(&soft(TargetLength::Tokens(5)), "m", 64)),
            Some("unsupported")
        );
        assert_eq!(
            kind(plain.check(&exact(TargetLength::Tokens(5)), "m", 64)),
            None
        );
        assert_eq!(
            kind(plain.check(&exact(TargetLength::Auto), "m", 64)),
            Some("unsupported")
        );
        assert_eq!(
            kind(model(false, true).check(&exact(TargetLength::Auto), "m", 64)),
            None
        );
        assert_eq!(kind(aware.check(&soft(TargetLength::Auto), "m", 64)), None);
        for bad in [0, 65] {
            assert_eq!(
                kind(aware.check(&soft(TargetLength::Tokens(bad)), "m", 64)),
                Some("invalid_target_length")
            );
        }
        for bad in [0, MAX_CHARS_LIMIT + 1] {
            assert_eq!(
                kind(aware.check(&ask(None, LengthMode::Soft, Some(bad)), "m", 64)),
                Some("invalid_target_length")
            );
        }
        assert_eq!(kind(plain.check(&LengthRequest::default(), "m", 64)), None);
    }

    #[test]
    fn target_lengths_parse_alike_from_json_and_command_lines() {
        for (word, json, length) in [
            ("7", "7", TargetLength::Tokens(7)),
            ("source", r#""source""#, TargetLength::Source),
            ("auto", r#""auto""#, TargetLength::Auto),
        ] {
            assert_eq!(word.parse::<TargetLength>().unwrap(), length);
            assert_eq!(serde_json::from_str::<TargetLength>(json).unwrap(), length);
            assert_eq!(serde_json::to_string(&length).unwrap(), json);
            assert_eq!(length.to_string(), word);
        }
        for bad in ["-1", "Auto", "", "1.5"] {
            assert!(bad.parse::<TargetLength>().is_err(), "{bad}");
        }
        for bad in ["-1", r#""Auto""#, "1.5", "null", "[]"] {
            assert!(serde_json::from_str::<TargetLength>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plans_say_where_the_length_came_from() {
        let aware = model(true, true);
        let req = |t| ask(t, LengthMode::Soft, None);
        let p = plan(&req(Some(TargetLength::Tokens(7))), &aware, 20, None, 64);
        assert_eq!((p.target, p.source), (Some(7), Some(LengthSource::Request)));
        let p = plan(&req(Some(TargetLength::Source)), &aware, 80, None, 64);
        assert_eq!((p.target, p.source), (Some(64), Some(LengthSource::Source)));
        let predicted = Some((12.6, LengthSource::Predictor));
        let p = plan(&req(Some(TargetLength::Auto)), &aware, 20, predicted, 64);
        assert_eq!((p.target, p.predicted), (Some(13), Some(12.6)));
        // A length-aware model asked for nothing and with nothing to predict with.
        let p = plan(&req(None), &model(true, false), 9, None, 64);
        assert_eq!((p.target, p.source), (Some(9), Some(LengthSource::Source)));
        assert_eq!(
            plan(&req(None), &model(false, false), 9, None, 64),
            LengthPlan::FREE
        );
        // max_chars caps a longer prediction and leaves a shorter one alone (4 chars/subword).
        let chars = |n| ask(None, LengthMode::Soft, Some(n));
        let p = plan(
            &chars(42),
            &aware,
            30,
            Some((30.0, LengthSource::Predictor)),
            64,
        );
        assert_eq!(
            (p.target, p.source),
            (Some(10), Some(LengthSource::MaxChars))
        );
        let p = plan(
            &chars(42),
            &aware,
            5,
            Some((6.0, LengthSource::Predictor)),
            64,
        );
        assert_eq!(
            (p.target, p.source),
            (Some(6), Some(LengthSource::Predictor))
        );
    }

    #[test]
    fn a_prediction_is_pulled_toward_beyond_the_packages_share_of_it() {
        let req = ask(None, LengthMode::Soft, None);
        let predicted = Some((40.4, LengthSource::Predictor));
        let p = plan(&req, &model(true, true), 38, predicted, 512);
        assert!(
            !p.pulled,
            "without prediction_pull only runaways are pulled"
        );
        let pulling = LengthModel {
            prediction_pull: Some(0.15),
            ..model(true, true)
        };
        let p = plan(&req, &pulling, 38, predicted, 512);
        // round(0.15 * 40.4) = 6 subwords either side of the 40 planned.
        assert_eq!((p.target, p.pulled, p.tolerance), (Some(40), true, 6));
        let soft = decode_input(vec![5, 2], 38, &p, LengthMode::Soft, true, &limits(), 512);
        assert_eq!(
            soft.eos,
            EosRule::Pull {
                target: 40,
                tolerance: 6,
                per_token: DEFAULT_LENGTH_PULL
            }
        );
        // A length asked for is still pulled within one subword.
        let asked = plan(
            &ask(Some(TargetLength::Source), LengthMode::Soft, None),
            &pulling,
            38,
            None,
            512,
        );
        assert_eq!((asked.pulled, asked.tolerance), (true, 1));
    }

    #[test]
    fn predictions_are_made_only_where_used() {
        let aware = model(true, true);
        let none = ask(None, LengthMode::Soft, None);
        assert!(needs_prediction(&none, &aware));
        assert!(!needs_prediction(&none, &model(false, true)));
        assert!(!needs_prediction(&none, &model(true, false)));
        let fixed = ask(Some(TargetLength::Tokens(3)), LengthMode::Soft, Some(40));
        assert!(!needs_prediction(&fixed, &aware));
        let chars = ask(None, LengthMode::Exact, Some(40));
        assert!(needs_prediction(&chars, &model(false, true)));
    }

    #[test]
    fn modes_set_the_eos_bounds() {
        let limits = limits();
        let plan = LengthPlan {
            target: Some(6),
            source: Some(LengthSource::Request),
            predicted: None,
            pulled: true,
            tolerance: 1,
            told: None,
        };
        let exact = decode_input(vec![5, 2], 1, &plan, LengthMode::Exact, true, &limits, 64);
        assert_eq!(
            (exact.eos, exact.max_output_tokens, exact.target_length),
            (EosRule::BanUntil(6), 6, Some(6))
        );
        // ceil(1.5 * 1) + 10 = 12 free; 6 + 10 = 16 for the plan.
        let soft = decode_input(vec![5, 2], 1, &plan, LengthMode::Soft, true, &limits, 64);
        assert_eq!(
            (soft.eos, soft.max_output_tokens, soft.target_length),
            (
                EosRule::Pull {
                    target: 6,
                    tolerance: 1,
                    per_token: DEFAULT_LENGTH_PULL
                },
                16,
                Some(6)
            )
        );
        let unpulled = RequestLimits {
            length_pull: 0.0,
            ..limits.clone()
        };
        let soft = decode_input(vec![5, 2], 1, &plan, LengthMode::Soft, true, &unpulled, 64);
        assert_eq!(soft.eos, EosRule::Free);
        let pulled = RequestLimits {
            length_pull: 0.5,
            ..limits.clone()
        };
        let soft = decode_input(vec![5, 2], 1, &plan, LengthMode::Soft, true, &pulled, 64);
        assert_eq!(
            soft.eos,
            EosRule::Pull {
                target: 6,
                tolerance: 1,
                per_token: 0.5
            }
        );
        let predicted = LengthPlan {
            source: Some(LengthSource::Predictor),
            pulled: false,
            tolerance: 1,
            ..plan
        };
        let natural = decode_input(
            vec![5, 2],
            1,
            &predicted,
            LengthMode::Soft,
            true,
            &pulled,
            64,
        );
        assert_eq!(
            natural.eos,
            EosRule::PullAfter {
                after: 14,
                per_token: RUNAWAY_PULL
            },
            "a prediction is not pulled toward, only a runaway past ceil(1.5 * 6) + 5"
        );
        let unguarded = RequestLimits {
            runaway_ratio: 0.0,
            ..pulled.clone()
        };
        let natural = decode_input(
            vec![5, 2],
            1,
            &predicted,
            LengthMode::Soft,
            true,
            &unguarded,
            64,
        );
        assert_eq!(natural.eos, EosRule::Free);
        let plain = decode_input(vec![5, 2], 1, &plan, LengthMode::Exact, false, &limits, 64);
        assert_eq!(plain.target_length, None);
        let free = decode_input(
            vec![5, 2],
            1,
            &LengthPlan::FREE,
            LengthMode::Soft,
            false,
            &limits,
            64,
        );
        assert_eq!((free.eos, free.max_output_tokens), (EosRule::Free, 12));
    }

    #[test]
    fn cuts_fall_between_words() {
        assert_eq!(cut_to_chars("Jesús lloró.", 20), None);
        assert_eq!(
            cut_to_chars("Y dijo: Señor, ven y ve.", 14).as_deref(),
            Some("Y dijo: Señor")
        );
        // The 12th character is a space: the first 11 are whole words.
        assert_eq!(
            cut_to_chars("Y dijo a él ven", 11).as_deref(),
            Some("Y dijo a él")
        );
        assert_eq!(
            cut_to_chars("Y dijo a él, ven", 11).as_deref(),
            Some("Y dijo a")
        );
        // No whole word fits: the first one, cut.
        assert_eq!(cut_to_chars("Bienaventurados", 5).as_deref(), Some("Biena"));
        assert_eq!(
            cut_to_chars("Bienaventurados son", 5).as_deref(),
            Some("Biena")
        );
        assert_eq!(cut_to_chars("año año", 5).as_deref(), Some("año"));
    }
}
