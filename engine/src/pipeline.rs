//! One model's pipeline, written once for every driver: validate → plan → decode input →
//! respond → fit characters. The server drives it through its scheduler (async, batches
//! shared with other requests); `nmt-translate` and `nmt-eval` drive it directly
//! ([`crate::offline::Engine`]). Only the decoding between the steps differs.
//!
//! As in text-generation-inference's `validation.rs`, the model only ever sees checked
//! input: [`Pipeline::validate`] turns texts into [`ValidText`]s (tokenized and within every
//! limit, with what decoding needs to know about each) before anything is queued.

use serde::{Deserialize, Serialize};

use crate::backend::BackendError;
use crate::char_length::{self, Candidate, CharGoal};
use crate::decode::{DecodeInput, DecodeOutput, StopReason};
use crate::ending::{sentence_end, Ending};
use crate::error::{EngineError, ValidationError};
use crate::length::{self, LengthMode, LengthModel, LengthPlan, LengthRequest, LengthSource};
use crate::limits::{LimitSource, RequestLimits};
use crate::logits::MAX_NO_REPEAT_NGRAM_SIZE;
use crate::package::{Prepared, Restore, TextCodec};
use crate::predictor::SourceText;

/// Texts predicted in one batch of the length predictor: in the server, one turn at it
/// (small enough that others' turns come between a large request's chunks, large enough that
/// BERT still runs batched); offline, the same chunks, so that both see the same batches and
/// predict the same lengths.
pub const PREDICTION_CHUNK: usize = 8;

/// What an exact count's candidates tell the length encoding, in subwords from the count,
/// most useful first (`--exact-plans` takes the first few). Told a little less than the
/// count, the model plans to end near it, finds its sentence closers held back there
/// ([`crate::ending::HOLD_WINDOW`]) and carries the sentence on to the count, where it
/// closes it itself more often than when told the count. Chosen on the Bible dev books
/// (docs/length-control.md, "Exact lengths that end well").
pub const EXACT_PLAN_OFFSETS: [isize; 10] = [-1, -3, -5, 3, -4, 1, -2, 0, 2, -6];

/// A predicted natural length and what predicted it.
pub type Prediction = Option<(f64, LengthSource)>;

/// What one served model needs to turn texts into decoder input and decoder output into
/// translations.
pub struct Pipeline {
    pub name: String,
    pub codec: TextCodec,
    pub eos_id: u32,
    /// Whether its decoder plans a length, and how it predicts one.
    pub length: LengthModel,
    /// The model's own input bound (absolute positions), EOS not counted; `None` when it has
    /// none beyond the request limits.
    pub max_source_tokens: Option<usize>,
    /// The model's own output bound (manifest `limits.max_target_tokens`).
    pub max_target_tokens: usize,
    pub limits: RequestLimits,
}

/// One text that passed every check, and what its decoding needs.
#[derive(Clone, Debug)]
pub struct ValidText {
    pub text: String,
    /// Encoder input (EOS appended, as the model was trained).
    pub source_ids: Vec<i64>,
    /// Subwords of the text (EOS not counted).
    pub source_tokens: usize,
    /// What the translation gets back after decoding (masked placeholders, edges).
    pub restore: Restore,
    pub length: LengthRequest,
    pub no_repeat_ngram_size: usize,
    /// The length it is decoded for; [`LengthPlan::FREE`] until [`Pipeline::set_plans`].
    pub plan: LengthPlan,
    /// What its translation should measure in characters, if the request said: it is then
    /// decoded at several lengths and the best candidate that complies is returned.
    pub goal: Option<CharGoal>,
}

/// How one translation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The model produced EOS.
    Eos,
    /// Decoding stopped at the length budget without EOS.
    Budget,
    /// Refused by validation (offline drivers, which score it as an empty translation; the
    /// server answers the request with the error instead).
    Refused,
}

