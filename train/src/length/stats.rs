//! The measures of Oka et al. (2020) for a length predictor, and the least-squares baseline.

use model_package::LinearFit;
use serde::{Deserialize, Serialize};

/// How far predictions are from the reference lengths; the error is `prediction - reference`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measures {
    pub count: usize,
    /// Signed: positive when predictions run long.
    pub mean_error: f64,
    pub mean_absolute_error: f64,
    /// Population variance of the signed error (divided by `count`, as numpy's `var`).
    pub error_variance: f64,
    /// Pearson's r between predictions and references.
    pub correlation: f64,
}

impl Measures {
    pub fn of(predictions: &[f64], references: &[f64]) -> Self {
        assert_eq!(
            predictions.len(),
            references.len(),
            "one prediction per reference"
        );
        let errors: Vec<f64> = predictions
            .iter()
            .zip(references)
            .map(|(p, r)| p - r)
            .collect();
        let mean_error = mean(&errors);
        Self {
            count: errors.len(),
            mean_error,
            mean_absolute_error: mean(&errors.iter().map(|e| e.abs()).collect::<Vec<_>>()),
            error_variance: mean(
                &errors
                    .iter()
                    .map(|e| (e - mean_error).powi(2))
                    .collect::<Vec<_>>(),
            ),
            correlation: pearson(predictions, references),
        }
    }
}

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Sums of products of deviations from the means: `(sxx, sxy, syy)`.
fn co_moments(xs: &[f64], ys: &[f64]) -> (f64, f64, f64) {
    let (mx, my) = (mean(xs), mean(ys));
    xs.iter()
        .zip(ys)
        .fold((0.0, 0.0, 0.0), |(xx, xy, yy), (x, y)| {
            let (dx, dy) = (x - mx, y - my);
            (xx + dx * dx, xy + dx * dy, yy + dy * dy)
        })
}

/// Pearson's correlation coefficient; NaN when either side is constant.
pub fn pearson(xs: &[f64], ys: &[f64]) -> f64 {
    let (sxx, sxy, syy) = co_moments(xs, ys);
    sxy / (sxx * syy).sqrt()
}

/// Least squares of `ys` on `xs`. With every `x` equal there is no slope to fit: the fit is
/// the mean of `ys`.
pub fn least_squares(xs: &[f64], ys: &[f64]) -> LinearFit {
    assert_eq!(xs.len(), ys.len(), "one y per x");
    let (sxx, sxy, _) = co_moments(xs, ys);
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    LinearFit {
        slope,
        intercept: mean(ys) - slope * mean(xs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn measures_by_hand() {
        // Errors 1, -1, 2, 0: mean 0.5, |mean| 1, deviations .5 -1.5 1.5 -.5 -> var 5/4.
        let predictions = [3.0, 3.0, 8.0, 8.0];
        let references = [2.0, 4.0, 6.0, 8.0];
        let m = Measures::of(&predictions, &references);
        assert_eq!(m.count, 4);
        assert!(close(m.mean_error, 0.5));
        assert!(close(m.mean_absolute_error, 1.0));
        assert!(close(m.error_variance, 1.25));
        // Deviations p: -2.5 -2.5 2.5 2.5, r: -3 -1 1 3: sxy 20, sxx 25, syy 20.
        assert!(close(m.correlation, 20.0 / (25.0f64 * 20.0).sqrt()));
    }

    #[test]
    fn correlation_is_one_for_any_increasing_linear_map() {
        let xs = [1.0, 2.0, 5.0, 9.0];
        let ys: Vec<f64> = xs.iter().map(|x| 3.0 * x - 7.0).collect();
        assert!(close(pearson(&xs, &ys), 1.0));
        let flipped: Vec<f64> = xs.iter().map(|x| -x).collect();
        assert!(close(pearson(&xs, &flipped), -1.0));
    }

    #[test]
    fn least_squares_by_hand() {
        // x 0 1 2 3, y 1 3 2 6: means 1.5, 3; sxy = 1.5*2 + .5*0 + .5*-1 + 1.5*3 = 7,
        // sxx = 5 -> slope 1.4, intercept 3 - 2.1 = 0.9.
        let fit = least_squares(&[0.0, 1.0, 2.0, 3.0], &[1.0, 3.0, 2.0, 6.0]);
        assert!(close(fit.slope, 1.4));
        assert!(close(fit.intercept, 0.9));
        assert!(close(fit.predict(10), 14.9));
    }

    #[test]
    fn least_squares_recovers_an_exact_line_and_survives_constant_x() {
        let xs = [4.0, 10.0, 13.0];
        let fit = least_squares(&xs, &xs.map(|x| 1.25 * x + 2.0));
        assert!(close(fit.slope, 1.25) && close(fit.intercept, 2.0));
        let flat = least_squares(&[5.0, 5.0], &[1.0, 3.0]);
        assert_eq!((flat.slope, flat.intercept), (0.0, 2.0));
    }
}
