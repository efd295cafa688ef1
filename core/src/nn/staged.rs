//! A layer sequence split into stages, each on its own device: the model of model-parallel and
//! pipeline training. Called directly it runs stage after stage, moving the activations
//! between devices (naive model parallel, also how it evaluates); a pipeline strategy runs the
//! stages at once on micro-batches. Tensors keep the whole model's names, so a checkpoint loads
//! on one device or on another placement, and `to_device` gathers the stages onto one device.

use std::sync::Arc;

use super::module::{Module, ModuleExt};
use super::sequential::Sequential;
use super::tie::{TiedWeight, untie};
use crate::backend::Communicator;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensor::Tensor;

/// A [`Sequential`] cut into consecutive stages, each on its own device (model-parallel and pipeline training).
/// Calling it runs stage after stage and returns the output on the input's device.
pub struct StagedModel {
    stages: Vec<Sequential>,
    devices: Vec<Device>,
    /// Weights two stages hold a copy each, whose gradients the pipeline sums.
    ties: Vec<TiedWeight>,
}

impl StagedModel {
    /// Stages (the parts of a `Sequential::split`) with the device each one's tensors live on.
    pub fn new(stages: Vec<(Sequential, Device)>) -> Result<StagedModel> {
        if stages.is_empty() {
            return Err(Error::invalid("StagedModel", "a staged model needs at least one stage"));
        }
        for (i, (stage, device)) in stages.iter().enumerate() {
            if let Some((name, t)) = stage.state_dict().into_iter().find(|(_, t)| t.device() != device) {
                return Err(Error::invalid(
                    "StagedModel",
                    format!(
                        "stage {i} is placed on {device} but its tensor {name} is on {}",
                        t.device()
                    ),
                ));
            }
        }
        let (stages, devices) = stages.into_iter().unzip();
        Ok(StagedModel {
            stages,
            devices,
            ties: Vec::new(),
        })
    }

    /// `model` cut into `sizes[i]` consecutive layers, each part moved to `devices[i]` (as
    /// PyTorch's `encoder.to(dev0)`, `decoder.to(dev1)`); build the optimizer afterwards.
    pub fn split(model: Sequential, sizes: &[usize], devices: &[Device]) -> Result<StagedModel> {
        if sizes.len() != devices.len() {
            return Err(Error::invalid(
                "StagedModel::split",
                format!("{} stage sizes for {} devices", sizes.len(), devices.len()),
            ));
        }
        let mut parts = model.split(sizes)?;
        let ties = untie(&mut parts)?;
        let mut stages = Vec::with_capacity(sizes.len());
        for (mut part, device) in parts.into_iter().zip(devices) {
            part.to_device(device)?;
            stages.push((part, device.clone()));
        }
        Ok(StagedModel {
            ties,
            ..StagedModel::new(stages)?
        })
    }

    /// `split` of the model `build` makes in host memory (so no device ever holds all of it).
    pub fn place<E: From<Error>>(
        sizes: &[usize],
        devices: &[Device],
        build: impl FnOnce(&Device) -> std::result::Result<Sequential, E>,
    ) -> std::result::Result<StagedModel, E> {
        Ok(StagedModel::split(build(&Device::cpu())?, sizes, devices)?)
    }

    /// Stage `stage` alone of the model `build` makes in host memory, cut into `sizes`, on
    /// `device`: a pipeline whose stages are processes holds one stage in each, its layers
    /// named as in the whole model (so each stage's checkpoint names what it holds).
    pub fn place_one<E: From<Error>>(
        sizes: &[usize],
        stage: usize,
        device: &Device,
        build: impl FnOnce(&Device) -> std::result::Result<Sequential, E>,
    ) -> std::result::Result<StagedModel, E> {
        let mut parts = build(&Device::cpu())?.split(sizes)?;
        let ties = untie(&mut parts)?;
        if stage >= parts.len() {
            return Err(Error::invalid(
                "StagedModel::place_one",
                format!("stage {stage} of a model cut into {} stages", parts.len()),
            )
            .into());
        }
        let mut part = parts.swap_remove(stage);
        part.to_device(device)?;
        Ok(StagedModel {
            ties: ties.into_iter().filter(|t| t.name_in(stage).is_some()).collect(),
            ..StagedModel::new(vec![(part, device.clone())])?
        })
    }

