//! Debian packages as a source of catalogs: the pinned list, `apt-get download` into a cache
//! (nothing is installed: the packages' files are unpacked into the cache, so the build does
//! not depend on, or change, what the machine has installed), and each package's license
//! from its `copyright` file.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, ensure, Context, Result};

/// Which split a package's pairs go to: whole packages are held out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Train,
    Dev,
    Test,
}

/// One line of the pinned list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub package: String,
    pub version: String,
    pub role: Role,
}

/// Reads the pinned list: `package<TAB>version<TAB>role`, a header line, `#` comments.
pub fn read_pins(path: &Path) -> Result<Vec<Pin>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut pins = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() || line.starts_with("package\t") {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        ensure!(
            cols.len() == 3,
            "{}:{}: expected package, version, role",
            path.display(),
            i + 1
        );
        let role = match cols[2] {
            "train" => Role::Train,
            "dev" => Role::Dev,
            "test" => Role::Test,
            r => bail!(
                "{}:{}: role {r:?} (train, dev or test)",
                path.display(),
                i + 1
            ),
        };
        pins.push(Pin {
            package: cols[0].into(),
            version: cols[1].into(),
            role,
        });
    }
    Ok(pins)
}

/// A package unpacked in the cache: where its catalogs are and the version actually used.
#[derive(Debug, Clone)]
pub struct Unpacked {
    pub pin: Pin,
    /// The pinned version, or the mirror's current one when the pinned one is gone (Debian's
    /// mirrors keep one version per suite; `stats.json` lists every such drift).
    pub version: String,
    pub root: PathBuf,
}

/// The .deb in `cache` for `package` at `version`, as `apt-get download` names it (the
/// epoch's colon is written `%3a`).
fn cached_deb(cache: &Path, package: &str, version: Option<&str>) -> Result<Option<PathBuf>> {
    let prefix = match version {
        Some(v) => format!("{package}_{}_", v.replace(':', "%3a")),
        None => format!("{package}_"),
    };
    let mut found: Vec<PathBuf> = fs::read_dir(cache)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with(&prefix) && n.ends_with(".deb") && n[prefix.len()..].contains('.')
            })
        })
        .collect();
    found.sort();
    Ok(found.pop())
}

/// Downloads `pin` into `cache` (pinned version first, then the current one).
fn download(cache: &Path, pin: &Pin) -> Result<PathBuf> {
    if let Some(deb) = cached_deb(cache, &pin.package, Some(&pin.version))? {
        return Ok(deb);
    }
    let pinned = format!("{}={}", pin.package, pin.version);
    for spec in [pinned.as_str(), pin.package.as_str()] {
        let out = Command::new("apt-get")
            .args(["download", "-q", spec])
            .current_dir(cache)
            .stdin(Stdio::null())
            .output()
            .context("running apt-get download")?;
        if out.status.success() {
            let version = (spec == pinned).then_some(pin.version.as_str());
            if let Some(deb) = cached_deb(cache, &pin.package, version)? {
                return Ok(deb);
            }
        }
    }
    bail!(
        "apt-get download {} failed (is the package index current? `apt-get update`)",
        pin.package
    )
}

/// [`download`], with the package index refreshed once if the mirror no longer has what the
/// index names (Debian replaces a package's file at each point release).
fn download_refreshing(cache: &Path, pin: &Pin) -> Result<PathBuf> {
    download(cache, pin).or_else(|first| {
        let refreshed = Command::new("apt-get")
            .args(["update", "-qq"])
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if refreshed {
            download(cache, pin)
        } else {
            Err(first)
        }
    })
}

/// The version in a .deb's file name.
fn deb_version(deb: &Path) -> String {
    let name = deb.file_name().unwrap_or_default().to_string_lossy();
    let v = name.split('_').nth(1).unwrap_or("");
    v.replace("%3a", ":")
}

/// Unpacks the Spanish catalogs and the copyright file of `deb` into `dir`.
fn unpack(deb: &Path, dir: &Path) -> Result<()> {
    fs::create_dir_all(dir)?;
    let mut dpkg = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(deb)
        .stdout(Stdio::piped())
        .spawn()
        .context("running dpkg-deb")?;
    let status = Command::new("tar")
        .args(["-x", "--wildcards", "-C"])
        .arg(dir)
        .args(["*/es/LC_MESSAGES/*.mo", "./usr/share/doc/*/copyright"])
        .stdin(dpkg.stdout.take().unwrap())
        .stderr(Stdio::null())
        .status()
        .context("running tar")?;
    ensure!(dpkg.wait()?.success(), "dpkg-deb {} failed", deb.display());
    // tar fails when one pattern matches nothing (a package whose copyright is a symlink into
    // another package's doc folder): what did match is unpacked all the same.
    let _ = status;
    Ok(())
}

/// Pinned packages fetched by one `apt-get download`: one call per package spends most of
/// its time starting apt (948 packages took ~90 min one by one, ~1 min in such batches).
const DOWNLOAD_BATCH: usize = 48;

