//! GRU and LSTM stacks on wgpu give the CPU's outputs, final states and gradients (the layers
//! are composed from ops each backend has, so this checks the composition end to end).

mod support;

use lockstep_core::nn::{CellKind, ModuleExt, Recurrent, RecurrentConfig, RecurrentState};
use lockstep_core::{DType, Device, Generator, Tensor};

/// Output, final h and every parameter's gradient of a 2-layer batch-first stack on `device`.
fn run(kind: CellKind, device: &Device) -> Vec<Vec<f32>> {
    let config = RecurrentConfig::new(3, 8).num_layers(2).batch_first(true);
    let m = Recurrent::new(kind, config, device, &Generator::new(3)).unwrap();
    let g = Generator::new(4);
    let x = Tensor::rand_normal([2, 5, 3], 0.0, 1.0, DType::F32, &g, device).unwrap();
    let state = RecurrentState {
        h: Tensor::rand_normal([2, 2, 8], 0.0, 0.5, DType::F32, &g, device).unwrap(),
        c: (kind == CellKind::Lstm).then(|| Tensor::rand_normal([2, 2, 8], 0.0, 0.5, DType::F32, &g, device).unwrap()),
    };
    let (out, last) = m.forward_with_state(&x, Some(&state)).unwrap();
    let weights = Tensor::rand_normal([2, 5, 8], 0.0, 1.0, DType::F32, &g, device).unwrap();
    out.mul(&weights).unwrap().sum_all().unwrap().backward().unwrap();
    let mut all = vec![
        out.contiguous().unwrap().to_vec::<f32>().unwrap(),
        last.h.to_vec::<f32>().unwrap(),
    ];
    all.extend(
        m.parameters()
            .iter()
            .map(|p| p.grad().unwrap().to_vec::<f32>().unwrap()),
    );
    all
}

#[test]
fn gru_and_lstm_on_wgpu_follow_the_cpu() {
    let Some(device) = support::wgpu_device() else { return };
    for kind in [CellKind::Gru, CellKind::Lstm] {
        let (gpu, cpu) = (run(kind, &device), run(kind, &Device::cpu()));
        for (i, (a, b)) in gpu.iter().zip(&cpu).enumerate() {
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                    "{kind:?} tensor {i}: wgpu {x}, cpu {y}"
                );
            }
        }
    }
}
