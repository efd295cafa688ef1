// reduce: sum, max, min or argmax (first index of the maximum, u32) over some axes. A group of G
// invocations (a power of two the host picks from the chunk's length: 256 for long chunks, fewer
// for short ones, 256 / G groups a workgroup) per chunk of an output's reduced elements; the
// group strides over the chunk and combines in workgroup memory in a fixed order, so results are
// deterministic. One chunk per output writes the output directly (reduce, argmax); with few
// outputs the host splits each into chunks (reduce_chunks: partials in f32 with their indices)
// and combine_chunks folds them in order.
// Sums accumulate in f32 for every `S`. The split depends on the shape only, so every device
// sums in the same order. `S` is the source's element type (bf16 read in its packed words), `D`
// the output's: the host binds f32 for a bf16 source (WGSL cannot write one half of a word
// alone) and rounds the few outputs afterwards.
// params: [n_out, kept_rank, n_reduced, reduced_rank, offset, chunk_len, G,
//        kept dims[kept_rank], kept strides[kept_rank], reduced dims[reduced_rank], reduced strides[reduced_rank]]
// combine_chunks' params: [n_out, chunks, G]

override KIND: u32 = 0u; // 0 sum, 1 max, 2 min, 3 argmax

const NONE: u32 = 0xffffffffu;
const SHAPES_AT: u32 = 7u;

@group(0) @binding(1) var<storage, read> src: array<S>;
@group(0) @binding(2) var<storage, read_write> out: array<D>;
@group(0) @binding(3) var<storage, read_write> out_index: array<u32>;
// One partial per (output, chunk), output-major.
@group(0) @binding(4) var<storage, read_write> chunk_value: array<f32>;
@group(0) @binding(5) var<storage, read_write> chunk_index: array<u32>;

var<workgroup> partial: array<f32, 256>;
var<workgroup> partial_index: array<u32, 256>;

// Offset of element `i` of a sub-shape whose sizes start at params[dims_at] and strides right after.
fn sub_offset(i: u32, rank: u32, dims_at: u32) -> u32 {
    var rest = i;
    var index = 0u;
    for (var d = i32(rank) - 1; d >= 0; d--) {
        let size = params[dims_at + u32(d)];
        index += (rest % size) * params[dims_at + rank + u32(d)];
        rest = rest / size;
    }
    return index;
}

// Whether (a, ia) beats (b, ib) for the reduction (ties go to the smaller index; NaN beats every
// number and the first NaN wins, as on the CPU and in PyTorch).
fn better(a: f32, ia: u32, b: f32, ib: u32) -> bool {
    if (is_nan(a) || is_nan(b)) {
        return is_nan(a) && (!is_nan(b) || ia < ib);
    }
    if (KIND == 2u) {
        return a < b || (a == b && ia < ib);
    }
    return a > b || (a == b && ia < ib);
}

// A running reduction: the sum (index NONE), or the best value so far and its index (NONE
// before the first).
struct Acc {
    value: f32,
    index: u32,
}

fn empty() -> Acc {
    return Acc(select(select(-f32_inf(), f32_inf(), KIND == 2u), 0.0, KIND == 0u), NONE);
}

// `a` with (x, ix) taken in; an extremum skips an empty partial (index NONE).
fn take(a: Acc, x: f32, ix: u32) -> Acc {
    if (KIND == 0u) {
        return Acc(a.value + x, NONE);
    }
    if (ix != NONE && (a.index == NONE || better(x, ix, a.value, a.index))) {
        return Acc(x, ix);
    }
    return a;
}

// Combines the `a` of each group of `group` invocations into the group's first slot of
// partial / partial_index (all invocations must call it).
fn combine(a: Acc, lid: u32, lane: u32, group: u32) {
    partial[lid] = a.value;
    partial_index[lid] = a.index;
    workgroupBarrier();
    for (var width = group / 2u; width > 0u; width = width / 2u) {
        if (lane < width) {
            let c = take(Acc(partial[lid], partial_index[lid]), partial[lid + width], partial_index[lid + width]);
            partial[lid] = c.value;
            partial_index[lid] = c.index;
        }
        workgroupBarrier();
    }
}

