//! What every benchmark's report shares: how it is printed and written ([`Document`],
//! [`emit`]) and how it describes the run (command line, date, machine).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

/// A benchmark's report, as [`emit`] prints and writes it. The renderers are its report
/// module's `tables` and `markdown` functions, which stay free functions for their tests.
pub trait Document: serde::Serialize {
    /// The tables, as printed on stdout.
    const TABLES: fn(&Self) -> String;
    /// The Markdown document of `--out-md`: how the run was made, then the tables.
    const MARKDOWN: fn(&Self) -> String;
}

/// Prints a report's tables and writes its Markdown (`--out-md`) and JSON (`--out-json`)
/// where asked. The Markdown is only made when it is written.
pub fn emit<R: Document>(report: &R, out_md: Option<&Path>, out_json: Option<&Path>) -> Result<()> {
    println!("{}", R::TABLES(report));
    if let Some(path) = out_md {
        write(path, &R::MARKDOWN(report))?;
    }
    if let Some(path) = out_json {
        write(path, &(serde_json::to_string_pretty(report)? + "\n"))?;
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Joins arguments for display, single-quoting the ones a shell would split or expand.
pub fn shell_join<S: AsRef<str>>(args: &[S]) -> String {
    args.iter()
        .map(|a| {
            let a = a.as_ref();
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
            if plain {
                a.to_string()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Now, in UTC: `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_string(secs)
}

/// `secs` since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc_string(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `nproc`, or the parallelism the standard library sees when it is missing.
pub fn nproc() -> usize {
    std::process::Command::new("nproc")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(0, |n| n.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc_string(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_string(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_string(1_709_251_199), "2024-02-29 23:59:59 UTC");
        assert_eq!(utc_string(1_735_689_600), "2025-01-01 00:00:00 UTC");
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(
            shell_join(&["nmt-bench", "--modes", "a,b", "x y", "it's", ""]),
            r"nmt-bench --modes a,b 'x y' 'it'\''s' ''"
        );
    }
}
