//! Protected spans: placeholders, numbers and markup that must leave translation exactly as
//! they entered it.
//!
//! A model paraphrases whatever it sees, and a `%s` turned into `% s`, a `{name}` into
//! `{nombre}` or `1,000` into `1.000` breaks the program that formats the string. So before a
//! text reaches the model each protected span is replaced by a sentinel `｟k｠` (the OpenNMT
//! placeholder brackets U+FF5F/U+FF60 around the decimal index k), which the tokenizer keeps as
//! one token; after decoding each sentinel is replaced by the original text.
//!
//! The same code serves both sides of the contract, which is why it lives in this crate: the
//! trainer masks a fraction of pairs with [`mask_pair`] (so the model learns to copy sentinels)
//! and the server masks a request with [`mask`] and restores the translation with [`unmask`].

use std::cmp::Reverse;
use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

/// How many sentinels the tokenizer registers as single tokens: `｟0｠`..`｟31｠`. A span beyond
/// this is left in the text as it is, since a sentinel the tokenizer would split is one the
/// model never learned to copy.
pub const MAX_SENTINELS: usize = 32;

/// Opens a sentinel. Full-width brackets, because they almost never occur in real text.
pub const OPEN: char = '\u{FF5F}';
/// Closes a sentinel.
pub const CLOSE: char = '\u{FF60}';

/// The sentinel for span `k`: `｟k｠`.
pub fn sentinel(k: usize) -> String {
    format!("{OPEN}{k}{CLOSE}")
}

/// All [`MAX_SENTINELS`] sentinels in index order, for the tokenizer trainer to register.
pub fn sentinels() -> Vec<String> {
    (0..MAX_SENTINELS).map(sentinel).collect()
}

/// What a protected span is. Only informative: every kind is restored the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// printf-style directives: C/POSIX `%1$-5.2ld`, Python `%(count)d`, Qt `%1`,
    /// LibreOffice `%PRODUCTNAME`, and the escape `%%`.
    Printf,
    /// Format fields: `{0}`, `{name}`, `{count:d}`, `{{name}}`.
    Brace,
    /// Shell/Perl/Make variables: `$HOME`, `${HOME}`, `$(CC)`.
    Variable,
    /// Markup tags with a lower-case name: `<b>`, `</a>`, `<a href="x">`, `<br/>`.
    Tag,
    /// Character references: `&amp;`, `&#169;`, `&#xA9;`.
    Entity,
    /// `http(s)://`, `ftp://`, `file://` and `www.` addresses.
    Url,
    /// E-mail addresses.
    Email,
    /// Stand-alone numbers, with internal separators: `3`, `1,000`, `12:30`, `2026-11-25`.
    Number,
    /// A sentinel already in the input. Protected so that a user cannot inject one: it is
    /// masked like any other span and restored verbatim.
    Sentinel,
}

/// One protected span: which kind and its exact original text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub kind: Kind,
    pub text: String,
}

/// A text with its spans replaced by sentinels; `spans[k]` is what `｟k｠` stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Masked {
    pub text: String,
    pub spans: Vec<Span>,
}

/// A translation with its sentinels replaced by the spans' texts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmasked {
    pub text: String,
    /// Indices of the spans the model did not emit, in index order. They are in `text` anyway
    /// (appended, see [`unmask`]); this tells the caller the placement is a guess.
    pub missing: Vec<usize>,
}

/// Digits only: a sentinel index is ASCII decimal, never other scripts' digits.
const SENTINEL_PATTERN: &str = "｟[0-9]+｠";

static SENTINEL: LazyLock<Regex> = LazyLock::new(|| Regex::new(SENTINEL_PATTERN).unwrap());

/// One way to recognise a span. Each alternative is a matcher of its own, rather than an
/// alternation inside one regex, because the regex crate prefers the first alternative that
/// matches while we want the longest: `%APPNAME` must win over the C directive `%A`.
struct Matcher {
    kind: Kind,
    re: Regex,
    /// Checks (and may shorten) a match; `None` rejects it. Covers what the regex crate cannot
    /// express: it has no look-around.
    accept: fn(&str, Range<usize>) -> Option<Range<usize>>,
}

impl Matcher {
    fn new(kind: Kind, pattern: &str) -> Self {
        Self::checked(kind, pattern, |_, range| Some(range))
    }

    fn checked(
        kind: Kind,
        pattern: &str,
        accept: fn(&str, Range<usize>) -> Option<Range<usize>>,
    ) -> Self {
        let re = Regex::new(pattern).unwrap_or_else(|e| panic!("placeholder regex {pattern}: {e}"));
        Self { kind, re, accept }
    }

