//! State-dict names, shapes and order against PyTorch's, and `load_state_dict`.
//! Reference values: scripts/reference_values.py, section `names` (`model.state_dict()` of the
//! same nn.Sequential models, and `repr(lenet)`).

mod nn_support;

use lockstep_core::nn::{
    BatchNorm1d, BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Linear, Module, ModuleExt, Relu, Sequential,
};
use lockstep_core::{DType, Device, Generator, Tensor};
use nn_support::{lenet, mlp, pat, values};

/// PyTorch's values, as scripts/reference_values.py prints them (kept on one line each).
#[rustfmt::skip]
mod pytorch {
    pub const MLP_STATE: &[(&str, &[usize])] = &[("0.weight", &[512, 784]), ("0.bias", &[512]), ("2.weight", &[512, 512]), ("2.bias", &[512]), ("4.weight", &[10, 512]), ("4.bias", &[10])];
    pub const LENET_STATE: &[(&str, &[usize])] = &[("0.weight", &[6, 1, 5, 5]), ("0.bias", &[6]), ("3.weight", &[16, 6, 5, 5]), ("3.bias", &[16]), ("7.weight", &[120, 400]), ("7.bias", &[120]), ("9.weight", &[84, 120]), ("9.bias", &[84]), ("11.weight", &[10, 84]), ("11.bias", &[10])];
    pub const BN_NET_STATE: &[(&str, &[usize])] = &[("0.weight", &[4, 1, 3, 3]), ("0.bias", &[4]), ("1.weight", &[4]), ("1.bias", &[4]), ("1.running_mean", &[4]), ("1.running_var", &[4]), ("1.num_batches_tracked", &[]), ("4.weight", &[10, 2704]), ("4.bias", &[10]), ("5.weight", &[10]), ("5.bias", &[10]), ("5.running_mean", &[10]), ("5.running_var", &[10]), ("5.num_batches_tracked", &[])];

    pub const LENET_REPR: &str = concat!(
        "Sequential(\n",
        "  (0): Conv2d(1, 6, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))\n",
        "  (1): ReLU()\n",
        "  (2): MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)\n",
        "  (3): Conv2d(6, 16, kernel_size=(5, 5), stride=(1, 1))\n",
        "  (4): ReLU()\n",
        "  (5): MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)\n",
        "  (6): Flatten(start_dim=1, end_dim=-1)\n",
        "  (7): Linear(in_features=400, out_features=120, bias=True)\n",
        "  (8): ReLU()\n",
        "  (9): Linear(in_features=120, out_features=84, bias=True)\n",
        "  (10): ReLU()\n",
        "  (11): Linear(in_features=84, out_features=10, bias=True)\n",
        ")"
    );
}
use pytorch::*;

fn names_and_shapes(model: &dyn Module) -> Vec<(String, Vec<usize>)> {
    model
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n, t.dims().to_vec()))
        .collect()
}

fn expected(reference: &[(&str, &[usize])]) -> Vec<(String, Vec<usize>)> {
    reference.iter().map(|(n, s)| (n.to_string(), s.to_vec())).collect()
}

#[test]
fn mlp_and_lenet_state_dicts_equal_pytorchs() {
    let (dev, g) = (Device::cpu(), Generator::new(0));
    let mlp = mlp(&dev, &g);
    assert_eq!(names_and_shapes(&mlp), expected(MLP_STATE));
    assert_eq!(mlp.num_parameters(), 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10);
    let lenet = lenet(&dev, &g);
    assert_eq!(names_and_shapes(&lenet), expected(LENET_STATE));
    assert_eq!(lenet.describe(), LENET_REPR);
    // Every parameter is a trainable leaf and appears in named_parameters in the same order.
    let params: Vec<String> = lenet.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        params,
        LENET_STATE.iter().map(|(n, _)| n.to_string()).collect::<Vec<_>>()
    );
}

#[test]
fn batchnorm_buffers_follow_pytorchs_names_and_order() {
    let (dev, g) = (Device::cpu(), Generator::new(0));
    let net = Sequential::new()
        .add(Conv2d::new(Conv2dConfig::new(1, 4, 3), &dev, &g).unwrap())
        .add(BatchNorm2d::new(4, &dev).unwrap())
        .add(Relu)
        .add(Flatten::new())
        .add(Linear::new(4 * 26 * 26, 10, true, &dev, &g).unwrap())
        .add(BatchNorm1d::new(10, &dev).unwrap());
    assert_eq!(names_and_shapes(&net), expected(BN_NET_STATE));
    let buffers: Vec<String> = net.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        buffers,
        [
            "1.running_mean",
            "1.running_var",
            "1.num_batches_tracked",
            "5.running_mean",
            "5.running_var",
            "5.num_batches_tracked"
        ]
    );
    let tracked = &net.state_dict()[6].1;
    assert_eq!(tracked.dtype(), DType::I64);
}

#[test]
fn load_state_dict_copies_in_place_converting_dtype() {
    let dev = Device::cpu();
    let (a, b) = (mlp(&dev, &Generator::new(1)), mlp(&dev, &Generator::new(2)));
    let x = pat(&[3, 784], 5);
    assert_ne!(values(&a.forward(&x).unwrap()), values(&b.forward(&x).unwrap()));
    // Stored as f64 (as a checkpoint might be); loading converts to the module's f32.
    let as_f64: Vec<(String, Tensor)> = a
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n, t.to_dtype(DType::F64).unwrap()))
        .collect();
    let before = b.parameters()[0].clone();
    b.load_state_dict(&as_f64).unwrap();
    assert_eq!(values(&a.forward(&x).unwrap()), values(&b.forward(&x).unwrap()));
    // In place: the module's tensors (and an optimizer holding them) see the new values.
    assert!(before.same_storage(&b.parameters()[0]));
    assert_eq!(values(&before), values(&a.parameters()[0]));
    assert_eq!(b.parameters()[0].dtype(), DType::F32);
}

#[test]
fn load_state_dict_reports_every_problem_and_writes_nothing() {
    let dev = Device::cpu();
    let model = mlp(&dev, &Generator::new(3));
    let original = values(&model.parameters()[0]);
    let mut state: Vec<(String, Tensor)> = mlp(&dev, &Generator::new(4))
        .state_dict()
        .into_iter()
        .filter(|(n, _)| n != "0.bias")
        .collect();
    state.push(("0.b".into(), Tensor::zeros([512], DType::F32, &dev).unwrap()));
    for (name, t) in state.iter_mut() {
        if name == "4.weight" {
            *t = Tensor::zeros([10, 256], DType::F32, &dev).unwrap();
        }
    }
    let msg = model.load_state_dict(&state).unwrap_err().to_string();
    assert_eq!(
        msg,
        "load_state_dict: missing: 0.bias; unexpected: 0.b; shape mismatch: 4.weight expected [10, 512] got [10, 256]"
    );
    assert_eq!(
        values(&model.parameters()[0]),
        original,
        "a failed load must not write anything"
    );
}

#[test]
fn batchnorm_state_round_trips_including_num_batches_tracked() {
    let dev = Device::cpu();
    let bn = BatchNorm2d::new(3, &dev).unwrap();
    bn.forward(&pat(&[4, 3, 2, 2], 5)).unwrap();
    let fresh = BatchNorm2d::new(3, &dev).unwrap();
    fresh.load_state_dict(&bn.state_dict()).unwrap();
    assert_eq!(fresh.num_batches_tracked.to_vec::<i64>().unwrap(), vec![1]);
    assert_eq!(values(&fresh.running_mean), values(&bn.running_mean));
    assert_eq!(values(&fresh.running_var), values(&bn.running_var));
}
