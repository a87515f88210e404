"""``benchmarks/gpu.py``'s two results files as markdown: ``gpu_<device>.md`` (the environment, the kernel checks,
the networks' figures, the targets) and ``gpu_cli_<device>.md`` (nnU-Net's commands)."""
from typing import List, Optional

from common import markdown_table


def _cell(value) -> str:
    return "-" if value is None else str(value)


def gpu_markdown(data: dict) -> str:
    env = data.get("environment", {})
    lines = [f"# Med-DisSeg on {data['device']}: environment, kernel checks, eager figures", "",
             f"{env.get('date', '-')}; {env.get('gpu', env.get('cpu', '-'))}, {env.get('cpu_cores', '-')} CPU cores; "
             f"torch {env.get('torch', '-')}, Triton {env.get('triton', '-')}, CUDA {env.get('cuda', '-')}, "
             f"Python {env.get('python', '-')}, nnunetv2 {env.get('nnunetv2', '-')}; `{data['command']}`", ""]
    checks = [[f"{kernel}/{name}", r.get("skipped") or r.get("error")
               or f"{max(r['errors'].values()):.1e} (tolerance {r['tolerance']:.0e})",
               {True: "passed", False: "FAILED"}.get(r.get("passed"), "skipped")]
              for kernel, named in data.get("kernel_checks", {}).items() for name, r in named.items()]
    if checks:
        lines += [markdown_table(["kernel check", "largest relative error", ""], checks), ""]
    settings = data.get("settings", {})
    if settings:
        big = settings["infer_batch"]
        keys = ["train_fp32", "train_bf16", "infer_b4_fp32", f"infer_b{big}_bf16_channels_last",
                "peak_train_memory_gib_fp32", "peak_train_memory_gib_bf16"]
        columns = [c for c in ("meddisseg", "meddisseg_shifted", "nnunet") if c in data]
        titles = {"meddisseg": f"Med-DisSeg ({data.get('forms_default', '?')} CDFA)",
                  "meddisseg_shifted": "Med-DisSeg (shifted CDFA)", "nnunet": "nnU-Net's default network"}
        rows = [[k.replace("_", " ")] + [_cell(data[c].get(k)) for c in columns] for k in keys]
        lines += [f"Eager, {settings['size']}x{settings['size']}, training batch {settings['train_batch']} (the "
                  f"plan's), images/s (memory in GiB), medians of {settings['repeats']} calls:", "",
                  markdown_table(["figure"] + [titles[c] for c in columns], rows), ""]
        if isinstance(data.get("fused_vs_shifted"), dict):
            lines += ["Fused vs shifted CDFA form, same run: "
                      + ", ".join(f"{k} x{v}" for k, v in data["fused_vs_shifted"].items()), ""]
        elif data.get("fused_vs_shifted"):
            lines += [f"CDFA forms: {data['fused_vs_shifted']}", ""]
    blocks = data.get("blocks")
    if blocks:
        lines += [f"Batch-{settings.get('infer_batch')} bf16 inference: wall {blocks['wall_ms']} ms, summed kernel "
                  f"time {blocks['kernel_ms']} ms.", "",
                  markdown_table(["block", "ms"], list(blocks["per_block_ms"].items())), "",
                  markdown_table(["kernel", "calls", "self ms"],
                                 [[f"`{k['name'][:90]}`", k["calls"], k["ms"]] for k in blocks["top_kernels"]]), ""]
    lines += onnx_markdown(data.get("onnx"))
    targets = [[k, t["target"], _cell(t["measured"]), {True: "met", False: "MISSED", None: "not measured"}[t["met"]],
                t["source"]] for k, t in data.get("targets", {}).items()]
    if targets:
        lines += [markdown_table(["target", "", "measured", "", "from"], targets), ""]
    steps = [[name, s["rc"], s["seconds"], s["cap_s"]] for name, s in data["steps"].items()]
    lines.append(markdown_table(["step", "rc", "seconds", "cap"], steps))
    return "\n".join(lines) + "\n"


