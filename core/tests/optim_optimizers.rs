//! SGD, Adam and AdamW against PyTorch, and optimizer state export/import.
//! Reference values: scripts/reference_values.py, section `optimizers`: five steps of
//! `torch.optim.{SGD, Adam, AdamW}(…, foreach=False)` on w = pat([2,3],5), b = pat([3],7), where
//! before step t each gradient is `0.5 * p + pat(shape, 3 + 2t) / 4`; values after steps 1 and 5.

mod nn_support;

use lockstep_core::optim::{Adam, AdamConfig, DecayScope, Optimizer, OptimizerState, Sgd, SgdConfig};
use lockstep_core::{Device, Tensor, no_grad};
use nn_support::{assert_close, pat, values};

/// PyTorch's values, as scripts/reference_values.py prints them (kept on one line each).
#[rustfmt::skip]
mod pytorch {
    pub const SGD_PLAIN_STEP1: [f32; 9] = [-0.925, -0.340625, 0.24375, 0.828125, -0.60625, -0.021875, -0.925, -0.103125, 0.71875];
    pub const SGD_PLAIN_STEP5: [f32; 9] = [-0.6606714, -0.2789267, 0.20641169, 0.63610166, -0.47729638, 0.005518615, -0.6606714, -0.0854815, 0.59330213];
    pub const SGD_MOMENTUM_DAMPENING_STEP1: [f32; 9] = [-0.925, -0.340625, 0.24375, 0.828125, -0.60625, -0.021875, -0.925, -0.103125, 0.71875];
    pub const SGD_MOMENTUM_DAMPENING_STEP5: [f32; 9] = [-0.1783001, -0.09790028, 0.11900424, 0.3208968, -0.2775777, -0.027872626, -0.1783001, 0.0151497545, 0.34510425];
    pub const SGD_NESTEROV_WD_STEP1: [f32; 9] = [-0.8556, -0.308975, 0.23765, 0.784275, -0.5881875, -0.0415625, -0.8556, -0.0832, 0.6892];
    pub const SGD_NESTEROV_WD_STEP5: [f32; 9] = [0.035395365, -0.05263931, 0.094451405, 0.16216023, -0.17307772, -0.004431389, 0.035395365, 0.023659503, 0.24704897];
    pub const SGD_MOMENTUM_WD_STEP1: [f32; 9] = [-0.96, -0.356875, 0.24625, 0.849375, -0.6140625, -0.0109375, -0.96, -0.11375, 0.7325];
    pub const SGD_MOMENTUM_WD_STEP5: [f32; 9] = [-0.6976014, -0.28008273, 0.20311174, 0.6649435, -0.48938227, -0.0009880661, -0.6976014, -0.08205749, 0.59916216];
    pub const ADAM_LR01_STEP1: [f32; 9] = [-0.99, -0.365, 0.24000001, 0.865, -0.615, -0.009999999, -0.99, -0.115, 0.74];
    pub const ADAM_LR01_STEP5: [f32; 9] = [-0.95003015, -0.32778206, 0.21112892, 0.82621115, -0.57765543, -0.014546683, -0.95003015, -0.08282168, 0.70204717];
    pub const ADAM_WD_BETAS_STEP1: [f32; 9] = [-0.98, -0.35500005, 0.23000023, 0.855, -0.6050001, -0.019999908, -0.98, -0.105000086, 0.73];
    pub const ADAM_WD_BETAS_STEP5: [f32; 9] = [-0.90026075, -0.2828755, 0.17098409, 0.7770486, -0.5282701, -0.021215167, -0.90026075, -0.04673174, 0.6537317];
    pub const ADAMW_DEFAULT_WD_STEP1: [f32; 9] = [-0.9899, -0.36496252, 0.239975, 0.8649125, -0.6149375, -0.009999999, -0.9899, -0.1149875, 0.739925];
    pub const ADAMW_DEFAULT_WD_STEP5: [f32; 9] = [-0.94954044, -0.32760596, 0.21101514, 0.82578427, -0.57735324, -0.014540971, -0.94954044, -0.08277031, 0.7016831];
    pub const ADAMW_WD_STEP1: [f32; 9] = [-0.945, -0.323125, 0.19875002, 0.820625, -0.571875, -0.049999993, -0.945, -0.074375, 0.69625];
    pub const ADAMW_WD_STEP5: [f32; 9] = [-0.72872484, -0.14307296, 0.06978302, 0.613836, -0.37785023, -0.051598866, -0.72872484, 0.056938082, 0.49808756];
}
use pytorch::*;

