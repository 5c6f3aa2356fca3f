//! gettext catalogs (`.po`, `.pot`): every untranslated entry gets a machine translation
//! marked `fuzzy` (so a translator reviews it before `msgfmt` puts it in a `.mo`: fuzzy
//! entries are left out), and everything else stays as it was.
//!
//! Entries are parsed and written by the `polib` crate. polib models only part of a catalog:
//! its parser fails on a template's header (`nplurals=INTEGER`), and it drops header fields it
//! has no field for (`Report-Msgid-Bugs-To`, `X-Generator`), obsolete `#~` entries and `#|`
//! lines. So the file is cut into its entries at blank lines (the rule polib itself parses by),
//! each entry is parsed on its own, and only an entry that gets a translation is written back
//! by polib; the header, obsolete entries, translated entries and the spacing are copied as
//! they were.

use std::io::BufWriter;

use anyhow::{bail, Context, Result};
use model_package::placeholders::{self, Kind};
use nmt_engine::{Outcome, Translation};
use polib::catalog::Catalog;
use polib::message::{MessageMutView, MessageView};

use crate::translator::Translator;

/// The shortest character budget `--max-chars-ratio` gives: a short string cannot be held
/// to a ratio ("OK" -> "Aceptar"), which is why IWSLT's isometric measure counts strings
/// under 10 characters as compliant.
pub const MIN_BUDGET_CHARS: usize = 10;

/// A header polib can parse, put before each entry so that polib parses the entry alone.
const STAND_IN_HEADER: &str =
    "msgid \"\"\nmsgstr \"Content-Type: text/plain; charset=UTF-8\\n\"\n\n";

pub struct PoOptions {
    /// Each translation at most this many times its msgid's characters.
    pub max_chars_ratio: Option<f64>,
    /// The model's target language (its manifest's), for a template's empty `Language`.
    pub target_language: String,
}

/// What a catalog run did, for the summary line.
#[derive(Debug, Default, PartialEq)]
pub struct PoReport {
    /// Entries that had an empty msgstr.
    pub untranslated: usize,
    /// Of those, entries filled (and marked fuzzy).
    pub filled: usize,
    /// Left empty because the translation lost or reordered a placeholder.
    pub placeholders_lost: usize,
}

impl PoReport {
    pub fn describe(&self) -> String {
        let mut what = format!(
            "{} of {} untranslated entries filled (fuzzy)",
            self.filled, self.untranslated
        );
        if self.placeholders_lost > 0 {
            what.push_str(&format!(
                ", {} left empty: their translation did not keep the placeholders",
                self.placeholders_lost
            ));
        }
        what
    }
}

/// A run of blank lines, or an entry: the lines between them, exactly as in the input.
struct Piece<'a> {
    text: &'a str,
    blank: bool,
    /// 1-based line of its first line, for messages.
    line: usize,
}

/// An entry to fill: where it is, polib's parse of it, and what its translations are of.
struct Job {
    piece: usize,
    catalog: Catalog,
    /// msgstr indices (singular: just 0) and which source fills each: 0 msgid, 1 msgid_plural.
    forms: Vec<(usize, usize)>,
    sources: Vec<Source>,
    filled: bool,
}

/// A source string as the model gets it: without its edge whitespace (a trailing `\n` must
/// stay one, which `msgfmt --check` checks), or copied as it is when there are no words.
struct Source {
    leading: String,
    core: String,
    trailing: String,
    copy: bool,
}

/// Fills the untranslated entries of the catalog `input`; returns the new catalog.
pub fn translate_catalog(
    input: &str,
    translator: &mut Translator,
    options: &PoOptions,
) -> Result<(String, PoReport)> {
    let pieces = split(input);
    let mut out: Vec<String> = pieces.iter().map(|p| p.text.to_string()).collect();
    let header = pieces.iter().position(|p| !p.blank && has_msgid(p.text));
    let header = header.filter(|&i| is_header(pieces[i].text));
    let mut nplurals = None;
    if let Some(i) = header {
        let (text, n) = fix_header(pieces[i].text, &options.target_language);
        out[i] = text;
        nplurals = n;
    }
    let nplurals = nplurals
        .or_else(|| plural_rule(&options.target_language).map(|(n, _)| n))
        .unwrap_or(2);
    let mut jobs = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        if piece.blank || Some(i) == header {
            continue;
        }
        if let Some(job) = job_for(i, piece, nplurals)? {
            jobs.push(job);
        }
    }
    let texts = jobs.iter().map(|j| j.sources.len()).sum();
    translator.start_progress(Some(texts), "texts");
    let report = fill(&mut jobs, translator, options)?;
    for job in &jobs {
        if job.filled {
            out[job.piece] = write_entry(&job.catalog, pieces[job.piece].text)?;
        }
    }
    Ok((out.concat(), report))
}

