//! The shared source/target subword vocabulary (`nmt-train tokenizer --corpus data/corpus
//! --vocab-size 12000 --out data/tokenizer.json`).
//!
//! A SentencePiece-style Unigram model trained with the `tokenizers` crate on `train.en` and
//! `train.es` together, saved as a Hugging Face `tokenizer.json`
//! (`tokenizers::Tokenizer::from_file` loads it; the server does). It is built for software
//! strings as much as for prose, so that `decode(encode(s)) == s` for any text:
//! - normalizer: NFC only. Nothing a translator would have to undo: no compatibility folding
//!   (NFKC turned `…` into `...` and `²` into `2`), no whitespace collapsing (a catalog's
//!   newlines, tabs and double spaces are part of the string);
//! - normalizer: then `▁` prepended to the whole text (see [`normalizer`]);
//! - pre-tokenizer: newlines, tabs, carriage returns, every digit and every sentinel split off
//!   as pieces of their own (numbers are copied digit by digit instead of as pieces the model
//!   must have seen), then Metaspace (`▁` for spaces);
//! - model: Unigram with byte fallback: the 256 pieces `<0x00>`..`<0xFF>` (at the end of the
//!   vocabulary) spell out any character the vocabulary lacks, so no input becomes `<unk>`.
//!   Digits, ASCII punctuation and symbols (the placeholder syntax: `%`, `{`, `$`, `<`, `&`,
//!   ...), newline and tab are always pieces ([`ALPHABET`]); characters rarer than
//!   [`MIN_CHAR_COUNT`] in the training text are left to byte fallback rather than each taking
//!   a vocabulary slot;
//! - decoder: ByteFallback, `▁` back to spaces, the pieces fused, the prepended space cut.
//!
//! Ids 0..3 are the special tokens of [`model_package::special::TOKENS`] (`<pad>`, `<s>`, `</s>`,
//! `<unk>`), in that order; [`train_tokenizer`] checks it. They are registered as special added
//! tokens: `decode(ids, true)` skips them, and their literal text in an input (`</s>`) is read
//! as the special token. Ids 4.. are the placeholder sentinels `｟0｠`, `｟1｠`, ...
//! ([`model_package::placeholders`]): pieces of the vocabulary that the pre-tokenizer keeps
//! whole, so each is one id wherever it stands, and decoding writes it back.
//!
//! **Encoding for the model** is `encode(text, false)` (no special tokens; [`encode_ids`]): no
//! post-processor is configured, and the model code appends `</s>` (and prepends `<s>` on the
//! decoder side) itself.
//!
//! `--vocab-size` is the whole vocabulary: special tokens, sentinels, byte pieces and learnt
//! pieces.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Context, Result};
use model_package::placeholders;
use model_package::special;
use serde_json::json;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::unigram::{Unigram, UnigramTrainer};
use tokenizers::models::{ModelWrapper, TrainerWrapper};
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::normalizers::utils::Sequence as NormalizerSequence;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// Byte-fallback pieces at the end of the vocabulary.
pub const BYTE_PIECES: usize = 256;
/// The Metaspace replacement character.
pub const METASPACE: char = '▁';
/// Characters that are pieces whatever the training text holds: digits, ASCII punctuation
/// and symbols (the syntax of placeholders, markup, paths and URLs), newline and tab.
pub const ALPHABET: &str = "0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~\n\t";
/// Characters seen fewer times than this in the training text are not given a piece of
/// their own (byte fallback spells them): the catalogs hold thousands of rare characters
/// (keyboard layouts, character maps) that would otherwise each take a vocabulary slot.
pub const MIN_CHAR_COUNT: usize = 20;
/// Upper bounds of the subword-length histogram buckets; the last bucket is open.
pub const LENGTH_BUCKETS: [(usize, usize); 7] = [
    (1, 10),
    (11, 20),
    (21, 30),
    (31, 40),
    (41, 60),
    (61, 80),
    (81, usize::MAX),
];

