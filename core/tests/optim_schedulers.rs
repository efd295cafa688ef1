//! Learning-rate schedules against PyTorch's, resuming from a step count, and bad arguments.
//! Reference values: scripts/reference_values.py, section `schedulers`: `get_last_lr()[0]` right
//! after constructing each torch.optim.lr_scheduler on SGD(lr=0.1), then after each `step()`.

use lockstep_core::optim::{
    ChainedLR, CosineAnnealingLR, LinearLR, LrSchedule, LrScheduler, MultiStepLR, Optimizer, SchedulerState,
    SequentialLR, Sgd, SgdConfig, StepLR,
};
use lockstep_core::{DType, Device, Tensor};

/// PyTorch's values, as scripts/reference_values.py prints them (kept on one line each).
#[rustfmt::skip]
mod pytorch {
    pub const STEP_LR: [f64; 13] = [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125, 0.0125, 0.0125, 0.00625];
    pub const MULTI_STEP_LR: [f64; 13] = [0.1, 0.1, 0.010000000000000002, 0.010000000000000002, 0.010000000000000002, 0.00010000000000000005, 0.00010000000000000005, 0.00010000000000000005, 0.00010000000000000005, 1.0000000000000006e-05, 1.0000000000000006e-05, 1.0000000000000006e-05, 1.0000000000000006e-05];
    pub const COSINE_LR: [f64; 26] = [0.1, 0.09757729755661011, 0.0905463412215599, 0.07959536998847742, 0.0657963412215599, 0.0505, 0.03520365877844011, 0.02140463001152259, 0.010453658778440109, 0.0034227024433899004, 0.001, 0.0034227024433899004, 0.01045365877844014, 0.02140463001152267, 0.035203658778440255, 0.05050000000000022, 0.06579634122156018, 0.07959536998847777, 0.09054634122156031, 0.09757729755661054, 0.10000000000000045, 0.09757729755661054, 0.09054634122156033, 0.07959536998847778, 0.0657963412215602, 0.050500000000000225];
    pub const LINEAR_LR: [f64; 9] = [0.025, 0.043750000000000004, 0.06250000000000001, 0.08125000000000002, 0.10000000000000002, 0.10000000000000002, 0.10000000000000002, 0.10000000000000002, 0.10000000000000002];
    pub const SEQUENTIAL_LR: [f64; 15] = [0.010000000000000002, 0.04, 0.07, 0.1, 0.09619397662556434, 0.08535533905932738, 0.0691341716182545, 0.05, 0.030865828381745515, 0.014644660940672627, 0.0038060233744356634, 0.0, 0.0038060233744356634, 0.014644660940672639, 0.030865828381745536];
    pub const CHAINED_LINEAR_STEP: [f64; 11] = [0.05, 0.0625, 0.075, 0.043750000000000004, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125, 0.0125];
    pub const CHAINED_LINEAR_COSINE: [f64; 11] = [0.020000000000000004, 0.03511901729331278, 0.04703444185374865, 0.05398469857794411, 0.05497871376374782, 0.050000000000000024, 0.03454915028125265, 0.020610737385376356, 0.009549150281252637, 0.0024471741852423244, 0.0];
}
use pytorch::*;

fn optimizer() -> Sgd {
    let p = Tensor::zeros([1], DType::F32, &Device::cpu())
        .unwrap()
        .requires_grad(true);
    Sgd::new(vec![p], SgdConfig::new(0.1)).unwrap()
}

/// The rate after construction and after each of `steps` steps, checking the optimizer follows.
fn rates(schedule: impl LrSchedule + 'static, steps: usize) -> Vec<f64> {
    let mut opt = optimizer();
    let mut sched = LrScheduler::new(schedule, &mut opt);
    let mut out = vec![sched.get_last_lr()];
    for _ in 0..steps {
        sched.step(&mut opt);
        assert_eq!(opt.lr(), sched.get_last_lr());
        out.push(sched.get_last_lr());
    }
    out
}

fn assert_rates(what: &str, actual: &[f64], expected: &[f64]) {
    assert_eq!(actual.len(), expected.len(), "{what}");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= 1e-12 * e.abs().max(1e-3),
            "{what} at step {i}: got {a}, PyTorch {e}\n  all: {actual:?}"
        );
    }
}