/// The input cut into blank runs and entries (whitespace-only lines are blank).
fn split(input: &str) -> Vec<Piece<'_>> {
    let mut pieces: Vec<Piece> = Vec::new();
    let mut start = 0;
    for (n, line) in input.split_inclusive('\n').enumerate() {
        let blank = line.trim().is_empty();
        let end = start + line.len();
        match pieces.last_mut() {
            Some(last) if last.blank == blank => {
                let from = last.text.as_ptr() as usize - input.as_ptr() as usize;
                last.text = &input[from..end];
            }
            _ => pieces.push(Piece {
                text: &input[start..end],
                blank,
                line: n + 1,
            }),
        }
        start = end;
    }
    pieces
}

fn has_msgid(entry: &str) -> bool {
    entry.lines().any(|l| l.starts_with("msgid "))
}

/// Whether `entry` is the header: an empty msgid without context.
fn is_header(entry: &str) -> bool {
    let lines: Vec<&str> = entry
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    lines.first() == Some(&"msgid \"\"") && lines.get(1).is_some_and(|l| l.starts_with("msgstr"))
}

/// The header with a template's placeholders filled where a translated catalog must have
/// them: the charset (the output is UTF-8), the language, and the plural rule (without one,
/// `msgfmt` refuses plural entries); and the number of plural forms it declares.
fn fix_header(header: &str, language: &str) -> (String, Option<usize>) {
    let mut text = header.replace("charset=CHARSET", "charset=UTF-8");
    text = text.replace("\"Language: \\n\"", &format!("\"Language: {language}\\n\""));
    if let Some((_, rule)) = plural_rule(language) {
        text = text.replace("nplurals=INTEGER; plural=EXPRESSION;", rule);
    }
    let nplurals = text.split("nplurals=").nth(1).and_then(|rest| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    });
    (text, nplurals)
}

/// gettext's plural rule for a target language, where we know it (the models translate
/// into Spanish).
fn plural_rule(language: &str) -> Option<(usize, &'static str)> {
    match language.split(['_', '-']).next()? {
        "es" | "en" | "de" | "it" | "pt" | "nl" | "ca" | "gl" => {
            Some((2, "nplurals=2; plural=(n != 1);"))
        }
        _ => None,
    }
}

/// The job for entry `piece` if it has empty msgstrs, `None` if it has none (or is no entry:
/// comments, obsolete `#~` entries).
fn job_for(piece: usize, entry: &Piece, nplurals: usize) -> Result<Option<Job>> {
    let msgids = entry
        .text
        .lines()
        .filter(|l| l.starts_with("msgid "))
        .count();
    if msgids == 0 {
        return Ok(None);
    }
    if msgids > 1 {
        bail!(
            "line {}: two entries without a blank line between them (`msgcat` rewrites a \
             catalog with one)",
            entry.line
        );
    }
    let text = format!("{STAND_IN_HEADER}{}", entry.text);
    let catalog = polib::po_file::parse_from_reader(text.as_bytes())
        .map_err(|e| anyhow::anyhow!("line {}: {e}", entry.line))?;
    let Some(message) = catalog.messages().next() else {
        return Ok(None);
    };
    if message.msgid().is_empty() {
        return Ok(None);
    }
    let forms: Vec<(usize, usize)> = if message.is_singular() {
        let empty = message.msgstr().is_ok_and(str::is_empty);
        if empty {
            vec![(0, 0)]
        } else {
            vec![]
        }
    } else {
        let strs = message.msgstr_plural().map(Vec::as_slice).unwrap_or(&[]);
        let n = nplurals.max(strs.len()).max(1);
        let any_empty = (0..n).any(|k| strs.get(k).is_none_or(String::is_empty));
        // All forms or none: gettext takes an entry with an empty form as untranslated.
        if any_empty {
            (0..n).map(|k| (k, usize::from(k > 0))).collect()
        } else {
            vec![]
        }
    };
    if forms.is_empty() {
        return Ok(None);
    }
    let mut sources = vec![Source::of(message.msgid())];
    if forms.iter().any(|&(_, s)| s == 1) {
        sources.push(Source::of(message.msgid_plural().unwrap_or_default()));
    }
    Ok(Some(Job {
        piece,
        catalog,
        forms,
        sources,
        filled: false,
    }))
}