/// Arguments of `nmt-train tokenizer`.
#[derive(clap::Args, Debug, Clone)]
pub struct TokenizerArgs {
    /// Corpus directory written by `nmt-train corpus`: trains on train.en + train.es, checks the
    /// round trip on test.en + test.es, adds subword statistics to its stats.json.
    #[arg(long, default_value = "data/corpus")]
    pub corpus: PathBuf,
    /// Size of the whole vocabulary: 4 special tokens, 256 byte-fallback pieces, learnt pieces.
    #[arg(long, default_value = "12000")]
    pub vocab_size: usize,
    /// Where to write the tokenizer (Hugging Face tokenizer.json); statistics go next to it,
    /// in `<name>-stats.json`.
    #[arg(long, default_value = "data/tokenizer.json")]
    pub out: PathBuf,
}

fn tk_err(
    context: &str,
) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> anyhow::Error + '_ {
    move |e| anyhow!("{context}: {e}")
}

/// Spaces to `▁` and split; prepends nothing: the normalizer already put the one `▁` in
/// front of the text (Metaspace's own "first" scheme also prepends to a piece split off at
/// the text's start, such as a leading newline, and that space would be decoded).
fn metaspace() -> Metaspace {
    Metaspace::new(METASPACE, PrependScheme::Never, true)
}

/// NFC, then `▁` in front of the whole text. The Metaspace decoder drops one leading `▁`;
/// prepending it here, before the text's own leading spaces become `▁`s, makes that the one
/// dropped, so leading spaces come back (Metaspace alone prepends only to a text that does
/// not already start with a space, and the decoder then eats one of the text's own).
fn normalizer() -> NormalizerWrapper {
    NormalizerWrapper::Sequence(NormalizerSequence::new(vec![
        NormalizerWrapper::NFC(NFC),
        NormalizerWrapper::Prepend(Prepend::new(METASPACE.to_string())),
    ]))
}

