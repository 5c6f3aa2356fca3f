//! What SubRip and WebVTT share: cue texts in, cue texts out, one for one. Each cue's lines
//! are translated as one text (its line breaks are layout, not meaning). A cue that ends
//! mid-sentence is translated together with the cues after it up to the one that ends the
//! sentence (at most [`MAX_JOINED_CUES`]), because a sentence cut in pieces is translated
//! piece by piece badly, and the translation is split back across those cues at word
//! boundaries, in proportion to their source lengths. Each cue is then laid out in at most two
//! lines of at most `--max-line-chars` characters. The engine is asked for at most that much
//! text (`max_chars`: two lines a cue, summed over joined cues), so it plans a translation that
//! fits instead of decoding one that must be cut.

use std::ops::Range;

use anyhow::Result;
use nmt_engine::{Outcome, Translation};

use crate::translator::Translator;

/// Most cues translated as one text: a sentence rarely spans more, and a file without
/// punctuation must not become one text.
pub const MAX_JOINED_CUES: usize = 4;
/// Lines a cue is laid out in.
pub const MAX_LINES: usize = 2;

/// What a subtitle run did, for the summary line.
#[derive(Debug, Default, PartialEq)]
pub struct SubtitleReport {
    pub cues: usize,
    /// Texts sent to the model.
    pub texts: usize,
    /// Cues translated together with the next.
    pub joined: usize,
}

impl SubtitleReport {
    pub fn describe(&self) -> String {
        format!(
            "{} cues as {} texts ({} cues joined with the next)",
            self.cues, self.texts, self.joined
        )
    }
}

/// A cue's text as the model gets it.
#[derive(Debug, PartialEq)]
struct CueText {
    /// Markup around the whole cue (`<i>`..`</i>`, `<v Roger>`, `{\an8}`), put back around its
    /// translation; markup inside a cue is dropped, as a translation has no place for it.
    open: String,
    close: String,
    /// The words on one line, without markup.
    plain: String,
}

/// Translates the cue texts `payloads` (lines separated by `\n`); returns the new ones, the
/// same number, each at most [`MAX_LINES`] lines of at most `max_line_chars` characters.
pub fn translate_cues(
    payloads: &[String],
    translator: &mut Translator,
    max_line_chars: usize,
) -> Result<(Vec<String>, SubtitleReport)> {
    let cues: Vec<CueText> = payloads.iter().map(|p| cue_text(p)).collect();
    let groups: Vec<Range<usize>> = groups(&cues)
        .into_iter()
        .filter(|g| has_words(&cues[g.start].plain))
        .collect();
    let mut report = SubtitleReport {
        cues: cues.len(),
        texts: groups.len(),
        joined: groups.iter().map(|g| g.len() - 1).sum(),
    };
    translator.start_progress(Some(groups.len()), "texts");
    let translations = translate_groups(&cues, &groups, translator, max_line_chars)?;
    let mut out = payloads.to_vec();
    let mut one_by_one = Vec::new();
    for (group, t) in groups.iter().zip(&translations) {
        if t.outcome == Outcome::Refused || t.text.trim().is_empty() {
            continue; // Left as it was, which the summary line counts.
        }
        let shares: Vec<usize> = group
            .clone()
            .map(|i| cues[i].plain.chars().count())
            .collect();
        match split_back(&t.text, &shares, max_line_chars) {
            Some(parts) => {
                for (i, part) in group.clone().zip(parts) {
                    out[i] = render(&cues[i], &part, max_line_chars, translator);
                }
            }
            // Fewer words than cues: each cue alone.
            None => one_by_one.extend(group.clone().map(|i| i..i + 1)),
        }
    }
    if !one_by_one.is_empty() {
        translator.bar.inc_length(one_by_one.len() as u64);
        report.texts += one_by_one.len();
        let translations = translate_groups(&cues, &one_by_one, translator, max_line_chars)?;
        for (group, t) in one_by_one.iter().zip(&translations) {
            if t.outcome != Outcome::Refused && !t.text.trim().is_empty() {
                out[group.start] = render(&cues[group.start], &t.text, max_line_chars, translator);
            }
        }
    }
    Ok((out, report))
}

