//! The engine's errors, typed: what a request asked that cannot be done
//! ([`ValidationError`]) and what failed on a valid one ([`EngineError`]). Transports wrap
//! them once, at their edge, into their own status codes; nothing here knows HTTP or gRPC.

use crate::length::MAX_CHARS_LIMIT;
use crate::limits::LimitSource;
use crate::logits::MAX_NO_REPEAT_NGRAM_SIZE;

/// A request the engine refuses before any work: the client must change it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ValidationError {
    #[error("`text` is an empty list")]
    NoTexts,
    #[error("text {index} is empty, or only whitespace and invisible characters")]
    EmptyText { index: usize },
    #[error("{count} texts in one request; the limit is {limit} (--max-texts-per-request)")]
    TooManyTexts { count: usize, limit: usize },
    #[error(
        "text {index} has {tokens} subword tokens; the limit is {limit} ({})",
        limit_name(model, *limit_source)
    )]
    InputTooLong {
        index: usize,
        tokens: usize,
        limit: usize,
        limit_source: LimitSource,
        model: String,
    },
    #[error(
        "target_length {tokens} is outside 1..={max_output} (the output limit of model `{model}`)"
    )]
    TargetLengthOutOfRange {
        tokens: usize,
        max_output: usize,
        model: String,
    },
    #[error("{field} {chars} is outside 1..={MAX_CHARS_LIMIT}")]
    CharsOutOfRange { field: &'static str, chars: usize },
    #[error(
        "target_length and target_chars both ask for a length; send one (target_chars for a \
         length in characters)"
    )]
    TwoTargets,
    #[error(
        "model `{model}` has no length encoding, so it cannot plan a translation of a given \
         length; send \"length_mode\": \"exact\" to force the length while decoding (the \
         output is cut or extended to fit), or pick a length-aware model (GET /models, \
         `length_aware`)"
    )]
    NoLengthEncoding { model: String },
    #[error(
        "target_length \"auto\" needs a length predictor, and model `{model}` has none; give a \
         number of subword tokens or \"source\""
    )]
    NoPredictor { model: String },
    #[error(
        "no_repeat_ngram_size is {size}; it must be from 0 (off) to {MAX_NO_REPEAT_NGRAM_SIZE}"
    )]
    NgramSizeTooLarge { size: usize },
}

fn limit_name(model: &str, source: LimitSource) -> String {
    match source {
        LimitSource::Model => format!("the longest input model `{model}` can take"),
        LimitSource::Server => "--max-input-tokens".to_string(),
    }
}

/// Anything that stops a translation.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The tokenizer failed on a text it was given (never expected of a valid string).
    #[error("tokenizing text {index}: {message}")]
    Tokenize { index: usize, message: String },
    /// The tokenizer failed to turn generated ids back into text.
    #[error("detokenizing text {index}: {message}")]
    Detokenize { index: usize, message: String },
    /// The length predictor failed.
    #[error("predicting lengths: {0}")]
    Predict(String),
    /// The model's graphs failed.
    #[error("decoding: {0}")]
    Decode(#[from] crate::backend::BackendError),
}
