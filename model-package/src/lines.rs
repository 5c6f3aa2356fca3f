//! Corpus files hold one text per line; a text's own newlines, tabs and backslashes are
//! escaped as in gettext's `.po` files. Written by the corpus builder, read by every stage
//! that reads a corpus (training, the tokenizer, evaluation).

/// One text per line: catalog strings hold newlines and tabs, which must reach the tokenizer
/// and the model as they are, so lines escape them as gettext's .po files do (`\n`, `\t`,
/// `\r`, `\\`). Bible verses have none of these characters: their files are unchanged.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

/// The inverse of [`escape`]; a backslash before any other character is kept as it is.
pub fn unescape(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_keeps_newlines_tabs_and_backslashes() {
        for text in ["plain", "a\nb\tc\r", "C:\\dir\\n", "\\", "end\\", "\n\n"] {
            let line = escape(text);
            assert!(!line.contains(['\n', '\t', '\r']), "{line:?}");
            assert_eq!(unescape(&line), text);
        }
        assert_eq!(unescape("a\\qb"), "a\\qb", "unknown escapes are kept");
    }
}
