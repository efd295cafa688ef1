//! RNN, GRU and LSTM against an independent reference (PyTorch's equations written out as
//! plain f64 loops, with PyTorch's gate order), their gradients against finite differences in
//! f64, and PyTorch's parameter names.

use lockstep_core::nn::{
    CellKind, Module, ModuleExt, Recurrent, RecurrentConfig, RecurrentLayer, RecurrentState, gru, lstm, rnn,
};
use lockstep_core::{DType, Device, Generator, Tensor};

const KINDS: [CellKind; 3] = [CellKind::RnnTanh, CellKind::Gru, CellKind::Lstm];
/// Time steps, batch, input features, hidden features, layers.
const T: usize = 3;
const B: usize = 2;
const I: usize = 3;
const H: usize = 4;
const L: usize = 2;

fn gates(kind: CellKind) -> usize {
    match kind {
        CellKind::RnnTanh => 1,
        CellKind::Gru => 3,
        CellKind::Lstm => 4,
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `w` [rows, cols] times `v` [cols], plus `b`.
fn affine(w: &[f64], v: &[f64], b: &[f64]) -> Vec<f64> {
    let cols = v.len();
    (0..b.len())
        .map(|r| b[r] + (0..cols).map(|c| w[r * cols + c] * v[c]).sum::<f64>())
        .collect()
}

/// Layer k's (weight_ih, weight_hh, bias_ih, bias_hh) as f64 (zeros where there is no bias).
fn layer_values(layer: &RecurrentLayer, rows: usize) -> [Vec<f64>; 4] {
    let v = |t: &Tensor| t.to_f64_vec().unwrap();
    let b = |t: &Option<Tensor>| t.as_ref().map_or(vec![0.0; rows], v);
    [
        v(&layer.weight_ih),
        v(&layer.weight_hh),
        b(&layer.bias_ih),
        b(&layer.bias_hh),
    ]
}

/// The reference: time-major x [T][B][in], states [L][B][H]; returns (output, h_n, c_n) flat.
fn reference(m: &Recurrent, x: &[f64], h0: &[f64], c0: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let rows = gates(m.kind) * H;
    let mut input: Vec<Vec<Vec<f64>>> = (0..T)
        .map(|t| {
            (0..B)
                .map(|b| x[(t * B + b) * I..(t * B + b + 1) * I].to_vec())
                .collect()
        })
        .collect();
    let (mut hn, mut cn) = (Vec::new(), Vec::new());
    for (k, layer) in m.layers.iter().enumerate() {
        let [wih, whh, bih, bhh] = layer_values(layer, rows);
        let mut out = vec![vec![vec![0.0; H]; B]; T];
        for b in 0..B {
            let mut h = h0[(k * B + b) * H..(k * B + b + 1) * H].to_vec();
            let mut c = c0[(k * B + b) * H..(k * B + b + 1) * H].to_vec();
            for t in 0..T {
                let xw = affine(&wih, &input[t][b], &bih);
                let hw = affine(&whh, &h, &bhh);
                let g = |i: usize, j: usize, v: &[f64]| v[i * H + j];
                for j in 0..H {
                    match m.kind {
                        CellKind::RnnTanh => out[t][b][j] = (xw[j] + hw[j]).tanh(),
                        CellKind::Gru => {
                            let r = sigmoid(g(0, j, &xw) + g(0, j, &hw));
                            let z = sigmoid(g(1, j, &xw) + g(1, j, &hw));
                            let n = (g(2, j, &xw) + r * g(2, j, &hw)).tanh();
                            out[t][b][j] = (1.0 - z) * n + z * h[j];
                        }
                        CellKind::Lstm => {
                            let s = |i| g(i, j, &xw) + g(i, j, &hw);
                            let (ig, fg, gg, og) = (sigmoid(s(0)), sigmoid(s(1)), s(2).tanh(), sigmoid(s(3)));
                            c[j] = fg * c[j] + ig * gg;
                            out[t][b][j] = og * c[j].tanh();
                        }
                    }
                }
                h = out[t][b].clone();
            }
            hn.push(h);
            cn.push(c);
        }
        input = out;
    }
    let flat_out = input.into_iter().flatten().flatten().collect();
    // hn/cn were pushed layer by layer, batch by batch: [L][B][H].
    (flat_out, hn.concat(), cn.concat())
}

/// Small signed values, fixed by `k`.
fn pattern(n: usize, k: usize) -> Vec<f64> {
    (0..n).map(|i| (((i * k) % 17) as f64 - 8.0) / 8.0).collect()
}

fn config(batch_first: bool) -> RecurrentConfig {
    RecurrentConfig::new(I, H).num_layers(L).batch_first(batch_first)
}

fn build(kind: CellKind, config: RecurrentConfig) -> Recurrent {
    Recurrent::new(kind, config, &Device::cpu(), &Generator::new(7)).unwrap()
}

#[test]
fn every_cell_follows_pytorchs_equations_over_layers_with_an_initial_state() {
    let dev = Device::cpu();
    let x = pattern(T * B * I, 5);
    let (h0, c0) = (pattern(L * B * H, 3), pattern(L * B * H, 7));
    for kind in KINDS {
        for batch_first in [false, true] {
            let m = build(kind, config(batch_first));
            let xt = Tensor::from_vec(x.iter().map(|&v| v as f32).collect(), [T, B, I], &dev).unwrap();
            let xt = if batch_first { xt.transpose(0, 1).unwrap() } else { xt };
            let state = RecurrentState {
                h: Tensor::from_vec(h0.iter().map(|&v| v as f32).collect(), [L, B, H], &dev).unwrap(),
                c: (kind == CellKind::Lstm)
                    .then(|| Tensor::from_vec(c0.iter().map(|&v| v as f32).collect(), [L, B, H], &dev).unwrap()),
            };
            let (out, last) = m.forward_with_state(&xt, Some(&state)).unwrap();
            let out = if batch_first { out.transpose(0, 1).unwrap() } else { out };
            assert_eq!(out.dims(), [T, B, H]);
            let (want_out, want_h, want_c) = reference(&m, &x, &h0, &c0);
            let close = |got: &Tensor, want: &[f64], what: &str| {
                let got = got.contiguous().unwrap().to_f64_vec().unwrap();
                for (g, w) in got.iter().zip(want) {
                    assert!(
                        (g - w).abs() < 1e-5,
                        "{kind:?} batch_first={batch_first} {what}: {g} vs {w}"
                    );
                }
            };
            close(&out, &want_out, "output");
            close(&last.h, &want_h, "h_n");
            if kind == CellKind::Lstm {
                close(last.c.as_ref().unwrap(), &want_c, "c_n");
            }
        }
    }
}

/// The module in f64 with `m`'s weights, every parameter a leaf.
fn in_f64(m: &Recurrent) -> Recurrent {
    let f64_leaf = |t: &Tensor| t.to_dtype(DType::F64).unwrap().detach().requires_grad(true);
    Recurrent {
        kind: m.kind,
        config: m.config,
        layers: m
            .layers
            .iter()
            .map(|l| RecurrentLayer {
                weight_ih: f64_leaf(&l.weight_ih),
                weight_hh: f64_leaf(&l.weight_hh),
                bias_ih: l.bias_ih.as_ref().map(f64_leaf),
                bias_hh: l.bias_hh.as_ref().map(f64_leaf),
            })
            .collect(),
    }
}

#[test]
fn gradients_match_finite_differences() {
    let dev = Device::cpu();
    for kind in KINDS {
        let m = in_f64(&build(kind, config(true)));
        let x = Tensor::from_vec(pattern(B * T * I, 5), [B, T, I], &dev)
            .unwrap()
            .requires_grad(true);
        let h0 = Tensor::from_vec(pattern(L * B * H, 3), [L, B, H], &dev)
            .unwrap()
            .requires_grad(true);
        let state = RecurrentState {
            h: h0.clone(),
            c: (kind == CellKind::Lstm).then(|| Tensor::from_vec(pattern(L * B * H, 7), [L, B, H], &dev).unwrap()),
        };
        // A scalar that weighs every output and the final state differently.
        let loss = || {
            let (out, last) = m.forward_with_state(&x, Some(&state)).unwrap();
            let wo = Tensor::from_vec(pattern(B * T * H, 11), [B, T, H], &dev).unwrap();
            let wh = Tensor::from_vec(pattern(L * B * H, 13), [L, B, H], &dev).unwrap();
            out.mul(&wo)
                .unwrap()
                .sum_all()
                .unwrap()
                .add(&last.h.mul(&wh).unwrap().sum_all().unwrap())
                .unwrap()
        };
        loss().backward().unwrap();
        let mut leaves: Vec<(String, Tensor)> = m.named_parameters();
        leaves.push(("x".into(), x.clone()));
        leaves.push(("h0".into(), h0.clone()));
        for (name, leaf) in leaves {
            let analytic = leaf.grad().unwrap().to_f64_vec().unwrap();
            let values = leaf.to_f64_vec().unwrap();
            for (i, &a) in analytic.iter().enumerate() {
                let at = |v: f64| {
                    let mut moved = values.clone();
                    moved[i] = v;
                    leaf.assign(&Tensor::from_vec(moved, leaf.dims(), &dev).unwrap())
                        .unwrap();
                    lockstep_core::autograd::no_grad(|| loss().item().unwrap())
                };
                let eps = 1e-6;
                let numeric = (at(values[i] + eps) - at(values[i] - eps)) / (2.0 * eps);
                at(values[i]);
                assert!(
                    (a - numeric).abs() <= 1e-6 * (1.0 + numeric.abs()),
                    "{kind:?} d/d{name}[{i}]: autograd {a}, finite differences {numeric}"
                );
            }
        }
    }
}

#[test]
fn parameters_carry_pytorchs_names_and_shapes() {
    let (dev, g) = (Device::cpu(), Generator::new(0));
    let m = gru(RecurrentConfig::new(5, 8).num_layers(2), &dev, &g).unwrap();
    let names: Vec<(String, Vec<usize>)> = m
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.dims().to_vec()))
        .collect();
    let want = [
        ("weight_ih_l0", vec![24, 5]),
        ("weight_hh_l0", vec![24, 8]),
        ("bias_ih_l0", vec![24]),
        ("bias_hh_l0", vec![24]),
        ("weight_ih_l1", vec![24, 8]),
        ("weight_hh_l1", vec![24, 8]),
        ("bias_ih_l1", vec![24]),
        ("bias_hh_l1", vec![24]),
    ];
    assert_eq!(names, want.map(|(n, s)| (n.to_string(), s)).to_vec());
    let lstm = lstm(RecurrentConfig::new(5, 8).bias(false), &dev, &g).unwrap();
    assert_eq!(lstm.parameters().len(), 2);
    assert_eq!(lstm.parameters()[0].dims(), [32, 5]);
    assert_eq!(
        rnn(RecurrentConfig::new(5, 8).batch_first(true), &dev, &g)
            .unwrap()
            .describe(),
        "RNN(5, 8, num_layers=1, bias=True, batch_first=True)"
    );
    // Uniform on ±1/sqrt(hidden).
    let bound = 1.0 / 8f64.sqrt();
    assert!(
        m.parameters()
            .iter()
            .all(|p| p.to_f64_vec().unwrap().iter().all(|v| v.abs() <= bound))
    );
}

#[test]
fn wrong_shapes_are_named() {
    let m = build(CellKind::Gru, config(false));
    let dev = Device::cpu();
    let flat = Tensor::zeros([T, I], DType::F32, &dev).unwrap();
    let err = m.forward_with_state(&flat, None).err().unwrap().to_string();
    assert!(err.contains("input must be [time, batch, 3]"), "{err}");
    let x = Tensor::zeros([T, B, I], DType::F32, &dev).unwrap();
    let state = RecurrentState {
        h: Tensor::zeros([1, B, H], DType::F32, &dev).unwrap(),
        c: None,
    };
    let err = m.forward_with_state(&x, Some(&state)).err().unwrap().to_string();
    assert!(err.contains("the state must be [2, 2, 4]"), "{err}");
}
