//! LibreTranslate's API under `/libretranslate/`, so that it cannot be taken for this server's
//! own `POST /translate`: a client is given `http://HOST:PORT/libretranslate/` as its
//! LibreTranslate URL.
//!
//! Checked against the clients' code (`libretranslatepy` 2.1.4, `deep-translator` 1.11.4) and
//! LibreTranslate's own answers: `q` a text or a list, and `translatedText` in the same shape;
//! fields as JSON, as a form, or (deep-translator) in the query string; every error
//! `{"error": "..."}`.

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{ArrayBuilder, OneOfBuilder, Schema};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

use super::fields::{Extras, Fields, WithExtras};
use super::languages::{self, Ask};
use crate::service::{ApiError, Infer};
use crate::transport::http::types::{ErrorOf, ErrorShape, Texts, TranslateErrors};

/// Where the API is mounted.
pub const PREFIX: &str = "/libretranslate";

pub fn routes() -> Router<Infer> {
    Router::new()
        .route("/libretranslate/translate", post(translate))
        .route("/libretranslate/languages", get(languages).post(languages))
        .route("/libretranslate/detect", post(detect))
}

/// LibreTranslate's fields of `POST /libretranslate/translate`.
#[derive(Deserialize, ToSchema)]
#[schema(as = LibreTranslateRequest)]
pub struct TranslateFields {
    /// A text or a list of texts.
    #[schema(value_type = Texts)]
    q: Texts,
    /// The texts' language (`GET /libretranslate/languages`), or `auto`: then the model's
    /// source language is assumed (nothing is detected) and reported as `detectedLanguage`.
    source: String,
    /// The language to translate into.
    target: String,
    /// `text`; `html` is refused (400): the models translate plain text, and would translate
    /// tags as words.
    #[serde(default)]
    format: Format,
    /// Accepted and ignored: this server has no keys.
    #[serde(default)]
    // Declared for the document, so that clients see it is accepted.
    #[allow(dead_code)]
    api_key: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = LibreTranslateFormat)]
pub enum Format {
    #[default]
    Text,
    Html,
}

/// One value where the request sent one text, a list where it sent a list.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Shaped<T> {
    One(T),
    Many(Vec<T>),
}

impl<T: PartialSchema> PartialSchema for Shaped<T> {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(T::schema())
            .item(ArrayBuilder::new().items(T::schema()))
            .into()
    }
}

impl<T: PartialSchema> ToSchema for Shaped<T> {}

// utoipa's macros take a generic type's schema from its own generic machinery (which
// `Shaped` and `WithExtras` do not implement) and a plain name's from `PartialSchema`.
type ShapedTexts = Shaped<String>;
type ShapedDetections = Shaped<Detection>;
type TranslateBody = WithExtras<TranslateFields>;

impl<T> Shaped<T> {
    fn of<I>(one: bool, mut items: impl Iterator<Item = I>, f: impl Fn(I) -> T) -> Self {
        match (one, items.next()) {
            (true, Some(item)) => Shaped::One(f(item)),
            (_, first) => Shaped::Many(first.into_iter().chain(items).map(f).collect()),
        }
    }
}

/// The answer to `POST /libretranslate/translate`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = LibreTranslateResponse)]
pub struct Translated {
    /// The translation, or one per text of `q`, in order.
    #[serde(rename = "translatedText")]
    #[schema(inline)]
    translated_text: ShapedTexts,
    /// With `source` `auto` only: the language each text was taken to be in.
    #[serde(rename = "detectedLanguage", skip_serializing_if = "Option::is_none")]
    #[schema(inline, nullable = false)]
    detected_language: Option<ShapedDetections>,
}

/// A language a text is taken to be in.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[schema(as = LibreTranslateDetection)]
pub struct Detection {
    /// Always 0: this server has no language detector, and answers with a served source
    /// language without looking at the text.
    confidence: f64,
    language: String,
}

/// One entry of `GET /libretranslate/languages`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = LibreTranslateLanguage)]
pub struct Language {
    code: String,
    name: String,
    /// The languages a served model translates this one into.
    targets: Vec<String>,
}

/// The fields of `POST /libretranslate/detect`.
#[derive(Deserialize, ToSchema)]
#[schema(as = LibreTranslateDetectRequest)]
pub struct DetectFields {
    #[schema(value_type = Texts)]
    // Required, as LibreTranslate requires it, though the answer does not depend on it.
    #[allow(dead_code)]
    q: Texts,
}

