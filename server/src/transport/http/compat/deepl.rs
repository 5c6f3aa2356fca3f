//! DeepL's API v2 (`/v2/translate`, `/v2/languages`, `/v2/usage`), so that the official
//! `deepl` client and its CLI, given this server's URL as `server_url`, translate here.
//!
//! Checked against the client's code (`deepl` 1.32.0): it sends JSON (`text` a list, and
//! always `show_billed_characters: true`, whose answer it parses as an integer), and
//! `GET /v2/languages?type=target` as a form body; it reads `message` from an error, retries
//! 429 and 5xx itself, and raises `QuotaExceededException` on 456, which this server never
//! answers (it has no quota). `Authorization: DeepL-Auth-Key ...` is accepted and ignored:
//! this server has no keys.

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::fields::{flag, Extras, Fields, WithExtras};
use super::languages::{self, Ask};
use crate::service::{ApiError, Infer};
use crate::transport::http::types::{ErrorOf, ErrorShape, Texts, TranslateErrors};

/// Where the API is mounted: where DeepL's is, since the client joins its paths to the bare
/// server URL.
pub const PREFIX: &str = "/v2";

/// `character_limit` of `GET /v2/usage`: what DeepL reports for an account without a limit.
/// This server has none, and never answers 456.
pub const CHARACTER_LIMIT: u64 = 1_000_000_000_000;

pub fn routes() -> Router<Infer> {
    Router::new()
        .route("/v2/translate", post(translate))
        .route("/v2/languages", get(languages).post(languages))
        .route("/v2/usage", get(usage).post(usage))
}

/// DeepL's fields of `POST /v2/translate`. Others DeepL defines (`formality`, `context`,
/// `split_sentences`, `preserve_formatting`, `model_type`) are accepted and ignored.
#[derive(Deserialize, ToSchema)]
#[schema(as = DeepLTranslateRequest)]
pub struct TranslateFields {
    /// The texts, in a list (a form repeats `text`).
    #[schema(value_type = Texts)]
    text: Texts,
    /// The language to translate into: `ES`, or a regional variant (`ES-ES`, `ES-419`),
    /// which is read as its language.
    target_lang: String,
    /// The texts' language (`EN`; `EN-GB` and `EN-US` are read as `EN`). Absent: the
    /// model's source language is assumed (nothing is detected).
    #[serde(default)]
    source_lang: Option<String>,
    /// Whether each translation reports `billed_characters`.
    #[serde(default, deserialize_with = "flag")]
    show_billed_characters: bool,
    /// Refused (400): this server translates plain text.
    #[serde(default)]
    tag_handling: Option<String>,
    /// Refused (400): this server has no glossaries.
    #[serde(default)]
    glossary_id: Option<String>,
}

// A plain name: utoipa's macros take a generic type's schema from machinery of their own.
type TranslateBody = WithExtras<TranslateFields>;

impl TranslateFields {
    /// A request that asks for what this server does not do is refused rather than answered
    /// without it.
    fn refuse_what_is_not_served(&self) -> Result<(), ApiError> {
        let refused = match (&self.tag_handling, &self.glossary_id) {
            (Some(tags), _) => format!("tag_handling `{tags}`: this server translates plain text"),
            (_, Some(_)) => "glossary_id: this server has no glossaries".to_string(),
            (None, None) => return Ok(()),
        };
        Err(ApiError::Unsupported(format!("{refused}; leave it out")))
    }
}

/// The answer to `POST /v2/translate`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DeepLTranslateResponse)]
pub struct Translations {
    /// One per text, in order.
    translations: Vec<Translation>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DeepLTranslation)]
pub struct Translation {
    /// The model's source language, given or assumed (`EN`).
    detected_source_language: String,
    text: String,
    /// The text's characters, with `show_billed_characters`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    billed_characters: Option<usize>,
}

/// The fields of `/v2/languages` (query or form).
#[derive(Deserialize, ToSchema)]
pub struct LanguagesFields {
    #[serde(default, rename = "type")]
    kind: LanguageKind,
}

/// Which languages `/v2/languages` lists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = DeepLLanguageType)]
pub enum LanguageKind {
    #[default]
    Source,
    Target,
}

/// One entry of `/v2/languages`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DeepLLanguage)]
pub struct Language {
    /// The code, in capitals (`EN`, `ES`).
    language: String,
    name: String,
    /// Target languages only: always false (the models have no formality setting).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    supports_formality: Option<bool>,
}

