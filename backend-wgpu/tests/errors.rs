//! Bad requests on a wgpu device end in errors that name the device or the limit, never a panic.

mod support;

use lockstep_core::{DType, Device, Error, HostVec, Tensor};

#[test]
fn f64_is_refused_with_what_to_use_instead() {
    let Some(device) = support::wgpu_device() else { return };
    let err = Tensor::from_host(HostVec::F64(vec![1.0]), [1], &device).unwrap_err();
    assert!(matches!(err, Error::UnsupportedDType { .. }), "{err}");
    assert!(
        err.to_string().contains("f64") && err.to_string().contains("f32"),
        "{err}"
    );
}

#[test]
fn a_tensor_beyond_the_binding_limit_names_the_limit() {
    let Some(device) = support::wgpu_device() else { return };
    let limit = lockstep_wgpu::adapter(0)
        .unwrap()
        .limits()
        .max_storage_buffer_binding_size;
    let too_many = (limit / 4 + 1) as usize;
    let err = Tensor::zeros([too_many], DType::F32, &device).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("max_storage_buffer_binding_size") && msg.contains("wgpu:0"),
        "{msg}"
    );
    // The device still works afterwards.
    let ok = Tensor::full([3], 2.5, DType::F32, &device).unwrap();
    assert_eq!(ok.to_vec::<f32>().unwrap(), vec![2.5; 3]);
}

#[test]
fn an_adapter_that_does_not_exist_is_named_with_what_exists() {
    let Some(_) = support::wgpu_device() else { return };
    let err = Device::parse("wgpu:99").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("wgpu:99") && msg.contains("lockstep devices"), "{msg}");
}

#[test]
fn ops_on_mismatched_dtypes_are_refused() {
    let Some(device) = support::wgpu_device() else { return };
    let a = Tensor::full([3], 1.0, DType::F32, &device).unwrap();
    let b = Tensor::full([3], 1.0, DType::U32, &device).unwrap();
    assert!(a.add(&b).is_err());
    let c = Tensor::full([3], 1.0, DType::BF16, &device).unwrap();
    let err = a.add(&c).unwrap_err();
    assert!(matches!(err, Error::DTypeMismatch { .. }), "{err}");
}
