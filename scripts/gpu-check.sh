#!/usr/bin/env bash
# The GPU check: runs the binaries `cargo xtask cuda-build` gathered (no Rust toolchain, no
# network needed) on a machine with an NVIDIA GPU, and prints what docs/BENCHMARKS.md records
# under "Backends".
#
#   gpu-check.sh [MODEL]
#
# Run it from the bundle (target/gpu-check): bin.tar.xz, this script, golden_visible.jsonl. MODEL is
# SmolLM2-135M-Instruct.Q4_1.gguf (default: next to this script, else ../../models/). The CUDA
# runtime and cuBLAS 13 are taken from CUDA_PATH, /usr/local/cuda or the loader's path.
# Each step prints PASS or FAIL; the exit status is the number of failed steps.
set -u
here=$(cd "$(dirname "$0")" && pwd)
model=${1:-}
for m in "$model" "$here/SmolLM2-135M-Instruct.Q4_1.gguf" "$here/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"; do
    if [ -n "$m" ] && [ -f "$m" ]; then model=$m; break; fi
done
[ -f "$model" ] || { echo "the model SmolLM2-135M-Instruct.Q4_1.gguf was not found; give its path"; exit 2; }
for d in "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-13; do
    for lib in "$d/lib64" "$d/lib" "$d/targets/x86_64-linux/lib"; do
        [ -n "$d" ] && [ -d "$lib" ] && export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
    done
done
# Python's CUDA packages (nvidia-cublas, nvidia-cuda-runtime) carry the same libraries where no
# toolkit is installed: their folders come after the toolkit's.
if command -v python3 > /dev/null; then
    while IFS= read -r lib; do
        [ -n "$lib" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$lib"
    done < <(python3 - <<'PY' 2>/dev/null
import glob, os, sys
seen = []
for root in sys.path:
    for lib in glob.glob(os.path.join(root, "nvidia", "*", "lib")):
        if glob.glob(os.path.join(lib, "libcu*.so.13*")) and lib not in seen:
            seen.append(lib)
print("\n".join(seen))
PY
)
fi
bin=$here/bin
# The binaries arrive as one xz-compressed tar (cargo xtask cuda-build); unpacked once.
if [ -f "$here/bin.tar.xz" ] && [ ! -d "$bin" ]; then
    if command -v xz > /dev/null; then xz -dc "$here/bin.tar.xz" | tar -C "$here" -xf -
    else python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$here/bin.tar.xz" "$here"
    fi || { echo "could not unpack $here/bin.tar.xz"; exit 2; }
fi
for exe in "$bin"/*; do
    missing=$(ldd "$exe" 2>/dev/null | grep "not found")
    [ -n "$missing" ] && echo "$(basename "$exe"): libraries not found: $missing"
done
out=${GPU_CHECK_OUT:-$here/out}
mkdir -p "$out"
failed=0
step() { # name, command...
    local name=$1; shift
    echo "== $name"
    local start=$(date +%s.%N)
    if "$@"; then echo "PASS $name ($(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo ?) s)";
    else echo "FAIL $name"; failed=$((failed + 1)); fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

# 1. ggml's CUDA backend against its CPU backend, op by op.
step "ggml-sys: CUDA backend against the CPU backend" \
    "$bin/ggml-sys-cuda" --ignored --nocapture --test-threads 1

# 2. The engine's tiny models and the real model with every layer on the GPU (tolerance
#    instead of bit equality), pages moved between the GPU and the CPU, a checkpoint saved
#    from VRAM and resumed on the CPU.
step "engine: offloaded layers, pages across tiers, GPU save / CPU restore" \
    env LLAMA_HDD_TEST_GPU=1 LLAMA_HDD_MODEL="$model" "$bin/engine-offload" --nocapture --test-threads 1

# 3. The golden prompts: greedy tokens and top-10 logits, all layers on the GPU against the CPU.
golden() {
    "$bin/generate" --model "$model" --golden "$here/golden_visible.jsonl" -n 32 --n-gpu-layers 0 > "$out/golden_cpu.jsonl" &&
    "$bin/generate" --model "$model" --golden "$here/golden_visible.jsonl" -n 32 --n-gpu-layers 99 > "$out/golden_gpu.jsonl" &&
    python3 - "$out/golden_cpu.jsonl" "$out/golden_gpu.jsonl" <<'PY'
import json, sys
cpu = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
gpu = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
assert len(cpu) == len(gpu) > 0
bad = 0
for c, g in zip(cpu, gpu):
    cl, gl = dict(c["top10"]), dict(g["top10"])
    worst = max(abs(cl[t] - gl.get(t, float("inf"))) for t in cl)
    same_ids = [t for t, _ in c["top10"]] == [t for t, _ in g["top10"]]
    first = next((i for i, (a, b) in enumerate(zip(c["greedy"], g["greedy"])) if a != b), None)
    print(f"{c['prompt'][:40]!r:44} top10 max |diff| {worst:.3e} same order {same_ids} "
          f"greedy {'identical' if first is None and len(c['greedy']) == len(g['greedy']) else f'first differs at {first}'}")
    bad += worst > 5e-2
print(f"{len(cpu)} prompts, {bad} beyond 5e-2")
sys.exit(1 if bad else 0)
PY
}
step "golden prompts: GPU against CPU" golden

# 4. Speed with every layer offloaded: prefill, decode, save, and restore of a 2,048-token
#    conversation from disk into VRAM (the CPU run beside it, for the ratio).
bench() {
    for ngl in 0 99; do
        rm -rf "$out/ckpt"
        "$bin/bench" --model "$model" --n-gpu-layers $ngl --prompt-tokens 2048 --gen-tokens 128 \
            --reps 3 --checkpoint "$out/ckpt" --restore-reps 5 > "$out/bench_ngl$ngl.json" || return 1
        cat "$out/bench_ngl$ngl.json"
    done
    rm -rf "$out/ckpt"
}
step "bench: prefill, decode, save, restore (ngl 0 and 99)" bench

echo "failed steps: $failed"
exit $failed
