//! What the handlers read and write that is the HTTP API's own (the service's answers are sent
//! as they are), with the schemas the OpenAPI document gives them.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use utoipa::openapi::response::{Response as ResponseObject, ResponseBuilder};
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, Ref, RefOr};
use utoipa::{IntoResponses, PartialSchema, ToResponse, ToSchema};

use crate::service::schema::LengthModeSchema;
use crate::service::{ModelInfo, TranslateRequest};
use crate::transport::error::ErrorBody;
use nmt_engine::length::{LengthMode, LengthRequest, TargetChars, TargetLength};

/// `text` is a single string or a list of strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Texts {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for Texts {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextsVisitor;
        impl<'de> Visitor<'de> for TextsVisitor {
            type Value = Texts;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Texts, E> {
                Ok(Texts::One(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Texts, E> {
                Ok(Texts::One(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Texts, A::Error> {
                let mut texts = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(text) = seq.next_element::<String>()? {
                    texts.push(text);
                }
                Ok(Texts::Many(texts))
            }
        }
        deserializer.deserialize_any(TextsVisitor)
    }
}

impl PartialSchema for Texts {
    fn schema() -> RefOr<Schema> {
        let string = || ObjectBuilder::new().schema_type(Type::String);
        // An empty list gets past serde, to be refused as `empty_text`.
        OneOfBuilder::new()
            .item(string())
            .item(ArrayBuilder::new().items(string()).min_items(Some(1)))
            .into()
    }
}

impl ToSchema for Texts {}

impl Texts {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Texts::One(text) => vec![text],
            Texts::Many(texts) => texts,
        }
    }
}

/// The schema of `target_length` ([`TargetLength`], whose serde implementation is the one
/// parser of it): a positive integer, `"source"` or `"auto"`.
pub struct TargetLengthSchema;

impl PartialSchema for TargetLengthSchema {
    fn schema() -> RefOr<Schema> {
        // serde takes 0 too, which validation refuses as `invalid_target_length`.
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(1)),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some([TargetLength::SOURCE, TargetLength::AUTO])),
            )
            .into()
    }
}

impl ToSchema for TargetLengthSchema {
    fn name() -> std::borrow::Cow<'static, str> {
        "TargetLength".into()
    }
}

/// The schema of `target_chars` ([`TargetChars`]): a positive integer or `"source"`.
pub struct TargetCharsSchema;

impl PartialSchema for TargetCharsSchema {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(1))
                    .maximum(Some(100_000)),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some([TargetLength::SOURCE])),
            )
            .into()
    }
}

impl ToSchema for TargetCharsSchema {
    fn name() -> std::borrow::Cow<'static, str> {
        "TargetChars".into()
    }
}

/// Body of `POST /translate`: a JSON object (serde would also accept an array for a
/// derived struct; the API does not).
pub struct TranslateBody(pub TranslateRequest);

