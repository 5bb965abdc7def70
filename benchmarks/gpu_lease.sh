#!/usr/bin/env bash
# One lease of a lent GPU machine (an H200 for 15 minutes, all tries together; PyTorch and CuPy there, no
# TVM): first the GPU measurements (the bundle built here, timed there), then the model-size sweep.
# Everything it keeps comes back under $OUT. Prepared here, on the CPU machine:
#
#   tensorlang gpu-bundle $(ls -d data/workloads/*/) --target cuda --per-task 8 --max-io-mb 64 \
#       --max-bundle-mb 40 --model tensorlang/lm/checkpoints/default -o .gpu/bundle
#   tar czf .gpu/bundle.tgz -C .gpu bundle
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       -d .gpu/whl apache-tvm-ffi==0.1.14.post1 lark==1.3.1      # what training imports that the image lacks
#
# (.gpu/ is ignored by git: `echo /.gpu/ >> .git/info/exclude`.) Run it with the device tool:
#   run(command="bash benchmarks/gpu_lease.sh", carry=[".gpu/bundle.tgz", ".gpu/whl"], timeout_s=560)
# and record what came back:
#   tar xzf meta.tgz && tensorlang gpu-ingest .gpu/bundle meta/results.jsonl -o data/measured/cuda
#   python benchmarks/gpu_policies.py .gpu/bundle meta/results.jsonl --json benchmarks/results/gpu_policies_h200.json
#   python benchmarks/gpu_sweep.py --report meta/sweep.json
#   cat tlm-6x384.tgz.part* | tar xz      # the sizes kept, float16
set -u
: "${OUT:?OUT is the folder whose files come back}"
RUNNER_S=${RUNNER_S:-150}   # seconds for the bundle's candidates
SWEEP_S=${SWEEP_S:-320}     # seconds for the sweep's stages
SIZES=${SIZES:-4x256 6x384 4x256/all 8x512}   # SIZE/all: pre-trained on the whole sampled corpus
KEEP=${KEEP:-4x256 6x384 4x256-all}   # sizes brought back (float16; at most 16 MB a file, 64 MB in all)
KEEP_PRETRAIN=${KEEP_PRETRAIN:-4x256-all}  # and their pre-trained stage: a CPU fine-tunes from it (minutes, not hours)
META=/tmp/meta
mkdir -p $META /tmp/b
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl \
    || echo "pip install failed" >> $META/lease.log
export PYTHONPATH=/tmp/site:$PWD
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv;
  python3 -c "import torch, transformers, cupy; print(torch.__version__, transformers.__version__, cupy.__version__)"; } \
    >> $META/lease.log 2>&1

# 1. the GPU measurements: a kernel fault ends the runner (status 3); the rerun resumes after it
start=$SECONDS
tar xzf .gpu/bundle.tgz -C /tmp/b
for try in 1 2 3 4 5 6 7 8; do
    left=$((RUNNER_S - (SECONDS - start)))
    [ $left -lt 10 ] && break
    python3 tensorlang/data/gpu_runner.py /tmp/b/bundle $META --budget-s $left >> $META/runner.log 2>&1
    rc=$?
    echo "runner try $try: exit $rc after $((SECONDS - start)) s" >> $META/lease.log
    [ $rc -ne 3 ] && break
done

# 2. the size sweep (the shipped recipe, from scratch, per size)
python3 benchmarks/gpu_sweep.py --sizes $SIZES --out /tmp/sweep --deadline-s $SWEEP_S ${SWEEP_ARGS:-} 2>&1 \
    | tr '\r' '\n' | grep -v "it/s\]\|s/it\]" > $META/sweep.log
cp /tmp/sweep/sweep.json $META/ 2>/dev/null

# 3. pack: the kept sizes as float16 checkpoints, split under the 16 MB a file
pack() {  # pack SIZE STAGE NAME: a stage's checkpoint as float16, split under the 16 MB a file
    [ -f /tmp/sweep/$1/$2/model.safetensors ] || return
    python3 - "/tmp/sweep/$1/$2" "/tmp/pack/$3" >> $META/lease.log 2>&1 <<'EOF'
import sys
from tensorlang.lm import model as M
model, card = M.load(sys.argv[1])
M.save(model, sys.argv[2], card, dtype="float16")
print(f"packed {sys.argv[2]}: {M.version(M.read_card(sys.argv[2]))}")
EOF
    tar czf /tmp/$3.tgz -C /tmp/pack $3 && split -b 15m -d /tmp/$3.tgz $OUT/$3.tgz.part
}
for size in $KEEP; do pack $size finetune tlm-$size; done
for size in $KEEP_PRETRAIN; do pack $size pretrain tlm-$size-pretrained; done
echo "lease done after $SECONDS s" >> $META/lease.log
tar czf $OUT/meta.tgz -C /tmp meta
ls -la $OUT
