//! A ResNet-18 trained on a folder of images with the Trainer, its weights then saved under
//! torchvision's names so PyTorch loads them:
//!
//! ```text
//! cargo run --release -p lockstep-core --example resnet_folder -- [DIR] [OUT.safetensors]
//! ```
//!
//! DIR holds one subdirectory of PNG or JPEG images per class (torchvision's ImageFolder
//! layout). Without it the example draws a small folder of its own (two classes, red and blue),
//! trains 30 steps and fails unless the training loss falls by half, which CI checks. In PyTorch:
//!
//! ```python
//! net = torchvision.models.resnet18(num_classes=CLASSES)
//! net.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False); net.maxpool = torch.nn.Identity()
//! net.load_state_dict(safetensors.torch.load_file("OUT.safetensors"))
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use lockstep_core::data::augment::{Augment, Normalize};
use lockstep_core::data::image_folder::{IMAGENET_MEAN_STD, ImageFolder};
use lockstep_core::data::{DataLoader, DataLoaderConfig, ImageClassification};
use lockstep_core::models::{ResNetConfig, Stem, resnet};
use lockstep_core::nn::ModuleExt;
use lockstep_core::optim::{CosineAnnealingLR, DecayScope, Sgd, SgdConfig};
use lockstep_core::train::checkpoint::save_tensors;
use lockstep_core::train::{Event, Record, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator};

const IMAGE: usize = 32;
const STEPS: u64 = 30;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (dir, demo) = match args.next() {
        Some(dir) => (PathBuf::from(dir), false),
        None => (demo_folder()?, true),
    };
    let out = args
        .next()
        .map_or_else(|| std::env::temp_dir().join("resnet18.safetensors"), PathBuf::from);

    // The data: every image resized to 32x32, cropped and flipped at random while training.
    let (images, warnings) = ImageFolder::open(&dir, IMAGE, false)?;
    warnings.iter().for_each(|w| eprintln!("warning: {w}"));
    let classes = images.class_names().to_vec();
    let (mean, std) = IMAGENET_MEAN_STD;
    let augment = Augment {
        crop_padding: Some(IMAGE / 8),
        horizontal_flip: true,
    };
    let data = ImageClassification::new(Arc::new(images), augment, Normalize::new(&mean, &std), 0)?;
    let loader_config = DataLoaderConfig {
        batch_size: 16,
        num_workers: 2,
        ..Default::default()
    };
    let train = DataLoader::simple(Arc::new(data), true, 0, loader_config)?;

    // The model and its recipe: SGD with momentum, weight decay on weights only, cosine rate.
    let config = ResNetConfig::named("resnet18")
        .expect("a built-in ResNet")
        .stem(Stem::Cifar)
        .classes(classes.len());
    let model = resnet(config, &Device::cpu(), &Generator::new(0))?;
    let sgd = SgdConfig::new(0.02)
        .momentum(0.9)
        .weight_decay(5e-4)
        .decay_scope(DecayScope::Weights);
    let optimizer = Sgd::new(model.parameters(), sgd)?;
    let mut setup = TrainingSetup::new(model, optimizer)
        .schedule(CosineAnnealingLR::new(STEPS, 0.0)?)
        .name("resnet18");

    let mut trainer = Trainer::new(TrainerConfig {
        max_epochs: u64::MAX,
        max_steps: Some(STEPS),
        log_every_n_steps: 1,
        ..Default::default()
    })?;
    let losses = Arc::new(Mutex::new(Vec::new()));
    let heard = losses.clone();
    trainer.add_listener(move |r: &Record| {
        if let Event::Step { loss, .. } = &r.event {
            heard.lock().expect("the loss list").push(*loss);
        }
        Ok(())
    });
    let report = trainer.fit(&mut setup, &train, None)?;

    // Weights only, under torchvision's names, with the class names beside them.
    let metadata = BTreeMap::from([("classes".to_string(), classes.join(","))]);
    save_tensors(&out, &setup.model.state_dict(), metadata)?;
    let losses = losses.lock().expect("the loss list").clone();
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len().max(1) as f64;
    let (first, last) = (
        mean(&losses[..5.min(losses.len())]),
        mean(&losses[losses.len().saturating_sub(5)..]),
    );
    println!(
        "{} steps on {} classes: loss {first:.3} -> {last:.3}; weights in {}",
        report.steps,
        classes.len(),
        out.display()
    );
    if demo {
        std::fs::remove_dir_all(&dir)?;
        if last >= 0.5 * first {
            return Err(format!("the training loss did not halve: {losses:?}").into());
        }
    }
    Ok(())
}

/// Two classes of 32x32 PNGs, reddish and bluish with a grain, in a scratch folder.
fn demo_folder() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("lockstep-resnet-folder-{}", std::process::id()));
    for (class, base) in [("blue", [30u32, 40, 200]), ("red", [200u32, 40, 30])] {
        write_class(&dir.join(class), base)?;
    }
    Ok(dir)
}

fn write_class(dir: &Path, base: [u32; 3]) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    for i in 0..48u32 {
        let image = image::RgbImage::from_fn(IMAGE as u32, IMAGE as u32, |x, y| {
            let grain = (x * 7 + y * 13 + i * 29) % 56;
            image::Rgb(base.map(|c| (c + grain).min(255) as u8))
        });
        image.save(dir.join(format!("{i:02}.png")))?;
    }
    Ok(())
}
