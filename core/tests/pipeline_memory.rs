//! Pipeline memory: with 1F1B a stage holds at most P micro-batches' activations at once, with
//! GPipe all M, measured from each CPU device's peak allocation. A test binary of its own, so
//! no other test allocates on these devices.

mod replica_support;

use lockstep_core::nn::{Linear, Module, ModuleExt, Relu, Sequential, StagedModel};
use lockstep_core::train::pipeline::{Pipeline, ScheduleKind};
use lockstep_core::train::{MicroBatch, StepTimes, Strategy, TrainerConfig};
use lockstep_core::{DType, Device, Generator, Result, Tensor};
use replica_support::setup_with;

const ROWS: usize = 2048;
const MICRO: usize = 16;
const STAGES: u64 = 2;
const WIDTH: usize = 512;

fn model(device: &Device) -> Result<Sequential> {
    let init = Generator::new(2);
    Ok(Sequential::new()
        .add(Linear::new(32, WIDTH, true, device, &init)?)
        .add(Relu)
        .add(Linear::new(WIDTH, WIDTH, true, device, &init)?)
        .add(Relu)
        .add(Linear::new(WIDTH, 10, true, device, &init)?))
}

fn allocated(device: &Device) -> u64 {
    device.backend().memory_stats().allocated_bytes
}

fn peak(device: &Device) -> u64 {
    device.backend().memory_stats().peak_allocated_bytes
}

/// Stage 0's memory in one step of `kind` on cpu:`first` and cpu:`first + 1`.
struct Measured {
    /// Peak allocation during the step above what the device held before it.
    peak_above_base: u64,
    /// What one micro-batch's forward through stage 0 holds for its backward.
    activations: u64,
    /// Stage 0's parameters (their gradients take as much again, twice while accumulating).
    params: u64,
}

fn step(kind: ScheduleKind, first: usize) -> Measured {
    let devices = [cpu(first), cpu(first + 1)];
    let staged = StagedModel::place(&[4, 1], &devices, model).unwrap();
    let x = Tensor::rand_uniform([ROWS, 32], -1.0, 1.0, DType::F32, &Generator::new(3), &devices[0]).unwrap();
    let y = Tensor::from_vec((0..ROWS as u32).map(|i| i % 10).collect(), [ROWS], &devices[1]).unwrap();
    let before = allocated(&devices[0]);
    let one_micro = x.narrow(0, 0, ROWS / MICRO).unwrap().requires_grad(true);
    let held = staged.stages()[0].forward(&one_micro).unwrap();
    let activations = allocated(&devices[0]) - before;
    drop(held);
    let params = staged.stages()[0]
        .parameters()
        .iter()
        .map(|p| 4 * p.elem_count() as u64)
        .sum();
    let mut setup = setup_with(Box::new(staged), &devices[0]);
    let mut strategy = Pipeline::new(kind, MICRO);
    strategy.setup(&mut setup, &TrainerConfig::default()).unwrap();
    let base = allocated(&devices[0]);
    let tensors = [x, y];
    let micro = MicroBatch::whole(&tensors);
    strategy
        .forward_backward(&setup, &micro, &mut StepTimes::default())
        .unwrap();
    Measured {
        peak_above_base: peak(&devices[0]) - base,
        activations,
        params,
    }
}

fn cpu(i: usize) -> Device {
    Device::parse(&format!("cpu:{i}")).unwrap()
}

#[test]
fn one_f_one_b_holds_p_micro_batches_gpipe_all_of_them() {
    let gpipe = step(ScheduleKind::GPipe, 2);
    let ofob = step(ScheduleKind::OneFOneB, 4);
    let a = gpipe.activations;
    assert!(a > 0 && ofob.activations == a);
    // Besides held activations: the gradients, once more while one is added to the other, and
    // one micro-batch's backward temporaries.
    let extra = 2 * gpipe.params + 2 * a;
    let show = |m: &Measured| format!("{} bytes above base ({} per micro-batch)", m.peak_above_base, a);
    eprintln!("GPipe: {}; 1F1B: {}", show(&gpipe), show(&ofob));
    assert!(gpipe.peak_above_base >= MICRO as u64 * a, "GPipe: {}", show(&gpipe));
    assert!(
        gpipe.peak_above_base <= MICRO as u64 * a + extra,
        "GPipe: {}",
        show(&gpipe)
    );
    assert!(ofob.peak_above_base <= STAGES * a + extra, "1F1B: {}", show(&ofob));
}