/// One text per group, with a budget of [`MAX_LINES`] lines per cue.
fn translate_groups(
    cues: &[CueText],
    groups: &[Range<usize>],
    translator: &mut Translator,
    max_line_chars: usize,
) -> Result<Vec<Translation>> {
    let texts: Vec<String> = groups
        .iter()
        .map(|g| {
            let plains: Vec<&str> = cues[g.clone()].iter().map(|c| c.plain.as_str()).collect();
            plains.join(" ")
        })
        .collect();
    let budgets: Vec<Option<usize>> = groups
        .iter()
        .map(|g| Some(MAX_LINES * max_line_chars * g.len()))
        .collect();
    translator.translate(&texts, &budgets)
}

/// `text` laid out for `cue`, in its markup; a text that cannot be laid out is cut, and
/// counted as cut.
fn render(cue: &CueText, text: &str, max_line_chars: usize, translator: &mut Translator) -> String {
    let text = text.replace("-->", "->"); // A cue's text must not hold its timing arrow.
    let lines = layout(&text, max_line_chars).unwrap_or_else(|| {
        translator.totals.truncated += 1;
        cut_to_lines(&text, max_line_chars)
    });
    format!("{}{}{}", cue.open, lines.join("\n"), cue.close)
}

/// A cue's text: its lines joined, its wrapping markup apart, other markup dropped.
fn cue_text(payload: &str) -> CueText {
    let joined = payload.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut inner = joined.as_str();
    let mut open = String::new();
    while let Some(tag) = leading_tag(inner) {
        open.push_str(tag);
        inner = inner[tag.len()..].trim_start();
    }
    let mut close = String::new();
    while let Some(tag) = trailing_tag(inner) {
        close.insert_str(0, tag);
        inner = inner[..inner.len() - tag.len()].trim_end();
    }
    if strip_markup(inner) != inner {
        // Markup inside: nothing wraps the whole cue.
        return CueText {
            open: String::new(),
            close: String::new(),
            plain: squeeze(&strip_markup(&joined)),
        };
    }
    CueText {
        open,
        close,
        plain: inner.to_string(),
    }
}

/// A `<tag>` or `{\override}` at the start of `text`.
fn leading_tag(text: &str) -> Option<&str> {
    let close = match text.chars().next()? {
        '<' => '>',
        '{' if text.starts_with("{\\") => '}',
        _ => return None,
    };
    text.find(close).map(|end| &text[..=end])
}

/// A `</tag>` (or any `<tag>`) at the end of `text`.
fn trailing_tag(text: &str) -> Option<&str> {
    if !text.ends_with('>') {
        return None;
    }
    text.rfind('<').map(|start| &text[start..])
}

