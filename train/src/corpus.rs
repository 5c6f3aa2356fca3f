//! The verse-aligned English -> Spanish corpus, built from the SWORD Bible modules through
//! `diatheke` (`nmt-train corpus --out data/corpus`).
//!
//! # Sources
//! Three public-domain SWORD modules (Debian packages `sword-text-web`, `sword-text-kjv`,
//! `sword-text-sparv`, installed by `scripts/setup.sh`):
//! - English: World English Bible ([`WEB_MODULE`]) and King James Version ([`KJV_MODULE`]);
//! - Spanish: Reina-Valera 1909 ([`SPANISH_MODULE`]), the target side of every pair.
//!
//! `diatheke` is run once per (module, book) with the whole book as key; its raw OSIS output is
//! parsed line by line (`<Book name> <chapter>:<verse>: <markup>`) and cleaned by
//! [`clean_verse`]. Pairs are aligned by reference (book, chapter, verse) over the 66 books of
//! the Protestant canon (the WEB's deuterocanon has no Spanish side here).
//!
//! # Held-out splits (whole books)
//! - dev  = Esther + Galatians ([`DEV_BOOKS`]), about 1% of the verses;
//! - test = Daniel + Philippians ([`TEST_BOOKS`]), about 1.5% of the verses.
//!
//! Narrative and epistolary prose, one Old and one New Testament book each, none in a chapter
//! dropped for the versification problems described below (the length check drops Gal 4:23-24). Dev and test use the WEB as their only English side
//! ([`HELD_OUT_SOURCE`]: one source per Spanish reference). Training uses every other book twice,
//! once with each English source ([`TRAIN_SOURCES`]). A training pair is dropped when its English
//! or its Spanish side equals the English or Spanish side of any dev or test verse (compared
//! after lower-casing and removing punctuation, see [`overlap_key`]): formulaic verses such as
//! "The grace of our Lord Jesus Christ be with you all. Amen." recur across books.
//!
//! # Alignment problems of the modules, and what is done about them
//! - The RV1909 module keeps the Spanish verse division under KJV references. Where the two
//!   differ (Num 12-13, 29-30, 1 Sam 23-24, Job 38-41, Hos 11-12, Jonah 1-2, 2 Cor 13, ...) the
//!   Spanish module has empty verses and the neighbouring verses are merged or shifted by one or
//!   more verses. Every chapter in which one side of a pair has an empty verse where the other
//!   side has text is dropped for that pair; when the empty verses end their chapter, the next
//!   chapter is dropped too (that is where the shifted verses land). The same rule covers the
//!   verses the WEB leaves empty (Luke 17:36, Acts 8:37, Rom 16:25-27, ...).
//! - The RV1909 prints psalm superscriptions inside verse 1 ("Salmo de David. Jehová es mi
//!   pastor"), the WEB and KJV as a heading before it. The canonical heading is put back in
//!   front of the English verse 1 (diatheke repeats the last heading before every later verse of
//!   a whole-book key; only a heading that differs from the previous verse's is used).
//! - The RV1909 adds Paul's subscriptions after the last "Amén." of the epistles ("Fué escrita de
//!   Corinto á los Romanos ..."), which neither English text has: cut ([`strip_subscription`]).
//! - The RV1909 prints the first word of a chapter in capitals ("EN el principio", "Y ACONTECIÓ
//!   que"): re-cased ([`fix_drop_cap`]) using how the word is written elsewhere in the text.
//! - The RV1909 also merges, splits and shifts verses inside chapters without leaving any empty
//!   (1 Kgs 22:43-53, 1 Chr 21:15-30, Judg 14:18-20) and moves clauses across verse boundaries
//!   (1 Kgs 18:33-34): every remaining chapter is aligned by verse lengths (Gale & Church, 1993,
//!   with priors that make anything but 1-1 rare), and a verse the alignment does not pair with
//!   the verse of the same number is dropped ([`off_diagonal`]; it also catches textual
//!   variants such as the WEB's 1 John 5:7 without the Comma Johanneum). The length model is
//!   fixed per source ([`LengthModel::for_source`]), so dev and test do not depend on `--books`.
//! - Last, a pair whose character-length ratio is far from the usual is dropped
//!   ([`MAX_LENGTH_RATIO`]): the WEB's Rom 14:23 carries half of Rom 16:25, the RV1909's Deut
//!   18:17 is a third of the English.
//!
//! # Output (`--out`)
//! `train.en train.es dev.en dev.es test.en test.es`: one sentence per line, line-aligned.
//! `test-concat.tsv`: the long-input test set (the "concat" condition of Rosendahl et al.,
//! 2019): consecutive test verses of one chapter, in order, joined by a space into
//! non-overlapping groups of 2, 4 and 8 verses (`--concat-sizes`); a header line, then columns
//! `n_verses`, `ref` (e.g. `Dan 1:1-4`), `en`, `es`. `stats.json`: pairs and words per split,
//! held-out books, what was dropped and why, and (with `--tokenizer`, or after
//! `nmt-train tokenizer`) subword-length histograms per split: those come from the tokenizer
//! stage ([`crate::tokenizer::add_subword_stats`]), which reads the corpus, never the reverse.
//!
//! The output is deterministic: the same modules and arguments give byte-identical files.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{bail, ensure, Context, Result};
use serde_json::json;

/// Spanish side of every pair: Reina-Valera 1909.
pub const SPANISH_MODULE: &str = "spaRV1909eb";
/// World English Bible (2015 edition, with deuterocanon).
pub const WEB_MODULE: &str = "engWEB2015eb";
/// King James Version (2006 edition).
pub const KJV_MODULE: &str = "engKJV2006eb";
/// English sources of the training split, in the order their pairs are written.
pub const TRAIN_SOURCES: [&str; 2] = [WEB_MODULE, KJV_MODULE];
/// The one English source of the dev and test splits.
pub const HELD_OUT_SOURCE: &str = WEB_MODULE;
/// Books (OSIS ids) of the dev split.
pub const DEV_BOOKS: [&str; 2] = ["Esth", "Gal"];
/// Books (OSIS ids) of the test split.
pub const TEST_BOOKS: [&str; 2] = ["Dan", "Phil"];
/// Split names, as `read_parallel` takes them.
pub const SPLITS: [&str; 3] = ["train", "dev", "test"];
/// A pair is dropped when one side is more than this many times longer (in characters) than
/// the other, the longer side having at least [`LENGTH_RATIO_MIN_CHARS`] characters.
pub const MAX_LENGTH_RATIO: f64 = 2.0;
/// See [`MAX_LENGTH_RATIO`]: short verses vary too much to be judged by their length.
pub const LENGTH_RATIO_MIN_CHARS: usize = 60;

/// The 66 books, as OSIS ids (diatheke accepts them as keys), in canonical order.
pub const BOOKS: [&str; 66] = [
    "Gen", "Exod", "Lev", "Num", "Deut", "Josh", "Judg", "Ruth", "1Sam", "2Sam", "1Kgs", "2Kgs",
    "1Chr", "2Chr", "Ezra", "Neh", "Esth", "Job", "Ps", "Prov", "Eccl", "Song", "Isa", "Jer",
    "Lam", "Ezek", "Dan", "Hos", "Joel", "Amos", "Obad", "Jonah", "Mic", "Nah", "Hab", "Zeph",
    "Hag", "Zech", "Mal", "Matt", "Mark", "Luke", "John", "Acts", "Rom", "1Cor", "2Cor", "Gal",
    "Eph", "Phil", "Col", "1Thess", "2Thess", "1Tim", "2Tim", "Titus", "Phlm", "Heb", "Jas",
    "1Pet", "2Pet", "1John", "2John", "3John", "Jude", "Rev",
];
/// Index of the first New Testament book (Matthew) in [`BOOKS`].
const FIRST_NT_BOOK: usize = 39;

/// Arguments of `nmt-train corpus`.
#[derive(clap::Args, Debug, Clone)]
pub struct CorpusArgs {
    /// Output directory: train/dev/test .en/.es files, test-concat.tsv and stats.json.
    #[arg(long, default_value = "data/corpus")]
    pub out: PathBuf,
    /// Only these training books (comma-separated OSIS ids, e.g. `Gen,Ruth,Mark`); the dev and
    /// test books are always extracted and always held out. Empty: all 66 books.
    #[arg(long, value_delimiter = ',', default_value = "")]
    pub books: Vec<String>,
    /// Group sizes, in consecutive verses, of the long-input test set (test-concat.tsv).
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    pub concat_sizes: Vec<usize>,
    /// A tokenizer.json: adds per-split histograms of lengths in subwords to stats.json. Read
    /// by the `nmt-train corpus` command, not by [`run`]: the histograms are the tokenizer
    /// stage's ([`crate::tokenizer::add_subword_stats`]).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The diatheke executable (from the Debian package `diatheke`).
    #[arg(long, default_value = "diatheke")]
    pub diatheke: PathBuf,
    /// diatheke processes run at once (0: one per CPU core).
    #[arg(long, default_value = "0")]
    pub jobs: usize,
}

/// Index of an OSIS book id in [`BOOKS`] (case-insensitive).
pub fn book_index(osis: &str) -> Option<usize> {
    BOOKS
        .iter()
        .position(|b| b.eq_ignore_ascii_case(osis.trim()))
}

/// A verse reference; orders as the canon does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VerseRef {
    /// Index in [`BOOKS`].
    pub book: usize,
    pub chapter: u32,
    pub verse: u32,
}

impl fmt::Display for VerseRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}:{}", BOOKS[self.book], self.chapter, self.verse)
    }
}

/// One verse as diatheke prints it, before cleaning.
#[derive(Debug, Clone, PartialEq)]
pub struct RawVerse {
    pub vref: VerseRef,
    /// Markup of a canonical heading printed before this verse (a psalm superscription), when it
    /// belongs to this verse and is not diatheke's repetition of an earlier one.
    pub title: Option<String>,
    /// Raw OSIS markup of the verse.
    pub body: String,
}

/// Runs diatheke on a whole book of a module and parses what it prints.
pub fn extract_book(diatheke: &Path, module: &str, book: usize) -> Result<Vec<RawVerse>> {
    let output = Command::new(diatheke)
        .args(["-b", module, "-k", BOOKS[book]])
        .output()
        .with_context(|| {
            format!(
                "running {} (install it with scripts/setup.sh)",
                diatheke.display()
            )
        })?;
    ensure!(
        output.status.success(),
        "diatheke -b {module} -k {} failed: {}",
        BOOKS[book],
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).with_context(|| {
        format!(
            "diatheke -b {module} -k {}: output is not UTF-8",
            BOOKS[book]
        )
    })?;
    let verses = parse_diatheke_output(module, book, &text)?;
    ensure!(
        !verses.is_empty(),
        "diatheke -b {module} -k {} printed no verse: is the module installed (scripts/setup.sh)?",
        BOOKS[book]
    );
    Ok(verses)
}

/// Position of the `" <chapter>:<verse>: "` marker that starts a verse line.
struct Marker {
    start: usize,
    end: usize,
    chapter: u32,
    verse: u32,
}

fn find_marker(line: &str) -> Option<Marker> {
    let b = line.as_bytes();
    let digits = |mut i: usize| {
        let s = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        (i > s).then_some(i)
    };
    for start in 1..b.len() {
        if b[start] != b' ' {
            continue;
        }
        let Some(c_end) = digits(start + 1) else {
            continue;
        };
        if c_end >= b.len() || b[c_end] != b':' {
            continue;
        }
        let Some(v_end) = digits(c_end + 1) else {
            continue;
        };
        if v_end >= b.len() || b[v_end] != b':' {
            continue;
        }
        let end = if v_end + 1 < b.len() && b[v_end + 1] == b' ' {
            v_end + 2
        } else {
            v_end + 1
        };
        if end < b.len() && end == v_end + 1 {
            continue; // "1:2:x": not a marker
        }
        let chapter = line[start + 1..c_end].parse().ok()?;
        let verse = line[c_end + 1..v_end].parse().ok()?;
        return Some(Marker {
            start,
            end,
            chapter,
            verse,
        });
    }
    None
}