/// LibreTranslate's error body (its statuses: `compat::Api::status`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(as = LibreTranslateError)]
pub struct ErrorBody {
    pub error: String,
}

impl ErrorShape for ErrorBody {
    const ERROR: &'static str = "LibreTranslateError";
    const RETRY: &'static str = "LibreTranslateRetry";
}

/// Translate a text or a list of texts (LibreTranslate)
///
/// LibreTranslate's `/translate`, through the same service as `POST /translate`. Fields as a
/// JSON object, form fields or query parameters; this server's `model`, `target_length`,
/// `length_mode` and `max_chars` are accepted beside LibreTranslate's.
#[utoipa::path(
    post,
    path = "/libretranslate/translate",
    operation_id = "libretranslate_translate",
    tag = "LibreTranslate-compatible",
    request_body(content(
        (inline(TranslateBody) = "application/json",
            example = json!({"q": "Jesus wept.", "source": "en", "target": "es"})),
        (inline(TranslateBody) = "application/x-www-form-urlencoded"),
    )),
    responses(
        (status = 200, description = "The translations, in the shape of `q`", body = Translated),
        TranslateErrors<ErrorBody>,
    )
)]
pub async fn translate(
    State(infer): State<Infer>,
    fields: Fields,
) -> Result<Json<Translated>, ApiError> {
    let request: TranslateFields = fields.read()?;
    let extras: Extras = fields.read()?;
    if request.format == Format::Html {
        return Err(ApiError::Unsupported(
            "format `html` is not supported: this server translates plain text (its models \
             would translate tags as words); send the text nodes with format `text`"
                .into(),
        ));
    }
    let auto = request.source.eq_ignore_ascii_case("auto");
    let ask = Ask {
        source: (!auto).then_some(request.source.as_str()),
        target: &request.target,
        extras: &extras,
    };
    let one = matches!(request.q, Texts::One(_));
    let (route, response) = ask.translate(&infer, request.q.into_vec()).await?;
    let translations = &response.translations;
    let detection = || Detection {
        confidence: 0.0,
        language: route.source.clone(),
    };
    Ok(Json(Translated {
        translated_text: Shaped::of(one, translations.iter(), |t| t.text.clone()),
        detected_language: auto.then(|| Shaped::of(one, translations.iter(), |_| detection())),
    }))
}

/// The languages served (LibreTranslate)
///
/// Every language some served model translates from or into, each with the languages it is
/// translated into.
#[utoipa::path(
    get,
    path = "/libretranslate/languages",
    operation_id = "libretranslate_languages",
    tag = "LibreTranslate-compatible",
    responses((status = 200, description = "The languages", body = Vec<Language>))
)]
pub async fn languages(State(infer): State<Infer>) -> Json<Vec<Language>> {
    let pairs = languages::served_pairs(&infer);
    let mut codes: Vec<&String> = pairs.iter().flat_map(|p| [&p.source, &p.target]).collect();
    codes.sort();
    codes.dedup();
    Json(
        codes
            .into_iter()
            .map(|code| Language {
                code: code.clone(),
                name: languages::name(code),
                targets: pairs
                    .iter()
                    .filter(|p| &p.source == code)
                    .map(|p| p.target.clone())
                    .collect(),
            })
            .collect(),
    )
}

/// The language of a text (LibreTranslate)
///
/// This server has no language detector: it answers with the languages it translates from,
/// each with confidence 0, without looking at the text.
#[utoipa::path(
    post,
    path = "/libretranslate/detect",
    operation_id = "libretranslate_detect",
    tag = "LibreTranslate-compatible",
    request_body(content((inline(DetectFields) = "application/json"), (inline(DetectFields) = "application/x-www-form-urlencoded"))),
    responses(
        (status = 200, description = "The served source languages", body = Vec<Detection>),
        (status = 400, response = ErrorOf<ErrorBody>),
    )
)]
pub async fn detect(
    State(infer): State<Infer>,
    fields: Fields,
) -> Result<Json<Vec<Detection>>, ApiError> {
    let _: DetectFields = fields.read()?;
    let mut sources: Vec<String> = languages::served_pairs(&infer)
        .into_iter()
        .map(|p| p.source)
        .collect();
    sources.dedup();
    Ok(Json(
        sources
            .into_iter()
            .map(|language| Detection {
                confidence: 0.0,
                language,
            })
            .collect(),
    ))
}
