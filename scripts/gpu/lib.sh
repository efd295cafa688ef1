# Shared by verify.sh and sweep.sh, sourced after they set `out` (the report directory, with
# logs/ made), `python` and `only` (",step,step," or empty for every step): finds the CUDA
# libraries, sets the environment every step runs in, and defines `step`.

steps="$out/steps.tsv"
: >"$steps"

# ---- libraries ---------------------------------------------------------------------------
# Every directory a CUDA library may sit in: the Python wheels first (PyTorch's), then toolkits.
search_dirs() {
    "$python" - <<'PY' 2>/dev/null
import site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]:
    print(d)
PY
    ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 2>/dev/null
    echo /usr/lib/x86_64-linux-gnu
}
find_lib() {
    local name="$1" d hit
    while read -r d; do
        [ -d "$d" ] || continue
        hit=$(find -L "$d" -maxdepth 5 -name "$name" -print -quit 2>/dev/null)
        [ -n "$hit" ] && { echo "$hit"; return 0; }
    done < <(search_dirs)
    return 1
}
shim="$out/lib"
mkdir -p "$shim"
lib_path=""
{
    for lib in libnvrtc.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcudnn.so.9; do
        if path=$(find_lib "$lib"); then
            echo "$lib: $path"
            case ":$lib_path:" in *":$(dirname "$path"):"*) ;; *) lib_path="$lib_path:$(dirname "$path")" ;; esac
            # NCCL's wheel ships only libnccl.so.2; the loader asks for libnccl.so.
            [ "$lib" = libnccl.so.2 ] && ln -sf "$path" "$shim/libnccl.so"
        else
            echo "$lib: NOT FOUND"
        fi
    done
    echo "libcuda.so.1: $(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')"
    echo "libnvidia-ml.so.1: $(ldconfig -p | awk '/libnvidia-ml.so.1 /{print $NF; exit}')"
} >"$out/logs/libraries.log" 2>&1
export LD_LIBRARY_PATH="$shim$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$out/logs/libraries.log"
# Kernels compile once per machine into this cache; keep it with the report.
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$out/cache}"
export LOCKSTEP_EXPECT_CUDA=1 LOCKSTEP_EXPECT_NCCL=1 RUST_BACKTRACE=1

# ---- steps -------------------------------------------------------------------------------
# step NAME LIMIT_SECONDS COMMAND...: runs it with its log in logs/NAME.log and one line in
# steps.tsv (name, exit code, seconds, command); a failure is recorded, not fatal.
step() {
    local name="$1" limit="$2"
    shift 2
    if [ -n "$only" ] && [[ "$only" != *",$name,"* ]]; then return 0; fi
    [ -n "${LOCKSTEP_STEP_LIMIT:-}" ] && [ "$LOCKSTEP_STEP_LIMIT" -lt "$limit" ] && limit=$LOCKSTEP_STEP_LIMIT
    local start end rc
    echo "== $name: $*" >&2
    start=$(date +%s%N)
    timeout -k 10 "$limit" "$@" >"$out/logs/$name.log" 2>&1
    rc=$?
    end=$(date +%s%N)
    printf '%s\t%s\t%d.%d\t%s\n' "$name" "$rc" $(((end - start) / 1000000000)) $(((end - start) / 100000000 % 10)) "$*" >>"$steps"
    [ $rc = 0 ] || echo "   $name failed (exit $rc): $(tail -n 3 "$out/logs/$name.log" | tr '\n' ' ')" >&2
    return 0
}