def onnx_markdown(onnx: Optional[dict]) -> List[str]:
    """Step onnx's lines: images/s of nnU-Net's predictor and of each ONNX Runtime provider, and their masks'
    agreement (``onnx_predict.md`` has the rest)."""
    if not onnx:
        return []
    lines = [f"ONNX Runtime {onnx.get('onnxruntime', '-')} (providers here: "
             f"{', '.join(onnx['providers_available'])}) against nnU-Net's predictor, {onnx['cases']} images:", ""]
    results, rows = onnx["results"], []
    for key, figures in results.items():
        parts = key.split(" / ")  # model / arm / mode, and " / agreement" after the ONNX arms' agreement
        if len(parts) != 3 or parts[1] == "nnUNetv2_predict":
            continue
        name, arm, mode = parts
        torch_figures, agreement = results[f"{name} / nnUNetv2_predict / {mode}"], results[f"{key} / agreement"]
        rows.append([name, mode, arm, round(torch_figures["images_per_s"], 2), round(figures["images_per_s"], 2),
                     f"{figures['images_per_s'] / torch_figures['images_per_s']:.2f}x",
                     agreement["sessions_and_first_round_s"], f"{agreement['min_dice']:.4f}"])
    if rows:
        lines += [markdown_table(["model", "mirroring", "provider", "nnU-Net's predictor images/s",
                                  "ONNX Runtime images/s", "ratio", "sessions + first round s", "min Dice"], rows), ""]
    failed = [f"{key[:-len(' / agreement')]}: {record['error']}" for key, record in results.items()
              if key.endswith(" / agreement") and "error" in record]
    notes = [f"Left out: {p} {why}" for p, why in onnx["providers_left_out"].items()] + failed
    return lines + notes + ([""] if notes else [])


def cli_markdown(data: dict) -> str:
    lines = [f"# nnU-Net's commands with Med-DisSeg on {data['device']}", "", f"`{data['command']}`", "",
             f"Compiled `nnUNetv2_train` through `nnUNetv2_predict`: **{data['completed_through_predict']}**"
             + (f"; compile seconds in total {data['compile_s_total']}" if data.get("compile_s_total") else ""), ""]
    if data.get("cases"):
        plans = "; ".join(f"{k} batch {v['batch_size']}" for k, v in data.get("plans", {}).items())
        lines += [f"{data['cases']['train']} training / {data['cases']['val']} validation / {data['cases']['test']} "
                  f"test cases at {data['size']}x{data['size']}, epochs of {data['iterations_per_epoch']} "
                  f"iterations; {plans}.", ""]
    main = data.get("main", {})
    if main:
        rows = [[arm, f["nnUNet_compile"], f"{f['decision']} ({f['reason']})" if f["decision"] else "-",
                 ", ".join(f"{g} {s}" for g, s in (f["compile_s"] or {}).items()) or "-",
                 ", ".join(map(str, f["epoch_s"])) or "-", f.get("predicted_cases", "-"),
                 _cell((f.get("test_mean") or {}).get("dice"))] for arm, f in main.items()]
        lines += [markdown_table(["main command", "nnUNet_compile", "decision", "compile s per graph", "epoch s",
                                  "predicted", "test Dice"], rows), ""]
    epochs = {k: v for k, v in data.get("epochs", {}).items() if isinstance(v, dict)}
    if epochs:
        hours = data.get("default_schedule_hours", {})
        rows = []
        for key, f in epochs.items():
            warm = f.get("stage2_warm_epoch") or f.get("warm_epoch") or {}
            first = f.get("stage1_epoch") or {}
            rows.append([key, {True: "yes", False: "no"}.get(f.get("compiled"), "-"), _cell(first.get("seconds")),
                         _cell(warm.get("seconds")), _cell(warm.get("images_per_s")), _cell(hours.get(key))])
        lines += [markdown_table(["trainer", "compiled (its log)", "Stage I epoch s (first)", "warm epoch s",
                                  "training images/s", "hours, default schedule"], rows), ""]
    commands = [[c["label"], c["rc"], c["seconds"], c["cap_s"]] for c in data["commands"]]
    lines.append(markdown_table(["command", "rc", "seconds", "cap"], commands))
    return "\n".join(lines) + "\n"