    /// The first accepted match starting at or after `from`. A rejected match is skipped whole:
    /// a number glued to a letter (`v1.2`) must not yield its tail (`2`) either.
    fn next(&self, text: &str, mut from: usize) -> Option<Range<usize>> {
        loop {
            let m = self.re.find_at(text, from)?;
            if let Some(range) = (self.accept)(text, m.range()) {
                return Some(range);
            }
            from = m.end();
        }
    }
}

/// The permissive character classes exclude `｟` and `｠`, so that a literal sentinel is always a
/// span of its own (masked first, see [`mask`]) and never hides inside, say, a URL left unmasked
/// for want of slots, where [`unmask`] would mistake it for one of ours.
static MATCHERS: LazyLock<Vec<Matcher>> = LazyLock::new(|| {
    use Kind::*;
    vec![
        Matcher::new(Sentinel, SENTINEL_PATTERN),
        Matcher::new(Printf, "%%"),
        // No space flag: in "50 % of" the `% o` would otherwise be a valid C directive.
        Matcher::new(
            Printf,
            r"%(?:[0-9]+\$)?[-+#0']*(?:[0-9]+|\*)?(?:\.(?:[0-9]+|\*))?(?:hh|h|ll|l|L|q|j|z|t|I64|I32|I)?[diouxXeEfFgGaAcspn]",
        ),
        // The `%(name)` prefix is unambiguous, so here the space flag is safe to accept.
        Matcher::new(
            Printf,
            r"%\([A-Za-z_][A-Za-z0-9_]*\)[-+ #0]*[0-9]*(?:\.[0-9]+)?[diouxXeEfFgGcrsa%]",
        ),
        Matcher::new(Printf, "%[0-9]+"),
        Matcher::new(Printf, "%[A-Z][A-Z0-9_]*%?"),
        Matcher::new(Brace, r"\{[^{}\s｟｠]{0,64}\}"),
        // Whether `{{name}}` is a Mustache field or an escaped literal `{name}`, it must come
        // out verbatim, so it is one span; lone `{{` or `}}` (escaped braces) are not spans.
        Matcher::new(Brace, r"\{\{[^{}\s｟｠]{1,64}\}\}"),
        Matcher::new(Variable, r"\$\{[^{}｟｠]{1,64}\}"),
        Matcher::new(Variable, r"\$\([A-Za-z0-9_]{1,64}\)"),
        Matcher::new(Variable, r"\$[A-Za-z_][A-Za-z0-9_]*"),
        // Lower-case names only: `<None>` is a word to translate (LibreOffice: `<Ninguno>`),
        // while `<b>` or `<filename>` must be kept.
        Matcher::new(
            Tag,
            r"</?[a-z][a-z0-9]*(?:[:_-][a-z0-9]+)*(?:\s+[^<>｟｠]*)?/?>",
        ),
        Matcher::new(Entity, "&[A-Za-z][A-Za-z0-9]{1,31};"),
        Matcher::new(Entity, "&#[0-9]{1,7};"),
        Matcher::new(Entity, "&#[xX][0-9A-Fa-f]{1,6};"),
        // `<`, `>` and `"` cannot occur in a URL (RFC 3986), but do end one in markup.
        Matcher::checked(Url, r#"(?i:https?|ftp|file)://[^\s<>"｟｠]+"#, url),
        Matcher::checked(Url, r#"(?i:www)\.[A-Za-z0-9-]+\.[^\s<>"｟｠]+"#, url),
        Matcher::new(
            Email,
            r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+",
        ),
        // A separator must be followed by a digit, so a sentence's final `.` stays outside.
        Matcher::checked(Number, "[0-9]+(?:[.,:/-][0-9]+)*", standalone),
    ]
});

/// Drops the punctuation that ends the sentence rather than the URL, and a `)` that closes a
/// parenthesis opened before the URL; rejects `www.` glued to a preceding word.
fn url(text: &str, range: Range<usize>) -> Option<Range<usize>> {
    let url = &text[range.clone()];
    let glued = text[..range.start]
        .chars()
        .next_back()
        .is_some_and(char::is_alphanumeric);
    if glued && url.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("www.")) {
        return None;
    }
    let mut end = url.len();
    while let Some(c) = url[..end].chars().next_back() {
        let open = url[..end].matches('(').count();
        let unbalanced = c == ')' && open < url[..end].matches(')').count();
        if !(unbalanced || matches!(c, '.' | ',' | ';' | ':' | '!' | '?' | '"' | '\'' | '»')) {
            break;
        }
        end -= c.len_utf8();
    }
    // Something must remain past `scheme://` or `www.`.
    let prefix = url.find("://").map_or(4, |i| i + 3);
    (end > prefix).then(|| range.start..range.start + end)
}

/// Digits glued to letters (`mp3`, `x86_64`, `1st`, `2D`) are words, not numbers.
fn standalone(text: &str, range: Range<usize>) -> Option<Range<usize>> {
    let glued = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    let before = text[..range.start].chars().next_back();
    let after = text[range.end..].chars().next();
    (!glued(before) && !glued(after)).then_some(range)
}

/// The protected spans of `text`, in order and non-overlapping: of the candidates the leftmost
/// wins, and at the same start the longest (so nothing inside a URL, e-mail or tag is a span
/// of its own).
pub fn find(text: &str) -> Vec<(Range<usize>, Kind)> {
    let matchers = &*MATCHERS;
    // Each matcher's next candidate, searched again only once a chosen span overlaps it.
    let mut next: Vec<_> = matchers.iter().map(|m| m.next(text, 0)).collect();
    let mut found = Vec::new();
    loop {
        // `min_by_key` keeps the first of equals, so ties go to the matcher listed first.
        let best = next
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.clone().map(|r| (i, r)))
            .min_by_key(|(_, r)| (r.start, Reverse(r.end)));
        let Some((i, range)) = best else { break };
        let end = range.end;
        found.push((range, matchers[i].kind));
        for (matcher, slot) in matchers.iter().zip(&mut next) {
            if slot.as_ref().is_some_and(|r| r.start < end) {
                *slot = matcher.next(text, end);
            }
        }
    }
    found
}