    /// The stages in order; each names its layers by their index in the whole model.
    pub fn stages(&self) -> &[Sequential] {
        &self.stages
    }

    /// The device each stage's tensors live on, parallel to [`StagedModel::stages`].
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The weights two stages hold a copy each (the stages counted in the whole pipeline; with
    /// `place_one`, those this stage takes part in).
    pub fn ties(&self) -> &[TiedWeight] {
        &self.ties
    }
}

/// How many consecutive layers of `model` each of `stages` stages gets so that their parameter
/// counts are as even as layer boundaries allow (a layer without parameters stays with the
/// layer before it); every stage gets at least one layer.
pub fn sizes_by_parameters(model: &Sequential, stages: usize) -> Result<Vec<usize>> {
    let costs: Vec<f64> = model.layers().iter().map(|l| l.num_parameters() as f64).collect();
    sizes_by_cost(&costs, stages)
}

/// How many consecutive layers each of `stages` stages gets so that the sums of `costs` (one
/// per layer: parameters, or measured seconds) are as even as layer boundaries allow; a tie
/// keeps a layer with the one before it, and every stage gets at least one layer.
pub fn sizes_by_cost(costs: &[f64], stages: usize) -> Result<Vec<usize>> {
    let layers = costs.len();
    if stages == 0 || stages > layers {
        return Err(Error::invalid(
            "pipeline stages",
            format!("{stages} stages for a model of {layers} layers: use 1 to {layers} stages"),
        ));
    }
    let mut cumulative = Vec::with_capacity(layers);
    let mut total = 0.0;
    for &cost in costs {
        total += cost;
        cumulative.push(total);
    }
    // Stage k ends after the last layer whose running count is nearest k/P of the total,
    // leaving at least one layer for each stage after it.
    let mut ends = Vec::with_capacity(stages);
    let mut start = 0usize;
    for k in 1..stages {
        let target = total * k as f64 / stages as f64;
        let last_allowed = layers - (stages - k);
        let end = (start + 1..=last_allowed)
            .min_by(|&a, &b| {
                let da = (cumulative[a - 1] - target).abs();
                let db = (cumulative[b - 1] - target).abs();
                da.total_cmp(&db).then(b.cmp(&a))
            })
            .unwrap_or(start + 1);
        ends.push(end);
        start = end;
    }
    ends.push(layers);
    let mut previous = 0;
    Ok(ends
        .into_iter()
        .map(|end| {
            let size = end - previous;
            previous = end;
            size
        })
        .collect())
}

/// Each layer's forward and backward time on `sample` (the best of three after a warm-up),
/// layer by layer on the sample's device: the costs for `sizes_by_cost`.
pub fn layer_times(model: &Sequential, sample: &Tensor) -> Result<Vec<f64>> {
    let mut times = vec![f64::INFINITY; model.len()];
    for round in 0..4 {
        let mut h = sample.clone();
        for (layer, best) in model.layers().iter().zip(&mut times) {
            let x = if h.dtype().is_float() {
                h.detach().requires_grad(true)
            } else {
                h.detach()
            };
            let started = std::time::Instant::now();
            let y = layer.forward(&x)?;
            if y.tracks_grad() {
                y.sum_all()?.backward()?;
            }
            y.device().synchronize()?;
            if round > 0 {
                *best = best.min(started.elapsed().as_secs_f64());
            }
            h = y.detach();
        }
    }
    model.layers().iter().for_each(|l| l.zero_grad());
    Ok(times)
}

impl Module for StagedModel {
    /// Stage after stage; the output comes back to the input's device, where the targets are.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (stage, device) in self.stages.iter().zip(&self.devices) {
            h = stage.forward(&h.to_device(device)?)?;
        }
        h.to_device(x.device())
    }
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.stages.iter().for_each(|s| s.visit_parameters(prefix, f));
    }
    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.stages.iter().for_each(|s| s.visit_buffers(prefix, f));
    }
    fn visit_state(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.stages.iter().for_each(|s| s.visit_state(prefix, f));
    }
    fn set_training(&mut self, training: bool) {
        self.stages.iter_mut().for_each(|s| s.set_training(training));
    }
    fn visit_generators(&self, f: &mut dyn FnMut(&Arc<Generator>)) {
        self.stages.iter().for_each(|s| s.visit_generators(f));
    }
    /// Every stage's tensors; each stage's device becomes where its tensors went.
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        for (stage, device) in self.stages.iter_mut().zip(&mut self.devices) {
            stage.map_tensors(f)?;
            if let Some((_, t)) = stage.state_dict().first() {
                *device = t.device().clone();
            }
        }
        Ok(())
    }
    fn convert_sync_batchnorm(&mut self, comm: &Arc<dyn Communicator>) {
        self.stages.iter_mut().for_each(|s| s.convert_sync_batchnorm(comm));
    }
    fn describe(&self) -> String {
        let body: Vec<String> = self
            .stages
            .iter()
            .zip(&self.devices)
            .enumerate()
            .map(|(i, (s, d))| format!("stage {i} on {d}: {}", s.describe()))
            .collect();
        body.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::nn::{Linear, Relu};
    use crate::rng::Generator;

    fn mlp(widths: &[usize]) -> Sequential {
        let (device, init) = (Device::cpu(), Generator::new(0));
        let mut model = Sequential::new();
        for w in widths.windows(2) {
            model = model
                .add(Linear::new(w[0], w[1], false, &device, &init).unwrap())
                .add(Relu);
        }
        model
    }

    #[test]
    fn stages_get_even_parameter_counts_and_activations_stay_with_their_layer() {
        // Four equal layers (each with its ReLU) over two stages: two and two.
        let model = mlp(&[8, 8, 8, 8, 8]);
        assert_eq!(sizes_by_parameters(&model, 2).unwrap(), vec![4, 4]);
        assert_eq!(sizes_by_parameters(&model, 4).unwrap(), vec![2, 2, 2, 2]);
        // One large layer first: it gets a stage of its own.
        let lopsided = mlp(&[64, 64, 4, 4, 4]);
        assert_eq!(sizes_by_parameters(&lopsided, 2).unwrap(), vec![2, 6]);
        // As many stages as layers, and too many.
        assert_eq!(sizes_by_parameters(&model, 8).unwrap(), vec![1; 8]);
        let err = sizes_by_parameters(&model, 9).unwrap_err().to_string();
        assert!(err.contains("use 1 to 8 stages"), "{err}");
    }

    #[test]
    fn stages_by_cost_follow_the_costs() {
        assert_eq!(sizes_by_cost(&[1.0, 1.0, 1.0, 1.0, 10.0], 2).unwrap(), vec![4, 1]);
        assert_eq!(sizes_by_cost(&[10.0, 1.0, 1.0, 1.0, 1.0], 2).unwrap(), vec![1, 4]);
        assert_eq!(sizes_by_cost(&[3.0, 0.0, 3.0, 0.0], 2).unwrap(), vec![2, 2]);
    }

    #[test]
    fn measured_layer_times_rank_a_wide_product_above_an_activation() {
        let model = mlp(&[64, 512, 512]);
        let x = Tensor::rand_uniform([256, 64], -1.0, 1.0, DType::F32, &Generator::new(1), &Device::cpu()).unwrap();
        let times = layer_times(&model, &x).unwrap();
        assert_eq!(times.len(), 4);
        assert!(times.iter().all(|t| t.is_finite() && *t > 0.0), "{times:?}");
        // Linear 512x512 against the ReLU after it and against Linear 64x512 (8x fewer products).
        assert!(times[2] > times[3] && times[2] > times[0], "{times:?}");
        assert!(
            model.parameters().iter().all(|p| p.grad().is_none()),
            "timing leaves no gradients"
        );
    }
}
