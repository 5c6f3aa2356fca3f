//! The train/dev/test splits (whole books held out) and the long-input test set.

use std::collections::HashSet;

use anyhow::{ensure, Result};

use super::align::Pair;
use super::canon::VerseRef;
use super::sword::{KJV_MODULE, WEB_MODULE};

/// English sources of the training split, in the order their pairs are written.
pub const TRAIN_SOURCES: [&str; 2] = [WEB_MODULE, KJV_MODULE];
/// The one English source of the dev and test splits.
pub const HELD_OUT_SOURCE: &str = WEB_MODULE;
/// Books (OSIS ids) of the dev split.
pub const DEV_BOOKS: [&str; 2] = ["Esth", "Gal"];
/// Books (OSIS ids) of the test split.
pub const TEST_BOOKS: [&str; 2] = ["Dan", "Phil"];

/// A pair of a split, with where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    pub vref: VerseRef,
    /// The English module.
    pub source: String,
    pub en: String,
    pub es: String,
}

/// The three splits.
#[derive(Debug, Default, Clone)]
pub struct Splits {
    pub train: Vec<Example>,
    pub dev: Vec<Example>,
    pub test: Vec<Example>,
    /// Training pairs dropped because a side equals a side of a dev or test pair.
    pub dropped_overlap: usize,
}

/// The key under which texts are compared with the held-out verses: lower case, letters and
/// digits only, single spaces.
pub fn overlap_key(text: &str) -> String {
    let mut key = String::with_capacity(text.len());
    for w in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if !key.is_empty() {
            key.push(' ');
        }
        key.extend(w.chars().flat_map(char::to_lowercase));
    }
    key
}

/// Splits aligned pairs by whole books. `aligned` holds the pairs of each English source, in
/// the order training pairs of one verse are written. Dev and test take the pairs of
/// `held_out_source` in their books; training takes the pairs of every source in the other
/// books, minus those with a side equal (by [`overlap_key`]) to a side of a dev or test pair.
pub fn build_splits(
    aligned: &[(&str, Vec<Pair>)],
    dev_books: &[usize],
    test_books: &[usize],
    held_out_source: &str,
) -> Splits {
    let mut splits = Splits::default();
    let mut train: Vec<(VerseRef, usize, Example)> = Vec::new();
    for (si, (source, pairs)) in aligned.iter().enumerate() {
        for p in pairs {
            let ex = Example {
                vref: p.vref,
                source: source.to_string(),
                en: p.en.clone(),
                es: p.es.clone(),
            };
            if dev_books.contains(&p.vref.book) {
                if *source == held_out_source {
                    splits.dev.push(ex);
                }
            } else if test_books.contains(&p.vref.book) {
                if *source == held_out_source {
                    splits.test.push(ex);
                }
            } else {
                train.push((p.vref, si, ex));
            }
        }
    }
    splits.dev.sort_by_key(|e| e.vref);
    splits.test.sort_by_key(|e| e.vref);
    train.sort_by_key(|(r, si, _)| (*r, *si));
    let held = held_out_keys(&splits);
    for (_, _, ex) in train {
        if repeats_held_out(&held, &ex) {
            splits.dropped_overlap += 1;
        } else {
            splits.train.push(ex);
        }
    }
    splits
}

/// The overlap keys of both sides of every dev and test verse.
fn held_out_keys(splits: &Splits) -> HashSet<String> {
    splits
        .dev
        .iter()
        .chain(&splits.test)
        .flat_map(|e| [overlap_key(&e.en), overlap_key(&e.es)])
        .collect()
}

/// Whether either side of `e` repeats a held-out verse (up to case and punctuation).
fn repeats_held_out(held: &HashSet<String>, e: &Example) -> bool {
    held.contains(&overlap_key(&e.en)) || held.contains(&overlap_key(&e.es))
}

/// Checks on the real data the property the splits promise: no training pair repeats a
/// held-out verse or comes from a held-out book, and dev and test are not empty.
pub fn check_splits(splits: &Splits, dev_books: &[usize], test_books: &[usize]) -> Result<()> {
    let held = held_out_keys(splits);
    ensure!(
        !splits.train.iter().any(|e| repeats_held_out(&held, e)),
        "a training pair repeats a held-out verse"
    );
    ensure!(
        splits
            .train
            .iter()
            .all(|e| !dev_books.contains(&e.vref.book) && !test_books.contains(&e.vref.book)),
        "a held-out book leaked into training"
    );
    ensure!(
        !splits.dev.is_empty() && !splits.test.is_empty(),
        "empty dev or test split"
    );
    Ok(())
}

/// One line of the long-input test set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcatExample {
    pub n_verses: usize,
    /// "Book chapter:first-last".
    pub reference: String,
    pub en: String,
    pub es: String,
}