/// Replaces each range by `｟k｠`, or deletes it where `k` is `None`. Ranges are in order.
fn substitute(
    text: &str,
    edits: impl IntoIterator<Item = (Range<usize>, Option<usize>)>,
) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (range, k) in edits {
        out.push_str(&text[last..range.start]);
        if let Some(k) = k {
            out.push_str(&sentinel(k));
        }
        last = range.end;
    }
    out.push_str(&text[last..]);
    out
}

/// Masks the spans of `text`, numbered in text order. At most [`MAX_SENTINELS`] are masked; the
/// rest stay in the text as they are. Sentinels already in the input get their slots first, as
/// left literal they would be misread by [`unmask`]; the absurd input with more than
/// [`MAX_SENTINELS`] of them loses the excess.
pub fn mask(text: &str) -> Masked {
    let found = find(text);
    let literal = found
        .iter()
        .filter(|(_, kind)| *kind == Kind::Sentinel)
        .count();
    let mut room = [MAX_SENTINELS.saturating_sub(literal), MAX_SENTINELS];
    let mut spans = Vec::new();
    let mut edits = Vec::new();
    for (range, kind) in found {
        let is_sentinel = kind == Kind::Sentinel;
        let slots = &mut room[usize::from(is_sentinel)];
        if *slots > 0 {
            *slots -= 1;
            edits.push((range.clone(), Some(spans.len())));
            spans.push(Span {
                kind,
                text: text[range].to_string(),
            });
        } else if is_sentinel {
            edits.push((range, None));
        }
    }
    Masked {
        text: substitute(text, edits),
        spans,
    }
}

/// Puts the spans back into a translation of a masked text.
///
/// Every sentinel that is in range is replaced by its span's text. A sentinel out of range or
/// repeated (only its first occurrence counts) is dropped: the model invented it. A span the
/// model dropped is not lost: it is appended at the end, before the final sentence punctuation
/// (`.:!?…`) if there is one, and listed in [`Unmasked::missing`]. The spans' texts are never
/// scanned again, so a literal sentinel restored from the input stays as it was.
pub fn unmask(translation: &str, spans: &[Span]) -> Unmasked {
    let mut used = vec![false; spans.len()];
    let mut text = String::with_capacity(translation.len());
    let mut last = 0;
    // The span restored last and where its text ends in `text`.
    let mut previous: Option<(Kind, usize)> = None;
    for m in SENTINEL.find_iter(translation) {
        text.push_str(&translation[last..m.start()]);
        last = m.end();
        let index = m.as_str().trim_matches([OPEN, CLOSE]).parse::<usize>().ok();
        match index.filter(|&k| k < spans.len() && !used[k]) {
            Some(k) => {
                used[k] = true;
                // Two numbers, URLs or addresses can never touch in a source (they would be
                // one span): a model that wrote their sentinels side by side lost the space,
                // and "3166" + "42" must not come out as "316642".
                let glued = previous.is_some_and(|(kind, end)| {
                    end == text.len() && is_word_like(kind) && is_word_like(spans[k].kind)
                });
                if glued {
                    text.push(' ');
                }
                text.push_str(&spans[k].text);
                previous = Some((spans[k].kind, text.len()));
            }
            // Dropping `｟40｠` from "a ｟40｠ b" should not leave two spaces.
            None if text.ends_with(' ') && translation[last..].starts_with(' ') => last += 1,
            None => {}
        }
    }
    text.push_str(&translation[last..]);
    let missing: Vec<usize> = (0..spans.len()).filter(|&k| !used[k]).collect();
    if !missing.is_empty() {
        let texts: Vec<&str> = missing.iter().map(|&k| spans[k].text.as_str()).collect();
        text = append(&text, &texts.join(" "));
    }
    Unmasked { text, missing }
}

