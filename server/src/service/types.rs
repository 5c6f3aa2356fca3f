//! The service's requests and answers, whatever the transport: what a transport delivers
//! ([`TranslateRequest`]) and the answers and model descriptions the JSON API sends as they
//! are (their OpenAPI schemas derived here; gRPC converts them to its messages).

use nmt_engine::length::{LengthMode, LengthRequest, LengthSource};
use nmt_engine::limits::LimitSource;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::schema;

/// A translation request as every transport delivers it.
#[derive(Clone, Debug, PartialEq)]
pub struct TranslateRequest {
    pub texts: Vec<String>,
    /// The model's name; `None` for the default model.
    pub model: Option<String>,
    pub length: LengthRequest,
    /// `no_repeat_ngram_size`; `None` for the server's default.
    pub no_repeat_ngram_size: Option<usize>,
    /// Each text is cut into sentences, which are translated as texts of their own and
    /// joined with the text's own whitespace (`split_sentences`).
    pub split_sentences: bool,
}

/// One text's translation. Fields that do not apply are left out, never `null`.
// `nullable = false`: utoipa takes an `Option` for `null`, serde here for absent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Translation {
    /// The translated text.
    pub text: String,
    /// Subword tokens of the input (EOS not counted).
    pub source_tokens: usize,
    /// Subword tokens generated (EOS not counted).
    pub output_tokens: usize,
    /// The target length this text was decoded for, in subword tokens; absent for free
    /// decoding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub target_length: Option<usize>,
    /// Where `target_length` came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, value_type = Option<schema::LengthSourceSchema>)]
    pub length_source: Option<LengthSource>,
    /// The predicted natural length (subwords, unrounded), when a prediction was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub predicted_length: Option<f64>,
    /// How `target_length` was met; absent for free decoding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, value_type = Option<schema::LengthModeSchema>)]
    pub length_mode: Option<LengthMode>,
    /// The translation was longer than `max_chars` and was cut at the last word boundary that
    /// fits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schema(default = false)]
    pub truncated: bool,
    /// How many sentences the text was cut into, with `split_sentences` only; absent
    /// otherwise. The sentences were translated one by one and joined with the text's own
    /// whitespace: `source_tokens`, `output_tokens`, `target_length` and `predicted_length`
    /// are then sums over them (`target_length` and `predicted_length` present only when
    /// every sentence had one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub sentences: Option<usize>,
    /// With `target_chars` or `max_chars`, or an exact `target_length` for a text that ends
    /// in sentence punctuation: every length the text was decoded at, the one returned
    /// marked `chosen`; absent otherwise (and with `split_sentences`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub length_candidates: Option<Vec<LengthCandidate>>,
}

/// One length a text was decoded at for a character goal or an exact count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LengthCandidate {
    /// The target length it was decoded for, in subword tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub target_length: Option<usize>,
    /// What the length encoding was told, where not `target_length`: the candidates of an
    /// exact count are forced to it and planned for lengths around it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub planned_length: Option<usize>,
    /// The candidate translation, before any `max_chars` cut.
    pub text: String,
    /// Its characters, spaces counted.
    pub characters: usize,
    /// Subword tokens generated.
    pub output_tokens: usize,
    /// The model's mean log-probability per token (EOS included): higher is likelier.
    pub score: f64,
    /// It meets the request's character goal.
    pub complies: bool,
    /// The model ended it (not its token budget); in exact mode, it chose the closing
    /// punctuation at the count itself.
    pub ended: bool,
    /// It is the translation returned.
    pub chosen: bool,
}

impl From<nmt_engine::char_length::Candidate> for LengthCandidate {
    fn from(c: nmt_engine::char_length::Candidate) -> Self {
        LengthCandidate {
            target_length: c.target_length,
            planned_length: c.planned_length,
            text: c.text,
            characters: c.characters,
            output_tokens: c.output_tokens,
            score: c.score,
            complies: c.complies,
            ended: c.ended,
            chosen: c.chosen,
        }
    }
}

impl From<nmt_engine::Translation> for Translation {
    fn from(t: nmt_engine::Translation) -> Self {
        Translation {
            text: t.text,
            source_tokens: t.source_tokens,
            output_tokens: t.output_tokens,
            target_length: t.target_length,
            length_source: t.length_source,
            predicted_length: t.predicted_length,
            length_mode: t.length_mode,
            truncated: t.truncated,
            sentences: None,
            length_candidates: (!t.candidates.is_empty()).then(|| {
                t.candidates
                    .into_iter()
                    .map(LengthCandidate::from)
                    .collect()
            }),
        }
    }
}

/// The answer to `POST /translate`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TranslateResponse {
    /// The model that translated.
    pub model: String,
    /// One per input text, in input order.
    pub translations: Vec<Translation>,
}

/// One entry of `GET /models`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelInfo {
    /// The model's name, as requests give it in `model`.
    pub name: String,
    /// Whether requests that name no model get this one.
    pub default: bool,
    pub source_language: String,
    pub target_language: String,
    pub variant: Variant,
    pub limits: ModelLimits,
    /// Whether the decoder plans a translation of a given length (LDPE/LRPE), so that
    /// `length_mode` `soft` can be used.
    pub length_aware: bool,
    /// What `target_length` `"auto"` uses: the package's learned predictor (the linear fit
    /// for sources too long for it), a linear fit on the source length, or nothing (`"auto"`
    /// refused unless the model is length-aware, which then uses the source length).
    pub length_prediction: PredictionKind,
    /// Number format of the model's weights: `int8` packages (`nmt-export quantize`) are
    /// smaller and faster on CPU, and may translate slightly differently from their `float32`
    /// original.
    #[schema(value_type = schema::PrecisionSchema)]
    pub precision: model_package::Precision,
    /// What text the model was trained on: it translates these domains well and others
    /// poorly. Empty when the package does not say.
    pub domains: Vec<String>,
    /// Where its weights came from: `nmt-train` (this project's training), or the format
    /// it was imported from (`huggingface-marian`: `nmt-export import-marian`; such a model
    /// has no length encoding, `length_aware` false).
    pub origin: String,
}

/// What `target_length` `"auto"` uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PredictionKind {
    /// The package's learned predictor (with the linear fit for sources too long for it).
    Predictor,
    /// A linear fit on the source length only.
    LinearFit,
    /// None: `"auto"` is refused (or, for a length-aware model, the source length is used).
    None,
}

/// How a model knows positions (the preset and its switches).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Variant {
    /// The named preset the model was configured from.
    pub preset: String,
    #[schema(value_type = schema::ArchitectureSchema)]
    pub architecture: model_package::Architecture,
    #[schema(value_type = schema::AbsolutePositionSchema)]
    pub absolute_position: model_package::AbsolutePosition,
    #[schema(value_type = schema::RelativeAttentionSchema)]
    pub relative_attention: model_package::RelativeAttention,
    #[schema(value_type = schema::RecurrentPositionSchema)]
    pub recurrent_position: model_package::RecurrentPosition,
    #[schema(value_type = schema::LengthEncodingSchema)]
    pub length_encoding: model_package::LengthEncoding,
}

/// The limits a request to this model meets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ModelLimits {
    /// Most subword tokens per input text.
    pub max_input_tokens: usize,
    /// Whether that limit is the model's own (`model`: it has absolute positions and declares
    /// the longest input it can take) or the server's (`--max-input-tokens`).
    #[schema(value_type = schema::LimitSourceSchema)]
    pub input_limit_from: LimitSource,
    /// Most subword tokens generated per text.
    pub max_output_tokens: usize,
}