fn pre_tokenizer() -> Result<PreTokenizerWrapper> {
    // One regex, so that a sentinel's digits stay inside it while every other digit stands
    // alone (a Digits pre-tokenizer would cut `｟12｠` apart).
    let isolated = Split::new(
        SplitPattern::Regex(format!(
            "{}[0-9]+{}|[0-9]|[\n\r\t]",
            placeholders::OPEN,
            placeholders::CLOSE
        )),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(tk_err("isolating pre-tokenizer"))?;
    Ok(PreTokenizerWrapper::Sequence(PreTokenizerSequence::new(
        vec![
            PreTokenizerWrapper::Split(isolated),
            PreTokenizerWrapper::Metaspace(metaspace()),
        ],
    )))
}

/// Pieces back to text: bytes, `▁` to spaces, one string, then the one `▁` the normalizer
/// prepended dropped (the Metaspace decoder would drop every `▁` of the first piece, and so
/// the leading spaces of a text).
fn decoder() -> Result<DecoderWrapper> {
    let spaces = Replace::new(METASPACE.to_string(), " ").map_err(tk_err("space decoder"))?;
    Ok(DecoderWrapper::Sequence(DecoderSequence::new(vec![
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Replace(spaces),
        DecoderWrapper::Fuse(Fuse::new()),
        DecoderWrapper::Strip(Strip::new(' ', 1, 0)),
    ])))
}

fn special_added_tokens() -> Vec<AddedToken> {
    special::TOKENS
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect()
}

/// The sentinels, reserved in the vocabulary (ids 4..) so the trainer neither learns nor
/// drops them. They are vocabulary pieces, not added tokens: an added token is cut out of the
/// raw input before normalization, and each stretch between two of them would get its own
/// prepended `▁`; the pre-tokenizer isolates them instead.
fn sentinel_tokens() -> Vec<AddedToken> {
    placeholders::sentinels()
        .into_iter()
        .map(|t| AddedToken::from(t, false))
        .collect()
}

/// The texts the vocabulary is learnt from: `texts` with characters rarer than
/// [`MIN_CHAR_COUNT`] (and not in [`ALPHABET`]) removed.
fn without_rare_chars(texts: &[String]) -> Vec<String> {
    let mut counts: std::collections::HashMap<char, usize> = std::collections::HashMap::new();
    for t in texts {
        for c in t.chars() {
            *counts.entry(c).or_default() += 1;
        }
    }
    let rare = |c: &char| counts[c] < MIN_CHAR_COUNT && !ALPHABET.contains(*c);
    texts
        .iter()
        .map(|t| {
            if t.chars().any(|c| rare(&c)) {
                t.chars().filter(|c| !rare(c)).collect()
            } else {
                t.clone()
            }
        })
        .collect()
}

/// Trains the shared Unigram tokenizer on `texts` (source and target sentences together).
/// `vocab_size` counts everything: special tokens, byte pieces and learnt pieces. The same
/// texts give the same tokenizer (see the comment on score rounding below).
pub fn train_tokenizer(texts: &[String], vocab_size: usize) -> Result<Tokenizer> {
    let reserved = special::TOKENS.len() + placeholders::MAX_SENTINELS;
    let learnt = vocab_size
        .checked_sub(BYTE_PIECES)
        .filter(|n| *n > reserved)
        .with_context(|| {
            format!("vocab size {vocab_size} leaves no room beside {BYTE_PIECES} byte pieces")
        })?;
    let unigram_trainer = UnigramTrainer::builder()
        .show_progress(false)
        .vocab_size(learnt as u32)
        .special_tokens(
            special_added_tokens()
                .into_iter()
                .chain(sentinel_tokens())
                .collect(),
        )
        .initial_alphabet(ALPHABET.chars().collect())
        .unk_token(Some(special::UNK_TOKEN.to_string()))
        .build()
        .map_err(|e| anyhow!("unigram trainer: {e}"))?;
    let mut trainer = TrainerWrapper::UnigramTrainer(unigram_trainer);
    let mut tokenizer = Tokenizer::new(ModelWrapper::Unigram(Unigram::default()));
    tokenizer.with_normalizer(Some(normalizer()));
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer()?));
    tokenizer
        .train(&mut trainer, without_rare_chars(texts).iter())
        .map_err(tk_err("training the tokenizer"))?;
    let ModelWrapper::Unigram(trained) = tokenizer.get_model() else {
        bail!("trained model is not a Unigram");
    };

    // Rebuild the model: specials and sentinels first (checked), learnt pieces in a stable
    // order, byte pieces.
    let mut vocab: Vec<(String, f64)> = trained.iter().cloned().collect();
    let reserved_tokens: Vec<String> = special::TOKENS
        .iter()
        .map(|t| t.to_string())
        .chain(placeholders::sentinels())
        .collect();
    for (id, tok) in reserved_tokens.iter().enumerate() {
        ensure!(
            vocab.get(id).map(|p| p.0.as_str()) == Some(tok.as_str()),
            "trained vocabulary has {:?} at id {id}, expected {tok}",
            vocab.get(id).map(|p| &p.0)
        );
    }
    // The trainer is not deterministic to the last bits: its hash maps are randomly seeded, so
    // EM sums come in a different order (scores differ by ~1e-11) and the characters it never
    // picked get `min + k * 1e-4` in hash order. Make the file reproducible: those characters
    // share the minimum, scores are rounded to 1e-4 (far below what changes a segmentation),
    // and pieces are ordered by score rounded to 1e-3, then by text.
    let n_special = reserved_tokens.len();
    let min_score = vocab[n_special..]
        .iter()
        .map(|p| p.1)
        .fold(f64::INFINITY, f64::min);
    for p in &mut vocab[n_special..] {
        if p.0.chars().count() == 1 && p.1 < min_score + 0.01 {
            p.1 = min_score;
        }
        p.1 = (p.1 * 1e4).round() / 1e4;
    }
    let order_key = |score: f64| -(score * 1e3).round() as i64;
    vocab[n_special..].sort_by(|a, b| {
        order_key(a.1)
            .cmp(&order_key(b.1))
            .then_with(|| a.0.cmp(&b.0))
    });
    let min_score = vocab[n_special..].iter().map(|p| p.1).fold(0.0, f64::min);
    for byte in 0..=255u8 {
        let piece = format!("<0x{byte:02X}>");
        ensure!(
            !vocab.iter().any(|p| p.0 == piece),
            "learnt piece {piece} clashes with a byte piece"
        );
        // Far below every learnt piece: only used for characters the vocabulary lacks.
        vocab.push((piece, min_score - 10.0));
    }
    let model = Unigram::from(vocab, Some(special::UNK as usize), true)
        .map_err(tk_err("building the unigram model"))?;
    let mut tokenizer = Tokenizer::new(ModelWrapper::Unigram(model));
    tokenizer.with_normalizer(Some(normalizer()));
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer()?));
    tokenizer.with_decoder(Some(decoder()?));
    tokenizer.add_special_tokens(&special_added_tokens());
    check_special_tokens(&tokenizer)?;
    Ok(tokenizer)
}