/// `plans` less the rows that would decode alike: in exact mode every row ends at its length,
/// pulled or not ([`LengthPlan::pulled`] only tells soft mode's rows apart), so one row a
/// target, counting those `tried`.
fn distinct_rows(
    text: &ValidText,
    plans: Vec<LengthPlan>,
    tried: &[LengthPlan],
) -> Vec<LengthPlan> {
    if text.length.mode != LengthMode::Exact {
        return plans;
    }
    let mut seen: std::collections::HashSet<_> = tried.iter().map(|p| (p.target, p.told)).collect();
    plans
        .into_iter()
        .filter(|p| seen.insert((p.target, p.told)))
        .collect()
}

/// A text's rows so far: the plans it was decoded under and, in the same order, what each
/// gave.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attempts {
    pub plans: Vec<LengthPlan>,
    pub outputs: Vec<DecodeOutput>,
}

impl Attempts {
    fn mismatch(&self, index: usize) -> EngineError {
        EngineError::Decode(BackendError::Contract(format!(
            "{} outputs for the {} rows of text {index}",
            self.outputs.len(),
            self.plans.len()
        )))
    }
}

impl Outcome {
    /// The outcome of a text translated in parts: refused, or stopped at the budget, when
    /// one of its parts was.
    pub fn of_parts(parts: impl IntoIterator<Item = Outcome>) -> Outcome {
        parts
            .into_iter()
            .fold(Outcome::Eos, |joined, part| match (joined, part) {
                (Outcome::Refused, _) | (_, Outcome::Refused) => Outcome::Refused,
                (Outcome::Budget, _) | (_, Outcome::Budget) => Outcome::Budget,
                _ => Outcome::Eos,
            })
    }
}

/// One text's translation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Translation {
    pub text: String,
    /// Subword tokens of the input (EOS not counted).
    pub source_tokens: usize,
    /// Subword tokens of `text` (EOS not counted): what was generated, or what is left of it
    /// after a `max_chars` cut.
    pub output_tokens: usize,
    /// The target length it was decoded for; `None` for free decoding.
    pub target_length: Option<usize>,
    pub length_source: Option<LengthSource>,
    /// The predicted natural length (subwords, unrounded), when a prediction was made.
    pub predicted_length: Option<f64>,
    /// How `target_length` was met; `None` for free decoding.
    pub length_mode: Option<LengthMode>,
    /// Longer than `max_chars`, so cut at the last word boundary that fits.
    pub truncated: bool,
    pub outcome: Outcome,
    /// With a character goal, every length it was decoded at and which was returned; empty
    /// otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<Candidate>,
}

impl Translation {
    /// What an offline driver records for a text validation refused.
    pub fn refused(source_tokens: usize) -> Self {
        Translation {
            text: String::new(),
            source_tokens,
            output_tokens: 0,
            target_length: None,
            length_source: None,
            predicted_length: None,
            length_mode: None,
            truncated: false,
            outcome: Outcome::Refused,
            candidates: Vec::new(),
        }
    }
}

/// Whether `text` shows nothing: only whitespace, control characters and the characters
/// Unicode marks default-ignorable (zero-width spaces and joiners, bidirectional marks, the
/// soft hyphen, variation selectors, tags, the byte-order mark). Given such a text, a model
/// invents a translation out of nothing; it is refused as empty instead.
pub fn is_blank(text: &str) -> bool {
    text.chars().all(|c| {
        c.is_whitespace()
            || c.is_control()
            || matches!(
                c,
                '\u{00AD}'
                    | '\u{034F}'
                    | '\u{061C}'
                    | '\u{115F}'
                    | '\u{1160}'
                    | '\u{17B4}'
                    | '\u{17B5}'
                    | '\u{180B}'..='\u{180F}'
                    | '\u{200B}'..='\u{200F}'
                    | '\u{202A}'..='\u{202E}'
                    | '\u{2060}'..='\u{206F}'
                    | '\u{3164}'
                    | '\u{FE00}'..='\u{FE0F}'
                    | '\u{FEFF}'
                    | '\u{FFA0}'
                    | '\u{FFF0}'..='\u{FFF8}'
                    | '\u{1BCA0}'..='\u{1BCA3}'
                    | '\u{1D173}'..='\u{1D17A}'
                    | '\u{E0000}'..='\u{E0FFF}'
            )
    })
}

