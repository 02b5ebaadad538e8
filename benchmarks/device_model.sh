#!/usr/bin/env bash
# Gemma 3 270M with its real weights on the device, in nine warm calls back to back (the machine is given back 30 s
# after a call and keeps nothing): the 253 MB GGUF travels in eight 32 MB pieces from .gl/ (left out by .gitignore;
# made with `split -n 8 -d -a 2 gemma.gguf part`: the working tree, ~28 MB, travels with every call and a call
# carries 64 MiB at most, the working tree included, so two pieces do not fit one call: s47), the `gguf` package in
# .gl/pylib (benchmarks/NOTES.md, "Gemma 3 270M with its real weights on the GPU"). The last piece's call joins
# and checks the pieces, writes held-out text from the device's own stdlib, and runs bench_model.py.
#   run(command="bash benchmarks/device_model.sh 0", carry=[".gl/pylib", ".gl/part00"])  (or `lib` alone first)
#   run(command="bash benchmarks/device_model.sh 1", carry=[".gl/part01"])      ... 2 to 6 likewise
#   run(command="bash benchmarks/device_model.sh 7 [bench_model.py options]", carry=[".gl/part07"])
#   run(command="bash benchmarks/device_model.sh 7 profile [B [PSA options]]", carry=[".gl/part07"])
# Default options: the compiled 32K step at B = 32 and 8, the paged dense kernel and PSA speculating 1.0 with
# one, four and eight chunks past the margin.
# `profile`: where the compiled 32K step's GPU time goes, kernel by kernel (profile_model_step.py), PSA then the
# paged dense step, B = 32 unless given; PSA's options (e.g. `--step 320 --first-chunk predicted`) replace the
# default `--speculate 1.0`. While the machine is warm, `device_model.sh again [...]` runs the same
# on the pieces already joined (no carry).
set -u
LAST=7  # the last piece (split -n 8)
N="${1:?give the piece: lib, 0..$LAST, or again}"
shift
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks:/tmp/g/pylib" OUT="${OUT:-/tmp/psa-out}"
mkdir -p /tmp/g "$OUT"
if [ "$N" = again ]; then
  [ -f /tmp/g/gemma.gguf ] || { echo "no /tmp/g/gemma.gguf: the machine was given back; start again from lib and piece 0"; exit 1; }
else
  if [ "$N" = lib ]; then cp -r .gl/pylib /tmp/g/ && echo "on the device: $(ls /tmp/g | tr '\n' ' ')"; exit $?; fi
  [ -d .gl/pylib ] && cp -r .gl/pylib /tmp/g/  # carried with piece 0 to save a call
  cp ".gl/part0$N" /tmp/g/ || exit 1
  echo "on the device: $(ls /tmp/g | tr '\n' ' ')"
  [ "$N" = $LAST ] || exit 0
  (cd /tmp/g && cat part0? > gemma.gguf && rm part0?)
fi
SUM=$(sha256sum /tmp/g/gemma.gguf | cut -c1-16)
if [ "$SUM" != a5fd3b62230aa5ec ]; then echo "gemma.gguf sha256 $SUM, expected a5fd3b62230aa5ec: a piece is missing"; exit 1; fi
python3 -c "import xml, multiprocessing, pathlib as p
open('/tmp/g/held.txt', 'w').write(''.join(f.read_text() for m in (xml, multiprocessing)
                                             for f in sorted(p.Path(m.__file__).parent.rglob('*.py'))))"
if [ "${1:-}" = profile ]; then
  B="${2:-32}"; shift; [ $# -gt 0 ] && shift
  PSA_OPTS="${*:---speculate 1.0}"  # PSA's options (profile_model_step.py: --step, --first-chunk, --rank, --speculate)
  for mode in psa dense; do
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 270 python3 benchmarks/profile_model_step.py \
        --model gemma3 --weights /tmp/g/gemma.gguf --text /tmp/g/held.txt --context 32768 --batch "$B" --mode $mode \
        --compile --steps 5 $([ $mode = psa ] && echo "$PSA_OPTS") > "$OUT/profile_gemma3_32k_$mode.txt" 2>&1
    echo "profile $mode rc=$?"; grep -v Warn "$OUT/profile_gemma3_32k_$mode.txt" | tail -42
  done
  exit 0
fi
[ $# -gt 0 ] || set -- --compile --contexts 32768 --batches 32,8 --steps 16 --methods paged,psa0.95s1.0,psa0.95s1.0x4,psa0.95s1.0x8
# MODEL_RUN: what runs bench_model.py (default python3), e.g. MODEL_RUN="python3 benchmarks/exp_kernels_attr.py
# LOOP_GRID=0,64 --" for an A/B of a launch constant in one call (each value runs the bench once)
timeout 540 ${MODEL_RUN:-python3} benchmarks/bench_model.py --model gemma3 --weights /tmp/g/gemma.gguf \
    --text /tmp/g/held.txt --out "$OUT/model_gemma3.jsonl" "$@" 2>&1 | grep -v Warn | tail -40
echo "bench_model rc=${PIPESTATUS[0]}"