impl Source {
    fn of(text: &str) -> Source {
        let core = text.trim();
        let start = text.len() - text.trim_start().len();
        Source {
            leading: text[..start].to_string(),
            core: core.to_string(),
            trailing: text[start + core.len()..].to_string(),
            copy: !has_words(core),
        }
    }
}

/// Whether `text` has letters outside its placeholders: "%s: %s" or "%d%%" has none, and
/// is its own translation.
fn has_words(text: &str) -> bool {
    let mut last = 0;
    let mut outside = String::new();
    for (range, _) in placeholders::find(text) {
        outside.push_str(&text[last..range.start]);
        last = range.end;
    }
    outside.push_str(&text[last..]);
    outside.chars().any(char::is_alphabetic)
}

/// What became of one source string.
enum Done {
    Text(String),
    /// Refused (over the input limit) or empty.
    Nothing,
    /// The translation lost or reordered a placeholder.
    Lost,
}

/// Translates every job's sources in one run and fills the entries whose translations keep
/// their placeholders.
fn fill(jobs: &mut [Job], translator: &mut Translator, options: &PoOptions) -> Result<PoReport> {
    let wanted: Vec<&Source> = jobs
        .iter()
        .flat_map(|j| &j.sources)
        .filter(|s| !s.copy)
        .collect();
    let texts: Vec<String> = wanted.iter().map(|s| s.core.clone()).collect();
    let budgets: Vec<Option<usize>> = wanted
        .iter()
        .map(|s| options.max_chars_ratio.map(|r| budget(&s.core, r)))
        .collect();
    translator
        .bar
        .inc((jobs.iter().map(|j| j.sources.len()).sum::<usize>() - texts.len()) as u64);
    let mut translations = translator.translate(&texts, &budgets)?.into_iter();
    let mut report = PoReport {
        untranslated: jobs.len(),
        ..PoReport::default()
    };
    for job in jobs.iter_mut() {
        let done: Vec<Done> = job
            .sources
            .iter()
            .map(|source| {
                if source.copy {
                    Done::Text(format!(
                        "{}{}{}",
                        source.leading, source.core, source.trailing
                    ))
                } else {
                    finished(
                        source,
                        &translations.next().expect("a translation per source"),
                    )
                }
            })
            .collect();
        let texts: Vec<String> = done
            .iter()
            .filter_map(|d| match d {
                Done::Text(t) => Some(t.clone()),
                _ => None,
            })
            .collect();
        if texts.len() < done.len() {
            report.placeholders_lost += usize::from(done.iter().any(|d| matches!(d, Done::Lost)));
            continue;
        }
        set_translation(&mut job.catalog, &job.forms, &texts)?;
        job.filled = true;
        report.filled += 1;
    }
    Ok(report)
}

/// `--max-chars-ratio`'s budget for a msgid.
pub fn budget(core: &str, ratio: f64) -> usize {
    ((ratio * core.chars().count() as f64).ceil() as usize).max(MIN_BUDGET_CHARS)
}

/// The msgstr a translation gives, with the source's edges back, unless it is empty or lost
/// or reordered a placeholder (a `%d` missing is a crash in the program that formats it).
fn finished(source: &Source, t: &Translation) -> Done {
    let text = t.text.trim();
    if t.outcome == Outcome::Refused || text.is_empty() {
        Done::Nothing
    } else if !keeps_placeholders(&source.core, text) {
        Done::Lost
    } else {
        Done::Text(format!("{}{text}{}", source.leading, source.trailing))
    }
}

