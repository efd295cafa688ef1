use half::bf16;

use super::*;

fn spec(outer: usize, channels: usize, inner: usize) -> BatchNormSpec {
    BatchNormSpec {
        outer,
        channels,
        inner,
        eps: 1e-5,
        channel_major: false,
        relu: false,
    }
}

/// Values varied by index around a per-channel offset far from zero (the variance must not
/// cancel), exact in bf16.
fn input(spec: &BatchNormSpec) -> Vec<f32> {
    (0..spec.outer * spec.channels * spec.inner)
        .map(|i| {
            let c = i / spec.inner % spec.channels;
            let spread = ((i * 7 + 3) % 19) as f32 / 8.0 - 1.0;
            f32::from(bf16::from_f32(300.0 * c as f32 + spread))
        })
        .collect()
}

fn per_channel(spec: &BatchNormSpec, seed: usize) -> Vec<f32> {
    (0..spec.channels)
        .map(|c| ((c * 5 + seed) % 7) as f32 / 4.0 - 0.5)
        .collect()
}

/// Each channel's values of `v`, in f64.
fn channel<'a>(v: &'a [f32], spec: &BatchNormSpec, c: usize) -> impl Iterator<Item = (usize, f64)> + 'a {
    let (inner, row) = (spec.inner, spec.channels * spec.inner);
    (0..spec.outer)
        .flat_map(move |n| (0..inner).map(move |i| n * row + c * inner + i))
        .map(|at| (at, v[at] as f64))
}

/// The mean, biased variance and `1 / sqrt(var + eps)` of channel `c`, two passes in f64.
fn statistics(x: &[f32], spec: &BatchNormSpec, c: usize) -> (f64, f64, f64) {
    let count = (spec.outer * spec.inner) as f64;
    let mean = channel(x, spec, c).map(|(_, v)| v).sum::<f64>() / count;
    let var = channel(x, spec, c).map(|(_, v)| (v - mean) * (v - mean)).sum::<f64>() / count;
    (mean, var, 1.0 / (var + spec.eps).sqrt())
}

fn close(what: &str, got: f32, want: f64, tolerance: f64) {
    assert!(
        (got as f64 - want).abs() <= tolerance * (1.0 + want.abs()),
        "{what}: got {got}, want {want}"
    );
}

/// `v` (`[outer, channels, inner]`) as the input is stored under `spec`: channel-major moves
/// each row to `[channels, outer, inner]`; `back` the other way.
fn stored(v: &[f32], spec: &BatchNormSpec, back: bool) -> Vec<f32> {
    if !spec.channel_major {
        return v.to_vec();
    }
    let mut out = vec![0.0; v.len()];
    let (n, c, inner) = (spec.outer, spec.channels, spec.inner);
    for (image, channel) in (0..n).flat_map(|i| (0..c).map(move |ch| (i, ch))) {
        let (logical, kept) = ((image * c + channel) * inner, (channel * n + image) * inner);
        let (from, to) = if back { (kept, logical) } else { (logical, kept) };
        out[to..to + inner].copy_from_slice(&v[from..from + inner]);
    }
    out
}

/// Both layouts of the input.
fn layouts(outer: usize, channels: usize, inner: usize) -> [BatchNormSpec; 2] {
    let image_major = spec(outer, channels, inner);
    [
        image_major,
        BatchNormSpec {
            channel_major: true,
            ..image_major
        },
    ]
}

/// Shapes on either side of the parallel threshold, with rows shorter than, spanning and longer
/// than a block.
const SHAPES: [[usize; 3]; 4] = [[4, 3, 5], [64, 512, 16], [3, 7, 5000], [2, 3, 20000]];

