//! Modern, human-translated English -> Spanish text: the Spanish gettext catalogs that Debian
//! packages ship (`nmt-train corpus --catalogs train/data/debian-catalogs.tsv`).
//!
//! Software strings are what a translation server is sent most (menus, messages, help text),
//! they carry the placeholders and markup that must survive translation, and they are where
//! length matters most (a button label must fit). Each catalog's msgids are the English
//! originals its program was written with; its msgstrs are the Spanish team's translations.
//!
//! # Steps
//! [`debian`] downloads the pinned packages into a cache and unpacks their Spanish catalogs
//! and copyright files; [`mo`] reads each catalog; [`pairs`] turns entries into pairs and
//! says why it drops the rest; [`build`] deduplicates and splits them.
//!
//! # Held-out packages
//! Whole packages are dev or test (the list's `role` column), as whole books are for the
//! Bible: their pairs are in no training file and so never reach the tokenizer either. Short
//! strings recur across packages ("Cancel", "File not found"); a held-out pair whose English
//! is also a training English is dropped from the held-out split (not from training): the
//! test then measures strings the model has not seen, and training keeps the common strings a
//! user sends most.

pub mod debian;
pub mod mo;
pub mod pairs;

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use debian::{Pin, Role, Unpacked};
use pairs::Drop;

/// A pair with where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogPair {
    pub en: String,
    pub es: String,
    pub package: String,
    /// The catalog's file name (`git.mo`).
    pub catalog: String,
}

impl CatalogPair {
    /// The provenance label written beside each pair (`{split}.origin`).
    pub fn origin(&self) -> String {
        format!("debian/{}/{}", self.package, self.catalog)
    }
}

/// One package's part in the corpus, for `stats.json` and `sources.tsv`.
#[derive(Debug, Clone, Serialize)]
pub struct PackageReport {
    pub package: String,
    pub pinned_version: String,
    pub version: String,
    pub role: Role,
    pub license: String,
    pub catalogs: usize,
    /// Catalogs that could not be read (not UTF-8, damaged), with why.
    pub unreadable: Vec<String>,
    /// Pairs its entries gave before deduplication.
    pub pairs: usize,
    /// Pairs it adds to its split after deduplication.
    pub unique_pairs: usize,
}

/// The catalog part of the corpus.
#[derive(Debug, Clone, Default)]
pub struct CatalogSplits {
    pub train: Vec<CatalogPair>,
    pub dev: Vec<CatalogPair>,
    pub test: Vec<CatalogPair>,
    pub packages: Vec<PackageReport>,
    pub dropped: BTreeMap<Drop, usize>,
    /// Pairs of a split already there (same English and Spanish) from an earlier package.
    pub duplicates: usize,
    /// Held-out pairs dropped because their English is a training English.
    pub held_out_seen_in_train: usize,
}

/// Every pair of the Spanish catalogs of one unpacked package, and its report.
fn package_pairs(
    unpacked: &Unpacked,
    dropped: &mut BTreeMap<Drop, usize>,
) -> (Vec<CatalogPair>, PackageReport) {
    let files = debian::catalog_files(&unpacked.root);
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let catalog = match fs::read(file)
            .map_err(anyhow::Error::from)
            .and_then(|b| mo::parse(&b))
        {
            Ok(c) => c,
            Err(e) => {
                unreadable.push(format!("{name}: {e:#}"));
                continue;
            }
        };
        for entry in &catalog.entries {
            for pair in pairs::entry_pairs(entry) {
                match pair {
                    Ok((en, es)) => out.push(CatalogPair {
                        en,
                        es,
                        package: unpacked.pin.package.clone(),
                        catalog: name.clone(),
                    }),
                    Err(why) => *dropped.entry(why).or_default() += 1,
                }
            }
        }
    }
    let report = PackageReport {
        package: unpacked.pin.package.clone(),
        pinned_version: unpacked.pin.version.clone(),
        version: unpacked.version.clone(),
        role: unpacked.pin.role,
        license: debian::license(&unpacked.root, &unpacked.pin.package),
        catalogs: files.len(),
        unreadable,
        pairs: out.len(),
        unique_pairs: 0,
    };
    (out, report)
}

