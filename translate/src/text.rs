//! Plain text: one translation per input line, in input order (an empty line stays empty), so
//! the output aligns with the input; read, translated and written chunk by chunk, so it
//! streams.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use anyhow::{Context, Result};
use nmt_engine::sentences::{self, Sentences};
use nmt_engine::{Outcome, Translation};

use crate::translator::{Translator, CHUNK_BATCHES};

/// Reads, translates and writes chunk by chunk, flushing each, so output streams; with
/// `split_sentences` each line's sentences are translated as texts of their own and joined.
/// Returns the number of lines.
pub fn translate_stream(
    translator: &mut Translator,
    mut input: Box<dyn BufRead>,
    output: &mut dyn Write,
    split_sentences: bool,
) -> Result<usize> {
    let chunk_size = translator.batch_size * CHUNK_BATCHES;
    let mut lines_done = 0;
    loop {
        let first_line = lines_done + 1;
        let chunk = read_chunk(&mut input, chunk_size, first_line)?;
        if chunk.is_empty() {
            return Ok(lines_done);
        }
        let translations = if split_sentences {
            translate_sentences(translator, &chunk)?
        } else {
            translator.translate(&chunk, &vec![None; chunk.len()])?
        };
        for (i, (line, translation)) in chunk.iter().zip(&translations).enumerate() {
            if translation.outcome == Outcome::Refused && !line.trim().is_empty() {
                translator.warn(&format!(
                    "line {}: {} subwords is over the input limit of {}; its translation is \
                     left empty (--beyond-input-limit decodes it)",
                    first_line + i,
                    translation.source_tokens,
                    translator.engine.info.input_limit
                ));
            }
            // One translation a line, so the output aligns with the input.
            let line = translation.text.replace(['\n', '\r'], " ");
            writeln!(output, "{line}").context("writing the translations")?;
        }
        output.flush().context("writing the translations")?;
        lines_done += chunk.len();
    }
}

/// Each line's translation from its sentences' (as `split_sentences` does on the server).
fn translate_sentences(translator: &mut Translator, lines: &[String]) -> Result<Vec<Translation>> {
    let language = translator.engine.info.source_language.clone();
    let split: Vec<Sentences> = lines
        .iter()
        .map(|l| sentences::split(&language, l))
        .collect();
    let all: Vec<String> = split.iter().flat_map(|s| s.sentences.clone()).collect();
    let translated = translator.translate(&all, &vec![None; all.len()])?;
    Ok(sentences::join_translations(&split, translated))
}

/// Up to `n` lines without their line endings; a line that is not UTF-8 is an error that names
/// it rather than a silently changed text.
pub fn read_chunk(input: &mut dyn BufRead, n: usize, first_line: usize) -> Result<Vec<String>> {
    let mut lines = Vec::with_capacity(n);
    let mut buffer = Vec::new();
    while lines.len() < n {
        buffer.clear();
        if input
            .read_until(b'\n', &mut buffer)
            .context("reading the input")?
            == 0
        {
            break;
        }
        while matches!(buffer.last(), Some(b'\n' | b'\r')) {
            buffer.pop();
        }
        let line = String::from_utf8(std::mem::take(&mut buffer))
            .map_err(|_| anyhow::anyhow!("line {} is not UTF-8 text", first_line + lines.len()))?;
        lines.push(line);
    }
    Ok(lines)
}

/// Lines in a file, for the progress bar's total.
pub fn count_lines(path: &Path) -> Result<usize> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut count = 0;
    for line in BufReader::new(file).split(b'\n') {
        line.with_context(|| format!("reading {}", path.display()))?;
        count += 1;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_keep_empty_lines_and_drop_line_endings() {
        let mut input: &[u8] = b"one\r\n\ntwo\nthree";
        let lines = read_chunk(&mut input, 2, 1).unwrap();
        assert_eq!(lines, ["one", ""]);
        let rest = read_chunk(&mut input, 5, 3).unwrap();
        assert_eq!(rest, ["two", "three"]);
        assert!(read_chunk(&mut input, 5, 5).unwrap().is_empty());
        let mut bad: &[u8] = b"ok\n\xff\xfe\n";
        let err = read_chunk(&mut bad, 5, 1).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
    }
}
