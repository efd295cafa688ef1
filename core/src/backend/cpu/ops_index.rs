//! The CPU backend's indexing operations: rows picked by index, and their adjoints that add
//! rows back.

use super::{CpuBackend, check_len, cpu, distinct, float_pair_mut, index, u32_ids};
use crate::backend::BufferRef;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::map_host_vec;

pub(super) fn index_select(
    dev: &CpuBackend,
    src: &BufferRef,
    outer: usize,
    dim: usize,
    inner: usize,
    ids: &BufferRef,
) -> Result<BufferRef> {
    let (data, ids) = (cpu("index_select", src)?.read(), cpu("index_select", ids)?.read());
    check_len("index_select", &data, outer * dim * inner)?;
    let ids = u32_ids("index_select", &ids)?;
    let out =
        map_host_vec!(&*data, v => Element::into_host(index::index_select(&dev.pool, v, outer, dim, inner, ids)?));
    dev.wrap("index_select", out)
}

#[allow(clippy::too_many_arguments)] // `Backend::index_add`'s operands, and the device
pub(super) fn index_add(
    dev: &CpuBackend,
    dst: &BufferRef,
    dst_dim: usize,
    src: &BufferRef,
    outer: usize,
    src_dim: usize,
    inner: usize,
    ids: &BufferRef,
) -> Result<()> {
    distinct("index_add", &[dst, src, ids])?;
    let (s, ids) = (cpu("index_add", src)?.read(), cpu("index_add", ids)?.read());
    let ids = u32_ids("index_add", &ids)?;
    check_len("index_add", &s, outer * src_dim * inner)?;
    let mut d = cpu("index_add", dst)?.write();
    check_len("index_add", &d, outer * dst_dim * inner)?;
    float_pair_mut(
        &dev.pool,
        "index_add",
        &mut d,
        &s,
        |d, s| index::index_add(d, dst_dim, s, outer, src_dim, inner, ids),
        |d, s| index::index_add(d, dst_dim, s, outer, src_dim, inner, ids),
    )
}

pub(super) fn gather(
    dev: &CpuBackend,
    src: &BufferRef,
    outer: usize,
    dim: usize,
    inner: usize,
    ids: &BufferRef,
    out_dim: usize,
) -> Result<BufferRef> {
    let (data, ids) = (cpu("gather", src)?.read(), cpu("gather", ids)?.read());
    check_len("gather", &data, outer * dim * inner)?;
    let ids = u32_ids("gather", &ids)?;
    if ids.len() != outer * out_dim * inner {
        return Err(Error::invalid(
            "gather",
            format!(
                "index holds {} elements, expected {}",
                ids.len(),
                outer * out_dim * inner
            ),
        ));
    }
    let out =
        map_host_vec!(&*data, v => Element::into_host(index::gather(&dev.pool, v, outer, dim, inner, ids, out_dim)?));
    dev.wrap("gather", out)
}

#[allow(clippy::too_many_arguments)] // `Backend::scatter_add`'s operands, and the device
pub(super) fn scatter_add(
    dev: &CpuBackend,
    dst: &BufferRef,
    dst_dim: usize,
    src: &BufferRef,
    outer: usize,
    src_dim: usize,
    inner: usize,
    ids: &BufferRef,
) -> Result<()> {
    distinct("scatter_add", &[dst, src, ids])?;
    let (s, ids) = (cpu("scatter_add", src)?.read(), cpu("scatter_add", ids)?.read());
    let ids = u32_ids("scatter_add", &ids)?;
    check_len("scatter_add", &s, outer * src_dim * inner)?;
    if ids.len() != s.len() {
        return Err(Error::invalid(
            "scatter_add",
            format!("index holds {} elements, source {}", ids.len(), s.len()),
        ));
    }
    let mut d = cpu("scatter_add", dst)?.write();
    check_len("scatter_add", &d, outer * dst_dim * inner)?;
    float_pair_mut(
        &dev.pool,
        "scatter_add",
        &mut d,
        &s,
        |d, s| index::scatter_add(d, dst_dim, s, outer, src_dim, inner, ids),
        |d, s| index::scatter_add(d, dst_dim, s, outer, src_dim, inner, ids),
    )
}
