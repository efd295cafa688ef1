//! The built-in models by name: `convnet-bn` builds, maps [N, 1, 28, 28] to [N, 10], and its
//! state dict has the names, shapes and order PyTorch's nn.Sequential of the same layers gives.

use lockstep_core::nn::{Module, ModuleExt};
use lockstep_core::{DType, Device, Generator, Tensor, models};

/// `nn.Sequential(Conv2d(1, 16, 3, padding=1, bias=False), BatchNorm2d(16), ReLU(), MaxPool2d(2),
/// Conv2d(16, 32, 3, padding=1, bias=False), BatchNorm2d(32), ReLU(), MaxPool2d(2), Flatten(),
/// Linear(1568, 10)).state_dict()`.
#[rustfmt::skip]
const CONVNET_BN_STATE: &[(&str, &[usize])] = &[
    ("0.weight", &[16, 1, 3, 3]),
    ("1.weight", &[16]), ("1.bias", &[16]), ("1.running_mean", &[16]), ("1.running_var", &[16]), ("1.num_batches_tracked", &[]),
    ("4.weight", &[32, 16, 3, 3]),
    ("5.weight", &[32]), ("5.bias", &[32]), ("5.running_mean", &[32]), ("5.running_var", &[32]), ("5.num_batches_tracked", &[]),
    ("9.weight", &[10, 1568]), ("9.bias", &[10]),
];

#[test]
fn convnet_bn_is_built_by_name_with_pytorchs_names_and_classifies_images() {
    assert!(models::NAMES.contains(&"convnet-bn"));
    let dev = Device::cpu();
    let mut net = models::build("convnet-bn", &[], &dev, &Generator::new(0)).unwrap();
    let state: Vec<(String, Vec<usize>)> = net
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n, t.dims().to_vec()))
        .collect();
    let expected: Vec<(String, Vec<usize>)> = CONVNET_BN_STATE
        .iter()
        .map(|(n, s)| (n.to_string(), s.to_vec()))
        .collect();
    assert_eq!(state, expected);
    let params: Vec<String> = net.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        params,
        [
            "0.weight", "1.weight", "1.bias", "4.weight", "5.weight", "5.bias", "9.weight", "9.bias"
        ]
    );
    let text = net.describe();
    assert!(text.contains("(1): BatchNorm2d(16, eps=1e-05"), "{text}");
    assert!(
        text.contains("(9): Linear(in_features=1568, out_features=10, bias=True)"),
        "{text}"
    );

    let x = Tensor::rand_normal([3, 1, 28, 28], 0.0, 1.0, DType::F32, &Generator::new(1), &dev).unwrap();
    assert_eq!(net.forward(&x).unwrap().dims(), &[3, 10]);
    net.eval();
    assert_eq!(net.forward(&x.narrow(0, 0, 1).unwrap()).unwrap().dims(), &[1, 10]);
}