// Chunks per output: params[5] reduced elements each, the last one shorter.
fn chunks_per_output() -> u32 {
    return max((params[2] + params[5] - 1u) / params[5], 1u);
}

// Reduces chunk `s.index` (of output s.index / chunks) into the group's first slot of `partial`.
fn reduce_chunk(s: Slot, lid: u32) {
    let n_out = params[0];
    let kept_rank = params[1];
    let n_red = params[2];
    let red_rank = params[3];
    let chunk_len = params[5];
    let group = params[6];
    let chunks = chunks_per_output();
    let w = s.index;
    let base = params[4] + sub_offset(min(w / chunks, n_out - 1u), kept_rank, SHAPES_AT);
    let red_at = SHAPES_AT + 2u * kept_rank;
    let start = (w % chunks) * chunk_len;
    let end = min(start + chunk_len, n_red);
    var a = empty();
    for (var r = start + s.lane; r < end; r += group) {
        let at = base + sub_offset(r, red_rank, red_at);
        a = take(a, S_load(src[S_word(at)], at), r);
    }
    combine(a, lid, s.lane, group);
}

@compute @workgroup_size(256)
fn reduce(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let s = slot(wid, groups, lid, params[6]);
    reduce_chunk(s, lid);
    if (s.lane == 0u && s.index < params[0]) {
        out[s.index] = D(partial[lid]);
    }
}

@compute @workgroup_size(256)
fn argmax(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let s = slot(wid, groups, lid, params[6]);
    reduce_chunk(s, lid);
    if (s.lane == 0u && s.index < params[0]) {
        out_index[s.index] = partial_index[lid];
    }
}

// Pass 1 of a split reduction: one group per (output, chunk).
@compute @workgroup_size(256)
fn reduce_chunks(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let s = slot(wid, groups, lid, params[6]);
    reduce_chunk(s, lid);
    if (s.lane == 0u && s.index < params[0] * chunks_per_output()) {
        chunk_value[s.index] = partial[lid];
        chunk_index[s.index] = partial_index[lid];
    }
}

// Pass 1 of a column reduction (the kept elements one run of stride 1, split into chunks):
// invocation o of grid row y reduces output o's chunk y in order, reading the address after its
// neighbour's (a bias gradient: [tokens, features] summed over tokens), where reduce_chunks'
// groups read elements a row apart. The grid's x covers the outputs, its y the chunks.
@compute @workgroup_size(256)
fn reduce_column_chunks(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let n_out = params[0];
    let n_red = params[2];
    let red_rank = params[3];
    let chunk_len = params[5];
    let o = wid.x * 256u + lid;
    if (o >= n_out) {
        return;
    }
    // The kept sub-shape is one run of stride 1: its sizes and strides take two words.
    let red_at = SHAPES_AT + 2u;
    let start = wid.y * chunk_len;
    let end = min(start + chunk_len, n_red);
    var a = empty();
    for (var r = start; r < end; r++) {
        let at = params[4] + o + sub_offset(r, red_rank, red_at);
        a = take(a, S_load(src[S_word(at)], at), r);
    }
    chunk_value[o * groups.y + wid.y] = a.value;
    chunk_index[o * groups.y + wid.y] = a.index;
}

// Pass 2: a group folds output `s.index`'s chunks in order into its first slot of `partial`.
fn combine_chunks_of(s: Slot, lid: u32) {
    let chunks = params[1];
    let group = params[2];
    let at = min(s.index, params[0] - 1u) * chunks;
    var a = empty();
    for (var c = s.lane; c < chunks; c += group) {
        a = take(a, chunk_value[at + c], chunk_index[at + c]);
    }
    combine(a, lid, s.lane, group);
}

@compute @workgroup_size(256)
fn combine_chunks(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let s = slot(wid, groups, lid, params[2]);
    combine_chunks_of(s, lid);
    if (s.lane == 0u && s.index < params[0]) {
        out[s.index] = D(partial[lid]);
    }
}

@compute @workgroup_size(256)
fn combine_chunks_argmax(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let s = slot(wid, groups, lid, params[2]);
    combine_chunks_of(s, lid);
    if (s.lane == 0u && s.index < params[0]) {
        out_index[s.index] = partial_index[lid];
    }
}
