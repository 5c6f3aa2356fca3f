//! A package's translations saved beside its hypotheses (`<out>/<label>/decoded.json`), to
//! be scored again without the package: other buckets, another baseline, a report that
//! gathers runs of several sessions (the position study keeps these files in the repo,
//! where the packages would be too large). `--package` takes the file in place of a
//! package directory.

use std::fs;
use std::path::Path;

use anyhow::{ensure, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::run::{Decoded, EvalSet};

/// Bumped when the saved fields change meaning.
const FORMAT: u32 = 1;
const FILE_NAME: &str = "decoded.json";

/// What a saved decoding was decoded from and how: scoring it for another set, or with
/// other decoding flags, would compare unlike things.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    format: u32,
    set: String,
    /// sha256 of the source sentences, one a line (after `--limit`).
    sources_sha256: String,
    length_ask: Option<String>,
    beyond_input_limit: bool,
    /// Decodings saved before `--no-placeholder-masking` existed were masked.
    #[serde(default = "masked")]
    placeholder_masking: bool,
}

fn masked() -> bool {
    true
}

/// The file, as read.
#[derive(Deserialize)]
struct SavedDecoding {
    provenance: Provenance,
    decoded: Decoded,
}

/// The file, as written: the same fields, borrowed.
#[derive(Serialize)]
struct SavingDecoding<'a> {
    provenance: &'a Provenance,
    decoded: &'a Decoded,
}

/// The provenance a decoding of `set` with these flags has, saved or expected.
pub fn provenance(
    set: &EvalSet,
    length_ask: Option<String>,
    beyond_input_limit: bool,
    placeholder_masking: bool,
) -> Provenance {
    let mut hasher = Sha256::new();
    for source in &set.data.sources {
        hasher.update(source.as_bytes());
        hasher.update(b"\n");
    }
    Provenance {
        format: FORMAT,
        set: set.name.clone(),
        sources_sha256: format!("{:x}", hasher.finalize()),
        length_ask,
        beyond_input_limit,
        placeholder_masking,
    }
}

/// Writes `decoded` to `dir/decoded.json`.
pub fn save(dir: &Path, decoded: &Decoded, provenance: &Provenance) -> Result<()> {
    let path = dir.join(FILE_NAME);
    let saved = SavingDecoding {
        provenance,
        decoded,
    };
    fs::write(&path, serde_json::to_vec(&saved)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// Reads a saved decoding of this set, made as `expected` says. Its long-input groups are
/// dropped when this run scores none, and must match when it does.
pub fn load(path: &Path, set: &EvalSet, expected: &Provenance) -> Result<Decoded> {
    let text = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let saved: SavedDecoding =
        serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))?;
    ensure!(
        saved.provenance == *expected,
        "{} was decoded otherwise: saved {:?}, this run {:?}",
        path.display(),
        saved.provenance,
        expected
    );
    let mut decoded = saved.decoded;
    match &set.concat {
        None => decoded.concat.clear(),
        Some(concat) => {
            let saved_groups: usize = decoded.concat.iter().map(|c| c.references.len()).sum();
            ensure!(
                saved_groups == concat.groups.len(),
                "{} holds {saved_groups} long-input groups, this run scores {} \
                 (--no-concat scores it without them)",
                path.display(),
                concat.groups.len()
            );
        }
    }
    Ok(decoded)
}

/// Whether `--package` names a saved decoding rather than a package directory.
pub fn is_saved(path: &Path) -> bool {
    path.is_file()
}
