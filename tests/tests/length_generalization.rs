//! Length robustness survives export (issue 4, item 5). Two tiny models learn a synthetic
//! task on strings of 1-8 random symbols (sort them), one with absolute sinusoidal positions
//! (`transformer-tiny`) and one Rel-Transformer (`rel-transformer-tiny`: Shaw relative
//! self-attention, no absolute positions). Both are exported and served by one real
//! `nmt-server`; over HTTP the relative model must be clearly more accurate on 20-symbol
//! strings, which are longer than any it was trained on.
//!
//! Why sorting and not copying, and the figures of several data seeds:
//! docs/experiments/length-generalization.md. Print the table with
//! `cargo test -p e2e --test length_generalization -- --nocapture`; `LENGTH_GEN_SEED=n` draws
//! another data set (the assertions are meant for the default seed).

mod common;

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Instant;

use common::{post_translate, start_server_with_env, wait_until_ready};
use model_package::special;
use serde_json::{json, Value};

/// Symbols of the task, each one token of the tokenizer.
const SYMBOLS: usize = 32;
/// Training (and dev) strings have 1..=MAX_TRAIN_LEN symbols.
const MAX_TRAIN_LEN: usize = 8;
const TRAIN_PAIRS: usize = 10_000;
const DEV_PAIRS: usize = 200;
/// Symbols in the strings of the long test set.
const LONG_LEN: usize = 20;
/// The test sets: name, strings, their lengths (uniform). The first is in distribution, the
/// last is the one the assertions are about.
const TEST_SETS: [(&str, usize, RangeInclusive<usize>); 3] = [
    ("4-8", 100, 4..=MAX_TRAIN_LEN),
    ("12", 100, 12..=12),
    ("20", 100, LONG_LEN..=LONG_LEN),
];
/// Seed of the data (LENGTH_GEN_SEED overrides it).
const DATA_SEED: u64 = 1;
/// Seed of initialisation and batch order.
const TRAIN_SEED: u64 = 1;
const STEPS: usize = 1000;

/// SplitMix64: a few lines, and the data cannot change under a `rand` upgrade.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (the modulo bias is far below anything measured here).
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Symbol `i`: two lowercase letters, `aa`, `ab`, ...
fn symbol(i: usize) -> String {
    let letter = |k: usize| char::from(b'a' + k as u8);
    format!("{}{}", letter(i / 26), letter(i % 26))
}