/// Downloads the pinned versions not yet in `cache`, many per `apt-get` call. Best effort:
/// a batch fails whole when the mirror lacks one of its versions, and [`download_refreshing`]
/// then fetches that batch's packages one by one, with its fallbacks.
fn prefetch(cache: &Path, pins: &[Pin]) -> Result<()> {
    let mut missing = Vec::new();
    for pin in pins {
        if cached_deb(cache, &pin.package, Some(&pin.version))?.is_none() {
            missing.push(format!("{}={}", pin.package, pin.version));
        }
    }
    for batch in missing.chunks(DOWNLOAD_BATCH) {
        let _ = Command::new("apt-get")
            .args(["download", "-q"])
            .args(batch)
            .current_dir(cache)
            .stdin(Stdio::null())
            .output();
    }
    Ok(())
}

/// Downloads and unpacks every pinned package, with a progress bar.
pub fn fetch_all(pins: &[Pin], cache: &Path) -> Result<Vec<Unpacked>> {
    fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    prefetch(cache, pins)?;
    let bar = indicatif::ProgressBar::new(pins.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("  packages {bar:40} {pos}/{len} {msg} [{eta}]")
            .unwrap(),
    );
    let mut out = Vec::with_capacity(pins.len());
    for pin in pins {
        bar.set_message(pin.package.clone());
        let deb = download_refreshing(cache, pin)?;
        let version = deb_version(&deb);
        let root =
            cache
                .join("unpacked")
                .join(format!("{}_{}", pin.package, version.replace(':', "%3a")));
        if !root.join(".done").exists() {
            unpack(&deb, &root)?;
            fs::write(root.join(".done"), "")?;
        }
        out.push(Unpacked {
            pin: pin.clone(),
            version,
            root,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(out)
}

/// The Spanish catalogs of an unpacked package, in a stable order.
pub fn catalog_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "mo")
                && p.parent().is_some_and(|d| d.ends_with("es/LC_MESSAGES"))
            {
                found.push(p);
            }
        }
    }
    found.sort();
    found
}

/// The license of a package: the `License:` of the `Files: *` paragraph of a machine-readable
/// copyright file (DEP-5), else the first license its text names, else "see copyright".
pub fn license(root: &Path, package: &str) -> String {
    let path = root.join("usr/share/doc").join(package).join("copyright");
    let Ok(text) = fs::read_to_string(path) else {
        return "see copyright (not in the package)".into();
    };
    dep5_license(&text)
        .or_else(|| named_license(&text))
        .unwrap_or_else(|| "see copyright".into())
}

fn dep5_license(text: &str) -> Option<String> {
    let mut in_star = false;
    for line in text.lines() {
        if let Some(files) = line.strip_prefix("Files:") {
            in_star = files.trim() == "*";
        } else if in_star {
            if let Some(lic) = line.strip_prefix("License:") {
                return Some(lic.trim().to_string()).filter(|l| !l.is_empty());
            }
        }
    }
    None
}

fn named_license(text: &str) -> Option<String> {
    const NAMES: [(&str, &str); 8] = [
        ("GNU Lesser General Public License", "LGPL"),
        ("GNU Library General Public License", "LGPL"),
        ("GNU General Public License", "GPL"),
        ("GNU Affero General Public License", "AGPL"),
        ("Mozilla Public License", "MPL"),
        ("Apache License", "Apache"),
        ("BSD", "BSD"),
        ("MIT", "MIT"),
    ];
    NAMES
        .iter()
        .find(|(long, _)| text.contains(long))
        .map(|(_, short)| short.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_shipped_pins() {
        let pins =
            read_pins(&Path::new(env!("CARGO_MANIFEST_DIR")).join("data/debian-catalogs.tsv"))
                .unwrap();
        assert!(pins.len() > 500);
        assert!(pins
            .iter()
            .any(|p| p.package == "git" && p.role == Role::Test));
        assert!(pins.iter().any(|p| p.role == Role::Dev));
        let mut names: Vec<&str> = pins.iter().map(|p| p.package.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), pins.len(), "a package pinned twice");
    }

    #[test]
    fn licenses_from_copyright_files() {
        let dep5 = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n\
                    Files: debian/*\nLicense: GPL-2+\n\nFiles: *\nCopyright: 2020 X\nLicense: LGPL-2.1+\n";
        assert_eq!(dep5_license(dep5).as_deref(), Some("LGPL-2.1+"));
        assert_eq!(
            named_license("distributed under the GNU General Public License v2").as_deref(),
            Some("GPL")
        );
        assert_eq!(dep5_license("free text"), None);
    }

    #[test]
    fn versions_from_deb_names() {
        assert_eq!(
            deb_version(Path::new("/c/attr_1%3a2.5.1-4_amd64.deb")),
            "1:2.5.1-4"
        );
    }
}
