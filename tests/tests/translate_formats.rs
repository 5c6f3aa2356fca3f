//! `nmt-translate` on a gettext template and on subtitle files, with the shipped package,
//! checked by tools no one here wrote: gettext's `msgfmt --check` (and `msgattrib`, `msgcat`)
//! for the catalog, the PyPI `srt` 3.5.3 and `webvtt-py` 0.6.0 parsers for the subtitles, at
//! the versions `scripts/setup.sh` installs.
//!
//! The shipped model knows only the Bible, so its UI strings and dialogue are poor: these
//! tests check structure (what is kept, what is filled and marked, placeholders, cues,
//! timings, line lengths), never wording.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{binary, shipped_package, translate_cli};
use serde_json::Value;

/// A template as xgettext writes one, with what a catalog keeps: the header's comments, flag
/// and fields (one xgettext's parser-less readers drop), extracted comments, references,
/// format flags, contexts, plurals, an entry already translated, a fuzzy one, an obsolete one.
const TEMPLATE: &str = r#"# SOME DESCRIPTIVE TITLE.
# This file is distributed under the same license as the PACKAGE package.
#
#, fuzzy
msgid ""
msgstr ""
"Project-Id-Version: PACKAGE VERSION\n"
"Report-Msgid-Bugs-To: bugs@example.org\n"
"POT-Creation-Date: 2026-11-26 07:18+0000\n"
"PO-Revision-Date: YEAR-MO-DA HO:MI+ZONE\n"
"Last-Translator: FULL NAME <EMAIL@ADDRESS>\n"
"Language-Team: LANGUAGE <LL@li.org>\n"
"Language: \n"
"MIME-Version: 1.0\n"
"Content-Type: text/plain; charset=CHARSET\n"
"Content-Transfer-Encoding: 8bit\n"
"Plural-Forms: nplurals=INTEGER; plural=EXPRESSION;\n"
"X-Generator: xgettext\n"

#. TRANSLATORS: the greeting shown at start-up
#: src/main.c:7
#, c-format
msgid "Hello, %s! You have %d new messages.\n"
msgstr ""

#: src/main.c:8
#, c-format
msgid "%d file was deleted."
msgid_plural "%d files were deleted."
msgstr[0] ""
msgstr[1] ""

#: src/menu.c:3
msgctxt "menu"
msgid "Open"
msgstr ""

#: src/menu.c:4
msgctxt "verb"
msgid "Open"
msgstr "Abrir"

#: src/ui.py:12
#, python-brace-format
msgid "Click <b>Save</b> to keep your changes to {name}."
msgstr ""

#: src/ui.py:20
msgid "Cancel"
msgstr ""

#: src/ui.py:21
msgid "And God said, Let there be light: and there was light."
msgstr ""

#: src/ui.py:30
msgid ""
"Jesus wept. In the beginning God created the heavens and the earth, and the "
"earth was without form, and void."
msgstr ""

#: src/main.c:40
#, c-format
msgid "%s: %s"
msgstr ""

#: src/main.c:41
#, fuzzy
msgid "Quit"
msgstr "Salir"

#~ msgid "Old string"
#~ msgstr "Cadena vieja"
"#;

/// Runs a tool and returns its output; fails the test with its standard error when it fails.
fn tool(program: &str, args: &[&str]) -> Output {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (scripts/setup.sh installs it)"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(output: Output) -> String {
    String::from_utf8(output.stdout).unwrap()
}

/// `nmt-translate args...`, which must succeed; its summary line.
fn translate(args: &[&str]) -> String {
    let output = translate_cli(args, "");
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "nmt-translate failed: {stderr}");
    assert!(stderr.contains("target tokens/s"), "{stderr}");
    stderr
}

/// A catalog's entries after its header: the header is the one part nmt-translate changes.
fn after_header(catalog: &str) -> &str {
    catalog.split_once("\n\n").expect("a header").1
}

/// One entry of `msgcat --no-wrap` output: its keyword lines, each string on one line.
fn entries(catalog: &str) -> Vec<Vec<(String, String)>> {
    catalog
        .split("\n\n")
        .map(|entry| {
            entry
                .lines()
                .filter_map(|l| l.split_once(" \""))
                .filter(|(key, _)| key.starts_with("msg"))
                .map(|(key, value)| (key.to_string(), value.trim_end_matches('"').to_string()))
                .collect()
        })
        .collect()
}

