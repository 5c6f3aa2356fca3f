//! WebVTT (`.vtt`): the same file out with each cue's text translated (see
//! [`crate::subtitles`]); the header, `NOTE`, `STYLE` and `REGION` blocks, cue identifiers,
//! timings and cue settings are copied as they were.
//!
//! Written here rather than with a crate: of the WebVTT crates on crates.io, `webvtt-parser`
//! 1.4 rejects a file with a `STYLE` block, drops cue settings it does not model (`region:`,
//! `position:10%,line-left`) and writes `position:10` without its `%`, and `vtt` 1.0 rejects
//! `NOTE` and `STYLE` blocks and any setting it does not model; both rewrite the header. A
//! translation only replaces cue texts, so this reads the file's block structure (W3C WebVTT,
//! "file parsing") and copies everything else through.

use anyhow::{bail, Result};

use crate::subtitles::{translate_cues, SubtitleReport};
use crate::translator::Translator;

/// A block of lines between blank lines.
#[derive(Debug, PartialEq)]
struct Block {
    lines: Vec<String>,
    /// For a cue, the index of its first text line (after the timing line).
    text_from: Option<usize>,
}

pub fn translate_vtt(
    input: &str,
    translator: &mut Translator,
    max_line_chars: usize,
) -> Result<(String, SubtitleReport)> {
    let mut blocks = parse(input)?;
    let payloads: Vec<String> = blocks
        .iter()
        .filter_map(|b| b.text_from.map(|from| b.lines[from..].join("\n")))
        .collect();
    let (translated, report) = translate_cues(&payloads, translator, max_line_chars)?;
    let cues = blocks.iter_mut().filter(|b| b.text_from.is_some());
    for (block, text) in cues.zip(translated) {
        let from = block.text_from.expect("a cue");
        block.lines.truncate(from);
        block.lines.extend(text.lines().map(str::to_string));
    }
    Ok((write(&blocks), report))
}

/// The file's blocks: the header (`WEBVTT` and the lines after it), then cues and other blocks.
fn parse(input: &str) -> Result<Vec<Block>> {
    let input = input.strip_prefix('\u{feff}').unwrap_or(input);
    // WebVTT ends lines with CRLF, LF or CR.
    let input = input.replace("\r\n", "\n").replace('\r', "\n");
    let first = input.lines().next().unwrap_or("");
    let signature = first.strip_prefix("WEBVTT");
    if !signature.is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t'])) {
        bail!("not a WebVTT file: it does not start with a WEBVTT line");
    }
    let mut blocks: Vec<Block> = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    // Only an empty line ends a block (a line of spaces is text).
    for line in input.lines().chain(std::iter::once("")) {
        if !line.is_empty() {
            lines.push(line.to_string());
        } else if !lines.is_empty() {
            let header = blocks.is_empty();
            let lines = std::mem::take(&mut lines);
            let text_from = if header { None } else { cue_text_from(&lines) };
            blocks.push(Block { lines, text_from });
        }
    }
    Ok(blocks)
}

/// Where a cue block's text starts: after its timing line, which is its first line or,
/// after an identifier, its second; `None` for any other block.
fn cue_text_from(lines: &[String]) -> Option<usize> {
    (0..lines.len().min(2))
        .find(|&i| lines[i].contains("-->"))
        .filter(|&i| is_timing(&lines[i]))
        .map(|i| i + 1)
}

/// `start --> end [settings]` with two valid timestamps (a block whose timings do not parse
/// is no cue, and a player skips it).
fn is_timing(line: &str) -> bool {
    let Some((start, rest)) = line.split_once("-->") else {
        return false;
    };
    let end = rest.split_whitespace().next().unwrap_or("");
    timestamp_ms(start.trim()).is_some() && timestamp_ms(end).is_some()
}

/// `[hh:]mm:ss.ttt` in milliseconds (hours of two or more digits, minutes and seconds < 60).
fn timestamp_ms(text: &str) -> Option<u64> {
    let (clock, millis) = text.split_once('.')?;
    let fields: Vec<&str> = clock.split(':').collect();
    let digits = |s: &str, n: usize| s.len() >= n && s.bytes().all(|b| b.is_ascii_digit());
    let ok = millis.len() == 3
        && digits(millis, 3)
        && matches!(fields.len(), 2 | 3)
        && fields
            .iter()
            .rev()
            .take(2)
            .all(|f| f.len() == 2 && digits(f, 2))
        && (fields.len() == 2 || digits(fields[0], 2));
    if !ok {
        return None;
    }
    let parse = |s: &str| s.parse::<u64>().ok();
    let (h, m, s) = match fields[..] {
        [m, s] => (0, parse(m)?, parse(s)?),
        [h, m, s] => (parse(h)?, parse(m)?, parse(s)?),
        _ => return None,
    };
    let ms = parse(millis)?;
    (m < 60 && s < 60).then_some(((h * 60 + m) * 60 + s) * 1000 + ms)
}

fn write(blocks: &[Block]) -> String {
    let blocks: Vec<String> = blocks.iter().map(|b| b.lines.join("\n")).collect();
    let mut out = blocks.join("\n\n");
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\u{feff}WEBVTT - A film\r\nKind: captions\r\n\r\nSTYLE\r\n::cue { color: yellow }\r\n\r\nNOTE a comment\r\nover two lines\r\n\r\n\r\nintro\r\n00:00:01.000 --> 00:00:04.000 align:start position:10%,line-left region:fred\r\n<v Roger>Never drink\r\nliquid nitrogen.\r\n\r\n00:05.000 --> 00:09.500\r\nIt will perforate\r\n\r\n99:00.000 --> 99:01.000\r\nnot a cue: 99 minutes\r\n";

    #[test]
    fn blocks_cues_and_their_texts() {
        let blocks = parse(FILE).unwrap();
        assert_eq!(blocks.len(), 6);
        assert_eq!(blocks[0].lines, ["WEBVTT - A film", "Kind: captions"]);
        let cues: Vec<usize> = blocks.iter().filter_map(|b| b.text_from).collect();
        assert_eq!(
            cues,
            [2, 1],
            "an identifier first, then none; the last block is no cue"
        );
        assert_eq!(
            blocks[3].lines[2..],
            ["<v Roger>Never drink", "liquid nitrogen."]
        );
    }

    #[test]
    fn everything_but_cue_texts_is_written_back_as_it_was() {
        let blocks = parse(FILE).unwrap();
        let written = write(&blocks);
        let expected = FILE
            .trim_start_matches('\u{feff}')
            .replace("\r\n", "\n")
            .replace("\n\n\n", "\n\n");
        assert_eq!(written, expected);
        assert!(parse("WEBVTTX\n").is_err());
        assert!(parse("1\n00:00:01,000 --> 00:00:02,000\nSRT\n").is_err());
        assert!(parse("WEBVTT\n").is_ok());
    }

    #[test]
    fn timestamps() {
        assert_eq!(timestamp_ms("00:01.500"), Some(1500));
        assert_eq!(timestamp_ms("01:02:03.004"), Some(3_723_004));
        assert_eq!(timestamp_ms("100:00:00.000"), Some(360_000_000));
        for bad in [
            "1:02.000",
            "00:60.000",
            "00:01,500",
            "00:01.5",
            "a0:01.500",
            "",
        ] {
            assert_eq!(timestamp_ms(bad), None, "{bad}");
        }
        assert!(is_timing("00:01.000 --> 00:02.000 line:0"));
        assert!(!is_timing("00:01.000 -> 00:02.000"));
    }
}