/// Deduplicates per split and splits by package role; see the module doc for the held-out rule.
pub fn build(unpacked: &[Unpacked]) -> CatalogSplits {
    let mut splits = CatalogSplits::default();
    let mut seen: BTreeMap<Role, HashSet<(String, String)>> = BTreeMap::new();
    let mut by_role: BTreeMap<Role, Vec<CatalogPair>> = BTreeMap::new();
    for u in unpacked {
        let (pairs, mut report) = package_pairs(u, &mut splits.dropped);
        let seen = seen.entry(u.pin.role).or_default();
        let split = by_role.entry(u.pin.role).or_default();
        for p in pairs {
            if seen.insert((p.en.clone(), p.es.clone())) {
                report.unique_pairs += 1;
                split.push(p);
            } else {
                splits.duplicates += 1;
            }
        }
        splits.packages.push(report);
    }
    splits.train = by_role.remove(&Role::Train).unwrap_or_default();
    let train_en: HashSet<&str> = splits.train.iter().map(|p| p.en.as_str()).collect();
    let mut held_out = |role: Role| -> Vec<CatalogPair> {
        let mut pairs = by_role.remove(&role).unwrap_or_default();
        let before = pairs.len();
        pairs.retain(|p| !train_en.contains(p.en.as_str()));
        splits.held_out_seen_in_train += before - pairs.len();
        pairs
    };
    let dev = held_out(Role::Dev);
    let test = held_out(Role::Test);
    splits.dev = dev;
    splits.test = test;
    splits
}

/// Reads the pinned list, fetches the packages into `cache` and builds the splits.
pub fn run(pins_file: &Path, cache: &Path) -> Result<CatalogSplits> {
    let pins: Vec<Pin> = debian::read_pins(pins_file)?;
    println!(
        "catalogs: {} pinned packages from {}, cache {}",
        pins.len(),
        pins_file.display(),
        cache.display()
    );
    let unpacked = debian::fetch_all(&pins, cache)
        .with_context(|| format!("fetching the packages of {}", pins_file.display()))?;
    Ok(build(&unpacked))
}

/// `sources.tsv`: one line per package with its version, license, role and pairs.
pub fn sources_tsv(splits: &CatalogSplits) -> String {
    let mut out = String::from(
        "package\tversion\tpinned_version\trole\tlicense\tcatalogs\tpairs\tunique_pairs\n",
    );
    for p in &splits.packages {
        let role = serde_json::to_value(p.role).unwrap();
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            p.package,
            p.version,
            p.pinned_version,
            role.as_str().unwrap_or(""),
            p.license.replace(['\t', '\n'], " "),
            p.catalogs,
            p.pairs,
            p.unique_pairs
        ));
    }
    out
}