/// The encoder input of a text's subword `ids`: EOS appended, as the model was trained.
pub fn source_ids(ids: &[u32], eos_id: u32) -> Vec<i64> {
    ids.iter()
        .map(|&id| i64::from(id))
        .chain([i64::from(eos_id)])
        .collect()
}

impl Pipeline {
    /// The input limit that applies, and whose it is.
    pub fn input_limit(&self) -> (usize, LimitSource) {
        self.limits.input_limit(self.max_source_tokens)
    }

    /// Most tokens generated per text.
    pub fn max_output(&self) -> usize {
        self.limits.max_output(self.max_target_tokens)
    }

    /// Checks what applies to a request as a whole: its text count, its length ask and its
    /// n-gram ban; returns the ban that applies.
    pub fn check_request(
        &self,
        texts: usize,
        length: &LengthRequest,
        no_repeat_ngram_size: Option<usize>,
    ) -> Result<usize, ValidationError> {
        if texts == 0 {
            return Err(ValidationError::NoTexts);
        }
        let limit = self.limits.max_texts_per_request;
        if texts > limit {
            return Err(ValidationError::TooManyTexts {
                count: texts,
                limit,
            });
        }
        self.length.check(length, &self.name, self.max_output())?;
        match no_repeat_ngram_size {
            Some(size) if size > MAX_NO_REPEAT_NGRAM_SIZE => {
                Err(ValidationError::NgramSizeTooLarge { size })
            }
            Some(size) => Ok(size),
            None => Ok(self.limits.no_repeat_ngram_size),
        }
    }

    /// Tokenizes text `index` of a request whose whole was checked by
    /// [`Pipeline::check_request`], and checks it against the input limit.
    pub fn validate_text(
        &self,
        index: usize,
        text: String,
        length: LengthRequest,
        no_repeat_ngram_size: usize,
    ) -> Result<ValidText, EngineError> {
        if is_blank(&text) {
            return Err(ValidationError::EmptyText { index }.into());
        }
        let Prepared { ids, restore } = self
            .codec
            .prepare(&text)
            .map_err(|message| EngineError::Tokenize { index, message })?;
        let (limit, limit_source) = self.input_limit();
        if ids.len() > limit {
            return Err(ValidationError::InputTooLong {
                index,
                tokens: ids.len(),
                limit,
                limit_source,
                model: self.name.clone(),
            }
            .into());
        }
        Ok(ValidText {
            source_ids: source_ids(&ids, self.eos_id),
            source_tokens: ids.len(),
            goal: length.char_goal(&text),
            text,
            restore,
            length,
            no_repeat_ngram_size,
            plan: LengthPlan::FREE,
        })
    }

    /// Checks a request and tokenizes its texts; the first refusal wins.
    pub fn validate(
        &self,
        texts: Vec<String>,
        length: LengthRequest,
        no_repeat_ngram_size: Option<usize>,
    ) -> Result<Vec<ValidText>, EngineError> {
        let ban = self.check_request(texts.len(), &length, no_repeat_ngram_size)?;
        texts
            .into_iter()
            .enumerate()
            .map(|(i, text)| self.validate_text(i, text, length, ban))
            .collect()
    }

    /// Whether `text` gets a prediction (see [`length::needs_prediction`]).
    pub fn needs_prediction(&self, text: &ValidText) -> bool {
        length::needs_prediction(&text.length, &self.length)
    }

