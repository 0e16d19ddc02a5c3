#!/usr/bin/env python3
"""Predicted peak device memory against the measured peaks of bench/validation/memory_cases.json.

  bench/validation/memory_check.py [--cli build/bin/moesim] [--json OUT]

Each case becomes a scenario (the mapping is below, every assumption printed with its case) and
one `moesim validate` over all of them predicts each run's memory: the pipeline stage whose rank
logged the peak (Megatron-LM's last rank; the worst stage when the source takes the maximum),
without moesim's runtime reserve; the error is (predicted - measured) / measured. Every run
ran, so a "does not fit" (against the run's own device memory) is false and fails --guard. Measured figures are what the source logged: PyTorch's
peak reserved memory (torchtitan) or peak allocated memory (Megatron's CI); the prediction is
one number for both, so the reserved figures carry the allocator's caching on top.
Nothing is fitted on these cases.
"""
import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]


def model_of(c, notes):
    m = c["model"]["hf_like"]
    act = (m.get("activation") or "swiglu").lower()
    out = {"name": c["model"]["name"], "hidden_size": m["hidden_size"], "num_hidden_layers": m["num_hidden_layers"],
           "num_attention_heads": m["num_attention_heads"], "vocab_size": m.get("padded_vocab_size") or m["vocab_size"],
           "tie_word_embeddings": bool(m.get("tie_word_embeddings", False))}
    if m.get("kv_lora_rank"):  # DeepSeek-style MLA + MoE
        out.update({"architectures": ["DeepseekV3ForCausalLM"], "intermediate_size": m["intermediate_size"],
                    "kv_lora_rank": m["kv_lora_rank"], "qk_nope_head_dim": m["qk_nope_head_dim"],
                    "qk_rope_head_dim": m["qk_rope_head_dim"], "v_head_dim": m["v_head_dim"],
                    "n_routed_experts": m["n_routed_experts"], "num_experts_per_tok": m["num_experts_per_tok"],
                    "moe_intermediate_size": m["moe_intermediate_size"], "n_shared_experts": m.get("n_shared_experts", 0),
                    "first_k_dense_replace": m.get("first_k_dense_replace", 0),
                    "num_key_value_heads": m["num_attention_heads"]})
        if m.get("q_lora_rank"):
            out["q_lora_rank"] = m["q_lora_rank"]
        if m.get("num_nextn_predict_layers"):
            out["num_nextn_predict_layers"] = m["num_nextn_predict_layers"]
        return out
    kv = m.get("num_key_value_heads") or m["num_attention_heads"]
    if act.startswith("gelu"):
        # A plain (non-gated) MLP with grouped-query attention: Nemotron's layout (squared ReLU has
        # the same memory as GeLU); learned positions are left out (a few MB).
        out.update({"architectures": ["NemotronForCausalLM"], "intermediate_size": m["intermediate_size"],
                    "num_key_value_heads": kv, "head_dim": m["hidden_size"] // m["num_attention_heads"]})
        notes.append("GeLU MLP modelled as Nemotron's plain MLP")
        return out
    out.update({"architectures": ["LlamaForCausalLM"], "intermediate_size": m["intermediate_size"],
                "num_key_value_heads": kv})
    return out


LEGACY = False  # --legacy-sharding: FSDP as the distributed optimizer (all moesim could say before issue 15)


def torch_compiled(c):
    """Whether the case's run used torch.compile (its parallelism.other text says so)."""
    other = (c["parallelism"].get("other") or "").lower()
    return ("torch.compile" in other and "compile: false" not in other
            and "compile per transformerblock: false" not in other)


def loss_of(c):
    """Megatron computes the loss with its fused vocab-parallel kernel; torchtitan with plain
    F.cross_entropy, which it compiles together with the model from 2025-04-02 (commit bbb1b616e,
    "refactor train_spec.loss_fn to build_loss_fn", pytorch/torchtitan #1033; commented out
    before, e.g. train.py at 9dec370)."""
    if "torchtitan" not in c["framework"].lower():
        return "fused"
    date = re.search(r"\d{4}-\d{2}-\d{2}", c["framework"])
    return "compiled" if torch_compiled(c) and date and date.group(0) >= "2025-04-02" else "pytorch"


def elementwise_of(c):
    """torchtitan without torch.compile runs RMSNorm, RoPE and SwiGLU as chains of plain PyTorch
    kernels (models/norms.py, models/llama/model.py at 9dec370); compiled, Inductor fuses them."""
    return "eager" if "torchtitan" in c["framework"].lower() and not torch_compiled(c) else "fused"


def probs_of(c):
    """Megatron-core multiplies the routing weights in the experts' activation from 2025-04-09
    (commit 2659630721; every Megatron case here is later); torchtitan's DeepSeek-V3 weights the
    expert outputs (MoEArgs.score_before_experts false), which its backward keeps."""
    return "output" if "torchtitan" in c["framework"].lower() else "activation"


def cluster_of(hw, notes):
    """DGX-H100 timing with the run's device memory: the 96 GB HBM2e H100 of Meta's Grand Teton
    (torch reports ~95 GiB) and the H200 (141 GB; torch reports ~140 GiB) hold more than the
    80 GiB preset, which only matters for the fits / does-not-fit verdict."""
    cluster = {"preset": "dgx-h100", "devices": hw["devices"]}
    dev = hw["device"]
    m = re.search(r"reports ~(\d+(?:\.\d+)?) GiB", dev)
    gib = float(m.group(1)) if m else 140.0 if dev.startswith("H200") else None
    if gib:
        cluster["device"] = {"preset": "h100-sxm-80gb", "hbm": {"capacity": f"{gib:g}GiB"}}
        notes.append(f"device memory {gib:g} GiB ({dev.split(' (')[0]}), H100 timing")
    return cluster


def scenario_of(c):
    notes = []
    p, t, hw = c["parallelism"], c["training"], c["hardware"]
    par = {"tp": p.get("tp") or 1, "pp": p.get("pp") or 1, "cp": p.get("cp") or 1, "mbs": t["micro_batch_size"]}
    if p.get("vpp") and p["vpp"] > 1:
        par["vpp"] = p["vpp"]
    if p.get("ep"):
        par["ep"] = p["ep"]
        par["etp"] = p.get("etp") or 1
    if "unfused attention" in (p.get("other") or "").lower() or "unfused" in c.get("notes", "").lower():
        sc_attention = "unfused"
    else:
        sc_attention = "flash"
    if p.get("sequence_parallel") and par["tp"] > 1:
        par["sequence_parallel"] = True
    if par["cp"] > 1 and "allgather" in (p.get("other") or "").lower().replace("-", "").replace(" ", ""):
        par["cp_comm_type"] = "all_gather"  # torchtitan's allgather rotation: gather K/V, then attend
        notes.append("context parallelism by all-gather (torchtitan's allgather rotate method)")
    sharding = (p.get("sharding") or "").lower()
    if LEGACY and ("fsdp" in sharding or "zero-3" in sharding):
        par["use_distributed_optimizer"] = True
    elif "fsdp" in sharding or "zero-3" in sharding:
        par["data_parallel_sharding_strategy"] = "optim_grads_params"
        if "reshard_after_forward=false" in sharding.replace(" ", ""):
            par["fsdp_reshard_after_forward"] = False
        if "torchtitan" in c["framework"].lower() and par["pp"] > 1:
            # torch.distributed.pipelining turns FSDP2's gradient sync and reshard-after-backward
            # off for every backward but the last (stage.py, backward_maybe_with_nosync).
            par["fsdp_gradient_sync"] = "last_microbatch"
    elif "distributed" in sharding or "zero-1" in sharding:
        par["use_distributed_optimizer"] = True
    ac = (p.get("activation_checkpointing") or "none").lower()
    if ac.startswith("full"):
        par.update({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1})
    elif ac.startswith("selective") and "'op'" in ac:
        par["recompute_granularity"] = "selective_op"
    elif ac.startswith("selective") and "--recompute-modules [" in ac:
        par["recompute_granularity"] = "selective"
        par["recompute_modules"] = ac.split("--recompute-modules [", 1)[1].split("]", 1)[0].split()
    elif ac.startswith("selective"):
        par["recompute_granularity"] = "selective"
        notes.append("selective recomputation: moesim's default modules")
    sched = (p.get("pipeline_schedule") or "").lower()
    if par["pp"] > 1 and "interleaved" in sched and "vpp" not in par:
        par["vpp"] = 2
    layers = (c["model"].get("hf_like") or {}).get("num_hidden_layers")
    if "megatron" in c["framework"].lower() and par["pp"] > 1 and layers and layers % (par["pp"] * par.get("vpp", 1)) == 0:
        par["pipeline_layer_partition"] = "even"  # Megatron's split when the layers divide
    if par.get("vpp", 1) > 1 and "torchtitan" in c["framework"].lower():
        par["pipeline_schedule"] = "interleaved_1f1b_torch"  # torch.distributed.pipelining's order
    prec = "fp8" if ("fp8" in t["precision"].lower() or "float8" in t["precision"].lower()) else "bf16"
    dp = p.get("dp") or 1
    devices = hw["devices"]
    gbs = t.get("global_batch_size") or t["micro_batch_size"] * dp
    return {"model": model_of(c, notes), "cluster": cluster_of(hw, notes),
            "training": {"seq_length": t["seq_length"], "global_batch_size": gbs, "precision": prec,
                         "attention_kernel": sc_attention,
                         "cross_entropy": loss_of(c), "moe_router_probs": probs_of(c),
                         **({"elementwise": "eager"} if elementwise_of(c) == "eager" else {})},
            "parallelism": par}, notes


def framework_of(c):
    """Short framework name for the validate category: "torchtitan", "megatron_lm"."""
    return re.split(r"[\s(]", c["framework"].strip(), maxsplit=1)[0].lower().replace("-", "_")


def validate_cases(cases):
    """The cases in `moesim validate`'s format (a ready scenario and the measured peak in GiB),
    the measured peaks and the mapping notes by id."""
    out, meas, notes = [], {}, {}
    for c in cases:
        sc, n = scenario_of(c)
        meas[c["id"]] = c["measured"]["peak_memory"] * (1.0 if c["measured"]["unit"] == "GiB" else 1e9 / 2**30)
        notes[c["id"]] = n
        measured = {"peak_memory_gib": meas[c["id"]]}
        per = c["measured"].get("per", "").lower()
        if "last rank" in per:  # Megatron-LM logs the last rank's peak: the last pipeline stage
            measured["peak_memory_stage"] = "last"
        out.append({"id": c["id"], "category": "memory_" + framework_of(c), "scenario": sc,
                    "measured": measured, "notes": n})
    return out, meas, notes


def run_validate(cli, path):
    """One `moesim validate` over the file: its cases by id, or the reason it did not run."""
    r = subprocess.run([cli, "validate", str(path), "--format", "json", "--fidelity", "fast"],
                       capture_output=True, text=True)
    try:  # exit 2 with a report when no case ran: the cases carry their reasons
        return {x["id"]: x for x in json.loads(r.stdout)["cases"]}, None
    except (json.JSONDecodeError, KeyError, TypeError):
        return {}, r.stderr.strip().splitlines()[-1:] or [f"moesim validate exited with {r.returncode}"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=str(ROOT / "build/bin/moesim"))
    ap.add_argument("--cases", default=str(ROOT / "bench/validation/memory_cases.json"))
    ap.add_argument("--json")
    ap.add_argument("--guard", help="recorded limits (JSON with mean_abs_error_pct): exit 1 above them")
    ap.add_argument("--legacy-sharding", action="store_true")
    ap.add_argument("--write-cases", metavar="PATH",
                    help="keep the generated `moesim validate` cases file here (run `moesim validate PATH` on it)")
    a = ap.parse_args()
    global LEGACY
    LEGACY = a.legacy_sharding
    cases = json.loads(pathlib.Path(a.cases).read_text())
    vcases, measured, notes = validate_cases(cases)
    # One `moesim validate` for all cases: it reports the measured stage's peak without the runtime
    # reserve (predicted_allocated_gib), since PyTorch's allocator statistics do not see the CUDA
    # context, NCCL's buffers or the reserve moesim adds per device, and the error against the
    # measured peak (memory_error_pct).
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(a.write_cases) if a.write_cases else pathlib.Path(tmp) / "memory_validate_cases.json"
        path.write_text(json.dumps(vcases, indent=1) + "\n")
        results, failure = run_validate(a.cli, path)
    rows = []
    for c in cases:
        res = results.get(c["id"], {"status": "error", "reason": "\n".join(failure or ["not in the report"])})
        if res["status"] != "ok":
            message = res.get("reason", res["status"]).strip().splitlines()[-1:]
            rows.append({"id": c["id"], "status": "error", "message": message})
            print(f"{c['id']}: error {message}")
            continue
        meas, pred, err = measured[c["id"]], res["predicted_allocated_gib"], res["memory_error_pct"]
        rows.append({"id": c["id"], "status": "ok", "measured_gib": meas, "predicted_gib": pred, "error_pct": err,
                     "fits": res["feasible"], "peak_gib": res["predicted_peak_gib"], "capacity_gib": res["capacity_gib"],
                     "what": c["measured"]["what"].split(":")[0].split(" ")[0], "notes": notes[c["id"]]})
        print(f"{c['id']}: measured {meas:6.1f} GiB  predicted {pred:6.1f} GiB  {err:+6.1f}%  {c['model']['name'][:40]}")
    ok = [r for r in rows if r["status"] == "ok"]
    mean = statistics.mean(abs(r["error_pct"]) for r in ok) if ok else 0.0
    print(f"{len(ok)} cases, mean |error| {mean:.1f}%, max {max(abs(r['error_pct']) for r in ok):.1f}%")
    # Every one of these runs ran: a "does not fit" is false.
    false_oom = [r["id"] for r in ok if not r["fits"]]
    print(f"predicted not to fit: {len(false_oom)} of {len(ok)} runs that ran" + (f" ({', '.join(false_oom)})" if false_oom else ""))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps({"cases": rows, "mean_abs_error_pct": mean,
                                                    "predicted_not_to_fit": false_oom}, indent=1) + "\n")
    if a.guard:
        limit = json.loads(pathlib.Path(a.guard).read_text())["mean_abs_error_pct"]
        if len(ok) < len(cases):
            print(f"memory guard: only {len(ok)} of {len(cases)} cases ran")
            return 1
        if mean > limit:
            print(f"memory guard: mean |error| rose to {mean:.1f}% (recorded {limit}%)")
            return 1
        if false_oom:
            print(f"memory guard: runs that ran are predicted not to fit: {', '.join(false_oom)}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