const TOL: f32 = 2e-6;

fn params() -> Vec<Tensor> {
    vec![pat(&[2, 3], 5).requires_grad(true), pat(&[3], 7).requires_grad(true)]
}

/// Sets the reference gradients for step `t` (0-based) and steps.
fn step(opt: &mut dyn Optimizer, t: usize) {
    no_grad(|| {
        for p in opt.parameters() {
            let g = p
                .detach()
                .mul_scalar(0.5)
                .unwrap()
                .add(&pat(p.dims(), 3 + 2 * t).mul_scalar(0.25).unwrap())
                .unwrap();
            p.set_grad(Some(g));
        }
    });
    opt.step().unwrap();
}

fn flat(opt: &dyn Optimizer) -> Vec<f32> {
    opt.parameters().iter().flat_map(values).collect()
}

type Make = fn(Vec<Tensor>) -> Box<dyn Optimizer>;

/// Each case: name, constructor, PyTorch's values after step 1 and after step 5.
fn cases() -> Vec<(&'static str, Make, &'static [f32], &'static [f32])> {
    vec![
        (
            "SGD lr 0.1",
            |p| Box::new(Sgd::new(p, SgdConfig::new(0.1)).unwrap()),
            &SGD_PLAIN_STEP1,
            &SGD_PLAIN_STEP5,
        ),
        (
            "SGD momentum 0.9 dampening 0.1",
            |p| Box::new(Sgd::new(p, SgdConfig::new(0.1).momentum(0.9).dampening(0.1)).unwrap()),
            &SGD_MOMENTUM_DAMPENING_STEP1,
            &SGD_MOMENTUM_DAMPENING_STEP5,
        ),
        (
            "SGD nesterov weight decay",
            |p| Box::new(Sgd::new(p, SgdConfig::new(0.1).momentum(0.9).nesterov(true).weight_decay(0.01)).unwrap()),
            &SGD_NESTEROV_WD_STEP1,
            &SGD_NESTEROV_WD_STEP5,
        ),
        (
            "SGD momentum weight decay",
            |p| Box::new(Sgd::new(p, SgdConfig::new(0.05).momentum(0.5).weight_decay(0.05)).unwrap()),
            &SGD_MOMENTUM_WD_STEP1,
            &SGD_MOMENTUM_WD_STEP5,
        ),
        (
            "Adam lr 0.01",
            |p| Box::new(Adam::new(p, AdamConfig::adam().lr(0.01)).unwrap()),
            &ADAM_LR01_STEP1,
            &ADAM_LR01_STEP5,
        ),
        (
            "Adam betas eps weight decay",
            |p| {
                Box::new(
                    Adam::new(
                        p,
                        AdamConfig::adam().lr(0.02).betas(0.8, 0.99).eps(1e-6).weight_decay(0.1),
                    )
                    .unwrap(),
                )
            },
            &ADAM_WD_BETAS_STEP1,
            &ADAM_WD_BETAS_STEP5,
        ),
        (
            "AdamW default weight decay",
            |p| Box::new(Adam::new(p, AdamConfig::adamw().lr(0.01)).unwrap()),
            &ADAMW_DEFAULT_WD_STEP1,
            &ADAMW_DEFAULT_WD_STEP5,
        ),
        (
            "AdamW weight decay 0.1",
            |p| Box::new(Adam::adamw(p, AdamConfig::adam().lr(0.05).weight_decay(0.1)).unwrap()),
            &ADAMW_WD_STEP1,
            &ADAMW_WD_STEP5,
        ),
    ]
}

#[test]
fn sgd_adam_and_adamw_match_pytorch() {
    for (name, make, step1, step5) in cases() {
        let mut opt = make(params());
        step(opt.as_mut(), 0);
        assert_close(&format!("{name}, step 1"), &flat(opt.as_ref()), step1, TOL);
        (1..5).for_each(|t| step(opt.as_mut(), t));
        assert_close(&format!("{name}, step 5"), &flat(opt.as_ref()), step5, TOL);
    }
}