/// The entries with a translation, the header aside.
fn filled(entries: &[Vec<(String, String)>]) -> Vec<&Vec<(String, String)>> {
    entries
        .iter()
        .filter(|e| field(e, "msgid").is_some_and(|id| !id.is_empty()))
        .filter(|e| {
            [field(e, "msgstr"), field(e, "msgstr[0]")]
                .into_iter()
                .flatten()
                .any(|s| !s.is_empty())
        })
        .collect()
}

fn field<'a>(entry: &'a [(String, String)], key: &str) -> Option<&'a str> {
    entry
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[test]
fn a_template_is_filled_fuzzy_within_its_budget_and_passes_msgfmt() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("app.pot"), dir.path().join("app.es.po"));
    std::fs::write(&input, TEMPLATE).unwrap();
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let summary = translate(&[
        &path(&input),
        "-o",
        &path(&output),
        "--max-chars-ratio",
        "1.3",
    ]);
    assert!(
        summary.contains("untranslated entries filled (fuzzy)"),
        "{summary}"
    );
    let written = std::fs::read_to_string(&output).unwrap();
    eprintln!("{written}");

    // gettext accepts it, the machine translations (fuzzy) included: format strings checked.
    tool(
        "msgfmt",
        &["--check", "--use-fuzzy", "-o", "/dev/null", &path(&output)],
    );
    tool("msgfmt", &["--check", "-o", "/dev/null", &path(&output)]);

    // The header: every field and comment kept, a template's placeholders filled.
    for kept in [
        "# SOME DESCRIPTIVE TITLE.\n",
        "#, fuzzy\nmsgid \"\"",
        "bugs@example.org",
        "X-Generator: xgettext",
    ] {
        assert!(written.contains(kept), "{kept}");
    }
    for filled in [
        "\"Language: es\\n\"",
        "charset=UTF-8",
        "nplurals=2; plural=(n != 1);",
    ] {
        assert!(written.contains(filled), "{filled}");
    }
    // Translated, fuzzy and obsolete entries exactly as they were.
    for kept in [
        "msgctxt \"verb\"\nmsgid \"Open\"\nmsgstr \"Abrir\"\n",
        "#, fuzzy\nmsgid \"Quit\"\nmsgstr \"Salir\"\n",
        "#~ msgid \"Old string\"\n#~ msgstr \"Cadena vieja\"\n",
    ] {
        assert!(written.contains(kept), "{kept}");
    }

    // Emptied of translations and fuzzy flags, the output is the input: comments, references,
    // flags, contexts, msgids and plural forms all kept. (gettext's tools read a template's
    // entries only once its header names a charset.)
    let input = dir.path().join("app-utf8.pot");
    std::fs::write(&input, TEMPLATE.replace("charset=CHARSET", "charset=UTF-8")).unwrap();
    let emptied = |file: &Path| {
        let cleared = dir.path().join("cleared.po");
        tool(
            "msgattrib",
            &["--clear-fuzzy", "-o", &path(&cleared), &path(file)],
        );
        stdout(tool(
            "msgfilter",
            &[
                "--keep-header",
                "--no-wrap",
                "-i",
                &path(&cleared),
                "sed",
                "-e",
                "d",
            ],
        ))
    };
    assert_eq!(
        after_header(&emptied(&output)),
        after_header(&emptied(&input))
    );

    // Entries without a fuzzy flag are those that had a translation without one.
    let unmarked = |file: &Path| {
        stdout(tool(
            "msgattrib",
            &["--translated", "--no-fuzzy", "--no-wrap", &path(file)],
        ))
    };
    assert_eq!(
        after_header(&unmarked(&output)),
        after_header(&unmarked(&input))
    );

    let normalized = stdout(tool("msgcat", &["--no-wrap", &path(&output)]));
    let entries = entries(&normalized);
    let filled = filled(&entries);
    assert!(filled.len() >= 5, "few entries filled: {normalized}");
    // "%s: %s" has no words: it is its own translation.
    assert!(
        normalized.contains("msgid \"%s: %s\"\nmsgstr \"%s: %s\"\n"),
        "{normalized}"
    );
    check_budgets_and_placeholders(&filled);
}

