//! The verse-aligned English -> Spanish corpus, built from the SWORD Bible modules through
//! `diatheke` (`nmt-train corpus --out data/corpus`).
//!
//! # Sources
//! Three public-domain SWORD modules (Debian packages `sword-text-web`, `sword-text-kjv`,
//! `sword-text-sparv`, installed by `scripts/setup.sh`):
//! - English: World English Bible ([`WEB_MODULE`]) and King James Version ([`KJV_MODULE`]);
//! - Spanish: Reina-Valera 1909 ([`SPANISH_MODULE`]), the target side of every pair.
//!
//! `diatheke` is run once per (module, book) with the whole book as key; its raw OSIS output is
//! parsed line by line (`<Book name> <chapter>:<verse>: <markup>`) and cleaned by
//! [`clean_verse`]. Pairs are aligned by reference (book, chapter, verse) over the 66 books of
//! the Protestant canon (the WEB's deuterocanon has no Spanish side here).
//!
//! # Held-out splits (whole books)
//! - dev  = Esther + Galatians ([`DEV_BOOKS`]), about 1% of the verses;
//! - test = Daniel + Philippians ([`TEST_BOOKS`]), about 1.5% of the verses.
//!
//! Narrative and epistolary prose, one Old and one New Testament book each, none in a chapter
//! dropped for the versification problems described below (the length check drops Gal 4:23-24). Dev and test use the WEB as their only English side
//! ([`HELD_OUT_SOURCE`]: one source per Spanish reference). Training uses every other book twice,
//! once with each English source ([`TRAIN_SOURCES`]). A training pair is dropped when its English
//! or its Spanish side equals the English or Spanish side of any dev or test verse (compared
//! after lower-casing and removing punctuation, see [`overlap_key`]): formulaic verses such as
//! "The grace of our Lord Jesus Christ be with you all. Amen." recur across books.
//!
//! # Alignment problems of the modules, and what is done about them
//! - The RV1909 module keeps the Spanish verse division under KJV references. Where the two
//!   differ (Num 12-13, 29-30, 1 Sam 23-24, Job 38-41, Hos 11-12, Jonah 1-2, 2 Cor 13, ...) the
//!   Spanish module has empty verses and the neighbouring verses are merged or shifted by one or
//!   more verses. Every chapter in which one side of a pair has an empty verse where the other
//!   side has text is dropped for that pair; when the empty verses end their chapter, the next
//!   chapter is dropped too (that is where the shifted verses land). The same rule covers the
//!   verses the WEB leaves empty (Luke 17:36, Acts 8:37, Rom 16:25-27, ...).
//! - The RV1909 prints psalm superscriptions inside verse 1 ("Salmo de David. Jehová es mi
//!   pastor"), the WEB and KJV as a heading before it. The canonical heading is put back in
//!   front of the English verse 1 (diatheke repeats the last heading before every later verse of
//!   a whole-book key; only a heading that differs from the previous verse's is used).
//! - The RV1909 adds Paul's subscriptions after the last "Amén." of the epistles ("Fué escrita de
//!   Corinto á los Romanos ..."), which neither English text has: cut ([`strip_subscription`]).
//! - The RV1909 prints the first word of a chapter in capitals ("EN el principio", "Y ACONTECIÓ
//!   que"): re-cased ([`fix_drop_cap`]) using how the word is written elsewhere in the text.
//! - The RV1909 also merges, splits and shifts verses inside chapters without leaving any empty
//!   (1 Kgs 22:43-53, 1 Chr 21:15-30, Judg 14:18-20) and moves clauses across verse boundaries
//!   (1 Kgs 18:33-34): every remaining chapter is aligned by verse lengths (Gale & Church, 1993,
//!   with priors that make anything but 1-1 rare), and a verse the alignment does not pair with
//!   the verse of the same number is dropped ([`off_diagonal`]; it also catches textual
//!   variants such as the WEB's 1 John 5:7 without the Comma Johanneum). The length model is
//!   fixed per source ([`LengthModel::for_source`]), so dev and test do not depend on `--books`.
//! - Last, a pair whose character-length ratio is far from the usual is dropped
//!   ([`MAX_LENGTH_RATIO`]): the WEB's Rom 14:23 carries half of Rom 16:25, the RV1909's Deut
//!   18:17 is a third of the English.
//!
//! # Output (`--out`)
//! `train.en train.es dev.en dev.es test.en test.es`: one sentence per line, line-aligned.
//! `test-concat.tsv`: the long-input test set (the "concat" condition of Rosendahl et al.,
//! 2019): consecutive test verses of one chapter, in order, joined by a space into
//! non-overlapping groups of 2, 4 and 8 verses (`--concat-sizes`); a header line, then columns
//! `n_verses`, `ref` (e.g. `Dan 1:1-4`), `en`, `es`. `stats.json`: pairs and words per split,
//! held-out books, what was dropped and why, and (with `--tokenizer`, or after
//! `nmt-train tokenizer`) subword-length histograms per split: those come from the tokenizer
//! stage ([`crate::tokenizer::add_subword_stats`]), which reads the corpus, never the reverse.
//!
//! The output is deterministic: the same modules and arguments give byte-identical files.
//!
//! # Steps
//! [`run`] takes the verses through [`sword`] (diatheke and its output), [`osis`] (markup to
//! text), [`recase`] and [`texts`] (the fixes each module needs), [`align`](mod@align) and
//! [`splits`], and writes them with [`files`] and [`stats`]; [`canon`] holds the books and
//! references they all use. A submodule imports [`canon`], [`osis`] and the steps before it,
//! nothing later.
//!
//! [`WEB_MODULE`]: sword::WEB_MODULE
//! [`KJV_MODULE`]: sword::KJV_MODULE
//! [`SPANISH_MODULE`]: sword::SPANISH_MODULE
//! [`clean_verse`]: osis::clean_verse
//! [`DEV_BOOKS`]: splits::DEV_BOOKS
//! [`TEST_BOOKS`]: splits::TEST_BOOKS
//! [`HELD_OUT_SOURCE`]: splits::HELD_OUT_SOURCE
//! [`TRAIN_SOURCES`]: splits::TRAIN_SOURCES
//! [`overlap_key`]: splits::overlap_key
//! [`strip_subscription`]: texts::strip_subscription
//! [`fix_drop_cap`]: recase::fix_drop_cap
//! [`off_diagonal`]: align::off_diagonal
//! [`LengthModel::for_source`]: align::LengthModel::for_source
//! [`MAX_LENGTH_RATIO`]: align::MAX_LENGTH_RATIO

