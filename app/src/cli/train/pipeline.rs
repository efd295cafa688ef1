//! `--pipeline-stages` and `--split`: which layers of the model go on which device, and the
//! model and strategy of a pipelined run (one pipeline, or data-parallel replicas of one).

use std::sync::Arc;

use anyhow::Context;
use lockstep_core::Device;
use lockstep_core::backend::Communicator;
use lockstep_core::data::Dataset;
use lockstep_core::distributed::Reducer;
use lockstep_core::nn::{ModuleExt, StagedModel, layer_times, sizes_by_cost, sizes_by_parameters};
use lockstep_core::train::pipeline::Pipeline;
use lockstep_core::train::{Hybrid, TrainingSetup};

use super::setup;
use lockstep_flags::train::{Args, StageBalance};

/// Consecutive layers per stage, and each replica's device for each stage.
#[derive(Clone, Debug, PartialEq)]
pub struct StagePlan {
    pub sizes: Vec<usize>,
    /// `replicas[r][s]`: replica r's device of stage s (one replica without data parallel).
    pub replicas: Vec<Vec<Device>>,
}

impl StagePlan {
    /// The stages the flags ask for; None for a run without a pipeline. `train_set` gives
    /// the micro-batch that `--balance-stages time` measures layers on.
    pub fn from_args(args: &Args, train_set: &dyn Dataset) -> anyhow::Result<Option<StagePlan>> {
        if let Some(spec) = &args.split {
            return parse_split(spec).map(Some);
        }
        if let Some(spec) = &args.place {
            return parse_place(spec, &args.model).map(Some);
        }
        let Some(stages) = args.pipeline_stages else {
            return Ok(None);
        };
        // Stage-major, as `--place encoder=cuda:0..3,decoder=cuda:4..7` reads: stage s of
        // replica r is device s * replicas + r.
        let devices = setup::devices(args)?;
        let replicas = devices.len() / stages;
        let sizes = match args.balance_stages {
            // Parameter counts do not depend on the device.
            StageBalance::Params => sizes_by_parameters(&setup::build_sequential(args, &Device::cpu())?, stages)?,
            StageBalance::Time => {
                let device = &devices[0];
                let rows = (args.batch_size / args.micro_batches).max(1).min(train_set.len());
                let sample = train_set.get_batch(&(0..rows).collect::<Vec<_>>())?.to_device(device)?;
                let times = layer_times(&setup::build_sequential(args, device)?, &sample[0])?;
                sizes_by_cost(&times, stages)?
            }
        };
        Ok(Some(StagePlan {
            sizes,
            replicas: (0..replicas)
                .map(|r| (0..stages).map(|s| devices[s * replicas + r].clone()).collect())
                .collect(),
        }))
    }

    /// Replica `r`'s pipeline alone.
    pub fn replica(&self, r: usize) -> StagePlan {
        StagePlan {
            sizes: self.sizes.clone(),
            replicas: vec![self.replicas[r].clone()],
        }
    }

    /// Every replica's device of stage `s`.
    pub fn stage_devices(&self, s: usize) -> Vec<Device> {
        self.replicas.iter().map(|r| r[s].clone()).collect()
    }

    /// The first replica's stage devices.
    fn devices(&self) -> &[Device] {
        &self.replicas[0]
    }

    /// The model split into these stages (the same weights as on one device), with the
    /// optimizer and task of the flags; batches are loaded onto the first stage's device.
    pub fn setup(&self, args: &Args) -> anyhow::Result<TrainingSetup> {
        let model = StagedModel::place(&self.sizes, self.devices(), |d| setup::build_sequential(args, d))
            .with_context(|| format!("cannot place the model's stages ({:?} layers)", self.sizes))?;
        let mut setup = setup::build_with(args, Box::new(model), self.devices()[0].clone())?;
        setup.hparams.extend(setup::model_hparams(args)?);
        setup.hparams.extend(hparams(args, &self.sizes));
        Ok(setup)
    }

    /// The schedule of the flags; CPU stages share out the compute threads, as separate
    /// devices would each compute on their own.
    pub fn strategy(&self, args: &Args) -> Pipeline {
        Pipeline::new(args.schedule, args.micro_batches)
            .with_cpu_threads_per_stage((args.threads / self.devices().len()).max(1))
    }

