//! Turning long metric series into what a plot can draw at 60 frames per second: exponential
//! smoothing (TensorBoard's, debiased so the first points are not pulled toward zero) and min-max
//! decimation (each bucket keeps its lowest and highest point, so spikes survive).

/// A point: (x, y).
pub type Point = [f64; 2];

/// Exponential moving average with weight `weight` in [0, 1) on the previous value, debiased:
/// the first value is itself, not `(1 - weight) * value`. Non-finite values pass through
/// unsmoothed and do not poison the average. Points are added as they arrive, so a live series
/// extends its smoothed copy instead of redoing it.
#[derive(Clone, Debug, Default)]
pub struct Smoother {
    weight: f64,
    avg: f64,
    debias: f64,
    pub smoothed: Vec<Point>,
}

impl Smoother {
    pub fn new(weight: f64) -> Smoother {
        Smoother {
            weight: weight.clamp(0.0, 0.999),
            avg: 0.0,
            debias: 1.0,
            smoothed: Vec::new(),
        }
    }

    pub fn weight(&self) -> f64 {
        self.weight
    }

    pub fn extend(&mut self, points: &[Point]) {
        for &[x, y] in points {
            if !y.is_finite() {
                self.smoothed.push([x, y]);
                continue;
            }
            let first = self.debias == 1.0;
            self.avg = self.weight * self.avg + (1.0 - self.weight) * y;
            self.debias *= self.weight;
            // (1 - w) y / (1 - w) can miss y by an ulp, which would put the first smoothed point
            // beside, not on, the raw one.
            let smoothed = if first { y } else { self.avg / (1.0 - self.debias) };
            self.smoothed.push([x, smoothed]);
        }
    }
}

/// At most about `max_points` points with the shape of `points` (sorted by x): the series is cut
/// into `max_points / 2` buckets and each keeps its minimum and maximum, in x order.
pub fn decimate(points: &[Point], max_points: usize) -> Vec<Point> {
    let buckets = (max_points / 2).max(1);
    if points.len() <= max_points.max(2) {
        return points.to_vec();
    }
    let mut out = Vec::with_capacity(buckets * 2);
    for b in 0..buckets {
        let range = &points[b * points.len() / buckets..(b + 1) * points.len() / buckets];
        let Some(first) = range.first() else { continue };
        let (mut lo, mut hi) = (first, first);
        for p in range {
            if p[1] < lo[1] {
                lo = p;
            }
            if p[1] > hi[1] {
                hi = p;
            }
        }
        if lo[0] <= hi[0] {
            out.push(*lo);
            if hi != lo {
                out.push(*hi);
            }
        } else {
            out.push(*hi);
            out.push(*lo);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smooth(points: &[Point], weight: f64) -> Vec<Point> {
        let mut s = Smoother::new(weight);
        s.extend(points);
        s.smoothed
    }

    fn line(n: usize) -> Vec<Point> {
        (0..n).map(|i| [i as f64, i as f64]).collect()
    }

    #[test]
    fn smoothing_starts_at_the_first_value_and_follows_a_constant() {
        let s = smooth(&[[0.0, 4.0], [1.0, 4.0], [2.0, 4.0]], 0.9);
        for p in &s {
            assert!((p[1] - 4.0).abs() < 1e-12, "{s:?}");
        }
    }

    #[test]
    fn the_first_smoothed_value_is_the_first_value_exactly() {
        // An f32 loss for which (1 - 0.9) y / (1 - 0.9) != y in f64.
        let y = f64::from(0.358_979_88_f32);
        assert_eq!(smooth(&[[50.0, y]], 0.9), vec![[50.0, y]]);
        assert_eq!(smooth(&[[0.0, f64::NAN], [1.0, y]], 0.9)[1], [1.0, y]);
    }

    #[test]
    fn smoothing_damps_noise_and_zero_weight_is_the_raw_series() {
        let noisy: Vec<Point> = (0..100)
            .map(|i| [i as f64, if i % 2 == 0 { 1.0 } else { 3.0 }])
            .collect();
        let s = smooth(&noisy, 0.9);
        assert!((s[99][1] - 2.0).abs() < 0.2, "{:?}", s[99]);
        assert_eq!(smooth(&noisy, 0.0), noisy);
    }

    #[test]
    fn smoothing_skips_non_finite_values() {
        let s = smooth(&[[0.0, 1.0], [1.0, f64::NAN], [2.0, 1.0]], 0.5);
        assert!(s[1][1].is_nan());
        assert!((s[2][1] - 1.0).abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn extending_point_by_point_equals_smoothing_at_once() {
        let points: Vec<Point> = (0..50).map(|i| [i as f64, ((i * 7) % 11) as f64]).collect();
        let mut s = Smoother::new(0.8);
        for chunk in points.chunks(7) {
            s.extend(chunk);
        }
        assert_eq!(s.smoothed, smooth(&points, 0.8));
    }

    #[test]
    fn short_series_are_left_alone() {
        assert_eq!(decimate(&line(10), 100), line(10));
        assert!(decimate(&[], 100).is_empty());
    }

    #[test]
    fn a_million_points_become_at_most_the_budget_and_keep_the_extremes() {
        let mut points = line(1_000_000);
        points[123_456][1] = 1e9; // a spike
        points[654_321][1] = -1e9;
        let d = decimate(&points, 2000);
        assert!(d.len() <= 2000, "{} points", d.len());
        assert!(d.iter().any(|p| p[1] == 1e9) && d.iter().any(|p| p[1] == -1e9));
        assert!(d.windows(2).all(|w| w[0][0] <= w[1][0]), "x order is kept");
        assert_eq!(d.first().unwrap()[0], 0.0);
    }
}
