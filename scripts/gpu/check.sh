#!/usr/bin/env bash
# The GPU node check in one command (≤ 9 min on one H200), or the same stages shrunk on a CPU (--tiny):
#   scripts/gpu/check.sh --out DIR [--tiny] [--work DIR] [--wheels DIR] [--budget S] [--stage-budget STAGE=S]...
#                        [--only STAGE,...]     # a rerun of some stages (more time for one: --stage-budget)
#   scripts/gpu/check.sh --print-plan [--tiny]   # every stage's budget and command, nothing run
# Each stage runs the harness's own entry points under `timeout --kill-after` (SIGTERM to the command's whole
# process group at its budget, so a training run records itself as interrupted; SIGKILL 20 s later); a stage that
# fails or runs out of time is recorded and the next one starts. After every stage scripts/gpu/report.py rewrites
# DIR/report.md and report.json from what the stages left. DIR gets at most 8 files (report.md, report.json,
# check.log, stages.log, bench_bfloat16.json, bench_float32.json, train_step.json, listops_curves.csv); the rest
# goes under --work. Runs from the source tree (the node is offline): the wheels in .whl/ (scripts/gpu/prepare.sh)
# supply what the node's Python lacks ($WHEEL_LIST: another list than scripts/gpu/wheels.txt). $PYTHON picks the
# interpreter (default python3).
set -uo pipefail
STAGES=(wheels env listops_data listops_train gpu_tests fast_tier bf16_smoke bench_bfloat16 bench_float32 train_step
  table)
SIDE=(gpu_tests fast_tier bf16_smoke) # run beside the three ListOps runs, inside listops_train's window
declare -A B RC SEC NOTE JOB
fail() { echo "error: $*" >&2 && exit 2; }

