//! The gRPC messages to and from the service's request and answer.

use crate::service::{ApiError, TranslateRequest, TranslateResponse};
use nmt_engine::length::{LengthMode, LengthRequest, LengthSource, TargetChars, TargetLength};

use super::proto;
use proto::translate_request::TargetChars as ProtoTargetChars;
use proto::translate_request::TargetLength as ProtoTargetLength;
use proto::TargetLengthMode;

pub fn from_proto(request: proto::TranslateRequest) -> Result<TranslateRequest, ApiError> {
    let target_length = match request.target_length {
        None => None,
        Some(ProtoTargetLength::Tokens(n)) => Some(TargetLength::Tokens(n as usize)),
        Some(ProtoTargetLength::Mode(mode)) => match TargetLengthMode::try_from(mode) {
            Ok(TargetLengthMode::Source) => Some(TargetLength::Source),
            Ok(TargetLengthMode::Auto) => Some(TargetLength::Auto),
            Ok(TargetLengthMode::Unspecified) | Err(_) => {
                return Err(ApiError::InvalidRequest(format!(
                    "target_length.mode {mode} is not SOURCE (1) or AUTO (2)"
                )))
            }
        },
    };
    let mode = match proto::LengthMode::try_from(request.length_mode) {
        Ok(proto::LengthMode::Unspecified | proto::LengthMode::Soft) => LengthMode::Soft,
        Ok(proto::LengthMode::Exact) => LengthMode::Exact,
        Err(_) => {
            return Err(ApiError::InvalidRequest(format!(
                "length_mode {} is not SOFT (1) or EXACT (2)",
                request.length_mode
            )))
        }
    };
    let target_chars = match request.target_chars {
        None | Some(ProtoTargetChars::SourceChars(false)) => None,
        Some(ProtoTargetChars::SourceChars(true)) => Some(TargetChars::Source),
        Some(ProtoTargetChars::Chars(n)) => Some(TargetChars::Chars(n as usize)),
    };
    Ok(TranslateRequest {
        texts: request.text,
        model: request.model,
        length: LengthRequest {
            target: target_length,
            mode,
            max_chars: request.max_chars.map(|n| n as usize),
            target_chars,
        },
        no_repeat_ngram_size: request.no_repeat_ngram_size.map(|n| n as usize),
        split_sentences: request.split_sentences,
    })
}

pub fn to_proto(response: TranslateResponse) -> proto::TranslateResponse {
    // Counts are bounded by the request limits; saturate rather than wrap all the same.
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    proto::TranslateResponse {
        model: response.model,
        translations: response
            .translations
            .into_iter()
            .map(|t| proto::Translation {
                text: t.text,
                source_tokens: count(t.source_tokens),
                output_tokens: count(t.output_tokens),
                target_length: t.target_length.map(count),
                length_source: t
                    .length_source
                    .map_or(proto::LengthSource::Unspecified, |s| match s {
                        LengthSource::Request => proto::LengthSource::Request,
                        LengthSource::Source => proto::LengthSource::Source,
                        LengthSource::Predictor => proto::LengthSource::Predictor,
                        LengthSource::LinearFit => proto::LengthSource::LinearFit,
                        LengthSource::MaxChars => proto::LengthSource::MaxChars,
                        LengthSource::TargetChars => proto::LengthSource::TargetChars,
                    }) as i32,
                predicted_length: t.predicted_length,
                length_mode: t
                    .length_mode
                    .map_or(proto::LengthMode::Unspecified, |m| match m {
                        LengthMode::Soft => proto::LengthMode::Soft,
                        LengthMode::Exact => proto::LengthMode::Exact,
                    }) as i32,
                truncated: t.truncated,
                sentences: t.sentences.map(count),
                length_candidates: t
                    .length_candidates
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| proto::LengthCandidate {
                        target_length: c.target_length.map(count),
                        planned_length: c.planned_length.map(count),
                        text: c.text,
                        characters: count(c.characters),
                        output_tokens: count(c.output_tokens),
                        score: c.score,
                        complies: c.complies,
                        ended: c.ended,
                        chosen: c.chosen,
                    })
                    .collect(),
            })
            .collect(),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_lengths_convert() {
        let request = |target_length| proto::TranslateRequest {
            text: vec!["a".into(), "b".into()],
            model: Some("m".into()),
            target_length,
            ..Default::default()
        };
        for (proto, expected) in [
            (None, None),
            (
                Some(ProtoTargetLength::Tokens(7)),
                Some(TargetLength::Tokens(7)),
            ),
            (
                Some(ProtoTargetLength::Mode(TargetLengthMode::Source as i32)),
                Some(TargetLength::Source),
            ),
            (
                Some(ProtoTargetLength::Mode(TargetLengthMode::Auto as i32)),
                Some(TargetLength::Auto),
            ),
        ] {
            let converted = from_proto(request(proto)).unwrap();
            assert_eq!(converted.texts, ["a", "b"]);
            assert_eq!(converted.model.as_deref(), Some("m"));
            assert_eq!(converted.length.target, expected);
            assert_eq!(converted.length.mode, LengthMode::Soft);
        }
        for mode in [TargetLengthMode::Unspecified as i32, 9] {
            let err = from_proto(request(Some(ProtoTargetLength::Mode(mode)))).unwrap_err();
            assert_eq!(err.error_type(), "invalid_request", "{mode}");
        }
        let exact = proto::TranslateRequest {
            length_mode: proto::LengthMode::Exact as i32,
            max_chars: Some(42),
            ..request(None)
        };
        let converted = from_proto(exact).unwrap().length;
        assert_eq!(
            (converted.mode, converted.max_chars),
            (LengthMode::Exact, Some(42))
        );
        let bad = proto::TranslateRequest {
            length_mode: 7,
            ..request(None)
        };
        assert_eq!(from_proto(bad).unwrap_err().error_type(), "invalid_request");
        for (chars, expected) in [
            (None, None),
            (
                Some(ProtoTargetChars::Chars(40)),
                Some(TargetChars::Chars(40)),
            ),
            (
                Some(ProtoTargetChars::SourceChars(true)),
                Some(TargetChars::Source),
            ),
            (Some(ProtoTargetChars::SourceChars(false)), None),
        ] {
            let asked = proto::TranslateRequest {
                target_chars: chars,
                ..request(None)
            };
            assert_eq!(from_proto(asked).unwrap().length.target_chars, expected);
        }
        let split = proto::TranslateRequest {
            split_sentences: true,
            ..request(None)
        };
        assert!(from_proto(split).unwrap().split_sentences);
    }

    #[test]
    fn candidates_convert() {
        let candidate = crate::service::LengthCandidate {
            target_length: Some(9),
            planned_length: Some(11),
            text: "hola".into(),
            characters: 4,
            output_tokens: 2,
            score: -0.5,
            complies: true,
            ended: true,
            chosen: true,
        };
        let response = TranslateResponse {
            model: "m".into(),
            translations: vec![crate::service::Translation {
                text: "hola".into(),
                source_tokens: 1,
                output_tokens: 2,
                target_length: Some(9),
                length_source: Some(LengthSource::TargetChars),
                predicted_length: None,
                length_mode: Some(LengthMode::Soft),
                truncated: false,
                sentences: None,
                length_candidates: Some(vec![candidate]),
            }],
        };
        let t = &to_proto(response).translations[0];
        assert_eq!(t.length_source, proto::LengthSource::TargetChars as i32);
        let c = &t.length_candidates[0];
        assert_eq!(
            (c.target_length, c.characters, c.output_tokens, c.chosen),
            (Some(9), 4, 2, true)
        );
    }
}