    /// This replica's pipeline with each stage's gradients averaged over `comms[s]` (every
    /// replica's device of stage s).
    pub fn hybrid(
        &self,
        args: &Args,
        setup: &TrainingSetup,
        comms: Vec<Box<dyn Communicator>>,
    ) -> anyhow::Result<Hybrid> {
        let model = setup
            .model
            .as_ref()
            .as_any()
            .downcast_ref::<StagedModel>()
            .context("a pipeline replica's model is staged")?;
        let reducers = model
            .stages()
            .iter()
            .zip(comms)
            .map(|(stage, comm)| Reducer::new(&stage.parameters(), Arc::from(comm), args.reducer_config()))
            .collect::<lockstep_core::Result<Vec<_>>>()?;
        Ok(Hybrid::new(self.strategy(args), reducers))
    }

    /// Every device, stage by stage (as --devices lists them), as the summary names them.
    pub fn describe(&self) -> String {
        let names: Vec<String> = (0..self.sizes.len())
            .flat_map(|s| self.stage_devices(s))
            .map(|d| d.location().to_string())
            .collect();
        names.join(",")
    }
}

/// What a checkpoint records of a pipeline: its stages' layer counts and its schedule.
fn hparams(args: &Args, sizes: &[usize]) -> [(String, String); 3] {
    let layers = sizes.iter().map(usize::to_string).collect::<Vec<_>>().join("+");
    [
        ("pipeline_layers".to_string(), layers),
        ("micro_batches".to_string(), args.micro_batches.to_string()),
        ("schedule".to_string(), args.schedule.name().to_string()),
    ]
}

/// Stage `stage` of `stages`, one per process of a launched job, on `device`: the layers
/// balanced by parameter count (as in one process), this stage's alone built.
pub fn process_stage_setup(args: &Args, stage: usize, stages: usize, device: &Device) -> anyhow::Result<TrainingSetup> {
    let sizes = sizes_by_parameters(&setup::build_sequential(args, &Device::cpu())?, stages)?;
    let model = StagedModel::place_one(&sizes, stage, device, |d| setup::build_sequential(args, d))
        .with_context(|| format!("cannot place stage {stage} of the model ({sizes:?} layers)"))?;
    let mut setup = setup::build_with(args, Box::new(model), device.clone())?;
    setup.hparams.extend(setup::model_hparams(args)?);
    setup.hparams.extend(hparams(args, &sizes));
    Ok(setup)
}

/// The named parts of a model, in layer order, and their layer counts.
fn parts(model: &str) -> Option<&'static [(&'static str, usize)]> {
    match model {
        "seq2seq" => Some(&[("encoder", 1), ("decoder", 1)]),
        _ => None,
    }
}

/// `encoder=cpu:0,decoder=cpu:1`, or ranges (`encoder=cuda:0..3,decoder=cuda:4..7`: four
/// replicas of the pair); every part named once, each with as many devices.
fn parse_place(spec: &str, model: &str) -> anyhow::Result<StagePlan> {
    let parts = parts(model).with_context(|| {
        format!("--place names the parts of seq2seq (encoder, decoder); for --model {model} use --split or --pipeline-stages")
    })?;
    let mut given: Vec<(&str, Vec<Device>)> = Vec::new();
    for item in spec.split(',').map(str::trim) {
        let (name, devices) = item
            .split_once('=')
            .with_context(|| format!("--place part `{item}` is not PART=DEVICES (e.g. encoder=cpu:0)"))?;
        given.push((name.trim(), device_range(devices.trim())?));
    }
    let names: Vec<&str> = parts.iter().map(|(n, _)| *n).collect();
    let mut stages = Vec::new();
    for name in &names {
        let devices = given
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d.clone())
            .with_context(|| {
                format!(
                    "--place does not say where the {name} goes (parts: {})",
                    names.join(", ")
                )
            })?;
        stages.push(devices);
    }
    if let Some((unknown, _)) = given.iter().find(|(n, _)| !names.contains(n)) {
        anyhow::bail!(
            "--place names `{unknown}`, which {model} does not have (parts: {})",
            names.join(", ")
        );
    }
    let replicas = stages[0].len();
    anyhow::ensure!(
        stages.iter().all(|d| d.len() == replicas),
        "--place gives the parts different numbers of devices; give each part one device per replica"
    );
    Ok(StagePlan {
        sizes: parts.iter().map(|(_, n)| *n).collect(),
        replicas: (0..replicas)
            .map(|r| stages.iter().map(|d| d[r].clone()).collect())
            .collect(),
    })
}

