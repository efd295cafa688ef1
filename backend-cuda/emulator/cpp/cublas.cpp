// The cuBLAS calls the backend makes, on the CPU: strided batched GEMMs in f32, f16 and bf16
// (column-major, f32 accumulation in k order, one rounding to the output type). TF32 and the
// math mode are accepted and ignored: every product here is a full f32 one.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "kernel_dialect.h"
#include "prelude.cuh"

typedef int cublasStatus_t;
typedef void* cublasHandle_t;

namespace {

enum : cublasStatus_t { SUCCESS = 0, INVALID_VALUE = 7, NOT_SUPPORTED = 15 };
enum : int { R_32F = 0, R_16F = 2, R_16BF = 14 };

char a_handle;

// Elements converted as the kernels convert them (the prelude's to_f32 and from_f32).
float load(const void* base, int type, long long i) {
    switch (type) {
    case R_32F: return static_cast<const float*>(base)[i];
    case R_16F: return to_f32(static_cast<const f16*>(base)[i]);
    default: return to_f32(static_cast<const bf16*>(base)[i]);
    }
}

void store(void* base, int type, long long i, float x) {
    switch (type) {
    case R_32F: static_cast<float*>(base)[i] = x; break;
    case R_16F: static_cast<f16*>(base)[i] = from_f32<f16>(x); break;
    default: static_cast<bf16*>(base)[i] = from_f32<bf16>(x); break;
    }
}

// op(X) of `rows` x `depth` as row-major f32: X is column-major with leading dimension ld.
void gather(std::vector<float>& out, const void* x, int type, bool transpose, int rows, int depth, int ld) {
    out.resize((size_t)rows * depth);
    for (int r = 0; r < rows; ++r)
        for (int d = 0; d < depth; ++d)
            out[(size_t)r * depth + d] = load(x, type, transpose ? (long long)r * ld + d : (long long)d * ld + r);
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
    *handle = &a_handle;
    return SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t) { return SUCCESS; }
cublasStatus_t cublasSetStream_v2(cublasHandle_t, void*) { return SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, int) { return SUCCESS; }

// C = alpha · op(A) · op(B) + beta · C for each of `batch` matrices; C is not read when beta is
// 0 (as cuBLAS promises, so NaN in fresh memory does not leak in). alpha and beta are host f32.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, int transa, int transb, int m, int n, int k,
                                          const void* alpha, const void* a, int a_type, int lda,
                                          long long stride_a, const void* b, int b_type, int ldb,
                                          long long stride_b, const void* beta, void* c, int c_type, int ldc,
                                          long long stride_c, int batch, int /*compute*/, int /*algo*/) {
    for (int type : {a_type, b_type, c_type})
        if (type != R_32F && type != R_16F && type != R_16BF) return NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || transa > 1 || transb > 1) return INVALID_VALUE;
    float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
    size_t a_size = a_type == R_32F ? 4 : 2, b_size = b_type == R_32F ? 4 : 2;
    std::vector<float> a_rows, b_cols;
    for (int p = 0; p < batch; ++p) {
        const char* ap = static_cast<const char*>(a) + (size_t)(p * stride_a) * a_size;
        const char* bp = static_cast<const char*>(b) + (size_t)(p * stride_b) * b_size;
        long long c0 = p * stride_c;
        gather(a_rows, ap, a_type, transa == 1, m, k, lda);
        // op(B) is k x n; its columns as rows: op(B)ᵀ, n x k.
        gather(b_cols, bp, b_type, transb != 1, n, k, ldb);
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < m; ++i) {
                const float* x = &a_rows[(size_t)i * k];
                const float* y = &b_cols[(size_t)j * k];
                float sum = 0.0f;
                for (int l = 0; l < k; ++l) sum += x[l] * y[l];
                long long at = c0 + (long long)j * ldc + i;
                float out = al * sum;
                if (be != 0.0f) out += be * load(c, c_type, at);
                store(c, c_type, at, out);
            }
    }
    return SUCCESS;
}

}  // extern "C"
