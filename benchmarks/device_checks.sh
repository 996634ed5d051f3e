#!/usr/bin/env bash
# The GPU checks of issues 10 (SPD / APD) and 12 (mixture quadratic), prepared for one call of the `device` tool.
#
# Here, once (needs the package registry and ../shared/data; writes the git-ignored folder .device/):
#     bash benchmarks/device_checks.sh --prepare
# There (the device image's python3 holds torch with CUDA; nothing can be fetched, so the one dependency it lacks,
# schedulefree, travels as a wheel, and MNIST as files), one call per line, each within the 10 minutes a command may
# run:
#     run(command="bash benchmarks/device_checks.sh env tests spd_steps mixture", carry=[".device"], timeout_s=600)
#     run(command="bash benchmarks/device_checks.sh spd_resid1 apd_resid1", carry=[".device"], timeout_s=600)
#     run(command="bash benchmarks/device_checks.sh polynomial", carry=[".device"], timeout_s=600)
# A session has 15 minutes of device time in all, the machine's start included: run the first call, read it, and the
# others only where time is left.
# Checks (each under its own time limit, in seconds; a failed one does not stop the others):
#     env         python, torch, the GPU                                                               30
#     tests       the tests that exercise a device (the CUDA ones skip on a machine without it)       180
#     spd_steps   benchmarks/bench_spd_steps.py --device cuda, paper presets (SPD beside APD)        240
#     mixture     benchmarks/bench_mixture_solver.py --device cuda: the main job's 784-512-10 Ledoit-Wolf
#                 problem in float32 / bfloat16 / warm-started, beside float32 on the machine's CPU   240
#     spd_resid1  mlpinterp reproduce spd --setting resid-mlp-1 (paper preset, 1 seed) --device cuda  420
#     apd_resid1  mlpinterp reproduce apd --setting resid-mlp-1 (paper preset, 1 seed) --device cuda  300
#     polynomial  mlpinterp reproduce polynomial --dataset mnist --seeds 1: the main job, its 19 mixture-quadratic
#                 solves on the GPU (fit_mixture's default device where CUDA is available), training on one
#                 CPU thread as everywhere                                                            540
# Every log lands in $OUT (the device tool's folder that comes back; .device/out here), with the runs' metrics.json,
# results.json and report.md.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--prepare" ]]; then
    set -e
    mkdir -p .device/wheels .device/data/mnist
    python3 -m pip download -q --no-deps -d .device/wheels "schedulefree>=1.2"
    src="${MLPINTERP_DATA:-../shared/data}/mnist"
    cp "$src"/*-ubyte.gz .device/data/mnist/
    du -sh .device
    exit 0
fi

OUT="${OUT:-.device/out}"
mkdir -p "$OUT"
if [[ ! -d .device/wheels ]]; then
    echo "no .device/wheels: run 'bash benchmarks/device_checks.sh --prepare' here first and carry .device" >&2
    exit 2
fi
python3 -m pip install -q --no-index --no-deps --target .device/site .device/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH="$PWD/src:$PWD/.device/site" PYTHONUNBUFFERED=1 MLPINTERP_DATA="$PWD/.device/data" MPLBACKEND=Agg
threads=$(nproc)

check() {  # check NAME LIMIT COMMAND...: run it under LIMIT seconds, log to $OUT/NAME.log, report its status
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit} s)"
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$name.log"
    echo "=== $name: exit $rc after $((SECONDS - t0)) s$([[ $rc == 124 ]] && echo ' (time limit)')"
}

mlpinterp() { python3 -c "from mlpinterp.cli.main import main; main()" "$@"; }

steps=("$@")
[[ ${#steps[@]} == 0 ]] && steps=(env tests spd_steps mixture)
for step in "${steps[@]}"; do
    case "$step" in
        env) check env 30 bash -c 'python3 --version; nvidia-smi --query-gpu=name,memory.total,driver_version \
            --format=csv; python3 -c "import torch; print(torch.__version__, torch.cuda.is_available(), \
            torch.cuda.get_device_name(0)); import mlpinterp, schedulefree; print(\"imports ok\")"' ;;
        tests) check tests 180 python3 -m pytest -q -p no:cacheprovider -k "cuda or device" tests ;;
        spd_steps) check spd_steps 240 python3 benchmarks/bench_spd_steps.py --device cuda --presets paper \
            --steps 20 --settings tms-5-2 tms-40-10 resid-mlp-1 resid-mlp-2 resid-mlp-3 ;;
        mixture) check mixture 240 python3 benchmarks/bench_mixture_solver.py --case mnist --d-hidden 512 \
            --covariance ledoit-wolf --device cuda --threads "$threads" --solvers cpu32 float32 bf16 warm32 \
            --out "$OUT/mixture.json" ;;
        spd_resid1) check spd_resid1 420 mlpinterp reproduce spd --setting resid-mlp-1 --seeds 1 --device cuda \
            --out .device/runs/spd-resid-mlp-1 ;;
        apd_resid1) check apd_resid1 300 mlpinterp reproduce apd --setting resid-mlp-1 --seeds 1 --device cuda \
            --out .device/runs/apd-resid-mlp-1 ;;
        polynomial) check polynomial 540 mlpinterp reproduce polynomial --dataset mnist --seeds 1 \
            --out .device/runs/polynomial-mnist --quiet ;;
        *) echo "unknown check $step (env tests spd_steps mixture spd_resid1 apd_resid1 polynomial)" >&2 ;;
    esac
done
for f in .device/runs/*/metrics.json .device/runs/*/results.json .device/runs/*/report.md; do
    [[ -f $f ]] && cp "$f" "$OUT/$(basename "$(dirname "$f")")-$(basename "$f")"
done
exit 0
