//! Grad-ready hooks: each leaf's hook runs once per backward, as soon as its gradient is final
//! (what a data-parallel reducer needs to overlap communication with the rest of backward).

use std::sync::{Arc, Mutex};

use lockstep_core::{Device, Tensor};

fn leaf(values: &[f32], dims: [usize; 2]) -> Tensor {
    Tensor::from_slice(values, dims, &Device::cpu())
        .unwrap()
        .requires_grad(true)
}

/// (name, gradient seen by the hook), in firing order.
type Log = Arc<Mutex<Vec<(&'static str, Vec<f32>)>>>;

fn record(t: &Tensor, name: &'static str, log: &Log) {
    let log = log.clone();
    t.add_grad_ready_hook(Arc::new(move |p: &Tensor| {
        let g = p.grad().map(|g| g.to_vec::<f32>().unwrap()).unwrap_or_default();
        log.lock().unwrap().push((name, g));
        Ok(())
    }));
}

#[test]
fn hooks_fire_once_per_backward_in_reverse_order_of_use_with_final_gradients() {
    let x = Tensor::from_slice(&[1f32, 2., 3., 4.], [2, 2], &Device::cpu()).unwrap();
    let w1 = leaf(&[0.5, -1., 2., 1.], [2, 2]);
    let w2 = leaf(&[1., 3., -2., 0.5], [2, 2]);
    let log = Arc::new(Mutex::new(Vec::new()));
    record(&w1, "w1", &log);
    record(&w2, "w2", &log);
    for _ in 0..2 {
        x.matmul(&w1)
            .unwrap()
            .relu()
            .unwrap()
            .matmul(&w2)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
    }
    let log = log.lock().unwrap();
    let names: Vec<&str> = log.iter().map(|(n, _)| *n).collect();
    // The last layer's gradient is final first; each backward fires each hook exactly once.
    assert_eq!(names, ["w2", "w1", "w2", "w1"]);
    // What a hook saw is the gradient as it stands after that backward (the second accumulates).
    assert_eq!(log[2].1, w2.grad().unwrap().to_vec::<f32>().unwrap());
    assert_eq!(log[3].1, w1.grad().unwrap().to_vec::<f32>().unwrap());
    let once: Vec<f32> = log[1].1.iter().map(|v| v * 2.0).collect();
    assert_eq!(log[3].1, once, "the second backward doubles the accumulated gradient");
}

#[test]
fn a_shared_weight_fires_after_its_last_use() {
    let w = leaf(&[1., 2., 3., 4.], [2, 2]);
    let log = Arc::new(Mutex::new(Vec::new()));
    record(&w, "w", &log);
    // w is used twice; d/dw sum(w @ w) has contributions from both uses.
    w.matmul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 1, "one firing per backward, after both uses");
    assert_eq!(log[0].1, w.grad().unwrap().to_vec::<f32>().unwrap());
    // d sum(W W)/dW = 1 1^T W^T + W^T 1 1^T: rows [3+7, 4+6], … = [[7, 11], [9, 13]].
    assert_eq!(log[0].1, vec![7., 11., 9., 13.]);
}
