//! gettext's binary catalogs (`.mo`), read without gettext: the format is a header and two
//! tables of (length, offset) pointing at NUL-terminated strings, in either byte order
//! (<https://www.gnu.org/software/gettext/manual/html_node/MO-Files.html>).
//!
//! What `msgfmt` folds into a key is unfolded again: `msgctxt` is the key's prefix before an
//! EOT (`\x04`), a plural `msgid_plural` follows the singular after a NUL, and the plural
//! forms of `msgstr` are NUL-separated. `msgfmt` leaves fuzzy entries out of the binary by
//! default, so there are none to drop here.

use anyhow::{bail, ensure, Context, Result};

const MAGIC_LE: u32 = 0x9504_12de;
const MAGIC_BE: u32 = 0xde12_0495;

/// One catalog entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub context: Option<String>,
    pub msgid: String,
    pub msgid_plural: Option<String>,
    /// One string, or one per plural form.
    pub msgstr: Vec<String>,
}

/// A parsed catalog: its entries and the charset its header declares.
#[derive(Debug, Clone)]
pub struct Catalog {
    pub entries: Vec<Entry>,
    /// From the header's `Content-Type: ...; charset=`; `None` when there is no header.
    pub charset: Option<String>,
}

/// Parses a `.mo` file. Strings must be UTF-8 (nearly every catalog Debian ships is); a
/// catalog in another charset is refused rather than decoded wrongly.
pub fn parse(bytes: &[u8]) -> Result<Catalog> {
    ensure!(bytes.len() >= 20, "too short for a .mo header");
    let word = |at: usize, big: bool| -> Result<u32> {
        let b: [u8; 4] = bytes
            .get(at..at + 4)
            .context("table runs past the end of the file")?
            .try_into()
            .unwrap();
        Ok(if big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    };
    let big = match u32::from_le_bytes(bytes[0..4].try_into().unwrap()) {
        MAGIC_LE => false,
        MAGIC_BE => true,
        m => bail!("not a .mo file (magic {m:#x})"),
    };
    let count = word(8, big)? as usize;
    let originals = word(12, big)? as usize;
    let translations = word(16, big)? as usize;
    let string_at = |table: usize, i: usize| -> Result<&[u8]> {
        let len = word(table + 8 * i, big)? as usize;
        let off = word(table + 8 * i + 4, big)? as usize;
        bytes
            .get(off..off + len)
            .with_context(|| format!("string {i} runs past the end of the file"))
    };
    let mut entries = Vec::with_capacity(count);
    let mut charset = None;
    for i in 0..count {
        let key = std::str::from_utf8(string_at(originals, i)?)
            .with_context(|| format!("msgid {i} is not UTF-8"))?;
        let value = std::str::from_utf8(string_at(translations, i)?)
            .with_context(|| format!("msgstr {i} is not UTF-8"))?;
        if key.is_empty() {
            charset = header_charset(value);
            continue;
        }
        entries.push(unfold(key, value));
    }
    if let Some(cs) = &charset {
        ensure!(
            cs.eq_ignore_ascii_case("utf-8") || cs.eq_ignore_ascii_case("utf8"),
            "charset {cs} (only UTF-8 catalogs are read)"
        );
    }
    Ok(Catalog { entries, charset })
}

fn unfold(key: &str, value: &str) -> Entry {
    let (context, key) = match key.split_once('\x04') {
        Some((c, k)) => (Some(c.to_string()), k),
        None => (None, key),
    };
    let (msgid, msgid_plural) = match key.split_once('\0') {
        Some((s, p)) => (s.to_string(), Some(p.to_string())),
        None => (key.to_string(), None),
    };
    Entry {
        context,
        msgid,
        msgid_plural,
        msgstr: value.split('\0').map(str::to_string).collect(),
    }
}

fn header_charset(header: &str) -> Option<String> {
    let line = header
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("content-type:"))?;
    let at = line.to_ascii_lowercase().find("charset=")?;
    let cs = line[at + "charset=".len()..].trim();
    Some(cs.trim_end_matches(';').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A catalog compiled by gettext's own `msgfmt` (Debian package gettext).
    fn compile(po: &str) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("t.po");
        let out = dir.path().join("t.mo");
        std::fs::write(&src, po).unwrap();
        let status = Command::new("msgfmt")
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .status()
            .expect("msgfmt (Debian package gettext: scripts/setup.sh installs it)");
        assert!(status.success());
        std::fs::read(out).unwrap()
    }

    #[test]
    fn reads_what_msgfmt_writes() {
        let po = r#"msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\n"
"Plural-Forms: nplurals=2; plural=(n != 1);\n"

msgid "Open _File"
msgstr "Abrir _archivo"

msgctxt "menu"
msgid "Open"
msgstr "Abrir"

msgid "%d file\n"
msgid_plural "%d files\n"
msgstr[0] "%d archivo\n"
msgstr[1] "%d archivos\n"

#, fuzzy
msgid "Fuzzy one"
msgstr "Difuso"

msgid "Untranslated"
msgstr ""
"#;
        let cat = parse(&compile(po)).unwrap();
        assert_eq!(cat.charset.as_deref(), Some("UTF-8"));
        let find = |id: &str| cat.entries.iter().find(|e| e.msgid == id).cloned();
        assert_eq!(find("Open _File").unwrap().msgstr, ["Abrir _archivo"]);
        let open = find("Open").unwrap();
        assert_eq!(open.context.as_deref(), Some("menu"));
        let plural = find("%d file\n").unwrap();
        assert_eq!(plural.msgid_plural.as_deref(), Some("%d files\n"));
        assert_eq!(plural.msgstr, ["%d archivo\n", "%d archivos\n"]);
        assert!(
            find("Fuzzy one").is_none(),
            "msgfmt leaves fuzzy entries out"
        );
        assert!(find("Untranslated").is_none());
        assert_eq!(cat.entries.len(), 3);
    }

    #[test]
    fn refuses_what_is_not_a_catalog() {
        assert!(parse(b"hello").is_err());
        assert!(parse(&[0u8; 40]).is_err());
        let mut truncated = compile("msgid \"a\"\nmsgstr \"b\"\n");
        truncated.truncate(30);
        assert!(parse(&truncated).is_err());
    }
}