/// Checks that ids 0..3 are `<pad> <s> </s> <unk>` and that they are special added tokens.
pub fn check_special_tokens(tokenizer: &Tokenizer) -> Result<()> {
    for (id, tok) in special::TOKENS.iter().enumerate() {
        ensure!(
            tokenizer.token_to_id(tok) == Some(id as u32),
            "special token {tok} has id {:?}, expected {id}",
            tokenizer.token_to_id(tok)
        );
        ensure!(
            tokenizer.id_to_token(id as u32).as_deref() == Some(*tok),
            "id {id} is {:?}, expected {tok}",
            tokenizer.id_to_token(id as u32)
        );
    }
    let decoded = tokenizer
        .decode(&[special::BOS, special::EOS, special::PAD], true)
        .map_err(tk_err("decoding special tokens"))?;
    ensure!(
        decoded.is_empty(),
        "special tokens are not skipped when decoding: {decoded:?}"
    );
    Ok(())
}

/// Loads a tokenizer.json written by [`run`] and checks its special tokens.
pub fn load(path: &Path) -> Result<Tokenizer> {
    let tokenizer = Tokenizer::from_file(path)
        .map_err(|e| anyhow!("loading tokenizer {}: {e}", path.display()))?;
    check_special_tokens(&tokenizer).with_context(|| format!("tokenizer {}", path.display()))?;
    Ok(tokenizer)
}

/// Ids of `text` as the model consumes them: no special tokens (the model code adds `</s>`).
pub fn encode_ids(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    Ok(tokenizer
        .encode(text, false)
        .map_err(tk_err("encoding"))?
        .get_ids()
        .to_vec())
}

/// Text back from ids, special tokens skipped.
pub fn decode_ids(tokenizer: &Tokenizer, ids: &[u32]) -> Result<String> {
    tokenizer.decode(ids, true).map_err(tk_err("decoding"))
}

/// Result of [`round_trip`].
#[derive(Debug, Default, Clone)]
pub struct RoundTrip {
    pub texts: usize,
    /// (input, decoded output) of the texts that did not come back.
    pub failures: Vec<(String, String)>,
    /// `<unk>` ids produced (0 with byte fallback).
    pub unk: usize,
    /// Byte-fallback ids produced (characters the vocabulary lacks).
    pub byte_pieces: usize,
    pub pieces: usize,
}

/// Encodes and decodes every text; checks `decode(encode(x)) == x`.
pub fn round_trip<'a>(
    tokenizer: &Tokenizer,
    texts: impl IntoIterator<Item = &'a str>,
) -> Result<RoundTrip> {
    let first_byte = byte_piece_range(tokenizer);
    let mut r = RoundTrip::default();
    for text in texts {
        let ids = encode_ids(tokenizer, text)?;
        let back = decode_ids(tokenizer, &ids)?;
        let expected = text.to_string();
        r.texts += 1;
        r.pieces += ids.len();
        r.unk += ids.iter().filter(|&&i| i == special::UNK).count();
        if let Some(range) = &first_byte {
            r.byte_pieces += ids.iter().filter(|i| range.contains(i)).count();
        }
        if back != expected {
            r.failures.push((expected, back));
        }
    }
    Ok(r)
}

