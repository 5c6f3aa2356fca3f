//! Splitting a text into sentences for `split_sentences`, and joining their translations with
//! the text's own whitespace: Wikimedia's segmenter ([`sentencex`]), which knows each
//! language's abbreviations and sentence ends.

use crate::pipeline::{is_blank, Outcome, Translation};

/// A text cut into sentences: `gaps[0]` comes before the first sentence, `gaps[i]` between
/// sentence `i - 1` and sentence `i`, and the last gap after the last sentence, so that
/// `gaps[0] + sentences[0] + gaps[1] + … + sentences[n - 1] + gaps[n]` is the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sentences {
    pub sentences: Vec<String>,
    /// One more than the sentences: the whitespace (and anything blank) around them.
    pub gaps: Vec<String>,
}

impl Sentences {
    /// `translations` (one per sentence, in order) with the text's own whitespace between.
    pub fn join<S: AsRef<str>>(&self, translations: &[S]) -> String {
        debug_assert_eq!(translations.len(), self.sentences.len());
        let mut out = String::new();
        for (gap, sentence) in self.gaps.iter().zip(translations) {
            out.push_str(gap);
            out.push_str(sentence.as_ref());
        }
        if let Some(last) = self.gaps.last() {
            out.push_str(last);
        }
        out
    }
}

/// One translation per text from its sentences' translations (`translations` in order, text
/// after text, `split[i]` text `i`'s sentences): joined with the text's own whitespace, the
/// subword counts summed (a target or predicted length only when every sentence had one),
/// the first sentence's length source and mode, cut or refused or stopped at the budget when
/// one of its sentences was.
pub fn join_translations(split: &[Sentences], translations: Vec<Translation>) -> Vec<Translation> {
    let mut translations = translations.into_iter();
    split
        .iter()
        .map(|sentences| {
            let parts: Vec<Translation> = translations
                .by_ref()
                .take(sentences.sentences.len())
                .collect();
            let texts: Vec<&str> = parts.iter().map(|t| t.text.as_str()).collect();
            Translation {
                text: sentences.join(&texts),
                source_tokens: parts.iter().map(|t| t.source_tokens).sum(),
                output_tokens: parts.iter().map(|t| t.output_tokens).sum(),
                target_length: parts.iter().map(|t| t.target_length).sum(),
                length_source: parts.first().and_then(|t| t.length_source),
                predicted_length: parts.iter().map(|t| t.predicted_length).sum(),
                length_mode: parts.first().and_then(|t| t.length_mode),
                truncated: parts.iter().any(|t| t.truncated),
                outcome: Outcome::of_parts(parts.iter().map(|t| t.outcome)),
                candidates: Vec::new(),
            }
        })
        .collect()
}

/// Cuts `text` into the sentences of `language` (an ISO 639-1 code such as `"en"`; the
/// segmenter falls back to English's rules for a language it does not know). Each sentence is
/// trimmed of whitespace, which goes to the gaps; a piece that is blank ([`is_blank`]) joins
/// the gap it stands in. A blank text has no sentences and one gap, itself.
pub fn split(language: &str, text: &str) -> Sentences {
    let base = text.as_ptr() as usize;
    let mut sentences = Vec::new();
    let mut gaps = Vec::new();
    // Where the gap before the next sentence starts.
    let mut gap_start = 0;
    for piece in sentencex::segment(language, text) {
        if is_blank(piece) {
            continue;
        }
        // The segmenter returns slices of `text` (it may leave out paragraph breaks between
        // its chunks of a long text, which then fall into a gap here).
        let offset = piece.as_ptr() as usize - base;
        let trimmed = piece.trim_start();
        let start = offset + (piece.len() - trimmed.len());
        let end = start + trimmed.trim_end().len();
        gaps.push(text[gap_start..start].to_string());
        sentences.push(text[start..end].to_string());
        gap_start = end;
    }
    gaps.push(text[gap_start..].to_string());
    Sentences { sentences, gaps }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips(text: &str) -> Sentences {
        let split = split("en", text);
        assert_eq!(split.gaps.len(), split.sentences.len() + 1);
        assert_eq!(split.join(&split.sentences), text);
        split
    }

    #[test]
    fn splits_sentences_and_keeps_the_whitespace() {
        let split = round_trips(" Hello there.  How are you?\nFine, Mr. Smith. ");
        assert_eq!(
            split.sentences,
            ["Hello there.", "How are you?", "Fine, Mr. Smith."]
        );
        assert_eq!(split.gaps, [" ", "  ", "\n", " "]);
    }

    #[test]
    fn one_sentence_and_blank_texts() {
        let split = round_trips("No end of sentence here");
        assert_eq!(split.sentences, ["No end of sentence here"]);
        assert_eq!(split.gaps, ["", ""]);
        let split = round_trips(" \n\t");
        assert!(split.sentences.is_empty());
        assert_eq!(split.join::<&str>(&[]), " \n\t");
    }

    #[test]
    fn paragraphs_and_long_texts() {
        round_trips("First paragraph. Still first.\n\nSecond paragraph!\n\n\nThird?");
        // Over the segmenter's 10 KB chunk, where it cuts at paragraph breaks.
        let long = "A sentence of a long text. Another one here.\n\n".repeat(400);
        let split = round_trips(&long);
        assert_eq!(split.sentences.len(), 800);
    }
}