/// Two steps, a checkpoint into a fresh optimizer over fresh parameters, three more steps:
/// the result is PyTorch's five-step result.
#[test]
fn state_export_and_import_resume_exactly() {
    for (name, make, _, step5) in cases() {
        let mut first = make(params());
        (0..2).for_each(|t| step(first.as_mut(), t));
        let state = first.state();
        let snapshot: Vec<Vec<f32>> = state.tensors.iter().map(|(_, t)| values(t)).collect();
        let resumed_params: Vec<Tensor> = first
            .parameters()
            .iter()
            .map(|p| {
                Tensor::from_vec(values(p), p.dims().to_vec(), &Device::cpu())
                    .unwrap()
                    .requires_grad(true)
            })
            .collect();
        let mut second = make(resumed_params);
        second.load_state(&state).unwrap();
        (2..5).for_each(|t| step(second.as_mut(), t));
        assert_close(
            &format!("{name}, resumed at step 2"),
            &flat(second.as_ref()),
            step5,
            TOL,
        );
        // The loaded state is a private copy: stepping `second` left `first`'s state alone.
        let after: Vec<Vec<f32>> = first.state().tensors.iter().map(|(_, t)| values(t)).collect();
        assert_eq!(snapshot, after, "{name}");
    }
}

#[test]
fn state_uses_pytorchs_names() {
    let mut sgd = Sgd::new(params(), SgdConfig::new(0.1).momentum(0.9)).unwrap();
    step(&mut sgd, 0);
    let state = sgd.state();
    let names: Vec<&str> = state.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["state.0.momentum_buffer", "state.1.momentum_buffer"]);
    assert_eq!(state.scalar("param_groups.0.lr"), Some(0.1));
    assert_eq!(state.scalar("param_groups.0.momentum"), Some(0.9));
    assert_eq!(sgd.name(), "SGD");

    let mut adam = Adam::new(params(), AdamConfig::adam()).unwrap();
    (0..2).for_each(|t| step(&mut adam, t));
    let state = adam.state();
    let names: Vec<&str> = state.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "state.0.exp_avg",
            "state.0.exp_avg_sq",
            "state.1.exp_avg",
            "state.1.exp_avg_sq"
        ]
    );
    assert_eq!(state.scalar("state.1.step"), Some(2.0));
    assert_eq!(state.scalar("param_groups.0.betas.1"), Some(0.999));
    assert_eq!(adam.name(), "Adam");
    assert_eq!(Adam::new(params(), AdamConfig::adamw()).unwrap().name(), "AdamW");
}

#[test]
fn pytorch_defaults() {
    assert_eq!(
        AdamConfig::adam(),
        AdamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            decay_scope: DecayScope::All,
        }
    );
    assert_eq!(
        AdamConfig::adamw(),
        AdamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
            decoupled: true,
            decay_scope: DecayScope::All,
        }
    );
    assert_eq!(AdamConfig::default(), AdamConfig::adam());
}

#[test]
fn invalid_state_is_rejected_without_changing_the_optimizer() {
    let mut adam = Adam::new(params(), AdamConfig::adam()).unwrap();
    step(&mut adam, 0);
    let mut sgd = Sgd::new(params(), SgdConfig::new(0.1).momentum(0.9)).unwrap();
    let msg = sgd.load_state(&adam.state()).unwrap_err().to_string();
    assert!(
        msg.contains("unexpected state") && msg.contains("state.0.exp_avg"),
        "{msg}"
    );
    assert!(sgd.momentum_buffer(0).is_none());
    assert_eq!(sgd.lr(), 0.1);

    let mut wrong_shape = adam.state();
    wrong_shape.tensors[0].1 = pat(&[6], 3);
    let mut fresh = Adam::new(params(), AdamConfig::adam()).unwrap();
    assert!(fresh.load_state(&wrong_shape).is_err());
    let incomplete = OptimizerState {
        tensors: adam.state().tensors[..1].to_vec(),
        scalars: vec![],
    };
    let msg = fresh.load_state(&incomplete).unwrap_err().to_string();
    assert!(msg.contains("parameter 0"), "{msg}");
    assert_eq!(fresh.step_count(0), 0);
    let bad_lr = OptimizerState {
        tensors: vec![],
        scalars: vec![("param_groups.0.lr".into(), -1.0)],
    };
    assert!(fresh.load_state(&bad_lr).is_err());
}

