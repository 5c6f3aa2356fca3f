//! Catalog entries to (English, Spanish) training pairs, and what is dropped on the way.
//!
//! - The header, untranslated entries and entries whose translation equals the original (a
//!   translator's "nothing to translate": command names, units, format-only strings) are not
//!   pairs: they would teach copying where translating is wanted.
//! - `msgctxt` is dropped on purpose: it disambiguates for the translator ("Open" as a verb
//!   or an adjective) and is not text a user sends; KDE's older `_: context\n` prefix in the
//!   msgid is the same thing and is cut too.
//! - Plurals give two pairs: singular with the first form, plural with the second (Spanish
//!   has two forms: `nplurals=2; plural=(n != 1)`).
//! - Entries that carry no language (no letter), the translator-credit pseudo-strings
//!   ("translator-credits", KDE's "Your names"), and pairs whose lengths are far apart are
//!   dropped.

use model_package::placeholders;

use super::mo::Entry;

/// Longest side kept, in characters: whole help pages ship as one msgid in a few catalogs,
/// far beyond anything the trainer keeps (`--max-len` subwords).
pub const MAX_CHARS: usize = 2000;
/// Character-length ratio beyond which a pair is not a translation of its original (both
/// sides at least [`RATIO_MIN_CHARS`] long): Spanish runs 10-30% longer than English.
pub const MAX_LENGTH_RATIO: f64 = 3.0;
pub const RATIO_MIN_CHARS: usize = 16;

/// msgids that stand for translator credits, not text.
const CREDIT_KEYS: [&str; 8] = [
    "translator-credits",
    "translator_credits",
    "translator-credits\n",
    "Your names",
    "Your emails",
    "NAME OF TRANSLATORS",
    "EMAIL OF TRANSLATORS",
    "ROLES_OF_TRANSLATORS",
];

/// Why an entry gave no pair (counted per reason in `stats.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Drop {
    Untranslated,
    SameAsOriginal,
    NoLetter,
    TranslatorCredits,
    TooLong,
    LengthRatio,
}

/// The pairs an entry gives, or why each candidate was dropped.
pub fn entry_pairs(entry: &Entry) -> Vec<Result<(String, String), Drop>> {
    let msgid = strip_kde_context(&entry.msgid);
    if CREDIT_KEYS.contains(&msgid) {
        return vec![Err(Drop::TranslatorCredits)];
    }
    let mut candidates = vec![(msgid, entry.msgstr.first())];
    if let Some(plural) = &entry.msgid_plural {
        candidates.push((strip_kde_context(plural), entry.msgstr.get(1)));
    }
    candidates
        .into_iter()
        .map(|(en, es)| check_pair(en, es.map(String::as_str).unwrap_or("")))
        .collect()
}

fn strip_kde_context(msgid: &str) -> &str {
    match msgid.strip_prefix("_: ") {
        Some(rest) => rest.split_once('\n').map_or(msgid, |(_, text)| text),
        None => msgid,
    }
}

/// Whether `text` has a letter outside its placeholders (`%s: %d` has none).
fn has_words(text: &str) -> bool {
    placeholders::mask(text)
        .text
        .chars()
        .any(char::is_alphabetic)
}

fn check_pair(en: &str, es: &str) -> Result<(String, String), Drop> {
    if es.trim().is_empty() {
        return Err(Drop::Untranslated);
    }
    if en == es {
        return Err(Drop::SameAsOriginal);
    }
    if !has_words(en) || !has_words(es) {
        return Err(Drop::NoLetter);
    }
    let (n_en, n_es) = (en.chars().count(), es.chars().count());
    if n_en > MAX_CHARS || n_es > MAX_CHARS {
        return Err(Drop::TooLong);
    }
    let (short, long) = (n_en.min(n_es), n_en.max(n_es));
    if short >= RATIO_MIN_CHARS && long as f64 > MAX_LENGTH_RATIO * short as f64 {
        return Err(Drop::LengthRatio);
    }
    Ok((en.to_string(), es.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(msgid: &str, plural: Option<&str>, msgstr: &[&str]) -> Entry {
        Entry {
            context: Some("ctx".into()),
            msgid: msgid.into(),
            msgid_plural: plural.map(str::to_string),
            msgstr: msgstr.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn keeps_translations_and_both_plural_forms() {
        assert_eq!(
            entry_pairs(&entry("Save _As…", None, &["Guardar _como…"])),
            [Ok(("Save _As…".into(), "Guardar _como…".into()))]
        );
        assert_eq!(
            entry_pairs(&entry(
                "%d file\n",
                Some("%d files\n"),
                &["%d archivo\n", "%d archivos\n"]
            )),
            [
                Ok(("%d file\n".into(), "%d archivo\n".into())),
                Ok(("%d files\n".into(), "%d archivos\n".into()))
            ]
        );
        assert_eq!(
            entry_pairs(&entry("_: File menu\nOpen", None, &["Abrir"])),
            [Ok(("Open".into(), "Abrir".into()))]
        );
    }

    #[test]
    fn drops_what_is_not_a_translation() {
        let first = |e: Entry| entry_pairs(&e).remove(0);
        assert_eq!(first(entry("Open", None, &[""])), Err(Drop::Untranslated));
        assert_eq!(first(entry("OK", None, &["OK"])), Err(Drop::SameAsOriginal));
        assert_eq!(
            first(entry("%s: %d", None, &["%s : %d"])),
            Err(Drop::NoLetter)
        );
        assert_eq!(
            first(entry("translator-credits", None, &["Ana <a@b.es>"])),
            Err(Drop::TranslatorCredits)
        );
        assert_eq!(
            first(entry("Print the document", None, &["Imprimir el documento y muchas otras cosas que no están en el original en absoluto"])),
            Err(Drop::LengthRatio)
        );
        assert_eq!(
            first(entry(&"a".repeat(MAX_CHARS + 1), None, &["b"])),
            Err(Drop::TooLong)
        );
    }
}
