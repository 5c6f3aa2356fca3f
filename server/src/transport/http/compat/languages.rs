//! Languages as the compatible APIs name them, and which served model translates a pair.
//!
//! Each served model translates one pair (its manifest's `source_language` and
//! `target_language`). The APIs name languages by ISO 639-1 code, DeepL's in capitals and with
//! regional variants (`EN-GB`, `ES-419`); a variant is read as its language, which is all a
//! model knows of it.

use std::collections::BTreeSet;

use super::fields::Extras;
use crate::service::{ApiError, Infer, TranslateRequest, TranslateResponse};

/// A language code without its region, in lower case: `EN-GB` and `en_gb` are `en`.
pub fn base(code: &str) -> String {
    code.split(['-', '_'])
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// A language's English name, for the language lists; the code itself for languages this
/// table lacks.
pub fn name(code: &str) -> String {
    let name = match base(code).as_str() {
        "ca" => "Catalan",
        "de" => "German",
        "en" => "English",
        "es" => "Spanish",
        "fr" => "French",
        "it" => "Italian",
        "pt" => "Portuguese",
        _ => return code.to_string(),
    };
    name.to_string()
}

/// One served pair, by base codes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pair {
    pub source: String,
    pub target: String,
}

/// Every pair some served model translates, once each.
pub fn served_pairs(infer: &Infer) -> BTreeSet<Pair> {
    infer
        .models()
        .map(|m| Pair {
            source: base(&m.source_language),
            target: base(&m.target_language),
        })
        .collect()
}

/// The model a request goes to, and the language it reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub model: String,
    /// The model's source language (base code): what a request without one is taken to be in.
    pub source: String,
}

/// What a compatible request asks to translate: into `target`, from `source` (`None` when the
/// client leaves it to the server to detect), with this server's own fields.
pub struct Ask<'a> {
    pub source: Option<&'a str>,
    pub target: &'a str,
    pub extras: &'a Extras,
}

impl Ask<'_> {
    /// Translates `texts` as this ask says, through the same service as `POST /translate`:
    /// by the model that translates the pair, with this server's own fields.
    pub async fn translate(
        &self,
        infer: &Infer,
        texts: Vec<String>,
    ) -> Result<(Route, TranslateResponse), ApiError> {
        let route = self.route(infer)?;
        let request = TranslateRequest {
            texts,
            model: Some(route.model.clone()),
            length: self.extras.length(),
            no_repeat_ngram_size: None,
            split_sentences: false,
        };
        Ok((route, infer.translate(request).await?))
    }

    /// The served model for this ask: the one named, when it translates the pair; else the
    /// default model when it does, else the first (by name) that does. A name no model has
    /// goes on to the service, which refuses it as it refuses it on `POST /translate`.
    pub fn route(&self, infer: &Infer) -> Result<Route, ApiError> {
        let target = base(self.target);
        let source = self.source.map(base);
        let translates = |source_language: &str, target_language: &str| {
            base(target_language) == target
                && source.as_ref().is_none_or(|s| *s == base(source_language))
        };
        let route = |m: &crate::service::Model| Route {
            model: m.name().to_string(),
            source: base(&m.source_language),
        };
        if let Some(name) = self.extras.model() {
            return match infer.models().find(|m| m.name() == name) {
                Some(m) if translates(&m.source_language, &m.target_language) => Ok(route(m)),
                Some(m) => Err(self.unsupported(&format!(
                    "model `{name}` translates {} into {}",
                    m.source_language, m.target_language
                ))),
                None => Ok(Route {
                    model: name.to_string(),
                    source: source.unwrap_or_default(),
                }),
            };
        }
        let candidates = || {
            infer
                .models()
                .filter(|m| translates(&m.source_language, &m.target_language))
        };
        candidates()
            .find(|m| m.name() == infer.default_model())
            .or_else(|| candidates().next())
            .map(route)
            .ok_or_else(|| {
                let served: Vec<String> = served_pairs(infer)
                    .iter()
                    .map(|p| format!("{} into {}", p.source, p.target))
                    .collect();
                self.unsupported(&format!("this server translates {}", served.join(", ")))
            })
    }

    fn unsupported(&self, served: &str) -> ApiError {
        ApiError::Unsupported(format!(
            "no translation from {} into `{}`: {served}",
            self.source
                .map_or("any language".to_string(), |s| format!("`{s}`")),
            self.target
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regional_variants_and_case_are_the_language() {
        for code in ["EN", "en", "EN-GB", "en-US", "en_gb", " en "] {
            assert_eq!(base(code), "en", "{code}");
        }
        assert_eq!(base("ES-419"), "es");
        assert_eq!(name("ES-419"), "Spanish");
        assert_eq!(name("xx"), "xx");
    }
}
