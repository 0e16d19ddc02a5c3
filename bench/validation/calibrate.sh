#!/usr/bin/env bash
# Re-fits the per-device calibration parameters on the fitting half (even case ids) of the
# calibration cases and prints the values to copy into the presets (with the MAPE they give).
# Each device gets at most two physical parameters; FP8 efficiency is fitted after the BF16
# ones of the same device. Takes about 15 minutes on 2 cores.
#
#   bench/validation/calibrate.sh [CASES.json] > bench/validation/calibration.log
set -euo pipefail
cd "$(dirname "$0")/../.."
cases=${1:-bench/validation/calibration_cases.json}
fit=build/bin/moesim_fit

echo "== A100 (Megatron 2021-22: FP16, unfused attention)"
$fit "$cases" --cluster dgx-a100 --param device.gemm_peak_efficiency:0.6:0.95 --param device.hbm.efficiency:0.5:0.95
echo "== H100, BF16 (Megatron-core dense weak scaling, MoE model zoo)"
# Host time per issued operator: only the eager MoE runs with many local experts are sensitive.
$fit "$cases" --cluster dgx-h100 --precision bf16 --param device.gemm_peak_efficiency:0.55:0.95 \
  --param device.host_op_time:0.00002:0.00012
echo "== H100, FP8 (NeMo)"
$fit "$cases" --cluster dgx-h100 --precision fp8 --param device.gemm_fp8_efficiency:0.35:0.85
echo "== B200, FP8 (NeMo long context)"
$fit "$cases" --cluster dgx-b200 --param device.gemm_fp8_efficiency:0.3:0.85 \
  --param device.attention_efficiency:0.25:0.8
echo "== GB200 NVL72, MXFP8 (DeepSeek-V3)"
$fit "$cases" --cluster gb200-nvl72 --param device.gemm_fp8_efficiency:0.2:0.85
echo "== Atlas 800T A2 (Ascend 910B, MindSpeed)"
# Two Ascend cases in the fitting half: one parameter only (HCCS and attention stay estimates).
$fit "$cases" --cluster atlas-800t-a2 --param device.gemm_peak_efficiency:0.4:0.9
