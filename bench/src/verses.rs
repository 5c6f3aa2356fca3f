//! The English inputs: the test split written by `nmt-train corpus`.
//!
//! `nmt-train corpus --out data/corpus` writes `test.en` (one verse per line, the held-out books
//! Daniel and Philippians) and `test-concat.tsv` (groups of 2, 4 and 8 consecutive test verses:
//! a header line, then the columns `n_verses`, `ref`, `en`, `es`). Both can be read: a `.tsv`
//! file by its `en` column, anything else one text per line.

use std::fs;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};

/// Reads the English texts of `path`: the `en` column of a `.tsv` file with a header line,
/// otherwise every non-empty line.
pub fn load(path: &Path) -> Result<Vec<String>> {
    let text = fs::read_to_string(path).with_context(|| {
        format!(
            "reading {} (build the corpus with `cargo run --release -p nmt-train -- corpus --out data/corpus`)",
            path.display()
        )
    })?;
    let is_tsv = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("tsv"));
    let verses = if is_tsv {
        parse_tsv(&text).with_context(|| path.display().to_string())?
    } else {
        parse_lines(&text)
    };
    ensure!(!verses.is_empty(), "{}: no texts", path.display());
    Ok(verses)
}

/// Every non-empty line, trimmed.
pub fn parse_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// The non-empty cells of the `en` column of a tab-separated table with a header line.
pub fn parse_tsv(text: &str) -> Result<Vec<String>> {
    let mut lines = text.lines();
    let header: Vec<&str> = match lines.next() {
        Some(h) => h.split('\t').collect(),
        None => bail!("empty file"),
    };
    let Some(col) = header.iter().position(|c| c.trim() == "en") else {
        bail!("no `en` column in the header {header:?}");
    };
    let mut out = Vec::new();
    for (i, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split('\t').collect();
        ensure!(
            cells.len() == header.len(),
            "line {}: {} columns, the header has {}",
            i + 2,
            cells.len(),
            header.len()
        );
        let en = cells[col].trim();
        if !en.is_empty() {
            out.push(en.to_string());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_skip_blanks() {
        assert_eq!(
            parse_lines("Jesus wept.\n\n  In the beginning.  \n"),
            ["Jesus wept.", "In the beginning."]
        );
    }

    #[test]
    fn tsv_takes_the_en_column() {
        let text = "n_verses\tref\ten\tes\n2\tDan 1:1-2\tA b.\tC d.\n4\tDan 1:3-6\tE f.\tG h.\n";
        assert_eq!(parse_tsv(text).unwrap(), ["A b.", "E f."]);
    }

    #[test]
    fn tsv_without_en_column_or_with_ragged_rows_fails() {
        assert!(parse_tsv("a\tb\n1\t2\n").is_err());
        assert!(parse_tsv("en\tes\nx\n").is_err());
        assert!(parse_tsv("").is_err());
    }
}