#[test]
fn bad_hyper_parameters_and_parameters_are_errors() {
    assert!(Sgd::new(params(), SgdConfig::new(-0.1)).is_err());
    assert!(Sgd::new(params(), SgdConfig::new(f64::NAN)).is_err());
    assert!(Sgd::new(params(), SgdConfig::new(0.1).nesterov(true)).is_err());
    assert!(
        Sgd::new(
            params(),
            SgdConfig::new(0.1).momentum(0.9).dampening(0.1).nesterov(true)
        )
        .is_err()
    );
    assert!(Adam::new(params(), AdamConfig::adam().lr(-1.0)).is_err());
    assert!(Adam::new(params(), AdamConfig::adam().betas(1.0, 0.999)).is_err());
    assert!(Adam::new(params(), AdamConfig::adam().eps(-1e-8)).is_err());
    assert!(Adam::new(params(), AdamConfig::adamw().weight_decay(-0.1)).is_err());
    // A view into a larger buffer cannot be updated in place by the fused kernels.
    let view = pat(&[4, 3], 5).narrow(0, 1, 2).unwrap().requires_grad(true);
    let msg = Sgd::new(vec![view], SgdConfig::new(0.1)).err().unwrap().to_string();
    assert!(msg.contains("view"), "{msg}");
    // No parameters at all (a model that forgot to show them): refused, as PyTorch refuses.
    let msg = Adam::new(vec![], AdamConfig::adam()).err().unwrap().to_string();
    assert!(
        msg.contains("empty parameter list") && msg.contains("derive(Module)"),
        "{msg}"
    );
    assert!(Sgd::new(vec![], SgdConfig::new(0.1)).is_err());
}

#[test]
fn parameters_without_gradients_are_left_alone_and_zero_grad_forgets() {
    let ps = params();
    let mut adam = Adam::new(ps.clone(), AdamConfig::adam()).unwrap();
    ps[0].set_grad(Some(pat(&[2, 3], 3)));
    adam.step().unwrap();
    assert_eq!(values(&ps[1]), values(&pat(&[3], 7)));
    assert_eq!((adam.step_count(0), adam.step_count(1)), (1, 0));
    adam.zero_grad();
    assert!(ps.iter().all(|p| p.grad().is_none()));
}

/// `DecayScope::Weights` is PyTorch's two parameter groups, `[{params: weights}, {params:
/// biases and norms, weight_decay: 0}]`: the matrix steps as with decay, the vector as without.
#[test]
fn decay_scope_weights_leaves_vectors_undecayed_as_a_second_param_group_would() {
    type Build = fn(Vec<Tensor>, f64, DecayScope) -> Box<dyn Optimizer>;
    let builds: [(&str, Build); 2] = [
        ("SGD", |p, wd, scope| {
            let config = SgdConfig::new(0.1).momentum(0.9).weight_decay(wd).decay_scope(scope);
            Box::new(Sgd::new(p, config).unwrap())
        }),
        ("AdamW", |p, wd, scope| {
            let config = AdamConfig::adamw().lr(0.1).weight_decay(wd).decay_scope(scope);
            Box::new(Adam::new(p, config).unwrap())
        }),
    ];
    for (name, build) in builds {
        let run = |params: Vec<Tensor>, wd, scope| {
            let mut opt = build(params, wd, scope);
            for t in 0..5 {
                step(opt.as_mut(), t);
            }
            opt.parameters().iter().map(values).collect::<Vec<_>>()
        };
        let [w, b] = <[Tensor; 2]>::try_from(params()).unwrap();
        let scoped = run(vec![w.clone(), b.clone()], 0.5, DecayScope::Weights);
        let [w0, b0] = <[Tensor; 2]>::try_from(params()).unwrap();
        let decayed = run(vec![w0], 0.5, DecayScope::All);
        let undecayed = run(vec![b0], 0.0, DecayScope::All);
        assert_eq!(scoped[0], decayed[0], "{name}: the matrix decays");
        assert_eq!(scoped[1], undecayed[0], "{name}: the vector does not");
        let everything = run(params(), 0.5, DecayScope::All);
        assert_ne!(
            everything[1], scoped[1],
            "{name}: with DecayScope::All the vector decays too"
        );
    }
}