/// Parses diatheke's raw output for one book: `<Book name> <c>:<v>: <markup>` per verse, a
/// heading (psalm superscription) possibly printed before the book name, continuation lines
/// appended to their verse, and the `(<module>)` trailer skipped.
///
/// With a whole-book key diatheke prints the last heading again before every later verse (Ps
/// 72:2-20 all carry "A Psalm for Solomon", Ps 10:1 carries the title of Ps 9): a heading is
/// only kept when its markup (which carries unique `sID`s) differs from the previous verse's.
pub fn parse_diatheke_output(module: &str, book: usize, text: &str) -> Result<Vec<RawVerse>> {
    let trailer = format!("({module})");
    let mut verses: Vec<RawVerse> = Vec::new();
    let mut name: Option<String> = None;
    let mut prev_heading = String::new();
    for line in text.lines() {
        if line.trim() == trailer {
            continue;
        }
        let Some(m) = find_marker(line) else {
            match verses.last_mut() {
                Some(last) => {
                    last.body.push('\n');
                    last.body.push_str(line);
                }
                None if line.trim().is_empty() => {}
                None => bail!(
                    "{module} {}: unexpected line before the first verse: {line:?}",
                    BOOKS[book]
                ),
            }
            continue;
        };
        let prefix = &line[..m.start];
        let (heading, display) = match prefix.rfind('>') {
            Some(i) => (&prefix[..=i], prefix[i + 1..].trim()),
            None => ("", prefix.trim()),
        };
        match &name {
            None => name = Some(display.to_string()),
            Some(n) => ensure!(
                n == display,
                "{module} {}: book name {display:?} after {n:?} in line {line:?}",
                BOOKS[book]
            ),
        }
        let title = if !heading.trim().is_empty() && heading != prev_heading {
            canonical_title(heading)
        } else {
            None
        };
        prev_heading = heading.to_string();
        let vref = VerseRef {
            book,
            chapter: m.chapter,
            verse: m.verse,
        };
        if let Some(last) = verses.last() {
            ensure!(
                last.vref < vref,
                "{module}: verse {vref} printed after {}",
                last.vref
            );
        }
        verses.push(RawVerse {
            vref,
            title,
            body: line[m.end..].to_string(),
        });
    }
    Ok(verses)
}

/// The markup inside `<title ... canonical="true">...</title>` elements of a heading.
fn canonical_title(heading: &str) -> Option<String> {
    let mut parts = Vec::new();
    let mut rest = heading;
    while let Some(i) = rest.find("<title") {
        let after = &rest[i..];
        let open_end = after.find('>')?;
        let open = &after[..open_end];
        let body = &after[open_end + 1..];
        let close = body.find("</title>").unwrap_or(body.len());
        if attr(open, "canonical") == Some("true") && !open.ends_with('/') {
            parts.push(body[..close].to_string());
        }
        rest = &body[(close + "</title>".len()).min(body.len())..];
    }
    (!parts.is_empty()).then(|| parts.join(" "))
}

/// Value of attribute `key` in the text of a tag (`<w savlm="x" ...`).
fn attr<'a>(tag: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = tag;
    while let Some(i) = rest.find(key) {
        let before_ok = i > 0 && rest.as_bytes()[i - 1].is_ascii_whitespace();
        let after = &rest[i + key.len()..];
        if before_ok {
            if let Some(v) = after.strip_prefix("=\"") {
                return v.find('"').map(|e| &v[..e]);
            }
        }
        rest = after;
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Cleaning
// ---------------------------------------------------------------------------------------------

/// Elements whose text is not part of the verse: notes, headings, speaker labels of the Song
/// of Songs, cross-references, variant readings.
const DROPPED_ELEMENTS: [&str; 6] = ["note", "title", "speaker", "reference", "rdg", "figure"];
/// Elements that separate words (poetry lines, paragraphs, line breaks, ...).
const BREAK_ELEMENTS: [&str; 14] = [
    "l",
    "lg",
    "lb",
    "div",
    "chapter",
    "p",
    "milestone",
    "list",
    "item",
    "table",
    "row",
    "cell",
    "br",
    "verse",
];
/// Spanish clitic pronouns: an added `<transChange>` holding one of them right after a verb
/// form ("sáca</w><transChange>lo</transChange>") is part of that word ("sácalo").
const ENCLITICS: [&str; 11] = [
    "lo", "la", "los", "las", "le", "les", "me", "te", "se", "nos", "os",
];
/// Short Spanish imperatives and forms that take enclitics without looking like verbs.
const SHORT_VERBS: [&str; 14] = [
    "di", "da", "haz", "he", "vi", "ve", "ten", "pon", "sal", "ven", "id", "oid", "dad", "sed",
];
/// Accented words that are not verbs and take no enclitic ("Josué los circuncidó").
const NOT_VERBS: [&str; 22] = [
    "jehová", "josué", "cuánto", "cuánta", "cuántos", "cuántas", "qué", "quién", "cómo", "dónde",
    "cuándo", "también", "además", "después", "allí", "aquí", "así", "más", "él", "mí", "tú",
    "jesús",
];

#[derive(Debug, Clone, Copy)]
struct InlineTag {
    start: bool,
    end: bool,
    trans_change: bool,
}

enum Piece {
    Text(String),
    Break,
    Tag(InlineTag),
}

/// Turns one verse of a module's raw OSIS markup into plain text.
///
/// - Markup is removed; the text of notes, headings, speaker labels and cross-references is
///   dropped; everything after the end of the book (the WEB appends its glossary to Rev 22:21)
///   is dropped.
/// - Where a tag boundary has no space between two words, one is put back when the tags
///   separate words (`God</w><w ...>created` -> "God created", `fringes</q><q><w>of`,
///   `Behold,<w>he`), and not when they split one word (`give</w>n` -> "given") or attach a
///   Spanish clitic to its verb (`sáca</w><transChange>lo</transChange>` -> "sácalo").
/// - Pilcrows (¶), stray USFM markers (`\nd`) and XML entities are removed or decoded;
///   whitespace is collapsed to single spaces and trimmed; no space is left before `, ; : . ! ?`.
pub fn clean_verse(raw: &str) -> String {
    let pieces = markup_pieces(raw);
    let mut out = String::with_capacity(raw.len() / 2);
    let mut pending: Vec<InlineTag> = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        match piece {
            Piece::Break => {
                out.push(' ');
                pending.clear();
            }
            Piece::Tag(t) => pending.push(*t),
            Piece::Text(text) => {
                if !pending.is_empty() {
                    let next_is_tc_end =
                        matches!(pieces.get(i + 1), Some(Piece::Tag(t)) if t.end && t.trans_change);
                    if needs_space(&out, &pending, text, next_is_tc_end) {
                        out.push(' ');
                    }
                    pending.clear();
                }
                out.push_str(text);
            }
        }
    }
    normalize_text(&out)
}

/// Splits markup into text, inline tags and word breaks, dropping the elements whose text is
/// not verse text and stopping at the end of the book.
fn markup_pieces(raw: &str) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut skip: Option<(String, usize)> = None; // dropped element name, nesting depth
    let mut rest = raw;
    while !rest.is_empty() {
        let Some(lt) = rest.find('<') else {
            if skip.is_none() {
                pieces.push(Piece::Text(decode_entities(rest)));
            }
            break;
        };
        if lt > 0 && skip.is_none() {
            pieces.push(Piece::Text(decode_entities(&rest[..lt])));
        }
        let Some(gt) = rest[lt..].find('>') else {
            // A lone '<' is text.
            if skip.is_none() {
                pieces.push(Piece::Text(decode_entities(&rest[lt..])));
            }
            break;
        };
        let tag = &rest[lt + 1..lt + gt];
        rest = &rest[lt + gt + 1..];
        let end = tag.starts_with('/');
        let empty = tag.ends_with('/');
        let name: String = tag
            .trim_start_matches('/')
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == ':' || *c == '_')
            .collect();
        if let Some((skip_name, depth)) = &mut skip {
            if *skip_name == name && !empty {
                if end {
                    *depth -= 1;
                    if *depth == 0 {
                        skip = None;
                    }
                } else {
                    *depth += 1;
                }
            }
            continue;
        }
        if name == "div" {
            let kind = attr(tag, "type");
            if matches!(kind, Some("glossary") | Some("introduction"))
                || (kind == Some("book") && attr(tag, "eID").is_some())
            {
                break; // back matter after the book's last verse
            }
        }
        if DROPPED_ELEMENTS.contains(&name.as_str()) {
            if !end && !empty {
                skip = Some((name, 1));
            }
            continue;
        }
        if BREAK_ELEMENTS.contains(&name.as_str()) {
            pieces.push(Piece::Break);
            continue;
        }
        pieces.push(Piece::Tag(InlineTag {
            start: !end && !empty,
            end,
            trans_change: name == "transChange",
        }));
    }
    pieces
}

/// Whether a run of inline tags between the text written so far and `next` separates words.
fn needs_space(out: &str, tags: &[InlineTag], next: &str, next_is_tc_end: bool) -> bool {
    let (Some(a), Some(b)) = (out.chars().next_back(), next.chars().next()) else {
        return false;
    };
    if a.is_whitespace() || b.is_whitespace() {
        return false;
    }
    let has_start = tags.iter().any(|t| t.start);
    let has_end = tags.iter().any(|t| t.end);
    let a_word = a.is_alphanumeric();
    let b_word = b.is_alphanumeric();
    if a_word && b_word {
        if !has_start {
            return false; // closing tags inside a word: KJV "give</w>n"
        }
        let opens_clitic = tags.last().is_some_and(|t| t.start && t.trans_change)
            && next_is_tc_end
            && ENCLITICS.contains(&next.to_lowercase().as_str());
        if opens_clitic && (!has_end || verb_like(last_word(out))) {
            return false; // "sáca</w><transChange>lo" -> "sácalo"
        }
        return true;
    }
    if b_word {
        if a == '’' && !has_end && next == "s" {
            return false; // KJV "day</w>’<w>s</w>" -> "day’s"
        }
        return ",.;:!?”’)]".contains(a);
    }
    "“‘¿¡(".contains(b) && (a_word || ",.;:!?”’)".contains(a))
}

fn last_word(s: &str) -> &str {
    let start = s
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_alphabetic())
        .last()
        .map_or(s.len(), |(i, _)| i);
    &s[start..]
}

/// Whether a Spanish word looks like a verb form that takes enclitic pronouns: infinitives
/// (-r), plural imperatives (-d), gerunds (-ndo), accented forms (sáca, díjo, plantó) and a few
/// short imperatives (di, haz, dad).
fn verb_like(word: &str) -> bool {
    let w = word.to_lowercase();
    if w.is_empty() || NOT_VERBS.contains(&w.as_str()) {
        return false;
    }
    SHORT_VERBS.contains(&w.as_str())
        || w.ends_with('r')
        || w.ends_with('d')
        || w.ends_with("ndo")
        || w.chars().any(|c| "áéíóú".contains(c))
}

