//! How a translation ends: the sentence punctuation a text ends with, and in exact mode a
//! row made to end as its source does. Forced to a count of subwords, a length-aware model
//! that planned a little short ends its sentence early and pads the count with the start of
//! another ("... el sueño. Y el"); exact mode's rows instead end on a sentence closer like
//! the source's, and hold closers back in the few tokens before it, so that the sentence is
//! carried to the count rather than ended short of it.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokenizers::Tokenizer;

/// Tokens before an exact row's last one in which sentence closers are held back: an early
/// end this close to the count leaves a fragment to pad it with. Chosen, not tuned: no other
/// window was measured (docs/length-control.md, "Exact lengths that end well").
pub const HOLD_WINDOW: usize = 4;

/// Characters that end a sentence (or a clause the next sentence continues, as a source's
/// colon does).
const SENTENCE_ENDS: [char; 6] = ['.', '!', '?', '…', ':', ';'];

/// What may follow the sentence punctuation at a text's end.
const CLOSING_MARKS: [char; 7] = ['"', '\'', '»', '”', '’', ')', ']'];

/// The sentence punctuation `text` ends with, closing quotes and brackets passed over.
pub fn sentence_end(text: &str) -> Option<char> {
    text.trim_end()
        .trim_end_matches(CLOSING_MARKS)
        .chars()
        .next_back()
        .filter(|c| SENTENCE_ENDS.contains(c))
}

/// A vocabulary's sentence closers by the punctuation they end with: pieces made only of
/// sentence punctuation and closing marks that attach to the word before them (".", "».",
/// ")."), never a special token.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Closers {
    by_end: BTreeMap<char, Arc<[u32]>>,
}

impl Closers {
    pub fn of(tokenizer: &Tokenizer) -> Closers {
        let special: std::collections::HashSet<u32> = tokenizer
            .get_added_tokens_decoder()
            .keys()
            .copied()
            .collect();
        let mut by_end: BTreeMap<char, Vec<u32>> = BTreeMap::new();
        for (piece, id) in tokenizer.get_vocab(false) {
            let closes = !piece.is_empty()
                && piece
                    .chars()
                    .all(|c| SENTENCE_ENDS.contains(&c) || CLOSING_MARKS.contains(&c));
            if let (true, false, Some(end)) = (closes, special.contains(&id), sentence_end(&piece))
            {
                by_end.entry(end).or_default().push(id);
            }
        }
        Closers {
            by_end: by_end
                .into_iter()
                .map(|(end, mut ids)| {
                    ids.sort_unstable();
                    (end, ids.into())
                })
                .collect(),
        }
    }

    /// The ending an exact row of `length` tokens gets when its source is `source`: none
    /// when the source does not end in sentence punctuation, the vocabulary has no closer
    /// for it, or the row is one token (a closer alone is no translation).
    pub fn ending_for(&self, source: &str, length: usize) -> Option<Ending> {
        if length < 2 {
            return None;
        }
        Some(Ending::AtCount {
            tokens: self.closers_for(source)?,
            length,
        })
    }

    /// The ending a soft row under a character cap gets when its source is `source`: none
    /// when the source does not end in sentence punctuation or the vocabulary has no closer
    /// for it.
    pub fn gate_for(&self, source: &str) -> Option<Ending> {
        Some(Ending::AfterCloser {
            tokens: self.closers_for(source)?,
        })
    }

    fn closers_for(&self, source: &str) -> Option<Arc<[u32]>> {
        self.by_end.get(&sentence_end(source)?).cloned()
    }
}

/// How one row is made to end as its source does.
#[derive(Clone, Debug, PartialEq)]
pub enum Ending {
    /// Exact mode: the `length`-th token is one of `tokens`, and none of them comes in the
    /// [`HOLD_WINDOW`] tokens before it.
    AtCount { tokens: Arc<[u32]>, length: usize },
    /// A soft row under a character cap (a subtitle should read as a sentence): EOS only
    /// right after one of `tokens`; before one, the length rule's pull on EOS goes to them
    /// instead, so that where the rule would stop the row mid-clause it closes the sentence.
    AfterCloser { tokens: Arc<[u32]> },
}

/// What an [`Ending`] does to a row's next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EndingStep<'a> {
    /// Nothing: the row is far from its end.
    Open,
    /// None of these: a closer here would end the sentence short of the count.
    Hold(&'a [u32]),
    /// One of these: the last token.
    Close(&'a [u32]),
    /// Not EOS: the sentence is not closed yet; the pull on EOS goes to these.
    Steer(&'a [u32]),
}

impl Ending {
    /// The rule for the token after `ids`.
    pub fn at(&self, ids: &[u32]) -> EndingStep<'_> {
        match self {
            Ending::AtCount { tokens, length } => {
                let last = length.saturating_sub(1);
                let produced = ids.len();
                if produced >= last {
                    EndingStep::Close(tokens)
                } else if produced + HOLD_WINDOW >= last {
                    EndingStep::Hold(tokens)
                } else {
                    EndingStep::Open
                }
            }
            Ending::AfterCloser { tokens } => match ids.last() {
                Some(last) if tokens.contains(last) => EndingStep::Open,
                _ => EndingStep::Steer(tokens),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn sentence_ends_pass_over_closing_quotes() {
        assert_eq!(sentence_end("Dijo: «Ven.»"), Some('.'));
        assert_eq!(sentence_end("¿Vienes?) "), Some('?'));
        assert_eq!(sentence_end("y de"), None);
        assert_eq!(sentence_end("uno, dos,"), None);
    }

    #[test]
    fn closers_are_punctuation_pieces_that_end_as_asked() {
        let tokenizer = testing::shipped_tokenizer();
        let closers = Closers::of(&tokenizer);
        let Some(Ending::AtCount { tokens, .. }) = closers.ending_for("It ends.", 5) else {
            panic!("the shipped vocabulary has '.'");
        };
        for &id in tokens.iter() {
            let piece = tokenizer.id_to_token(id).unwrap();
            assert_eq!(sentence_end(&piece), Some('.'), "{piece}");
            assert!(!piece.chars().any(char::is_alphanumeric), "{piece}");
        }
        assert_eq!(closers.ending_for("no ending", 5), None);
        assert_eq!(closers.ending_for("It ends.", 1), None);
    }

    #[test]
    fn an_ending_holds_closers_back_then_closes() {
        let ending = Ending::AtCount {
            tokens: vec![7, 9].into(),
            length: 10,
        };
        let at = |produced: usize| ending.at(&vec![5; produced]);
        assert_eq!(at(0), EndingStep::Open);
        assert_eq!(at(9 - HOLD_WINDOW - 1), EndingStep::Open);
        assert_eq!(at(9 - HOLD_WINDOW), EndingStep::Hold(&[7, 9]));
        assert_eq!(at(8), EndingStep::Hold(&[7, 9]));
        assert_eq!(at(9), EndingStep::Close(&[7, 9]));
    }

    #[test]
    fn a_gated_row_may_end_only_after_a_closer() {
        let gate = Ending::AfterCloser {
            tokens: vec![7, 9].into(),
        };
        assert_eq!(gate.at(&[]), EndingStep::Steer(&[7, 9]));
        assert_eq!(gate.at(&[4, 5]), EndingStep::Steer(&[7, 9]));
        assert_eq!(gate.at(&[4, 9]), EndingStep::Open);
        assert_eq!(gate.at(&[4, 9, 5]), EndingStep::Steer(&[7, 9]));
    }
}
