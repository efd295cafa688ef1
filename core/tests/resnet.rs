//! The ResNets: torchvision's state-dict names, shapes and order (from
//! testdata/resnet18-parity/torchvision_state_dicts.json, written by scripts/resnet_parity.py),
//! parameter counts, both stems' output shapes, and the channels and classes a data set gives.

use lockstep_core::models::{self, Input, ResNetConfig, Stem, resnet};
use lockstep_core::nn::{Module, ModuleExt};
use lockstep_core::{DType, Device, Generator, Tensor};

struct Reference {
    state_dict: Vec<(String, Vec<usize>)>,
    parameters: usize,
}

fn torchvision(name: &str) -> Reference {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/resnet18-parity/torchvision_state_dicts.json"
    );
    let all: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let net = &all[name];
    let state_dict = net["state_dict"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let dims = e[1]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            (e[0].as_str().unwrap().to_string(), dims)
        })
        .collect();
    Reference {
        state_dict,
        parameters: net["parameters"].as_u64().unwrap() as usize,
    }
}

fn state_of(net: &dyn Module) -> Vec<(String, Vec<usize>)> {
    net.state_dict()
        .into_iter()
        .map(|(n, t)| (n, t.dims().to_vec()))
        .collect()
}

#[test]
fn resnets_have_torchvisions_names_shapes_order_and_parameter_counts() {
    let dev = Device::cpu();
    for name in models::resnet::NAMES {
        let net = resnet(ResNetConfig::named(name).unwrap(), &dev, &Generator::new(0)).unwrap();
        let expected = torchvision(name);
        assert_eq!(state_of(&net), expected.state_dict, "{name}");
        assert_eq!(net.num_parameters(), expected.parameters, "{name}");
    }
}

#[test]
fn cifar_resnet18_has_11_173_962_parameters_under_torchvisions_names() {
    let dev = Device::cpu();
    let input = Input {
        image: [3, 32, 32],
        classes: 10,
    };
    let net = models::build_for("resnet18", &[], input, &dev, &Generator::new(0)).unwrap();
    let expected = torchvision("resnet18-cifar10");
    assert_eq!(state_of(&net), expected.state_dict);
    assert_eq!(net.num_parameters(), 11_173_962);
    let text = net.describe();
    assert!(
        text.contains("(conv1): Conv2d(3, 64, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)"),
        "{text}"
    );
    assert!(
        text.contains("(avgpool): AdaptiveAvgPool2d(output_size=(1, 1))"),
        "{text}"
    );
    assert!(!text.contains("maxpool"), "the CIFAR stem has no max-pool:\n{text}");
}

#[test]
fn both_stems_classify_images_and_take_the_data_sets_channels() {
    let dev = Device::cpu();
    let g = Generator::new(1);
    // The CIFAR stem on MNIST-shaped input (1 channel), in evaluation with a single image too.
    let mut mnist = models::build_for("resnet18", &[], Input::MNIST, &dev, &g).unwrap();
    let x = Tensor::rand_normal([2, 1, 28, 28], 0.0, 1.0, DType::F32, &g, &dev).unwrap();
    assert_eq!(mnist.forward(&x).unwrap().dims(), &[2, 10]);
    mnist.eval();
    assert_eq!(mnist.forward(&x.narrow(0, 0, 1).unwrap()).unwrap().dims(), &[1, 10]);
    // ImageNet's stem shrinks 64px by 32 before the pooling; a bottleneck net widens to 2048.
    let config = ResNetConfig::named("resnet50").unwrap().stem(Stem::ImageNet).classes(7);
    let net = resnet(config, &dev, &g).unwrap();
    let x = Tensor::rand_normal([1, 3, 64, 64], 0.0, 1.0, DType::F32, &g, &dev).unwrap();
    assert_eq!(net.forward(&x).unwrap().dims(), &[1, 7]);
    assert!(
        net.describe()
            .contains("(fc): Linear(in_features=2048, out_features=7, bias=True)")
    );
}

#[test]
fn wrong_inputs_are_errors_that_say_what_fits() {
    let dev = Device::cpu();
    let g = Generator::new(2);
    let cifar = Input {
        image: [3, 32, 32],
        classes: 10,
    };
    let err = models::build_for("lenet5", &[], cifar, &dev, &g)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("1x28x28") && err.contains("3x32x32") && err.contains("resnet18"),
        "{err}"
    );
    let err = resnet(ResNetConfig::named("resnet18").unwrap().classes(0), &dev, &g)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("at least 1"), "{err}");
    // Three channels into a one-channel stem: the convolution names both counts.
    let net = models::build_for("resnet18", &[], Input::MNIST, &dev, &g).unwrap();
    let x = Tensor::zeros([1, 3, 28, 28], DType::F32, &dev).unwrap();
    let err = net.forward(&x).err().unwrap().to_string();
    assert!(err.contains("3 channels") && err.contains("in_channels=1"), "{err}");
}

/// `conv_layers` lists every convolution the model has (each 4-d weight of its state dict, in
/// order), with its shape, and the image sizes the stems and strides leave: 32px through the
/// CIFAR stem to 4x4, 224px through ImageNet's stem and max-pool to 56 and then 7.
#[test]
fn conv_layers_are_the_models_convolutions_at_the_sizes_they_see() {
    let dev = Device::cpu();
    for (stem, image, first, last) in [(Stem::Cifar, 32, 32, 4), (Stem::ImageNet, 224, 224, 7)] {
        for name in models::resnet::NAMES {
            let config = ResNetConfig::named(name).unwrap().stem(stem);
            let net = resnet(config, &dev, &Generator::new(0)).unwrap();
            let weights: Vec<(String, Vec<usize>)> =
                state_of(&net).into_iter().filter(|(_, dims)| dims.len() == 4).collect();
            let layers = models::resnet::conv_layers(config, 8, [image, image]);
            let listed: Vec<(String, Vec<usize>)> = layers
                .iter()
                .map(|l| {
                    let g = l.geometry;
                    (format!("{}.weight", l.name), vec![l.out_channels, g.c, g.kh, g.kw])
                })
                .collect();
            assert_eq!(listed, weights, "{name} {stem:?}");
            assert_eq!(layers[0].geometry.h, first);
            let end = layers.last().unwrap().geometry;
            assert_eq!((end.out_h(), end.n), (last, 8), "{name} {stem:?}");
        }
    }
}