#[test]
fn single_schedules_match_pytorch() {
    assert_rates("StepLR(3, 0.5)", &rates(StepLR::new(3, 0.5).unwrap(), 12), &STEP_LR);
    assert_rates(
        "MultiStepLR([2, 5, 5, 9], 0.1)",
        &rates(MultiStepLR::new(&[2, 5, 5, 9], 0.1).unwrap(), 12),
        &MULTI_STEP_LR,
    );
    assert_rates(
        "CosineAnnealingLR(10, 0.001)",
        &rates(CosineAnnealingLR::new(10, 0.001).unwrap(), 25),
        &COSINE_LR,
    );
    assert_rates(
        "LinearLR(0.25, 1.0, 4)",
        &rates(LinearLR::new(0.25, 1.0, 4).unwrap(), 8),
        &LINEAR_LR,
    );
}

#[test]
fn composed_schedules_match_pytorch() {
    let warmup_then_cosine = SequentialLR::new(
        vec![
            Box::new(LinearLR::new(0.1, 1.0, 3).unwrap()),
            Box::new(CosineAnnealingLR::new(8, 0.0).unwrap()),
        ],
        &[3],
    )
    .unwrap();
    assert_rates("SequentialLR", &rates(warmup_then_cosine, 14), &SEQUENTIAL_LR);
    let linear_step = ChainedLR::new(vec![
        Box::new(LinearLR::new(0.5, 1.0, 4).unwrap()),
        Box::new(StepLR::new(3, 0.5).unwrap()),
    ])
    .unwrap();
    assert_rates(
        "ChainedScheduler(LinearLR, StepLR)",
        &rates(linear_step, 10),
        &CHAINED_LINEAR_STEP,
    );
    let linear_cosine = ChainedLR::new(vec![
        Box::new(LinearLR::warmup(0.2, 5).unwrap()),
        Box::new(CosineAnnealingLR::new(10, 0.0).unwrap()),
    ])
    .unwrap();
    assert_rates(
        "ChainedScheduler(LinearLR, CosineAnnealingLR)",
        &rates(linear_cosine, 10),
        &CHAINED_LINEAR_COSINE,
    );
}

/// Resuming needs only the base rate and the step count.
#[test]
fn a_scheduler_resumes_from_its_state() {
    let mut opt = optimizer();
    let mut sched = LrScheduler::new(CosineAnnealingLR::new(10, 0.001).unwrap(), &mut opt);
    (0..7).for_each(|_| sched.step(&mut opt));
    let state = sched.state();
    assert_eq!(
        state,
        SchedulerState {
            base_lr: 0.1,
            last_epoch: 7
        }
    );

    let mut opt2 = optimizer();
    opt2.set_lr(0.5); // whatever the new optimizer starts with, the checkpoint decides
    let mut resumed = LrScheduler::new(CosineAnnealingLR::new(10, 0.001).unwrap(), &mut opt2);
    resumed.load_state(state, &mut opt2).unwrap();
    assert_rates("resumed cosine", &[opt2.lr()], &COSINE_LR[7..8]);
    resumed.step(&mut opt2);
    assert_rates("resumed cosine", &[opt2.lr()], &COSINE_LR[8..9]);
    assert!(
        resumed
            .load_state(
                SchedulerState {
                    base_lr: -1.0,
                    last_epoch: 0
                },
                &mut opt2
            )
            .is_err()
    );
}

#[test]
fn bad_schedule_arguments_are_errors() {
    assert!(StepLR::new(0, 0.1).is_err());
    assert!(MultiStepLR::new(&[1], f64::NAN).is_err());
    assert!(CosineAnnealingLR::new(0, 0.0).is_err());
    assert!(CosineAnnealingLR::new(10, -1.0).is_err());
    assert!(LinearLR::new(0.0, 1.0, 5).is_err());
    assert!(LinearLR::new(1.5, 1.0, 5).is_err());
    assert!(LinearLR::new(0.5, 1.5, 5).is_err());
    assert!(LinearLR::new(0.5, 1.0, 0).is_err());
    let two = || -> Vec<Box<dyn LrSchedule>> {
        vec![
            Box::new(StepLR::new(1, 0.5).unwrap()),
            Box::new(StepLR::new(1, 0.5).unwrap()),
        ]
    };
    assert!(SequentialLR::new(two(), &[]).is_err());
    assert!(SequentialLR::new(two(), &[3, 4]).is_err());
    assert!(SequentialLR::new(vec![], &[]).is_err());
    assert!(ChainedLR::new(vec![]).is_err());
    let three: Vec<Box<dyn LrSchedule>> = vec![
        Box::new(StepLR::new(1, 0.5).unwrap()),
        Box::new(StepLR::new(1, 0.5).unwrap()),
        Box::new(StepLR::new(1, 0.5).unwrap()),
    ];
    assert!(SequentialLR::new(three, &[5, 2]).is_err());
}
