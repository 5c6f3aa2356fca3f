//! Opening a model package: the manifest (validated, checksums checked) and the tokenizer,
//! cross-checked against each other before any graph is loaded.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use model_package::placeholders::{self, Span};
use model_package::{files, special, Manifest, ManifestError};
use tokenizers::Tokenizer;

use crate::ending::Closers;

/// A package whose manifest and tokenizer have been read and checked.
pub struct ModelPackage {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub tokenizer: Tokenizer,
    /// The manifest's `target_tokenizer`, which translations are decoded with, when the
    /// package has one (see [`TextCodec::with_target`]).
    pub target_tokenizer: Option<Tokenizer>,
}

impl ModelPackage {
    /// Every problem is one line naming the file at fault (`PATH: what is wrong`), since it
    /// is what an operator sees when the server refuses to start.
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        if !dir.is_dir() {
            bail!(
                "model package directory {} does not exist (set --model-dir or NMT_MODEL_DIR)",
                dir.display()
            );
        }
        let manifest = Manifest::load(dir).map_err(|e| manifest_error(dir, e))?;
        for file in [files::TOKENIZER, files::ENCODER, files::DECODER] {
            let path = dir.join(file);
            if !path.is_file() {
                bail!("{}: missing from the model package", path.display());
            }
        }
        let tokenizer = load_tokenizer(&manifest, &dir.join(files::TOKENIZER))?;
        let target_tokenizer = match &manifest.target_tokenizer {
            Some(file) => Some(load_tokenizer(&manifest, &dir.join(file))?),
            None => None,
        };
        Ok(ModelPackage {
            dir: dir.to_path_buf(),
            manifest,
            tokenizer,
            target_tokenizer,
        })
    }
}

/// A tokenizer of the package, read and checked against the manifest.
fn load_tokenizer(manifest: &Manifest, path: &Path) -> anyhow::Result<Tokenizer> {
    if !path.is_file() {
        bail!("{}: missing from the model package", path.display());
    }
    let tokenizer = Tokenizer::from_file(path).map_err(|e| {
        anyhow::anyhow!(
            "{}: not a tokenizer this server can read: {e}",
            path.display()
        )
    })?;
    check_tokenizer(manifest, &tokenizer)
        .with_context(|| format!("{}: does not match the manifest", path.display()))?;
    Ok(tokenizer)
}

/// `Manifest::load`'s error as one line that starts with the file at fault: the manifest, or
/// the file whose checksum it could not confirm.
fn manifest_error(dir: &Path, error: ManifestError) -> anyhow::Error {
    let manifest = dir.join(files::MANIFEST);
    match error {
        ManifestError::Io { path, source } if source.kind() == std::io::ErrorKind::NotFound => {
            if Path::new(&path) == manifest {
                anyhow::anyhow!("{path}: missing (is {} a model package?)", dir.display())
            } else {
                anyhow::anyhow!("{path}: missing, but {} lists it", manifest.display())
            }
        }
        ManifestError::Io { path, source } => anyhow::anyhow!("{path}: {source}"),
        ManifestError::Checksum {
            file,
            expected,
            actual,
        } => anyhow::anyhow!(
            "{}: sha256 {actual} does not match {expected} in {}: the file is damaged or not \
             the one the package was made with",
            dir.join(file).display(),
            manifest.display()
        ),
        ManifestError::Json(e) => {
            anyhow::anyhow!("{}: not a valid manifest: {e}", manifest.display())
        }
        other => anyhow::anyhow!("{}: {other}", manifest.display()),
    }
}

/// The special tokens must have the manifest's ids, and every tokenizer id must be a row of
/// the model's vocabulary. A decoder that starts from the pad token (`bos_id` = `pad_id`, as
/// Marian's do) needs no `<s>`.
pub fn check_tokenizer(manifest: &Manifest, tokenizer: &Tokenizer) -> anyhow::Result<()> {
    for (field, token, id) in [
        ("pad_id", special::PAD_TOKEN, manifest.pad_id),
        ("bos_id", special::BOS_TOKEN, manifest.bos_id),
        ("eos_id", special::EOS_TOKEN, manifest.eos_id),
        ("unk_id", special::UNK_TOKEN, manifest.unk_id),
    ] {
        if field == "bos_id" && manifest.bos_id == manifest.pad_id {
            continue;
        }
        match tokenizer.token_to_id(token) {
            Some(found) if found == id => {}
            Some(found) => {
                bail!("the tokenizer gives {token} id {found}, the manifest's {field} is {id}")
            }
            None => bail!("the tokenizer has no {token} token (the manifest's {field} is {id})"),
        }
    }
    let size = tokenizer.get_vocab_size(true);
    if size > manifest.config.vocab_size {
        bail!(
            "the tokenizer has {size} tokens but the model's vocab_size is {}",
            manifest.config.vocab_size
        );
    }
    Ok(())
}

