//! `lockstep bench`: GEMM GFLOP/s and MLP training throughput on one device, optionally beside
//! PyTorch in the same run, with the ratio ours / PyTorch.

mod ddp;
mod gemm;
mod gpt;
mod gpu;
mod loader;
mod machine;
mod mlp;
mod peer;
mod pipeline;
mod plan;
mod report;
mod resnet;
mod rounds;
mod steps;
mod timing;
mod zero;

use anyhow::Context;
use lockstep_core::distributed::ReducerConfig;
use lockstep_core::{DType, Device};

pub use lockstep_flags::bench::{Args, Peer, Which};

use self::plan::{GEMM_TIMING, MlpPlan, Plan};
use self::report::{Busy, Report, Results};
use super::threads;

const MLP_BATCH: usize = 128;
const PIPELINE_BATCH: usize = 2048;
/// nanoGPT's shakespeare-char batch, of `bench gpt` and `bench zero`.
const GPT_BATCH: usize = 16;

pub fn run(args: Args) -> anyhow::Result<()> {
    let threads = usize::from(args.threads);
    // Before any tensor exists: the pool can be sized only once.
    threads::init(threads)?;
    let device = Device::parse(&args.device)?;
    if args.kernels > 0 {
        anyhow::ensure!(
            matches!(args.which, Which::Resnet | Which::Gpt),
            "--kernels profiles the steps of `bench resnet` and `bench gpt`"
        );
        // Refused before any measuring where the device cannot time kernels.
        let backend = device.backend();
        backend
            .profile_kernels(true)
            .and_then(|()| backend.profile_kernels(false))?;
    }
    if args.which == Which::Loader {
        let data = match &args.data {
            Some(dir) => dir.clone(),
            None => lockstep_core::data::data_home("mnist")?,
        };
        return loader::run(&data, &device);
    }
    if args.which == Which::Gpu {
        return gpu::run(&device);
    }
    if args.which == Which::Ddp {
        return run_ddp(&args);
    }
    if args.which == Which::Zero {
        return run_zero(&args, threads);
    }
    if args.which == Which::Pipeline {
        return run_pipeline(&args, threads);
    }
    let plan = Plan {
        threads,
        device: device.location().into(),
        gemm_sizes: if matches!(args.which, Which::Gemm | Which::All) {
            args.sizes.clone()
        } else {
            vec![]
        },
        gemm_dtype: args.gemm_dtype.clone(),
        gemm_timing: GEMM_TIMING,
        resnet: (args.which == Which::Resnet).then(|| resnet::ResnetPlan {
            batch: args.batch.unwrap_or(resnet::ResnetPlan::default().batch),
            precisions: match args.precision.as_str() {
                "32" => resnet::ResnetPlan::default().precisions,
                other => vec![other.to_string()],
            },
            kernel_profile: args.kernels,
            ..resnet::ResnetPlan::default()
        }),
        gpt: (args.which == Which::Gpt)
            .then(|| {
                let precisions = match args.precision.as_str() {
                    "32" => vec!["32".to_string(), "bf16-mixed".to_string()],
                    other => vec![other.to_string()],
                };
                let plan = gpt::GptPlan::new(&args.model, args.batch.unwrap_or(GPT_BATCH), precisions)?;
                let config = match args.block_size {
                    Some(block) => plan.config.block_size(block),
                    None => plan.config,
                };
                anyhow::Ok(gpt::GptPlan {
                    config,
                    kernel_profile: args.kernels,
                    compile: args.device.starts_with("cuda"),
                    ..plan
                })
            })
            .transpose()?,
        mlp: matches!(args.which, Which::Mlp | Which::All).then(|| MlpPlan {
            layers: [784]
                .into_iter()
                .chain(args.hidden.iter().copied())
                .chain([10])
                .collect(),
            precision: args.precision.clone(),
            batch: args.batch.unwrap_or(MLP_BATCH),
            ..MlpPlan::default()
        }),
    };
    let info = device.info();
    println!("device: {}, {}", device.location(), info.name);
    // Which kernels and libraries ran (a CPU's vector code, cuDNN, TF32): numbers depend on them.
    for (label, value) in &info.details {
        println!("  {label}: {value}");
    }
    let rounds = usize::from(args.rounds);
    anyhow::ensure!(
        rounds == 1 || (args.peer.is_some() && matches!(args.which, Which::Resnet | Which::Gpt)),
        "--rounds alternates `bench resnet` or `bench gpt` with a --peer"
    );
    let load_before = machine::load_average();
    let (mut ours_rounds, mut peer_rounds) = (Vec::new(), Vec::new());
    let (mut busy_ours, mut busy_peer) = (Vec::new(), Vec::new());
    let mut peer_note = None;
    for round in 0..rounds {
        let start = machine::sample();
        ours_rounds.push(measure(&device, &plan)?);
        let ours_done = machine::sample();
        busy_ours.extend(machine::others_percent(start, ours_done));
        let Some(Peer::Pytorch) = args.peer else { break };
        eprintln!("running the PyTorch peer …");
        match peer::pytorch(&plan) {
            Ok(r) => peer_rounds.push(r),
            Err(note) => {
                peer_note = Some(note);
                break;
            }
        }
        busy_peer.extend(machine::others_percent(ours_done, machine::sample()));
        if rounds > 1 {
            println!("{}", rounds::describe(round, &ours_rounds[round], &peer_rounds[round]));
        }
    }
    if let Some(resnet_plan) = &plan.resnet {
        // Not beside the peer: the loader is ours alone, and must outrun the steps above.
        for (workers, rate) in resnet::loader_images_per_s(resnet_plan.batch)? {
            println!("loader, augmented CIFAR-shaped images, {workers} workers: {rate:.0} images/s");
        }
    }
    let mean = |p: &[f64]| (!p.is_empty()).then(|| p.iter().sum::<f64>() / p.len() as f64);
    let others = Busy {
        during_ours: mean(&busy_ours),
        during_peer: args.peer.and(mean(&busy_peer)),
    };
    let ours = rounds::median_round(&ours_rounds).context("no round was measured")?;
    let peer = rounds::median_round(&peer_rounds);
    let (peer_results, peer_note) = (peer.as_ref(), peer_note.as_deref());
    println!("{}", report::table(&ours, peer_results));
    if let Some(note) = peer_note {
        println!("no PyTorch numbers: {note}");
    }
    // Other processes on the machine skew every number: say how busy it was.
    let load_after = machine::load_average();
    println!("load average (1, 5, 15 min) before: {load_before}, after: {load_after}");
    println!("{}", others.describe());
    if let Some(path) = &args.json {
        let report = Report {
            plan: &plan,
            ours: &ours,
            peer: peer_results,
            peer_note,
            load_before: &load_before,
            load_after: &load_after,
            others_cpu_percent: &others,
        };
        let text = serde_json::to_string_pretty(&report).context("cannot encode the report")?;
        std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn run_ddp(args: &Args) -> anyhow::Result<()> {
    let buckets = ReducerConfig::from_mib(args.first_bucket_mb, args.bucket_mb);
    let plan = ddp::DdpPlan {
        devices: args.devices.clone(),
        hidden: args.hidden.clone(),
        batch: args.batch.unwrap_or(MLP_BATCH),
        warmup_steps: 3,
        steps: args.steps.max(1),
        first_bucket_bytes: buckets.first_bucket_bytes,
        bucket_bytes: buckets.bucket_bytes,
    };
    eprintln!(
        "running {} data-parallel steps on {} …",
        plan.steps,
        plan.devices.join(",")
    );
    let report = ddp::run(&plan)?;
    println!("{}", ddp::table(&report));
    write_json(args, &report)
}

fn run_zero(args: &Args, threads: usize) -> anyhow::Result<()> {
    let text = args
        .data
        .clone()
        .context("bench zero trains a GPT on a text file: give it with --data FILE")?;
    let plan = zero::ZeroPlan {
        devices: args.devices.clone(),
        model: args.model.clone(),
        text,
        batch: args.batch.unwrap_or(GPT_BATCH),
        steps: args.steps,
        threads,
    };
    let variants = zero::run(&plan)?;
    println!("{}", zero::table(&variants));
    write_json(args, &serde_json::json!({ "plan": plan, "variants": variants }))
}

fn run_pipeline(args: &Args, threads: usize) -> anyhow::Result<()> {
    let plan = pipeline::PipelinePlan {
        devices: args.devices.clone(),
        depth: args.depth,
        width: args.width,
        batch: args.batch.unwrap_or(PIPELINE_BATCH),
        micro_batches: args.micro_batches,
        // The machine's threads shared out over the stages, as separate devices would compute.
        threads_per_stage: (threads / args.devices.len().max(1)).max(1),
        timing: timing::Timing {
            warmup: 1,
            min_reps: args.steps.clamp(1, 5),
            max_reps: args.steps.max(1),
            min_seconds: 5.0,
        },
    };
    let report = pipeline::run(&plan)?;
    println!("{}", pipeline::table(&report));
    write_json(args, &report)
}

/// Writes `report` to --json, when given.
fn write_json(args: &Args, report: &impl serde::Serialize) -> anyhow::Result<()> {
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(report).context("cannot encode the report")?;
        std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn measure(device: &Device, plan: &Plan) -> anyhow::Result<Results> {
    let mut ours = Results {
        engine: format!("Lockstep {}", env!("CARGO_PKG_VERSION")),
        ..Results::default()
    };
    for &n in &plan.gemm_sizes {
        eprintln!("running gemm {n}x{n} …");
        ours.gemm.push(
            gemm::run_in(device, n, gemm_dtype(&plan.gemm_dtype), &plan.gemm_timing)
                .with_context(|| format!("gemm benchmark at {n}"))?,
        );
    }
    if let Some(mlp_plan) = &plan.mlp {
        eprintln!("running the MLP training step …");
        ours.mlp = Some(mlp::run(device, mlp_plan).context("MLP benchmark")?);
    }
    if let Some(resnet_plan) = &plan.resnet {
        eprintln!("running the ResNet-18 training steps …");
        ours.resnet = resnet::run(device, resnet_plan).context("ResNet benchmark")?;
    }
    if let Some(gpt_plan) = &plan.gpt {
        eprintln!("running the {} training steps …", gpt_plan.model);
        ours.gpt = gpt::run(device, gpt_plan).context("GPT benchmark")?;
    }
    Ok(ours)
}

/// The GEMM benchmark's element type (clap allows only these names); `tf32` also lets CUDA
/// products use TF32.
fn gemm_dtype(name: &str) -> DType {
    lockstep_cuda::set_allow_tf32(name == "tf32");
    match name {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        _ => DType::F32,
    }
}