fn byte_piece_range(tokenizer: &Tokenizer) -> Option<std::ops::RangeInclusive<u32>> {
    let lo = tokenizer.token_to_id("<0x00>")?;
    let hi = tokenizer.token_to_id("<0xFF>")?;
    Some(lo..=hi)
}

/// Histogram of lengths over [`LENGTH_BUCKETS`] ("1-10", ..., "81+").
pub fn length_histogram(lengths: impl IntoIterator<Item = usize>) -> BTreeMap<String, usize> {
    let label = |(lo, hi): (usize, usize)| {
        if hi == usize::MAX {
            format!("{lo}+")
        } else {
            format!("{lo}-{hi}")
        }
    };
    // Zero-padded keys would sort; keep the natural labels and insert every bucket.
    let mut counts = vec![0usize; LENGTH_BUCKETS.len()];
    let mut zero = 0;
    for n in lengths {
        match LENGTH_BUCKETS
            .iter()
            .position(|&(lo, hi)| n >= lo && n <= hi)
        {
            Some(i) => counts[i] += 1,
            None => zero += 1,
        }
    }
    let mut out: BTreeMap<String, usize> = LENGTH_BUCKETS
        .iter()
        .map(|&b| label(b))
        .zip(counts)
        .collect();
    if zero > 0 {
        out.insert("0".into(), zero);
    }
    out
}

/// Subword statistics of a corpus directory: per split (and per size of the concatenated test
/// set), pieces per verse on each side and the histogram of lengths in subwords.
pub fn subword_stats(
    tokenizer: &Tokenizer,
    corpus: &Path,
    tokenizer_path: &Path,
) -> Result<serde_json::Value> {
    let side_stats = |texts: &[&str]| -> Result<serde_json::Value> {
        let lens: Vec<usize> = texts
            .iter()
            .map(|t| encode_ids(tokenizer, t).map(|ids| ids.len()))
            .collect::<Result<_>>()?;
        let total: usize = lens.iter().sum();
        Ok(json!({
            "pieces": total,
            "mean_pieces": (total as f64 / lens.len().max(1) as f64 * 100.0).round() / 100.0,
            "max_pieces": lens.iter().copied().max().unwrap_or(0),
            "histogram": length_histogram(lens),
        }))
    };
    let mut splits = serde_json::Map::new();
    for split in crate::corpus::SPLITS {
        let pairs = crate::corpus::read_parallel(corpus, split)?;
        let en: Vec<&str> = pairs.iter().map(|p| p.0.as_str()).collect();
        let es: Vec<&str> = pairs.iter().map(|p| p.1.as_str()).collect();
        splits.insert(
            split.to_string(),
            json!({"pairs": pairs.len(), "source": side_stats(&en)?, "target": side_stats(&es)?}),
        );
    }
    if corpus.join("test-concat.tsv").exists() {
        let concat = crate::corpus::read_concat(corpus)?;
        let mut sizes: Vec<usize> = concat.iter().map(|c| c.n_verses).collect();
        sizes.sort_unstable();
        sizes.dedup();
        for n in sizes {
            let group: Vec<_> = concat.iter().filter(|c| c.n_verses == n).collect();
            let en: Vec<&str> = group.iter().map(|c| c.en.as_str()).collect();
            let es: Vec<&str> = group.iter().map(|c| c.es.as_str()).collect();
            splits.insert(
                format!("test-concat-{n}"),
                json!({"pairs": group.len(), "source": side_stats(&en)?, "target": side_stats(&es)?}),
            );
        }
    }
    Ok(json!({
        "tokenizer": tokenizer_path.display().to_string(),
        "vocab_size": tokenizer.get_vocab_size(true),
        "splits": splits,
    }))
}

