//! What one `lockstep bench` run measures. Serialised as JSON, the same plan drives the PyTorch
//! peer, so shapes, hyper-parameters and timing rules are written down once, here.

use serde::Serialize;

use super::timing::Timing;

/// Enough repetitions for a stable median at 512 (about 1 ms each) and at 2048 (about 70 ms).
pub const GEMM_TIMING: Timing = Timing {
    warmup: 3,
    min_reps: 10,
    max_reps: 2000,
    min_seconds: 1.0,
};

/// One repetition is a window of `steps_per_window` training steps ended by one host sync.
pub const MLP_TIMING: Timing = Timing {
    warmup: 2,
    min_reps: 7,
    max_reps: 1000,
    min_seconds: 3.0,
};

#[derive(Clone, Debug, Serialize)]
pub struct MlpPlan {
    /// Layer widths: `Linear(layers[i], layers[i+1])` with ReLU between.
    pub layers: Vec<usize>,
    pub batch: usize,
    pub lr: f64,
    pub momentum: f64,
    pub steps_per_window: usize,
    pub timing: Timing,
    /// `32`, `16-mixed` or `bf16-mixed`: autocast and, for 16-mixed, loss scaling, as a
    /// training step runs them.
    pub precision: String,
}

impl Default for MlpPlan {
    fn default() -> Self {
        MlpPlan {
            layers: vec![784, 512, 512, 10],
            batch: 128,
            lr: 0.05,
            momentum: 0.9,
            steps_per_window: 25,
            timing: MLP_TIMING,
            precision: "32".into(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub threads: usize,
    /// Our device (`cpu:0`); the peer is given its own name for it.
    pub device: String,
    pub gemm_sizes: Vec<usize>,
    /// Element type of the GEMM operands: `f32` or `bf16` (f32 accumulation).
    pub gemm_dtype: String,
    pub gemm_timing: Timing,
    pub mlp: Option<MlpPlan>,
    pub resnet: Option<super::resnet::ResnetPlan>,
    pub gpt: Option<super::gpt::GptPlan>,
}
