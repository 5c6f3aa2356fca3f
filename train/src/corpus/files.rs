//! The files of a corpus directory: written by `nmt-train corpus`, read by the later stages.

use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{ensure, Context, Result};

use super::catalogs::{CatalogPair, CatalogSplits};
use super::splits::{ConcatExample, Example, Splits};

/// Split names, as `read_parallel` takes them.
pub const SPLITS: [&str; 3] = ["train", "dev", "test"];
/// The held-out catalog splits, written when the corpus includes the catalogs.
pub const CATALOG_SPLITS: [&str; 2] = ["l10n-dev", "l10n-test"];

pub use model_package::lines::{escape, unescape};

/// Reads a split ("train", "dev" or "test") written by `nmt-train corpus`: (English, Spanish)
/// pairs in file order.
pub fn read_parallel(dir: &Path, split: &str) -> anyhow::Result<Vec<(String, String)>> {
    let read = |lang: &str| -> Result<Vec<String>> {
        let path = dir.join(format!("{split}.{lang}"));
        let text = fs::read_to_string(&path)
            .with_context(|| format!("reading {} (run `nmt-train corpus`)", path.display()))?;
        Ok(text.lines().map(unescape).collect())
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

/// Reads `{split}.origin`, the provenance of each pair of a split (one line per pair).
pub fn read_origins(dir: &Path, split: &str) -> Result<Vec<String>> {
    let path = dir.join(format!("{split}.origin"));
    let text = fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (corpora built before provenance was recorded have none: rebuild with `nmt-train corpus`)",
            path.display()
        )
    })?;
    Ok(text.lines().map(str::to_owned).collect())
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

/// Writes the splits and the long-input test set (`test-concat.tsv`) to `out`; with
/// `catalogs`, their training pairs follow the Bible's in `train.*`, their held-out packages
/// go to `l10n-dev.*` and `l10n-test.*`, and every split gets a line-aligned `.origin` file
/// (`bible/<module>` or `debian/<package>/<catalog>`).
pub fn write_corpus(
    out: &Path,
    splits: &Splits,
    concat: &[ConcatExample],
    catalogs: Option<&CatalogSplits>,
) -> Result<()> {
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let bible = |split: &[Example]| -> Vec<Line> {
        split
            .iter()
            .map(|e| Line {
                en: e.en.clone(),
                es: e.es.clone(),
                origin: format!("bible/{}", e.source),
            })
            .collect()
    };
    let catalog = |pairs: &[CatalogPair]| -> Vec<Line> {
        pairs
            .iter()
            .map(|p| Line {
                en: p.en.clone(),
                es: p.es.clone(),
                origin: p.origin(),
            })
            .collect()
    };
    let mut train = bible(&splits.train);
    let mut files = vec![("dev", bible(&splits.dev)), ("test", bible(&splits.test))];
    if let Some(c) = catalogs {
        train.extend(catalog(&c.train));
        files.push((CATALOG_SPLITS[0], catalog(&c.dev)));
        files.push((CATALOG_SPLITS[1], catalog(&c.test)));
    }
    files.insert(0, ("train", train));
    for (name, lines) in &files {
        write_lines(
            &out.join(format!("{name}.en")),
            lines.iter().map(|l| l.en.as_str()),
        )?;
        write_lines(
            &out.join(format!("{name}.es")),
            lines.iter().map(|l| l.es.as_str()),
        )?;
        if catalogs.is_some() {
            write_lines(
                &out.join(format!("{name}.origin")),
                lines.iter().map(|l| l.origin.as_str()),
            )?;
        }
    }
    let concat_lines: Vec<String> = std::iter::once("n_verses\tref\ten\tes".to_string())
        .chain(
            concat
                .iter()
                .map(|c| format!("{}\t{}\t{}\t{}", c.n_verses, c.reference, c.en, c.es)),
        )
        .collect();
    fs::write(out.join("test-concat.tsv"), concat_lines.join("\n") + "\n")
        .with_context(|| format!("writing {}", out.join("test-concat.tsv").display()))?;
    Ok(())
}

/// One pair as written: both sides and where it comes from.
struct Line {
    en: String,
    es: String,
    origin: String,
}

fn write_lines<'a>(path: &Path, lines: impl IntoIterator<Item = &'a str>) -> Result<()> {
    let mut f = std::io::BufWriter::new(
        fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for line in lines {
        f.write_all(escape(line).as_bytes())?;
        f.write_all(b"\n")?;
    }
    f.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