/// Text <-> ids with the package's tokenizer, as the model was trained: no special tokens
/// added by the tokenizer (the server appends EOS itself), special tokens skipped on output.
///
/// User text never becomes a control token: `</s>` or `<pad>` in a request (HTML
/// strikethrough, XML, code, logs) is split into ordinary subwords like any other text,
/// rather than matched as the tokenizer's special tokens.
///
/// When the tokenizer has the placeholder sentinels (`model_package::placeholders`: models
/// trained on the localization catalogs), [`prepare`](Self::prepare) also takes a text's
/// leading and trailing whitespace off and masks its placeholders, numbers, URLs, e-mail
/// addresses and markup, and [`finish`](Self::finish) puts them back: they come out exactly
/// as they went in, whatever the model makes of them.
/// How byte-fallback pieces are written (`<0x41>`): what a text that spells one starts with.
const BYTE_PIECE_PREFIX: &str = "<0x";

#[derive(Clone)]
pub struct TextCodec {
    tokenizer: std::sync::Arc<Tokenizer>,
    /// What translations are decoded with when the target side has its own tokenizer.
    target: Option<std::sync::Arc<Tokenizer>>,
    /// Ids of the special tokens that only the server may put in a sequence (all but
    /// `<unk>`, which stands for text the vocabulary lacks).
    control: std::sync::Arc<[u32]>,
    unk: Option<u32>,
    masks: bool,
    /// The target vocabulary's sentence closers (rows that end as their sources do).
    closers: std::sync::Arc<Closers>,
}

/// A text ready for the model, and what its translation needs back.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Subword ids, EOS not included.
    pub ids: Vec<u32>,
    pub restore: Restore,
}

/// What [`TextCodec::finish`] puts back into a translation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restore {
    /// `spans[k]` is what sentinel `｟k｠` stands for.
    pub spans: Vec<Span>,
    pub leading: String,
    pub trailing: String,
}

impl TextCodec {
    pub fn new(mut tokenizer: Tokenizer) -> Self {
        // Not matched as added tokens before the model sees the text...
        tokenizer.set_encode_special_tokens(true);
        let unk = tokenizer.token_to_id(special::UNK_TOKEN);
        let control = tokenizer
            .get_added_tokens_decoder()
            .iter()
            .filter(|(&id, token)| token.special && Some(id) != unk)
            .map(|(&id, _)| id)
            .collect();
        let masks = placeholders::sentinels()
            .iter()
            .all(|s| tokenizer.token_to_id(s).is_some());
        TextCodec {
            unk,
            closers: std::sync::Arc::new(Closers::of(&tokenizer)),
            tokenizer: std::sync::Arc::new(tokenizer),
            target: None,
            control,
            masks,
        }
    }

    /// Decodes translations with `target` (a package's `target_tokenizer`) rather than the
    /// source tokenizer; `None` changes nothing.
    pub fn with_target(mut self, target: Option<Tokenizer>) -> Self {
        if let Some(target) = target {
            self.closers = std::sync::Arc::new(Closers::of(&target));
            self.target = Some(std::sync::Arc::new(target));
        }
        self
    }

    /// The sentence closers of the vocabulary translations are written in.
    pub fn closers(&self) -> &Closers {
        &self.closers
    }

    /// Turns masking off (or on, where the tokenizer has the sentinels): to measure what it
    /// is worth, or for a client that wants the model's own handling of placeholders.
    pub fn with_masking(mut self, on: bool) -> Self {
        self.masks &= on;
        self
    }

    /// Whether [`prepare`](Self::prepare) masks placeholders.
    pub fn masks_placeholders(&self) -> bool {
        self.masks
    }

    /// `text` as the model reads it: edges off and placeholders masked when the tokenizer
    /// has sentinels, then [`encode`](Self::encode).
    pub fn prepare(&self, text: &str) -> Result<Prepared, String> {
        if !self.masks {
            return Ok(Prepared {
                ids: self.encode(text)?,
                restore: Restore::default(),
            });
        }
        let core = text.trim();
        let start = text.len() - text.trim_start().len();
        let masked = placeholders::mask(core);
        Ok(Prepared {
            ids: self.encode(&masked.text)?,
            restore: Restore {
                spans: masked.spans,
                leading: text[..start].to_string(),
                trailing: text[start + core.len()..].to_string(),
            },
        })
    }

