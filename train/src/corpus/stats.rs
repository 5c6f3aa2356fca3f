//! `stats.json`: pairs and words per split, held-out books, what was dropped and why.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use super::align::{AlignReport, LENGTH_RATIO_MIN_CHARS, MAX_LENGTH_RATIO};
use super::canon::BOOKS;
use super::splits::{
    ConcatExample, Example, Splits, DEV_BOOKS, HELD_OUT_SOURCE, TEST_BOOKS, TRAIN_SOURCES,
};
use super::sword::SPANISH_MODULE;
use super::texts::ModuleTexts;

/// The statistics of a corpus built from `train_books`; `reports` are the alignments of each
/// English source with the Spanish texts `es`.
pub fn corpus_stats(
    train_books: &[usize],
    splits: &Splits,
    concat: &[ConcatExample],
    reports: &BTreeMap<&str, AlignReport>,
    es: &ModuleTexts,
) -> serde_json::Value {
    let mut concat_counts: BTreeMap<String, usize> = BTreeMap::new();
    for c in concat {
        *concat_counts.entry(c.n_verses.to_string()).or_default() += 1;
    }
    json!({
        "modules": {"spanish": SPANISH_MODULE, "train_sources": TRAIN_SOURCES, "held_out_source": HELD_OUT_SOURCE},
        "held_out_books": {"dev": DEV_BOOKS, "test": TEST_BOOKS},
        "train_books": book_names(train_books),
        "splits": {
            "train": split_stats(&splits.train),
            "dev": split_stats(&splits.dev),
            "test": split_stats(&splits.test),
        },
        "test_concat": {"file": "test-concat.tsv", "groups_by_n_verses": concat_counts},
        "dropped_train_pairs_repeating_held_out_text": splits.dropped_overlap,
        "alignment": alignment_stats(reports, es),
        "length_filter": {"max_ratio": MAX_LENGTH_RATIO, "min_chars": LENGTH_RATIO_MIN_CHARS},
    })
}

fn split_stats(split: &[Example]) -> serde_json::Value {
    let mut by_source: BTreeMap<&str, usize> = BTreeMap::new();
    for e in split {
        *by_source.entry(e.source.as_str()).or_default() += 1;
    }
    json!({
        "pairs": split.len(),
        "source_words": split.iter().map(|e| word_count(&e.en)).sum::<usize>(),
        "target_words": split.iter().map(|e| word_count(&e.es)).sum::<usize>(),
        "by_source": by_source,
    })
}

/// What each alignment kept and dropped. Only chapters the Spanish module has are listed as
/// mismatched: [`align`](super::align::align) also drops the chapter after the last one of a
/// book when empty verses end it.
fn alignment_stats<'a>(
    reports: &BTreeMap<&'a str, AlignReport>,
    es: &ModuleTexts,
) -> BTreeMap<&'a str, serde_json::Value> {
    let es_chapters: BTreeSet<(usize, u32)> = es.keys().map(|r| (r.book, r.chapter)).collect();
    reports
        .iter()
        .map(|(source, r)| {
            (
                *source,
                json!({
                    "common_refs": r.common,
                    "dropped_empty_side": r.empty,
                    "dropped_versification_mismatch": r.disturbed,
                    "dropped_off_diagonal": r.off_diagonal,
                    "dropped_length_ratio": r.length_ratio,
                    "length_model": r.length_model.map(|m| json!({"c": (m.c * 1e4).round() / 1e4, "s2": (m.s2 * 1e4).round() / 1e4})),
                    "off_diagonal_refs": r.off_diagonal_refs.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
                    "mismatched_chapters": r.disturbed_chapters.iter()
                        .filter(|bc| es_chapters.contains(bc))
                        .map(|(b, c)| format!("{} {c}", BOOKS[*b])).collect::<Vec<_>>(),
                    "length_ratio_refs": r.length_ratio_refs.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
                }),
            )
        })
        .collect()
}

fn word_count(text: &str) -> usize {
    text.split_whitespace().count()
}

fn book_names(books: &[usize]) -> Vec<&'static str> {
    books.iter().map(|&b| BOOKS[b]).collect()
}
