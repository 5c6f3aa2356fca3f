//! SubRip (`.srt`), read and written by the `srtlib` crate: the same cues, numbers and
//! timings out, each cue's text translated (see [`crate::subtitles`]). A UTF-8 byte-order
//! mark and CRLF line endings are read; the output is UTF-8 with LF endings. srtlib keeps a
//! cue's number, times and text, not the rarely used coordinates after the end time
//! (`X1:... Y2:...`).

use anyhow::{Context, Result};
use srtlib::Subtitles;

use crate::subtitles::{translate_cues, SubtitleReport};
use crate::translator::Translator;

pub fn translate_srt(
    input: &str,
    translator: &mut Translator,
    max_line_chars: usize,
) -> Result<(String, SubtitleReport)> {
    let mut cues = Subtitles::parse_from_str(input.to_string())
        .context("reading the SubRip file")?
        .to_vec();
    let payloads: Vec<String> = cues.iter().map(|c| c.text.trim_end().to_string()).collect();
    let (translated, report) = translate_cues(&payloads, translator, max_line_chars)?;
    for (cue, text) in cues.iter_mut().zip(translated) {
        cue.text = text;
    }
    let mut out = Subtitles::new_from_vec(cues).to_string();
    if !out.is_empty() {
        out.push('\n');
    }
    Ok((out, report))
}