/// `cpu:0` or `cuda:0..3` (0 to 3 inclusive).
fn device_range(spec: &str) -> anyhow::Result<Vec<Device>> {
    let Some((first, last)) = spec.split_once("..") else {
        return Ok(vec![Device::parse(spec)?]);
    };
    let (kind, start) = first
        .rsplit_once(':')
        .with_context(|| format!("`{spec}` is not a device range like cuda:0..3"))?;
    let (start, end): (usize, usize) = (
        start
            .parse()
            .with_context(|| format!("`{spec}`: {start} is not an index"))?,
        last.parse()
            .with_context(|| format!("`{spec}`: {last} is not an index"))?,
    );
    anyhow::ensure!(end >= start, "`{spec}`: the range ends before it starts");
    (start..=end)
        .map(|i| Ok(Device::parse(&format!("{kind}:{i}"))?))
        .collect()
}

/// `0-5@cpu:0,6-11@cpu:1`: each stage's first and last layer (a single index for one layer)
/// and its device; the ranges must follow each other from layer 0.
fn parse_split(spec: &str) -> anyhow::Result<StagePlan> {
    let (mut sizes, mut devices) = (Vec::new(), Vec::new());
    let mut next = 0usize;
    for part in spec.split(',').map(str::trim) {
        let bad = || format!("--split part `{part}` is not FIRST-LAST@DEVICE (e.g. 0-5@cpu:0)");
        let (range, device) = part.split_once('@').with_context(bad)?;
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        let (first, last): (usize, usize) = (
            first.trim().parse().with_context(bad)?,
            last.trim().parse().with_context(bad)?,
        );
        anyhow::ensure!(
            first == next && last >= first,
            "--split part `{part}` must cover layers {next}-… (each stage starts where the one before ended)"
        );
        sizes.push(last - first + 1);
        devices.push(Device::parse(device.trim())?);
        next = last + 1;
    }
    Ok(StagePlan {
        sizes,
        replicas: vec![devices],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_names_consecutive_ranges_and_devices() {
        let plan = parse_split("0-5@cpu:0, 6-10@cpu:1,11@cpu:0").unwrap();
        assert_eq!(plan.sizes, vec![6, 5, 1]);
        assert_eq!(plan.describe(), "cpu:0,cpu:1,cpu:0");
        let gap = parse_split("0-5@cpu:0,7-11@cpu:1").unwrap_err().to_string();
        assert!(gap.contains("must cover layers 6-"), "{gap}");
        let bad = parse_split("0-5cpu:0").unwrap_err().to_string();
        assert!(bad.contains("not FIRST-LAST@DEVICE"), "{bad}");
        assert!(parse_split("0-3@tpu:0").is_err());
    }

    #[test]
    fn a_placement_names_the_parts_and_ranges_make_replicas() {
        let plan = parse_place("decoder=cpu:1, encoder=cpu:0", "seq2seq").unwrap();
        assert_eq!(plan.sizes, vec![1, 1]);
        assert_eq!(plan.describe(), "cpu:0,cpu:1");
        let plan = parse_place("encoder=cpu:0..1,decoder=cpu:2..3", "seq2seq").unwrap();
        assert_eq!(plan.replicas.len(), 2);
        assert_eq!(plan.describe(), "cpu:0,cpu:1,cpu:2,cpu:3");
        let err = |spec: &str, model: &str| parse_place(spec, model).unwrap_err().to_string();
        assert!(err("encoder=cpu:0", "seq2seq").contains("where the decoder goes"));
        assert!(err("encoder=cpu:0,decoder=cpu:1,head=cpu:2", "seq2seq").contains("`head`"));
        assert!(err("encoder=cpu:0..1,decoder=cpu:2", "seq2seq").contains("different numbers"));
        assert!(err("encoder=cpu:0,decoder=cpu:1", "mlp").contains("use --split"));
    }
}