/// Inserts `extra` at the end of `text` but before its final sentence punctuation, so that
/// "¿Eliminar archivos?" + `%s` reads "¿Eliminar archivos %s?".
/// Spans that read as words: side by side they need a space between them.
fn is_word_like(kind: Kind) -> bool {
    matches!(kind, Kind::Number | Kind::Url | Kind::Email)
}

fn append(text: &str, extra: &str) -> String {
    let body_end = text.trim_end().len();
    let punct_start = text[..body_end]
        .trim_end_matches(['.', ':', '!', '?', '…'])
        .len();
    let (body, tail) = text.split_at(punct_start);
    let sep = if body.is_empty() || body.ends_with(char::is_whitespace) {
        ""
    } else {
        " "
    };
    format!("{body}{sep}{extra}{tail}")
}

/// Masks a training pair with one shared numbering, so the model learns to move each sentinel
/// to where its span belongs in the translation.
///
/// Source spans are numbered in source order; each target span takes the number of the first
/// not yet taken source span with the same text. `None` (the pair is used unmasked) when the
/// two sides' spans are not the same multiset of texts (the translation changed or lost one,
/// and a model trained on it would learn to do the same), when there is no span at all, or
/// when there are more than [`MAX_SENTINELS`].
pub fn mask_pair(source: &str, target: &str) -> Option<(String, String)> {
    let src = find(source);
    let tgt = find(target);
    if src.is_empty() || src.len() != tgt.len() || src.len() > MAX_SENTINELS {
        return None;
    }
    let mut taken = vec![false; src.len()];
    let mut numbers = Vec::with_capacity(tgt.len());
    for (range, _) in &tgt {
        let text = &target[range.clone()];
        let k = (0..src.len()).find(|&k| !taken[k] && source[src[k].0.clone()] == *text)?;
        taken[k] = true;
        numbers.push(Some(k));
    }
    let masked_source = substitute(
        source,
        src.into_iter().enumerate().map(|(k, (r, _))| (r, Some(k))),
    );
    let masked_target = substitute(target, tgt.into_iter().map(|(r, _)| r).zip(numbers));
    Some((masked_source, masked_target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Kind::*;

    /// The spans `find` reports, as text.
    fn spans(text: &str) -> Vec<(&str, Kind)> {
        find(text).into_iter().map(|(r, k)| (&text[r], k)).collect()
    }

    fn span(kind: Kind, text: &str) -> Span {
        Span {
            kind,
            text: text.to_string(),
        }
    }

    /// Real-world strings with the spans each must yield.
    fn cases() -> Vec<(&'static str, Vec<(&'static str, Kind)>)> {
        vec![
            (
                "Delete %s files from %d folders?",
                vec![("%s", Printf), ("%d", Printf)],
            ),
            ("%1$s of %2$s", vec![("%1$s", Printf), ("%2$s", Printf)]),
            ("%(count)d items", vec![("%(count)d", Printf)]),
            ("100%% done", vec![("100", Number), ("%%", Printf)]),
            (
                "Open {0} in {name}",
                vec![("{0}", Brace), ("{name}", Brace)],
            ),
            (
                "{{count}} files, use {{ and }} to escape",
                vec![("{{count}}", Brace)],
            ),
            (
                "Path: ${HOME}/x and $USER",
                vec![("${HOME}", Variable), ("$USER", Variable)],
            ),
            (
                "Click <b>here</b> or <a href=\"https://x.org\">there</a>",
                vec![
                    ("<b>", Tag),
                    ("</b>", Tag),
                    ("<a href=\"https://x.org\">", Tag),
                    ("</a>", Tag),
                ],
            ),
            (
                "Line<br/>break<br />and <None>",
                vec![("<br/>", Tag), ("<br />", Tag)],
            ),
            (
                "Tom &amp; Jerry &#169;",
                vec![("&amp;", Entity), ("&#169;", Entity)],
            ),
            (
                "See https://www.debian.org/doc/. Or mail me@example.com.",
                vec![
                    ("https://www.debian.org/doc/", Url),
                    ("me@example.com", Email),
                ],
            ),
            (
                "(see www.gnu.org/licenses)",
                vec![("www.gnu.org/licenses", Url)],
            ),
            (
                "On 2026-11-25 at 12:30, 1,000 users paid 3.14 EUR.",
                vec![
                    ("2026-11-25", Number),
                    ("12:30", Number),
                    ("1,000", Number),
                    ("3.14", Number),
                ],
            ),
            (
                "Due 25/11/2026, version 1.2.3 (not v1.2) in 2026.",
                vec![("25/11/2026", Number), ("1.2.3", Number), ("2026", Number)],
            ),
            ("mp3 and x86_64 and 1st", vec![]),
            ("50 % of files", vec![("50", Number)]),
            (
                "AutoText for Shortcut '%1' not found.",
                vec![("%1", Printf)],
            ),
            (
                "%PRODUCTNAME %PRODUCTVERSION",
                vec![("%PRODUCTNAME", Printf), ("%PRODUCTVERSION", Printf)],
            ),
            (
                "No alt text for graphic '%OBJECT_NAME%'",
                vec![("%OBJECT_NAME%", Printf)],
            ),
            ("%s.", vec![("%s", Printf)]),
            ("Keep ｟3｠ as is", vec![("｟3｠", Sentinel)]),
        ]
    }

    #[test]
    fn finds_the_spans_of_real_strings() {
        for (text, expected) in cases() {
            assert_eq!(spans(text), expected, "{text:?}");
        }
    }

    #[test]
    fn overlaps_go_to_the_leftmost_then_longest() {
        let cases: Vec<(&str, Vec<(&str, Kind)>)> = vec![
            (
                "%APPNAME, not %A",
                vec![("%APPNAME", Printf), ("%A", Printf)],
            ),
            (
                "%d%% and %%d",
                vec![("%d", Printf), ("%%", Printf), ("%%", Printf)],
            ),
            (
                "%-5.2lf, %'d, %*d, %zu",
                vec![
                    ("%-5.2lf", Printf),
                    ("%'d", Printf),
                    ("%*d", Printf),
                    ("%zu", Printf),
                ],
            ),
            (
                "(http://en.wikipedia.org/wiki/C_(lang)).",
                vec![("http://en.wikipedia.org/wiki/C_(lang)", Url)],
            ),
            ("«www.example.com»", vec![("www.example.com", Url)]),
            (
                "Costs $5 (x2), see &#xA9;",
                vec![("5", Number), ("&#xA9;", Entity)],
            ),
            ("a@b.org's", vec![("a@b.org", Email)]),
        ];
        for (text, expected) in cases {
            assert_eq!(spans(text), expected, "{text:?}");
        }
    }

    #[test]
    fn identity_translation_round_trips() {
        for (text, expected) in cases() {
            let masked = mask(text);
            assert_eq!(masked.spans.len(), expected.len(), "{text:?}");
            let unmasked = unmask(&masked.text, &masked.spans);
            assert_eq!(unmasked.text, text);
            assert!(unmasked.missing.is_empty(), "{text:?}");
        }
    }

    #[test]
    fn numbers_the_model_glued_together_are_spaced() {
        let masked = mask("Flight 3166 leaves from gate 42 at 06:45 (<b>%s</b>).");
        let out = unmask(
            "Vuelo ｟0｠｟1｠ a las ｟2｠ (｟3｠｟4｠｟5｠).",
            &masked.spans,
        );
        assert_eq!(out.text, "Vuelo 3166 42 a las 06:45 (<b>%s</b>).");
        assert!(out.missing.is_empty());
    }

    #[test]
    fn mask_numbers_spans_in_text_order() {
        let masked = mask("Delete %s files from %d folders?");
        assert_eq!(masked.text, "Delete ｟0｠ files from ｟1｠ folders?");
        assert_eq!(masked.spans, vec![span(Printf, "%s"), span(Printf, "%d")]);
    }

    #[test]
    fn a_literal_sentinel_is_protected() {
        let masked = mask("Keep ｟3｠ and %s");
        assert_eq!(masked.text, "Keep ｟0｠ and ｟1｠");
        assert_eq!(
            masked.spans,
            vec![span(Sentinel, "｟3｠"), span(Printf, "%s")]
        );
        let unmasked = unmask("Conserva ｟0｠ y ｟1｠", &masked.spans);
        assert_eq!(unmasked.text, "Conserva ｟3｠ y %s");
    }

    #[test]
    fn unmask_follows_the_models_order() {
        let spans = [span(Printf, "%s"), span(Printf, "%d")];
        let unmasked = unmask("｟1｠ de ｟0｠", &spans);
        assert_eq!(
            unmasked,
            Unmasked {
                text: "%d de %s".into(),
                missing: vec![]
            }
        );
    }

    #[test]
    fn unmask_appends_a_dropped_span_before_the_final_punctuation() {
        let spans = [span(Printf, "%s"), span(Printf, "%d")];
        let unmasked = unmask("¿Eliminar ｟0｠ archivos?", &spans);
        assert_eq!(
            unmasked,
            Unmasked {
                text: "¿Eliminar %s archivos %d?".into(),
                missing: vec![1]
            }
        );
        let unmasked = unmask("Hecho", &spans);
        assert_eq!(
            unmasked,
            Unmasked {
                text: "Hecho %s %d".into(),
                missing: vec![0, 1]
            }
        );
        assert_eq!(unmask("", &spans).text, "%s %d");
    }

    #[test]
    fn unmask_drops_out_of_range_and_repeated_sentinels() {
        let spans = [span(Printf, "%s")];
        let unmasked = unmask("Copiar ｟0｠ a ｟40｠ ahora", &spans);
        assert_eq!(
            unmasked,
            Unmasked {
                text: "Copiar %s a ahora".into(),
                missing: vec![]
            }
        );
        let unmasked = unmask("｟0｠ y ｟0｠.", &spans);
        assert_eq!(
            unmasked,
            Unmasked {
                text: "%s y .".into(),
                missing: vec![]
            }
        );
        let huge = "｟99999999999999999999999｠ ok ｟0｠";
        assert_eq!(unmask(huge, &spans).text, " ok %s");
    }

    #[test]
    fn at_most_max_sentinels_are_masked() {
        let text = (1..=40)
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" ");
        let masked = mask(&text);
        assert_eq!(masked.spans.len(), MAX_SENTINELS);
        let expected: Vec<String> = (0..MAX_SENTINELS)
            .map(sentinel)
            .chain((33..=40).map(|n| n.to_string()))
            .collect();
        assert_eq!(masked.text, expected.join(" "));
        assert_eq!(unmask(&masked.text, &masked.spans).text, text);
    }

    #[test]
    fn literal_sentinels_get_slots_first() {
        let text = format!(
            "{} ｟7｠",
            (1..=40)
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        );
        let masked = mask(&text);
        assert_eq!(masked.spans.len(), MAX_SENTINELS);
        assert_eq!(masked.spans.last(), Some(&span(Sentinel, "｟7｠")));
        assert_eq!(unmask(&masked.text, &masked.spans).text, text);
    }

    #[test]
    fn sentinels_are_the_tokenizers_tokens() {
        assert_eq!(sentinel(0), "｟0｠");
        let all = sentinels();
        assert_eq!(all.len(), MAX_SENTINELS);
        assert_eq!(all[31], "｟31｠");
    }

    #[test]
    fn mask_pair_shares_one_numbering() {
        let pair = |s, t| mask_pair(s, t);
        let owned = |s: &str, t: &str| Some((s.to_string(), t.to_string()));
        assert_eq!(
            pair("Delete %s files?", "¿Eliminar %s archivos?"),
            owned("Delete ｟0｠ files?", "¿Eliminar ｟0｠ archivos?")
        );
        assert_eq!(
            pair("%s of %d", "%d de %s"),
            owned("｟0｠ of ｟1｠", "｟1｠ de ｟0｠")
        );
        assert_eq!(
            pair("%s and %s", "%s y %s"),
            owned("｟0｠ and ｟1｠", "｟0｠ y ｟1｠")
        );
        assert_eq!(pair("%s files", "archivos"), None);
        assert_eq!(pair("%s files", "%d archivos"), None);
        assert_eq!(pair("Open the file", "Abrir el archivo"), None);
    }
}