# The plan. GPU: the Nyströmformer ListOps protocol as run.py composes it (official-size data, 5000 steps, bf16),
# only the diagnostics lighter (a 256-token probe at every 20th validation and at each improvement: the default
# 1024-token fp64 SVDs would add seconds to each of 100 validations); the three runs share the one GPU while the
# side stages run on the CPU cores; the bench runs alone afterwards, on an idle GPU. Tiny: the same on a CPU.
plan() {
  FAST=(tests/test_run.py) # fast-tier files whose code picks the device (the rest has its CUDA twin in test_gpu.py)
  if ((tiny)); then
    mode=tiny total=640 threads=1 budgets=(30 30 60 300 90 150 150 60 60 40 20)
    TASK=(task.max_length=128 task.seq_len=128 task.gen_num_train=320 task.gen_num_val=32 task.gen_num_test=32
      task.gen_min_length=8 task.gen_max_length=128 task.gen_max_depth=5 task.gen_max_args=5)
    DATA=(task.gen_workers=2) # the parallel generator path, even on 2 cores
    TRAIN=(trainer=cpu data.batch_size=8 trainer.max_steps=20 trainer.val_check_interval=10 trainer.limit_val_batches=2
      optim.warmup_steps=2 callbacks.stats_warmup_steps=2 diagnostics.max_len=64)
    SMOKE=(trainer=cpu trainer.precision=bf16-mixed task.max_length=128 task.seq_len=128 data.batch_size=8
      trainer.max_steps=4 trainer.val_check_interval=2 trainer.limit_val_batches=1 optim.warmup_steps=1
      callbacks.stats_warmup_steps=1 diagnostics.max_len=32 task.gen_num_train=64 task.gen_num_val=16
      task.gen_num_test=16 task.gen_min_length=8 task.gen_max_length=128 task.gen_max_depth=5)
    BENCH=(device=cpu threads=1 "attns=[full,nystrom,gpa]" "landmarks=[16]" "references=[sdpa_flash]"
      "seq_lens=[64,128]" batch_size=1 warmup=1 repeats=2 min_repeats=1 max_time_s=0.2 count_flops=false
      matmul.size=128)
    STEP=(--device cpu --attn nystrom --steps 1 --warmup 0 --threads 1 task.seq_len=128 task.max_length=100
      model.dim=16 data.batch_size=4)
    NOTES=("tiny mode: CPU, everything shrunk — the numbers test the script, not the methods")
  else
    mode=gpu total=530 threads=2 budgets=(30 15 90 280 80 110 80 40 35 25 15)
    TASK=() DATA=() TRAIN=(trainer=gpu diagnostics.max_len=256 diagnostics.every_n_validations=20)
    SMOKE=(trainer=gpu task.max_length=512 task.seq_len=512 data.batch_size=16 trainer.max_steps=30
      trainer.val_check_interval=15 trainer.limit_val_batches=2 optim.warmup_steps=5 diagnostics.max_len=128
      task.gen_num_train=256 task.gen_num_val=32 task.gen_num_test=32 task.gen_min_length=64 task.gen_max_length=512)
    BENCH=(device=cuda "attns=[full,nystrom,gpa,spectral,pivoted,skyformer]" "landmarks=[64]"
      "references=[sdpa_flash,sdpa_efficient]" "seq_lens=[1024,2048,4096,8192,16384,32768]" batch_size=8 warmup=2
      repeats=10 min_repeats=3 max_time_s=0.3 count_flops=true count_flops_max_n=2048)
    STEP=(--device cuda --attn full nystrom gpa --precisions 32-true bf16-mixed --steps 5 --warmup 2)
    FAST+=(tests/test_reliability.py tests/test_bench.py)
    "$PY" -c "import xdist" 2>/dev/null && FAST+=(-n 4)
    NOTES=("ListOps diagnostics: a 256-token probe at every 20th validation and at each val/acc improvement"
      "ListOps step times: three runs share one GPU, beside the gpu_tests, fast_tier and bf16_smoke stages")
  fi
  SMOKE+=(trainer.log_every_n_steps=1) # every step's loss in the CSV: the smoke checks each is finite
  BENCH+=(isolate=false profile.enabled=false plots=false) # CUDA peaks are per-process counters: no fork needed
}
now() { echo "${EPOCHREALTIME/./}"; } # microseconds
say() { ((print)) || { local d=$((($(now) - t0) / 100000)) && echo "[check $((d / 10)).$((d % 10))s] $*"; }; }
tag() { # each line into WORK/log/LABEL.log and, prefixed, into stages.log (at most 3 MiB a label: the transfer limit)
  awk -v l="[$1] " -v f="$work/log/$1.log" -v cap=$((3 << 20)) '{ print >> f; n += length(l $0) + 1 }
    n <= cap { print l $0; fflush() } n > cap && !c++ { print l "... output beyond 3 MiB not kept here"; fflush() }' \
    >>"$out/stages.log"
}
launch() { # LABEL SECONDS CMD...: in the background; `finish LABEL` waits for it and returns its exit code
  printf '%s\t%s\n' "$1" "${*:3}" >>"$work/commands.tsv"
  if ((print)); then printf 'command %s' "$1" && printf ' %q' "${@:3}" && echo && return; fi
  local label=$1 secs=$2 && shift 2 && echo "\$ $*" | tag "$label"
  { local t && t=$(now); timeout -k 20 "$secs" "$@" </dev/null 2>&1 & echo $! >"$work/pid/$label" && wait $!
    echo "$? $((($(now) - t) / 1000))" >"$work/rc/$label"; } | tag "$label" & # exit code, milliseconds
  JOB[$label]=$!
}
finish() {
  ((print)) && return 0
  wait "${JOB[$1]}"
  unset "JOB[$1]" && rm -f "$work/pid/$1"
  local rc ms && read -r rc ms <"$work/rc/$1" && echo "exit $rc after $ms ms" | tag "$1" && return "$rc"
}
run() { launch "$@" && finish "$1"; }
stop_all() { # external SIGTERM/Ctrl-C: every running stage gets the same treatment as at its budget
  local f j && for f in "$work"/pid/*; do [ -e "$f" ] && kill -TERM "$(<"$f")" 2>/dev/null; done
  for j in "${JOB[@]}"; do wait "$j"; done
}
render() { # report.md/json from what the stages left; prints one line about STAGE (or the table, with --final)
  ((print)) && return
  for s in "${STAGES[@]}"; do printf '%s\t%s\t%s\t%s\t%s\n' "$s" "${RC[$s]-}" "${B[$s]}" "${SEC[$s]-}" "${NOTE[$s]-}"
  done >"$work/stages.tsv"
  local notes=() n && for n in "${NOTES[@]}"; do notes+=(--note "$n"); done
  "$PY" -m scripts.gpu.report render --out "$out" --work "$work" --mode $mode --budget "$budget" "${notes[@]}" \
    --command "scripts/gpu/check.sh $argv" --elapsed $((($(now) - t0) / 1000)) "$@"
}
stage() { # NAME [CAP]: stage_NAME with its time left (skipped under 3 s), its status recorded, the report rewritten
  [[ -z $only || $only == *",$1,"* ]] || return 0
  local name=$1 t=${B[$1]} start reserve=10 && [ "$1" = table ] && reserve=0 # kept back for the final table
  local left=$(((deadline - $(now)) / 1000000 - reserve)) cap=${2:-$t} && ((left < t)) && t=$left
  ((cap < t)) && t=$cap
  if ((t < 3)); then
    RC[$name]=skip NOTE[$name]="no time left (the check's budget or its window)" && say "$(render --stage "$name")"
    return
  fi
  RC[$name]=run && render && say "$name: start (budget $t s)" && start=$(now)
  "stage_$name" "$t"
  local rc=$? && [ "${RC[$name]}" = skip ] || RC[$name]=$rc
  SEC[$name]=$((($(now) - start) / 1000)) && say "$(render --stage "$name")"
}

stage_wheels() { # install only what the node lacks: a carried copy of one of its own packages would shadow it
  local spec module name site=$work/site list=${WHEEL_LIST:-scripts/gpu/wheels.txt} missing=() absent=() names=()
  while read -r spec module _; do
    [[ -z $spec || $spec == \#* ]] || "$PY" -c "import importlib.util as u, sys; sys.exit(not u.find_spec('$module'))" \
      2>/dev/null || missing+=("$spec")
  done <"$list"
  for spec in "${missing[@]}"; do # wheel file names spell the distribution with _ (PEP 427)
    name=${spec%%==*} && compgen -G "$wheels/${name//-/_}-${spec#*==}-*.whl" >/dev/null || absent+=("$name")
  done
  ((${#absent[@]})) && NOTE[wheels]="no wheel in $wheels for ${absent[*]}: run scripts/gpu/prepare.sh" && return 1
  ((${#missing[@]})) || { NOTE[wheels]="nothing to install: every listed module is there" && return 0; }
  run wheels "$1" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
    --find-links "$wheels" --target "$site" "${missing[@]}" || return
  for name in "$site"/*; do # what the site adds that the node already has (namespace packages merge instead)
    [[ $name == *.py || $name == *.so ]] || [[ -f $name/__init__.py &&
      ! $(<"$name/__init__.py") =~ extend_path|declare_namespace ]] && name=${name##*/} && names+=("${name%%.*}")
  done
  name=$("$PY" -c 'import importlib.util as u, sys; print(*[n for n in sys.argv[1:] if u.find_spec(n)])' "${names[@]}")
  [ -z "$name" ] || { NOTE[wheels]="the carried site shadows the node's $name" && return 1; }
  export PYTHONPATH=$site:$PYTHONPATH # every later stage sees the carried packages
  module=$(awk '!/^#/ && NF { printf "%s%s", sep, $2; sep = ", " }' "$list")
  run wheels "$1" "$PY" -c "import $module, torch; assert not torch.__file__.startswith('$site'), 'torch from site'" ||
    { NOTE[wheels]="import failed: $(tail -2 "$work/log/wheels.log" | head -1)" && return 1; }
  run wheels "$1" "$PY" -m pip check # the carried distributions' requirements (--no-deps skipped the resolver)
  spec=$(printf '%s|' "${missing[@]%%==*}") && name=$(grep -iE "^(${spec%|}) .* requires" "$work/log/wheels.log")
  [ -z "$name" ] || { NOTE[wheels]="missing requirement: $name" && return 1; }
  name=$(grep -ciE "^(${spec%|}) .* has requirement" "$work/log/wheels.log") # a warning: the node's version may do
  NOTE[wheels]="installed ${missing[*]}; every listed module imports, torch from the node; $name version ranges not met"
}
stage_env() { # nvidia-smi's own view into stages.log; torch's and the harness's into env.json
  ! command -v nvidia-smi >/dev/null || run env 20 nvidia-smi
  run env "$1" "$PY" -m scripts.gpu.report env --out "$work/env.json"
}
stage_listops_data() {
  run listops_data "$1" "$PY" -m lra_bench.prepare task=listops "data_dir=$work/data" --json "${TASK[@]}" "${DATA[@]}"
}
stage_listops_train() { # full, nystrom and gpa concurrently on the one device; the side stages inside their window
  local end=$(($(now) + $1 * 1000000)) attn rc=0 s
  [ "${RC[listops_data]-}" = 0 ] || { RC[listops_train]=skip NOTE[listops_train]="no ListOps data (see listops_data)"; }
  for attn in full nystrom gpa; do
    [ "${RC[listops_train]}" = skip ] || OMP_NUM_THREADS=$threads launch "listops-$attn" "$1" "$PY" run.py task=listops \
      "attn=$attn" protocol=nystromformer logger=csv seed=0 "run_name=$attn" "output_root=$work/runs" \
      "data_dir=$work/data" print_config=false callbacks.progress_bar=false "${TASK[@]}" "${TRAIN[@]}"
  done
  for s in "${SIDE[@]}"; do stage "$s" $(((end - $(now)) / 1000000)); done
  [ "${RC[listops_train]}" = skip ] && return
  for attn in full nystrom gpa; do finish "listops-$attn" || rc=$?; done
  return $rc
}
tests() { run "$1" "$2" "$PY" -m pytest -q -rfE -p no:cacheprovider "--junitxml=$work/junit_$1.xml" "${@:3}"; }
# the CUDA tests live in one file (tests/test_gpu_check.py checks no other has one): collecting the whole suite
# for them took longer than the stage's tiny budget beside the three runs
stage_gpu_tests() { tests gpu_tests "$1" -m gpu tests/test_gpu.py; }
stage_fast_tier() { tests fast_tier "$1" -m "not slow and not gpu" "${FAST[@]}"; }
stage_bf16_smoke() { # every registered attention trains in bf16-mixed with finite loss
  local attns && attns=$(cd conf/attn && ls -- *.yaml | sed 's/\.yaml$//' | paste -sd,)
  OMP_NUM_THREADS=$threads run bf16_smoke "$1" "$PY" run.py -m "attn=$attns" task=listops logger=csv seed=0 \
    print_config=false callbacks.progress_bar=false "data_dir=$work/smoke_data" "hydra.sweep.dir=$work/smoke" \
    "${SMOKE[@]}"
}
bench() {
  run "bench_$2" "$1" "$PY" -m lra_bench.bench "${BENCH[@]}" "dtype=$2" "hydra.run.dir=$work/bench_$2"
  local rc=$? && cp "$work/bench_$2/bench.json" "$out/bench_$2.json" 2>/dev/null
  return $rc
}
stage_bench_bfloat16() { bench "$1" bfloat16; }
stage_bench_float32() { bench "$1" float32; }
stage_train_step() { # the faithful training step against the device's matmul limit, and the protocol's projected time
  OMP_NUM_THREADS=$threads run train_step "$1" "$PY" -m lra_bench.bench.step "${STEP[@]}" --json "$out/train_step.json"
}
stage_table() { # the harness's own reader of the same records (report.py puts the runs beside the published row)
  [ -d "$work/runs" ] || { NOTE[table]="leaderboard not built: no $work/runs" && return 0; }
  run table "$1" "$PY" -m lra_bench.leaderboard "$work/runs" --no-plots --out "$work/leaderboard"
}

