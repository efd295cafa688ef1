// reduce: one workgroup per output element; its 256 invocations stride over the reduced elements
// and combine in workgroup memory (a fixed order, so results are deterministic). Sums accumulate
// in f32 for every `T`. ArgMax returns the first index of the maximum (u32) over one axis.
// params: [n_out, kept_rank, n_reduced, reduced_rank, offset,
//        kept dims[kept_rank], kept strides[kept_rank], reduced dims[reduced_rank], reduced strides[reduced_rank]]

override KIND: u32 = 0u; // 0 sum, 1 max, 2 min, 3 argmax

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;
@group(0) @binding(3) var<storage, read_write> out_index: array<u32>;

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

// Reduces output element `o` into partial[0] / partial_index[0] (all invocations must call it).
fn reduce_into_partial(o: u32, lid: u32) {
    let n_out = params[0];
    let kept_rank = params[1];
    let n_red = params[2];
    let red_rank = params[3];
    let base = params[4] + sub_offset(min(o, n_out - 1u), kept_rank, 5u);
    let red_at = 5u + 2u * kept_rank;
    var acc = select(select(-f32_inf(), f32_inf(), KIND == 2u), 0.0, KIND == 0u);
    var acc_index = 0xffffffffu;
    for (var r = lid; r < n_red; r += WG) {
        let x = f32(src[base + sub_offset(r, red_rank, red_at)]);
        if (KIND == 0u) {
            acc += x;
        } else if (acc_index == 0xffffffffu || better(x, r, acc, acc_index)) {
            acc = x;
            acc_index = r;
        }
    }
    partial[lid] = acc;
    partial_index[lid] = acc_index;
    workgroupBarrier();
    for (var width = WG / 2u; width > 0u; width = width / 2u) {
        if (lid < width) {
            let other = partial[lid + width];
            let other_index = partial_index[lid + width];
            if (KIND == 0u) {
                partial[lid] += other;
            } else if (other_index != 0xffffffffu
                && (partial_index[lid] == 0xffffffffu || better(other, other_index, partial[lid], partial_index[lid]))) {
                partial[lid] = other;
                partial_index[lid] = other_index;
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(256)
fn reduce(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let o = wid.x + wid.y * groups.x;
    reduce_into_partial(o, lid);
    if (lid == 0u && o < params[0]) {
        out[o] = T(partial[0]);
    }
}

@compute @workgroup_size(256)
fn argmax(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let o = wid.x + wid.y * groups.x;
    reduce_into_partial(o, lid);
    if (lid == 0u && o < params[0]) {
        out_index[o] = partial_index[0];
    }
}