fn decode_entities(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        let decoded = after.find(';').filter(|&e| e <= 10).and_then(|e| {
            let ent = &after[1..e];
            let c = match ent {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                "nbsp" => Some(' '),
                _ => ent
                    .strip_prefix("#x")
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                    .and_then(char::from_u32),
            };
            c.map(|c| (c, e))
        });
        match decoded {
            Some((c, e)) => {
                out.push(c);
                rest = &after[e + 1..];
            }
            None => {
                out.push('&');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Removes pilcrows and stray USFM markers, collapses whitespace, removes spaces before
/// closing punctuation.
fn normalize_text(s: &str) -> String {
    let mut t = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '¶' => t.push(' '),
            // USFM character markers left in the KJV text ("the \nd LORD").
            '\\' if chars.peek().is_some_and(|c| c.is_ascii_alphabetic()) => {
                while chars.peek().is_some_and(|c| c.is_ascii_alphanumeric()) {
                    chars.next();
                }
                if chars.peek() == Some(&'*') {
                    chars.next();
                }
                t.push(' ');
            }
            c if c.is_whitespace() || c.is_control() => t.push(' '),
            c => t.push(c),
        }
    }
    let mut out = String::with_capacity(t.len());
    for word in t.split(' ').filter(|w| !w.is_empty()) {
        // "word ," (a break element before punctuation) -> "word,".
        let glue = word.starts_with(|c: char| ",;:.!?".contains(c));
        if !out.is_empty() && !glue {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

/// Cuts what the RV1909 appends after the last "Amén." of an epistle (its subscription:
/// "Fué escrita de Corinto á los Romanos, ...").
pub fn strip_subscription(text: &str) -> String {
    match text.rfind("Amén.") {
        Some(i) if !text[i + "Amén.".len()..].trim().is_empty() => {
            text[..i + "Amén.".len()].to_string()
        }
        _ => text.to_string(),
    }
}

/// How often each lower-cased word is written in lower case and capitalised, away from the
/// start of a sentence: tells names ("Jehová", "Jacob") from other words ("aconteció").
#[derive(Debug, Default, Clone)]
pub struct CaseLexicon {
    counts: HashMap<String, (usize, usize)>,
}

impl CaseLexicon {
    pub fn from_texts<'a>(texts: impl IntoIterator<Item = &'a str>) -> Self {
        let mut counts: HashMap<String, (usize, usize)> = HashMap::new();
        for text in texts {
            for (start, word) in words(text) {
                if sentence_initial(&text[..start]) {
                    continue;
                }
                let mut cs = word.chars();
                let first_upper = cs.next().is_some_and(char::is_uppercase);
                let rest_lower = cs.all(|c| !c.is_uppercase());
                if !rest_lower {
                    continue;
                }
                let e = counts.entry(word.to_lowercase()).or_default();
                if first_upper {
                    e.1 += 1;
                } else {
                    e.0 += 1;
                }
            }
        }
        Self { counts }
    }

    /// `word` (upper case) written the way the text usually writes it mid-sentence.
    fn recase(&self, word: &str) -> String {
        let lower = word.to_lowercase();
        match self.counts.get(&lower) {
            Some(&(l, t)) if t > l => capitalize(&lower),
            _ => lower,
        }
    }
}

fn capitalize(lower: &str) -> String {
    let mut cs = lower.chars();
    match cs.next() {
        Some(f) => f.to_uppercase().chain(cs).collect(),
        None => String::new(),
    }
}

/// Words (maximal runs of letters) with their byte offsets.
fn words(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    for (i, c) in text.char_indices() {
        match (c.is_alphabetic(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, &text[s..i]));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, &text[s..]));
    }
    out
}

fn sentence_initial(before: &str) -> bool {
    let t = before.trim_end_matches(|c: char| c.is_whitespace() || "¿¡(“‘\"'".contains(c));
    t.is_empty() || t.ends_with(|c: char| ".:;?!".contains(c))
}

/// Hebrew letters heading the stanzas of Psalm 119 ("ALEPH. Bienaventurados ..."): kept.
const HEBREW_LETTERS: [&str; 22] = [
    "ALEPH", "BETH", "GIMEL", "DALETH", "HE", "VAU", "ZAIN", "CHETH", "TETH", "JOD", "CAPH",
    "LAMED", "MEM", "NUN", "SAMECH", "AIN", "PE", "TZADDI", "COPH", "RESH", "SCHIN", "TAU",
];

/// Re-cases the capitalised first word(s) the RV1909 prints at the start of a chapter ("EN el
/// principio" -> "En el principio", "Y ACONTECIÓ que" -> "Y aconteció que", "Salmo de David.
/// JEHOVÁ es mi pastor" -> "... Jehová es mi pastor"). Only the first run of all-capital words
/// of at least two letters is touched (the Hebrew letters of Psalm 119 are skipped), with a
/// one-letter capital word just before it unless that one starts the sentence; a word that
/// starts a sentence is capitalised, the others are written as `lexicon` says the text usually
/// writes them.
pub fn fix_drop_cap(text: &str, lexicon: &CaseLexicon) -> String {
    let ws = words(text);
    let is_caps = |w: &str| w.chars().count() >= 2 && w.chars().all(|c| !c.is_lowercase());
    let mut i = 0;
    while i < ws.len() {
        if is_caps(ws[i].1) && !HEBREW_LETTERS.contains(&ws[i].1) {
            break;
        }
        i += 1;
    }
    if i == ws.len() {
        return text.to_string();
    }
    // The run: following all-capital words separated by single spaces, and a one-letter word
    // before them that does not start the sentence ("Y Á SUS discípulos" -> "Y á sus").
    let mut run = vec![ws[i]];
    if i > 0 {
        let (s, w) = ws[i - 1];
        if w.chars().count() == 1
            && w.chars().all(char::is_uppercase)
            && &text[s + w.len()..ws[i].0] == " "
            && !sentence_initial(&text[..s])
        {
            run.insert(0, ws[i - 1]);
        }
    }
    let mut j = i + 1;
    while j < ws.len() {
        let (prev_start, prev) = *run.last().unwrap();
        let gap = &text[prev_start + prev.len()..ws[j].0];
        if gap == " " && is_caps(ws[j].1) {
            run.push(ws[j]);
            j += 1;
        } else {
            break;
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut pos = 0;
    for (k, &(start, word)) in run.iter().enumerate() {
        out.push_str(&text[pos..start]);
        if k == 0 && sentence_initial(&text[..start]) {
            out.push_str(&capitalize(&word.to_lowercase()));
        } else {
            out.push_str(&lexicon.recase(word));
        }
        pos = start + word.len();
    }
    out.push_str(&text[pos..]);
    out
}

// ---------------------------------------------------------------------------------------------
// Module texts, alignment, splits
// ---------------------------------------------------------------------------------------------

/// Cleaned texts of one module (an empty string for a verse the module leaves empty).
pub type ModuleTexts = BTreeMap<VerseRef, String>;

/// Cleans the raw verses of an English module; a canonical heading is put in front of its
/// verse.
pub fn english_texts(raw: &[RawVerse]) -> ModuleTexts {
    raw.iter()
        .map(|v| {
            let body = clean_verse(&v.body);
            let text = match v.title.as_deref().map(clean_verse) {
                Some(title) if !title.is_empty() && !body.is_empty() => format!("{title} {body}"),
                _ => body,
            };
            (v.vref, text)
        })
        .collect()
}

/// Cleans the raw verses of the Spanish module: subscriptions cut from the last verse of the
/// New Testament books, chapter-initial capitals re-cased.
pub fn spanish_texts(raw: &[RawVerse]) -> ModuleTexts {
    let mut texts: ModuleTexts = raw.iter().map(|v| (v.vref, clean_verse(&v.body))).collect();
    let last_of_book: BTreeMap<usize, VerseRef> = texts
        .keys()
        .map(|r| (r.book, *r))
        .collect::<BTreeMap<_, _>>();
    for (book, vref) in last_of_book {
        if book >= FIRST_NT_BOOK {
            let t = texts.get_mut(&vref).unwrap();
            *t = strip_subscription(t);
        }
    }
    let lexicon = CaseLexicon::from_texts(texts.values().map(String::as_str));
    for (vref, text) in texts.iter_mut() {
        if vref.verse == 1 {
            *text = fix_drop_cap(text, &lexicon);
        }
    }
    texts
}

/// One aligned verse pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    pub vref: VerseRef,
    pub en: String,
    pub es: String,
}

/// What [`align`] kept and dropped.
#[derive(Debug, Default, Clone)]
pub struct AlignReport {
    /// References present in both modules.
    pub common: usize,
    /// Pairs with an empty side.
    pub empty: usize,
    /// Pairs in a chapter dropped because of a versification mismatch.
    pub disturbed: usize,
    /// Pairs the length-based alignment puts off the diagonal (merged, split, shifted).
    pub off_diagonal: usize,
    /// Pairs dropped by the length-ratio filter.
    pub length_ratio: usize,
    /// The length model estimated for the alignment check.
    pub length_model: Option<LengthModel>,
    /// References of the pairs put off the diagonal.
    pub off_diagonal_refs: Vec<VerseRef>,
    /// Chapters dropped, as "Book chapter".
    pub disturbed_chapters: BTreeSet<(usize, u32)>,
    /// References of the pairs dropped by the length-ratio filter.
    pub length_ratio_refs: Vec<VerseRef>,
}

/// Aligns an English module with the Spanish one by reference. Keeps the references present and
/// non-empty in both, except
/// - in the chapters where one side has an empty verse that the other side has (with the next
///   chapter too when the empty verses end their chapter);
/// - the verses that a length-based alignment of their chapter (Gale & Church, with priors
///   that make anything but 1-1 rare: [`BEADS`]) does not pair with the verse of the same
///   number: the RV1909 merges, splits and shifts verses inside some chapters without leaving
///   any empty (1 Kgs 22:43-53, 1 Chr 21:15-30, Judg 14:18-20, ...), and moves clauses across
///   verse boundaries here and there (1 Kgs 18:33-34);
/// - the pairs whose lengths disagree anyway (see [`MAX_LENGTH_RATIO`]).
///
/// `model` is the length model of the check ([`LengthModel::for_source`]); `None` estimates it
/// from the pairs given.
pub fn align(
    en: &ModuleTexts,
    es: &ModuleTexts,
    model: Option<LengthModel>,
) -> (Vec<Pair>, AlignReport) {
    let mut report = AlignReport::default();
    for (side, other) in [(en, es), (es, en)] {
        // Last non-empty verse of each chapter on this side.
        let mut last_text: BTreeMap<(usize, u32), u32> = BTreeMap::new();
        for (r, t) in side {
            if !t.is_empty() {
                let e = last_text.entry((r.book, r.chapter)).or_default();
                *e = (*e).max(r.verse);
            }
        }
        for (r, t) in side {
            if t.is_empty() && other.get(r).is_some_and(|o| !o.is_empty()) {
                report.disturbed_chapters.insert((r.book, r.chapter));
                let trailing = last_text
                    .get(&(r.book, r.chapter))
                    .is_none_or(|&l| r.verse > l);
                if trailing {
                    report.disturbed_chapters.insert((r.book, r.chapter + 1));
                }
            }
        }
    }
    // Length-based check of the chapters left: merged, split and shifted verses.
    let both: Vec<(VerseRef, usize, usize)> = en
        .iter()
        .filter_map(|(r, e)| {
            let s = es.get(r)?;
            (!e.is_empty() && !s.is_empty()).then(|| (*r, e.chars().count(), s.chars().count()))
        })
        .collect();
    let model = model.unwrap_or_else(|| {
        LengthModel::estimate(&both.iter().map(|&(_, a, b)| (a, b)).collect::<Vec<_>>())
    });
    report.length_model = Some(model);
    let mut off: HashSet<VerseRef> = HashSet::new();
    for chapter in both.chunk_by(|a, b| (a.0.book, a.0.chapter) == (b.0.book, b.0.chapter)) {
        let r0 = chapter[0].0;
        if report.disturbed_chapters.contains(&(r0.book, r0.chapter)) {
            continue;
        }
        let a: Vec<usize> = chapter.iter().map(|x| x.1).collect();
        let b: Vec<usize> = chapter.iter().map(|x| x.2).collect();
        for (k, o) in off_diagonal(&model, &a, &b).into_iter().enumerate() {
            if o {
                off.insert(chapter[k].0);
            }
        }
    }

    let mut pairs = Vec::new();
    for (r, e) in en {
        let Some(s) = es.get(r) else { continue };
        report.common += 1;
        if e.is_empty() || s.is_empty() {
            report.empty += 1;
        } else if report.disturbed_chapters.contains(&(r.book, r.chapter)) {
            report.disturbed += 1;
        } else if off.contains(r) {
            report.off_diagonal += 1;
            report.off_diagonal_refs.push(*r);
        } else if !lengths_agree(e, s) {
            report.length_ratio += 1;
            report.length_ratio_refs.push(*r);
        } else {
            pairs.push(Pair {
                vref: *r,
                en: e.clone(),
                es: s.clone(),
            });
        }
    }
    (pairs, report)
}

/// Bead types of the length-based alignment check, as (English verses, Spanish verses, prior
/// probability). Verses are nearly always 1-1 here, so the other types are rare.
pub const BEADS: [(usize, usize, f64); 6] = [
    (1, 1, 0.978),
    (1, 0, 0.0025),
    (0, 1, 0.0025),
    (2, 1, 0.0075),
    (1, 2, 0.0075),
    (2, 2, 0.002),
];

/// Gale & Church's (1993) length model: the Spanish length of a verse is about `c` times the
/// English one, with a variance proportional to the length (`s2` per character).
#[derive(Debug, Clone, Copy)]
pub struct LengthModel {
    pub c: f64,
    pub s2: f64,
}

impl LengthModel {
    /// The model of an English source against the RV1909, as [`LengthModel::estimate`] gives
    /// it on all 66 books (fixed, so that the dev and test splits do not depend on `--books`);
    /// `None` for another module.
    pub fn for_source(module: &str) -> Option<Self> {
        match module {
            WEB_MODULE => Some(Self {
                c: 0.9586,
                s2: 2.2905,
            }),
            KJV_MODULE => Some(Self {
                c: 0.9194,
                s2: 2.0896,
            }),
            _ => None,
        }
    }

    /// Estimates `c` and `s2` from (English, Spanish) lengths in characters.
    pub fn estimate(lengths: &[(usize, usize)]) -> Self {
        let (sa, sb) = lengths
            .iter()
            .fold((0.0, 0.0), |(x, y), &(a, b)| (x + a as f64, y + b as f64));
        let c = if sa > 0.0 { sb / sa } else { 1.0 };
        let n = lengths.iter().filter(|(a, _)| *a > 0).count().max(1) as f64;
        let s2 = lengths
            .iter()
            .filter(|(a, _)| *a > 0)
            .map(|&(a, b)| (b as f64 - c * a as f64).powi(2) / a as f64)
            .sum::<f64>()
            / n;
        Self {
            c,
            s2: if s2 > 0.0 { s2 } else { 1.0 },
        }
    }

    /// -log of the probability that texts of these lengths are translations of each other.
    fn cost(&self, l1: usize, l2: usize) -> f64 {
        if l1 == 0 && l2 == 0 {
            return 0.0;
        }
        let (l1, l2) = (l1 as f64, l2 as f64);
        let mean = ((l1 + l2 / self.c) / 2.0).max(1.0);
        let z = (l2 - l1 * self.c) / (mean * self.s2).sqrt();
        let tail = erfc(z.abs() / std::f64::consts::SQRT_2);
        -tail.max(1e-12).ln()
    }
}

/// Complementary error function (Numerical Recipes' `erfcc`, fractional error < 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Aligns two equally long sequences of verse lengths with [`BEADS`] (dynamic programming over
/// the lowest total cost) and returns, per position, whether the best alignment leaves it off
/// the diagonal: the verse is merged, split or shifted with respect to the other text.
pub fn off_diagonal(model: &LengthModel, en: &[usize], es: &[usize]) -> Vec<bool> {
    let (n, m) = (en.len(), es.len());
    let w = m + 1;
    let mut cost = vec![f64::INFINITY; (n + 1) * w];
    let mut back = vec![(0usize, 0usize); (n + 1) * w];
    cost[0] = 0.0;
    for i in 0..=n {
        for j in 0..=m {
            let here = cost[i * w + j];
            if !here.is_finite() {
                continue;
            }
            for &(di, dj, p) in &BEADS {
                let (ii, jj) = (i + di, j + dj);
                if ii > n || jj > m {
                    continue;
                }
                let l1: usize = en[i..ii].iter().sum();
                let l2: usize = es[j..jj].iter().sum();
                let c = here - p.ln() + model.cost(l1, l2);
                if c < cost[ii * w + jj] {
                    cost[ii * w + jj] = c;
                    back[ii * w + jj] = (i, j);
                }
            }
        }
    }
    let mut off = vec![false; n.max(m)];
    let (mut i, mut j) = (n, m);
    while (i, j) != (0, 0) {
        let (pi, pj) = back[i * w + j];
        if !(i - pi == 1 && j - pj == 1 && pi == pj) {
            off[pi..i].iter_mut().for_each(|o| *o = true);
            off[pj..j].iter_mut().for_each(|o| *o = true);
        }
        (i, j) = (pi, pj);
    }
    off
}

fn lengths_agree(a: &str, b: &str) -> bool {
    let (la, lb) = (a.chars().count(), b.chars().count());
    let (short, long) = (la.min(lb), la.max(lb));
    long < LENGTH_RATIO_MIN_CHARS || (long as f64) <= MAX_LENGTH_RATIO * short as f64
}

/// A pair of a split, with where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    pub vref: VerseRef,
    /// The English module.
    pub source: String,
    pub en: String,
    pub es: String,
}

/// The three splits.
#[derive(Debug, Default, Clone)]
pub struct Splits {
    pub train: Vec<Example>,
    pub dev: Vec<Example>,
    pub test: Vec<Example>,
    /// Training pairs dropped because a side equals a side of a dev or test pair.
    pub dropped_overlap: usize,
}

/// The key under which texts are compared with the held-out verses: lower case, letters and
/// digits only, single spaces.
pub fn overlap_key(text: &str) -> String {
    let mut key = String::with_capacity(text.len());
    for w in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if !key.is_empty() {
            key.push(' ');
        }
        key.extend(w.chars().flat_map(char::to_lowercase));
    }
    key
}