main() {
  cd "$(dirname "$0")/../.." && REPO=$PWD
  PY=${PYTHON:-python3} out="" work="" wheels=$REPO/.whl budget="" only="" tiny=0 print=0 argv="$*"
  local arg kv s extra=()
  while (($#)); do
    arg=$1 && shift
    case $arg in --out | --work | --wheels | --budget | --stage-budget | --only)
      (($#)) || fail "$arg needs a value"
      arg=$arg=$1 && shift ;;
    esac
    case $arg in
    --out=*) out=${arg#*=} ;; --work=*) work=${arg#*=} ;; --wheels=*) wheels=${arg#*=} ;; --only=*) only=,${arg#*=}, ;;
    --budget=*) budget=${arg#*=} ;; --stage-budget=*) extra+=("${arg#*=}") ;; --tiny) tiny=1 ;; --print-plan) print=1 ;;
    -h | --help) sed -n 2,5p "$0" && exit 0 ;; *) fail "unknown argument $arg (--help lists them)" ;;
    esac
  done
  [ -n "$out" ] || ((print)) || fail "--out DIR is required (the folder the report is written to)"
  plan
  for s in "${!STAGES[@]}"; do B[${STAGES[s]}]=${budgets[s]}; done
  for kv in "${extra[@]}"; do
    [[ -n ${B[${kv%%=*}]-} && ${kv#*=} =~ ^[0-9]+$ && ${kv#*=} -gt 0 ]] ||
      fail "--stage-budget $kv: want STAGE=SECONDS (a positive whole number), STAGE one of ${STAGES[*]}"
    B[${kv%%=*}]=${kv#*=}
  done
  budget=${budget:-$total} t0=$(now)
  [[ $budget =~ ^[0-9]+$ && $budget -gt 0 ]] || fail "--budget=$budget: must be a positive whole number of seconds"
  deadline=$((t0 + budget * 1000000))
  if ((print)); then
    work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
    for s in "${STAGES[@]}"; do echo "budget $s ${B[$s]}$([[ " ${SIDE[*]} " == *" $s "* ]] && echo " side")"; done
    echo "total $total"
  else
    out=$(realpath -m "$out") work=$(realpath -m "${work:-${TMPDIR:-/tmp}/lra-gpu-check-$(date +%Y%m%d-%H%M%S)}")
    mkdir -p "$out" "$work/log" "$work/pid" "$work/rc" || exit 2
    exec > >(tee -a "$out/check.log") 2>&1
    echo "scripts/gpu/check.sh $argv — $(date -u +%FT%TZ) on $(hostname), $(nproc) cores"
  fi
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 WANDB_MODE=disabled WANDB_SILENT=true \
    HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 MPLBACKEND=Agg
  trap 'say "stopped by a signal: ending every stage"; stop_all; render --final; exit 143' TERM INT
  say "$mode mode; out $out; work $work; budget $budget s"
  for s in "${STAGES[@]}"; do [[ " ${SIDE[*]} " == *" $s "* ]] || stage "$s"; done
  ((print)) && exit 0
  render --final
  local status=$?
  echo "check.sh: exit $status"
  exec 1>&- 2>&-
  wait # check.log is complete when we return
  exit $status
}

[[ ${BASH_SOURCE[0]} != "$0" ]] || main "$@" # sourced (tests): the functions only
