//! What every format shares: the engine called in chunks of batches, each text with its own
//! character budget, the progress bar advanced as batches finish, and the counts the summary
//! line reports.

use std::io::{self, IsTerminal};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nmt_engine::length::LengthRequest;
use nmt_engine::{Engine, Outcome, Translation};

/// Texts planned and decoded at a time, in batches: enough batches to sort by length, few
/// enough that memory stays flat on any input size (and, for plain text, that output streams).
pub const CHUNK_BATCHES: usize = 16;

/// What a run did, for the summary line.
#[derive(Default)]
pub struct Totals {
    pub texts: usize,
    pub source_tokens: usize,
    pub output_tokens: usize,
    pub refused: usize,
    pub budget: usize,
    pub truncated: usize,
}

impl Totals {
    fn add(&mut self, t: &Translation) {
        self.texts += 1;
        self.source_tokens += t.source_tokens;
        self.output_tokens += t.output_tokens;
        self.refused += usize::from(t.outcome == Outcome::Refused);
        self.budget += usize::from(t.outcome == Outcome::Budget);
        self.truncated += usize::from(t.truncated);
    }
}

/// The engine with the run's length ask, batch size, progress bar and counts.
pub struct Translator {
    pub engine: Engine,
    /// The command line's length ask; a format may tighten `max_chars` per text.
    pub request: LengthRequest,
    pub batch_size: usize,
    pub bar: ProgressBar,
    pub totals: Totals,
    /// No progress bar.
    pub quiet: bool,
}

impl Translator {
    /// Shows a progress bar of `total` `unit`s (a spinner when unknown) in place of the last.
    pub fn start_progress(&mut self, total: Option<usize>, unit: &str) {
        self.bar.finish_and_clear();
        self.bar = progress_bar(total, unit, self.quiet);
    }

    /// Translates `texts` in input order; `max_chars[i]` is text `i`'s own character budget,
    /// the tighter of it and `--max-chars` applies. A text the engine refuses (over the input
    /// limit) comes back empty with [`Outcome::Refused`], as in the server's answer.
    pub fn translate(
        &mut self,
        texts: &[String],
        max_chars: &[Option<usize>],
    ) -> Result<Vec<Translation>> {
        let chunk = self.batch_size * CHUNK_BATCHES;
        let mut out = Vec::with_capacity(texts.len());
        for (texts, budgets) in texts.chunks(chunk).zip(max_chars.chunks(chunk)) {
            let lengths: Vec<LengthRequest> = budgets
                .iter()
                .map(|budget| LengthRequest {
                    max_chars: tighter(self.request.max_chars, *budget),
                    ..self.request
                })
                .collect();
            let bar = &self.bar;
            let translations =
                self.engine
                    .translate(texts, &lengths, self.batch_size, &mut |n| bar.inc(n as u64))?;
            for t in &translations {
                self.totals.add(t);
            }
            out.extend(translations);
        }
        Ok(out)
    }

    /// Prints `message` on standard error without tearing the progress bar.
    pub fn warn(&self, message: &str) {
        self.bar.suspend(|| eprintln!("nmt-translate: {message}"));
    }

    /// The summary line: `what` says what was translated (`7 lines`, `12 entries filled`),
    /// `unit` what the rate counts.
    pub fn summary(&self, what: &str, unit: &str, seconds: f64) -> String {
        let totals = &self.totals;
        let seconds = seconds.max(1e-9);
        let info = &self.engine.info;
        let mut line = format!(
            "nmt-translate: {what}, {} -> {} subwords in {:.1} s: {:.0} target tokens/s, \
             {:.1} {unit}/s ({}, {})",
            totals.source_tokens,
            totals.output_tokens,
            seconds,
            totals.output_tokens as f64 / seconds,
            totals.texts as f64 / seconds,
            info.name,
            info.execution_provider,
        );
        for (count, what) in [
            (totals.refused, "over the input limit, left untranslated"),
            (totals.budget, "stopped at the length budget"),
            (totals.truncated, "cut to their character budget"),
        ] {
            if count > 0 {
                line.push_str(&format!("; {count} {what}"));
            }
        }
        line
    }
}

fn tighter(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A progress bar on standard error counting `unit`s (hidden when quiet or not a terminal);
/// a spinner when the total is unknown (standard input).
pub fn progress_bar(total: Option<usize>, unit: &str, quiet: bool) -> ProgressBar {
    if quiet || !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = match total {
        Some(n) => ProgressBar::new(n as u64),
        None => ProgressBar::new_spinner(),
    };
    bar.set_style(
        ProgressStyle::with_template(&template(total.is_some(), unit)).expect("a valid template"),
    );
    bar.set_draw_target(ProgressDrawTarget::stderr());
    bar
}

fn template(known_total: bool, unit: &str) -> String {
    if known_total {
        format!(
            "[{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} ({{per_sec}}, eta {{eta}})"
        )
    } else {
        format!("{{spinner}} [{{elapsed_precise}}] {{pos}} {unit} ({{per_sec}})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tighter_budget_wins() {
        assert_eq!(tighter(None, None), None);
        assert_eq!(tighter(Some(40), None), Some(40));
        assert_eq!(tighter(None, Some(84)), Some(84));
        assert_eq!(tighter(Some(40), Some(84)), Some(40));
    }

    #[test]
    fn progress_templates_parse() {
        for known in [true, false] {
            let t = template(known, "entries");
            assert!(ProgressStyle::with_template(&t).is_ok(), "{t}");
            assert!(t.contains("entries"));
        }
    }
}