/// Adds the [`subword_stats`] of `corpus` under `tokenizer_path` to its `stats.json`, as
/// `subwords` (what `nmt-train corpus --tokenizer` does after building the corpus).
pub fn add_subword_stats(corpus: &Path, tokenizer_path: &Path) -> Result<()> {
    let tokenizer = load(tokenizer_path)?;
    let subwords = subword_stats(&tokenizer, corpus, tokenizer_path)?;
    write_into_corpus_stats(corpus, &subwords)
}

fn write_into_corpus_stats(corpus: &Path, subwords: &serde_json::Value) -> Result<()> {
    let corpus_stats = corpus.join("stats.json");
    let mut cs: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(&corpus_stats)
            .with_context(|| format!("reading {}", corpus_stats.display()))?,
    )
    .with_context(|| format!("parsing {}", corpus_stats.display()))?;
    cs["subwords"] = subwords.clone();
    fs::write(&corpus_stats, serde_json::to_string_pretty(&cs)? + "\n")
        .with_context(|| format!("writing {}", corpus_stats.display()))
}

fn stats_path(out: &Path) -> PathBuf {
    let stem = out
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("tokenizer");
    out.with_file_name(format!("{stem}-stats.json"))
}

/// How some words and placeholders are cut: what the model has to work with.
fn piece_examples(tokenizer: &Tokenizer) -> Result<BTreeMap<&'static str, Vec<String>>> {
    const EXAMPLES: [&str; 8] = [
        "repository",
        "Please save your changes before closing the window.",
        "Delete %s files from %d folders?",
        "Open {0} in ${HOME}/x",
        "<b>Bold</b> &amp; https://www.debian.org/",
        "On 2026-11-25 at 12:30",
        "_File\tCtrl+O\n",
        "Guardar los cambios antes de cerrar la ventana",
    ];
    EXAMPLES
        .iter()
        .map(|text| {
            let enc = tokenizer.encode(*text, false).map_err(tk_err("encoding"))?;
            Ok((*text, enc.get_tokens().to_vec()))
        })
        .collect()
}