/// Groups consecutive examples (same book and chapter, verse numbers without gaps, in order)
/// into non-overlapping groups of each size; the remainder of a run shorter than a size is
/// left out. Sizes are written in the order given, each over the whole test set.
pub fn concat_groups(examples: &[Example], sizes: &[usize]) -> Vec<ConcatExample> {
    // Runs of consecutive verses.
    let mut runs: Vec<&[Example]> = Vec::new();
    let mut start = 0;
    for i in 1..=examples.len() {
        let breaks = i == examples.len() || {
            let (a, b) = (&examples[i - 1].vref, &examples[i].vref);
            a.book != b.book || a.chapter != b.chapter || b.verse != a.verse + 1
        };
        if breaks {
            if i > start {
                runs.push(&examples[start..i]);
            }
            start = i;
        }
    }
    let mut out = Vec::new();
    for &n in sizes {
        if n == 0 {
            continue;
        }
        for run in &runs {
            for group in run.chunks_exact(n) {
                let first = group[0].vref;
                let last = group[n - 1].vref;
                out.push(ConcatExample {
                    n_verses: n,
                    reference: format!("{first}-{}", last.verse),
                    en: group
                        .iter()
                        .map(|e| e.en.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                    es: group
                        .iter()
                        .map(|e| e.es.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::canon::{book_index, vref};

    fn pair(book: &str, chapter: u32, verse: u32, en: &str, es: &str) -> Pair {
        Pair {
            vref: vref(book, chapter, verse),
            en: en.into(),
            es: es.into(),
        }
    }

    #[test]
    fn splits_hold_out_whole_books_and_their_texts() {
        let web = vec![
            pair("Gen", 1, 1, "In the beginning.", "En el principio."),
            pair("Gen", 1, 2, "Grace be with you all. Amen.", "Otra cosa."),
            pair(
                "Gen",
                1,
                3,
                "Something else.",
                "La gracia sea con todos vosotros. Amén.",
            ),
            pair("Gen", 1, 4, "A unique verse.", "Un versículo único."),
            pair(
                "Esth",
                1,
                1,
                "Grace be with you all! Amen",
                "Texto de Ester.",
            ),
            pair(
                "Dan",
                1,
                1,
                "Daniel's text.",
                "La gracia sea con todos vosotros. Amén.",
            ),
        ];
        let kjv = vec![
            pair("Gen", 1, 1, "In the beginning God.", "En el principio."),
            pair("Gen", 1, 4, "An unique verse.", "Un versículo único."),
            pair("Esth", 1, 1, "Esther in the KJV.", "Texto de Ester."),
        ];
        let aligned = vec![(WEB_MODULE, web), (KJV_MODULE, kjv)];
        let dev = [book_index("Esth").unwrap()];
        let test = [book_index("Dan").unwrap()];
        let s = build_splits(&aligned, &dev, &test, WEB_MODULE);
        // Held out: only the WEB pair of each held-out verse.
        assert_eq!(s.dev.len(), 1);
        assert_eq!(s.dev[0].source, WEB_MODULE);
        assert_eq!(s.test.len(), 1);
        // Training: both sources, canonical order, WEB first; Gen 1:2 and 1:3 repeat a
        // held-out English (up to case and punctuation) or Spanish side.
        let train: Vec<(String, &str)> = s
            .train
            .iter()
            .map(|e| (e.vref.to_string(), e.source.as_str()))
            .collect();
        assert_eq!(
            train,
            [
                ("Gen 1:1".to_string(), WEB_MODULE),
                ("Gen 1:1".to_string(), KJV_MODULE),
                ("Gen 1:4".to_string(), WEB_MODULE),
                ("Gen 1:4".to_string(), KJV_MODULE),
            ]
        );
        assert_eq!(s.dropped_overlap, 2);
        // The property, stated generally.
        let held: HashSet<String> = s
            .dev
            .iter()
            .chain(&s.test)
            .flat_map(|e| [overlap_key(&e.en), overlap_key(&e.es)])
            .collect();
        for e in &s.train {
            assert!(!held.contains(&overlap_key(&e.en)) && !held.contains(&overlap_key(&e.es)));
            assert!(!dev.contains(&e.vref.book) && !test.contains(&e.vref.book));
        }
    }

    #[test]
    fn overlap_key_ignores_case_and_punctuation() {
        assert_eq!(
            overlap_key("Grace be with you all. Amen."),
            "grace be with you all amen"
        );
        assert_eq!(
            overlap_key("“Grace—be with  you all!” Amen"),
            "grace be with you all amen"
        );
        assert_eq!(overlap_key("¿Qué?"), "qué");
    }

    #[test]
    fn concat_groups_stay_inside_runs_of_consecutive_verses() {
        let ex = |c: u32, v: u32| Example {
            vref: vref("Dan", c, v),
            source: WEB_MODULE.into(),
            en: format!("e{c}.{v}"),
            es: format!("s{c}.{v}"),
        };
        // Dan 1:1-5, a gap, 1:7-8, then chapter 2.
        let examples = vec![
            ex(1, 1),
            ex(1, 2),
            ex(1, 3),
            ex(1, 4),
            ex(1, 5),
            ex(1, 7),
            ex(1, 8),
            ex(2, 1),
            ex(2, 2),
        ];
        let groups = concat_groups(&examples, &[2, 4]);
        let got: Vec<(usize, &str, &str)> = groups
            .iter()
            .map(|g| (g.n_verses, g.reference.as_str(), g.en.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (2, "Dan 1:1-2", "e1.1 e1.2"),
                (2, "Dan 1:3-4", "e1.3 e1.4"),
                (2, "Dan 1:7-8", "e1.7 e1.8"),
                (2, "Dan 2:1-2", "e2.1 e2.2"),
                (4, "Dan 1:1-4", "e1.1 e1.2 e1.3 e1.4"),
            ]
        );
        assert_eq!(groups[4].es, "s1.1 s1.2 s1.3 s1.4");
    }
}