/// Whether `translation` has exactly `source`'s placeholders, markup, URLs and addresses
/// (numbers aside: msgfmt does not check them, and a model that masks them keeps them), with
/// printf directives in the source's order unless they are numbered or named (`%1$s`, `%1`,
/// `%(n)d`), which a translation may reorder.
pub fn keeps_placeholders(source: &str, translation: &str) -> bool {
    let spans = |text: &str| -> Vec<String> {
        placeholders::find(text)
            .into_iter()
            .filter(|(_, kind)| !matches!(kind, Kind::Number | Kind::Sentinel))
            .map(|(range, _)| text[range].to_string())
            .collect()
    };
    let (a, b) = (spans(source), spans(translation));
    let printf = |v: &[String]| -> Vec<String> {
        v.iter().filter(|s| s.starts_with('%')).cloned().collect()
    };
    let (pa, pb) = (printf(&a), printf(&b));
    let (mut sa, mut sb) = (a, b);
    sa.sort();
    sb.sort();
    sa == sb && (pa == pb || pa.iter().all(|p| is_reorderable(p)))
}

/// `%1$s`, Qt's `%1`, Python's `%(name)s`, and the literal `%%`.
fn is_reorderable(directive: &str) -> bool {
    let rest = &directive[1..];
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    rest.starts_with('(')
        || rest == "%"
        || (digits > 0 && (digits == rest.len() || rest[digits..].starts_with('$')))
}

/// Puts the translations into the entry's msgstr (or every plural form) and marks it fuzzy.
fn set_translation(catalog: &mut Catalog, forms: &[(usize, usize)], done: &[String]) -> Result<()> {
    let mut message = catalog.messages_mut().next().context("the entry")?;
    if message.is_singular() {
        message.set_msgstr(done[0].clone())?;
    } else {
        let strs = message.msgstr_plural_mut()?;
        strs.resize(forms.len(), String::new());
        for &(k, source) in forms {
            strs[k] = done[source].clone();
        }
    }
    // First, where gettext's tools put it.
    let flags = &mut message.flags_mut().entries;
    if !flags.iter().any(|f| f == "fuzzy") {
        flags.insert(0, "fuzzy".to_string());
    }
    Ok(())
}