fn strip_markup(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(['<', '{']) {
        out.push_str(&rest[..start]);
        match leading_tag(&rest[start..]) {
            Some(tag) => rest = &rest[start + tag.len()..],
            None => {
                out.push_str(&rest[start..start + 1]);
                rest = &rest[start + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn squeeze(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn has_words(text: &str) -> bool {
    text.chars().any(char::is_alphanumeric)
}

/// Runs of cues translated together: a cue that does not end a sentence is joined with the
/// next, up to [`MAX_JOINED_CUES`]; a cue without words (`♪`) stands alone, and is kept.
fn groups(cues: &[CueText]) -> Vec<Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    while start < cues.len() {
        let mut end = start + 1;
        while end < cues.len()
            && end - start < MAX_JOINED_CUES
            && has_words(&cues[end - 1].plain)
            && has_words(&cues[end].plain)
            && !ends_sentence(&cues[end - 1].plain)
        {
            end += 1;
        }
        groups.push(start..end);
        start = end;
    }
    groups
}

/// Whether `text` ends a sentence (after closing quotes and brackets): `.`, `!`, `?`, an
/// ellipsis, a dash that breaks off speech, or the note that ends a sung line.
fn ends_sentence(text: &str) -> bool {
    let text = text.trim_end_matches(['"', '\'', '”', '’', '»', ')', ']', ' ']);
    text.ends_with(['.', '!', '?', '…', '-', '—', '♪'])
}

/// `text` split at word boundaries into `shares.len()` non-empty parts whose lengths follow
/// `shares` (the source cues' lengths), at good breaks where one is near (see
/// [`break_penalty`]), each part one that can be laid out if there is one; `None` when there
/// are fewer words than parts.
fn split_back(text: &str, shares: &[usize], max_line_chars: usize) -> Option<Vec<String>> {
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.len() < shares.len() {
        return None;
    }
    // Characters up to the end of word k, spaces between words included.
    let upto: Vec<usize> = words
        .iter()
        .scan(0, |n, w| {
            *n += w.chars().count() + usize::from(*n > 0);
            Some(*n)
        })
        .collect();
    let total_share: usize = shares.iter().map(|s| s.max(&1)).sum();
    let mut parts = Vec::with_capacity(shares.len());
    let (mut start, mut share) = (0, 0);
    for (i, s) in shares.iter().enumerate().take(shares.len() - 1) {
        share += s.max(&1);
        let target = upto[words.len() - 1] * share / total_share;
        let last_end = words.len() - (shares.len() - 1 - i);
        let fits = |end: usize| layout(&words[start..end].join(" "), max_line_chars).is_some();
        let end = (start + 1..=last_end)
            .filter(|&end| fits(end))
            .min_by_key(|&end| upto[end - 1].abs_diff(target) + break_penalty(words[end - 1]))
            .unwrap_or(start + 1);
        parts.push(words[start..end].join(" "));
        start = end;
    }
    parts.push(words[start..].join(" "));
    Some(parts)
}

/// `text` in at most [`MAX_LINES`] lines of at most `max` characters; `None` if it does not
/// fit. Of the breaks that fit, the one that makes the longer line shortest, a bad break
/// counting as longer (see [`break_penalty`]); ties put the shorter line on top.
fn layout(text: &str, max: usize) -> Option<Vec<String>> {
    let len = |s: &str| s.chars().count();
    if len(text) <= max {
        return Some(vec![text.to_string()]);
    }
    text.match_indices(' ')
        .map(|(i, _)| (&text[..i], &text[i + 1..]))
        .filter(|(top, bottom)| len(top) <= max && len(bottom) <= max)
        .min_by_key(|(top, bottom)| (len(top).max(len(bottom)) + break_penalty(top), len(top)))
        .map(|(top, bottom)| vec![top.to_string(), bottom.to_string()])
}

/// What breaking a line (or a sentence across cues) after `before` costs, in characters of
/// imbalance, as subtitlers' guidelines rank breaks (BBC, Netflix): after punctuation is best,
/// and after a short word (an article, a preposition: "de", "tu") that belongs with the next
/// one is bad.
fn break_penalty(before: &str) -> usize {
    let last = before.rsplit(' ').next().unwrap_or(before);
    let after_punctuation = last.ends_with([',', '.', ';', ':', '?', '!', '…']);
    let dangling = last.chars().count() <= 3 && last.chars().all(char::is_lowercase);
    (if after_punctuation { 0 } else { 4 }) + (if dangling { 8 } else { 0 })
}

/// The words of `text` that fill [`MAX_LINES`] lines of `max` characters, the rest dropped; a
/// word longer than a line is cut to it.
fn cut_to_lines(text: &str, max: usize) -> Vec<String> {
    let mut lines: Vec<String> = vec![String::new()];
    for word in text.split_whitespace() {
        let word: String = word.chars().take(max).collect();
        let line = lines.last_mut().expect("a line");
        let needed = line.chars().count() + usize::from(!line.is_empty()) + word.chars().count();
        if needed <= max {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(&word);
        } else if lines.len() < MAX_LINES {
            lines.push(word);
        } else {
            break;
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cue(payload: &str) -> CueText {
        cue_text(payload)
    }

    #[test]
    fn cue_texts_keep_wrapping_markup_and_drop_the_rest() {
        let c = cue("<i>Never drink\nliquid nitrogen.</i>");
        assert_eq!(
            (c.open.as_str(), c.plain.as_str(), c.close.as_str()),
            ("<i>", "Never drink liquid nitrogen.", "</i>")
        );
        let c = cue("{\\an8}<v Roger>It will perforate\nyour stomach.");
        assert_eq!(
            (c.open.as_str(), c.close.as_str()),
            ("{\\an8}<v Roger>", "")
        );
        let c = cue("<i>Never</i> drink <b>it</b>");
        assert_eq!(
            (c.open.as_str(), c.plain.as_str(), c.close.as_str()),
            ("", "Never drink it", "")
        );
        assert_eq!(cue("a < b and {c}").plain, "a < b and {c}");
    }

    #[test]
    fn cues_that_end_mid_sentence_are_joined_with_the_next() {
        let cues: Vec<CueText> = [
            "I told you,",
            "never drink",
            "liquid nitrogen.",
            "♪",
            "Why?",
            "\"Because.\"",
            "one",
            "two",
            "three",
            "four",
            "five",
        ]
        .iter()
        .map(|p| cue(p))
        .collect();
        assert_eq!(groups(&cues), [0..3, 3..4, 4..5, 5..6, 6..10, 10..11]);
    }

    #[test]
    fn a_joined_translation_is_split_back_in_proportion() {
        let parts = split_back(
            "Te lo dije, nunca bebas nitrógeno líquido.",
            &["I told you,".len(), "never drink liquid nitrogen.".len()],
            42,
        )
        .unwrap();
        assert_eq!(parts, ["Te lo dije,", "nunca bebas nitrógeno líquido."]);
        assert!(split_back("Sí.", &[3, 3], 42).is_none());
        // Every part non-empty even when the shares would give one nothing.
        let parts = split_back("uno dos tres", &[1, 100, 1], 42).unwrap();
        assert!(parts.iter().all(|p| !p.is_empty()), "{parts:?}");
    }

    #[test]
    fn lines_are_balanced_and_never_too_long() {
        assert_eq!(layout("Corto.", 42).unwrap(), ["Corto."]);
        let lines = layout(
            "Nunca bebas nitrógeno líquido: te perforará el estómago.",
            42,
        )
        .unwrap();
        assert_eq!(
            lines,
            [
                "Nunca bebas nitrógeno líquido:",
                "te perforará el estómago."
            ]
        );
        // The most even break, after "ni tu", would leave "tu" dangling.
        let lines = layout("No dejes tu maleta ni tu bolso sola en el andén.", 42).unwrap();
        assert_eq!(
            lines,
            ["No dejes tu maleta", "ni tu bolso sola en el andén."]
        );
        assert!(layout(&"palabra ".repeat(20), 42).is_none());
        let cut = cut_to_lines(&"palabra ".repeat(20), 42);
        assert_eq!(cut.len(), 2);
        assert!(cut.iter().all(|l| l.chars().count() <= 42), "{cut:?}");
        assert!(cut_to_lines(&"x".repeat(50), 42)[0].chars().count() == 42);
    }

    #[test]
    fn sentence_ends() {
        for end in [
            "Yes.",
            "Why?",
            "No!",
            "Wait...",
            "Well…",
            "\"Go.\"",
            "(laughs.)",
            "I was--",
            "♪ la la ♪",
        ] {
            assert!(ends_sentence(end), "{end}");
        }
        for open in ["I told you,", "and then", "he said:"] {
            assert!(!ends_sentence(open), "{open}");
        }
    }
}
