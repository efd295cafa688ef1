// Indexing over contiguous [outer, dim, inner] views with u32 indices. The in-place adds
// (index_add, scatter_add) run one invocation per destination element that sums every source
// element aimed at it, in order: no atomics, so repeated indices give deterministic results.
// Indices outside the indexed dimension select zeros and add nothing.
// params: [n, outer, src_dim, inner, out_dim]

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

// Adds to destination element `e` of [outer, out_dim, inner] every source element aimed at it:
// src[o, j, i] for each j whose id (ids[j], or ids[o, j, i] when `per_element`) is its row.
fn add_aimed(e: u32, per_element: bool) {
    let src_dim = params[2];
    let inner = params[3];
    let c = coord(e, params[4], inner);
    var acc = f32(out[e]);
    for (var j = 0u; j < src_dim; j++) {
        let s = (c.o * src_dim + j) * inner + c.i;
        if (ids[select(j, s, per_element)] == c.j) {
            acc += f32(src[s]);
        }
    }
    out[e] = T(acc);
}

// out[o, ids[j], i] += src[o, j, i]; here out is the destination [outer, out_dim, inner].
@compute @workgroup_size(256)
fn index_add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = flat_index(gid, groups);
    if (e < params[0]) {
        add_aimed(e, false);
    }
}

// out[o, ids[o, j, i], i] += src[o, j, i]; out is the destination [outer, out_dim, inner].
@compute @workgroup_size(256)
fn scatter_add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = flat_index(gid, groups);
    if (e < params[0]) {
        add_aimed(e, true);
    }
}