pub mod align;
pub mod canon;
pub mod catalogs;
pub mod files;
pub mod osis;
pub mod recase;
pub mod splits;
pub mod stats;
pub mod sword;
pub mod texts;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

use align::{align, AlignReport, LengthModel, Pair};
use canon::{book_index, BOOKS};
use splits::{
    build_splits, check_splits, concat_groups, ConcatExample, Splits, DEV_BOOKS, HELD_OUT_SOURCE,
    TEST_BOOKS, TRAIN_SOURCES,
};
use sword::{check_modules, extract_all, RawVerse, KJV_MODULE, SPANISH_MODULE, WEB_MODULE};
use texts::{english_texts, spanish_texts, ModuleTexts};

/// What the later stages read.
pub use files::{read_concat, read_origins, read_parallel, CATALOG_SPLITS, SPLITS};

/// Arguments of `nmt-train corpus`.
#[derive(clap::Args, Debug, Clone)]
pub struct CorpusArgs {
    /// Output directory: train/dev/test .en/.es files, test-concat.tsv and stats.json.
    #[arg(long, default_value = "data/corpus")]
    pub out: PathBuf,
    /// Only these training books (comma-separated OSIS ids, e.g. `Gen,Ruth,Mark`); the dev and
    /// test books are always extracted and always held out. Empty: all 66 books.
    #[arg(long, value_delimiter = ',', default_value = "")]
    pub books: Vec<String>,
    /// Group sizes, in consecutive verses, of the long-input test set (test-concat.tsv).
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    pub concat_sizes: Vec<usize>,
    /// A tokenizer.json: adds per-split histograms of lengths in subwords to stats.json. Read
    /// by the `nmt-train corpus` command, not by [`run`]: the histograms are the tokenizer
    /// stage's ([`crate::tokenizer::add_subword_stats`]).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The diatheke executable (from the Debian package `diatheke`).
    #[arg(long, default_value = "diatheke")]
    pub diatheke: PathBuf,
    /// diatheke processes run at once (0: one per CPU core).
    #[arg(long, default_value = "0")]
    pub jobs: usize,
    /// A pinned list of Debian packages (`train/data/debian-catalogs.tsv`): their Spanish
    /// gettext catalogs are added to the corpus (training pairs after the Bible's, held-out
    /// packages in `l10n-dev.*` and `l10n-test.*`, provenance in `*.origin` and `sources.tsv`).
    #[arg(long)]
    pub catalogs: Option<PathBuf>,
    /// Where the packages of `--catalogs` are downloaded and unpacked (kept between runs).
    #[arg(long, default_value = "data/debian-cache")]
    pub catalog_cache: PathBuf,
}

