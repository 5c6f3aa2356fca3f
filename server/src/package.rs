//! Opening a model package: the manifest (validated, checksums checked) and the tokenizer,
//! cross-checked against each other before any graph is loaded.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use model_package::{files, special, Manifest};
use tokenizers::Tokenizer;

/// A package whose manifest and tokenizer have been read and checked.
pub struct ModelPackage {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub tokenizer: Tokenizer,
}

impl ModelPackage {
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        if !dir.is_dir() {
            bail!(
                "model package directory {} does not exist (set --model-dir or NMT_MODEL_DIR)",
                dir.display()
            );
        }
        let manifest = Manifest::load(dir)
            .with_context(|| format!("reading the model package manifest in {}", dir.display()))?;
        for file in [files::TOKENIZER, files::ENCODER, files::DECODER] {
            if !dir.join(file).is_file() {
                bail!("model package {} has no {file}", dir.display());
            }
        }
        let tokenizer_path = dir.join(files::TOKENIZER);
        let tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| anyhow::anyhow!("loading tokenizer {}: {e}", tokenizer_path.display()))?;
        check_tokenizer(&manifest, &tokenizer).with_context(|| {
            format!(
                "tokenizer {} does not match the manifest",
                tokenizer_path.display()
            )
        })?;
        Ok(ModelPackage {
            dir: dir.to_path_buf(),
            manifest,
            tokenizer,
        })
    }
}

/// The special tokens must have the manifest's ids, and every tokenizer id must be a row of
/// the model's vocabulary.
pub fn check_tokenizer(manifest: &Manifest, tokenizer: &Tokenizer) -> anyhow::Result<()> {
    for (field, token, id) in [
        ("pad_id", special::PAD_TOKEN, manifest.pad_id),
        ("bos_id", special::BOS_TOKEN, manifest.bos_id),
        ("eos_id", special::EOS_TOKEN, manifest.eos_id),
        ("unk_id", special::UNK_TOKEN, manifest.unk_id),
    ] {
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
#[derive(Clone)]
pub struct TextCodec {
    tokenizer: std::sync::Arc<Tokenizer>,
}

impl TextCodec {
    pub fn new(tokenizer: Tokenizer) -> Self {
        TextCodec {
            tokenizer: std::sync::Arc::new(tokenizer),
        }
    }

    /// Subword ids of `text`, EOS not included.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode_fast(text, false)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.tokenizer.decode(ids, true).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::testing::{manifest, tokenizer};

    #[test]
    fn codec_round_trips_known_words() {
        let codec = TextCodec::new(tokenizer());
        let ids = codec.encode("Hello  world").unwrap();
        assert_eq!(ids, vec![4, 5]);
        assert_eq!(codec.decode(&[1, 4, 5, 2]).unwrap(), "hello world");
        assert_eq!(codec.encode("zebra").unwrap(), vec![3]);
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