/// Splits aligned pairs by whole books. `aligned` holds the pairs of each English source, in
/// the order training pairs of one verse are written. Dev and test take the pairs of
/// `held_out_source` in their books; training takes the pairs of every source in the other
/// books, minus those with a side equal (by [`overlap_key`]) to a side of a dev or test pair.
pub fn build_splits(
    aligned: &[(&str, Vec<Pair>)],
    dev_books: &[usize],
    test_books: &[usize],
    held_out_source: &str,
) -> Splits {
    let mut splits = Splits::default();
    let mut train: Vec<(VerseRef, usize, Example)> = Vec::new();
    for (si, (source, pairs)) in aligned.iter().enumerate() {
        for p in pairs {
            let ex = Example {
                vref: p.vref,
                source: source.to_string(),
                en: p.en.clone(),
                es: p.es.clone(),
            };
            if dev_books.contains(&p.vref.book) {
                if *source == held_out_source {
                    splits.dev.push(ex);
                }
            } else if test_books.contains(&p.vref.book) {
                if *source == held_out_source {
                    splits.test.push(ex);
                }
            } else {
                train.push((p.vref, si, ex));
            }
        }
    }
    splits.dev.sort_by_key(|e| e.vref);
    splits.test.sort_by_key(|e| e.vref);
    train.sort_by_key(|(r, si, _)| (*r, *si));
    let held: HashSet<String> = splits
        .dev
        .iter()
        .chain(&splits.test)
        .flat_map(|e| [overlap_key(&e.en), overlap_key(&e.es)])
        .collect();
    for (_, _, ex) in train {
        if held.contains(&overlap_key(&ex.en)) || held.contains(&overlap_key(&ex.es)) {
            splits.dropped_overlap += 1;
        } else {
            splits.train.push(ex);
        }
    }
    splits
}

/// One line of the long-input test set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcatExample {
    pub n_verses: usize,
    /// "Book chapter:first-last".
    pub reference: String,
    pub en: String,
    pub es: String,
}

