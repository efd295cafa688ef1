//! The host waits for cuda:0's queued work only where a value is read back (or it synchronizes):
//! a GPT's bf16-mixed training steps (the weights' bf16 copies, forward, backward, clipping,
//! AdamW) queue their launches without waiting, so a GPU's queue never drains mid-step.

mod support;

use lockstep_core::Tensor;
use lockstep_core::conformance::training_step_host_waits;

#[test]
fn a_read_waits_once_and_training_steps_never_wait() {
    let Some(device) = support::cuda_device() else { return };
    let _counters = support::exclusive();
    let waits = || {
        device
            .backend()
            .work_counters()
            .host_waits
            .expect("CUDA counts host waits")
    };
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], [3], &device).unwrap();
    let before = waits();
    let doubled = x.add(&x).unwrap();
    assert_eq!(waits(), before, "queueing an op does not wait");
    assert_eq!(doubled.to_vec::<f32>().unwrap(), [2.0, -4.0, 6.0]);
    assert_eq!(waits(), before + 1, "reading a value back waits once");
    assert_eq!(
        training_step_host_waits(&device, 3).unwrap(),
        Some(0),
        "a training step waited for the device"
    );
}
