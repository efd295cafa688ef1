//! `#[derive(Module)]`: a model written as fields and a forward gets PyTorch's names, state
//! order, train/eval switching, device moves and printing without a hand-written visitor.

use std::sync::Arc;

use lockstep_core::nn::{
    BatchNorm, BatchNorm1d, BatchNorm2d, Conv2d, Conv2dConfig, Dropout, Flatten, Linear, Module, ModuleExt, Relu,
    Sequential,
};
use lockstep_core::{DType, Device, Generator, Result, Tensor};

#[derive(Module)]
struct Block {
    fc: Linear,
    norm: BatchNorm1d,
    act: Relu,
    #[module(skip)]
    width: usize,
}

impl Block {
    fn new(width: usize, generator: &Generator) -> Block {
        let device = Device::cpu();
        Block {
            fc: Linear::new(width, width, true, &device, generator).unwrap(),
            norm: BatchNorm1d::new(width, &device).unwrap(),
            act: Relu,
            width,
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        assert_eq!(x.dims()[1], self.width);
        self.act.forward(&self.norm.forward(&self.fc.forward(x)?)?)
    }
}

#[derive(Module)]
struct Net {
    scale: Tensor,
    #[module(buffer)]
    calls: Tensor,
    blocks: Vec<Block>,
    extra: Option<Linear>,
    absent: Option<Linear>,
    dropout: Dropout,
    #[module(rename = "head")]
    out: Linear,
    #[module(training)]
    training: bool,
}

impl Net {
    fn new() -> Net {
        let (device, g) = (Device::cpu(), Generator::new(7));
        Net {
            scale: Tensor::ones([1], DType::F32, &device).unwrap().requires_grad(true),
            calls: Tensor::zeros([1], DType::F32, &device).unwrap(),
            blocks: vec![Block::new(4, &g), Block::new(4, &g)],
            extra: Some(Linear::new(4, 4, false, &device, &g).unwrap()),
            absent: None,
            dropout: Dropout::new(0.5, Arc::new(Generator::new(1))).unwrap(),
            out: Linear::new(4, 2, true, &device, &g).unwrap(),
            training: true,
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.mul(&self.scale)?;
        for block in &self.blocks {
            h = block.forward(&h)?;
        }
        self.out.forward(&self.dropout.forward(&h)?)
    }
}

fn names(pairs: Vec<(String, Tensor)>) -> Vec<String> {
    pairs.into_iter().map(|(n, _)| n).collect()
}

fn block_state(i: usize) -> Vec<String> {
    [
        "fc.weight",
        "fc.bias",
        "norm.weight",
        "norm.bias",
        "norm.running_mean",
        "norm.running_var",
        "norm.num_batches_tracked",
    ]
    .iter()
    .map(|n| format!("blocks.{i}.{n}"))
    .collect()
}

#[test]
fn fields_become_pytorch_names_in_state_dict_order() {
    let net = Net::new();
    // PyTorch's state_dict: the module's own parameters, its own buffers, then each child.
    let mut expected: Vec<String> = vec!["scale".into(), "calls".into()];
    expected.extend(block_state(0));
    expected.extend(block_state(1));
    expected.extend(["extra.weight".into(), "head.weight".into(), "head.bias".into()]);
    assert_eq!(names(net.state_dict()), expected);
    let parameters = names(net.named_parameters());
    assert_eq!(
        parameters,
        [
            "scale",
            "blocks.0.fc.weight",
            "blocks.0.fc.bias",
            "blocks.0.norm.weight",
            "blocks.0.norm.bias",
            "blocks.1.fc.weight",
            "blocks.1.fc.bias",
            "blocks.1.norm.weight",
            "blocks.1.norm.bias",
            "extra.weight",
            "head.weight",
            "head.bias",
        ]
    );
    assert_eq!(net.parameters().len(), parameters.len());
}

#[test]
fn eval_reaches_every_child_and_the_flag() {
    let mut net = Net::new();
    let x = Tensor::from_vec(
        (0..12).map(|v| v as f32 / 7.0).collect::<Vec<_>>(),
        [3, 4],
        &Device::cpu(),
    )
    .unwrap();
    net.set_training(false);
    assert!(!net.training);
    // Dropout off and BatchNorm on running statistics: two passes agree exactly.
    let a: Vec<f32> = net.forward(&x).unwrap().to_vec().unwrap();
    let b: Vec<f32> = net.forward(&x).unwrap().to_vec().unwrap();
    assert_eq!(a, b);
    net.set_training(true);
    assert!(net.training);
}

#[test]
fn map_tensors_reaches_every_parameter_and_buffer() {
    let mut net = Net::new();
    let mut seen = 0;
    net.map_tensors(&mut |t| {
        seen += 1;
        Ok(t.clone())
    })
    .unwrap();
    assert_eq!(seen, net.state_dict().len());
    net.to_device(&Device::cpu()).unwrap();
}

#[test]
fn the_tree_prints_as_pytorch_prints_it() {
    let text = Block::new(3, &Generator::new(0)).describe();
    assert_eq!(
        text,
        "Block(\n  (fc): Linear(in_features=3, out_features=3, bias=True)\n  (norm): BatchNorm1d(3, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)\n  (act): ReLU()\n)"
    );
    let net = Net::new().describe();
    assert!(
        net.starts_with("Net(\n  (blocks): ModuleList(\n    (0): Block(\n      (fc): Linear("),
        "{net}"
    );
    assert!(
        net.contains("\n  (head): Linear(in_features=4, out_features=2, bias=True)\n)"),
        "{net}"
    );
    assert!(!net.contains("absent"), "{net}");
}

#[test]
fn the_dropouts_stream_is_found_through_the_fields() {
    let net = Net::new();
    let streams = net.generators();
    assert_eq!(streams.len(), 1);
    assert!(Arc::ptr_eq(&streams[0], net.dropout.generator()));
}

/// A conv net as one writes it in PyTorch: the batch norms are fields of their classes' types.
#[derive(Module)]
struct ConvNet {
    conv: Conv2d,
    bn: BatchNorm2d,
    flatten: Flatten,
    fc1: Linear,
    bn_fc: BatchNorm1d,
    fc2: Linear,
}

impl ConvNet {
    /// `fc1_inputs` is what the author computed for the flattened features (2*4*4 = 32 is right).
    fn new(fc1_inputs: usize) -> ConvNet {
        let (device, g) = (Device::cpu(), Generator::new(3));
        ConvNet {
            conv: Conv2d::new(Conv2dConfig::new(1, 2, 3).padding(1), &device, &g).unwrap(),
            bn: BatchNorm2d::new(2, &device).unwrap(),
            flatten: Flatten::new(),
            fc1: Linear::new(fc1_inputs, 8, true, &device, &g).unwrap(),
            bn_fc: BatchNorm1d::new(8, &device).unwrap().momentum(0.2).unwrap(),
            fc2: Linear::new(8, 3, true, &device, &g).unwrap(),
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.bn.forward(&self.conv.forward(x)?)?.relu()?;
        let h = self
            .bn_fc
            .forward(&self.fc1.forward(&self.flatten.forward(&h)?)?)?
            .relu()?;
        self.fc2.forward(&h)
    }
}

fn images(n: usize) -> Tensor {
    let values: Vec<f32> = (0..n * 16).map(|v| (v % 7) as f32 / 7.0).collect();
    Tensor::from_vec(values, [n, 1, 4, 4], &Device::cpu()).unwrap()
}

#[test]
fn batch_norm_classes_are_field_types() {
    let mut net = ConvNet::new(32);
    let names = names(net.state_dict());
    for name in [
        "bn.weight",
        "bn.running_mean",
        "bn.num_batches_tracked",
        "bn_fc.running_var",
    ] {
        assert!(names.contains(&name.to_string()), "{name} in {names:?}");
    }
    assert_eq!(net.forward(&images(4)).unwrap().dims(), &[4, 3]);
    net.set_training(false);
    assert!(!net.bn.is_training() && !net.bn_fc.is_training());
    let text = net.describe();
    assert!(text.contains("(bn): BatchNorm2d(2, eps=1e-05, momentum=0.1"), "{text}");
    assert!(
        text.contains("(bn_fc): BatchNorm1d(8, eps=1e-05, momentum=0.2"),
        "{text}"
    );
    // The general type is still one `.into()` away.
    let _general: BatchNorm = BatchNorm2d::new(2, &Device::cpu()).unwrap().into();
}

#[derive(Module)]
struct Classifier {
    backbone: ConvNet,
}

impl Classifier {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.backbone.forward(x)
    }
}

#[test]
fn a_shape_error_names_the_layer_it_happened_in() {
    // The author reckoned 30 flattened features; the convolution gives 32.
    let net = ConvNet::new(30);
    let msg = Module::forward(&net, &images(4)).unwrap_err().to_string();
    assert!(msg.starts_with("fc1: Linear: shapes [4, 32] and [8, 30]"), "{msg}");
    // Nested: the dotted name down to the layer.
    let classifier = Classifier { backbone: net };
    let msg = Module::forward(&classifier, &images(4)).unwrap_err().to_string();
    assert!(msg.starts_with("backbone.fc1: Linear: shapes [4, 32]"), "{msg}");
    let wide = Tensor::zeros([3, 5], DType::F32, &Device::cpu()).unwrap();
    // A Sequential names its layers by index, a boxed model through its own names.
    let g = Generator::new(0);
    let chain = Sequential::new()
        .add(Linear::new(5, 4, true, &Device::cpu(), &g).unwrap())
        .add(Relu)
        .add(Linear::new(3, 2, true, &Device::cpu(), &g).unwrap());
    let msg = chain.forward(&wide).unwrap_err().to_string();
    assert!(msg.starts_with("2: Linear: shapes [3, 4] and [2, 3]"), "{msg}");
    let boxed: Box<dyn Module> = Box::new(ConvNet::new(30));
    let msg = boxed.forward(&images(2)).unwrap_err().to_string();
    assert!(msg.starts_with("fc1: Linear:"), "{msg}");
    // A layer on its own says what it is, as before.
    let msg = Linear::new(4, 2, true, &Device::cpu(), &g)
        .unwrap()
        .forward(&wide)
        .unwrap_err()
        .to_string();
    assert!(msg.starts_with("Linear: shapes [3, 5]"), "{msg}");
}