/// The body of `POST /translate`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = TranslateRequest)]
pub struct TranslateFields {
    /// One text or a list (at most `--max-texts-per-request`); none may be empty.
    text: Texts,
    /// A served model's name; the default model when absent.
    #[serde(default)]
    model: Option<String>,
    /// Output length in subword tokens (EOS not counted): a number, `"source"` (each text's
    /// own length), or `"auto"` (the length predicted for each text by the package's length
    /// predictor, or its linear fit on the source length). A length-aware model (`GET
    /// /models`, `length_aware`) asked for none uses `"auto"`. Models without a length
    /// encoding accept a target only with `length_mode` `"exact"`.
    #[serde(default)]
    #[schema(value_type = Option<TargetLengthSchema>)]
    target_length: Option<TargetLength>,
    /// `soft`: the decoder's length encoding plans a sentence of the target length, which may
    /// end a little early or late (length-aware models only; 422 `unsupported` otherwise).
    /// `exact`: end-of-sentence is masked before the target and forced at it, on any model.
    #[serde(default, deserialize_with = "word_enum")]
    #[schema(value_type = Option<LengthModeSchema>, default = "soft")]
    length_mode: Option<LengthMode>,
    /// At most this many characters per translation. The text is decoded at a few lengths
    /// at or under the budget (its natural length when shorter, and sentences planned
    /// shorter), as rows of the same batch, and the candidate the model scores best among
    /// those that fit is returned, one that ends as the source does (a sentence) first; only
    /// when none fits is the shortest cut at the last word boundary that fits (`truncated`:
    /// true). `length_candidates` shows them all.
    // The maximum is `length::MAX_CHARS_LIMIT` (utoipa takes only a literal; a test compares).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100000)]
    max_chars: Option<usize>,
    /// About this many characters per translation (within ±10%, spaces counted), or
    /// `"source"`: isometric, about as many characters as the source, spaces not counted on
    /// either side (the IWSLT 2022 isometric task's rule: within ±10%, or either side under
    /// 10 characters). The text is decoded at its natural length and at five lengths around
    /// the characters' estimate in subwords, as rows of the same batch, and the candidate
    /// the model scores best (mean log-probability per token) among those that comply is
    /// returned; the nearest when none does. `length_candidates` shows them all. Not with
    /// `target_length` (422 `invalid_target_length`). Costs a row per candidate.
    #[serde(default)]
    #[schema(value_type = Option<TargetCharsSchema>)]
    target_chars: Option<TargetChars>,
    /// No n-gram of this many subword tokens appears twice in a translation: a token that
    /// would repeat one gives way to the model's next choice (CTranslate2's and Hugging
    /// Face's option of this name). 0 turns it off; absent, the server's
    /// `--no-repeat-ngram-size`.
    // The maximum is `logits::MAX_NO_REPEAT_NGRAM_SIZE` (a test compares).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 64)]
    no_repeat_ngram_size: Option<usize>,
    /// Cut each text into sentences (Wikimedia's segmenter, `sentencex`, with the model's
    /// source language), translate every sentence as a text of its own (in the same batch),
    /// and join the translations with the text's own whitespace between sentences. Still
    /// one translation per text, with `sentences`, the count. `--max-input-tokens` then
    /// applies to each sentence, and a request may hold at most 16 times
    /// `--max-texts-per-request` sentences (413 `too_many_texts`). Numbers in `target_length` or
    /// `target_chars`, and `max_chars`, apply to whole texts, so they are refused with it
    /// (422 `invalid_request`); `"source"` and `"auto"` apply to each sentence.
    #[serde(default)]
    #[schema(default = false)]
    split_sentences: Option<bool>,
}

/// An enum that JSON spells as one of its words (`"soft"`), or null. serde_json reads a number,
/// a bool or an array where an enum is due as a syntax error (400 `invalid_json`), and an
/// object `{"exact": null}` as the variant it names; a field that has the wrong type is the
/// request's fault, not the JSON's (422 `invalid_request`), and only a word is a word.
fn word_enum<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    match Option::<serde_json::Value>::deserialize(deserializer)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(word)) => {
            T::deserialize(de::value::StrDeserializer::<D::Error>::new(&word)).map(Some)
        }
        Some(other) => Err(de::Error::invalid_type(
            match &other {
                serde_json::Value::Bool(b) => de::Unexpected::Bool(*b),
                serde_json::Value::Number(_) => de::Unexpected::Other("a number"),
                serde_json::Value::Array(_) => de::Unexpected::Seq,
                _ => de::Unexpected::Map,
            },
            &"one of its words as a string",
        )),
    }
}