/// Each translation within 1.3 times its msgid (10 characters at least), and the markup and
/// brace placeholders msgfmt does not check for a python-brace-format string kept.
fn check_budgets_and_placeholders(filled: &[&Vec<(String, String)>]) {
    let chars = |s: &str| s.trim_end_matches("\\n").chars().count();
    for entry in filled {
        let pairs = [
            ("msgid", "msgstr"),
            ("msgid", "msgstr[0]"),
            ("msgid_plural", "msgstr[1]"),
        ];
        for (source, target) in pairs {
            let (Some(source), Some(target)) = (field(entry, source), field(entry, target)) else {
                continue;
            };
            let budget = ((1.3 * chars(source) as f64).ceil() as usize).max(10);
            assert!(
                chars(target) <= budget,
                "{target:?} is over {budget} characters ({source:?})"
            );
            for kept in ["<b>", "</b>", "{name}", "%s", "%d"] {
                assert_eq!(
                    source.matches(kept).count(),
                    target.matches(kept).count(),
                    "{kept}: {source:?} -> {target:?}"
                );
            }
        }
    }
}

/// Cues as a subtitle parser no one here wrote reads them: `[start, end, text]` in order.
fn cues(module: &str, file: &Path) -> Vec<Value> {
    const READ: &str = r#"
import json, sys
module, path = sys.argv[1], sys.argv[2]
if module == "srt":
    import srt
    with open(path, encoding="utf-8") as f:
        cues = [[str(c.start), str(c.end), c.content] for c in srt.parse(f.read())]
else:
    import webvtt
    cues = [[c.start, c.end, c.raw_text] for c in webvtt.read(path)]
print(json.dumps(cues))
"#;
    let printed = stdout(tool(
        "python3",
        &["-c", READ, module, file.to_str().unwrap()],
    ));
    serde_json::from_str::<Vec<Value>>(&printed).unwrap()
}

/// A cue's text without markup, as it shows on screen.
fn shown(text: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for c in text.chars() {
        match c {
            '<' | '{' => inside = true,
            '>' | '}' if inside => inside = false,
            _ if !inside => out.push(c),
            _ => {}
        }
    }
    out
}

/// Translates `file` with `args`, then checks with `module`'s parser that the output has the
/// same cues and timings, each in at most two lines of at most `line_chars` characters.
fn check_subtitles(
    module: &str,
    source: &str,
    name: &str,
    args: &[&str],
    line_chars: usize,
) -> (String, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join(name), dir.path().join(format!("es.{name}")));
    std::fs::write(&input, source).unwrap();
    let summary = translate(
        &[
            &[input.to_str().unwrap(), "-o", output.to_str().unwrap()],
            args,
        ]
        .concat(),
    );
    assert!(summary.contains("cues joined"), "{summary}");
    let written = std::fs::read_to_string(&output).unwrap();
    eprintln!("{written}");
    let (before, after) = (cues(module, &input), cues(module, &output));
    assert_eq!(before.len(), after.len(), "cue count");
    for (b, a) in before.iter().zip(&after) {
        assert_eq!((&b[0], &b[1]), (&a[0], &a[1]), "timings of {a}");
        let text = a[2].as_str().unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!((1..=2).contains(&lines.len()), "{text:?}");
        for line in lines {
            let n = shown(line).trim().chars().count();
            assert!(n > 0 && n <= line_chars, "{line:?}: {n} characters");
        }
    }
    (written, after)
}

const SUBRIP: &str = "1\r\n00:00:01,000 --> 00:00:03,200\r\nAnd God said,\r\n\r\n\
2\r\n00:00:03,300 --> 00:00:05,900\r\nLet there be light:\r\n\r\n\
3\r\n00:00:06,000 --> 00:00:08,000\r\nand there was light.\r\n\r\n\
4\r\n00:00:08,500 --> 00:00:11,000\r\n<i>In the beginning God created\r\nthe heavens and the earth.</i>\r\n\r\n\
5\r\n00:00:12,000 --> 00:00:14,000\r\n♪\r\n\r\n\
6\r\n00:00:14,500 --> 00:00:18,000\r\nAnd the earth was without form, and void; and darkness was upon the face of the deep.\r\n\r\n\
7\r\n00:00:18,100 --> 00:00:19,000\r\nJesus wept.\r\n";

