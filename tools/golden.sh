#!/usr/bin/env bash
# Writes moesim's outputs for a fixed set of scenarios, plans, searches and validations into a
# folder, so that a refactoring can be checked to change nothing, byte for byte:
#   tools/golden.sh /tmp/before      # on the old code
#   tools/golden.sh /tmp/after       # on the new code
#   diff -r /tmp/before /tmp/after   # empty when the outputs are identical
# About 2 minutes on 2 cores. Uses build/bin/moesim (MOESIM=... to override).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: tools/golden.sh OUTDIR}"
cli="${MOESIM:-build/bin/moesim}"
mkdir -p "$out"
pangu=scenarios/pangu-ultra-moe-718b.json
small=tests/scenarios/search_small_moe.json
sim() {  # name scenario [--set ...]
  local name=$1 scen=$2
  shift 2
  "$cli" simulate "$scen" --format json --no-wall-time "$@" > "$out/sim_$name.json" 2> "$out/sim_$name.err" || echo "exit $?" >> "$out/sim_$name.err"
}
sim 718b $pangu
sim 718b_fast $pangu --fidelity fast
sim 718b_zipf $pangu --set 'moe.routing="zipf"'
sim 718b_rebalanced $pangu --set 'moe.routing="zipf"' --set 'moe.placement="rebalanced"' --fidelity fast
sim 718b_fb_overlap $pangu --set parallelism.moe_fb_overlap=true --set parallelism.moe_shared_expert_overlap=true
sim 718b_swap $pangu --set parallelism.swap_activations=0.5 --set parallelism.swap_optimizer=true
sim 718b_dualpipev $pangu --set 'parallelism.pipeline_schedule="dualpipev"'
sim 718b_dualpipe $pangu --set 'parallelism.pipeline_schedule="dualpipe"' --set parallelism.vpp=1
sim 718b_zbv $pangu --set 'parallelism.pipeline_schedule="zb_v"'
sim 718b_zbh1 $pangu --set 'parallelism.pipeline_schedule="zb_h1"' --set parallelism.vpp=1
sim small_full_recompute $small --set 'parallelism.recompute_granularity="full"' --set 'parallelism.recompute_method="block"' --set parallelism.recompute_num_layers=1
sim small_selective $small --set 'parallelism.recompute_granularity="selective"'
sim 718b_slowdown $pangu --set simulation.comm_compute_slowdown=0.15
sim 718b_host $pangu --set 'simulation.host_dispatch.launch_overhead="60us"'
sim 718b_infeasible $pangu --set parallelism.micro_batch_size=8
for sch in 1f1b zb_h1; do sim small_$sch $small --set "parallelism.pipeline_schedule=\"$sch\""; done
for sch in interleaved_1f1b zb_v dualpipev; do sim small_$sch $small --set parallelism.pp=2 --set parallelism.vpp=2 --set "parallelism.pipeline_schedule=\"$sch\""; done
sim small_dualpipe $small --set parallelism.pp=2 --set 'parallelism.pipeline_schedule="dualpipe"'
sim small_full $small --fidelity full
sim small_fast $small --fidelity fast
sim small_cp2 $small --set parallelism.cp=2 --set parallelism.tp=1
sim small_docs $small --set training.documents.mean_tokens=512 --set training.documents.reorder=true
sim small_dirichlet $small --set 'moe.routing="dirichlet"' --set moe.dirichlet_alpha=0.5 --fidelity full
sim gpt1t tests/scenarios/case_010_gpt_1t.json
"$cli" simulate $small --trace "$out/trace_small.json" --no-wall-time > /dev/null
"$cli" search $small --format json --threads 2 > "$out/search_small.json"
"$cli" search $small --format json --threads 2 \
  --set 'search.pipeline_schedule=["auto","zb_h1","zb_v","dualpipev","dualpipe"]' --set training.global_batch_size=256 > "$out/search_small_schedules.json"
"$cli" search $pangu --format json --threads 2 > "$out/search_718b.json"
"$cli" rl tests/scenarios/rl_small.json --format json --no-wall-time > "$out/rl_small.json"
"$cli" plan $small --tokens 1T --deadline 6d --devices 8:32 --format json --threads 2 > "$out/plan_small.json"
"$cli" validate bench/validation/calibration_cases.json --json "$out/validate.json" > /dev/null
"$cli" validate bench/validation/supplementary_cases.json --json "$out/validate_supplementary.json" > /dev/null
echo "wrote $(ls "$out" | wc -l) files to $out"
