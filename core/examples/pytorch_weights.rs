//! Weights PyTorch wrote, loaded into a Lockstep model built to the same layout, checked against
//! PyTorch's own output, then saved again for PyTorch to read:
//!
//! ```text
//! cargo run -p lockstep-core --example pytorch_weights
//! ```
//!
//! testdata/pytorch-weights/tiny_net.safetensors (written by scripts/pytorch_weights.py) holds
//! the state dict of this PyTorch model, beside an input batch and what the model, in eval mode,
//! computed from it:
//!
//! ```python
//! class TinyNet(nn.Module):
//!     def __init__(self):
//!         super().__init__()
//!         self.encoder = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.GELU())
//!         self.head = nn.Linear(16, 3)
//! ```
//!
//! The example fails unless our output is within 1e-5 of PyTorch's and the file we save loads
//! back into a fresh model that computes exactly the same. PyTorch reads that file with
//! `net.load_state_dict(safetensors.torch.load_file(path))`.

use std::path::Path;

use lockstep_core::nn::{BatchNorm1d, Gelu, Linear, Module, ModuleExt, Sequential};
use lockstep_core::train::checkpoint::load_tensors;
use lockstep_core::{Device, Generator, Result, Tensor, no_grad};

/// The field names and the Sequential's indices make PyTorch's names: `encoder.0.weight`,
/// `encoder.1.running_var`, `head.bias`, …
#[derive(Module)]
struct TinyNet {
    encoder: Sequential,
    head: Linear,
}

impl TinyNet {
    /// Randomly initialised from `seed`, until weights are loaded over it.
    fn new(seed: u64, device: &Device) -> Result<TinyNet> {
        let g = Generator::new(seed);
        Ok(TinyNet {
            encoder: Sequential::new()
                .add(Linear::new(6, 16, true, device, &g)?)
                .add(BatchNorm1d::new(16, device)?)
                .add(Gelu),
            head: Linear::new(16, 3, true, device, &g)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.head.forward(&self.encoder.forward(x)?)
    }
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let from_pytorch = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/pytorch-weights/tiny_net.safetensors"
    ));
    let device = Device::cpu();
    let mut model = TinyNet::new(0, &device)?;

    // `load` is strict, like PyTorch's `load_state_dict`: the file's two extra tensors refuse it.
    match model.load(from_pytorch) {
        Ok(()) => return Err("a strict load took a file with names the model lacks".into()),
        Err(e) => println!("strict load refused, as it should: {e}"),
    }
    // `load_non_strict` takes the names both sides have and reports the rest (`strict=False`).
    let report = model.load_non_strict(from_pytorch)?;
    println!(
        "missing {:?}, unexpected {:?}",
        report.missing_keys, report.unexpected_keys
    );
    if !report.missing_keys.is_empty() || report.unexpected_keys != ["check.input", "check.output"] {
        return Err(format!("not the keys expected: {report:?}").into());
    }

    // PyTorch ran the model in eval mode: BatchNorm normalises with its running statistics.
    model.eval();
    let file = load_tensors(from_pytorch)?;
    let input = file.get("check.input").ok_or("no check.input")?.to_device(&device)?;
    let theirs = file
        .get("check.output")
        .ok_or("no check.output")?
        .to_device(&device)?
        .to_vec::<f32>()?;
    let ours = no_grad(|| model.forward(&input))?.to_vec::<f32>()?;
    let worst = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    println!("largest difference from PyTorch's output: {worst:.2e}");
    if worst > 1e-5 {
        return Err(format!("ours {ours:?}\nPyTorch's {theirs:?}").into());
    }

    // Saved under the same names; a fresh model (another seed) loads it strictly.
    let exported = std::env::temp_dir().join(format!("tiny_net-{}.safetensors", std::process::id()));
    model.save(&exported)?;
    let mut reloaded = TinyNet::new(1, &device)?;
    reloaded.load(&exported)?;
    reloaded.eval();
    let again = no_grad(|| reloaded.forward(&input))?;
    std::fs::remove_file(&exported)?;
    if again.to_vec::<f32>()? != ours {
        return Err("the saved weights did not load back to the same model".into());
    }
    println!("saved and reloaded: the same output, bit for bit");
    Ok(())
}