impl<'de> Deserialize<'de> for TranslateBody {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = TranslateBody;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a JSON object with `text` and optionally `model`, `target_length`, \
                     `length_mode`, `max_chars`, `target_chars`, `no_repeat_ngram_size` and \
                     `split_sentences`",
                )
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let fields =
                    TranslateFields::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(TranslateBody(TranslateRequest {
                    texts: fields.text.into_vec(),
                    model: fields.model,
                    length: LengthRequest {
                        target: fields.target_length,
                        mode: fields.length_mode.unwrap_or_default(),
                        max_chars: fields.max_chars,
                        target_chars: fields.target_chars,
                    },
                    no_repeat_ngram_size: fields.no_repeat_ngram_size,
                    split_sentences: fields.split_sentences.unwrap_or(false),
                }))
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

/// `GET /health`'s answer.
#[derive(Serialize, ToSchema)]
pub struct Health {
    #[schema(inline)]
    pub status: Alive,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Alive {
    Ok,
}

/// `GET /ready`'s answer when ready.
#[derive(Serialize, ToSchema)]
pub struct Readiness {
    #[schema(inline)]
    pub status: Ready,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Ready {
    Ready,
}

/// `GET /models`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Models {
    /// The model of requests that name none.
    pub default: String,
    pub models: Vec<ModelInfo>,
}

/// An error body, and the names of the responses that carry it in the OpenAPI document: this
/// API's [`ErrorBody`], and the compatible APIs' own.
pub trait ErrorShape: ToSchema {
    /// The response of an error (`#/components/responses/<ERROR>`).
    const ERROR: &'static str;
    /// The response of an error that may say when to retry.
    const RETRY: &'static str;
}

impl ErrorShape for ErrorBody {
    const ERROR: &'static str = "Error";
    const RETRY: &'static str = "Retry";
}

/// An error answer in the shape `B`.
pub struct ErrorOf<B>(PhantomData<B>);

impl<'r, B: ErrorShape> ToResponse<'r> for ErrorOf<B> {
    fn response() -> (&'r str, RefOr<ResponseObject>) {
        (B::ERROR, error_response::<B>("An error").into())
    }
}

/// An error answer in the shape `B` that may say when to retry: 429 `overloaded` and 503
/// `not_ready` carry `Retry-After`, 503 `unavailable` does not.
pub struct RetryOf<B>(PhantomData<B>);

impl<'r, B: ErrorShape> ToResponse<'r> for RetryOf<B> {
    fn response() -> (&'r str, RefOr<ResponseObject>) {
        let retry_after = HeaderBuilder::new()
            .schema(u64::schema())
            .description(Some(
                "Seconds to wait before sending the request again (`overloaded`, `not_ready`).",
            ))
            .build();
        let response =
            error_response::<B>("Overloaded or not ready: retry after the given seconds")
                .header("Retry-After", retry_after);
        (B::RETRY, response.into())
    }
}

/// The error responses of a route that translates, in the shape `B`: what the request got
/// wrong (400), a body too slow or too large (408, 413), the door (429, with `Retry-After`),
/// and the server's own failures (500, 503, 504).
pub struct TranslateErrors<B>(PhantomData<B>);

impl<B: ErrorShape> IntoResponses for TranslateErrors<B> {
    fn responses() -> BTreeMap<String, RefOr<ResponseObject>> {
        [400, 408, 413, 429, 500, 503, 504]
            .into_iter()
            .map(|status| {
                let name = match status {
                    429 | 503 => B::RETRY,
                    _ => B::ERROR,
                };
                (
                    status.to_string(),
                    RefOr::Ref(Ref::from_response_name(name)),
                )
            })
            .collect()
    }
}

/// An error answer: `{error, error_type}` (`#/components/responses/Error`).
pub type ErrorResponse = ErrorOf<ErrorBody>;

/// An error answer that may say when to retry (`#/components/responses/Retry`).
pub type RetryResponse = RetryOf<ErrorBody>;

fn error_response<B: ToSchema>(description: &str) -> ResponseBuilder {
    ResponseBuilder::new().description(description).content(
        "application/json",
        ContentBuilder::new()
            .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                B::name(),
            ))))
            .build(),
    )
}