fn parse_books(names: &[String]) -> Result<Vec<usize>> {
    let mut books = BTreeSet::new();
    for n in names.iter().filter(|n| !n.trim().is_empty()) {
        let b = book_index(n)
            .with_context(|| format!("unknown book {n:?}: use OSIS ids ({})", BOOKS.join(",")))?;
        books.insert(b);
    }
    Ok(books.into_iter().collect())
}

/// The books of each split, as indices in [`BOOKS`].
struct Books {
    train: Vec<usize>,
    dev: Vec<usize>,
    test: Vec<usize>,
    /// Every book to extract, in canonical order.
    all: Vec<usize>,
}

/// Training books: those `--books` names, or all 66, less the dev and test books, which are
/// always extracted.
fn select_books(names: &[String]) -> Result<Books> {
    let dev_books: Vec<usize> = DEV_BOOKS.iter().map(|b| book_index(b).unwrap()).collect();
    let test_books: Vec<usize> = TEST_BOOKS.iter().map(|b| book_index(b).unwrap()).collect();
    let mut train_books = parse_books(names)?;
    if train_books.is_empty() {
        train_books = (0..BOOKS.len()).collect();
    }
    train_books.retain(|b| !dev_books.contains(b) && !test_books.contains(b));
    let books: Vec<usize> = train_books
        .iter()
        .chain(&dev_books)
        .chain(&test_books)
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    Ok(Books {
        train: train_books,
        dev: dev_books,
        test: test_books,
        all: books,
    })
}

/// The raw verses of every module in `books`.
fn extract_modules(
    diatheke: &Path,
    books: &[usize],
    jobs: usize,
) -> Result<BTreeMap<&'static str, Vec<RawVerse>>> {
    let modules = [WEB_MODULE, KJV_MODULE, SPANISH_MODULE];
    let raw = extract_all(diatheke, &modules, books, jobs)?;
    let mut by_module: BTreeMap<&str, Vec<RawVerse>> = BTreeMap::new();
    for (i, verses) in raw.into_iter().enumerate() {
        by_module
            .entry(modules[i / books.len()])
            .or_default()
            .extend(verses);
    }
    Ok(by_module)
}

