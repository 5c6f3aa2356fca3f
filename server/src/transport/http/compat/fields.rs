//! A compatible API's request fields, however its clients send them, and the fields this server
//! adds to both APIs ([`Extras`]: the length controls and the model).
//!
//! The services these APIs copy read a JSON object or form fields alike, and their clients use
//! both: `libretranslatepy` posts a form, `deep-translator` puts LibreTranslate's fields in the
//! query string of an empty POST, and `deepl` sends `GET /v2/languages` with a form body. So
//! [`Fields`] turns each into one JSON object and a serde type reads it, whichever came: a form
//! field is a string (a repeated one a list of them), which the numeric fields also accept.

use std::fmt::Display;
use std::marker::PhantomData;
use std::str::FromStr;

use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::{self, DeserializeOwned, Deserializer};
use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::openapi::schema::{AllOfBuilder, Schema};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use crate::service::schema::LengthModeSchema;
use crate::service::{ApiError, Infer};
use crate::transport::http::types::{TargetCharsSchema, TargetLengthSchema};
use nmt_engine::length::{LengthMode, LengthRequest, TargetChars, TargetLength};

/// The request's fields as one JSON object: the JSON body's, or the form body's and then the
/// query string's (a field in the body wins over the same field in the query).
#[derive(Clone, Debug, PartialEq)]
pub struct Fields(Value);

impl Fields {
    /// `T` read from the fields (fields `T` does not name are ignored, as the services do).
    pub fn read<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_path_to_error::deserialize(&self.0).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            ApiError::InvalidRequest(match path.as_str() {
                "." => inner.to_string(),
                field => format!("{field}: {inner}"),
            })
        })
    }

    /// Form fields (`application/x-www-form-urlencoded`) of `body`, then of `query`.
    pub fn from_form(body: &[u8], query: &[u8]) -> Self {
        let mut fields = pairs(body);
        for (key, value) in pairs(query) {
            fields.entry(key).or_insert(value);
        }
        Fields(Value::Object(fields))
    }

    /// A JSON body, which must be an object.
    pub fn from_json(body: &[u8]) -> Result<Self, ApiError> {
        match serde_json::from_slice(body) {
            Ok(object @ Value::Object(_)) => Ok(Fields(object)),
            Ok(_) => Err(ApiError::InvalidRequest(
                "the body must be a JSON object".into(),
            )),
            Err(e) => Err(ApiError::InvalidJson(format!(
                "the body is not valid JSON: {e}"
            ))),
        }
    }
}

/// Form pairs as JSON fields: a string each, a list of strings where a name repeats.
fn pairs(form: &[u8]) -> Map<String, Value> {
    let mut fields = Map::new();
    for (key, value) in form_urlencoded::parse(form) {
        let value = Value::String(value.into_owned());
        match fields.get_mut(key.as_ref()) {
            None => {
                fields.insert(key.into_owned(), value);
            }
            Some(Value::Array(values)) => values.push(value),
            Some(first) => *first = Value::Array(vec![first.take(), value]),
        }
    }
    fields
}

impl FromRequest<Infer> for Fields {
    type Rejection = ApiError;

    async fn from_request(request: Request, _: &Infer) -> Result<Self, Self::Rejection> {
        let query = request.uri().query().unwrap_or_default().to_owned();
        let media_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| v.trim().to_ascii_lowercase());
        // The body middleware has read it whole, within the body limit.
        let body = axum::body::to_bytes(request.into_body(), usize::MAX)
            .await
            .map_err(|e| ApiError::InvalidRequest(format!("reading the body: {e}")))?;
        match media_type.as_deref() {
            // Whatever the type says, a GET or an empty POST has its fields in the query.
            _ if body.is_empty() => Ok(Fields::from_form(&[], query.as_bytes())),
            Some(json) if json == "application/json" || json.ends_with("+json") => {
                Fields::from_json(&body)
            }
            Some("application/x-www-form-urlencoded") => {
                Ok(Fields::from_form(&body, query.as_bytes()))
            }
            _ => Err(ApiError::UnsupportedMediaType(
                "send a JSON object (Content-Type: application/json) or form fields \
                 (application/x-www-form-urlencoded)"
                    .into(),
            )),
        }
    }
}

