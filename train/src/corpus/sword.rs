//! The SWORD modules, read through `diatheke`: one process per (module, book), its raw OSIS
//! output parsed into verses.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{bail, ensure, Context, Result};

use super::canon::{VerseRef, BOOKS};
use super::osis::attr;

/// Spanish side of every pair: Reina-Valera 1909.
pub const SPANISH_MODULE: &str = "spaRV1909eb";
/// World English Bible (2015 edition, with deuterocanon).
pub const WEB_MODULE: &str = "engWEB2015eb";
/// King James Version (2006 edition).
pub const KJV_MODULE: &str = "engKJV2006eb";

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

pub(super) fn check_modules(diatheke: &Path) -> Result<()> {
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
pub(super) fn extract_all(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::canon::book_index;
    use crate::corpus::osis::clean_verse;

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
}