    /// The translation of a [`prepare`](Self::prepare)d text: decoded, its placeholders and
    /// edges put back. A placeholder the model left out is appended (before final
    /// punctuation) rather than lost; one it repeated is kept once.
    pub fn finish(&self, ids: &[u32], restore: &Restore) -> Result<String, String> {
        let decoded = self.decode(ids)?;
        if !self.masks {
            return Ok(decoded);
        }
        let unmasked = placeholders::unmask(decoded.trim(), &restore.spans);
        // The source's core had no edge whitespace: nor does its translation's.
        Ok(format!(
            "{}{}{}",
            restore.leading,
            unmasked.text.trim(),
            restore.trailing
        ))
    }

    /// Subword ids of `text`, EOS not included, and never a special token's.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let fast = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(|e| e.to_string())?;
        let spells_unk = text.contains(special::UNK_TOKEN);
        let spells_byte = text.contains(BYTE_PIECE_PREFIX);
        if !spells_unk && !spells_byte && !fast.get_ids().iter().any(|id| self.control.contains(id))
        {
            return Ok(fast.get_ids().to_vec());
        }
        // ...but a Unigram or BPE model whose vocabulary holds `</s>` or `<unk>` as a piece
        // still finds it in the text, and one with byte fallback finds its byte pieces
        // (`<0x41>` stands for the byte 0x41, not for the six characters): spell such pieces
        // out character by character. (`<unk>` stays the id of characters the vocabulary
        // lacks and a byte piece the id of a byte it lacks; only the written word is spelled.)
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| e.to_string())?;
        let mut ids = Vec::with_capacity(encoding.len() + 8);
        for (&id, &(start, end)) in encoding.get_ids().iter().zip(encoding.get_offsets()) {
            let span = text.get(start..end).unwrap_or_default();
            let written_unk = Some(id) == self.unk && span == special::UNK_TOKEN;
            let written_byte = span.starts_with(BYTE_PIECE_PREFIX)
                && self.tokenizer.id_to_token(id).as_deref() == Some(span);
            if !self.control.contains(&id) && !written_unk && !written_byte {
                ids.push(id);
                continue;
            }
            for ch in span.chars() {
                self.spell(ch, &mut ids);
            }
        }
        Ok(ids)
    }

    /// The id of `ch` as a piece of its own, else of its UTF-8 bytes (byte fallback), else
    /// `<unk>`; never a control token's.
    fn spell(&self, ch: char, ids: &mut Vec<u32>) {
        let piece = |token: &str| {
            self.tokenizer
                .token_to_id(token)
                .filter(|id| !self.control.contains(id))
        };
        if let Some(id) = piece(ch.encode_utf8(&mut [0; 4])) {
            ids.push(id);
            return;
        }
        let bytes: Option<Vec<u32>> = ch
            .encode_utf8(&mut [0; 4])
            .bytes()
            .map(|b| piece(&format!("<0x{b:02X}>")))
            .collect();
        match bytes {
            Some(bytes) => ids.extend(bytes),
            None => ids.extend(self.unk),
        }
    }

    /// A translation's text, by the target tokenizer when there is one.
    pub fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.target
            .as_ref()
            .unwrap_or(&self.tokenizer)
            .decode(ids, true)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{manifest, tokenizer};

    #[test]
    fn a_written_byte_piece_is_text_not_a_byte() {
        let codec = TextCodec::new(crate::testing::shipped_tokenizer());
        let byte_a = codec
            .tokenizer
            .token_to_id("<0x41>")
            .expect("byte fallback pieces");
        for text in ["<0x41>", "see <0x41> and <0x4G>", "x<0x41><0x42>y"] {
            let ids = codec.encode(text).unwrap();
            assert!(!ids.contains(&byte_a), "{text}: {ids:?}");
            assert_eq!(codec.decode(&ids).unwrap(), text, "{ids:?}");
        }
        // Byte fallback itself still works: a character the vocabulary lacks.
        let ids = codec.encode("Ω").unwrap();
        assert_eq!(codec.decode(&ids).unwrap(), "Ω");
    }

    #[test]
    fn codec_round_trips_known_words() {
        let codec = TextCodec::new(tokenizer());
        let ids = codec.encode("Hello  world").unwrap();
        assert_eq!(ids, vec![4, 5]);
        assert_eq!(codec.decode(&[1, 4, 5, 2]).unwrap(), "hello world");
        assert_eq!(codec.encode("zebra").unwrap(), vec![3]);
    }

    #[test]
    fn user_text_never_becomes_a_control_token() {
        let shipped = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../models/en-es-rel-ldpe/tokenizer.json"
        );
        let tokenizer = Tokenizer::from_file(shipped).unwrap();
        let codec = TextCodec::new(tokenizer.clone());
        for text in ["</s>", "<s>strike</s> <pad><unk>", "a</s>b", "<s>"] {
            let ids = codec.encode(text).unwrap();
            assert!(!ids.is_empty(), "{text}");
            for control in [special::PAD, special::BOS, special::EOS] {
                assert!(!ids.contains(&control), "{text}: {ids:?}");
            }
        }
        // The vocabulary holds `<unk>` as a piece too: the written word is spelled out, its
        // letters kept, not read as the unknown-text token.
        for text in ["<unk>", "a <unk> b"] {
            let ids = codec.encode(text).unwrap();
            assert!(ids.len() > 1, "{text}: {ids:?}");
            assert!(
                codec.decode(&ids).unwrap().contains("unk"),
                "{text}: {ids:?}"
            );
        }
        // Plain text tokenizes as the model was trained.
        let plain = "Jesus wept, and the <b>Lord</b> heard.";
        let trained = tokenizer.encode_fast(plain, false).unwrap();
        assert_eq!(codec.encode(plain).unwrap(), trained.get_ids());
    }

    /// A word-level tokenizer with the sentinels at ids 4.., as the catalog models have.
    fn sentinel_tokenizer() -> Tokenizer {
        let words = "delete files from folders borrar archivos de carpetas";
        let vocab: serde_json::Map<String, serde_json::Value> = special::TOKENS
            .iter()
            .map(|t| t.to_string())
            .chain(placeholders::sentinels())
            .chain(words.split_whitespace().map(str::to_string))
            .enumerate()
            .map(|(i, t)| (t, i.into()))
            .collect();
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
        });
        json.to_string().parse().unwrap()
    }

    #[test]
    fn placeholders_and_edges_come_back_as_they_went_in() {
        let codec = TextCodec::new(sentinel_tokenizer());
        assert!(codec.masks_placeholders());
        assert!(!TextCodec::new(tokenizer()).masks_placeholders());
        let source = "  delete %s files from 3 folders\n";
        let prepared = codec.prepare(source).unwrap();
        assert_eq!(
            prepared.ids,
            codec
                .encode("delete ｟0｠ files from ｟1｠ folders")
                .unwrap()
        );
        assert_eq!(prepared.restore.leading, "  ");
        assert_eq!(prepared.restore.trailing, "\n");
        let model_output = codec
            .encode("borrar ｟0｠ archivos de ｟1｠ carpetas")
            .unwrap();
        assert_eq!(
            codec.finish(&model_output, &prepared.restore).unwrap(),
            "  borrar %s archivos de 3 carpetas\n"
        );
        // A placeholder the model dropped is appended, not lost; a repeated one kept once.
        let dropped = codec.encode("borrar ｟0｠ archivos ｟0｠").unwrap();
        assert_eq!(
            codec.finish(&dropped, &prepared.restore).unwrap(),
            "  borrar %s archivos 3\n"
        );
        // Masking off: the text goes to the model as it is.
        let raw = codec.clone().with_masking(false);
        assert!(!raw.masks_placeholders());
        let prepared = raw.prepare("delete ｟0｠ files").unwrap();
        assert_eq!(prepared.restore, Restore::default());
    }

    #[test]
    fn a_decoder_that_starts_from_pad_needs_no_bos_token() {
        let mut m = manifest();
        m.bos_id = m.pad_id;
        check_tokenizer(&m, &tokenizer()).unwrap();
        m.bos_id = 5;
        let err = check_tokenizer(&m, &tokenizer()).unwrap_err().to_string();
        assert!(err.contains("the manifest's bos_id is 5"), "{err}");
    }

    #[test]
    fn translations_are_decoded_with_the_target_tokenizer() {
        let target = sentinel_tokenizer();
        let codec = TextCodec::new(tokenizer()).with_target(Some(target.clone()));
        let ids = [4, 5, 40];
        assert_eq!(
            codec.decode(&ids).unwrap(),
            target.decode(&ids, true).unwrap()
        );
        assert_ne!(
            codec.decode(&ids).unwrap(),
            TextCodec::new(tokenizer()).decode(&ids).unwrap()
        );
        // Encoding stays the source tokenizer's.
        assert_eq!(codec.encode("Hello  world").unwrap(), vec![4, 5]);
        let same = TextCodec::new(tokenizer()).with_target(None);
        assert_eq!(same.decode(&[4, 5]).unwrap(), "hello world");
    }

    #[test]
    fn tokenizer_must_agree_with_the_manifest() {
        check_tokenizer(&manifest(), &tokenizer()).unwrap();

        let mut m = manifest();
        m.eos_id = 5;
        let err = check_tokenizer(&m, &tokenizer()).unwrap_err().to_string();
        assert!(
            err.contains("</s> id 2, the manifest's eos_id is 5"),
            "{err}"
        );

        let mut m = manifest();
        m.config.vocab_size = 10;
        let err = check_tokenizer(&m, &tokenizer()).unwrap_err().to_string();
        assert!(
            err.contains("34 tokens but the model's vocab_size is 10"),
            "{err}"
        );
    }
}