/// What `stats.json` says of the catalogs.
pub fn stats(splits: &CatalogSplits) -> serde_json::Value {
    let drift: Vec<_> = splits
        .packages
        .iter()
        .filter(|p| p.version != p.pinned_version)
        .map(|p| format!("{} {} (pinned {})", p.package, p.version, p.pinned_version))
        .collect();
    let held_out = |role: Role| -> Vec<&str> {
        splits
            .packages
            .iter()
            .filter(|p| p.role == role)
            .map(|p| p.package.as_str())
            .collect()
    };
    serde_json::json!({
        "packages": splits.packages.len(),
        "held_out_packages": {"dev": held_out(Role::Dev), "test": held_out(Role::Test)},
        "pairs": {"train": splits.train.len(), "dev": splits.dev.len(), "test": splits.test.len()},
        "dropped_entries": splits.dropped,
        "duplicates": splits.duplicates,
        "held_out_dropped_seen_in_train": splits.held_out_seen_in_train,
        "unreadable_catalogs": splits.packages.iter().flat_map(|p| p.unreadable.iter().map(move |u| format!("{}: {u}", p.package))).collect::<Vec<_>>(),
        "version_drift": drift,
        "sources": "sources.tsv",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_catalog(dir: &Path, package: &str, po: &str) -> Unpacked {
        let root = dir.join(package);
        let lc = root.join("usr/share/locale/es/LC_MESSAGES");
        fs::create_dir_all(&lc).unwrap();
        let src = dir.join(format!("{package}.po"));
        fs::write(&src, po).unwrap();
        let ok = std::process::Command::new("msgfmt")
            .arg("-o")
            .arg(lc.join(format!("{package}.mo")))
            .arg(&src)
            .status()
            .expect("msgfmt (scripts/setup.sh installs gettext)")
            .success();
        assert!(ok);
        Unpacked {
            pin: Pin {
                package: package.into(),
                version: "1".into(),
                role: if package.starts_with("held") {
                    Role::Test
                } else {
                    Role::Train
                },
            },
            version: "1".into(),
            root,
        }
    }

    const HEADER: &str = "msgid \"\"\nmsgstr \"Content-Type: text/plain; charset=UTF-8\\n\"\n\n";

    #[test]
    fn splits_by_package_without_leaking_held_out_text() {
        let dir = tempfile::tempdir().unwrap();
        let a = write_catalog(
            dir.path(),
            "alpha",
            &format!("{HEADER}msgid \"Cancel\"\nmsgstr \"Cancelar\"\n\nmsgid \"Open %s\"\nmsgstr \"Abrir %s\"\n"),
        );
        let b = write_catalog(
            dir.path(),
            "beta",
            &format!(
                "{HEADER}msgid \"Cancel\"\nmsgstr \"Cancelar\"\n\nmsgid \"OK\"\nmsgstr \"OK\"\n"
            ),
        );
        let held = write_catalog(
            dir.path(),
            "held",
            &format!("{HEADER}msgid \"Cancel\"\nmsgstr \"Anular\"\n\nmsgid \"Delete %d files\"\nmsgstr \"Eliminar %d archivos\"\n"),
        );
        let splits = build(&[a, b, held]);
        let en: Vec<&str> = splits.train.iter().map(|p| p.en.as_str()).collect();
        assert_eq!(en, ["Cancel", "Open %s"]);
        assert_eq!(splits.duplicates, 1);
        assert_eq!(splits.dropped[&Drop::SameAsOriginal], 1);
        assert_eq!(splits.test.len(), 1, "Cancel is a training English");
        assert_eq!(splits.test[0].es, "Eliminar %d archivos");
        assert_eq!(splits.test[0].origin(), "debian/held/held.mo");
        assert_eq!(splits.held_out_seen_in_train, 1);
        assert_eq!(splits.packages[1].unique_pairs, 0);
        let tsv = sources_tsv(&splits);
        assert!(tsv
            .lines()
            .nth(3)
            .unwrap()
            .starts_with("held\t1\t1\ttest\t"));
    }

    /// The real thing on one small package (`hello`, GPL-3+): needs Debian's package mirror.
    #[test]
    fn fetches_a_real_package() {
        let cache = tempfile::tempdir().unwrap();
        let pins = vec![Pin {
            package: "hello".into(),
            version: "0-not-a-version".into(),
            role: Role::Train,
        }];
        let unpacked = debian::fetch_all(&pins, cache.path()).expect("apt-get download hello");
        assert_ne!(
            unpacked[0].version, "0-not-a-version",
            "falls back to the mirror's"
        );
        let splits = build(&unpacked);
        assert!(splits.train.len() > 5, "{} pairs", splits.train.len());
        assert!(splits.packages[0].license.contains("GPL"));
        assert!(splits.train.iter().all(|p| p.catalog == "hello.mo"));
    }
}