#[test]
fn the_forward_pass_matches_two_passes_in_f64() {
    let pool = Pool::default();
    for spec in SHAPES.into_iter().flat_map(|[n, c, i]| layouts(n, c, i)) {
        let BatchNormSpec { channels, .. } = spec;
        let (x, weight, bias) = (input(&spec), per_channel(&spec, 1), per_channel(&spec, 2));
        let (y, [mean, var]) = forward(&pool, &stored(&x, &spec, false), &weight, &bias, &spec);
        for c in 0..channels {
            let (m, v, r) = statistics(&x, &spec, c);
            close(&format!("{spec:?} mean {c}"), mean[c], m, 1e-7);
            close(&format!("{spec:?} var {c}"), var[c], v, 1e-5);
            for (at, xv) in channel(&x, &spec, c) {
                let want = (xv - m) * r * weight[c] as f64 + bias[c] as f64;
                close(&format!("{spec:?} y[{at}]"), y[at], want, 1e-4);
            }
        }
    }
}

#[test]
fn the_backward_pass_matches_f64() {
    let pool = Pool::default();
    for spec in SHAPES.into_iter().flat_map(|[n, c, i]| layouts(n, c, i)) {
        let BatchNormSpec {
            outer, channels, inner, ..
        } = spec;
        let (x, weight) = (input(&spec), per_channel(&spec, 3));
        let g: Vec<f32> = (0..x.len()).map(|i| ((i * 11 + 5) % 13) as f32 / 6.0 - 1.0).collect();
        let kept = stored(&x, &spec, false);
        let (_, [mean, var]) = forward(&pool, &kept, &weight, &weight, &spec);
        let (dx, [dweight, dbias]) = backward(&pool, &g, &kept, &weight, [&mean, &var], &spec);
        let dx = stored(&dx, &spec, true);
        let count = (outer * inner) as f64;
        for c in 0..channels {
            let (m, _, r) = statistics(&x, &spec, c);
            let sum_g: f64 = channel(&g, &spec, c).map(|(_, v)| v).sum();
            let sum_gx: f64 = channel(&x, &spec, c).map(|(at, v)| g[at] as f64 * (v - m) * r).sum();
            let what = format!("{spec:?} channel {c}");
            close(&format!("{what} dbias"), dbias[c], sum_g, 1e-6);
            close(&format!("{what} dweight"), dweight[c], sum_gx, 1e-4);
            for (at, xv) in channel(&x, &spec, c) {
                let want = weight[c] as f64 * r * (g[at] as f64 - (sum_g + (xv - m) * r * sum_gx) / count);
                close(&format!("{what} dx[{at}]"), dx[at], want, 1e-4);
            }
        }
    }
}

#[test]
fn bf16_is_the_f32_result_rounded_once() {
    let pool = Pool::default();
    let spec = spec(64, 512, 16);
    let (x, weight, bias) = (input(&spec), per_channel(&spec, 1), per_channel(&spec, 2));
    let low: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let (y, stats) = forward(&pool, &x, &weight, &bias, &spec);
    let (y_low, stats_low) = forward(&pool, &low, &weight, &bias, &spec);
    assert_eq!(stats, stats_low, "the statistics of equal values");
    let rounded: Vec<bf16> = y.iter().map(|&v| <bf16 as ViaF32>::from_f32(v)).collect();
    assert!(rounded == y_low, "bf16 output differs from the f32 output rounded");
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let pool = Pool::default();
    let spec = spec(64, 512, 16);
    let (x, weight) = (input(&spec), per_channel(&spec, 3));
    let g: Vec<f32> = (0..x.len()).map(|i| ((i * 11 + 5) % 13) as f32 / 6.0 - 1.0).collect();
    let run = |threads: usize| {
        let workers = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        workers.install(|| {
            let (y, [mean, var]) = forward(&pool, &x, &weight, &weight, &spec);
            let (dx, grads) = backward(&pool, &g, &x, &weight, [&mean, &var], &spec);
            (y, mean, var, dx, grads)
        })
    };
    assert!(run(1) == run(3), "one thread and three give different bits");
}
