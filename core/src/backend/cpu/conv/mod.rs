//! The CPU backend's convolutions.

#[cfg(target_arch = "x86_64")]
mod direct;
pub(super) mod fused;
#[cfg(target_arch = "x86_64")]
pub(super) mod fused_bf16;
#[cfg(target_arch = "x86_64")]
mod panels;
#[cfg(target_arch = "x86_64")]
mod positions;
mod ranges;
#[cfg(test)]
mod reference;
pub(super) mod shifted;
mod transposed;
pub(super) mod unfold;