#[test]
fn subrip_cues_keep_their_timings_in_two_lines_of_42() {
    let (written, cues) = check_subtitles("srt", SUBRIP, "film.srt", &[], 42);
    assert_eq!(cues[4][2], "♪", "a cue without words is kept");
    let italic = cues[3][2].as_str().unwrap();
    assert!(
        italic.starts_with("<i>") && italic.ends_with("</i>"),
        "{italic}"
    );
    assert!(
        written.starts_with("1\n00:00:01,000 --> 00:00:03,200\n"),
        "{written}"
    );
}

const WEBVTT: &str = "WEBVTT - Genesis\nKind: captions\nLanguage: en\n\n\
STYLE\n::cue { color: yellow }\n\n\
NOTE two cues, one sentence\n\n\
intro\n00:00:01.000 --> 00:00:03.200 align:start position:10%,line-left\n<v Narrator>And God said,\n\n\
00:00:03.300 --> 00:00:05.900\nLet there be light: and there was light.\n\n\
3\n01:00:06.000 --> 01:00:09.000 line:0\nAnd the earth was without form, and void;\nand darkness was upon the face of the deep.\n";

#[test]
fn webvtt_cues_keep_their_timings_settings_and_blocks_in_short_lines() {
    let (written, cues) = check_subtitles(
        "webvtt",
        WEBVTT,
        "film.vtt",
        &["--max-line-chars", "32"],
        32,
    );
    for kept in [
        "WEBVTT - Genesis\nKind: captions\nLanguage: en\n\n",
        "STYLE\n::cue { color: yellow }\n\n",
        "NOTE two cues, one sentence\n\n",
        "intro\n00:00:01.000 --> 00:00:03.200 align:start position:10%,line-left\n<v Narrator>",
        "\n3\n01:00:06.000 --> 01:00:09.000 line:0\n",
    ] {
        assert!(written.contains(kept), "{kept:?} in {written}");
    }
    assert_eq!(cues.len(), 3);
}

/// The modern package masks placeholders, so its c-format translations are filled too: they
/// must pass msgfmt's format checks, which the shipped model's (left empty) do not reach.
#[test]
fn with_the_modern_package_c_format_entries_are_filled_and_pass_msgfmt() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("app.pot"), dir.path().join("app.es.po"));
    std::fs::write(&input, TEMPLATE).unwrap();
    let l10n = shipped_package().with_file_name("en-es-l10n");
    let run = Command::new(binary("nmt-translate"))
        .arg("--model-dir")
        .arg(&l10n)
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .args(["--max-chars-ratio", "1.3"])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let path = output.to_str().unwrap();
    tool(
        "msgfmt",
        &["--check", "--use-fuzzy", "-o", "/dev/null", path],
    );
    let normalized = stdout(tool("msgcat", &["--no-wrap", path]));
    eprintln!("{normalized}");
    let entries = entries(&normalized);
    let c_format: Vec<&Vec<(String, String)>> = entries
        .iter()
        .filter(|e| field(e, "msgid").is_some_and(|id| id.contains("%d")))
        .collect();
    assert_eq!(c_format.len(), 2);
    for entry in c_format {
        for (key, value) in entry.iter().filter(|(k, _)| k.starts_with("msgstr")) {
            assert!(value.contains("%d"), "{key} {value:?} of {entry:?}");
        }
    }
    let filled = filled(&entries);
    assert!(filled.len() >= 8, "few entries filled: {normalized}");
    check_budgets_and_placeholders(&filled);
}

#[test]
fn budgets_of_another_format_are_refused() {
    // Refused before anything is read (so nothing is written to its standard input).
    let output = translate_cli(&["in.txt", "--max-chars-ratio", "1.3"], "");
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(
        message.contains("--max-chars-ratio applies to gettext catalogs"),
        "{message}"
    );
    let output = translate_cli(&["film.srt", "--max-chars", "40"], "");
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("--max-line-chars"), "{message}");
}
