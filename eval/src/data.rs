//! The test sets: a parallel set (one sentence a line) and the long-input set
//! (`test-concat.tsv`, written by `nmt-train corpus`), whose groups are tied back to the
//! verses they join so that those can be translated one by one.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};

/// Sources and references, aligned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parallel {
    pub sources: Vec<String>,
    pub references: Vec<String>,
}

impl Parallel {
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    pub fn truncate(&mut self, n: usize) {
        self.sources.truncate(n);
        self.references.truncate(n);
    }
}

/// `escaped`: the files are a corpus split, whose lines escape newlines, tabs and
/// backslashes (`model_package::lines`); other files are read as they are.
fn read_lines(path: &Path, escaped: bool) -> Result<Vec<String>> {
    let text = fs::read_to_string(path).with_context(|| {
        format!(
            "reading {} (the corpus comes from `nmt-train corpus --out data/corpus`)",
            path.display()
        )
    })?;
    Ok(text
        .lines()
        .map(|l| {
            if escaped {
                model_package::lines::unescape(l)
            } else {
                l.to_string()
            }
        })
        .collect())
}

/// Reads two aligned files, one sentence a line (`escaped`: see [`read_lines`]).
pub fn read_parallel(source: &Path, reference: &Path, escaped: bool) -> Result<Parallel> {
    let sources = read_lines(source, escaped)?;
    let references = read_lines(reference, escaped)?;
    ensure!(
        sources.len() == references.len(),
        "{} has {} lines but {} has {}",
        source.display(),
        sources.len(),
        reference.display(),
        references.len()
    );
    ensure!(!sources.is_empty(), "{} is empty", source.display());
    Ok(Parallel {
        sources,
        references,
    })
}

/// One row of the long-input set, with the indices (into the verse list it was built from)
/// of the verses it joins.
#[derive(Clone, Debug, PartialEq)]
pub struct ConcatGroup {
    pub n_verses: usize,
    /// "Book chapter:first-last".
    pub reference_id: String,
    pub en: String,
    pub es: String,
    pub verses: Vec<usize>,
}

/// Parses `test-concat.tsv` (a header line, then n_verses, ref, en, es).
pub fn parse_concat(text: &str) -> Result<Vec<ConcatGroup>> {
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    ensure!(
        header.split('\t').collect::<Vec<_>>() == ["n_verses", "ref", "en", "es"],
        "the header is {header:?}, not n_verses, ref, en, es"
    );
    let mut groups = Vec::new();
    for (i, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let cols: Vec<&str> = line.split('\t').collect();
        ensure!(
            cols.len() == 4,
            "line {}: {} columns, not 4",
            i + 2,
            cols.len()
        );
        groups.push(ConcatGroup {
            n_verses: cols[0]
                .parse()
                .with_context(|| format!("line {}: n_verses {:?}", i + 2, cols[0]))?,
            reference_id: cols[1].to_string(),
            en: cols[2].to_string(),
            es: cols[3].to_string(),
            verses: Vec::new(),
        });
    }
    Ok(groups)
}

/// Finds the verses each group joins: the run of `n_verses` consecutive lines of `verses`
/// whose sources and references, joined with a space, are the group's. `nmt-train corpus`
/// builds the groups of each size in verse order, so the search for a group starts after the
/// previous group of its size.
pub fn locate_verses(groups: &mut [ConcatGroup], verses: &Parallel) -> Result<()> {
    let mut next_start: BTreeMap<usize, usize> = BTreeMap::new();
    for group in groups.iter_mut() {
        let n = group.n_verses;
        ensure!(n > 0, "{}: n_verses is 0", group.reference_id);
        let from = next_start.get(&n).copied().unwrap_or(0);
        let joins = |start: usize| {
            verses.sources[start..start + n].join(" ") == group.en
                && verses.references[start..start + n].join(" ") == group.es
        };
        let Some(start) = (from..(verses.len() + 1).saturating_sub(n)).find(|&s| joins(s)) else {
            bail!(
                "{}: no {n} consecutive verses of the test split join to this group \
                 (was the concat set built from another corpus?)",
                group.reference_id
            );
        };
        group.verses = (start..start + n).collect();
        next_start.insert(n, start + n);
    }
    Ok(())
}

/// The first `max(1, limit / n_verses)` groups of each size, in file order.
pub fn limit_groups(groups: Vec<ConcatGroup>, limit: usize) -> Vec<ConcatGroup> {
    let mut taken: BTreeMap<usize, usize> = BTreeMap::new();
    groups
        .into_iter()
        .filter(|g| {
            let count = taken.entry(g.n_verses).or_default();
            *count += 1;
            *count <= (limit / g.n_verses.max(1)).max(1)
        })
        .collect()
}

/// The group sizes present, ascending.
pub fn group_sizes(groups: &[ConcatGroup]) -> Vec<usize> {
    let mut sizes: Vec<usize> = groups.iter().map(|g| g.n_verses).collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verses() -> Parallel {
        Parallel {
            sources: ["a1", "a2", "a3", "a4", "b1"].map(String::from).to_vec(),
            references: ["x1", "x2", "x3", "x4", "y1"].map(String::from).to_vec(),
        }
    }

    const TSV: &str = "n_verses\tref\ten\tes\n\
        2\tA 1:1-2\ta1 a2\tx1 x2\n\
        2\tA 1:3-4\ta3 a4\tx3 x4\n\
        4\tA 1:1-4\ta1 a2 a3 a4\tx1 x2 x3 x4\n";

    #[test]
    fn groups_are_tied_to_the_verses_they_join() {
        let mut groups = parse_concat(TSV).unwrap();
        locate_verses(&mut groups, &verses()).unwrap();
        let found: Vec<Vec<usize>> = groups.iter().map(|g| g.verses.clone()).collect();
        assert_eq!(found, vec![vec![0, 1], vec![2, 3], vec![0, 1, 2, 3]]);
        assert_eq!(group_sizes(&groups), vec![2, 4]);
    }

    #[test]
    fn a_group_that_joins_no_verses_is_an_error() {
        let tsv = TSV.replace("x3 x4\n", "x3 x5\n");
        let mut groups = parse_concat(&tsv).unwrap();
        let err = locate_verses(&mut groups, &verses()).unwrap_err();
        assert!(err.to_string().contains("A 1:3-4"), "{err}");
        assert!(parse_concat("n\tref\ten\tes\n").is_err());
        assert!(parse_concat("n_verses\tref\ten\tes\nx\tA\ta\tb\n").is_err());
    }

    #[test]
    fn the_limit_keeps_about_that_many_verses_of_each_size() {
        let groups = parse_concat(TSV).unwrap();
        let kept = limit_groups(groups.clone(), 2);
        let ids: Vec<&str> = kept.iter().map(|g| g.reference_id.as_str()).collect();
        assert_eq!(ids, ["A 1:1-2", "A 1:1-4"]);
        assert_eq!(limit_groups(groups, 4).len(), 3);
    }
}
