//! PNG charts of a metric by source-length bucket, one line per series (package, model):
//! `nmt-eval`'s BLEU and length-ratio plots, `nmt-bench memory`'s resident memory. Text is drawn by
//! ab_glyph from a TrueType file read at run time (no fontconfig), so a fresh Debian machine
//! needs only the font package that `scripts/setup.sh` installs.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use plotters::coord::ranged1d::{SegmentValue, SegmentedCoord};
use plotters::coord::types::{RangedCoordf64, RangedCoordi32};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// The font family name the plots ask for.
const FAMILY: &str = "sans-serif";
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Reads and registers the font once per process.
pub fn load_font(path: &Path) -> Result<()> {
    static LOADED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if LOADED.get().is_some() {
        return Ok(());
    }
    let bytes = std::fs::read(path).with_context(|| {
        format!(
            "reading the plot font {} (Debian package fonts-dejavu-core; --font)",
            path.display()
        )
    })?;
    // plotters keeps registered fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font(FAMILY, FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{} is not a TrueType/OpenType font", path.display()))?;
    let _ = LOADED.set(());
    Ok(())
}

/// A metric by bucket: the x labels, and per series its name and one value per label.
pub struct Chart<'a> {
    pub title: String,
    pub y_label: &'a str,
    pub labels: Vec<String>,
    pub series: Vec<(String, Vec<Option<f64>>)>,
    /// A horizontal reference line (1.0 for a length ratio).
    pub reference: Option<f64>,
}

impl Chart<'_> {
    fn y_range(&self) -> std::ops::Range<f64> {
        let values = self
            .series
            .iter()
            .flat_map(|(_, v)| v.iter().flatten())
            .chain(self.reference.iter())
            .copied();
        let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if lo > hi {
            return 0.0..1.0;
        }
        let pad = ((hi - lo) * 0.1).max(0.05);
        let lo = if self.reference.is_some() {
            lo - pad
        } else {
            0.0_f64.min(lo)
        };
        // Headroom for the legend in the upper right corner, one line per series.
        let legend = (hi - lo) * 0.08 * (self.series.len() + 1) as f64;
        lo..hi + pad + legend
    }
}

/// Draws `chart` into a PNG at `path` (the font must be loaded).
pub fn draw(chart: &Chart, path: &Path) -> Result<()> {
    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    // An i32 range is inclusive in plotters: 0..=n-1 makes n segments.
    let last = chart.labels.len().max(1) as i32 - 1;
    let mut ctx = ChartBuilder::on(&root)
        .caption(&chart.title, (FAMILY, 26))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d((0..last).into_segmented(), chart.y_range())
        .map_err(plot_error)?;
    let label_of = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
            chart.labels.get(*i as usize).cloned().unwrap_or_default()
        }
        SegmentValue::Last => String::new(),
    };
    ctx.configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_desc("source length (subwords)")
        .y_desc(chart.y_label)
        .x_labels(chart.labels.len())
        .x_label_formatter(&label_of)
        .label_style((FAMILY, 16))
        .axis_desc_style((FAMILY, 18))
        .draw()
        .map_err(plot_error)?;
    if let Some(y) = chart.reference {
        let line = [(SegmentValue::Exact(0), y), (SegmentValue::Last, y)];
        ctx.draw_series(LineSeries::new(line, BLACK.mix(0.6).stroke_width(2)))
            .map_err(plot_error)?;
    }
    draw_series(&mut ctx, chart)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

type Ctx<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<SegmentedCoord<RangedCoordi32>, RangedCoordf64>,
>;

fn draw_series<'a>(ctx: &mut Ctx<'a, 'a>, chart: &Chart) -> Result<()> {
    for (k, (name, values)) in chart.series.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        let points: Vec<(SegmentValue<i32>, f64)> = values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| (SegmentValue::CenterOf(i as i32), v)))
            .collect();
        ctx.draw_series(LineSeries::new(points.clone(), color.stroke_width(3)))
            .map_err(plot_error)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(3)));
        ctx.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 5, color.filled())),
        )
        .map_err(plot_error)?;
    }
    ctx.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .label_font((FAMILY, 16))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

fn plot_error<E: std::error::Error + Send + Sync + 'static>(e: E) -> anyhow::Error {
    anyhow!("drawing a plot: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn y_range_covers_the_values_and_the_reference_line() {
        let chart = Chart {
            title: "t".into(),
            y_label: "y",
            labels: vec!["1-16".into(), "17-32".into()],
            series: vec![
                ("a".into(), vec![Some(1.2), None]),
                ("b".into(), vec![Some(1.5), Some(1.4)]),
            ],
            reference: Some(1.0),
        };
        let r = chart.y_range();
        assert!(r.start < 1.0 && r.end > 1.5, "{r:?}");
        let bleu = Chart {
            reference: None,
            ..chart
        };
        assert_eq!(bleu.y_range().start, 0.0);
    }
}
