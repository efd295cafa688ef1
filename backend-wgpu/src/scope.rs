//! Error scopes that catch every kind of wgpu error. A kind a scope lets through goes to the
//! uncaptured handler, which marks the whole device failed: a back-end compile failure (hal's
//! `PipelineError::Linkage`, which wgpu reports as Internal) or an out-of-memory would then turn
//! every later op into "restart the run" instead of one error the caller can handle.

/// Every kind a scope can catch.
pub const EVERY_KIND: [wgpu::ErrorFilter; 3] = [
    wgpu::ErrorFilter::Validation,
    wgpu::ErrorFilter::Internal,
    wgpu::ErrorFilter::OutOfMemory,
];

/// Runs `f` inside one scope per kind: what `f` returned, and the first error caught.
pub fn catching<T>(device: &wgpu::Device, f: impl FnOnce() -> T) -> (T, Option<wgpu::Error>) {
    let scopes = EVERY_KIND.map(|filter| device.push_error_scope(filter));
    let value = f();
    // Every scope is popped, innermost first, before looking at what they caught: a guard left
    // to drop would pop out of order, which wgpu answers with a panic.
    let caught: Vec<Option<wgpu::Error>> = scopes.into_iter().rev().map(|s| pollster::block_on(s.pop())).collect();
    (value, first_error(caught))
}

/// The first error the scopes caught, if any.
pub fn first_error(caught: Vec<Option<wgpu::Error>>) -> Option<wgpu::Error> {
    caught.into_iter().flatten().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(kind: wgpu::ErrorFilter) -> wgpu::Error {
        let source = Box::new(std::io::Error::other("fake"));
        let description = format!("a fake {kind:?} error");
        match kind {
            wgpu::ErrorFilter::OutOfMemory => wgpu::Error::OutOfMemory { source },
            wgpu::ErrorFilter::Validation => wgpu::Error::Validation { source, description },
            wgpu::ErrorFilter::Internal => wgpu::Error::Internal { source, description },
        }
    }

    /// The filter that catches `e` (exhaustive, so a new kind in wgpu fails to compile here).
    fn filter_of(e: &wgpu::Error) -> wgpu::ErrorFilter {
        match e {
            wgpu::Error::OutOfMemory { .. } => wgpu::ErrorFilter::OutOfMemory,
            wgpu::Error::Validation { .. } => wgpu::ErrorFilter::Validation,
            wgpu::Error::Internal { .. } => wgpu::ErrorFilter::Internal,
        }
    }

    #[test]
    fn scopes_catch_every_kind_of_error_including_back_end_compile_failures() {
        let kinds = [
            wgpu::ErrorFilter::OutOfMemory,
            wgpu::ErrorFilter::Validation,
            wgpu::ErrorFilter::Internal,
        ];
        for kind in kinds {
            let e = fake(kind);
            assert!(
                EVERY_KIND.contains(&filter_of(&e)),
                "{e} would reach the uncaptured handler"
            );
        }
    }

    #[test]
    fn an_error_in_any_scope_is_reported() {
        assert!(first_error(vec![None, None, None]).is_none());
        let internal = first_error(vec![None, Some(fake(wgpu::ErrorFilter::Internal)), None]);
        assert!(matches!(internal, Some(wgpu::Error::Internal { .. })), "{internal:?}");
        let oom = first_error(vec![None, None, Some(fake(wgpu::ErrorFilter::OutOfMemory))]);
        assert!(matches!(oom, Some(wgpu::Error::OutOfMemory { .. })), "{oom:?}");
    }
}