/// The entry as polib writes it, without the stand-in header, ending as `original` ended.
fn write_entry(catalog: &Catalog, original: &str) -> Result<String> {
    let mut bytes = Vec::new();
    polib::po_file::write(catalog, &mut BufWriter::new(&mut bytes)).context("writing an entry")?;
    let text = String::from_utf8(bytes).context("polib wrote UTF-8")?;
    let entry = text
        .split_once("\n\n")
        .map(|(_, entry)| entry)
        .context("polib wrote its header")?;
    let entry = entry.trim_end_matches('\n');
    Ok(if original.ends_with('\n') {
        format!("{entry}\n")
    } else {
        entry.to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str = r#"# SOME DESCRIPTIVE TITLE.
#
#, fuzzy
msgid ""
msgstr ""
"Project-Id-Version: PACKAGE VERSION\n"
"Report-Msgid-Bugs-To: \n"
"Language: \n"
"Content-Type: text/plain; charset=CHARSET\n"
"Plural-Forms: nplurals=INTEGER; plural=EXPRESSION;\n"

#. TRANSLATORS: shown at start-up
#: hello.c:7
#, c-format
msgid "Hello, %s! You have %d new messages.\n"
msgstr ""

#: hello.c:8
#, c-format
msgid "%d file was deleted."
msgid_plural "%d files were deleted."
msgstr[0] ""
msgstr[1] ""

msgctxt "menu"
msgid "Open"
msgstr "Abrir"

#~ msgid "Gone"
#~ msgstr "Ido"
"#;

    #[test]
    fn pieces_cover_the_input_exactly() {
        let pieces = split(TEMPLATE);
        assert_eq!(pieces.iter().map(|p| p.text).collect::<String>(), TEMPLATE);
        let entries: Vec<&Piece> = pieces.iter().filter(|p| !p.blank).collect();
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[1].line, 12);
        assert!(is_header(entries[0].text));
        assert!(!is_header(entries[1].text));
        // A long msgid starts with "" too, but is no header.
        assert!(!is_header("msgid \"\"\n\"Long text\"\nmsgstr \"\"\n"));
    }

    #[test]
    fn a_template_header_gets_what_a_translation_needs() {
        let header = split(TEMPLATE)[0].text;
        let (fixed, nplurals) = fix_header(header, "es");
        assert_eq!(nplurals, Some(2));
        assert!(fixed.contains("charset=UTF-8"), "{fixed}");
        assert!(fixed.contains("\"Language: es\\n\""), "{fixed}");
        assert!(fixed.contains("nplurals=2; plural=(n != 1);"), "{fixed}");
        // Everything else as it was, the fuzzy flag and unknown fields included.
        assert!(fixed.contains("#, fuzzy\n") && fixed.contains("Report-Msgid-Bugs-To"));
        let (kept, n) = fix_header("msgid \"\"\nmsgstr \"Plural-Forms: nplurals=3; plural=(n%10==1 ? 0 : n%10>=2 ? 1 : 2);\\n\"\n", "xx");
        assert_eq!(n, Some(3));
        assert!(kept.contains("nplurals=3"));
    }

    #[test]
    fn jobs_are_the_untranslated_entries() {
        let pieces = split(TEMPLATE);
        let jobs: Vec<Job> = pieces
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, p)| !p.blank)
            .filter_map(|(i, p)| job_for(i, p, 2).unwrap())
            .collect();
        assert_eq!(
            jobs.len(),
            2,
            "the translated and the obsolete entry are no jobs"
        );
        assert_eq!(jobs[0].forms, [(0, 0)]);
        assert_eq!(
            jobs[0].sources[0].core,
            "Hello, %s! You have %d new messages."
        );
        assert_eq!(jobs[0].sources[0].trailing, "\n");
        assert_eq!(jobs[1].forms, [(0, 0), (1, 1)]);
        assert_eq!(jobs[1].sources[1].core, "%d files were deleted.");
        let glued = Piece {
            text: "msgid \"a\"\nmsgstr \"\"\nmsgid \"b\"\nmsgstr \"\"\n",
            blank: false,
            line: 3,
        };
        let err = job_for(0, &glued, 2).err().unwrap().to_string();
        assert!(err.contains("line 3"), "{err}");
    }

    #[test]
    fn a_filled_entry_keeps_its_comments_context_and_flags() {
        let entry = "# translator\n#. extracted\n#: a.c:1\n#, c-format\nmsgctxt \"menu\"\nmsgid \"%d file\"\nmsgid_plural \"%d files\"\nmsgstr[0] \"\"\nmsgstr[1] \"\"\n";
        let piece = Piece {
            text: entry,
            blank: false,
            line: 1,
        };
        let mut job = job_for(0, &piece, 2).unwrap().unwrap();
        set_translation(
            &mut job.catalog,
            &job.forms,
            &["%d archivo".into(), "%d archivos".into()],
        )
        .unwrap();
        let written = write_entry(&job.catalog, entry).unwrap();
        assert_eq!(
            written,
            "# translator\n#. extracted\n#: a.c:1\n#, fuzzy, c-format\nmsgctxt \"menu\"\nmsgid \"%d file\"\nmsgid_plural \"%d files\"\nmsgstr[0] \"%d archivo\"\nmsgstr[1] \"%d archivos\"\n"
        );
    }

    #[test]
    fn placeholders_must_come_back_in_an_order_the_program_can_use() {
        assert!(keeps_placeholders(
            "Hello, %s! %d new.",
            "Hola, %s: %d nuevos."
        ));
        assert!(!keeps_placeholders(
            "Hello, %s! %d new.",
            "Hola, %d: %s nuevos."
        ));
        assert!(keeps_placeholders("%1$s of %2$d", "%2$d de %1$s"));
        assert!(keeps_placeholders(
            "Save {name} <b>now</b>",
            "<b>Ahora</b> guarda {name}"
        ));
        assert!(!keeps_placeholders("Save {name}", "Guarda {nombre}"));
        assert!(!keeps_placeholders("Save %s", "Guardar"));
        assert!(!keeps_placeholders("Save", "Guardar %s"));
        // Numbers are the model's business: "3" may be written "tres".
        assert!(keeps_placeholders("3 files", "tres archivos"));
    }

    #[test]
    fn strings_without_words_are_copied_and_edges_kept() {
        assert!(Source::of("%s: %s").copy);
        assert!(Source::of("%d%%").copy);
        assert!(!Source::of("%d files").copy);
        let s = Source::of("\n  Usage: %s\n");
        assert_eq!(
            (s.leading.as_str(), s.core.as_str(), s.trailing.as_str()),
            ("\n  ", "Usage: %s", "\n")
        );
    }

    #[test]
    fn budgets_scale_with_the_msgid_but_leave_short_strings_room() {
        assert_eq!(budget("Open", 1.3), MIN_BUDGET_CHARS);
        assert_eq!(budget("Delete the selected files", 1.3), 33);
    }
}
