#!/usr/bin/env bash
# One device call (about 8 minutes) that checks branch wip/pending, whose GPU code has not run on a GPU yet:
# rank="share" on the GPU (kernels/share.cu) and the compiled window layers (window_decode_attention), then the
# kernel benchmark on real captured K/V. Run from the repository root with the branch checked out:
#   run(command="bash benchmarks/device_pending.sh", carry=[".gl/gemma3_xml_l17_32k.npz"])
# The whole-model checks need the Gemma GGUF on the machine first (benchmarks/NOTES.md: six warm calls carrying
# .gl/part00..05, joined in /tmp/g), then:
#   python3 benchmarks/bench_model.py --compile [--rank share] --model gemma3 --weights /tmp/g/gemma.gguf \
#       --text /tmp/g/held.txt --contexts 32768 --batches 1,8,32 --steps 32 --methods sdpa,paged,psa0.95s1.0
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks" OUT="${OUT:-/tmp/psa-out}"
mkdir -p "$OUT"
echo "== rank='share' on the GPU"
timeout 240 python3 -m pytest -q -p no:cacheprovider -W ignore -rf --tb=short tests/test_fast.py \
    -k "share_rank or psa_conforms or agrees" > "$OUT/t_share.log" 2>&1; echo "rc=$?"; tail -4 "$OUT/t_share.log"
echo "== compiled window layers"
timeout 150 python3 -m pytest -q -p no:cacheprovider -W ignore -rf --tb=short tests/test_fast_hf.py \
    -k "compiled or captured or baseline" > "$OUT/t_windows.log" 2>&1; echo "rc=$?"; tail -4 "$OUT/t_windows.log"
if [ -f .gl/gemma3_xml_l17_32k.npz ]; then
    echo "== real K/V (Gemma 3 layer 17, 32K)"
    timeout 150 python3 benchmarks/bench_decode.py --profile real --kv .gl/gemma3_xml_l17_32k.npz --shape gemma3 \
        --sizes 32768 --batches 1,8 --reps 10 --skip tau0.9,remaining --out "$OUT" > "$OUT/real.log" 2>&1
    echo "rc=$?"; tail -12 "$OUT/real.log"
fi