/// Groups consecutive examples (same book and chapter, verse numbers without gaps, in order)
/// into non-overlapping groups of each size; the remainder of a run shorter than a size is
/// left out. Sizes are written in the order given, each over the whole test set.
pub fn concat_groups(examples: &[Example], sizes: &[usize]) -> Vec<ConcatExample> {
    // Runs of consecutive verses.
    let mut runs: Vec<&[Example]> = Vec::new();
    let mut start = 0;
    for i in 1..=examples.len() {
        let breaks = i == examples.len() || {
            let (a, b) = (&examples[i - 1].vref, &examples[i].vref);
            a.book != b.book || a.chapter != b.chapter || b.verse != a.verse + 1
        };
        if breaks {
            if i > start {
                runs.push(&examples[start..i]);
            }
            start = i;
        }
    }
    let mut out = Vec::new();
    for &n in sizes {
        if n == 0 {
            continue;
        }
        for run in &runs {
            for group in run.chunks_exact(n) {
                let first = group[0].vref;
                let last = group[n - 1].vref;
                out.push(ConcatExample {
                    n_verses: n,
                    reference: format!("{first}-{}", last.verse),
                    en: group
                        .iter()
                        .map(|e| e.en.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                    es: group
                        .iter()
                        .map(|e| e.es.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                });
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Reading back
// ---------------------------------------------------------------------------------------------

/// Reads a split ("train", "dev" or "test") written by `nmt-train corpus`: (English, Spanish)
/// pairs in file order.
pub fn read_parallel(dir: &Path, split: &str) -> anyhow::Result<Vec<(String, String)>> {
    let read = |lang: &str| -> Result<Vec<String>> {
        let path = dir.join(format!("{split}.{lang}"));
        let text = fs::read_to_string(&path)
            .with_context(|| format!("reading {} (run `nmt-train corpus`)", path.display()))?;
        Ok(text.lines().map(str::to_string).collect())
    };
    let en = read("en")?;
    let es = read("es")?;
    ensure!(
        en.len() == es.len(),
        "{}: {split}.en has {} lines, {split}.es {}",
        dir.display(),
        en.len(),
        es.len()
    );
    Ok(en.into_iter().zip(es).collect())
}

/// Reads `test-concat.tsv`.
pub fn read_concat(dir: &Path) -> Result<Vec<ConcatExample>> {
    let path = dir.join("test-concat.tsv");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        ensure!(
            cols.len() == 4,
            "{}:{}: expected 4 columns",
            path.display(),
            i + 1
        );
        out.push(ConcatExample {
            n_verses: cols[0]
                .parse()
                .with_context(|| format!("{}:{}: n_verses", path.display(), i + 1))?,
            reference: cols[1].to_string(),
            en: cols[2].to_string(),
            es: cols[3].to_string(),
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The command
// ---------------------------------------------------------------------------------------------

fn parse_books(names: &[String]) -> Result<Vec<usize>> {
    let mut books = BTreeSet::new();
    for n in names.iter().filter(|n| !n.trim().is_empty()) {
        let b = book_index(n)
            .with_context(|| format!("unknown book {n:?}: use OSIS ids ({})", BOOKS.join(",")))?;
        books.insert(b);
    }
    Ok(books.into_iter().collect())
}

fn check_modules(diatheke: &Path) -> Result<()> {
    let out = Command::new(diatheke)
        .args(["-b", "system", "-k", "modulelistnames"])
        .output()
        .with_context(|| {
            format!(
                "running {} (install it with scripts/setup.sh)",
                diatheke.display()
            )
        })?;
    let list = String::from_utf8_lossy(&out.stdout);
    let installed: HashSet<&str> = list.lines().map(str::trim).collect();
    for m in [SPANISH_MODULE, WEB_MODULE, KJV_MODULE] {
        ensure!(
            installed.contains(m),
            "SWORD module {m} is not installed (scripts/setup.sh installs sword-text-web, \
             sword-text-kjv, sword-text-sparv)"
        );
    }
    Ok(())
}

/// Runs diatheke for every (module, book), a few processes at a time, with a progress bar.
/// Results come back in job order, whatever order the processes finish in.
fn extract_all(
    diatheke: &Path,
    modules: &[&str],
    books: &[usize],
    jobs: usize,
) -> Result<Vec<Vec<RawVerse>>> {
    let tasks: Vec<(&str, usize)> = modules
        .iter()
        .flat_map(|m| books.iter().map(move |b| (*m, *b)))
        .collect();
    let bar = indicatif::ProgressBar::new(tasks.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "extracting {bar:40} {pos}/{len} books {msg} [{elapsed}]",
        )
        .expect("valid template"),
    );
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Vec<RawVerse>>>>> =
        Mutex::new((0..tasks.len()).map(|_| None).collect());
    let workers = if jobs == 0 {
        std::thread::available_parallelism().map_or(2, |n| n.get())
    } else {
        jobs
    };
    std::thread::scope(|s| {
        for _ in 0..workers.min(tasks.len()).max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&(module, book)) = tasks.get(i) else {
                    break;
                };
                let r = extract_book(diatheke, module, book);
                bar.set_message(format!("{module} {}", BOOKS[book]));
                bar.inc(1);
                results.lock().unwrap()[i] = Some(r);
            });
        }
    });
    bar.finish_and_clear();
    results
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|r| r.expect("every task ran"))
        .collect()
}

fn word_count(text: &str) -> usize {
    text.split_whitespace().count()
}

fn write_lines<'a>(path: &Path, lines: impl IntoIterator<Item = &'a str>) -> Result<()> {
    let mut f = std::io::BufWriter::new(
        fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for line in lines {
        debug_assert!(!line.contains('\n'));
        f.write_all(line.as_bytes())?;
        f.write_all(b"\n")?;
    }
    f.flush()?;
    Ok(())
}

fn book_names(books: &[usize]) -> Vec<&'static str> {
    books.iter().map(|&b| BOOKS[b]).collect()
}

/// `nmt-train corpus`: extracts, cleans, aligns and splits the corpus, writes it to `--out`.
pub fn run(args: CorpusArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    check_modules(&args.diatheke)?;
    let dev_books: Vec<usize> = DEV_BOOKS.iter().map(|b| book_index(b).unwrap()).collect();
    let test_books: Vec<usize> = TEST_BOOKS.iter().map(|b| book_index(b).unwrap()).collect();
    let mut train_books = parse_books(&args.books)?;
    if train_books.is_empty() {
        train_books = (0..BOOKS.len()).collect();
    }
    train_books.retain(|b| !dev_books.contains(b) && !test_books.contains(b));
    let books: Vec<usize> = train_books
        .iter()
        .chain(&dev_books)
        .chain(&test_books)
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();

    let modules = [WEB_MODULE, KJV_MODULE, SPANISH_MODULE];
    let raw = extract_all(&args.diatheke, &modules, &books, args.jobs)?;
    let mut by_module: BTreeMap<&str, Vec<RawVerse>> = BTreeMap::new();
    for (i, verses) in raw.into_iter().enumerate() {
        by_module
            .entry(modules[i / books.len()])
            .or_default()
            .extend(verses);
    }
    let es = spanish_texts(&by_module[SPANISH_MODULE]);
    let mut aligned: Vec<(&str, Vec<Pair>)> = Vec::new();
    let mut reports: BTreeMap<&str, AlignReport> = BTreeMap::new();
    for source in TRAIN_SOURCES {
        let en = english_texts(&by_module[source]);
        let (pairs, report) = align(&en, &es, LengthModel::for_source(source));
        aligned.push((source, pairs));
        reports.insert(source, report);
    }
    let splits = build_splits(&aligned, &dev_books, &test_books, HELD_OUT_SOURCE);
    // The property the split promises, checked on the real data.
    {
        let held: HashSet<String> = splits
            .dev
            .iter()
            .chain(&splits.test)
            .flat_map(|e| [overlap_key(&e.en), overlap_key(&e.es)])
            .collect();
        ensure!(
            splits
                .train
                .iter()
                .all(|e| !held.contains(&overlap_key(&e.en)) && !held.contains(&overlap_key(&e.es))),
            "a training pair repeats a held-out verse"
        );
        ensure!(
            splits
                .train
                .iter()
                .all(|e| !dev_books.contains(&e.vref.book) && !test_books.contains(&e.vref.book)),
            "a held-out book leaked into training"
        );
        ensure!(
            !splits.dev.is_empty() && !splits.test.is_empty(),
            "empty dev or test split"
        );
    }
    let concat = concat_groups(&splits.test, &args.concat_sizes);

    fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    for (name, split) in [
        ("train", &splits.train),
        ("dev", &splits.dev),
        ("test", &splits.test),
    ] {
        write_lines(
            &args.out.join(format!("{name}.en")),
            split.iter().map(|e| e.en.as_str()),
        )?;
        write_lines(
            &args.out.join(format!("{name}.es")),
            split.iter().map(|e| e.es.as_str()),
        )?;
    }
    let concat_lines: Vec<String> = std::iter::once("n_verses\tref\ten\tes".to_string())
        .chain(
            concat
                .iter()
                .map(|c| format!("{}\t{}\t{}\t{}", c.n_verses, c.reference, c.en, c.es)),
        )
        .collect();
    write_lines(
        &args.out.join("test-concat.tsv"),
        concat_lines.iter().map(String::as_str),
    )?;

    // stats.json
    let split_stats = |split: &[Example]| {
        let mut by_source: BTreeMap<&str, usize> = BTreeMap::new();
        for e in split {
            *by_source.entry(e.source.as_str()).or_default() += 1;
        }
        json!({
            "pairs": split.len(),
            "source_words": split.iter().map(|e| word_count(&e.en)).sum::<usize>(),
            "target_words": split.iter().map(|e| word_count(&e.es)).sum::<usize>(),
            "by_source": by_source,
        })
    };
    let mut concat_counts: BTreeMap<String, usize> = BTreeMap::new();
    for c in &concat {
        *concat_counts.entry(c.n_verses.to_string()).or_default() += 1;
    }
    let es_chapters: BTreeSet<(usize, u32)> = es.keys().map(|r| (r.book, r.chapter)).collect();
    let alignment: BTreeMap<&str, serde_json::Value> = reports
        .iter()
        .map(|(source, r)| {
            (
                *source,
                json!({
                    "common_refs": r.common,
                    "dropped_empty_side": r.empty,
                    "dropped_versification_mismatch": r.disturbed,
                    "dropped_off_diagonal": r.off_diagonal,
                    "dropped_length_ratio": r.length_ratio,
                    "length_model": r.length_model.map(|m| json!({"c": (m.c * 1e4).round() / 1e4, "s2": (m.s2 * 1e4).round() / 1e4})),
                    "off_diagonal_refs": r.off_diagonal_refs.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
                    "mismatched_chapters": r.disturbed_chapters.iter()
                        .filter(|bc| es_chapters.contains(bc))
                        .map(|(b, c)| format!("{} {c}", BOOKS[*b])).collect::<Vec<_>>(),
                    "length_ratio_refs": r.length_ratio_refs.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
                }),
            )
        })
        .collect();
    let stats = json!({
        "modules": {"spanish": SPANISH_MODULE, "train_sources": TRAIN_SOURCES, "held_out_source": HELD_OUT_SOURCE},
        "held_out_books": {"dev": DEV_BOOKS, "test": TEST_BOOKS},
        "train_books": book_names(&train_books),
        "splits": {
            "train": split_stats(&splits.train),
            "dev": split_stats(&splits.dev),
            "test": split_stats(&splits.test),
        },
        "test_concat": {"file": "test-concat.tsv", "groups_by_n_verses": concat_counts},
        "dropped_train_pairs_repeating_held_out_text": splits.dropped_overlap,
        "alignment": alignment,
        "length_filter": {"max_ratio": MAX_LENGTH_RATIO, "min_chars": LENGTH_RATIO_MIN_CHARS},
    });
    let stats_path = args.out.join("stats.json");
    fs::write(&stats_path, serde_json::to_string_pretty(&stats)? + "\n")
        .with_context(|| format!("writing {}", stats_path.display()))?;

    println!(
        "corpus: {} train pairs ({} books x {} sources), {} dev ({}), {} test ({}), {} concat groups",
        splits.train.len(),
        train_books.len(),
        TRAIN_SOURCES.len(),
        splits.dev.len(),
        DEV_BOOKS.join("+"),
        splits.test.len(),
        TEST_BOOKS.join("+"),
        concat.len()
    );
    for (source, r) in &reports {
        println!(
            "  {source}: {} common refs; dropped {} with an empty side, {} in {} mismatched chapters, \
             {} off the length alignment, {} by length ratio",
            r.common,
            r.empty,
            r.disturbed,
            r.disturbed_chapters.len(),
            r.off_diagonal,
            r.length_ratio
        );
    }
    println!(
        "  {} training pairs dropped for repeating a held-out verse; wrote {} in {:.1}s",
        splits.dropped_overlap,
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real verses as `diatheke -b <module> -k <book>` prints them (the markup after
    /// "<Book> <c>:<v>: "), with what [`clean_verse`] must make of them: glued words (WEB
    /// Gen 1:1, Ps 42:8, Ps 7:14, Matt 13:25), a word split by markup (KJV Mark 4:24), a
    /// possessive split by markup (KJV Acts 1:12), a pilcrow (KJV 1 Sam 23:29), a stray USFM
    /// marker (KJV Exod 6:3), a speaker label (WEB Song 1:4), italics and red letters (KJV Gen
    /// 1:2, Matt 5:3), Spanish clitics added in italics (RV Gen 19:12, 1 Chr 10:13, Rev 1:1)
    /// and words that are not clitics (RV Gen 2:12, Josh 5:4, 1 Sam 14:1).
    const CLEAN_CASES: &[(&str, &str, &str)] = &[
        (
            "engWEB2015eb Genesis 1:1",
            r#"<w savlm="strong:H0430">In</w> <w savlm="strong:H0853">the</w> <w savlm="strong:H7225">beginning</w>, <w savlm="strong:H0430">God</w><w savlm="strong:H1254">created</w> <w savlm="strong:H0853">the</w> <w savlm="strong:H8064">heavens</w> <w savlm="strong:H0430">and</w> <w savlm="strong:H0853">the</w> <w savlm="strong:H0776">earth</w>."#,
            "In the beginning, God created the heavens and the earth.",
        ),
        (
            "engWEB2015eb Psalms 42:8",
            r#"Yahweh<w savlm="strong:H6963">will</w> <w savlm="strong:H5921">command</w> <w savlm="strong:H3605">his</w> loving kindness <w savlm="strong:H5921">in</w> <w savlm="strong:H3605">the</w> daytime.<l eID="gen9297" level="1"/> <l level="2" sID="gen9298"/><w savlm="strong:H5921">In</w> <w savlm="strong:H3605">the</w> night <w savlm="strong:H3605">his</w> song shall <w savlm="strong:H6963">be</w> <w savlm="strong:H0413">with</w> <w savlm="strong:H0413">me</w>:<l eID="gen9298" level="2"/> <l level="2" sID="gen9299"/><w savlm="strong:H7121">a</w> prayer <w savlm="strong:H0413">to</w> <w savlm="strong:H3605">the</w> <w savlm="strong:H0413">God</w> <w savlm="strong:H6963">of</w> <w savlm="strong:H3605">my</w> life. <l eID="gen9299" level="2"/>"#,
            "Yahweh will command his loving kindness in the daytime. In the night his song shall be with me: a prayer to the God of my life.",
        ),
        (
            "engWEB2015eb Matthew 13:25",
            r#"<q marker=""><w savlm="strong:G1161">but</w> <w savlm="strong:G1722">while</w> <w savlm="strong:G0444">people</w> slept, <w savlm="strong:G0846">his</w> <w savlm="strong:G2190">enemy</w> <w savlm="strong:G2064">came</w> <w savlm="strong:G2532">and</w> <w savlm="strong:G4687">sowed</w> darnel <w savlm="strong:G2215">weeds</w></q><q marker=""><w savlm="strong:G2532">also</w> <w savlm="strong:G1722">among</w> <w savlm="strong:G3588">the</w> <w savlm="strong:G4621">wheat</w>, <w savlm="strong:G2532">and</w> <w savlm="strong:G0565">went</w> <w savlm="strong:G0565">away</w>. </q>"#,
            "but while people slept, his enemy came and sowed darnel weeds also among the wheat, and went away.",
        ),
        (
            "engWEB2015eb Song of Solomon 1:4",
            r#"<w savlm="strong:H0935">Take</w> <w savlm="strong:H0935">me</w> <w savlm="strong:H0310">away</w> <w savlm="strong:H0935">with</w> <w savlm="strong:H0935">you</w>.<l eID="gen15623" level="1"/> <l level="2" sID="gen15624"/><w savlm="strong:H1523">Let’s</w> hurry.<l eID="gen15624" level="2"/> <l level="2" sID="gen15625"/><w savlm="strong:H0935">The</w> <w savlm="strong:H4428">king</w> <w savlm="strong:H4428">has</w> <w savlm="strong:H0935">brought</w> <w savlm="strong:H0935">me</w> <w savlm="strong:H0935">into</w> <w savlm="strong:H0935">his</w> <w savlm="strong:H2315">rooms</w>.<l eID="gen15625" level="2"/> <lg eID="gen15617"/> <speaker>Friends</speaker> <lg sID="gen15626"/> <l level="1" sID="gen15627"/>We <w savlm="strong:H4428">will</w> <w savlm="strong:H4428">be</w> <w savlm="strong:H8055">glad</w> <w savlm="strong:H0935">and</w> <w savlm="strong:H8055">rejoice</w> <w savlm="strong:H0935">in</w> <w savlm="strong:H0935">you</w>.<l eID="gen15627" level="1"/> <l level="2" sID="gen15628"/>We <w savlm="strong:H4428">will</w> praise <w savlm="strong:H0935">your</w> <w savlm="strong:H0157">love</w> more <w savlm="strong:H4428">than</w> <w savlm="strong:H3196">wine</w>!<l eID="gen15628" level="2"/> <lg eID="gen15626"/> <speaker>Beloved</speaker> <lg sID="gen15629"/> <l level="1" sID="gen15630"/><w savlm="strong:H0935">They</w> <w savlm="strong:H4428">are</w> <w savlm="strong:H4339">right</w> <w savlm="strong:H0935">to</w> <w savlm="strong:H0157">love</w> <w savlm="strong:H0935">you</w>. <l eID="gen15630" level="1"/>"#,
            "Take me away with you. Let’s hurry. The king has brought me into his rooms. We will be glad and rejoice in you. We will praise your love more than wine! They are right to love you.",
        ),
        (
            "engWEB2015eb Numbers 21:14",
            r#"<w savlm="strong:H3651">Therefore</w> <w savlm="strong:H5921">it</w> <w savlm="strong:H3068">is</w> <w savlm="strong:H0559">said</w> <w savlm="strong:H5921">in</w> <name type="x-usfm-bk"><w savlm="strong:H0853">The</w> <w savlm="strong:H5612">Book</w> <w savlm="strong:H3068">of</w> <w savlm="strong:H0853">the</w> <w savlm="strong:H4421">Wars</w> <w savlm="strong:H3068">of</w> <w savlm="strong:H3068">Yahweh</w></name>, “Vaheb <w savlm="strong:H5921">in</w> Suphah, <w savlm="strong:H0853">the</w> <w savlm="strong:H5158">valleys</w> <w savlm="strong:H3068">of</w> <w savlm="strong:H0853">the</w> <w savlm="strong:H0769">Arnon</w>,"#,
            "Therefore it is said in The Book of the Wars of Yahweh, “Vaheb in Suphah, the valleys of the Arnon,",
        ),
        (
            "engWEB2015eb Psalms 7:14",
            r#"Behold,<w savlm="strong:H4194">he</w> travails <w savlm="strong:H3627">with</w> iniquity.<l eID="gen7986" level="1"/> <l level="2" sID="gen7987"/>Yes, <w savlm="strong:H4194">he</w> <w savlm="strong:H4194">has</w> conceived mischief,<l eID="gen7987" level="2"/> <l level="2" sID="gen7988"/><w savlm="strong:H3627">and</w> brought <w savlm="strong:H3559">out</w> falsehood. <l eID="gen7988" level="2"/>"#,
            "Behold, he travails with iniquity. Yes, he has conceived mischief, and brought out falsehood.",
        ),
        (
            "engKJV2006eb Genesis 1:2",
            r#"And the <w savlm="strong:H0776">earth</w> <w savlm="strong:H1961">was</w> without <w savlm="strong:H8414">form</w>, and <w savlm="strong:H0922">void</w>; and <w savlm="strong:H2822">darkness</w> <transChange type="added">was</transChange> upon the <w savlm="strong:H6440">face</w> of the <w savlm="strong:H8415">deep</w>. And the <w savlm="strong:H7307">Spirit</w> of <w savlm="strong:H0430">God</w> <w savlm="strong:H7363">moved</w> <w savlm="strong:H5921">upon</w> the <w savlm="strong:H6440">face</w> of the <w savlm="strong:H4325">waters</w>.  <div eID="gen3" type="x-p"/>"#,
            "And the earth was without form, and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters.",
        ),
        (
            "engKJV2006eb Mark 4:24",
            r#"<w savlm="strong:G2532">And</w> he <w savlm="strong:G3004">said</w> unto <w savlm="strong:G0846">them</w>, <q marker=""><w savlm="strong:G0991">Take heed</w> <w savlm="strong:G5101">what</w> <w savlm="strong:G0191">ye hear</w>: <w savlm="strong:G1722">with</w> <w savlm="strong:G3739">what</w> <w savlm="strong:G3358">measure</w> <w savlm="strong:G3354">ye mete</w>, <w savlm="strong:G3354">it shall be measured</w> <w savlm="strong:G5213">to you</w>: <w savlm="strong:G2532">and</w> <w savlm="strong:G5213">unto you</w> <w savlm="strong:G0191">that hear</w> <w savlm="strong:G4369">shall more be give</w>n.</q>"#,
            "And he said unto them, Take heed what ye hear: with what measure ye mete, it shall be measured to you: and unto you that hear shall more be given.",
        ),
        (
            "engKJV2006eb Acts 1:12",
            r#"<w savlm="strong:G5119">Then</w> returned <w savlm="strong:G5290">they</w> <w savlm="strong:G1519">unto</w> <w savlm="strong:G2419">Jerusalem</w> <w savlm="strong:G0575">from</w> the <w savlm="strong:G3735">mount</w> <w savlm="strong:G2564">called</w> <w savlm="strong:G1638">Olivet</w>, <w savlm="strong:G3739">which</w> <w savlm="strong:G2076">is</w> <w savlm="strong:G1451">from</w> <w savlm="strong:G2419">Jerusalem</w> a sabbath <w savlm="strong:G4521">day</w>’<w savlm="strong:G2192">s</w> <w savlm="strong:G3598">journey</w>."#,
            "Then returned they unto Jerusalem from the mount called Olivet, which is from Jerusalem a sabbath day’s journey.",
        ),
        (
            "engKJV2006eb I Samuel 23:29",
            r#"¶ And <w savlm="strong:H1732">David</w> went <w savlm="strong:H5927">up</w> from thence, and <w savlm="strong:H3427">dwelt</w> in strong <w savlm="strong:H4679">holds</w> at <w savlm="strong:H5872">En-gedi</w>.  <chapter eID="1Sam.23"/> <div eID="gen1530" type="x-p"/>"#,
            "And David went up from thence, and dwelt in strong holds at En-gedi.",
        ),
        (
            "engKJV2006eb Exodus 6:3",
            r#"And I <w savlm="strong:H7200">appeared</w> unto <w savlm="strong:H0085">Abraham</w>, unto <w savlm="strong:H3327">Isaac</w>, and unto <w savlm="strong:H3290">Jacob</w>, by <transChange type="added">the name of</transChange> <w savlm="strong:H0410">God</w> <w savlm="strong:H7706">Almighty</w>, but by my <w savlm="strong:H8034">name</w> \nd <w savlm="strong:H3068">JEHOVAH</w></divineName> was I not <w savlm="strong:H3045">known</w> to them."#,
            "And I appeared unto Abraham, unto Isaac, and unto Jacob, by the name of God Almighty, but by my name JEHOVAH was I not known to them.",
        ),
        (
            "engKJV2006eb Matthew 5:3",
            r#"<q marker=""><w savlm="strong:G3107">Blessed</w> <seg type="x-nested"><transChange type="added">are</transChange></seg> <w savlm="strong:G4434">the poor</w> <w savlm="strong:G4151">in spirit</w>: <w savlm="strong:G3754">for</w> <w savlm="strong:G0846">theirs</w> <w savlm="strong:G2076">is</w> <w savlm="strong:G0932">the kingdom</w> <w savlm="strong:G3772">of heaven</w>.</q>"#,
            "Blessed are the poor in spirit: for theirs is the kingdom of heaven.",
        ),
        (
            "spaRV1909eb Genesis 2:12",
            r#"<w savlm="strong:H2091">Y el oro</w> <w savlm="strong:H1931">de aquella</w> <w savlm="strong:H0776">tierra</w> <w savlm="strong:H2896">es bueno</w>: <w savlm="strong:H8033">hay allí</w><transChange type="added">también</transChange><w savlm="strong:H0916">bdelio</w> <w savlm="strong:H0068">y piedra</w> <w savlm="strong:H7718">cornerina</w>."#,
            "Y el oro de aquella tierra es bueno: hay allí también bdelio y piedra cornerina.",
        ),
        (
            "spaRV1909eb Genesis 19:12",
            r#"<w savlm="strong:H0559">Y dijeron</w> <w savlm="strong:H0582">los varones</w> <w savlm="strong:H3876">á Lot</w>: ¿<w savlm="strong:H5750">Tienes</w> <w savlm="strong:H4310">aquí alguno</w> más? <w savlm="strong:H2860">Yernos</w>, <w savlm="strong:H1121">y tus hijos</w> <w savlm="strong:H1323">y tus hijas</w>, <w savlm="strong:H3605">y todo</w> <w savlm="strong:H0834">lo que</w> <w savlm="strong:H5750">tienes</w> <w savlm="strong:H5892">en la ciudad</w>, <w savlm="strong:H3318">sáca</w><transChange type="added">lo</transChange> <w savlm="strong:H4480">de</w> <w savlm="strong:H4725">este lugar</w>:"#,
            "Y dijeron los varones á Lot: ¿Tienes aquí alguno más? Yernos, y tus hijos y tus hijas, y todo lo que tienes en la ciudad, sácalo de este lugar:",
        ),
        (
            "spaRV1909eb I Chronicles 10:13",
            r#"<w savlm="strong:H4191">Así murió</w> <w savlm="strong:H7586">Saúl</w> <w savlm="strong:H4604">por su rebelión</w> <w savlm="strong:H0834">con que</w> <w savlm="strong:H4603">prevaricó</w> <w savlm="strong:H3068">contra Jehová</w>, <w savlm="strong:H5921">contra</w> <w savlm="strong:H1697">la palabra</w> <w savlm="strong:H3068">de Jehová</w>, <w savlm="strong:H0834">la cual</w> <w savlm="strong:H3808">no</w> <w savlm="strong:H8104">guardó</w>; <w savlm="strong:H1571">y porque</w> <w savlm="strong:H1875">consultó</w> <w savlm="strong:H0178">al pythón</w>, preguntándo<transChange type="added">le</transChange>,"#,
            "Así murió Saúl por su rebelión con que prevaricó contra Jehová, contra la palabra de Jehová, la cual no guardó; y porque consultó al pythón, preguntándole,",
        ),
        (
            "spaRV1909eb Joshua 5:4",
            r#"<w savlm="strong:H2088">Esta</w> <w savlm="strong:H1697">es la causa</w> <w savlm="strong:H0834">por la cual</w> <w savlm="strong:H3091">Josué</w><transChange type="added">los</transChange> circuncidó: <w savlm="strong:H3605">todo</w> <w savlm="strong:H5971">el pueblo</w> <w savlm="strong:H3318">que había salido</w> <w savlm="strong:H4714">de Egipto</w>, <w savlm="strong:H2145">los varones</w>, <w savlm="strong:H3605">todos</w> <w savlm="strong:H0582">los hombres</w> <w savlm="strong:H4421">de guerra</w>, <w savlm="strong:H4191">habían muerto</w> <w savlm="strong:H4057">en el desierto</w> <w savlm="strong:H1870">por el camino</w>, <w savlm="strong:H3318">después que salieron</w> <w savlm="strong:H4714">de Egipto</w>."#,
            "Esta es la causa por la cual Josué los circuncidó: todo el pueblo que había salido de Egipto, los varones, todos los hombres de guerra, habían muerto en el desierto por el camino, después que salieron de Egipto.",
        ),
        (
            "spaRV1909eb I Samuel 14:1",
            r#"<w savlm="strong:H3117">Y UN día</w> <w savlm="strong:H1961">aconteció</w>, <w savlm="strong:H3129">que Jonathán</w> <w savlm="strong:H1121">hijo</w> <w savlm="strong:H7586">de Saúl</w> <w savlm="strong:H0559">dijo</w> <w savlm="strong:H5288">á su criado</w> <w savlm="strong:H5375">que le traía</w> <w savlm="strong:H3627">las armas</w>: <w savlm="strong:H3212">Ven</w>, <w savlm="strong:H5676">y pasemos</w> <w savlm="strong:H4673">á la guarnición</w> <w savlm="strong:H6430">de los Filisteos</w>, <w savlm="strong:H0834">que</w> <w savlm="strong:H5674">está á aquel lado</w>. <w savlm="strong:H3808">Y no</w><transChange type="added">lo</transChange><w savlm="strong:H5046">hizo saber</w> <w savlm="strong:H0001">á su padre</w>."#,
            "Y UN día aconteció, que Jonathán hijo de Saúl dijo á su criado que le traía las armas: Ven, y pasemos á la guarnición de los Filisteos, que está á aquel lado. Y no lo hizo saber á su padre.",
        ),
        (
            "spaRV1909eb Revelation of John 1:1",
            r#"<w savlm="strong:G0602">LA revelación</w> <w lemma="G5547" savlm="strong:G2424 G5547">de Jesucristo</w>, <w savlm="strong:G3739">que</w> <w savlm="strong:G2316">Dios</w> <w savlm="strong:G0846">le</w> <w savlm="strong:G1325">dió</w>, <w savlm="strong:G1166">para manifestar</w> <w savlm="strong:G0846">á sus</w> <w savlm="strong:G1401">siervos</w> <w savlm="strong:G3739">las cosas que</w> <w savlm="strong:G1163">deben</w> <w savlm="strong:G1096">suceder</w> <w lemma="G5034" savlm="strong:G1722 G5034">presto</w>; <w savlm="strong:G2532">y</w><transChange type="added">la</transChange><w savlm="strong:G4591">declaró</w>, <w savlm="strong:G0649">enviándo</w><transChange type="added">la</transChange><w savlm="strong:G1223">por</w> <w savlm="strong:G0846">su</w> <w savlm="strong:G0032">ángel</w> <w savlm="strong:G2491">á Juan</w> <w savlm="strong:G0846">su</w> <w savlm="strong:G1401">siervo</w>,"#,
            "LA revelación de Jesucristo, que Dios le dió, para manifestar á sus siervos las cosas que deben suceder presto; y la declaró, enviándola por su ángel á Juan su siervo,",
        ),
        (
            "spaRV1909eb Romans 16:27",
            r#"<w savlm="strong:G3441">Al solo</w> <w savlm="strong:G2316">Dios</w> <w savlm="strong:G4680">sabio</w>, <w savlm="strong:G1391">sea gloria</w> <w lemma="G5547" savlm="strong:G2424 G5547">por Jesucristo</w> <w savlm="strong:G1519">para</w> <w savlm="strong:G0165">siempre</w>. <w savlm="strong:G0281">Amén</w>. <w savlm="strong:G1125">Fué escrita</w> <w savlm="strong:G0575">de</w> <w savlm="strong:G2882">Corinto</w> <w savlm="strong:G4314">á</w> <w savlm="strong:G4514">los Romanos</w>, <transChange type="added">enviada</transChange><w savlm="strong:G1223">por</w><transChange type="added">medio de</transChange><w savlm="strong:G5402">Febe</w>, <w savlm="strong:G1249">diaconisa</w> <w savlm="strong:G1577">de la iglesia</w> <w savlm="strong:G2747">de Cencreas</w>. <chapter eID="Rom.16"/><div eID="gen1108" type="x-p"/> <div canonical="true" eID="gen1092" osisID="Rom" type="book"/>"#,
            "Al solo Dios sabio, sea gloria por Jesucristo para siempre. Amén. Fué escrita de Corinto á los Romanos, enviada por medio de Febe, diaconisa de la iglesia de Cencreas.",
        ),
        (
            "spaRV1909eb Luke 17:1",
            r#"<w savlm="strong:G1161">Y</w> <w savlm="strong:G4314">Á</w> <w savlm="strong:G3588">SUS</w> <w savlm="strong:G3101">discípulos</w> <w savlm="strong:G2036">dice</w>: <w savlm="strong:G0418">Imposible</w> <w savlm="strong:G2076">es</w> <w savlm="strong:G3588">que</w> <w savlm="strong:G3361">no</w> <w savlm="strong:G2064">vengan</w> <w savlm="strong:G4625">escándalos</w>; <w savlm="strong:G1161">mas</w> ¡<w savlm="strong:G3759">ay</w> <w savlm="strong:G1223">de aquél por</w> <w savlm="strong:G3739">quien</w> <w savlm="strong:G2064">vienen</w>!"#,
            "Y Á SUS discípulos dice: Imposible es que no vengan escándalos; mas ¡ay de aquél por quien vienen!",
        ),
        (
            "spaRV1909eb Genesis 1:1",
            r#"<w savlm="strong:H7225">EN el principio</w> <w savlm="strong:H1254">crió</w> <w savlm="strong:H0430">Dios</w> <w savlm="strong:H8064">los cielos</w> <w savlm="strong:H0776">y la tierra</w>."#,
            "EN el principio crió Dios los cielos y la tierra.",
        ),
        (
            "spaRV1909eb Genesis 3:1",
            r#"<w savlm="strong:H5175">EMPERO la serpiente</w> <w savlm="strong:H1961">era</w> <w savlm="strong:H6175">astuta</w>, <w savlm="strong:H3605">más que todos</w> <w savlm="strong:H2416">los animales</w> <w savlm="strong:H7704">del campo</w> <w savlm="strong:H0834">que</w> <w savlm="strong:H3068">Jehová</w> <w savlm="strong:H0430">Dios</w> <w savlm="strong:H6213">había hecho</w>; <w savlm="strong:H0559">la cual dijo</w> <w savlm="strong:H0413">á</w> <w savlm="strong:H0802">la mujer</w>: ¿<w lemma="H3588" savlm="strong:H0637 H3588">Conque</w> <w savlm="strong:H0430">Dios</w> <w savlm="strong:H0559">os ha dicho</w>: <w savlm="strong:H3808">No</w> <w savlm="strong:H0398">comáis</w> <w savlm="strong:H3605">de todo</w> <w savlm="strong:H6086">árbol</w> <w savlm="strong:H1588">del huerto</w>?"#,
            "EMPERO la serpiente era astuta, más que todos los animales del campo que Jehová Dios había hecho; la cual dijo á la mujer: ¿Conque Dios os ha dicho: No comáis de todo árbol del huerto?",
        ),
    ];

    #[test]
    fn clean_verse_on_real_verses() {
        for (reference, raw, want) in CLEAN_CASES {
            assert_eq!(clean_verse(raw), *want, "{reference}");
        }
    }

    /// KJV Psalms as diatheke prints them with a whole-book key: the title of Ps 9 is printed
    /// again before Ps 10:1, as is the title of Ps 3 before Ps 3:2.
    const KJV_PSALMS: &str = concat!(
        r#"<title canonical="true" type="psalm">A <w savlm="strong:H4210">Psalm</w> of <w savlm="strong:H1732">David</w>, when he <w savlm="strong:H1272">fled</w> <w savlm="strong:H6440">from</w> <w savlm="strong:H0053">Absalom</w> his <w savlm="strong:H1121">son</w>.</title> <lg sID="gen2600"/> <l level="1" sID="gen2601"/> Psalms 3:1: <divineName><w savlm="strong:H3068">LORD</w></divineName>, how are they <w savlm="strong:H7231">increased</w> that <w savlm="strong:H6862">trouble</w> me! <w savlm="strong:H7227">many</w> <transChange type="added">are</transChange> they that rise <w savlm="strong:H6965">up</w> against me. <l eID="gen2601" level="1"/>"#,
        "\n",
        r#"<title canonical="true" type="psalm">A <w savlm="strong:H4210">Psalm</w> of <w savlm="strong:H1732">David</w>, when he <w savlm="strong:H1272">fled</w> <w savlm="strong:H6440">from</w> <w savlm="strong:H0053">Absalom</w> his <w savlm="strong:H1121">son</w>.</title> <lg sID="gen2600"/> <l level="1" sID="gen2601"/> Psalms 3:2: <w savlm="strong:H7227">Many</w> <transChange type="added">there be</transChange> which <w savlm="strong:H0559">say</w> of my <w savlm="strong:H5315">soul</w>, <transChange type="added">There is</transChange> no <w savlm="strong:H3444">help</w> for him in <w savlm="strong:H0430">God</w>. <w savlm="strong:H5542">Selah</w>. <l eID="gen2602" level="1"/>"#,
        "\n",
        r#"<title canonical="true" type="psalm">To the chief <w savlm="strong:H5329">Musician</w> upon <w savlm="strong:H4192">Muthlabben</w>, A <w savlm="strong:H4210">Psalm</w> of <w savlm="strong:H1732">David</w>.</title> <lg sID="gen2670"/> <l level="1" sID="gen2671"/> Psalms 9:20: <w savlm="strong:H7896">Put</w> them in <w savlm="strong:H4172">fear</w>, O <divineName><w savlm="strong:H3068">LORD</w></divineName>: <transChange type="added">that</transChange> the <w savlm="strong:H1471">nations</w> may <w savlm="strong:H3045">know</w> themselves <transChange type="added">to be but</transChange> <w savlm="strong:H0582">men</w>. <w savlm="strong:H5542">Selah</w>.  <chapter eID="Ps.9"/>"#,
        "\n",
        r#"<title canonical="true" type="psalm">To the chief <w savlm="strong:H5329">Musician</w> upon <w savlm="strong:H4192">Muthlabben</w>, A <w savlm="strong:H4210">Psalm</w> of <w savlm="strong:H1732">David</w>.</title> <lg sID="gen2670"/> <l level="1" sID="gen2671"/> Psalms 10:1: Why <w savlm="strong:H5975">standest</w> thou afar <w savlm="strong:H7350">off</w>, O <divineName><w savlm="strong:H3068">LORD</w></divineName>? <transChange type="added">why</transChange> <w savlm="strong:H5956">hidest</w> thou <transChange type="added">thyself</transChange> in <w savlm="strong:H6256">times</w> of <w savlm="strong:H6869">trouble</w>? <l eID="gen2691" level="1"/>"#,
        "\n",
        "(engKJV2006eb)\n"
    );

    #[test]
    fn parse_keeps_a_title_once_and_skips_the_trailer() {
        let ps = book_index("Ps").unwrap();
        let verses = parse_diatheke_output(KJV_MODULE, ps, KJV_PSALMS).unwrap();
        let refs: Vec<String> = verses.iter().map(|v| v.vref.to_string()).collect();
        assert_eq!(refs, ["Ps 3:1", "Ps 3:2", "Ps 9:20", "Ps 10:1"]);
        // Ps 3:1 has its title; Ps 3:2 and Ps 10:1 only carry diatheke's repetitions.
        assert!(verses[0].title.is_some());
        assert!(verses[1].title.is_none());
        assert!(verses[3].title.is_none());
        let texts = english_texts(&verses);
        assert_eq!(
            texts[&verses[0].vref],
            "A Psalm of David, when he fled from Absalom his son. LORD, how are they increased \
             that trouble me! many are they that rise up against me."
        );
        assert_eq!(
            texts[&verses[3].vref],
            "Why standest thou afar off, O LORD? why hidest thou thyself in times of trouble?"
        );
    }

    #[test]
    fn parse_appends_continuation_lines_and_checks_order() {
        let text = "Ruth 1:1: first\npart two\nRuth 1:2: second\n(engWEB2015eb)\n";
        let ruth = book_index("Ruth").unwrap();
        let v = parse_diatheke_output(WEB_MODULE, ruth, text).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(clean_verse(&v[0].body), "first part two");
        assert_eq!(
            v[1].vref,
            VerseRef {
                book: ruth,
                chapter: 1,
                verse: 2
            }
        );
        let backwards = "Ruth 1:2: b\nRuth 1:1: a\n";
        assert!(parse_diatheke_output(WEB_MODULE, ruth, backwards).is_err());
        let two_names = "Ruth 1:1: a\nEsther 1:2: b\n";
        assert!(parse_diatheke_output(WEB_MODULE, ruth, two_names).is_err());
    }

    #[test]
    fn markup_details() {
        // Notes are dropped with their text; entities are decoded; back matter is cut.
        assert_eq!(
            clean_verse(r#"God<note placement="foot">Or, gods</note><w>created</w> &amp; made"#),
            "God created & made"
        );
        assert_eq!(
            clean_verse(
                r#"Amen. <div canonical="true" eID="gen1" osisID="Rev" type="book"/> <list><item>Glossary</item></list>"#
            ),
            "Amen."
        );
        // A break element before punctuation leaves no space before it.
        assert_eq!(clean_verse(r#"word<l eID="x"/> , next"#), "word, next");
        assert_eq!(clean_verse("  a \t b\u{a0}c  "), "a b c");
    }

    /// A lexicon from real RV1909 sentences: "Jehová" is a name, "aconteció" is not.
    fn lexicon() -> CaseLexicon {
        CaseLexicon::from_texts([
            "Y dijo Jehová á Moisés: Entra tú.",
            "Y aconteció que cuando hubo Isaac envejecido, y sus ojos se oscurecieron",
            "y el espíritu de Jehová cayó sobre él, y sus discípulos le siguieron.",
        ])
    }

    #[test]
    fn drop_caps_are_recased() {
        let lex = lexicon();
        let cases = [
            (
                "EN el principio crió Dios los cielos y la tierra.",
                "En el principio crió Dios los cielos y la tierra.",
            ),
            ("Y ACONTECIÓ que como oyeron", "Y aconteció que como oyeron"),
            (
                "Y JEHOVÁ dijo á Noé: Entra tú",
                "Y Jehová dijo á Noé: Entra tú",
            ),
            (
                "Salmo de David. JEHOVÁ es mi pastor; nada me faltará.",
                "Salmo de David. Jehová es mi pastor; nada me faltará.",
            ),
            (
                "¿POR qué se amotinan las gentes",
                "¿Por qué se amotinan las gentes",
            ),
            (
                "YO DIJE: Atenderé á mis caminos",
                "Yo dije: Atenderé á mis caminos",
            ),
            (
                "Y Á SUS discípulos dice: Imposible es",
                "Y á sus discípulos dice: Imposible es",
            ),
            (
                "ALEPH. BIENAVENTURADOS los perfectos de camino",
                "ALEPH. Bienaventurados los perfectos de camino",
            ),
            (
                "BETH ¿Con qué limpiará el joven su camino?",
                "BETH ¿Con qué limpiará el joven su camino?",
            ),
            ("Ya normal, sin capitales.", "Ya normal, sin capitales."),
        ];
        for (input, want) in cases {
            assert_eq!(fix_drop_cap(input, &lex), want);
        }
    }

    #[test]
    fn subscriptions_are_cut() {
        let rom_16_27 = clean_verse(
            CLEAN_CASES
                .iter()
                .find(|c| c.0.ends_with("Romans 16:27"))
                .unwrap()
                .1,
        );
        assert_eq!(
            strip_subscription(&rom_16_27),
            "Al solo Dios sabio, sea gloria por Jesucristo para siempre. Amén."
        );
        let plain = "La gracia de nuestro Señor Jesucristo sea con todos vosotros. Amén.";
        assert_eq!(strip_subscription(plain), plain);
    }

    fn vref(book: &str, chapter: u32, verse: u32) -> VerseRef {
        VerseRef {
            book: book_index(book).unwrap(),
            chapter,
            verse,
        }
    }

    /// A sentence of about `n` characters, different for every `seed`.
    fn text(n: usize, seed: usize) -> String {
        let mut s = format!("v{seed} ");
        while s.len() < n {
            s.push_str("lorem ");
        }
        s.truncate(n.max(4));
        s
    }

    #[test]
    fn off_diagonal_finds_shifts_only() {
        let model = LengthModel { c: 1.0, s2: 2.0 };
        let en: Vec<usize> = vec![40, 120, 60, 200, 35, 90, 150, 70, 45, 110];
        assert!(off_diagonal(&model, &en, &en).iter().all(|o| !o));
        // Verses 3 and 4 merged into 3 on the Spanish side, verse 5 split into 4 and 5.
        let es: Vec<usize> = vec![40, 120, 260, 20, 15, 90, 150, 70, 45, 110];
        let off = off_diagonal(&model, &en, &es);
        assert_eq!(
            off,
            [false, false, true, true, true, false, false, false, false, false]
        );
    }

    #[test]
    fn align_drops_mismatched_chapters_and_shifts() {
        let mut en = ModuleTexts::new();
        let mut es = ModuleTexts::new();
        let lens = [80, 150, 60, 120, 90, 140, 70, 100];
        // Num 12: the Spanish 12:8 is empty (its text opens Num 13): Num 12 and 13 go.
        // Num 14: fine. Num 15: one verse with lengths that disagree.
        for ch in 12..=15u32 {
            for (i, &l) in lens.iter().enumerate() {
                let v = i as u32 + 1;
                en.insert(vref("Num", ch, v), text(l, (ch * 100 + v) as usize));
                es.insert(vref("Num", ch, v), text(l, (ch * 100 + v) as usize + 1));
            }
        }
        es.insert(vref("Num", 12, 8), String::new());
        es.insert(vref("Num", 15, 3), text(400, 1));
        let (pairs, report) = align(&en, &es, None);
        let chapters: BTreeSet<u32> = pairs.iter().map(|p| p.vref.chapter).collect();
        assert_eq!(chapters, BTreeSet::from([14, 15]));
        assert!(report
            .disturbed_chapters
            .contains(&(book_index("Num").unwrap(), 13)));
        assert_eq!(report.empty, 1);
        assert_eq!(report.disturbed, 15);
        assert!(!pairs.iter().any(|p| p.vref == vref("Num", 15, 3)));
        assert_eq!(pairs.len(), 15);
    }

    fn pair(book: &str, chapter: u32, verse: u32, en: &str, es: &str) -> Pair {
        Pair {
            vref: vref(book, chapter, verse),
            en: en.into(),
            es: es.into(),
        }
    }

    #[test]
    fn splits_hold_out_whole_books_and_their_texts() {
        let web = vec![
            pair("Gen", 1, 1, "In the beginning.", "En el principio."),
            pair("Gen", 1, 2, "Grace be with you all. Amen.", "Otra cosa."),
            pair(
                "Gen",
                1,
                3,
                "Something else.",
                "La gracia sea con todos vosotros. Amén.",
            ),
            pair("Gen", 1, 4, "A unique verse.", "Un versículo único."),
            pair(
                "Esth",
                1,
                1,
                "Grace be with you all! Amen",
                "Texto de Ester.",
            ),
            pair(
                "Dan",
                1,
                1,
                "Daniel's text.",
                "La gracia sea con todos vosotros. Amén.",
            ),
        ];
        let kjv = vec![
            pair("Gen", 1, 1, "In the beginning God.", "En el principio."),
            pair("Gen", 1, 4, "An unique verse.", "Un versículo único."),
            pair("Esth", 1, 1, "Esther in the KJV.", "Texto de Ester."),
        ];
        let aligned = vec![(WEB_MODULE, web), (KJV_MODULE, kjv)];
        let dev = [book_index("Esth").unwrap()];
        let test = [book_index("Dan").unwrap()];
        let s = build_splits(&aligned, &dev, &test, WEB_MODULE);
        // Held out: only the WEB pair of each held-out verse.
        assert_eq!(s.dev.len(), 1);
        assert_eq!(s.dev[0].source, WEB_MODULE);
        assert_eq!(s.test.len(), 1);
        // Training: both sources, canonical order, WEB first; Gen 1:2 and 1:3 repeat a
        // held-out English (up to case and punctuation) or Spanish side.
        let train: Vec<(String, &str)> = s
            .train
            .iter()
            .map(|e| (e.vref.to_string(), e.source.as_str()))
            .collect();
        assert_eq!(
            train,
            [
                ("Gen 1:1".to_string(), WEB_MODULE),
                ("Gen 1:1".to_string(), KJV_MODULE),
                ("Gen 1:4".to_string(), WEB_MODULE),
                ("Gen 1:4".to_string(), KJV_MODULE),
            ]
        );
        assert_eq!(s.dropped_overlap, 2);
        // The property, stated generally.
        let held: HashSet<String> = s
            .dev
            .iter()
            .chain(&s.test)
            .flat_map(|e| [overlap_key(&e.en), overlap_key(&e.es)])
            .collect();
        for e in &s.train {
            assert!(!held.contains(&overlap_key(&e.en)) && !held.contains(&overlap_key(&e.es)));
            assert!(!dev.contains(&e.vref.book) && !test.contains(&e.vref.book));
        }
    }

    #[test]
    fn overlap_key_ignores_case_and_punctuation() {
        assert_eq!(
            overlap_key("Grace be with you all. Amen."),
            "grace be with you all amen"
        );
        assert_eq!(
            overlap_key("“Grace—be with  you all!” Amen"),
            "grace be with you all amen"
        );
        assert_eq!(overlap_key("¿Qué?"), "qué");
    }

    #[test]
    fn concat_groups_stay_inside_runs_of_consecutive_verses() {
        let ex = |c: u32, v: u32| Example {
            vref: vref("Dan", c, v),
            source: WEB_MODULE.into(),
            en: format!("e{c}.{v}"),
            es: format!("s{c}.{v}"),
        };
        // Dan 1:1-5, a gap, 1:7-8, then chapter 2.
        let examples = vec![
            ex(1, 1),
            ex(1, 2),
            ex(1, 3),
            ex(1, 4),
            ex(1, 5),
            ex(1, 7),
            ex(1, 8),
            ex(2, 1),
            ex(2, 2),
        ];
        let groups = concat_groups(&examples, &[2, 4]);
        let got: Vec<(usize, &str, &str)> = groups
            .iter()
            .map(|g| (g.n_verses, g.reference.as_str(), g.en.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (2, "Dan 1:1-2", "e1.1 e1.2"),
                (2, "Dan 1:3-4", "e1.3 e1.4"),
                (2, "Dan 1:7-8", "e1.7 e1.8"),
                (2, "Dan 2:1-2", "e2.1 e2.2"),
                (4, "Dan 1:1-4", "e1.1 e1.2 e1.3 e1.4"),
            ]
        );
        assert_eq!(groups[4].es, "s1.1 s1.2 s1.3 s1.4");
    }

    #[test]
    fn read_parallel_reads_what_is_written() {
        let dir = tempfile::tempdir().unwrap();
        write_lines(&dir.path().join("dev.en"), ["a b", "c"]).unwrap();
        write_lines(&dir.path().join("dev.es"), ["x y", "z"]).unwrap();
        let pairs = read_parallel(dir.path(), "dev").unwrap();
        assert_eq!(
            pairs,
            [
                ("a b".to_string(), "x y".to_string()),
                ("c".into(), "z".into())
            ]
        );
        write_lines(&dir.path().join("test.en"), ["a"]).unwrap();
        write_lines(&dir.path().join("test.es"), ["x", "y"]).unwrap();
        assert!(read_parallel(dir.path(), "test").is_err());
        assert!(read_parallel(dir.path(), "train").is_err());
    }

    fn small_args(out: &Path) -> CorpusArgs {
        CorpusArgs {
            out: out.to_path_buf(),
            books: vec!["Ruth".into(), "Jonah".into(), "Phlm".into(), "Dan".into()],
            concat_sizes: vec![2, 4, 8],
            tokenizer: None,
            diatheke: PathBuf::from("diatheke"),
            jobs: 0,
        }
    }

    /// End to end on a small real corpus (needs diatheke and the modules: scripts/setup.sh).
    #[test]
    fn run_builds_a_small_real_corpus_deterministically() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        run(small_args(a.path()))
            .expect("nmt-train corpus (is diatheke installed? scripts/setup.sh)");
        run(small_args(b.path())).unwrap();
        for f in [
            "train.en",
            "train.es",
            "dev.en",
            "dev.es",
            "test.en",
            "test.es",
            "test-concat.tsv",
            "stats.json",
        ] {
            let x = fs::read(a.path().join(f)).unwrap();
            assert_eq!(
                x,
                fs::read(b.path().join(f)).unwrap(),
                "{f} differs between runs"
            );
            assert!(!x.is_empty(), "{f} is empty");
        }
        let train = read_parallel(a.path(), "train").unwrap();
        let dev = read_parallel(a.path(), "dev").unwrap();
        let test = read_parallel(a.path(), "test").unwrap();
        // Ruth (85 verses), Jonah (48; chapters 1-2 mismatch) and Philemon (25), twice each;
        // Daniel is a test book whatever --books says.
        assert!(
            (240..=270).contains(&train.len()),
            "{} training pairs",
            train.len()
        );
        assert!((300..=316).contains(&dev.len()), "{} dev pairs", dev.len());
        assert!(
            (440..=461).contains(&test.len()),
            "{} test pairs",
            test.len()
        );
        let held: HashSet<String> = dev
            .iter()
            .chain(&test)
            .flat_map(|(e, s)| [overlap_key(e), overlap_key(s)])
            .collect();
        assert!(train
            .iter()
            .all(|(e, s)| !held.contains(&overlap_key(e)) && !held.contains(&overlap_key(s))));
        assert!(train
            .iter()
            .chain(&dev)
            .chain(&test)
            .all(|(e, s)| !e.is_empty()
                && !s.is_empty()
                && !e.contains(['<', '>', '¶', '\t'])
                && !s.contains(['<', '>', '¶', '\t'])
                && e.trim() == e
                && !e.contains("  ")));
        assert_eq!(
            test.first().unwrap().1,
            "En el año tercero del reinado de Joacim rey de Judá, vino Nabucodonosor rey de \
             Babilonia á Jerusalem, y cercóla."
        );
        let stats: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(a.path().join("stats.json")).unwrap())
                .unwrap();
        assert_eq!(stats["splits"]["train"]["pairs"], train.len());
        assert_eq!(stats["held_out_books"]["test"][0], "Dan");
        let concat = read_concat(a.path()).unwrap();
        for n in [2, 4, 8] {
            assert!(concat.iter().any(|c| c.n_verses == n));
        }
        assert!(concat
            .iter()
            .all(|c| c.reference.starts_with("Dan ") || c.reference.starts_with("Phil ")));
    }
}