    /// The linear fit's length of each text: cheap, what stands in for a prediction when
    /// the predictor cannot take a text soon.
    pub fn fit(&self, texts: &[ValidText]) -> Vec<Prediction> {
        let tokens: Vec<usize> = texts.iter().map(|t| t.source_tokens).collect();
        self.length.fit(&tokens)
    }

    /// The predicted natural length of each text. Blocking: a neural network may run.
    pub fn predict<'a>(
        &self,
        texts: impl IntoIterator<Item = &'a ValidText>,
    ) -> Result<Vec<Prediction>, EngineError> {
        let texts: Vec<SourceText> = texts
            .into_iter()
            .map(|t| SourceText {
                text: &t.text,
                source_ids: &t.source_ids,
                source_tokens: t.source_tokens,
            })
            .collect();
        self.length
            .predict(&texts)
            .map_err(|e| EngineError::Predict(format!("{e:#}")))
    }

    /// The plan `text` gets with `predicted` (used only where a prediction is needed).
    pub fn plan(&self, text: &ValidText, predicted: Prediction) -> LengthPlan {
        let predicted = predicted.filter(|_| self.needs_prediction(text));
        length::plan(
            &text.length,
            &self.length,
            text.source_tokens,
            predicted,
            self.max_output(),
        )
    }

    /// Plans every text; `predicted[i]` is text `i`'s prediction.
    pub fn set_plans(&self, texts: &mut [ValidText], predicted: Vec<Prediction>) {
        for (text, p) in texts.iter_mut().zip(predicted) {
            text.plan = self.plan(text, p);
        }
    }

    /// Predicts where needed (in the server's chunks, [`PREDICTION_CHUNK`]) and plans every
    /// text: for drivers that may block.
    pub fn plan_blocking(&self, texts: &mut [ValidText]) -> Result<(), EngineError> {
        let needing: Vec<usize> = (0..texts.len())
            .filter(|&i| self.needs_prediction(&texts[i]))
            .collect();
        let mut predicted = vec![None; texts.len()];
        for chunk in needing.chunks(PREDICTION_CHUNK) {
            let texts_of_chunk = chunk.iter().map(|&i| &texts[i]);
            for (&i, p) in chunk.iter().zip(self.predict(texts_of_chunk)?) {
                predicted[i] = p;
            }
        }
        self.set_plans(texts, predicted);
        Ok(())
    }

    /// The plans `text` is decoded under first: its own, or with a character goal the
    /// candidates around it.
    pub fn first_plans(&self, text: &ValidText) -> Vec<LengthPlan> {
        self.plans_for(text, &text.plan)
    }

    /// How a row of `text` under `plan`, of at most `length` tokens, ends as its source does
    /// ([`crate::ending`]): an exact count on a closer like the source's (unless
    /// `--exact-plans` is 0), a soft row under `max_chars` alone only after one; `None`
    /// otherwise, or where the source ends in no sentence punctuation.
    fn ending(&self, text: &ValidText, plan: &LengthPlan, length: usize) -> Option<Ending> {
        let closers = self.codec.closers();
        let subtitle = text
            .goal
            .is_some_and(|g| g.at_most.is_some() && g.about.is_none());
        match text.length.mode {
            LengthMode::Exact if plan.target.is_some() && self.limits.exact_plans > 0 => {
                closers.ending_for(&text.text, length)
            }
            LengthMode::Soft if subtitle => closers.gate_for(&text.text),
            _ => None,
        }
    }

    /// An exact count that ends as its source does ([`crate::ending`]): rows forced to the
    /// count, each telling the length encoding a length around it
    /// ([`EXACT_PLAN_OFFSETS`]); the model's best is returned. Otherwise `plan` alone.
    fn exact_candidates(&self, text: &ValidText, plan: &LengthPlan) -> Vec<LengthPlan> {
        let exact = text.length.mode == LengthMode::Exact && self.length.length_aware;
        match plan.target {
            Some(n) if exact && self.ending(text, plan, n).is_some() => EXACT_PLAN_OFFSETS
                .iter()
                .take(self.limits.exact_plans)
                .filter_map(|&offset| n.checked_add_signed(offset).filter(|&t| t >= 1))
                .map(|told| LengthPlan {
                    told: (told != n).then_some(told),
                    ..*plan
                })
                .collect(),
            _ => vec![*plan],
        }
    }

    /// The rows the decode loop takes for `text` under `plans`, scored when there is more
    /// than one to choose from (a character goal's, an exact count's).
    pub fn rows_of(&self, text: &ValidText, plans: &[LengthPlan]) -> Vec<DecodeInput> {
        plans
            .iter()
            .map(|p| DecodeInput {
                score: text.goal.is_some() || plans.len() > 1,
                ..self.decode_input_for(text, p)
            })
            .collect()
    }

    /// The first rows of `text` under `plan` instead of its own (admission counts a
    /// stand-in plan's rows before the real one is made).
    pub fn rows_for(&self, text: &ValidText, plan: &LengthPlan) -> Vec<DecodeInput> {
        self.rows_of(text, &self.plans_for(text, plan))
    }

    fn plans_for(&self, text: &ValidText, plan: &LengthPlan) -> Vec<LengthPlan> {
        let Some(goal) = &text.goal else {
            return self.exact_candidates(text, plan);
        };
        let plans = goal.candidate_plans(plan, self.length.chars_per_subword, self.max_output());
        distinct_rows(text, plans, &[])
    }

    /// What the decode loop takes for `text` under `plan`.
    fn decode_input_for(&self, text: &ValidText, plan: &LengthPlan) -> DecodeInput {
        let input = length::decode_input(
            text.source_ids.clone(),
            text.source_tokens,
            plan,
            text.length.mode,
            self.length.length_aware,
            &self.limits,
            self.max_output(),
        );
        let ending = self.ending(text, plan, input.max_output_tokens);
        DecodeInput {
            no_repeat_ngram_size: text.no_repeat_ngram_size,
            ending,
            ..input
        }
    }

    /// The plans of a second round for text `index` when none of its candidates so far
    /// meets its character goal ([`CharGoal::second_round`]); empty otherwise.
    pub fn second_round(
        &self,
        index: usize,
        text: &ValidText,
        attempts: &Attempts,
    ) -> Result<Vec<LengthPlan>, EngineError> {
        let Some(goal) = &text.goal else {
            return Ok(Vec::new());
        };
        let (_, candidates) = self.candidates(index, text, Some(goal), attempts)?;
        let plans = goal.second_round(&attempts.plans, &candidates, self.max_output());
        Ok(distinct_rows(text, plans, &attempts.plans))
    }

    /// The translation of text `index` from what its rows gave: with a character goal, the
    /// candidate [`CharGoal::choose`] picks, cut at a word boundary if it is still over
    /// `max_chars`.
    pub fn finish(
        &self,
        index: usize,
        text: &ValidText,
        attempts: &Attempts,
    ) -> Result<Translation, EngineError> {
        if let (None, [plan]) = (&text.goal, attempts.plans.as_slice()) {
            return self.translation(index, text, plan, &attempts.outputs[0]);
        }
        let goal = text.goal.as_ref();
        let (mut translations, mut candidates) = self.candidates(index, text, goal, attempts)?;
        let chosen = match goal {
            Some(goal) => {
                let exact = text.length.mode == LengthMode::Exact;
                goal.choose(&candidates, sentence_end(&text.text), exact)
            }
            None => char_length::best_scored(&candidates),
        };
        candidates[chosen].chosen = true;
        let mut translation = translations.swap_remove(chosen);
        if let Some(max_chars) = goal.and_then(|g| g.at_most) {
            self.cut(index, &mut translation, max_chars)?;
        }
        translation.candidates = candidates;
        Ok(translation)
    }

    /// Each attempt's translation, and its candidate for `goal`.
    fn candidates(
        &self,
        index: usize,
        text: &ValidText,
        goal: Option<&CharGoal>,
        attempts: &Attempts,
    ) -> Result<(Vec<Translation>, Vec<Candidate>), EngineError> {
        if attempts.plans.len() != attempts.outputs.len() || attempts.plans.is_empty() {
            return Err(attempts.mismatch(index));
        }
        let translations = attempts
            .plans
            .iter()
            .zip(&attempts.outputs)
            .map(|(plan, output)| self.translation(index, text, plan, output))
            .collect::<Result<Vec<_>, _>>()?;
        let candidates = translations
            .iter()
            .zip(&attempts.outputs)
            .zip(&attempts.plans)
            .map(|((t, output), plan)| {
                // Exact mode ends a character goal's rows at their lengths, their planned
                // ends; an exact count's rows end where the model would have ended them only
                // when it chose the closer itself.
                let ended = t.outcome == Outcome::Eos
                    || (text.length.mode == LengthMode::Exact
                        && (goal.is_some() || output.closed_freely));
                Candidate {
                    target_length: t.target_length,
                    planned_length: plan.told,
                    characters: t.text.chars().count(),
                    output_tokens: t.output_tokens,
                    score: output.log_prob.unwrap_or(f64::NEG_INFINITY)
                        / (t.output_tokens + usize::from(ended)).max(1) as f64,
                    complies: goal.is_none_or(|g| g.complies(&t.text)),
                    ended,
                    chosen: false,
                    text: t.text.clone(),
                }
            })
            .collect();
        Ok((translations, candidates))
    }

    /// The translation of text `index` from what the decode loop produced for it under
    /// `plan`.
    fn translation(
        &self,
        index: usize,
        text: &ValidText,
        plan: &LengthPlan,
        output: &DecodeOutput,
    ) -> Result<Translation, EngineError> {
        let detokenized = self
            .codec
            .finish(&output.ids, &text.restore)
            .map_err(|message| EngineError::Detokenize { index, message })?;
        Ok(Translation {
            text: detokenized,
            source_tokens: text.source_tokens,
            output_tokens: output.ids.len(),
            target_length: plan.target,
            length_source: plan.source,
            predicted_length: plan.predicted,
            length_mode: plan.target.map(|_| text.length.mode),
            truncated: false,
            outcome: match output.stop {
                StopReason::Eos => Outcome::Eos,
                StopReason::MaxLength => Outcome::Budget,
            },
            candidates: Vec::new(),
        })
    }

    /// Cuts a translation over `max_chars` at the last word boundary that fits.
    fn cut(
        &self,
        index: usize,
        translation: &mut Translation,
        max_chars: usize,
    ) -> Result<(), EngineError> {
        if let Some(cut) = length::cut_to_chars(&translation.text, max_chars) {
            // The client is told the length of what it gets, not of what was decoded.
            translation.output_tokens = self
                .codec
                .encode(&cut)
                .map_err(|message| EngineError::Tokenize { index, message })?
                .len();
            translation.text = cut;
            translation.truncated = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::length::TargetLength;
    use crate::logits::EosRule;
    use crate::testing::{self, SPECIAL};

    fn pipeline(limits: RequestLimits) -> Pipeline {
        Pipeline {
            name: "dev-copy".into(),
            codec: TextCodec::new(testing::tokenizer()),
            eos_id: SPECIAL.eos,
            length: LengthModel::without_prediction(false),
            max_source_tokens: Some(3),
            max_target_tokens: 64,
            limits,
        }
    }

    #[test]
    fn validation_names_the_text_and_the_limit() {
        let p = pipeline(RequestLimits {
            max_texts_per_request: 2,
            ..RequestLimits::default()
        });
        let texts = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let none = LengthRequest::default();
        let err = |r: Result<Vec<ValidText>, EngineError>| match r {
            Err(EngineError::Invalid(e)) => e,
            other => panic!("{:?}", other.map(|v| v.len())),
        };
        assert_eq!(
            err(p.validate(vec![], none, None)),
            ValidationError::NoTexts
        );
        assert!(matches!(
            err(p.validate(texts(&["a", "b", "c"]), none, None)),
            ValidationError::TooManyTexts { count: 3, limit: 2 }
        ));
        assert_eq!(
            err(p.validate(texts(&["hello", " \n"]), none, None)),
            ValidationError::EmptyText { index: 1 }
        );
        let long = err(p.validate(texts(&["the cat sat on the mat"]), none, None));
        assert!(matches!(
            long,
            ValidationError::InputTooLong {
                index: 0,
                tokens: 6,
                limit: 3,
                limit_source: LimitSource::Model,
                ..
            }
        ));
        assert!(long.to_string().contains("model `dev-copy`"), "{long}");
        assert!(matches!(
            err(p.validate(texts(&["hello"]), none, Some(65))),
            ValidationError::NgramSizeTooLarge { size: 65 }
        ));
        let exact = LengthRequest {
            target: Some(TargetLength::Tokens(2)),
            mode: LengthMode::Exact,
            max_chars: None,
            target_chars: None,
        };
        let valid = p.validate(texts(&["hello world"]), exact, None).unwrap();
        assert_eq!(valid[0].source_ids, vec![4, 5, i64::from(SPECIAL.eos)]);
        assert_eq!(
            valid[0].no_repeat_ngram_size,
            RequestLimits::default().no_repeat_ngram_size
        );
    }

    #[test]
    fn texts_of_only_invisible_characters_are_empty() {
        for blank in [
            "",
            " \n\t",
            "\u{200B}",
            "\u{FEFF}\u{200D} \u{2060}",
            "\u{00AD}\u{E0041}",
            "\u{0007}",
        ] {
            assert!(is_blank(blank), "{blank:?}");
        }
        for shown in ["a", "\u{200B}a", "é", "\u{1F600}", "\u{0301}", "½"] {
            assert!(!is_blank(shown), "{shown:?}");
        }
        let p = pipeline(RequestLimits::default());
        let refused = p.validate(
            vec!["hello".into(), "\u{200B}\u{200B}".into()],
            LengthRequest::default(),
            None,
        );
        assert!(matches!(
            refused,
            Err(EngineError::Invalid(ValidationError::EmptyText {
                index: 1
            }))
        ));
    }

    #[test]
    fn a_text_in_parts_is_refused_or_stopped_when_a_part_was() {
        use Outcome::{Budget, Eos, Refused};
        assert_eq!(Outcome::of_parts([]), Eos);
        assert_eq!(Outcome::of_parts([Eos, Budget, Eos]), Budget);
        assert_eq!(Outcome::of_parts([Budget, Refused, Eos]), Refused);
    }

    #[test]
    fn a_cut_reports_the_subwords_it_kept() {
        let p = Pipeline {
            max_source_tokens: None,
            ..pipeline(RequestLimits::default())
        };
        let ask = LengthRequest {
            target: Some(TargetLength::Tokens(4)),
            mode: LengthMode::Exact,
            max_chars: Some(9),
            target_chars: None,
        };
        let mut texts = p
            .validate(vec!["one two three four".into()], ask, None)
            .unwrap();
        p.plan_blocking(&mut texts).unwrap();
        assert_eq!(
            texts[0].plan.target,
            Some(2),
            "max_chars 9 caps the plan at 9/4 subwords"
        );
        let plans = p.first_plans(&texts[0]);
        let rows = p.rows_of(&texts[0], &plans);
        let targets: Vec<_> = rows.iter().map(|r| r.max_output_tokens).collect();
        assert_eq!(
            targets,
            vec![2, 1],
            "the cap's length and shorter candidates"
        );
        assert!(rows.iter().all(|r| r.score));
        let output = |ids: Vec<u32>, stop| DecodeOutput {
            ids,
            stop,
            log_prob: Some(-1.0),
            closed_freely: false,
        };
        let outputs = [
            output(vec![24, 25, 26, 27], StopReason::MaxLength),
            output(vec![24, 25, 26], StopReason::Eos),
        ];
        let attempts = Attempts {
            plans,
            outputs: outputs.to_vec(),
        };
        let second = p.second_round(0, &texts[0], &attempts).unwrap();
        assert!(
            second.is_empty(),
            "the candidates' own ratio asks for no new length: {second:?}"
        );
        let translation = p.finish(0, &texts[0], &attempts).unwrap();
        // Nothing fits: the shortest candidate, cut.
        assert_eq!(translation.text, "one two");
        assert_eq!(translation.output_tokens, 2);
        assert_eq!(translation.target_length, Some(1));
        let chosen: Vec<_> = translation.candidates.iter().map(|c| c.chosen).collect();
        assert_eq!(chosen, vec![false, true]);
        assert_eq!(translation.candidates[1].text, "one two three");
        assert_eq!(translation.candidates[1].score, -0.25);
        assert!(translation.truncated);
    }

    #[test]
    fn an_exact_count_is_planned_around_and_the_model_s_own_ending_wins() {
        let p = Pipeline {
            codec: TextCodec::new(testing::shipped_tokenizer()),
            length: LengthModel::without_prediction(true),
            max_source_tokens: None,
            ..pipeline(RequestLimits::default())
        };
        let ask = LengthRequest {
            target: Some(TargetLength::Tokens(6)),
            mode: LengthMode::Exact,
            max_chars: None,
            target_chars: None,
        };
        let mut texts = p
            .validate(vec!["It ends here.".into(), "no ending".into()], ask, None)
            .unwrap();
        p.plan_blocking(&mut texts).unwrap();
        let plans = p.first_plans(&texts[0]);
        let rows = p.rows_of(&texts[0], &plans);
        assert_eq!(rows.len(), RequestLimits::default().exact_plans);
        assert!(rows.iter().all(|r| r.max_output_tokens == 6
            && r.eos == EosRule::BanUntil(6)
            && r.score
            && matches!(r.ending, Some(Ending::AtCount { length: 6, .. }))));
        let told: Vec<_> = rows.iter().map(|r| r.target_length.unwrap()).collect();
        let expected: Vec<_> = EXACT_PLAN_OFFSETS
            .iter()
            .take(rows.len())
            .map(|&o| 6usize.checked_add_signed(o).unwrap())
            .collect();
        assert_eq!(told, expected);
        // Without sentence punctuation to end on, one row, as before.
        let plain = p.rows_of(&texts[1], &p.first_plans(&texts[1]));
        assert_eq!(plain.len(), 1);
        assert_eq!(plain[0].ending, None);

        let ids = p.codec.encode("Y así termina aquí.").unwrap();
        let output = |log_prob, closed_freely| DecodeOutput {
            ids: ids.clone(),
            stop: StopReason::MaxLength,
            log_prob: Some(log_prob),
            closed_freely,
        };
        // The likeliest row was made to close; the one the model closed itself wins.
        let mut outputs = vec![output(-1.0, false); plans.len()];
        outputs[2] = output(-9.0, true);
        let attempts = Attempts { plans, outputs };
        let translation = p.finish(0, &texts[0], &attempts).unwrap();
        let chosen: Vec<_> = translation.candidates.iter().map(|c| c.chosen).collect();
        assert!(chosen[2] && chosen.iter().filter(|&&c| c).count() == 1);
        assert_eq!(translation.candidates[2].planned_length, Some(expected[2]));
        assert_eq!(translation.candidates[0].planned_length, Some(expected[0]));
        assert!(translation.candidates.iter().all(|c| c.complies));
    }
}
