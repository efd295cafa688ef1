// Indexing over contiguous [outer, dim, inner] views with u32 indices. Indices outside the
// indexed dimension select zeros and add nothing.
// params: [n, outer, src_dim, inner, out_dim]; the in-place adds name the destination's dim
// out_dim and its buffer out.

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

struct Coord {
    o: u32,
    j: u32,
    i: u32,
}

// Element `e` of a contiguous [outer, dim, inner] tensor.
fn coord(e: u32, dim: u32, inner: u32) -> Coord {
    return Coord(e / (dim * inner), (e / inner) % dim, e % inner);
}

// src[o, id, i] for output element `e`, or 0 when `id` is outside the indexed dimension.
fn pick(e: u32, id: u32) -> T {
    let src_dim = params[2];
    let inner = params[3];
    let c = coord(e, params[4], inner);
    return select(T(0), src[(c.o * src_dim + min(id, src_dim - 1u)) * inner + c.i], id < src_dim);
}

// out[o, j, i] = src[o, ids[j], i] (out_dim = len(ids))
@compute @workgroup_size(256)
fn index_select(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = flat_index(gid, groups);
    if (e < params[0]) {
        out[e] = pick(e, ids[coord(e, params[4], params[3]).j]);
    }
}

// out[o, j, i] = src[o, ids[o, j, i], i]
@compute @workgroup_size(256)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = flat_index(gid, groups);
    if (e < params[0]) {
        out[e] = pick(e, ids[e]);
    }
}

// The in-place adds: out[o, id, i] += src[o, j, i] for id = ids[j] (index_add) or ids[o, j, i]
// (scatter_add, PER_ELEMENT). One invocation per destination element sums, in f32 rounded once,
// the sources aimed at it in increasing j: no float atomics, so repeated ids add up the same on
// every run and as on the CPU. Either it scans every source (add_scanning: cheap when there are
// few), or link_sources first threads each id's sources into a list in increasing j
// (first[slot] -> next[position] -> .. -> NONE) and add_linked walks only its own list.

override PER_ELEMENT: bool = false;

const NONE: u32 = 0xffffffffu;

// Each list's first source row (NONE before link_sources): per destination row, or per destination
// element when PER_ELEMENT.
@group(0) @binding(4) var<storage, read_write> first: array<atomic<u32>>;
// The next source row with the same id in the same column, by source position.
@group(0) @binding(5) var<storage, read_write> next: array<u32>;

// The ids (and, for scatter_add, the list links) of the column of source position `o, i`: row j
// is at column_base + j * column_step.
struct Column {
    base: u32,
    step: u32,
}

fn column(o: u32, i: u32) -> Column {
    if (PER_ELEMENT) {
        return Column(o * params[2] * params[3] + i, params[3]);
    }
    return Column(0u, 1u);
}

@compute @workgroup_size(256)
fn add_scanning(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = flat_index(gid, groups);
    if (e >= params[0]) {
        return;
    }
    let src_dim = params[2];
    let inner = params[3];
    let c = coord(e, params[4], inner);
    let col = column(c.o, c.i);
    var acc = f32(out[e]);
    for (var j = 0u; j < src_dim; j++) {
        if (ids[col.base + j * col.step] == c.j) {
            acc += f32(src[(c.o * src_dim + j) * inner + c.i]);
        }
    }
    out[e] = T(acc);
}

// One invocation per source position (a row j of index_add's ids, an element of scatter_add's):
// links it to the next row of its column with the same id and offers j as its list's first.
// A search forward, so O(src_dim) per position at worst, but no destination factor.
// params[0] here counts positions.
@compute @workgroup_size(256)
fn link_sources(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let p = flat_index(gid, groups);
    if (p >= params[0]) {
        return;
    }
    let src_dim = params[2];
    let inner = params[3];
    let dst_dim = params[4];
    var c = Coord(0u, p, 0u);
    if (PER_ELEMENT) {
        c = coord(p, src_dim, inner);
    }
    let col = column(c.o, c.i);
    let id = ids[p];
    if (id >= dst_dim) {
        return; // adds nothing, and no list reaches it
    }
    var k = c.j + 1u;
    while (k < src_dim && ids[col.base + k * col.step] != id) {
        k++;
    }
    next[p] = select(NONE, k, k < src_dim);
    atomicMin(&first[select(id, (c.o * dst_dim + id) * inner + c.i, PER_ELEMENT)], c.j);
}

@compute @workgroup_size(256)
fn add_linked(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = flat_index(gid, groups);
    if (e >= params[0]) {
        return;
    }
    let src_dim = params[2];
    let inner = params[3];
    let c = coord(e, params[4], inner);
    let col = column(c.o, c.i);
    var acc = f32(out[e]);
    var j = atomicLoad(&first[select(c.j, e, PER_ELEMENT)]);
    while (j != NONE) {
        acc += f32(src[(c.o * src_dim + j) * inner + c.i]);
        j = next[col.base + j * col.step];
    }
    out[e] = T(acc);
}