/// The answer of `/v2/usage`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(as = DeepLUsage)]
pub struct Usage {
    /// Characters of the texts translated through `POST /v2/translate` since the server
    /// started, by every client (keys are not told apart).
    pub character_count: u64,
    /// 10^12, what DeepL reports for an account without a limit: this server has none.
    pub character_limit: u64,
}

/// DeepL's error body (its statuses: `compat::Api::status`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(as = DeepLError)]
pub struct ErrorBody {
    pub message: String,
}

impl ErrorShape for ErrorBody {
    const ERROR: &'static str = "DeepLError";
    const RETRY: &'static str = "DeepLRetry";
}

/// Translate texts (DeepL API v2)
///
/// DeepL's `/v2/translate`, through the same service as `POST /translate`. JSON or form
/// fields; this server's `model`, `target_length`, `length_mode` and `max_chars` are accepted
/// beside DeepL's (the `deepl` client sends them with `extra_body_parameters`).
#[utoipa::path(
    post,
    path = "/v2/translate",
    operation_id = "deepl_translate",
    tag = "DeepL-compatible",
    params(
        (
            "Authorization" = Option<String>,
            Header,
            nullable = false,
            description = "`DeepL-Auth-Key KEY`: accepted and ignored (this server has no keys)."
        )
    ),
    request_body(content(
        (inline(TranslateBody) = "application/json",
            example = json!({"text": ["Jesus wept."], "target_lang": "ES", "max_chars": 42})),
        (inline(TranslateBody) = "application/x-www-form-urlencoded"),
    )),
    responses(
        (status = 200, description = "The translations", body = Translations),
        TranslateErrors<ErrorBody>,
    )
)]
pub async fn translate(
    State(infer): State<Infer>,
    fields: Fields,
) -> Result<Json<Translations>, ApiError> {
    let request: TranslateFields = fields.read()?;
    let extras: Extras = fields.read()?;
    request.refuse_what_is_not_served()?;
    let texts = request.text.into_vec();
    let ask = Ask {
        source: request.source_lang.as_deref(),
        target: &request.target_lang,
        extras: &extras,
    };
    let (route, response) = ask.translate(&infer, texts.clone()).await?;
    let billed: usize = texts.iter().map(|t| t.chars().count()).sum();
    infer.metrics().deepl_characters.inc_by(billed as u64);
    let translations = texts
        .iter()
        .zip(response.translations)
        .map(|(source, translation)| Translation {
            detected_source_language: route.source.to_ascii_uppercase(),
            text: translation.text,
            billed_characters: request
                .show_billed_characters
                .then(|| source.chars().count()),
        })
        .collect();
    Ok(Json(Translations { translations }))
}

/// The languages served (DeepL API v2)
///
/// `type=source` (default): the languages some served model translates from; `type=target`:
/// those it translates into. In the query string or a form body.
#[utoipa::path(
    get,
    path = "/v2/languages",
    operation_id = "deepl_languages",
    tag = "DeepL-compatible",
    params(("type" = Option<LanguageKind>, Query, description = "`source` (default) or `target`")),
    responses(
        (status = 200, description = "The languages", body = Vec<Language>),
        (status = 400, response = ErrorOf<ErrorBody>),
    )
)]
pub async fn languages(
    State(infer): State<Infer>,
    fields: Fields,
) -> Result<Json<Vec<Language>>, ApiError> {
    let LanguagesFields { kind } = fields.read()?;
    let mut codes: Vec<String> = languages::served_pairs(&infer)
        .into_iter()
        .map(|pair| match kind {
            LanguageKind::Source => pair.source,
            LanguageKind::Target => pair.target,
        })
        .collect();
    codes.sort();
    codes.dedup();
    Ok(Json(
        codes
            .into_iter()
            .map(|code| Language {
                name: languages::name(&code),
                language: code.to_ascii_uppercase(),
                supports_formality: (kind == LanguageKind::Target).then_some(false),
            })
            .collect(),
    ))
}

/// Characters translated (DeepL API v2)
///
/// `character_count`: characters of the texts translated through `POST /v2/translate` since
/// the server started; `character_limit`: 10^12, DeepL's figure for no limit.
#[utoipa::path(
    get,
    path = "/v2/usage",
    operation_id = "deepl_usage",
    tag = "DeepL-compatible",
    responses((status = 200, description = "Usage", body = Usage))
)]
pub async fn usage(State(infer): State<Infer>) -> Json<Usage> {
    Json(Usage {
        character_count: infer.metrics().deepl_characters.get(),
        character_limit: CHARACTER_LIMIT,
    })
}