/// `nmt-train tokenizer`: trains on the training split, saves, reloads, checks the special
/// tokens and the round trip on the whole test split, writes statistics.
pub fn run(args: TokenizerArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let train = crate::corpus::read_parallel(&args.corpus, "train")?;
    ensure!(
        !train.is_empty(),
        "{}: empty training split",
        args.corpus.display()
    );
    let texts: Vec<String> = train
        .iter()
        .map(|p| p.0.clone())
        .chain(train.iter().map(|p| p.1.clone()))
        .collect();
    println!(
        "tokenizer: training a {}-piece Unigram vocabulary on {} sentences",
        args.vocab_size,
        texts.len()
    );
    let tokenizer = train_tokenizer(&texts, args.vocab_size)?;
    let trained_in = started.elapsed();
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    tokenizer
        .save(&args.out, true)
        .map_err(|e| anyhow!("writing {}: {e}", args.out.display()))?;
    // Everything below uses the saved file, as the trainer and the server will.
    let tokenizer = load(&args.out)?;

    let mut test = crate::corpus::read_parallel(&args.corpus, "test")?;
    for split in crate::corpus::CATALOG_SPLITS {
        if args.corpus.join(format!("{split}.en")).exists() {
            test.extend(crate::corpus::read_parallel(&args.corpus, split)?);
        }
    }
    let test_texts: Vec<&str> = test
        .iter()
        .map(|p| p.0.as_str())
        .chain(test.iter().map(|p| p.1.as_str()))
        .collect();
    let rt = round_trip(&tokenizer, test_texts.iter().copied())?;

    let subwords = subword_stats(&tokenizer, &args.corpus, &args.out)?;
    let stats = json!({
        "vocab_size": tokenizer.get_vocab_size(true),
        "byte_pieces": BYTE_PIECES,
        "special_tokens": special::TOKENS,
        "pieces_of": piece_examples(&tokenizer)?,
        "round_trip_test": {
            "texts": rt.texts,
            "failures": rt.failures.len(),
            "unk_ids": rt.unk,
            "byte_fallback_ids": rt.byte_pieces,
        },
        "train_seconds": (trained_in.as_secs_f64() * 10.0).round() / 10.0,
        "subwords": subwords,
    });
    let path = stats_path(&args.out);
    fs::write(&path, serde_json::to_string_pretty(&stats)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    if args.corpus.join("stats.json").exists() {
        write_into_corpus_stats(&args.corpus, &stats["subwords"])?;
    }

    println!(
        "  vocabulary {} (ids 0..3 = {}), trained in {:.1}s, wrote {} and {}",
        tokenizer.get_vocab_size(true),
        special::TOKENS.join(" "),
        trained_in.as_secs_f64(),
        args.out.display(),
        path.display()
    );
    for split in crate::corpus::SPLITS {
        let s = &stats["subwords"]["splits"][split];
        println!(
            "  {split:5}: {:6} pairs, mean pieces per verse: source {:.2}, target {:.2}",
            s["pairs"],
            s["source"]["mean_pieces"].as_f64().unwrap_or(0.0),
            s["target"]["mean_pieces"].as_f64().unwrap_or(0.0)
        );
    }
    println!(
        "  round trip on the held-out splits: {}/{} texts identical, {} <unk>, {} byte-fallback ids",
        rt.texts - rt.failures.len(),
        rt.texts,
        rt.unk,
        rt.byte_pieces
    );
    if let Some((want, got)) = rt.failures.first() {
        bail!(
            "{} test texts do not survive decode(encode(x)); first: {want:?} came back as {got:?}",
            rt.failures.len()
        );
    }
    println!("  done in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::align::{align, LengthModel};
    use crate::corpus::canon::book_index;
    use crate::corpus::sword::{extract_book, SPANISH_MODULE, WEB_MODULE};
    use crate::corpus::texts::{english_texts, spanish_texts, ModuleTexts};

    /// Real verse pairs of some books, cleaned and aligned as the corpus does (needs diatheke and
    /// the modules: scripts/setup.sh).
    fn real_pairs(books: &[&str]) -> Vec<(String, String)> {
        let diatheke = Path::new("diatheke");
        let mut en = ModuleTexts::new();
        let mut es = ModuleTexts::new();
        for b in books {
            let book = book_index(b).unwrap();
            let web = extract_book(diatheke, WEB_MODULE, book)
                .expect("diatheke (install it with scripts/setup.sh)");
            en.extend(english_texts(&web));
            es.extend(spanish_texts(
                &extract_book(diatheke, SPANISH_MODULE, book).unwrap(),
            ));
        }
        align(&en, &es, LengthModel::for_source(WEB_MODULE))
            .0
            .into_iter()
            .map(|p| (p.en, p.es))
            .collect()
    }

    #[test]
    fn small_tokenizer_round_trips_held_out_verses() {
        // A few hundred verses to train on, Philemon held out.
        let train = real_pairs(&["Ruth", "Titus", "Jude"]);
        assert!(train.len() > 150, "{} training pairs", train.len());
        let texts: Vec<String> = train
            .iter()
            .flat_map(|(e, s)| [e.clone(), s.clone()])
            .collect();
        let vocab_size = BYTE_PIECES + 500;
        let tok = train_tokenizer(&texts, vocab_size).unwrap();
        assert_eq!(tok.get_vocab_size(true), vocab_size);
        check_special_tokens(&tok).unwrap();
        for (id, t) in special::TOKENS.iter().enumerate() {
            assert_eq!(tok.id_to_token(id as u32).as_deref(), Some(*t));
        }

        let held_out = real_pairs(&["Phlm"]);
        assert!(held_out.len() >= 20);
        let rt = round_trip(
            &tok,
            held_out.iter().flat_map(|(e, s)| [e.as_str(), s.as_str()]),
        )
        .unwrap();
        assert_eq!(rt.texts, 2 * held_out.len());
        assert!(rt.failures.is_empty(), "{:?}", rt.failures.first());
        assert_eq!(rt.unk, 0);

        // Characters never seen in training come out as bytes, not <unk>, and come back.
        let odd = "Ζεῦς — 日本 ☃ ñandú\tfin ";
        let ids = encode_ids(&tok, odd).unwrap();
        assert!(!ids.contains(&special::UNK));
        assert!(ids.iter().any(|&i| i >= (vocab_size - BYTE_PIECES) as u32));
        assert!(!ids.iter().any(|&i| i < special::TOKENS.len() as u32));
        assert_eq!(
            decode_ids(&tok, &ids).unwrap(),
            odd,
            "nothing is normalized away"
        );

        // Software strings come back exactly: newlines, tabs, double and edge spaces,
        // placeholders, compatibility characters.
        for s in [
            "  Two  spaces\n\tand a tab\n",
            "Delete %s files from %d folders? {0} ${HOME} <b>x</b> &amp; 2026-11-25",
            "…² ﬁ « »",
            "Abrir ｟0｠ en ｟1｠.",
        ] {
            let ids = encode_ids(&tok, s).unwrap();
            assert_eq!(decode_ids(&tok, &ids).unwrap(), s);
        }
        // Digits, the placeholder syntax, newline and tab are pieces even where the training
        // text (a few Bible books here) lacks them.
        let first_byte = (vocab_size - BYTE_PIECES) as u32;
        for c in ALPHABET.chars() {
            let ids = encode_ids(&tok, &format!("a{c}b")).unwrap();
            assert!(
                ids.iter().all(|&i| i < first_byte),
                "{c:?} is spelt in bytes"
            );
        }
        let ids = encode_ids(&tok, "｟0｠｟31｠").unwrap();
        assert_eq!(&ids[ids.len() - 2..], [4, 4 + 31], "sentinels are ids 4..");
        for s in [
            "｟0｠ at the start",
            "   three spaces",
            "\nnewline first",
            "end ｟2｠",
        ] {
            let ids = encode_ids(&tok, s).unwrap();
            assert_eq!(decode_ids(&tok, &ids).unwrap(), s);
        }

        // No special token is added by encoding; the saved file loads back the same.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        tok.save(&path, false).unwrap();
        let loaded = load(&path).unwrap();
        let verse = &held_out[0].0;
        assert_eq!(
            encode_ids(&loaded, verse).unwrap(),
            encode_ids(&tok, verse).unwrap()
        );
        assert_eq!(
            loaded.encode(verse.as_str(), true).unwrap().get_ids(),
            encode_ids(&tok, verse).unwrap()
        );

        // Training is reproducible.
        let again = train_tokenizer(&texts, vocab_size).unwrap();
        assert_eq!(
            again.to_string(false).unwrap(),
            tok.to_string(false).unwrap(),
            "two trainings on the same texts differ"
        );
    }

    #[test]
    fn vocab_size_must_leave_room() {
        let texts = vec!["a b".to_string()];
        assert!(train_tokenizer(&texts, BYTE_PIECES).is_err());
    }

    #[test]
    fn histogram_buckets() {
        let h = length_histogram([1, 10, 11, 35, 40, 41, 60, 61, 80, 81, 500]);
        let want: BTreeMap<String, usize> = [
            ("1-10", 2),
            ("11-20", 1),
            ("21-30", 0),
            ("31-40", 2),
            ("41-60", 2),
            ("61-80", 2),
            ("81+", 2),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(h, want);
        assert_eq!(length_histogram([0])["0"], 1);
    }

    #[test]
    fn stats_path_is_next_to_the_tokenizer() {
        assert_eq!(
            stats_path(Path::new("data/tokenizer.json")),
            Path::new("data/tokenizer-stats.json")
        );
        assert_eq!(
            stats_path(Path::new("tok.json")),
            Path::new("tok-stats.json")
        );
    }
}
