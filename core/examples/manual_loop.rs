//! A training loop written by hand, as in PyTorch, with no Trainer: forward, loss, backward,
//! optimizer step; then an evaluation pass in eval mode without the autograd graph:
//!
//! ```text
//! cargo run -p lockstep-core --example manual_loop -- [MNIST_DIR]
//! ```
//!
//! MNIST_DIR holds MNIST's four IDX files, gzipped or not (default: the repository's subset,
//! testdata/mnist-subset: 2,000 training and 500 test images). A two-layer perceptron trains
//! for four epochs, its learning rate halved after each; the example fails unless it then
//! labels at least 85% of the test images correctly, which CI checks.

use std::path::PathBuf;
use std::sync::Arc;

use lockstep_core::data::mnist::{Mnist, Split};
use lockstep_core::data::{DataLoader, DataLoaderConfig};
use lockstep_core::nn::{Flatten, Linear, Module, ModuleExt, Relu, Sequential};
use lockstep_core::optim::{Optimizer, Sgd, SgdConfig};
use lockstep_core::{DType, Device, Generator, Result, no_grad};

const EPOCHS: u64 = 4;

/// Mean loss and accuracy over `loader`: no graph is recorded, so nothing is kept for backward.
fn evaluate(model: &Sequential, loader: &DataLoader, device: &Device) -> Result<(f64, f64)> {
    no_grad(|| {
        let (mut loss_sum, mut correct, mut seen) = (0.0, 0.0, 0usize);
        for batch in loader.iter(0) {
            let fields = batch?.to_device(device)?;
            let (images, labels) = (&fields[0], &fields[1]);
            let logits = model.forward(images)?;
            let n = labels.elem_count();
            loss_sum += logits.cross_entropy(labels)?.item()? * n as f64;
            let hits = logits.argmax(-1, false)?.eq(labels)?.to_dtype(DType::F32)?;
            correct += hits.sum_all()?.item()?;
            seen += n;
        }
        Ok((loss_sum / seen as f64, correct / seen as f64))
    })
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/mnist-subset")),
        PathBuf::from,
    );
    let device = Device::cpu();
    let config = DataLoaderConfig {
        batch_size: 64,
        ..Default::default()
    };
    let train = DataLoader::simple(Arc::new(Mnist::load(&dir, Split::Train)?), true, 0, config.clone())?;
    let test = DataLoader::simple(Arc::new(Mnist::load(&dir, Split::Test)?), false, 0, config)?;

    let g = Generator::new(0);
    let mut model = Sequential::new()
        .add(Flatten::new())
        .add(Linear::new(28 * 28, 128, true, &device, &g)?)
        .add(Relu)
        .add(Linear::new(128, 10, true, &device, &g)?);
    let mut optimizer = Sgd::new(model.parameters(), SgdConfig::new(0.05).momentum(0.9))?;

    let (loss, mut accuracy) = evaluate(&model, &test, &device)?;
    println!("before training: test loss {loss:.3}, accuracy {accuracy:.3}");
    for epoch in 0..EPOCHS {
        // Modes matter to Dropout and BatchNorm; this model has neither, but the habit is cheap.
        model.train();
        let mut running = 0.0;
        for (i, batch) in train.iter(epoch).enumerate() {
            let fields = batch?.to_device(&device)?;
            let loss = model.forward(&fields[0])?.cross_entropy(&fields[1])?;
            optimizer.zero_grad();
            loss.backward()?;
            optimizer.step()?;
            running += loss.item()?;
            if (i + 1) % 10 == 0 {
                println!("epoch {epoch} batch {:3}: loss {:.3}", i + 1, running / 10.0);
                running = 0.0;
            }
        }
        optimizer.set_lr(optimizer.lr() * 0.5);
        model.eval();
        let (loss, epoch_accuracy) = evaluate(&model, &test, &device)?;
        println!("after epoch {epoch}: test loss {loss:.3}, accuracy {epoch_accuracy:.3}");
        accuracy = epoch_accuracy;
    }
    if accuracy < 0.85 {
        return Err(format!("test accuracy {accuracy:.3}, short of 0.85").into());
    }
    Ok(())
}