/// What this server adds to both compatible APIs: the native API's length controls and the
/// model. The DeepL client sends them with `extra_body_parameters`; a LibreTranslate client
/// that passes extra fields through, or a form, can too.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = CompatExtras)]
pub struct Extras {
    /// A served model's name (`GET /models`); it must translate the language pair asked for.
    /// Absent: the default model when it translates the pair, else the first that does.
    #[serde(default)]
    model: Option<String>,
    /// As in `POST /translate`: subword tokens, `"source"` or `"auto"`.
    #[serde(default, deserialize_with = "json_or_form")]
    #[schema(value_type = Option<TargetLengthSchema>)]
    target_length: Option<TargetLength>,
    /// As in `POST /translate`: `soft` (default) or `exact`.
    #[serde(default)]
    #[schema(value_type = Option<LengthModeSchema>)]
    length_mode: Option<LengthMode>,
    /// As in `POST /translate`: at most this many characters per translation.
    #[serde(default, deserialize_with = "json_or_form")]
    #[schema(minimum = 1, maximum = 100000)]
    max_chars: Option<usize>,
    /// As in `POST /translate`: about this many characters, or `"source"` (isometric).
    #[serde(default, deserialize_with = "json_or_form")]
    #[schema(value_type = Option<TargetCharsSchema>)]
    target_chars: Option<TargetChars>,
}

impl Extras {
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    pub fn length(&self) -> LengthRequest {
        LengthRequest {
            target: self.target_length,
            mode: self.length_mode.unwrap_or_default(),
            max_chars: self.max_chars,
            target_chars: self.target_chars,
        }
    }
}

/// The schema of a compatible API's body: that API's fields `T` and this server's [`Extras`],
/// which are read from the same object.
pub struct WithExtras<T>(PhantomData<T>);

impl<T: ToSchema> PartialSchema for WithExtras<T> {
    fn schema() -> RefOr<Schema> {
        AllOfBuilder::new()
            .item(Ref::from_schema_name(T::name()))
            .item(Ref::from_schema_name(Extras::name()))
            .into()
    }
}

impl<T: ToSchema> ToSchema for WithExtras<T> {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((T::name().into(), T::schema()));
        T::schemas(schemas);
        schemas.push((Extras::name().into(), Extras::schema()));
        Extras::schemas(schemas);
    }
}

/// A field that JSON gives as its own type and a form as a string (`max_chars=42`).
fn json_or_form<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + FromStr,
    T::Err: Display,
{
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(word)) => word
            .parse()
            .map(Some)
            .map_err(|e| de::Error::custom(format!("`{word}`: {e}"))),
        Some(other) => T::deserialize(other).map(Some).map_err(de::Error::custom),
    }
}

/// A yes or no: JSON's `true`/`false`, or a form's `1`/`0`/`true`/`false`.
pub fn flag<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    match Value::deserialize(deserializer)? {
        Value::Bool(yes) => Ok(yes),
        Value::Null => Ok(false),
        Value::String(word) => match word.to_ascii_lowercase().as_str() {
            "1" | "true" => Ok(true),
            "0" | "false" | "" => Ok(false),
            _ => Err(de::Error::custom(format!(
                "`{word}` is not 1, 0, true or false"
            ))),
        },
        other => Err(de::Error::custom(format!("{other} is not true or false"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extras(fields: &Fields) -> Result<Extras, ApiError> {
        fields.read()
    }

    #[test]
    fn a_form_gives_strings_and_lists_where_a_name_repeats_and_the_body_wins() {
        let fields = Fields::from_form(b"q=Hello&text=a&text=b+c", b"q=ignored&source=en");
        assert_eq!(
            fields.0,
            serde_json::json!({"q": "Hello", "text": ["a", "b c"], "source": "en"})
        );
    }

    #[test]
    fn the_length_fields_read_from_json_and_from_a_form_alike() {
        let json = Fields::from_json(br#"{"max_chars": 42, "target_length": "source"}"#).unwrap();
        let form = Fields::from_form(b"max_chars=42&target_length=source", b"");
        for fields in [json, form] {
            let length = extras(&fields).unwrap().length();
            assert_eq!(length.max_chars, Some(42));
            assert_eq!(length.target, Some(TargetLength::Source));
        }
        let form = Fields::from_form(b"target_length=8&length_mode=exact&model=m", b"");
        let read = extras(&form).unwrap();
        assert_eq!(read.length().target, Some(TargetLength::Tokens(8)));
        assert_eq!(read.length().mode, LengthMode::Exact);
        assert_eq!(read.model(), Some("m"));
    }

    #[test]
    fn a_bad_field_is_an_invalid_request_that_names_it() {
        for (fields, named) in [
            (Fields::from_form(b"max_chars=many", b""), "`many`"),
            (
                Fields::from_json(br#"{"max_chars": true}"#).unwrap(),
                "max_chars",
            ),
            (
                Fields::from_json(br#"{"length_mode": "fast"}"#).unwrap(),
                "length_mode",
            ),
        ] {
            let err = extras(&fields).expect_err("refused");
            assert_eq!(err.error_type(), "invalid_request");
            assert!(err.to_string().contains(named), "{err}");
        }
        let err = Fields::from_json(b"[1]").expect_err("not an object");
        assert_eq!(err.error_type(), "invalid_request");
        let err = Fields::from_json(b"{").expect_err("not JSON");
        assert_eq!(err.error_type(), "invalid_json");
    }
}