/// A string of `len` distinct symbols, space-separated.
fn random_string(rng: &mut SplitMix64, len: usize) -> String {
    let mut pool: Vec<usize> = (0..SYMBOLS).collect();
    // Partial Fisher-Yates: the first `len` entries become a uniform draw without repetition.
    for i in 0..len {
        let j = i + rng.below(SYMBOLS - i);
        pool.swap(i, j);
    }
    pool[..len]
        .iter()
        .map(|&s| symbol(s))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The output the task wants for `source`: its symbols in vocabulary order (the order of
/// their names).
fn target(source: &str) -> String {
    let mut symbols: Vec<&str> = source.split_whitespace().collect();
    symbols.sort_unstable();
    symbols.join(" ")
}

/// Writes `{split}.en` and `{split}.es` (source and [`target`]) of `n` strings
/// whose lengths are uniform in `lens`; returns the source strings.
fn write_split(
    dir: &Path,
    split: &str,
    rng: &mut SplitMix64,
    (n, lens): (usize, RangeInclusive<usize>),
) -> Vec<String> {
    let (lo, hi) = (*lens.start(), *lens.end());
    let sources: Vec<String> = (0..n)
        .map(|_| {
            let len = lo + rng.below(hi - lo + 1);
            random_string(rng, len)
        })
        .collect();
    let text: String = sources.iter().map(|s| format!("{s}\n")).collect();
    std::fs::write(dir.join(format!("{split}.en")), &text).unwrap();
    let text: String = sources.iter().map(|s| format!("{}\n", target(s))).collect();
    std::fs::write(dir.join(format!("{split}.es")), &text).unwrap();
    sources
}

/// The corpus directory in the trainer's layout (`train.*`, `dev.*`), plus the test sets
/// (`test-<name>.*`); returns the sources of each test set.
fn write_corpus(dir: &Path, seed: u64) -> Vec<Vec<String>> {
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = SplitMix64(seed);
    write_split(dir, "train", &mut rng, (TRAIN_PAIRS, 1..=MAX_TRAIN_LEN));
    write_split(dir, "dev", &mut rng, (DEV_PAIRS, 1..=MAX_TRAIN_LEN));
    TEST_SETS
        .iter()
        .map(|(name, n, lens)| {
            write_split(dir, &format!("test-{name}"), &mut rng, (*n, lens.clone()))
        })
        .collect()
}

/// A WordLevel `tokenizer.json`: the special tokens at ids 0..3 (as `model_package::special`
/// wants), then one id per symbol; words are split on whitespace only; decoding joins the
/// pieces with spaces and skips the special tokens.
fn write_tokenizer(path: &Path) {
    let vocab: serde_json::Map<String, Value> = special::TOKENS
        .iter()
        .map(|t| t.to_string())
        .chain((0..SYMBOLS).map(symbol))
        .enumerate()
        .map(|(id, token)| (token, id.into()))
        .collect();
    let added: Vec<Value> = special::TOKENS
        .iter()
        .enumerate()
        .map(|(id, token)| {
            json!({"id": id, "content": token, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": special::UNK_TOKEN},
    });
    std::fs::write(path, serde_json::to_string_pretty(&tokenizer).unwrap()).unwrap();
}

/// The tokenizer as the trainer (nmt_train::tokenizer) and the server (`encode_fast`, no
/// special tokens; `decode` skipping them) use it: one id per symbol, and back.
fn check_tokenizer(path: &Path) {
    let tokenizer = nmt_train::tokenizer::load(path).unwrap();
    assert_eq!(
        tokenizer.get_vocab_size(true),
        special::TOKENS.len() + SYMBOLS
    );
    let (mid, last) = (SYMBOLS / 2, SYMBOLS - 1);
    let text = format!(
        "{} {}  {}\t{}",
        symbol(0),
        symbol(mid),
        symbol(last),
        symbol(1)
    );
    let ids = nmt_train::tokenizer::encode_ids(&tokenizer, &text).unwrap();
    let first = special::TOKENS.len() as u32;
    assert_eq!(
        ids,
        [first, first + mid as u32, first + last as u32, first + 1]
    );
    let server_ids = tokenizer
        .encode_fast(text.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(server_ids, ids);
    let mut with_specials = ids.clone();
    with_specials.push(special::EOS);
    with_specials.insert(0, special::BOS);
    assert_eq!(
        nmt_train::tokenizer::decode_ids(&tokenizer, &with_specials).unwrap(),
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    // An unknown word is one <unk>, not pieces.
    assert_eq!(
        nmt_train::tokenizer::encode_ids(&tokenizer, "aa zz").unwrap(),
        [first, special::UNK]
    );
}

struct Trained {
    preset: &'static str,
    package: PathBuf,
    seconds: f64,
    dev_loss: f64,
}

/// Trains `preset` on the corpus and exports it as the package `work/<preset>/package`,
/// named after the preset.
fn train_and_export(work: &Path, preset: &'static str) -> Trained {
    let dir = work.join(preset);
    let started = Instant::now();
    let report = nmt_train::train::train(&nmt_train::train::TrainArgs {
        corpus: work.join("corpus"),
        tokenizer: work.join("tokenizer.json"),
        preset: preset.to_string(),
        out: dir.join("run"),
        resume: false,
        batch_tokens: 512,
        lr: 5e-3,
        warmup_steps: 50,
        label_smoothing: 0.0,
        clip_norm: 1.0,
        dropout: None,
        max_steps: Some(STEPS),
        max_epochs: 1000,
        max_minutes: None,
        eval_every: STEPS,
        save_every: STEPS,
        snapshot_every: 0,
        keep_snapshots: 0,
        max_len: 64,
        train_limit: None,
        min_source_len: None,
        max_source_len: None,
        joined_fraction: 0.0,
        joined_max_verses: nmt_train::train::DEFAULT_JOINED_MAX_VERSES,
        init_from: None,
        mask_fraction: 0.0,
        dev_splits: vec!["dev".into()],
        dev_limit: DEV_PAIRS,
        oversample: Vec::new(),
        seed: TRAIN_SEED,
        quiet: true,
    })
    .unwrap();
    let seconds = started.elapsed().as_secs_f64();
    let package = dir.join("package");
    model_export::export_package(&model_export::ExportArgs {
        checkpoint: dir.join("run").join("best"),
        tokenizer: None,
        out: package.clone(),
        name: Some(preset.to_string()),
        source_language: "sym".into(),
        target_language: "sym".into(),
        max_source_tokens: None,
        max_target_tokens: 64,
        evaluation: None,
        domains: Vec::new(),
    })
    .unwrap();
    Trained {
        preset,
        package,
        seconds,
        dev_loss: report.state.best_dev_loss.unwrap(),
    }
}

/// Accuracy of outputs against what the task wants.
#[derive(Debug, Clone, Copy)]
struct Scores {
    /// Share of outputs equal to their target.
    exact: f64,
    /// Share of target symbols output at their position.
    per_position: f64,
    /// Mean number of symbols in an output.
    mean_len: f64,
}

fn score(sources: &[String], outputs: &[String]) -> Scores {
    assert_eq!(sources.len(), outputs.len());
    let (mut exact, mut correct, mut total, mut out_len) = (0, 0, 0, 0);
    for (source, output) in sources.iter().zip(outputs) {
        let want = target(source);
        let want: Vec<&str> = want.split_whitespace().collect();
        let got: Vec<&str> = output.split_whitespace().collect();
        exact += usize::from(want == got);
        correct += want.iter().zip(&got).filter(|(a, b)| a == b).count();
        total += want.len();
        out_len += got.len();
    }
    let n = sources.len() as f64;
    Scores {
        exact: exact as f64 / n,
        per_position: correct as f64 / total as f64,
        mean_len: out_len as f64 / n,
    }
}

/// Translations of `sources` by `model`, through `POST /translate`; checks that the server
/// tokenized every source into one piece per symbol.
async fn translate(
    client: &reqwest::Client,
    server: &common::ServerProcess,
    model: &str,
    sources: &[String],
) -> Vec<String> {
    let response = post_translate(client, server, &json!({"text": sources, "model": model})).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["model"], model);
    let translations = body["translations"].as_array().unwrap();
    assert_eq!(translations.len(), sources.len());
    sources
        .iter()
        .zip(translations)
        .map(|(source, t)| {
            let symbols = source.split_whitespace().count() as u64;
            assert_eq!(t["source_tokens"].as_u64(), Some(symbols), "{t}");
            t["text"].as_str().unwrap().to_string()
        })
        .collect()
}

#[test]
fn relative_positions_sort_longer_strings_than_absolute_ones_through_the_server() {
    let started = Instant::now();
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("length-generalization");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let seed = std::env::var("LENGTH_GEN_SEED")
        .map(|s| s.parse().expect("LENGTH_GEN_SEED: an integer"))
        .unwrap_or(DATA_SEED);
    let tests = write_corpus(&work.join("corpus"), seed);
    write_tokenizer(&work.join("tokenizer.json"));
    check_tokenizer(&work.join("tokenizer.json"));

    // The two trainings at once, one per core.
    let (absolute, relative) = std::thread::scope(|s| {
        let absolute = s.spawn(|| train_and_export(&work, "transformer-tiny"));
        let relative = s.spawn(|| train_and_export(&work, "rel-transformer-tiny"));
        (absolute.join().unwrap(), relative.join().unwrap())
    });
    let trained_in = started.elapsed().as_secs_f64();
    let models = [&absolute, &relative];

    // One server for both packages; a request picks its model by name.
    let server = start_server_with_env(
        &[&absolute.package, &relative.package],
        &["--max-texts-per-request", "100"],
        &[("RUST_LOG", "warn")],
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // scores[model][test set]
    let scores: Vec<Vec<Scores>> = runtime.block_on(async {
        let client = reqwest::Client::new();
        wait_until_ready(&client, &server).await;
        let mut scores = Vec::new();
        for m in models {
            let mut per_set = Vec::new();
            for sources in &tests {
                let outputs = translate(&client, &server, m.preset, sources).await;
                per_set.push(score(sources, &outputs));
            }
            let long = tests.last().unwrap();
            let output = translate(&client, &server, m.preset, &long[..1]).await;
            println!("{}: {}\n  -> {}", m.preset, long[0], output[0]);
            scores.push(per_set);
        }
        scores
    });
    drop(server);

    println!(
        "\nsorting strings of distinct symbols ({SYMBOLS} symbols, trained on 1-{MAX_TRAIN_LEN}, \
         data seed {seed}, {STEPS} steps), through nmt-server: exact match / per-position accuracy \
         / mean output length, by input length"
    );
    let mut header = "| model | train s | dev NLL |".to_string();
    for (name, ..) in &TEST_SETS {
        header += &format!(" {name}: exact | per-pos. | length |");
    }
    println!("{header}");
    println!("| --- |{}", " ---: |".repeat(2 + 3 * TEST_SETS.len()));
    for (m, per_set) in models.iter().zip(&scores) {
        let mut row = format!("| {} | {:.0} | {:.4} |", m.preset, m.seconds, m.dev_loss);
        for s in per_set {
            row += &format!(
                " {:.2} | {:.2} | {:.1} |",
                s.exact, s.per_position, s.mean_len
            );
        }
        println!("{row}");
    }
    println!(
        "trained and exported in {trained_in:.0} s, whole test {:.0} s",
        started.elapsed().as_secs_f64()
    );

    let (abs, rel) = (&scores[0], &scores[1]);
    for (name, s) in [("absolute", abs[0]), ("relative", rel[0])] {
        assert!(
            s.exact >= 0.95,
            "the {name} model did not learn the task at training lengths: {s:?}"
        );
    }
    let (abs_long, rel_long) = (*abs.last().unwrap(), *rel.last().unwrap());
    assert!(
        rel_long.exact >= abs_long.exact + 0.25
            && rel_long.per_position >= abs_long.per_position + 0.1,
        "on {LONG_LEN} symbols the relative model {rel_long:?} is not clearly better than the \
         absolute one {abs_long:?}"
    );
}