/// Pairs of each English source, and what aligning it dropped.
type Aligned = (
    Vec<(&'static str, Vec<Pair>)>,
    BTreeMap<&'static str, AlignReport>,
);

/// Aligns each English source of [`TRAIN_SOURCES`], in that order, with the Spanish texts `es`.
fn align_sources(by_module: &BTreeMap<&str, Vec<RawVerse>>, es: &ModuleTexts) -> Aligned {
    let mut aligned: Vec<(&str, Vec<Pair>)> = Vec::new();
    let mut reports: BTreeMap<&str, AlignReport> = BTreeMap::new();
    for source in TRAIN_SOURCES {
        let en = english_texts(&by_module[source]);
        let (pairs, report) = align(&en, es, LengthModel::for_source(source));
        aligned.push((source, pairs));
        reports.insert(source, report);
    }
    (aligned, reports)
}

/// `nmt-train corpus`: extracts, cleans, aligns and splits the corpus, writes it to `--out`.
pub fn run(args: CorpusArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    check_modules(&args.diatheke)?;
    let books = select_books(&args.books)?;
    let by_module = extract_modules(&args.diatheke, &books.all, args.jobs)?;
    let es = spanish_texts(&by_module[SPANISH_MODULE]);
    let (aligned, reports) = align_sources(&by_module, &es);
    let splits = build_splits(&aligned, &books.dev, &books.test, HELD_OUT_SOURCE);
    check_splits(&splits, &books.dev, &books.test)?;
    let concat = concat_groups(&splits.test, &args.concat_sizes);
    let catalogs = match &args.catalogs {
        Some(pins) => Some(catalogs::run(pins, &args.catalog_cache)?),
        None => None,
    };

    files::write_corpus(&args.out, &splits, &concat, catalogs.as_ref())?;
    let mut stats = stats::corpus_stats(&books.train, &splits, &concat, &reports, &es);
    if let Some(c) = &catalogs {
        stats["catalogs"] = catalogs::stats(c);
        let sources = args.out.join("sources.tsv");
        fs::write(&sources, catalogs::sources_tsv(c))
            .with_context(|| format!("writing {}", sources.display()))?;
        print_catalog_summary(c);
    }
    let stats_path = args.out.join("stats.json");
    fs::write(&stats_path, serde_json::to_string_pretty(&stats)? + "\n")
        .with_context(|| format!("writing {}", stats_path.display()))?;

    print_summary(&args.out, &books, &splits, &concat, &reports, started);
    Ok(())
}

fn print_catalog_summary(c: &catalogs::CatalogSplits) {
    println!(
        "  catalogs: {} packages, {} training pairs, {} l10n-dev, {} l10n-test; {} duplicates, \
         {} held-out pairs dropped for repeating a training English; dropped entries {:?}",
        c.packages.len(),
        c.train.len(),
        c.dev.len(),
        c.test.len(),
        c.duplicates,
        c.held_out_seen_in_train,
        c.dropped
    );
}

fn print_summary(
    out: &Path,
    books: &Books,
    splits: &Splits,
    concat: &[ConcatExample],
    reports: &BTreeMap<&str, AlignReport>,
    started: Instant,
) {
    println!(
        "corpus: {} train pairs ({} books x {} sources), {} dev ({}), {} test ({}), {} concat groups",
        splits.train.len(),
        books.train.len(),
        TRAIN_SOURCES.len(),
        splits.dev.len(),
        DEV_BOOKS.join("+"),
        splits.test.len(),
        TEST_BOOKS.join("+"),
        concat.len()
    );
    for (source, r) in reports {
        println!(
            "  {source}: {} common refs; dropped {} with an empty side, {} in {} mismatched chapters, \
             {} off the length alignment, {} by length ratio",
            r.common,
            r.empty,
            r.disturbed,
            r.disturbed_chapters.len(),
            r.off_diagonal,
            r.length_ratio
        );
    }
    println!(
        "  {} training pairs dropped for repeating a held-out verse; wrote {} in {:.1}s",
        splits.dropped_overlap,
        out.display(),
        started.elapsed().as_secs_f64()
    );
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::splits::overlap_key;
    use super::*;

    fn small_args(out: &Path) -> CorpusArgs {
        CorpusArgs {
            out: out.to_path_buf(),
            books: vec!["Ruth".into(), "Jonah".into(), "Phlm".into(), "Dan".into()],
            concat_sizes: vec![2, 4, 8],
            tokenizer: None,
            diatheke: PathBuf::from("diatheke"),
            jobs: 0,
            catalogs: None,
            catalog_cache: PathBuf::from("data/debian-cache"),
        }
    }

    /// End to end on a small real corpus (needs diatheke and the modules: scripts/setup.sh).
    #[test]
    fn run_builds_a_small_real_corpus_deterministically() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        run(small_args(a.path()))
            .expect("nmt-train corpus (is diatheke installed? scripts/setup.sh)");
        run(small_args(b.path())).unwrap();
        for f in [
            "train.en",
            "train.es",
            "dev.en",
            "dev.es",
            "test.en",
            "test.es",
            "test-concat.tsv",
            "stats.json",
        ] {
            let x = fs::read(a.path().join(f)).unwrap();
            assert_eq!(
                x,
                fs::read(b.path().join(f)).unwrap(),
                "{f} differs between runs"
            );
            assert!(!x.is_empty(), "{f} is empty");
        }
        let train = read_parallel(a.path(), "train").unwrap();
        let dev = read_parallel(a.path(), "dev").unwrap();
        let test = read_parallel(a.path(), "test").unwrap();
        // Ruth (85 verses), Jonah (48; chapters 1-2 mismatch) and Philemon (25), twice each;
        // Daniel is a test book whatever --books says.
        assert!(
            (240..=270).contains(&train.len()),
            "{} training pairs",
            train.len()
        );
        assert!((300..=316).contains(&dev.len()), "{} dev pairs", dev.len());
        assert!(
            (440..=461).contains(&test.len()),
            "{} test pairs",
            test.len()
        );
        let held: HashSet<String> = dev
            .iter()
            .chain(&test)
            .flat_map(|(e, s)| [overlap_key(e), overlap_key(s)])
            .collect();
        assert!(train
            .iter()
            .all(|(e, s)| !held.contains(&overlap_key(e)) && !held.contains(&overlap_key(s))));
        assert!(train
            .iter()
            .chain(&dev)
            .chain(&test)
            .all(|(e, s)| !e.is_empty()
                && !s.is_empty()
                && !e.contains(['<', '>', '¶', '\t'])
                && !s.contains(['<', '>', '¶', '\t'])
                && e.trim() == e
                && !e.contains("  ")));
        assert_eq!(
            test.first().unwrap().1,
            "En el año tercero del reinado de Joacim rey de Judá, vino Nabucodonosor rey de \
             Babilonia á Jerusalem, y cercóla."
        );
        let stats: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(a.path().join("stats.json")).unwrap())
                .unwrap();
        assert_eq!(stats["splits"]["train"]["pairs"], train.len());
        assert_eq!(stats["held_out_books"]["test"][0], "Dan");
        let concat = read_concat(a.path()).unwrap();
        for n in [2, 4, 8] {
            assert!(concat.iter().any(|c| c.n_verses == n));
        }
        assert!(concat
            .iter()
            .all(|c| c.reference.starts_with("Dan ") || c.reference.starts_with("Phil ")));
    }
}
